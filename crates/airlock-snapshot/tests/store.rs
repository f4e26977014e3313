//! The snapshot store against a real directory: round trips, dedup, deletes, budget,
//! restarts, a put killed mid-way, hostile streams, full states, concurrency.

mod util;

use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_snapshot::{SnapshotKind, Store, StoreError};
use tar::{EntryType, Header};
use util::*;

const GIB: u64 = 1 << 30;

/// Every kind of entry airlock-fstree emits, with the awkward sizes and names.
fn varied() -> Vec<Item> {
    let long_dir = format!("workspace/{}/", "d".repeat(120));
    let long_file = format!("{long_dir}{}", "f".repeat(150));
    vec![
        util::dir("workspace/"),
        file("workspace/empty", b""),
        file("workspace/one", b"x"),
        file("workspace/511", &noise(1, 511)),
        file("workspace/512", &noise(2, 512)),
        file("workspace/513", &noise(3, 513)),
        file("workspace/same-as-512", &noise(2, 512)),
        file("workspace/big", &noise(4, (1 << 20) * 5 + 17)),
        dir(&long_dir),
        file(&long_file, b"long name"),
        link("workspace/rel", "512"),
        link("workspace/abs", "/etc/passwd"),
        link("workspace/longlink", &format!("../{}", "t".repeat(200))),
        Item::File(b"workspace/not-utf8-\xff\xfe".to_vec(), 0o600, b"bytes".to_vec()),
        Item::Dir(b"workspace/private/".to_vec(), 0o700),
        Item::File(
            b"workspace/private/run.sh".to_vec(),
            0o755,
            b"#!/bin/sh\n".to_vec(),
        ),
        dir("tmp/"),
        file("tmp/scratch", &noise(5, 3000)),
        dir("dev/shm/"),
        file("dev/shm/seg", &noise(6, 100)),
    ]
}

#[test]
fn round_trip_is_byte_exact() {
    let t = tempdir();
    let store = Store::open(&store_dir(&t), GIB).unwrap();
    let input = build(&varied());
    let rec = store.put(snap(Some("k1")), &mut &input[..]).unwrap();
    let out = tar_of(&store, &rec.id);
    assert!(
        out == input,
        "tar() differs from the input ({} vs {} bytes)",
        out.len(),
        input.len()
    );
    assert!(rec.id.starts_with("snap-") && rec.id.len() == 21, "{}", rec.id);
    assert_eq!(rec.kind, SnapshotKind::Filesystem);
    assert_eq!(rec.files, 12);
    let logical: u64 = varied()
        .iter()
        .map(|i| {
            if let Item::File(_, _, c) = i {
                c.len() as u64
            } else {
                0
            }
        })
        .sum();
    assert_eq!(rec.bytes, logical);
    // The duplicate 512-byte file is stored once.
    let pack = std::fs::metadata(store_dir(&t).join("packs").join(format!("{}.pack", rec.id))).unwrap();
    assert_eq!(pack.len(), logical - 512);
    assert_eq!(store.get(&rec.id).unwrap(), rec);
    // Headers as the tar crate's Builder writes them are rebuilt, not kept verbatim.
    let json =
        std::fs::read_to_string(store_dir(&t).join("records").join(format!("{}.json", rec.id))).unwrap();
    assert!(!json.contains("\"r\":"), "raw headers kept: {json}");
    assert_eq!(store.usage().used_bytes, rec.stored_bytes);
    assert_eq!(store.usage().snapshots, 1);

    // The same files read back through the tar crate: same entries, modes, mtimes, targets.
    let mut a = tar::Archive::new(&out[..]);
    let mut b = tar::Archive::new(&input[..]);
    let mut ea = a.entries().unwrap();
    for eb in b.entries().unwrap() {
        let (mut x, mut y) = (ea.next().unwrap().unwrap(), eb.unwrap());
        assert_eq!(x.path_bytes(), y.path_bytes());
        assert_eq!(x.header().mode().unwrap(), y.header().mode().unwrap());
        assert_eq!(x.header().mtime().unwrap(), y.header().mtime().unwrap());
        assert_eq!(x.link_name_bytes(), y.link_name_bytes());
        let (mut cx, mut cy) = (Vec::new(), Vec::new());
        x.read_to_end(&mut cx).unwrap();
        y.read_to_end(&mut cy).unwrap();
        assert!(cx == cy);
    }
    assert!(ea.next().is_none());
}

