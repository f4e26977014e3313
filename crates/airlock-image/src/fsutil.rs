//! Filesystem steps relative to directory descriptors, never following a symlink.
//!
//! Every path the unpacker and flattener touch is reached one component at a time from a
//! directory descriptor with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so neither a
//! symlink nor a `..` in the tree can send a later step outside the root, whatever a
//! previous step created.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::Owner;

/// How `openat2` resolves every path here: below the starting directory, through no
/// symlink (not even one that stays below), across no mount.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// Opens the directory `name` (one component) in `dir`, refusing symlinks.
pub(crate) fn open_dir(dir: impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rfs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        RESOLVE,
    )?)
}

/// Opens the directory at `comps` below `root`, one component at a time; with `create`,
/// missing directories are made (mode 0755, owned by `owner`).
pub(crate) fn open_dir_path(root: &OwnedFd, comps: &[&OsStr], create: Option<Owner>) -> io::Result<OwnedFd> {
    let mut cur = root.try_clone()?;
    for comp in comps {
        cur = match open_dir(&cur, comp) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {
                let Some(owner) = create else { return Err(e) };
                match rfs::mkdirat(&cur, *comp, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                let fd = open_dir(&cur, comp)?;
                owner.apply(&fd)?;
                // Exactly 0755, whatever the process's umask.
                rfs::fchmod(&fd, Mode::from_raw_mode(0o755))?;
                fd
            }
            // O_NOFOLLOW | O_DIRECTORY on a symlink says ENOTDIR: tell the two apart, so
            // the caller can say "through a symlink" (ELOOP) or "through a file" (ENOTDIR).
            Err(e) if e.raw_os_error() == Some(Errno::NOTDIR.raw_os_error()) => {
                let st = lstat(&cur, &cstr(comp)?)?;
                let is_link =
                    st.is_some_and(|st| rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Symlink);
                return Err(if is_link { Errno::LOOP.into() } else { e });
            }
            Err(e) => return Err(e),
        };
    }
    Ok(cur)
}

/// The names in `dir`, without `.` and `..`.
pub(crate) fn list(dir: &OwnedFd) -> io::Result<Vec<CString>> {
    let mut out = Vec::new();
    for entry in rfs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

/// `lstat` of `name` in `dir`, `None` when it does not exist.
pub(crate) fn lstat(dir: impl AsFd, name: &CStr) -> io::Result<Option<rfs::Stat>> {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether a `stat` mode is a directory.
pub(crate) fn is_dir(st: &rfs::Stat) -> bool {
    rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Directory
}

/// Removes `name` from `dir`, a whole tree if it is a directory (symlinks are removed,
/// never followed). A missing `name` is not an error.
pub(crate) fn remove_all_at(dir: &OwnedFd, name: &CStr) -> io::Result<()> {
    let Some(st) = lstat(dir, name)? else {
        return Ok(());
    };
    if is_dir(&st) {
        let child = open_dir(dir, OsStr::from_bytes(name.to_bytes()))?;
        for n in list(&child)? {
            remove_all_at(&child, &n)?;
        }
        rfs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    } else {
        rfs::unlinkat(dir, name, AtFlags::empty())?;
    }
    Ok(())
}

/// Converts a path component to a C string (tar names and readdir names have no NUL).
pub(crate) fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
}
