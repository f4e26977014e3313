//! Who owns the files the store writes.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;

use rustix::fs::{self as rfs, AtFlags, Gid, Uid};

/// The uid and gid every unpacked file and directory gets, whatever the archive says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Owner {
    /// Owner uid (default 0, root).
    pub uid: u32,
    /// Owner gid (default 0, root).
    pub gid: u32,
}

impl Owner {
    /// `fchown` of an open file or directory.
    pub(crate) fn apply(self, fd: impl AsFd) -> io::Result<()> {
        Ok(rfs::fchown(
            fd,
            Some(Uid::from_raw(self.uid)),
            Some(Gid::from_raw(self.gid)),
        )?)
    }

    /// `lchown` of `name` in `dir` (for symlinks, which cannot be opened).
    pub(crate) fn apply_at(self, dir: impl AsFd, name: &CStr) -> io::Result<()> {
        Ok(rfs::chownat(
            dir,
            name,
            Some(Uid::from_raw(self.uid)),
            Some(Gid::from_raw(self.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }
}