/// Streams whose headers the tar crate's Builder would not write (ustar, PAX records, a uid
/// left blank, GNU tar's 10 KiB end padding) come back byte for byte too.
#[test]
fn round_trip_of_foreign_headers() {
    let t = tempdir();
    let store = Store::open(&store_dir(&t), GIB).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = Header::new_ustar();
    h.set_entry_type(EntryType::Regular);
    h.set_mode(0o640);
    h.set_mtime(7);
    h.set_size(3);
    b.append_data(&mut h, format!("workspace/{}/u", "p".repeat(120)), &b"abc"[..])
        .unwrap();
    b.append_pax_extensions([
        ("mtime", &b"1764000000.123456789"[..]),
        ("path", b"workspace/pax-path"),
    ])
    .unwrap();
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::Regular);
    h.set_mode(0o600);
    h.set_size(4);
    b.append_data(&mut h, "workspace/ignored-name", &b"pax!"[..])
        .unwrap();
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::Directory);
    h.set_mode(0o755);
    h.as_gnu_mut().unwrap().uname[..4].copy_from_slice(b"root");
    b.append_data(&mut h, "tmp/", io::empty()).unwrap();
    let mut input = b.into_inner().unwrap();
    input.resize(input.len() + 10240 - 1024, 0);
    let rec = store.put(snap(None), &mut &input[..]).unwrap();
    assert!(tar_of(&store, &rec.id) == input);
    let mut ar = tar::Archive::new(&input[..]);
    let paths: Vec<Vec<u8>> = ar
        .entries()
        .unwrap()
        .take(2) // the tar crate cannot read the third's blank size field
        .map(|e| e.unwrap().path_bytes().into_owned())
        .collect();
    assert_eq!(paths[1], b"workspace/pax-path");
}

#[test]
fn dedup_within_an_owner_and_not_across() {
    let t = tempdir();
    let dir = store_dir(&t);
    let store = Store::open(&dir, GIB).unwrap();
    let input = build(&workspace(200, 10_000, 1));
    let a = store.put(snap(Some("k1")), &mut &input[..]).unwrap();
    assert!(a.stored_bytes > 2_000_000, "{a:?}");
    let b = store.put(snap(Some("k1")), &mut &input[..]).unwrap();
    assert!(
        b.stored_bytes < 100_000,
        "a second put of the same files stored {} bytes",
        b.stored_bytes
    );
    assert_eq!(
        names(&dir, "packs"),
        vec![format!("{}.pack", a.id)],
        "the second put made a pack"
    );
    // Another owner pays in full: nothing tells it that k1 holds these files.
    let c = store.put(snap(Some("k2")), &mut &input[..]).unwrap();
    assert!(c.stored_bytes > 2_000_000, "{c:?}");
    let d = store.put(snap(None), &mut &input[..]).unwrap();
    assert!(d.stored_bytes > 2_000_000, "{d:?}");
    assert_eq!(names(&dir, "packs").len(), 3);
    for r in [&a, &b, &c, &d] {
        assert!(tar_of(&store, &r.id) == input);
    }
    // One file changed: only it is new.
    let mut items = workspace(200, 10_000, 1);
    items.push(file("workspace/new", &noise(99, 50_000)));
    let e = store.put(snap(Some("k1")), &mut &build(&items)[..]).unwrap();
    assert!(e.stored_bytes > 50_000 && e.stored_bytes < 150_000, "{e:?}");
    // Large files (streamed into the pack, not batched) dedup too.
    let big = build(&[
        util::dir("workspace/"),
        file("workspace/big", &noise(30, 3 << 20)),
        file("workspace/small", b"s"),
    ]);
    let f = store.put(snap(Some("k1")), &mut &big[..]).unwrap();
    assert!(f.stored_bytes > 3 << 20, "{f:?}");
    let g = store.put(snap(Some("k1")), &mut &big[..]).unwrap();
    assert!(g.stored_bytes < 2000, "{g:?}");
    assert!(!names(&dir, "packs").contains(&format!("{}.pack", g.id)));
    assert!(tar_of(&store, &g.id) == big);
    let used: u64 = store.list().iter().map(|r| r.stored_bytes).sum();
    assert_eq!(store.usage().used_bytes, used);
}

