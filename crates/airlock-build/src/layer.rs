//! Layers: what a step changed, as a deterministic tar, gzip-compressed and stored.
//!
//! [`diff`] walks a step's tree against the tree it started from (both flattened from the
//! same layers) and lists what changed: a new or changed file, symlink or directory (by
//! type, permission bits, size, content or link target) becomes an entry, a name gone
//! becomes an OCI whiteout `.wh.<name>`, and a directory with any change below it gets an
//! entry of its own (flattening a layer sets a directory's mode from the layer's entry, so
//! every parent must carry its real mode). Owners are not compared: the step's tree was
//! handed to the sandbox user, and images' files are root's.
//!
//! [`write`] turns entries into a tar whose bytes depend only on the entries: sorted
//! depth-first, GNU headers with mtime 0, uid and gid 0, no user or group names; then
//! gzip without a name or a timestamp. So the same changes give the same digests.

use std::fs::{self, File};
use std::io::{self, Read, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use airlock_image::{Digest, Store};
use sha2::{Digest as _, Sha256};

use crate::Error;

/// One entry of a layer; `path` is relative to the image root, `/`-separated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A directory with these permission bits.
    Dir { path: String, mode: u32 },
    /// A regular file whose content is read from `src` on the host.
    File { path: String, mode: u32, src: PathBuf },
    /// A symbolic link.
    Symlink { path: String, target: Vec<u8> },
    /// An OCI whiteout for `path` (written as `dir/.wh.name`).
    Whiteout { path: String },
}

/// A stored layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layer {
    /// The gzip blob's digest (the store's layer key).
    pub digest: Digest,
    /// The uncompressed tar's digest (the config's `diff_ids`).
    pub diff_id: Digest,
    /// The blob's size.
    pub size: u64,
}

/// Paths the sandbox mounts over or binds onto (see `airlock_image::ROOT_MOUNT_DIRS`):
/// whatever they hold in a step's tree is not the step's doing, and never part of a layer.
fn is_mount_point(rel: &str) -> bool {
    airlock_image::ROOT_MOUNT_DIRS
        .iter()
        .chain(airlock_image::ROOT_MOUNT_FILES)
        .any(|m| m.trim_start_matches('/') == rel && *m != "/etc")
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}/{name}")
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Sorted names of a directory.
fn names(dir: &Path) -> Result<Vec<std::ffi::OsString>, Error> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map_err(io_err("list", dir))? {
        out.push(e.map_err(io_err("list", dir))?.file_name());
    }
    out.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(out)
}

/// What changed from `base` to `step` (see the module's documentation).
pub(crate) fn diff(base: &Path, step: &Path) -> Result<Vec<Entry>, Error> {
    let mut out = Vec::new();
    diff_dir(base, step, "", &mut out)?;
    Ok(out)
}

fn diff_dir(base: &Path, step: &Path, rel: &str, out: &mut Vec<Entry>) -> Result<(), Error> {
    let step_names = names(step)?;
    let base_names = names(base)?;
    let mut all: Vec<&std::ffi::OsString> = step_names.iter().chain(&base_names).collect();
    all.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    all.dedup();
    for name in all {
        let name_str = name.to_string_lossy().into_owned();
        let r = join(rel, &name_str);
        if is_mount_point(&r) {
            continue;
        }
        let (b, s) = (base.join(name), step.join(name));
        let bm = fs::symlink_metadata(&b).ok();
        let Some(sm) = fs::symlink_metadata(&s).ok() else {
            out.push(Entry::Whiteout { path: r });
            continue;
        };
        let mode = sm.mode() & 0o7777;
        let ft = sm.file_type();
        if ft.is_dir() {
            let same_dir = bm.as_ref().is_some_and(|m| m.is_dir());
            let mut below = Vec::new();
            if same_dir {
                diff_dir(&b, &s, &r, &mut below)?;
            } else {
                add_tree(&s, &r, &mut below)?;
            }
            let mode_changed = bm.as_ref().is_none_or(|m| m.mode() & 0o7777 != mode);
            if !same_dir || mode_changed || !below.is_empty() {
                out.push(Entry::Dir { path: r, mode });
                out.extend(below);
            }
        } else if ft.is_file() {
            let changed = match &bm {
                Some(m) if m.is_file() => {
                    m.mode() & 0o7777 != mode || m.len() != sm.len() || !same_content(&b, &s)?
                }
                _ => true,
            };
            if changed {
                out.push(Entry::File {
                    path: r,
                    mode,
                    src: s,
                });
            }
        } else if ft.is_symlink() {
            let target = fs::read_link(&s).map_err(io_err("read link", &s))?;
            let same = bm.as_ref().is_some_and(|m| m.file_type().is_symlink())
                && fs::read_link(&b).ok().as_deref() == Some(target.as_path());
            if !same {
                out.push(Entry::Symlink {
                    path: r,
                    target: target.as_os_str().as_bytes().to_vec(),
                });
            }
        } else if bm.is_some() {
            // A FIFO or socket replaced what was there: the old entry goes, the node is
            // not kept (layers hold no special files).
            out.push(Entry::Whiteout { path: r });
        }
    }
    Ok(())
}

