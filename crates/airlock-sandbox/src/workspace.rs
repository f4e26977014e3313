//! File operations on /workspace, done by init inside the sandbox on the supervisor's
//! behalf. Every path is resolved beneath /workspace with `openat2`: no `..` above it, no
//! symlinks, no magic links, no crossing into another mount. Whatever the program planted
//! (symlinks, FIFOs, hard links), these operations only ever touch regular files and
//! directories of the sandbox's own tmpfs; and since they run inside the sandbox's mount
//! namespace, no host path is reachable at all.

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{FileStat, Mode, fstat};
use nix::unistd::{Gid, Uid, fchown};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path};

use airlock_spec::FileEntry;

use crate::mounts::SANDBOX_ID;

/// The work directory every path is relative to.
pub const ROOT: &str = "/workspace";

/// A listing stops after this many entries: it travels in one control frame.
const MAX_LISTING: usize = 1000;

fn resolve_flags() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
        | ResolveFlag::RESOLVE_NO_XDEV
}

fn open_beneath(dir: &impl AsFd, path: &Path, flags: OFlag, mode: u32) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .mode(Mode::from_bits_truncate(mode))
        .resolve(resolve_flags());
    openat2(dir.as_fd(), path, how).map_err(|e| match e {
        nix::errno::Errno::ELOOP | nix::errno::Errno::EXDEV => io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the path crosses a symlink or a mount",
        ),
        e => e.into(),
    })
}

fn root() -> io::Result<OwnedFd> {
    nix::fcntl::open(
        ROOT,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// Splits `path` into its directory components and file name, refusing anything but
/// plain names.
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

fn regular(fd: &OwnedFd) -> io::Result<FileStat> {
    let st = fstat(fd.as_fd()).map_err(io::Error::from)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(st)
}

/// Writes one chunk of `path` (creating it and its directories, owned by the sandbox user;
/// truncating it when `first`).
pub fn write_chunk(path: &str, mode: u32, first: bool, data: &[u8]) -> io::Result<()> {
    let (dirs, name) = components(path)?;
    let owner = (Some(Uid::from_raw(SANDBOX_ID)), Some(Gid::from_raw(SANDBOX_ID)));
    let mut dir = root()?;
    for d in dirs {
        match nix::sys::stat::mkdirat(dir.as_fd(), d, Mode::from_bits_truncate(0o755)) {
            Ok(()) => {
                let created = open_beneath(&dir, Path::new(d), OFlag::O_DIRECTORY | OFlag::O_RDONLY, 0)?;
                fchown(created.as_fd(), owner.0, owner.1).map_err(io::Error::from)?;
            }
            Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        dir = open_beneath(&dir, Path::new(d), OFlag::O_PATH | OFlag::O_DIRECTORY, 0)?;
    }
    // O_NONBLOCK: a FIFO planted at the path must not hang init.
    let mut flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK;
    flags |= if first { OFlag::O_TRUNC } else { OFlag::O_APPEND };
    let fd = open_beneath(&dir, Path::new(name), flags, mode & 0o777)?;
    regular(&fd)?;
    fchown(fd.as_fd(), owner.0, owner.1).map_err(io::Error::from)?;
    let mut file = File::from(fd);
    file.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))?;
    file.write_all(data)
}

/// Whether a write failed for want of room: the tmpfs is full (`ENOSPC`), or the file
/// would pass a size cap (`EFBIG`, `EDQUOT`).
pub(crate) fn is_no_room(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EFBIG) | Some(libc::EDQUOT)
    )
}

/// Removes what a failed write left at `path`: a regular file only (whatever else is
/// there was not written by it). Best effort: the failure is reported either way.
pub(crate) fn remove_partial(path: &str) {
    let Ok((dirs, name)) = components(path) else {
        return;
    };
    let Ok(mut dir) = root() else { return };
    for d in dirs {
        match open_beneath(&dir, Path::new(d), OFlag::O_PATH | OFlag::O_DIRECTORY, 0) {
            Ok(next) => dir = next,
            Err(_) => return,
        }
    }
    let Ok(fd) = open_beneath(&dir, Path::new(name), OFlag::O_PATH, 0) else {
        return;
    };
    if fstat(fd.as_fd()).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG) {
        let _ = nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
}

/// Bytes still free on the sandbox's disk (the tmpfs /workspace is on).
pub(crate) fn free_bytes() -> io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(ROOT).map_err(io::Error::from)?;
    Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
}

pub use airlock_backend::DiskFull;

/// What a file operation's failure is to its caller: a path that does not exist, or one
/// it must change (outside /workspace, through a symlink, not a regular file).
pub(crate) fn error_kind(e: &io::Error) -> airlock_backend::ErrorKind {
    match e.kind() {
        io::ErrorKind::NotFound => airlock_backend::ErrorKind::NotFound,
        _ => airlock_backend::ErrorKind::Invalid,
    }
}

/// Opens `path` for reading; returns the file and its size.
pub fn open_read(path: &str, max_bytes: u64) -> io::Result<(File, u64)> {
    let (dirs, name) = components(path)?;
    let mut rel = std::path::PathBuf::new();
    rel.extend(dirs);
    rel.push(name);
    let fd = open_beneath(&root()?, &rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK, 0)?;
    let size = regular(&fd)?.st_size as u64;
    if size > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{path}: {size} bytes, more than the {max_bytes} allowed"),
        ));
    }
    Ok((File::from(fd), size))
}

/// Reads the next chunk of `file` into `buf`; returns the bytes read (0 at the end).
pub fn read_chunk(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match file.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// Lists /workspace recursively (without following symlinks), sorted by path.
pub fn list() -> io::Result<Vec<FileEntry>> {
    let mut entries = Vec::new();
    let mut stack = vec![std::path::PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = Path::new(ROOT).join(&rel);
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?; // lstat: symlinks are listed, not followed
            let path = rel.join(entry.file_name());
            if meta.is_dir() {
                stack.push(path.clone());
            }
            entries.push(FileEntry {
                path: path.to_string_lossy().into_owned(),
                size: if meta.is_file() { meta.len() } else { 0 },
                mode: meta.permissions().mode() & 0o7777,
                dir: meta.is_dir(),
            });
            if entries.len() >= MAX_LISTING {
                entries.sort_by(|a, b| a.path.cmp(&b.path));
                return Ok(entries);
            }
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}
