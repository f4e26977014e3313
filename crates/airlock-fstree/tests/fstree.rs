//! airlock-fstree on real directories: scan and diff, export and import, hostile input.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Cursor, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use airlock_fstree::{Index, Root, clear, diff, export, import};
use airlock_spec::{Change, FileChange, FileKind, MAX_FILES_CHANGED};

fn root(path: &Path, name: &str) -> Root {
    Root::open(path, name).unwrap()
}

fn change(path: &str, change: Change, kind: FileKind, bytes: u64) -> FileChange {
    FileChange {
        path: path.to_string(),
        change,
        kind,
        bytes,
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Coarse-timestamp filesystems need a tick between two writes to tell them apart.
fn tick() {
    std::thread::sleep(Duration::from_millis(20));
}

#[test]
fn scan_and_diff_name_what_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir(&ws).unwrap();
    fs::write(ws.join("same.txt"), "same").unwrap();
    fs::write(ws.join("rewrite.txt"), "aaaa").unwrap();
    fs::write(ws.join("grow.txt"), "a").unwrap();
    fs::write(ws.join("gone.txt"), "12345").unwrap();
    fs::write(ws.join("old-name"), "r").unwrap();
    fs::write(ws.join("mode.sh"), "#!").unwrap();
    fs::write(ws.join("kind"), "was a file").unwrap();
    fs::create_dir(ws.join("keep")).unwrap();
    fs::write(ws.join("keep/inner"), "x").unwrap();
    let roots = [root(&ws, "/workspace")];

    let before = Index::scan(&roots).unwrap();
    assert!(!before.truncated());
    assert_eq!(before.len(), 9);
    let (none, truncated) = diff(&before, &Index::scan(&roots).unwrap());
    assert_eq!(none, vec![], "nothing changed, nothing listed");
    assert!(!truncated);

    tick();
    fs::write(ws.join("rewrite.txt"), "bbbb").unwrap(); // same size
    fs::write(ws.join("grow.txt"), "abc").unwrap();
    fs::remove_file(ws.join("gone.txt")).unwrap();
    fs::rename(ws.join("old-name"), ws.join("new-name")).unwrap();
    fs::set_permissions(ws.join("mode.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::remove_file(ws.join("kind")).unwrap();
    fs::create_dir(ws.join("kind")).unwrap();
    fs::create_dir_all(ws.join("made/sub")).unwrap();
    fs::write(ws.join("made/sub/f.bin"), [0u8; 300]).unwrap();
    symlink("/etc/hostname", ws.join("made/link")).unwrap();

    let after = Index::scan(&roots).unwrap();
    let (changes, truncated) = diff(&before, &after);
    assert!(!truncated);
    use Change::*;
    use FileKind::*;
    assert_eq!(
        changes,
        vec![
            change("/workspace/gone.txt", Deleted, File, 5),
            change("/workspace/grow.txt", Modified, File, 3),
            change("/workspace/kind", Modified, Dir, 0),
            change("/workspace/made", Created, Dir, 0),
            change("/workspace/made/link", Created, Symlink, 13),
            change("/workspace/made/sub", Created, Dir, 0),
            change("/workspace/made/sub/f.bin", Created, File, 300),
            change("/workspace/mode.sh", Modified, File, 2),
            change("/workspace/new-name", Created, File, 1),
            change("/workspace/old-name", Deleted, File, 1),
            change("/workspace/rewrite.txt", Modified, File, 4),
        ]
    );
}

#[test]
fn two_roots_are_named_by_their_names() {
    let tmp = tempfile::tempdir().unwrap();
    let (ws, t) = (tmp.path().join("ws"), tmp.path().join("t"));
    fs::create_dir(&ws).unwrap();
    fs::create_dir(&t).unwrap();
    let roots = [root(&ws, "/workspace"), root(&t, "/tmp")];
    let before = Index::scan(&roots).unwrap();
    fs::write(ws.join("a"), "1").unwrap();
    fs::write(t.join("b"), "22").unwrap();
    let (changes, _) = diff(&before, &Index::scan(&roots).unwrap());
    let paths: Vec<_> = changes.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["/tmp/b", "/workspace/a"]);
}

#[test]
fn diff_stops_at_the_cap_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let roots = [root(tmp.path(), "/workspace")];
    let before = Index::scan(&roots).unwrap();
    for i in 0..MAX_FILES_CHANGED + 500 {
        fs::write(tmp.path().join(format!("f{i:05}")), "x").unwrap();
    }
    let (changes, truncated) = diff(&before, &Index::scan(&roots).unwrap());
    assert!(truncated);
    assert_eq!(changes.len(), MAX_FILES_CHANGED);
    assert_eq!(changes[0].path, "/workspace/f00000");
    assert!(changes.windows(2).all(|w| w[0].path < w[1].path), "sorted");
}

#[test]
fn exactly_the_cap_is_not_truncated() {
    let tmp = tempfile::tempdir().unwrap();
    let roots = [root(tmp.path(), "/workspace")];
    let before = Index::scan(&roots).unwrap();
    for i in 0..MAX_FILES_CHANGED {
        fs::write(tmp.path().join(format!("f{i:05}")), "x").unwrap();
    }
    let (changes, truncated) = diff(&before, &Index::scan(&roots).unwrap());
    assert!(!truncated);
    assert_eq!(changes.len(), MAX_FILES_CHANGED);
}

/// Everything beneath `dir`: relative path -> (kind, permission bits, size, content or link
/// target, mtime seconds, uid, gid).
type Tree = BTreeMap<PathBuf, (char, u32, u64, Vec<u8>, i64, u32, u32)>;

fn tree(dir: &Path) -> Tree {
    fn walk(base: &Path, dir: &Path, out: &mut Tree) {
        let mut names: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        names.sort();
        for p in names {
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(base).unwrap().to_path_buf();
            let perm = m.mode() & 0o7777;
            let (kind, data) = if m.file_type().is_symlink() {
                (
                    'l',
                    fs::read_link(&p).unwrap().into_os_string().into_encoded_bytes(),
                )
            } else if m.is_dir() {
                ('d', Vec::new())
            } else {
                ('f', fs::read(&p).unwrap())
            };
            let size = if m.is_dir() { 0 } else { m.len() };
            out.insert(rel, (kind, perm, size, data, m.mtime(), m.uid(), m.gid()));
            if m.is_dir() {
                walk(base, &p, out);
            }
        }
    }
    let mut out = Tree::new();
    walk(dir, dir, &mut out);
    out
}

fn set_mtime(path: &Path, secs: u64) {
    let f = fs::File::open(path).unwrap();
    f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
        .unwrap();
}

#[test]
fn export_then_import_restores_the_tree_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let (ws, t) = (tmp.path().join("ws"), tmp.path().join("t"));
    fs::create_dir(&ws).unwrap();
    fs::create_dir(&t).unwrap();
    fs::write(ws.join("plain.txt"), "hello").unwrap();
    fs::write(ws.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(ws.join("run.sh"), fs::Permissions::from_mode(0o750)).unwrap();
    fs::write(ws.join("suid"), "s").unwrap();
    fs::set_permissions(ws.join("suid"), fs::Permissions::from_mode(0o6755)).unwrap();
    fs::write(
        ws.join("big.bin"),
        (0..200_000u32).map(|i| i as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    fs::write(ws.join("empty"), "").unwrap();
    fs::create_dir_all(ws.join("deep/er/est")).unwrap();
    fs::write(ws.join("deep/er/est/leaf"), "leaf").unwrap();
    fs::create_dir(ws.join("empty-dir")).unwrap();
    fs::create_dir(ws.join("ro-dir")).unwrap();
    fs::write(ws.join("ro-dir/inside"), "in").unwrap();
    symlink("plain.txt", ws.join("rel-link")).unwrap();
    symlink("/nonexistent/dangling", ws.join("dangling")).unwrap();
    symlink("/etc/passwd", ws.join("host-link")).unwrap();
    symlink("../../outside", ws.join("deep/up-link")).unwrap();
    let long = "n".repeat(200);
    fs::create_dir(ws.join(&long)).unwrap();
    fs::write(ws.join(&long).join(&long), "long name").unwrap();
    fs::write(t.join("scratch"), "tmp file").unwrap();
    fs::write(ws.join("hard-a"), "shared").unwrap();
    fs::hard_link(ws.join("hard-a"), ws.join("hard-b")).unwrap();
    for p in [
        "plain.txt",
        "deep/er/est/leaf",
        "deep/er/est",
        "deep",
        "empty-dir",
        "ro-dir/inside",
    ] {
        set_mtime(&ws.join(p), 1_000_000_000);
    }
    fs::set_permissions(ws.join("ro-dir"), fs::Permissions::from_mode(0o555)).unwrap();
    set_mtime(&ws.join("ro-dir"), 1_100_000_000);

    let mut tar = Vec::new();
    let exported = export(&[root(&ws, "/workspace"), root(&t, "/tmp")], &mut tar).unwrap();
    assert_eq!(exported.files, 11);
    assert_eq!(exported.symlinks, 4);
    assert_eq!(exported.dirs, 6);
    assert_eq!(exported.skipped, 0);

    // The paths as the contract says.
    let mut names = Vec::new();
    for e in tar::Archive::new(Cursor::new(&tar)).entries().unwrap() {
        names.push(String::from_utf8(e.unwrap().path_bytes().into_owned()).unwrap());
    }
    assert_eq!(names[0], "workspace/big.bin");
    assert!(names.contains(&"tmp/scratch".to_string()));
    let d = names.iter().position(|n| n == "workspace/deep").unwrap();
    let leaf = names
        .iter()
        .position(|n| n == "workspace/deep/er/est/leaf")
        .unwrap();
    assert!(d < leaf, "a directory comes before its contents");

    // Import into roots that hold other things already: they are gone afterwards.
    let (ws2, t2) = (tmp.path().join("ws2"), tmp.path().join("t2"));
    fs::create_dir(&ws2).unwrap();
    fs::create_dir(&t2).unwrap();
    fs::create_dir_all(ws2.join("old/stuff")).unwrap();
    fs::write(ws2.join("old/stuff/x"), "old").unwrap();
    fs::write(ws2.join("plain.txt"), "old content").unwrap();
    fs::write(t2.join("old-tmp"), "old").unwrap();
    let owner = if is_root() {
        (4242, 4343)
    } else {
        (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        )
    };
    let imported = import(
        &[root(&ws2, "/workspace"), root(&t2, "/tmp")],
        &mut Cursor::new(&tar),
        owner,
    )
    .unwrap();
    assert_eq!(imported.files, 11);
    assert_eq!(imported.symlinks, 4);

    let mut want = tree(&ws);
    let got = tree(&ws2);
    for v in want.values_mut() {
        v.1 &= !0o6000; // setuid/setgid dropped
        v.5 = owner.0;
        v.6 = owner.1;
    }
    // Symlinks' mtimes: set with utimensat(AT_SYMLINK_NOFOLLOW); compare the rest exactly.
    assert_eq!(want.keys().collect::<Vec<_>>(), got.keys().collect::<Vec<_>>());
    for (k, w) in &want {
        let g = &got[k];
        assert_eq!(
            (w.0, w.1, w.2, &w.3, w.5, w.6),
            (g.0, g.1, g.2, &g.3, g.5, g.6),
            "{k:?}"
        );
        assert_eq!(w.4, g.4, "mtime of {k:?}");
    }
    assert_eq!(got[Path::new("ro-dir")].1, 0o555);
    assert_eq!(got[Path::new("suid")].1, 0o755);
    assert_eq!(tree(&t2).keys().collect::<Vec<_>>(), [Path::new("scratch")]);
    assert!(
        fs::symlink_metadata(ws2.join("host-link"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    // Export again: the same stream (the tree is the same).
    let mut again = Vec::new();
    export(&[root(&ws2, "/workspace"), root(&t2, "/tmp")], &mut again).unwrap();
    assert_eq!(again.len(), tar.len());

    // Clearing leaves the roots empty (the read-only dir included).
    clear(&[root(&ws2, "/workspace")]).unwrap();
    assert!(tree(&ws2).is_empty());
    fs::set_permissions(ws.join("ro-dir"), fs::Permissions::from_mode(0o755)).unwrap();
}

/// A tar with one regular file at a raw path the tar crate's builder would refuse to write.
/// (path, kind, link target, data)
type RawEntry<'a> = (&'a [u8], tar::EntryType, &'a [u8], &'a [u8]);

fn raw_tar(entries: &[RawEntry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, kind, link, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path);
        h.as_gnu_mut().unwrap().linkname[..link.len()].copy_from_slice(link);
        h.set_entry_type(*kind);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

#[test]
fn hostile_paths_are_refused_and_nothing_is_written_outside() {
    use tar::EntryType::{Directory, Regular, Symlink};
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("box/ws");
    fs::create_dir_all(&ws).unwrap();
    let bait = tmp.path().join("bait");
    fs::create_dir(&bait).unwrap();
    fs::write(bait.join("x"), "bait").unwrap();
    let bait_abs = bait.join("abs");
    let bait_abs = bait_abs.to_str().unwrap().as_bytes().to_vec();
    let bait_dir = bait.to_str().unwrap().as_bytes().to_vec();
    let cases: Vec<Vec<u8>> = vec![
        raw_tar(&[(b"workspace/../../../bait/x", Regular, b"", b"evil")]),
        raw_tar(&[(b"../bait/x", Regular, b"", b"evil")]),
        raw_tar(&[(&bait_abs, Regular, b"", b"evil")]),
        raw_tar(&[(b"etc/passwd", Regular, b"", b"evil")]),
        raw_tar(&[(b"workspacex/y", Regular, b"", b"evil")]),
        // A symlink the stream made, then a path through it.
        raw_tar(&[
            (b"workspace/link", Symlink, &bait_dir, b""),
            (b"workspace/link/x", Regular, b"", b"evil"),
        ]),
        raw_tar(&[
            (b"workspace/link", Symlink, &bait_dir, b""),
            (b"workspace/link/sub", Directory, b"", b""),
        ]),
    ];
    for (i, case) in cases.iter().enumerate() {
        let r = import(&[root(&ws, "/workspace")], &mut Cursor::new(case), (0, 0));
        assert!(r.is_err(), "case {i} was accepted");
        assert_eq!(fs::read(bait.join("x")).unwrap(), b"bait", "case {i}");
        assert_eq!(tree(&bait).len(), 1, "case {i} wrote into the bait dir");
        assert!(!tmp.path().join("box/x").exists());
        assert!(!tmp.path().join("box/bait").exists());
    }
    // A symlink at a root's top is made, not followed.
    let ok = raw_tar(&[(b"workspace/link", Symlink, &bait_dir, b"")]);
    import(&[root(&ws, "/workspace")], &mut Cursor::new(&ok), (0, 0)).unwrap();
    assert!(
        fs::symlink_metadata(ws.join("link"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // Clearing removes the symlink, not what it points to.
    clear(&[root(&ws, "/workspace")]).unwrap();
    assert_eq!(fs::read(bait.join("x")).unwrap(), b"bait");
    assert!(tree(&ws).is_empty());
}

#[test]
fn a_root_that_is_a_symlink_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    symlink(tmp.path(), tmp.path().join("l")).unwrap();
    assert!(Root::open(&tmp.path().join("l"), "/workspace").is_err());
}

#[test]
fn fifos_and_sockets_are_skipped_without_hanging() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        ws.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(ws.join("sock")).unwrap();
    fs::write(ws.join("file"), "f").unwrap();
    let roots = [root(ws, "/workspace")];
    let index = Index::scan(&roots).unwrap();
    assert_eq!(index.len(), 1);
    assert!(index.get("/workspace/file").is_some());
    let mut out = Vec::new();
    let e = export(&roots, &mut out).unwrap();
    assert_eq!((e.files, e.skipped), (1, 2));
    // Clearing removes them (unlinking never opens).
    clear(&roots).unwrap();
    assert_eq!(fs::read_dir(ws).unwrap().count(), 0);
}

/// A file that grows or shrinks between the header and its data: the stream stays well formed.
#[test]
fn sized_reads_keep_the_stream_well_formed() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir(&ws).unwrap();
    fs::write(ws.join("a"), vec![1u8; 2_000_000]).unwrap(); // past SMALL: read while written
    let roots = [root(&ws, "/workspace")];
    // A writer that truncates the file while the export writes the stream.
    struct Shrinker {
        out: Vec<u8>,
        path: PathBuf,
        done: bool,
    }
    impl Write for Shrinker {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if !self.done && self.out.len() >= 512 {
                fs::write(&self.path, b"short").unwrap();
                self.done = true;
            }
            self.out.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = Shrinker {
        out: Vec::new(),
        path: ws.join("a"),
        done: false,
    };
    export(&roots, &mut w).unwrap();
    assert!(w.done);
    let mut ar = tar::Archive::new(Cursor::new(&w.out));
    let mut e = ar.entries().unwrap().next().unwrap().unwrap();
    assert_eq!(e.size(), 2_000_000);
    let mut data = Vec::new();
    std::io::Read::read_to_end(&mut e, &mut data).unwrap();
    assert_eq!(data.len(), 2_000_000);
    // What was read before the cut, then zeros.
    assert_eq!(data[0], 1);
    assert_eq!(*data.last().unwrap(), 0, "padded with zeros");
    assert!(data[5..].iter().all(|&b| b == 0 || b == 1));
}

/// Needs root (mount): a mount beneath a root is not crossed, and a full tmpfs is recognisable.
#[test]
fn mounts_are_not_crossed_and_a_full_disk_is_recognisable() {
    if !is_root() {
        eprintln!("skipped: needs root to mount a tmpfs");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir_all(ws.join("mnt")).unwrap();
    let mount = |target: &Path, data: &str| {
        let data = std::ffi::CString::new(data).unwrap();
        rustix::mount::mount(
            "tmpfs",
            target,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            Some(data.as_c_str()),
        )
    };
    mount(&ws.join("mnt"), "size=1m").unwrap();
    struct Unmount(Vec<PathBuf>);
    impl Drop for Unmount {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = rustix::mount::unmount(p, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
    let mut guard = Unmount(vec![ws.join("mnt")]);
    fs::write(ws.join("mnt/hidden"), "on another fs").unwrap();
    fs::write(ws.join("seen"), "x").unwrap();
    let roots = [root(&ws, "/workspace")];
    let index = Index::scan(&roots).unwrap();
    assert!(index.get("/workspace/seen").is_some());
    assert!(index.get("/workspace/mnt").is_none());
    assert!(index.get("/workspace/mnt/hidden").is_none());
    let mut out = Vec::new();
    export(&roots, &mut out).unwrap();
    clear(&roots).unwrap();
    assert_eq!(fs::read(ws.join("mnt/hidden")).unwrap(), b"on another fs");

    // A 64 KiB tmpfs and a 1 MB file.
    let small = tmp.path().join("small");
    fs::create_dir(&small).unwrap();
    mount(&small, "size=64k").unwrap();
    guard.0.push(small.clone());
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("big"), vec![7u8; 1 << 20]).unwrap();
    let mut tar = Vec::new();
    export(&[root(&src, "/workspace")], &mut tar).unwrap();
    let err = import(&[root(&small, "/workspace")], &mut Cursor::new(&tar), (0, 0)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc_enospc()), "{err}");
    assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
}

fn libc_enospc() -> i32 {
    rustix::io::Errno::NOSPC.raw_os_error()
}

/// Deeper than MAX_DEPTH: the scan says it is truncated, the export skips, clear empties it.
#[test]
fn a_very_deep_tree_is_bounded_and_still_cleared() {
    let tmp = tempfile::tempdir().unwrap();
    let deep: PathBuf = std::iter::repeat_n("d", airlock_fstree::MAX_DEPTH * 2 + 10).collect();
    fs::create_dir_all(tmp.path().join(&deep)).unwrap();
    fs::write(tmp.path().join(&deep).join("f"), "x").unwrap();
    let roots = [root(tmp.path(), "/workspace")];
    let index = Index::scan(&roots).unwrap();
    assert!(index.truncated());
    assert_eq!(diff(&index, &index), (vec![], true));
    let e = export(&roots, &mut std::io::sink()).unwrap();
    assert!(e.skipped >= 1);
    clear(&roots).unwrap();
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
}
