//! File operations on /workspace for the host. Paths are walked one plain component at a
//! time with `O_NOFOLLOW`, so a symlink the program planted is never followed (this
//! gVisor release has no `openat2`); only regular files and directories are touched, and
//! whatever else the program planted (FIFOs, sockets) is refused without blocking.

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, fstat};
use nix::unistd::{Gid, Uid, fchown};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path};

use super::SANDBOX_ID;

/// The directory every path is relative to.
const ROOT: &str = "/workspace";

/// Splits `path` into directory components and a file name, refusing anything but plain
/// names.
fn components(path: &str) -> io::Result<(Vec<&str>, &str)> {
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{path:?}: not a plain relative path"),
        )
    };
    let mut parts = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(s) => parts.push(s.to_str().ok_or_else(bad)?),
            Component::CurDir => {}
            _ => return Err(bad()),
        }
    }
    let name = parts.pop().ok_or_else(bad)?;
    Ok((parts, name))
}

fn open_at(dir: &impl AsFd, name: &str, flags: OFlag, mode: u32) -> io::Result<OwnedFd> {
    openat(
        dir.as_fd(),
        name,
        flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ELOOP => {
            io::Error::new(io::ErrorKind::PermissionDenied, "the path crosses a symlink")
        }
        e => e.into(),
    })
}

fn root() -> io::Result<OwnedFd> {
    nix::fcntl::open(
        ROOT,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// The directory holding `dirs` under /workspace, creating missing ones (owned by the
/// sandbox user) when `create`.
fn walk(dirs: &[&str], create: bool) -> io::Result<OwnedFd> {
    let mut dir = root()?;
    for d in dirs {
        if create {
            match nix::sys::stat::mkdirat(dir.as_fd(), *d, Mode::from_bits_truncate(0o755)) {
                Ok(()) => {
                    let created = open_at(&dir, d, OFlag::O_DIRECTORY | OFlag::O_RDONLY, 0)?;
                    fchown(
                        created.as_fd(),
                        Some(Uid::from_raw(SANDBOX_ID)),
                        Some(Gid::from_raw(SANDBOX_ID)),
                    )
                    .map_err(io::Error::from)?;
                }
                Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        dir = open_at(&dir, d, OFlag::O_DIRECTORY | OFlag::O_RDONLY, 0)?;
    }
    Ok(dir)
}

fn regular(fd: &OwnedFd) -> io::Result<u64> {
    let st = fstat(fd.as_fd()).map_err(io::Error::from)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(st.st_size as u64)
}

/// Writes one chunk of `path` (creating it and its directories, owned by the sandbox
/// user; truncating it when `first`).
pub fn write_chunk(path: &str, mode: u32, first: bool, data: &[u8]) -> io::Result<()> {
    let (dirs, name) = components(path)?;
    let dir = walk(&dirs, true)?;
    // O_NONBLOCK: a FIFO planted at the path must not hang the agent.
    let mut flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK;
    flags |= if first { OFlag::O_TRUNC } else { OFlag::O_APPEND };
    let fd = open_at(&dir, name, flags, mode & 0o777)?;
    regular(&fd)?;
    fchown(
        fd.as_fd(),
        Some(Uid::from_raw(SANDBOX_ID)),
        Some(Gid::from_raw(SANDBOX_ID)),
    )
    .map_err(io::Error::from)?;
    let mut file = File::from(fd);
    file.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))?;
    file.write_all(data)
}

/// Whether a write failed for want of room.
pub fn is_no_room(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EFBIG) | Some(libc::EDQUOT)
    )
}

/// Removes the regular file a failed write left at `path` (best effort).
pub fn remove_partial(path: &str) {
    let Ok((dirs, name)) = components(path) else {
        return;
    };
    let Ok(dir) = walk(&dirs, false) else { return };
    let is_file = open_at(&dir, name, OFlag::O_RDONLY | OFlag::O_NONBLOCK, 0)
        .and_then(|fd| regular(&fd))
        .is_ok();
    if is_file {
        let _ = nix::unistd::unlinkat(dir.as_fd(), name, nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
}

/// Bytes free on the disk.
pub fn free_bytes() -> io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(ROOT).map_err(io::Error::from)?;
    Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// Reads `path`, at most `max_bytes`.
pub fn read(path: &str, max_bytes: u64) -> io::Result<Vec<u8>> {
    let (dirs, name) = components(path)?;
    let dir = walk(&dirs, false)?;
    let fd = open_at(&dir, name, OFlag::O_RDONLY | OFlag::O_NONBLOCK, 0)?;
    let size = regular(&fd)?;
    if size > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{size} bytes, more than the {max_bytes} allowed"),
        ));
    }
    let mut data = Vec::with_capacity(size as usize);
    File::from(fd).take(max_bytes).read_to_end(&mut data)?;
    Ok(data)
}

/// Lists /workspace recursively (the namespace tier's own listing: no symlink followed,
/// sorted, at most a thousand entries).
pub use airlock_sandbox::list_workspace as list;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_are_taken() {
        assert_eq!(components("a/./b.txt").unwrap(), (vec!["a"], "b.txt"));
        for bad in ["/etc/passwd", "../x", "a/../../x", "", "."] {
            assert!(components(bad).is_err(), "{bad}");
        }
    }
}