#[test]
fn delete_frees_packs_only_when_unreferenced() {
    let t = tempdir();
    let dir = store_dir(&t);
    let store = Store::open(&dir, GIB).unwrap();
    let base = workspace(50, 20_000, 2);
    let first_input = build(&base);
    let first = store.put(snap(Some("k1")), &mut &first_input[..]).unwrap();
    let mut more = base.clone();
    more.push(file("workspace/extra", &noise(7, 30_000)));
    let second_input = build(&more);
    let second = store.put(snap(Some("k1")), &mut &second_input[..]).unwrap();
    assert_eq!(names(&dir, "packs").len(), 2);

    // A stream opened before the delete still reads to the end.
    let mut early = store.tar(&first.id).unwrap();
    let gone = store.delete(&first.id).unwrap();
    assert_eq!(gone.id, first.id);
    assert!(store.get(&first.id).is_none());
    assert!(matches!(store.delete(&first.id), Err(StoreError::NotFound(_))));
    assert!(matches!(store.tar(&first.id), Err(StoreError::NotFound(_))));
    // Its pack stays: the second snapshot's files live in it.
    assert!(names(&dir, "packs").contains(&format!("{}.pack", first.id)));
    assert!(tar_of(&store, &second.id) == second_input);
    let mut out = Vec::new();
    early.read_to_end(&mut out).unwrap();
    assert!(out == first_input);
    // A third snapshot of the same files still dedups against the surviving pack.
    let third = store.put(snap(Some("k1")), &mut &first_input[..]).unwrap();
    assert!(third.stored_bytes < 50_000, "{third:?}");

    store.delete(&second.id).unwrap();
    assert!(names(&dir, "packs").contains(&format!("{}.pack", first.id)));
    store.delete(&third.id).unwrap();
    assert_empty(&dir);
    assert_eq!(store.usage().used_bytes, 0);
    assert_eq!(store.usage().snapshots, 0);
    // After the packs went, the same files are stored in full again.
    let fourth = store.put(snap(Some("k1")), &mut &first_input[..]).unwrap();
    assert!(fourth.stored_bytes > 900_000, "{fourth:?}");
    assert!(tar_of(&store, &fourth.id) == first_input);
}

#[test]
fn over_budget_put_is_refused_and_leaves_nothing() {
    let t = tempdir();
    let dir = store_dir(&t);
    let input = build(&workspace(100, 10_000, 3)); // 1 MB of files
    let store = Store::open(&dir, 500_000).unwrap();
    match store.put(snap(Some("k1")), &mut &input[..]) {
        Err(StoreError::Budget { needed, used, budget }) => {
            assert!(needed > 1_000_000, "needed {needed}");
            assert_eq!((used, budget), (0, 500_000));
        }
        other => panic!("expected Budget, got {other:?}"),
    }
    assert_empty(&dir);
    assert_eq!(store.usage().used_bytes, 0);

    // A large file (streamed) over budget.
    let big = build(&[
        util::dir("workspace/"),
        file("workspace/big", &noise(31, 3 << 20)),
    ]);
    match store.put(snap(Some("k1")), &mut &big[..]) {
        Err(StoreError::Budget { needed, .. }) => assert!(needed > 3 << 20, "needed {needed}"),
        other => panic!("expected Budget, got {other:?}"),
    }
    assert_empty(&dir);

    // With a full state: the staging directory goes too.
    let staging = store.staging().unwrap();
    std::fs::write(staging.path().join("mem"), noise(8, 300_000)).unwrap();
    let staged = staging.path().to_path_buf();
    let small = build(&workspace(10, 20_000, 4));
    let mut s = snap(Some("k1"));
    s.full = Some(staging);
    assert!(matches!(
        store.put(s, &mut &small[..]),
        Err(StoreError::Budget { .. })
    ));
    assert!(!staged.exists());
    assert_empty(&dir);

    // One fits; the next does not, and the first is untouched.
    let ok = store.put(snap(Some("k1")), &mut &small[..]).unwrap();
    let other = build(&workspace(10, 30_000, 5));
    match store.put(snap(Some("k1")), &mut &other[..]) {
        Err(StoreError::Budget { used, .. }) => assert_eq!(used, ok.stored_bytes),
        other => panic!("expected Budget, got {other:?}"),
    }
    assert_eq!(store.list(), vec![ok.clone()]);
    assert_eq!(names(&dir, "packs"), vec![format!("{}.pack", ok.id)]);
    assert_eq!(names(&dir, "tmp"), Vec::<String>::new());
    // A second copy of it is nearly free, so it fits.
    store.put(snap(Some("k1")), &mut &small[..]).unwrap();
}

