//! Stacking unpacked layers into one tree, the way an OCI runtime's overlay would show them.
//!
//! Layers are applied in order. In each directory of a layer, first an opaque marker
//! (`.wh..wh..opq`) empties the directory as the lower layers left it, then each whiteout
//! `.wh.<name>` deletes `<name>` from below, then the layer's other entries are copied in:
//! a directory merges with a directory of the same name, anything else replaces what was
//! there. Whiteout files themselves never reach the result. Files sharing an inode within
//! one layer (hard links) share one in the result.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};

use crate::Owner;
use crate::fsutil::{cstr, list, lstat, open_dir, open_dir_path, remove_all_at};

/// The OCI whiteout prefix.
const WHITEOUT: &[u8] = b".wh.";
/// The OCI opaque-directory marker.
const OPAQUE: &CStr = c".wh..wh..opq";

/// Where a hard-linked inode of the current layer was first written in the result.
type Links = HashMap<(u64, u64), Vec<CString>>;

/// How regular files reach the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ApplyMode {
    /// Copied, modes as in the layer ([`crate::Store::flatten`]).
    Copy,
    /// Modes made readable by others ([`readable`]); a file whose mode that leaves as it is
    /// is hard-linked to the layer's inode (nothing is changed on that inode), any other is
    /// copied and given the new mode, so a layer's files never change.
    LinkReadable,
}

/// A mode with "others" given the owner's read and execute bits (never write): files of
/// an image are owned by the store's owner, and the sandbox user is not that owner.
pub(crate) fn readable(mode: u32) -> u32 {
    mode | ((mode >> 6) & 0o5)
}

/// Applies the layer tree at `src` onto the tree at `dst`; returns the bytes copied.
pub(crate) fn apply_layer(src: &OwnedFd, dst: &OwnedFd, mode: ApplyMode) -> io::Result<u64> {
    let mut links = Links::new();
    let mut copied = 0;
    apply_dir(src, dst, &mut Vec::new(), dst, &mut links, mode, &mut copied)?;
    Ok(copied)
}

fn apply_dir(
    src: &OwnedFd,
    dst: &OwnedFd,
    rel: &mut Vec<CString>,
    dst_root: &OwnedFd,
    links: &mut Links,
    apply: ApplyMode,
    copied: &mut u64,
) -> io::Result<()> {
    let names = list(src)?;
    if names.iter().any(|n| n.as_c_str() == OPAQUE) {
        for child in list(dst)? {
            remove_all_at(dst, &child)?;
        }
    }
    for name in &names {
        let bytes = name.to_bytes();
        if let Some(target) = bytes.strip_prefix(WHITEOUT)
            && name.as_c_str() != OPAQUE
            && !target.is_empty()
            && target != b"."
            && target != b".."
        {
            remove_all_at(dst, &cstr(OsStr::from_bytes(target))?)?;
        }
    }
    for name in names.iter().filter(|n| !n.to_bytes().starts_with(WHITEOUT)) {
        let Some(st) = lstat(src, name)? else { continue };
        let existing = lstat(dst, name)?;
        let ftype = FileType::from_raw_mode(st.st_mode);
        let owner = Owner {
            uid: st.st_uid,
            gid: st.st_gid,
        };
        let raw_mode = st.st_mode & 0o777;
        let mode = match apply {
            ApplyMode::Copy => Mode::from_raw_mode(raw_mode),
            ApplyMode::LinkReadable => Mode::from_raw_mode(readable(raw_mode)),
        };
        let os = OsStr::from_bytes(name.to_bytes());
        match (ftype, existing.as_ref().map(crate::fsutil::is_dir)) {
            (FileType::Directory, Some(true)) => {}
            (_, Some(_)) => remove_all_at(dst, name)?,
            (_, None) => {}
        }
        match ftype {
            FileType::Directory => {
                if existing.as_ref().is_none_or(|e| !crate::fsutil::is_dir(e)) {
                    rfs::mkdirat(dst, name, Mode::from_raw_mode(0o700))?;
                }
                let s = open_dir(src, os)?;
                let d = open_dir(dst, os)?;
                rel.push(name.clone());
                apply_dir(&s, &d, rel, dst_root, links, apply, copied)?;
                rel.pop();
                owner.apply(&d)?;
                rfs::fchmod(&d, mode)?;
                rfs::futimens(&d, &times_of(&st))?;
            }
            FileType::RegularFile => {
                // The layer's inode is shared only when its mode is already the result's:
                // linking never changes a layer file. A failed link (too many links, another
                // filesystem) falls back to a copy.
                if apply == ApplyMode::LinkReadable
                    && readable(raw_mode) == raw_mode
                    && rfs::linkat(src, name, dst, name, AtFlags::empty()).is_ok()
                {
                    continue;
                }
                let key = (st.st_dev, st.st_ino);
                if st.st_nlink > 1
                    && let Some(first) = links.get(&key)
                    && link_to(dst_root, first, dst, name).is_ok()
                {
                    continue;
                }
                let from = rfs::openat(
                    src,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                let to = rfs::openat(
                    dst,
                    name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )?;
                let mut to = File::from(to);
                *copied += io::copy(&mut File::from(from), &mut to)?;
                owner.apply(&to)?;
                rfs::fchmod(&to, mode)?;
                rfs::futimens(&to, &times_of(&st))?;
                if st.st_nlink > 1 {
                    let mut path = rel.clone();
                    path.push(name.clone());
                    links.insert(key, path);
                }
            }
            FileType::Symlink => {
                let target = rfs::readlinkat(src, name, Vec::new())?;
                rfs::symlinkat(&*target, dst, name)?;
                owner.apply_at(dst, name)?;
                rfs::utimensat(dst, name, &times_of(&st), AtFlags::SYMLINK_NOFOLLOW)?;
            }
            // Unpacked layers hold nothing else; anything else is not copied.
            _ => {}
        }
    }
    Ok(())
}

/// The layer entry's modification time, kept in the result (as access time too).
fn times_of(st: &rfs::Stat) -> rfs::Timestamps {
    let t = rfs::Timespec {
        tv_sec: st.st_mtime,
        tv_nsec: st.st_mtime_nsec as _,
    };
    rfs::Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// Hard-links `name` in `dir` to the file at `first` (components below `root`).
fn link_to(root: &OwnedFd, first: &[CString], dir: &OwnedFd, name: &CStr) -> io::Result<()> {
    let (last, parents) = first.split_last().ok_or(io::ErrorKind::NotFound)?;
    let parents: Vec<&OsStr> = parents.iter().map(|c| OsStr::from_bytes(c.to_bytes())).collect();
    let parent = open_dir_path(root, &parents, None)?;
    rfs::linkat(&parent, last.as_c_str(), dir, name, AtFlags::empty())?;
    Ok(())
}

/// The path of a temporary sibling for `dest` (same filesystem, so it can be renamed).
pub(crate) fn parent_of(dest: &Path) -> PathBuf {
    match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}
