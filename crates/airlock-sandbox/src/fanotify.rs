//! Whether anything changed on a sandbox's scratch tmpfs, without walking it: one fanotify
//! group for the engine, a filesystem mark on each sandbox's tmpfs, and a "dirty" flag per
//! sandbox set by any event the kernel reports for its tmpfs (events carry the
//! filesystem's id). An exec after which the flag is still clear changed nothing, and its
//! changeset needs no second walk (see `Sandbox::exec_inner`).
//!
//! The events asked for cover every way a program changes a tree: writes and truncation
//! (`FAN_MODIFY`), a close after writing (`FAN_CLOSE_WRITE`: writes through a shared
//! mapping report nothing else, and every writable fd of an exec's processes is closed by
//! the time they are all gone), metadata (`FAN_ATTRIB`), and entries made, removed or
//! renamed. A full queue (`FAN_Q_OVERFLOW`) marks every sandbox dirty: they walk again.
//! One group, not one per sandbox: groups count against root's `max_user_groups` (128),
//! which the host's own services share.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The events that mean a tree changed.
const MASK: u64 = libc::FAN_MODIFY
    | libc::FAN_CLOSE_WRITE
    | libc::FAN_ATTRIB
    | libc::FAN_CREATE
    | libc::FAN_DELETE
    | libc::FAN_MOVED_FROM
    | libc::FAN_MOVED_TO
    | libc::FAN_DELETE_SELF
    | libc::FAN_MOVE_SELF
    | libc::FAN_ONDIR
    | libc::FAN_EVENT_ON_CHILD;

/// `struct fanotify_event_metadata`'s size, and the offset of the first info record.
const METADATA_LEN: usize = 24;

/// The engine's fanotify group and who each filesystem id belongs to.
#[derive(Debug)]
pub(crate) struct Changes {
    /// The group (non-blocking, close-on-exec, reporting file ids).
    fd: OwnedFd,
    /// Filesystem id -> that sandbox's dirty flag.
    owners: Mutex<HashMap<u64, Arc<AtomicBool>>>,
}

/// One sandbox's mark: its filesystem id and dirty flag; removed from the group's table
/// on drop (the kernel drops the mark itself with the tmpfs).
#[derive(Debug)]
pub(crate) struct Marked {
    changes: Arc<Changes>,
    fsid: u64,
    dirty: Arc<AtomicBool>,
}

impl Changes {
    /// A fanotify group, or why there is none (no CAP_SYS_ADMIN, a kernel without
    /// `FAN_REPORT_FID`): the engine then walks after every exec.
    pub(crate) fn new() -> io::Result<Changes> {
        let flags = libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK | libc::FAN_REPORT_FID;
        // SAFETY: integer arguments; the returned fd, if any, is ours alone.
        let fd = unsafe { libc::fanotify_init(flags, libc::O_RDONLY as libc::c_uint) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fanotify_init returned a new fd nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Changes {
            fd,
            owners: Mutex::new(HashMap::new()),
        })
    }

    /// Marks the whole filesystem `dir` is on (a sandbox's scratch tmpfs).
    pub(crate) fn mark(self: &Arc<Self>, dir: BorrowedFd<'_>) -> io::Result<Marked> {
        let fsid = fsid_of(dir)?;
        // Two live filesystems with one id could not be told apart: the second is not
        // watched (it is walked instead).
        if self
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&fsid)
        {
            return Err(io::Error::other("another watched filesystem has the same id"));
        }
        let flags = libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM;
        // SAFETY: `dir` is a valid fd; a null path marks what `dir` itself is on.
        let ret = unsafe {
            libc::fanotify_mark(
                self.fd.as_raw_fd(),
                flags,
                MASK,
                dir.as_raw_fd(),
                std::ptr::null(),
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        let dirty = Arc::new(AtomicBool::new(true));
        self.owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fsid, Arc::clone(&dirty));
        Ok(Marked {
            changes: Arc::clone(self),
            fsid,
            dirty,
        })
    }