#[test]
fn restart_keeps_records_and_cleans_orphans() {
    let t = tempdir();
    let dir = store_dir(&t);
    let a_in = build(&workspace(30, 5_000, 6));
    let b_in = build(&varied());
    let (a, b, usage);
    {
        let store = Store::open(&dir, GIB).unwrap();
        a = store.put(snap(Some("k1")), &mut &a_in[..]).unwrap();
        let staging = store.staging().unwrap();
        std::fs::create_dir(staging.path().join("sub")).unwrap();
        std::fs::write(staging.path().join("sub/pages"), noise(9, 40_000)).unwrap();
        let mut s = snap(Some("k1"));
        s.full = Some(staging);
        b = store.put(s, &mut &b_in[..]).unwrap();
        usage = store.usage();
        // A staging directory a tier was writing when the daemon died.
        std::mem::forget(store.staging().unwrap());
    }
    // What a crash could leave: temporary files, a pack and a full state without a record,
    // a record whose pack is gone, a record that does not parse.
    std::fs::write(dir.join("tmp/snap-00000000000000aa.pack"), b"partial").unwrap();
    std::fs::write(dir.join("tmp/snap-00000000000000aa.json"), b"{").unwrap();
    std::fs::write(dir.join("packs/snap-00000000000000bb.pack"), b"orphan").unwrap();
    std::fs::create_dir(dir.join("full/snap-00000000000000cc")).unwrap();
    let rec_b = std::fs::read_to_string(dir.join(format!("records/{}.json", b.id))).unwrap();
    let dangling = rec_b.replace(&b.id, "snap-00000000000000dd");
    std::fs::write(dir.join("records/snap-00000000000000dd.json"), dangling).unwrap();
    std::fs::write(dir.join("records/snap-00000000000000ee.json"), b"not json").unwrap();
    std::fs::write(dir.join("records/stray"), b"?").unwrap();

    let store = Store::open(&dir, GIB).unwrap();
    assert_eq!(store.list(), vec![a.clone(), b.clone()]);
    assert_eq!(store.usage(), usage);
    assert_eq!(names(&dir, "tmp"), Vec::<String>::new());
    assert_eq!(names(&dir, "staging"), Vec::<String>::new());
    let mut packs = vec![format!("{}.pack", a.id), format!("{}.pack", b.id)];
    packs.sort();
    assert_eq!(names(&dir, "packs"), packs);
    assert_eq!(names(&dir, "full"), vec![b.id.clone()]);
    let mut records = vec![format!("{}.json", a.id), format!("{}.json", b.id)];
    records.sort();
    assert_eq!(names(&dir, "records"), records);
    assert!(tar_of(&store, &a.id) == a_in);
    assert!(tar_of(&store, &b.id) == b_in);
    assert_eq!(
        std::fs::read(store.full_dir(&b.id).unwrap().join("sub/pages")).unwrap(),
        noise(9, 40_000)
    );
    // The dedup index came back from the records.
    let again = store.put(snap(Some("k1")), &mut &a_in[..]).unwrap();
    assert!(again.stored_bytes < 20_000, "{again:?}");

    // A record whose pack vanished is dropped at the next open, and what it alone used goes.
    drop(store);
    std::fs::remove_file(dir.join(format!("packs/{}.pack", a.id))).unwrap();
    let store = Store::open(&dir, GIB).unwrap();
    assert_eq!(store.list(), vec![b.clone()]);
}

#[test]
fn a_second_open_of_the_same_directory_fails() {
    let t = tempdir();
    let dir = store_dir(&t);
    let store = Store::open(&dir, GIB).unwrap();
    let err = Store::open(&dir, GIB).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    assert!(err.to_string().contains("in use"), "{err}");
    drop(store);
    Store::open(&dir, GIB).unwrap();
}

const CHILD_ENV: &str = "AIRLOCK_SNAPSHOT_TEST_CHILD";