/// Every entry of the tree at `dir` (itself excluded), as `rel/...`.
pub(crate) fn add_tree(dir: &Path, rel: &str, out: &mut Vec<Entry>) -> Result<(), Error> {
    for name in names(dir)? {
        let p = dir.join(&name);
        let r = join(rel, &name.to_string_lossy());
        let m = fs::symlink_metadata(&p).map_err(io_err("stat", &p))?;
        let mode = m.mode() & 0o7777;
        if m.is_dir() {
            out.push(Entry::Dir {
                path: r.clone(),
                mode,
            });
            add_tree(&p, &r, out)?;
        } else if m.is_file() {
            out.push(Entry::File {
                path: r,
                mode,
                src: p,
            });
        } else if m.file_type().is_symlink() {
            let target = fs::read_link(&p).map_err(io_err("read link", &p))?;
            out.push(Entry::Symlink {
                path: r,
                target: target.as_os_str().as_bytes().to_vec(),
            });
        }
    }
    Ok(())
}

fn open_nofollow(p: &Path) -> Result<File, Error> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)
        .map_err(io_err("open", p))
}

fn same_content(a: &Path, b: &Path) -> Result<bool, Error> {
    let (mut fa, mut fb) = (open_nofollow(a)?, open_nofollow(b)?);
    let (mut ba, mut bb) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    loop {
        let na = read_full(&mut fa, &mut ba).map_err(io_err("read", a))?;
        let nb = read_full(&mut fb, &mut bb).map_err(io_err("read", b))?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Feeds everything `r` reads to `h`.
pub(crate) fn hash_reader(r: &mut impl Read, h: &mut Sha256) -> io::Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn digest_of(h: Sha256) -> Digest {
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Digest::from_hex(&hex).expect("a sha256 is 64 hex digits")
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// Writes `entries` as a layer, stores its blob and unpacks it.
pub(crate) fn write(store: &Store, entries: &[Entry], work: &Path) -> Result<Layer, Error> {
    let tar_io = |e| Error::Io {
        op: "write layer",
        path: work.to_path_buf(),
        source: e,
    };
    let tmp = tempfile::tempfile_in(work).map_err(tar_io)?;
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(tmp, flate2::Compression::default());
    let mut outer = Hashing {
        inner: gz,
        hasher: Sha256::new(),
        bytes: 0,
    };
    {
        let mut b = tar::Builder::new(&mut outer);
        for e in entries {
            match e {
                Entry::Dir { path, mode } => {
                    let mut h = header(tar::EntryType::Directory, *mode, 0);
                    b.append_data(&mut h, format!("{path}/"), io::empty())
                        .map_err(tar_io)?;
                }
                Entry::File { path, mode, src } => {
                    let f = open_nofollow(src)?;
                    let len = f.metadata().map_err(io_err("stat", src))?.len();
                    let mut h = header(tar::EntryType::Regular, *mode, len);
                    // Exactly `len` bytes, whatever the file does meanwhile (nothing
                    // writes it: the step's processes are gone).
                    b.append_data(&mut h, path, f.take(len)).map_err(tar_io)?;
                }
                Entry::Symlink { path, target } => {
                    let mut h = header(tar::EntryType::Symlink, 0o777, 0);
                    let target = Path::new(std::ffi::OsStr::from_bytes(target));
                    b.append_link(&mut h, path, target).map_err(tar_io)?;
                }
                Entry::Whiteout { path } => {
                    let (dir, name) = match path.rsplit_once('/') {
                        Some((d, n)) => (format!("{d}/"), n),
                        None => (String::new(), path.as_str()),
                    };
                    let mut h = header(tar::EntryType::Regular, 0o644, 0);
                    b.append_data(&mut h, format!("{dir}.wh.{name}"), io::empty())
                        .map_err(tar_io)?;
                }
            }
        }
        b.finish().map_err(tar_io)?;
    }
    let diff_id = digest_of(outer.hasher);
    let mut tmp = outer.inner.finish().map_err(tar_io)?;
    tmp.flush().map_err(tar_io)?;
    let size = tmp.stream_position().map_err(tar_io)?;
    tmp.rewind().map_err(tar_io)?;
    let mut hasher = Sha256::new();
    hash_reader(&mut tmp, &mut hasher).map_err(tar_io)?;
    let digest = digest_of(hasher);
    tmp.rewind().map_err(tar_io)?;
    store.ensure_blob(&digest, Some(size), || Ok(tmp))?;
    store.unpack_layer(&digest, Some(airlock_image::manifest::MEDIA_OCI_LAYER_GZIP))?;
    Ok(Layer {
        digest,
        diff_id,
        size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn mk(root: &Path, rel: &str, content: &str, mode: u32) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, content).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn diff_finds_new_changed_and_deleted_and_skips_mount_points() {
        let d = tempfile::tempdir().unwrap();
        let (base, step) = (d.path().join("b"), d.path().join("s"));
        for t in [&base, &step] {
            mk(t, "usr/bin/same", "x", 0o755);
            mk(t, "etc/passwd", "", 0o644);
            mk(t, "gone/file", "1", 0o644);
            mk(t, "mode", "m", 0o644);
            mk(t, "content", "aaa", 0o644);
            fs::create_dir_all(t.join("tmp")).unwrap();
        }
        fs::remove_dir_all(step.join("gone")).unwrap();
        mk(&step, "usr/local/bin/tool", "#!/bin/sh\n", 0o755);
        mk(&step, "etc/passwd", "changed", 0o644);
        mk(&step, "tmp/junk", "j", 0o644);
        fs::set_permissions(step.join("mode"), fs::Permissions::from_mode(0o600)).unwrap();
        mk(&step, "content", "bbb", 0o644);
        symlink("tool", step.join("usr/local/bin/t")).unwrap();
        let got: Vec<String> = diff(&base, &step)
            .unwrap()
            .iter()
            .map(|e| match e {
                Entry::Dir { path, mode } => format!("d {path} {mode:o}"),
                Entry::File { path, mode, .. } => format!("f {path} {mode:o}"),
                Entry::Symlink { path, .. } => format!("l {path}"),
                Entry::Whiteout { path } => format!("w {path}"),
            })
            .collect();
        assert_eq!(
            got,
            [
                "f content 644",
                "w gone",
                "f mode 600",
                "d usr 755",
                "d usr/local 755",
                "d usr/local/bin 755",
                "l usr/local/bin/t",
                "f usr/local/bin/tool 755",
            ]
        );
    }

    #[test]
    fn the_same_entries_make_the_same_layer() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return; // unpacking chowns to root
        }
        let d = tempfile::tempdir().unwrap();
        mk(d.path(), "src/a", "content", 0o640);
        let entries = vec![
            Entry::Dir {
                path: "opt".into(),
                mode: 0o755,
            },
            Entry::File {
                path: "opt/a".into(),
                mode: 0o640,
                src: d.path().join("src/a"),
            },
            Entry::Symlink {
                path: "opt/l".into(),
                target: b"a".to_vec(),
            },
            Entry::Whiteout {
                path: "opt/gone".into(),
            },
        ];
        let mut layers = Vec::new();
        for name in ["s1", "s2"] {
            let store = Store::open(d.path().join(name), Default::default()).unwrap();
            let l = write(&store, &entries, d.path()).unwrap();
            let unpacked = store.layer_path(&l.digest);
            assert_eq!(fs::read(unpacked.join("opt/a")).unwrap(), b"content");
            assert!(unpacked.join("opt/.wh.gone").exists());
            layers.push(l);
        }
        assert_eq!(layers[0], layers[1]);
    }
}
