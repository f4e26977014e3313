//! The writable filesystem of a sandbox (`/workspace`, `/tmp`, `/dev/shm`), seen through
//! directory fds: a scan and a diff for an exec's `files_changed`, an export to and an import
//! from a tar stream for snapshots.
//!
//! It runs as root on the host (the namespace tier, through `/proc/<init>/root/...`) and as
//! the agent inside gVisor and micro-VM sandboxes, walking trees a hostile program controls
//! and may change while they are walked. So every step is relative to a directory fd:
//!
//! - every open is `openat` of one name with `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC` (a
//!   multi-component path goes through `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
//!   | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`, or one component at a time where the kernel
//!   has no `openat2`), and the opened fd is `fstat`ed to check it is what was expected;
//! - a directory on another filesystem than its root's (a mount point) is never entered;
//! - only regular files, directories and symlinks are looked at: FIFOs, sockets and device
//!   nodes are skipped (and `O_NONBLOCK` makes sure opening one swapped in cannot block);
//! - symlinks are recorded and recreated as symlinks, never followed.

mod export;
mod import;
mod sys;

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use airlock_spec::{Change, FileChange, FileKind, MAX_FILES_CHANGED};

pub use export::{Exported, export};
pub use import::{Imported, clear, import};

/// A scan records at most this many entries (then it says `truncated`): the index of a tree
/// costs about 100 bytes an entry, and a tmpfs's inode cap bounds a sandbox's trees anyway.
pub const MAX_ENTRIES: usize = 100_000;

/// Directories nested deeper than this below a root are not entered by a scan or an export
/// (one fd is held per level of the walk). Real trees (node_modules included) stay far below.
pub const MAX_DEPTH: usize = 128;

/// One root of the writable filesystem: its name inside the sandbox and an fd on its directory.
#[derive(Debug)]
pub struct Root {
    /// Its absolute path inside the sandbox: `"/workspace"`, `"/tmp"`, `"/dev/shm"`.
    pub name: String,
    /// The directory, opened `O_RDONLY | O_DIRECTORY` (never written through directly: every
    /// walk opens `.` beneath it afresh, so one `Root` serves any number of walks).
    pub dir: OwnedFd,
}

impl Root {
    /// Opens `path` (a path the caller trusts up to its last component, which must not be a
    /// symlink) as the root named `name`.
    pub fn open(path: &Path, name: &str) -> io::Result<Root> {
        let dir = sys::open_dir_path(path)?;
        Ok(Root::from_fd(name, dir))
    }

    /// A root from a directory fd the caller opened itself.
    pub fn from_fd(name: &str, dir: OwnedFd) -> Root {
        Root {
            name: name.trim_end_matches('/').to_string(),
            dir,
        }
    }

    /// The root's name in tar paths: without the leading slash (`workspace`, `dev/shm`).
    pub(crate) fn tar_prefix(&self) -> &str {
        self.name.trim_start_matches('/')
    }

    /// The device of the root's filesystem: nothing on another one is looked at.
    pub(crate) fn dev(&self) -> io::Result<u64> {
        Ok(rustix::fs::fstat(self.dir.as_fd())?.st_dev)
    }
}

/// What a scan records of one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// File, directory or symlink.
    pub kind: FileKind,
    /// Size in bytes (a symlink's target length; 0 for directories).
    pub size: u64,
    /// `st_mode`, type bits included.
    pub mode: u32,
    /// Last modification, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Last status change, nanoseconds since the epoch.
    pub ctime_ns: i128,
    /// Inode number.
    pub ino: u64,
}

/// Every path beneath some roots with its metadata, as one scan saw it.
#[derive(Debug, Clone, Default)]
pub struct Index {
    /// Absolute path inside the sandbox (raw bytes: names need not be UTF-8) -> metadata.
    entries: BTreeMap<Vec<u8>, Meta>,
    /// Whether the scan stopped at [`MAX_ENTRIES`] or skipped directories past [`MAX_DEPTH`].
    truncated: bool,
}

impl Index {
    /// Scans everything beneath each root (not the roots themselves).
    pub fn scan(roots: &[Root]) -> io::Result<Index> {
        let mut index = Index::default();
        for root in roots {
            let dev = root.dev()?;
            let dir = sys::reopen_dir(&root.dir)?;
            let mut path = root.name.as_bytes().to_vec();
            scan_dir(&dir, dev, &mut path, 0, &mut index)?;
        }
        Ok(index)
    }