/// A tar stream that hands out `head`, then tells the parent (a file) and never ends.
struct Stall {
    head: Vec<u8>,
    pos: usize,
    ready: std::path::PathBuf,
}

impl Read for Stall {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos < self.head.len() {
            let n = buf.len().min(self.head.len() - self.pos);
            buf[..n].copy_from_slice(&self.head[self.pos..self.pos + n]);
            self.pos += n;
            return Ok(n);
        }
        std::fs::write(&self.ready, b"ready").unwrap();
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
}

/// The child's side: one put that completes, one that stalls half-way (its pack partly
/// written) until the parent kills the process.
fn child(dir: &Path, ready: &Path) -> ! {
    let store = Store::open(dir, GIB).unwrap();
    let done = build(&workspace(20, 1000, 10));
    store.put(snap(Some("k1")), &mut &done[..]).unwrap();
    // 12 MB of files, cut before the end-of-archive marker: more than one buffer's worth
    // (4 MiB) reaches the pack file before the stall.
    let mut head = build(&workspace(12, 1 << 20, 11));
    head.truncate(head.len() - 1024);
    let mut s = snap(Some("k1"));
    let staging = store.staging().unwrap();
    std::fs::write(staging.path().join("mem"), noise(12, 100_000)).unwrap();
    s.full = Some(staging);
    let _ = store.put(
        s,
        &mut Stall {
            head,
            pos: 0,
            ready: ready.to_path_buf(),
        },
    );
    unreachable!("the stalled put returned");
}

#[test]
fn a_put_killed_midway_leaves_nothing() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(Path::new(&dir), &Path::new(&dir).with_extension("ready"));
    }
    let t = tempdir();
    let dir = store_dir(&t);
    let ready = dir.with_extension("ready");
    let mut proc = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_put_killed_midway_leaves_nothing",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !ready.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the child never reached the stall"
        );
        assert!(proc.try_wait().unwrap().is_none(), "the child exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Mid-put: a partial pack on disk, a staged full state, no record yet.
    let tmp = names(&dir, "tmp");
    assert_eq!(tmp.len(), 1, "{tmp:?}");
    assert!(std::fs::metadata(dir.join("tmp").join(&tmp[0])).unwrap().len() >= 4 << 20);
    assert_eq!(names(&dir, "staging").len(), 1);
    assert_eq!(names(&dir, "records").len(), 1);
    // The second open is refused while the child holds the store.
    assert!(Store::open(&dir, GIB).is_err());
    proc.kill().unwrap(); // SIGKILL
    proc.wait().unwrap();

    let store = Store::open(&dir, GIB).unwrap();
    let list = store.list();
    assert_eq!(list.len(), 1, "{list:?}");
    assert!(tar_of(&store, &list[0].id) == build(&workspace(20, 1000, 10)));
    assert_eq!(names(&dir, "tmp"), Vec::<String>::new());
    assert_eq!(names(&dir, "staging"), Vec::<String>::new());
    assert_eq!(names(&dir, "full"), Vec::<String>::new());
    assert_eq!(names(&dir, "packs"), vec![format!("{}.pack", list[0].id)]);
    assert_eq!(store.usage().used_bytes, list[0].stored_bytes);
}

/// A header with raw name bytes (the tar crate refuses to write hostile names itself).
fn raw_entry(name: &[u8], kind: EntryType, link: &[u8], size: u64) -> Vec<u8> {
    let mut h = Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_mtime(1);
    h.set_size(size);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.resize(out.len() + size.div_ceil(512) as usize * 512, b'a');
    out
}

fn refused(store: &Store, dir: &Path, stream: &[u8], reason: &str) {
    match store.put(snap(Some("k1")), &mut &stream[..]) {
        Err(StoreError::InvalidTar { reason: r, .. }) => {
            assert!(r.contains(reason), "{r:?} does not say {reason:?}")
        }
        other => panic!("expected a refusal ({reason}), got {other:?}"),
    }
    for sub in ["tmp", "packs", "records"] {
        assert_eq!(
            names(dir, sub),
            Vec::<String>::new(),
            "{sub}/ after refusing ({reason})"
        );
    }
}

