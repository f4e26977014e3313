//! The *at() calls the walks make, each with the flags that keep it beneath its directory fd.

use std::ffi::{CStr, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use airlock_spec::FileKind;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RawDir, ResolveFlags, Stat};
use rustix::io::Errno;

use crate::Meta;

/// Flags of every directory open: never through a symlink, never blocking, never inherited.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC);

/// Flags of every open of a file to read: as for directories, and no controlling terminal.
const READ_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC)
    .union(OFlags::NOCTTY);

/// Opens a root's directory by a path the caller trusts (its last component not followed).
pub(crate) fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(path, DIR_FLAGS, Mode::empty())?)
}

/// A fresh fd on the directory `dir` (its own offset, so walks of one root do not share one).
pub(crate) fn reopen_dir(dir: &OwnedFd) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(dir, c".", DIR_FLAGS, Mode::empty())?)
}

/// Calls `f` with each name in `dir` (not `.` and `..`) and its type as the directory
/// lists it (`Unknown` where the filesystem does not say) until it returns `Ok(false)`; a
/// directory removed meanwhile has no names.
pub(crate) fn read_dir(
    dir: &OwnedFd,
    mut f: impl FnMut(&CStr, FileType) -> io::Result<bool>,
) -> io::Result<()> {
    let mut buf: Vec<MaybeUninit<u8>> = Vec::with_capacity(16 * 1024);
    buf.resize(16 * 1024, MaybeUninit::uninit());
    let mut entries = RawDir::new(dir.as_fd(), &mut buf);
    while let Some(entry) = entries.next() {
        let entry = match entry {
            Ok(entry) => entry,
            // Removed since it was opened (the program is still running): empty now.
            Err(Errno::NOENT) => break,
            Err(e) => return Err(e.into()),
        };
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        if !f(name, entry.file_type())? {
            break;
        }
    }
    Ok(())
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; `None` when it is gone.
pub(crate) fn lstat_at(dir: &OwnedFd, name: &CStr) -> io::Result<Option<Stat>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// What a scan records of a stat; `None` for what is not part of a tree (FIFOs, sockets,
/// devices).
// The stat fields' integer types differ between architectures.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn meta_of(st: &Stat) -> Option<Meta> {
    let kind = kind_of(st)?;
    Some(Meta {
        kind,
        size: if kind == FileKind::Dir {
            0
        } else {
            st.st_size as u64
        },
        mode: st.st_mode as u32,
        mtime_ns: st.st_mtime as i64 as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
        ctime_ns: st.st_ctime as i64 as i128 * 1_000_000_000 + st.st_ctime_nsec as i128,
        ino: st.st_ino as u64,
    })
}

/// File, directory or symlink; `None` for anything else.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn kind_of(st: &Stat) -> Option<FileKind> {
    match FileType::from_raw_mode(st.st_mode as _) {
        FileType::RegularFile => Some(FileKind::File),
        FileType::Directory => Some(FileKind::Dir),
        FileType::Symlink => Some(FileKind::Symlink),
        _ => None,
    }
}

/// Errors that mean "what was listed is not (or no longer) what can be opened": the program
/// removed or replaced it since, or it is something that refuses to be opened (a socket, a
/// device on a nodev mount). The walk skips the entry.
fn vanished(e: Errno) -> bool {
    matches!(
        e,
        Errno::NOENT
            | Errno::LOOP
            | Errno::NOTDIR
            | Errno::ISDIR
            | Errno::NXIO
            | Errno::NODEV
            | Errno::ACCESS
            | Errno::PERM
            | Errno::AGAIN
            | Errno::TXTBSY
    )
}

/// Opens the subdirectory `name` of `dir` if it is still a directory on the filesystem `dev`.
pub(crate) fn open_subdir(dir: &OwnedFd, name: &[u8], dev: u64) -> io::Result<Option<OwnedFd>> {
    let fd = match rustix::fs::openat(dir, OsStr::from_bytes(name), DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(e) if vanished(e) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&fd)?;
    if st.st_dev != dev || kind_of(&st) != Some(FileKind::Dir) {
        return Ok(None);
    }
    Ok(Some(fd))
}

/// Opens the regular file `name` of `dir` to read, if it is still one on the filesystem `dev`.
pub(crate) fn open_file(dir: &OwnedFd, name: &[u8], dev: u64) -> io::Result<Option<(OwnedFd, Stat)>> {
    let fd = match rustix::fs::openat(dir, OsStr::from_bytes(name), READ_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(e) if vanished(e) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&fd)?;
    if st.st_dev != dev || kind_of(&st) != Some(FileKind::File) {
        return Ok(None);
    }
    Ok(Some((fd, st)))
}

/// Opens the directory at the relative path `rel` (components separated by `/`, none of them
/// `..`) beneath `root`: never through a symlink, a magic link or a mount point.
pub(crate) fn open_dir_beneath(root: &OwnedFd, rel: &[u8]) -> io::Result<OwnedFd> {
    if rel.is_empty() {
        return reopen_dir(root);
    }
    let resolve = ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV;
    match rustix::fs::openat2(root, OsStr::from_bytes(rel), DIR_FLAGS, Mode::empty(), resolve) {
        Ok(fd) => return Ok(fd),
        // No openat2 (older kernels, some user-space kernels): one component at a time.
        Err(Errno::NOSYS) => {}
        Err(e) => return Err(e.into()),
    }
    let dev = rustix::fs::fstat(root)?.st_dev;
    let mut dir = reopen_dir(root)?;
    for name in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        if name == b".." {
            return Err(Errno::XDEV.into());
        }
        let fd = rustix::fs::openat(&dir, OsStr::from_bytes(name), DIR_FLAGS, Mode::empty())?;
        if rustix::fs::fstat(&fd)?.st_dev != dev {
            return Err(Errno::XDEV.into());
        }
        dir = fd;
    }
    Ok(dir)
}
