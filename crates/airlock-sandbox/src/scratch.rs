//! The sandbox's writable filesystem seen from the host: its scratch tmpfs (behind
//! /workspace, /tmp and /dev/shm, see `mounts`) through directory fds opened via
//! `/proc/<init>/root`, for an exec's `files_changed` and for snapshots (export, import).
//! Every walk is airlock-fstree's: beneath those fds, never following a symlink, never
//! leaving the tmpfs, whatever the sandbox's programs do to the tree meanwhile.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use airlock_fstree::{Index, Root};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::SandboxError;

/// The roots a snapshot holds, in the order they are exported.
pub(crate) const SNAPSHOT_ROOTS: [&str; 3] = ["/workspace", "/tmp", "/dev/shm"];

/// How many bytes an export writes (or an import reads) between two looks at the cancel fds.
const CANCEL_EVERY: u64 = 1 << 20;

/// The scratch tmpfs's roots, opened once per sandbox (each when first needed). The fds
/// keep the tmpfs reachable after init is gone (a one-shot's, whose result still needs the
/// scan after the program).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// `(name, root)` for each root opened so far.
    roots: Vec<Root>,
    /// The tmpfs's device: every root must be on it.
    dev: Option<u64>,
}

impl Scratch {
    /// The roots named `names` (of [`SNAPSHOT_ROOTS`]), as fresh fds (dups) a walk can own,
    /// opening through `/proc/<pid>/root` those not opened yet. `pid` must be the
    /// sandbox's init, alive or an unreaped zombie of ours (so its pid is not reused).
    pub(crate) fn roots(&mut self, pid: libc::pid_t, names: &[&str]) -> Result<Vec<Root>, SandboxError> {
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let root = match self.roots.iter().find(|r| r.name == *name) {
                Some(root) => root,
                None => {
                    let opened = self.open(pid, name).map_err(|e| {
                        SandboxError::Setup(format!("opening the sandbox's {name} from the host: {e}"))
                    })?;
                    self.roots.push(opened);
                    self.roots.last().expect("just pushed")
                }
            };
            let dir = root.dir.try_clone().map_err(SandboxError::Spawn)?;
            out.push(Root::from_fd(name, dir));
        }
        Ok(out)
    }

    /// Opens one root and checks it is the sandbox's scratch tmpfs: a tmpfs, on the same
    /// device as the roots opened before (all three are parts of one tmpfs).
    fn open(&mut self, pid: libc::pid_t, name: &str) -> io::Result<Root> {
        let path = format!("/proc/{pid}/root{name}");
        let root = Root::open(Path::new(&path), name)?;
        let fs = nix::sys::statfs::fstatfs(&root.dir)?;
        if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
            return Err(io::Error::other(format!("{path} is not on a tmpfs")));
        }
        #[allow(clippy::unnecessary_cast)] // its type differs between architectures
        let dev = nix::sys::stat::fstat(&root.dir)?.st_dev as u64;
        match self.dev {
            Some(d) if d != dev => {
                return Err(io::Error::other(format!(
                    "{path} is not on the sandbox's scratch tmpfs"
                )));
            }
            _ => self.dev = Some(dev),
        }
        Ok(root)
    }
}

/// What an exec's before-scan left for its after-scan.
#[derive(Debug)]
pub(crate) struct Watch {
    /// The roots of `files_changed_in`.
    pub(crate) names: Vec<String>,
    /// Their fds.
    pub(crate) roots: Vec<Root>,
    /// The tree before the program.
    pub(crate) before: Index,
}

/// Whether any `cancel` fd is readable (polled, never read).
fn cancelled(cancel: &[BorrowedFd<'_>]) -> bool {
    if cancel.is_empty() {
        return false;
    }
    let mut fds: Vec<PollFd<'_>> = cancel
        .iter()
        .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
        .collect();
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

/// A writer or reader that gives up once a cancel fd is readable (looked at every
/// [`CANCEL_EVERY`] bytes).
pub(crate) struct Cancellable<'a, T> {
    pub(crate) inner: T,
    cancel: &'a [BorrowedFd<'a>],
    since: u64,
    /// Set once it gave up for that reason.
    pub(crate) cancelled: bool,
}

impl<'a, T> Cancellable<'a, T> {
    pub(crate) fn new(inner: T, cancel: &'a [BorrowedFd<'a>]) -> Self {
        Cancellable {
            inner,
            cancel,
            since: 0,
            cancelled: false,
        }
    }

    fn check(&mut self, n: usize) -> io::Result<()> {
        self.since += n as u64;
        if self.since >= CANCEL_EVERY {
            self.since = 0;
            if cancelled(self.cancel) {
                self.cancelled = true;
            }
        }
        if self.cancelled {
            return Err(io::Error::other("cancelled"));
        }
        Ok(())
    }
}

impl<T: Write> Write for Cancellable<'_, T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.check(buf.len())?;
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<T: Read> Read for Cancellable<'_, T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check(0)?;
        let n = self.inner.read(buf)?;
        self.check(n)?;
        Ok(n)
    }
}

/// Whether an import failed for want of room (the tmpfs's size or inodes, or the file-size
/// limit).
pub(crate) fn no_room(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG))
        || matches!(
            e.kind(),
            io::ErrorKind::StorageFull | io::ErrorKind::FileTooLarge | io::ErrorKind::QuotaExceeded
        )
}

/// Free bytes of the tmpfs under `root`.
pub(crate) fn free_bytes(root: &Root) -> Option<u64> {
    let fs = nix::sys::statfs::fstatfs(root.dir.as_fd()).ok()?;
    #[allow(clippy::unnecessary_cast)] // their types differ between architectures
    Some((fs.blocks_available() as u64).saturating_mul(fs.block_size() as u64))
}