#[test]
fn hostile_streams_are_refused() {
    let t = tempdir();
    let dir = store_dir(&t);
    let store = Store::open(&dir, GIB).unwrap();
    let ok = build(&[dir_item(), file("workspace/a", &noise(1, 70_000))]);
    let body = &ok[..ok.len() - 1024];
    let with = |e: Vec<u8>| [body, &e[..], &[0u8; 1024][..]].concat();
    refused(
        &store,
        &dir,
        &with(raw_entry(b"workspace/h", EntryType::Link, b"workspace/a", 0)),
        "hard link",
    );
    refused(
        &store,
        &dir,
        &with(raw_entry(b"workspace/c", EntryType::Char, b"", 0)),
        "character device",
    );
    refused(
        &store,
        &dir,
        &with(raw_entry(b"workspace/b", EntryType::Block, b"", 0)),
        "block device",
    );
    refused(
        &store,
        &dir,
        &with(raw_entry(b"workspace/p", EntryType::Fifo, b"", 0)),
        "FIFO",
    );
    refused(
        &store,
        &dir,
        &with(raw_entry(b"/etc/passwd", EntryType::Regular, b"", 3)),
        "absolute",
    );
    refused(
        &store,
        &dir,
        &with(raw_entry(b"workspace/../../etc/x", EntryType::Regular, b"", 3)),
        "..",
    );
    refused(
        &store,
        &dir,
        &with(raw_entry(b"etc/cron.d/x", EntryType::Regular, b"", 3)),
        "outside",
    );
    refused(
        &store,
        &dir,
        &with(raw_entry(b"workspace/s", EntryType::GNUSparse, b"", 0)),
        "sparse",
    );
    refused(
        &store,
        &dir,
        &with(raw_entry(b"pax_global", EntryType::XGlobalHeader, b"", 0)),
        "global PAX",
    );
    refused(
        &store,
        &dir,
        &with(raw_entry(b"workspace/d/", EntryType::Directory, b"", 5)),
        "with content",
    );
    refused(
        &store,
        &dir,
        &with(raw_entry(b"workspace/l", EntryType::Symlink, b"", 0)),
        "symlink target",
    );
    // A GNU long name hiding `..`.
    let mut long = raw_entry(b"././@LongLink", EntryType::GNULongName, b"", 0);
    let name = format!("workspace/{}/../../../etc/shadow\0", "x".repeat(100));
    let mut h = Header::from_byte_slice(&long[..512]).clone();
    h.set_size(name.len() as u64);
    h.set_cksum();
    long = h.as_bytes().to_vec();
    long.extend_from_slice(name.as_bytes());
    long.resize(512 + name.len().div_ceil(512) * 512, 0);
    long.extend(raw_entry(b"workspace/innocent", EntryType::Regular, b"", 3));
    refused(&store, &dir, &with(long), "..");
    // A PAX path escaping.
    let mut b = tar::Builder::new(Vec::new());
    b.append_pax_extensions([("path", &b"/root/.ssh/authorized_keys"[..])])
        .unwrap();
    let mut pax = b.into_inner().unwrap();
    pax.truncate(pax.len() - 1024);
    pax.extend(raw_entry(b"workspace/k", EntryType::Regular, b"", 3));
    refused(&store, &dir, &with(pax), "absolute");
    // Writing through a symlink of the same stream, and a root replaced by a symlink.
    let through = build(&[
        util::dir("workspace/"),
        link("workspace/etc", "/etc"),
        file("workspace/etc/passwd", b"x"),
    ]);
    refused(&store, &dir, &through, "beneath a symlink");
    let through = build(&[link("tmp", "/"), file("tmp/x", b"x")]);
    refused(&store, &dir, &through, "not a directory");
    // Broken framing.
    refused(&store, &dir, &ok[..ok.len() - 1024], "end-of-archive");
    refused(&store, &dir, &ok[..ok.len() - 1024 - 600], "truncated");
    refused(&store, &dir, &ok[..1000], "truncated");
    refused(
        &store,
        &dir,
        &[&ok[..], b"garbage"].concat(),
        "after the end-of-archive",
    );
    let mut bad_sum = ok.clone();
    bad_sum[0] ^= 1;
    refused(&store, &dir, &bad_sum, "checksum");
    refused(&store, &dir, &noise(3, 4096), "checksum");
    assert!(store.list().is_empty());
    assert_eq!(store.usage().used_bytes, 0);
    // The store still works.
    let rec = store.put(snap(Some("k1")), &mut &ok[..]).unwrap();
    assert!(tar_of(&store, &rec.id) == ok);
}