    /// How many paths it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the scan did not see everything (too many entries, or too deep).
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The metadata of one absolute path, if the scan saw it.
    pub fn get(&self, path: &str) -> Option<&Meta> {
        self.entries.get(path.as_bytes())
    }
}

/// Scans the directory `dir` whose absolute path is `path` (restored before returning).
fn scan_dir(dir: &OwnedFd, dev: u64, path: &mut Vec<u8>, depth: usize, index: &mut Index) -> io::Result<()> {
    let mut subdirs: Vec<Vec<u8>> = Vec::new();
    sys::read_dir(dir, |name, _| {
        if index.entries.len() >= MAX_ENTRIES {
            index.truncated = true;
            return Ok(false);
        }
        // Gone between the listing and the stat (the program is still running): not there.
        let Some(st) = sys::lstat_at(dir, name)? else {
            return Ok(true);
        };
        let Some(meta) = sys::meta_of(&st) else {
            return Ok(true); // FIFO, socket, device: not part of the tree
        };
        if st.st_dev != dev {
            return Ok(true); // a mount point: another filesystem
        }
        let len = path.len();
        path.push(b'/');
        path.extend_from_slice(name.to_bytes());
        index.entries.insert(path.clone(), meta);
        path.truncate(len);
        if meta.kind == FileKind::Dir {
            subdirs.push(name.to_bytes().to_vec());
        }
        Ok(true)
    })?;
    for name in subdirs {
        if depth + 1 >= MAX_DEPTH {
            index.truncated = true;
            continue;
        }
        // Replaced by something else, or gone, since the listing: what is there now was
        // recorded as a directory; the next scan sees the truth.
        let Some(sub) = sys::open_subdir(dir, &name, dev)? else {
            continue;
        };
        let len = path.len();
        path.push(b'/');
        path.extend_from_slice(&name);
        let result = scan_dir(&sub, dev, path, depth + 1, index);
        path.truncate(len);
        result?;
    }
    Ok(())
}

/// Whether a path that exists before and after is the same: for a directory, the same
/// directory with the same mode (entries made or removed in it are changes of their
/// own, not of it); for anything else, the same metadata.
fn unchanged(before: &Meta, after: &Meta) -> bool {
    if before.kind == FileKind::Dir && after.kind == FileKind::Dir {
        return before.ino == after.ino && before.mode == after.mode;
    }
    before == after
}

/// What changed between two scans of the same roots, sorted by path, at most
/// [`MAX_FILES_CHANGED`] entries, and whether more changed than listed.
///
/// Created: in `after` only. Deleted: in `before` only (kind and size as they were).
/// Modified: in both, and kind, size, mode, mtime, ctime or inode differ (a rewrite to the
/// same size shows in mtime/ctime; a kind change is `modified` with the new kind). A
/// directory is modified only when its mode changed or another directory took its place:
/// entries made or removed in it are listed themselves.
///
/// When either scan was truncated its paths past the cap are unknown, so nothing reliable
/// can be said: the list is empty and the flag is set.
pub fn diff(before: &Index, after: &Index) -> (Vec<FileChange>, bool) {
    if before.truncated || after.truncated {
        return (Vec::new(), true);
    }
    let mut out: Vec<FileChange> = Vec::new();
    let mut a = before.entries.iter().peekable();
    let mut b = after.entries.iter().peekable();
    loop {
        let (path, change, meta) = match (a.peek(), b.peek()) {
            (None, None) => return (out, false),
            (Some(&(pa, ma)), None) => {
                a.next();
                (pa, Change::Deleted, ma)
            }
            (None, Some(&(pb, mb))) => {
                b.next();
                (pb, Change::Created, mb)
            }
            (Some(&(pa, ma)), Some(&(pb, mb))) => match pa.cmp(pb) {
                std::cmp::Ordering::Less => {
                    a.next();
                    (pa, Change::Deleted, ma)
                }
                std::cmp::Ordering::Greater => {
                    b.next();
                    (pb, Change::Created, mb)
                }
                std::cmp::Ordering::Equal => {
                    a.next();
                    b.next();
                    if unchanged(ma, mb) {
                        continue;
                    }
                    (pb, Change::Modified, mb)
                }
            },
        };
        if out.len() >= MAX_FILES_CHANGED {
            return (out, true);
        }
        out.push(FileChange {
            path: String::from_utf8_lossy(path).into_owned(),
            change,
            kind: meta.kind,
            bytes: meta.size,
        });
    }
}