    /// Reads every queued event and sets the dirty flag of the sandbox each names (all of
    /// them on an overflow).
    fn drain(&self) {
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        let mut buf = [0u64; 1024]; // 8 KiB, aligned for the metadata
        loop {
            // SAFETY: the buffer is valid for its size in bytes; the kernel writes whole
            // events into it.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    std::mem::size_of_val(&buf),
                )
            };
            if n <= 0 {
                return; // EAGAIN: the queue is empty (or the group is broken: walk anyway)
            }
            // SAFETY: the first `n` bytes were written by the kernel; u8 has no invalid values.
            let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n as usize) };
            let mut at = 0;
            while at + METADATA_LEN <= bytes.len() {
                let ev = &bytes[at..];
                let len = u32::from_ne_bytes(ev[0..4].try_into().expect("4 bytes")) as usize;
                let metadata_len = u16::from_ne_bytes(ev[6..8].try_into().expect("2 bytes")) as usize;
                let mask = u64::from_ne_bytes(ev[8..16].try_into().expect("8 bytes"));
                if len < METADATA_LEN || at + len > bytes.len() {
                    break;
                }
                if mask & libc::FAN_Q_OVERFLOW != 0 {
                    for dirty in owners.values() {
                        dirty.store(true, Ordering::Relaxed);
                    }
                } else if len >= metadata_len + 4 + 8 {
                    // The first info record: a 4-byte header, then the filesystem id.
                    let fsid = &ev[metadata_len + 4..metadata_len + 12];
                    let fsid = u64::from_ne_bytes(fsid.try_into().expect("8 bytes"));
                    if let Some(dirty) = owners.get(&fsid) {
                        dirty.store(true, Ordering::Relaxed);
                    }
                }
                at += len;
            }
        }
    }
}

impl Marked {
    /// Whether anything changed on the tmpfs since the last [`Marked::reset`].
    pub(crate) fn dirty(&self) -> bool {
        self.changes.drain();
        self.dirty.load(Ordering::Relaxed)
    }

    /// Takes what is queued so far as seen: the caller's index has it.
    pub(crate) fn reset(&self) {
        self.changes.drain();
        self.dirty.store(false, Ordering::Relaxed);
    }
}

impl Drop for Marked {
    fn drop(&mut self) {
        let mut owners = self.changes.owners.lock().unwrap_or_else(|e| e.into_inner());
        if owners
            .get(&self.fsid)
            .is_some_and(|d| Arc::ptr_eq(d, &self.dirty))
        {
            owners.remove(&self.fsid);
        }
    }
}

/// The filesystem id `statfs` reports for what `dir` is on, as the events carry it.
fn fsid_of(dir: BorrowedFd<'_>) -> io::Result<u64> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `st` is valid for a statfs the kernel fills in.
    if unsafe { libc::fstatfs(dir.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatfs succeeded, so the whole struct was written.
    let st = unsafe { st.assume_init() };
    // SAFETY: fsid_t is two ints (8 bytes, fields private in libc's binding), the same
    // bytes the kernel puts in an event's fid record.
    let raw: [u8; 8] = unsafe { std::mem::transmute(st.f_fsid) };
    let fsid = u64::from_ne_bytes(raw);
    if fsid == 0 {
        return Err(io::Error::other(
            "the filesystem has no id to tell its events apart",
        ));
    }
    Ok(fsid)
}

/// Whether this host can watch a tmpfs this way: a group, and a mark on the host's
/// /dev/shm (a tmpfs on every distribution; notification only, gone with the group a
/// moment later).
pub(crate) fn probe() -> Result<(), String> {
    let changes = Arc::new(Changes::new().map_err(|e| format!("no fanotify group with file ids: {e}"))?);
    let shm = std::fs::File::open("/dev/shm").map_err(|e| format!("/dev/shm: {e}"))?;
    let fs = nix::sys::statfs::fstatfs(&shm).map_err(|e| format!("/dev/shm: {e}"))?;
    if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        return Err("/dev/shm is not a tmpfs to probe with".into());
    }
    let marked = changes
        .mark(std::os::fd::AsFd::as_fd(&shm))
        .map_err(|e| format!("a tmpfs cannot be marked: {e}"))?;
    drop(marked);
    Ok(())
}