fn dir_item() -> Item {
    util::dir("workspace/")
}

#[test]
fn full_state_is_adopted_and_removed_on_delete() {
    let t = tempdir();
    let dir = store_dir(&t);
    let store = Store::open(&dir, GIB).unwrap();
    // An unused staging directory goes when dropped.
    let unused = store.staging().unwrap();
    let unused_path = unused.path().to_path_buf();
    assert!(unused_path.is_dir() && unused_path.starts_with(&dir));
    drop(unused);
    assert!(!unused_path.exists());

    let staging = store.staging().unwrap();
    std::fs::write(staging.path().join("memory.img"), noise(13, 200_000)).unwrap();
    std::fs::write(staging.path().join("state.json"), b"{}").unwrap();
    let staged = staging.path().to_path_buf();
    let input = build(&workspace(10, 1000, 14));
    let mut s = snap(Some("k1"));
    s.full = Some(staging);
    let rec = store.put(s, &mut &input[..]).unwrap();
    assert_eq!(rec.kind, SnapshotKind::Full);
    assert!(!staged.exists(), "the staging directory was copied, not moved");
    let full = store.full_dir(&rec.id).unwrap();
    assert_eq!(full, dir.join("full").join(&rec.id));
    assert_eq!(
        std::fs::read(full.join("memory.img")).unwrap(),
        noise(13, 200_000)
    );
    assert!(rec.stored_bytes > 200_000 + 10_000, "{rec:?}");
    assert_eq!(store.usage().used_bytes, rec.stored_bytes);
    assert!(tar_of(&store, &rec.id) == input);

    // A filesystem snapshot has no full dir; nor has an unknown id.
    let fs_only = store.put(snap(Some("k1")), &mut &input[..]).unwrap();
    assert!(store.full_dir(&fs_only.id).is_none());
    assert!(store.full_dir("snap-0000000000000000").is_none());

    // Another store's staging directory is refused.
    let t2 = tempdir();
    let other = Store::open(&store_dir(&t2), GIB).unwrap();
    let mut s = snap(Some("k1"));
    s.full = Some(other.staging().unwrap());
    assert!(matches!(
        store.put(s, &mut &input[..]),
        Err(StoreError::ForeignStaging(_))
    ));
    assert_empty(&store_dir(&t2));

    store.delete(&rec.id).unwrap();
    assert!(!full.exists());
    store.delete(&fs_only.id).unwrap();
    assert_empty(&dir);
    assert_eq!(store.usage().used_bytes, 0);
}

#[test]
fn concurrent_puts_tars_and_deletes() {
    let t = tempdir();
    let dir = store_dir(&t);
    let store = Arc::new(Store::open(&dir, GIB).unwrap());
    let shared = Arc::new(build(&workspace(40, 4000, 15)));
    let threads: Vec<_> = (0..4)
        .map(|n| {
            let (store, shared) = (store.clone(), shared.clone());
            std::thread::spawn(move || {
                let owner = format!("k{}", n % 2);
                let mut mine = workspace(40, 4000, 15);
                mine.push(file("workspace/own", &noise(100 + n, 5000)));
                let mine = build(&mine);
                for _ in 0..15 {
                    let a = store.put(snap(Some(&owner)), &mut &shared[..]).unwrap();
                    let b = store.put(snap(Some(&owner)), &mut &mine[..]).unwrap();
                    store.delete(&a.id).unwrap();
                    assert!(tar_of(&store, &b.id) == mine);
                    store.delete(&b.id).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_empty(&dir);
    assert_eq!(store.usage().used_bytes, 0);
}

#[test]
fn an_empty_snapshot_round_trips() {
    let t = tempdir();
    let dir = store_dir(&t);
    let store = Store::open(&dir, GIB).unwrap();
    let input = build(&[]);
    assert_eq!(input.len(), 1024);
    let rec = store.put(snap(None), &mut &input[..]).unwrap();
    assert_eq!((rec.files, rec.bytes), (0, 0));
    assert!(tar_of(&store, &rec.id) == input);
    assert_eq!(names(&dir, "packs"), Vec::<String>::new());
    assert!(matches!(
        store.put(snap(None), &mut &b""[..]),
        Err(StoreError::InvalidTar { .. })
    ));
}

#[test]
fn store_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Store>();
}
