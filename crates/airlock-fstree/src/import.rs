//! Emptying the roots, and filling them from a tar stream.

use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, Gid, Mode, OFlags, RenameFlags, Timestamps, Uid};
use rustix::io::Errno;
use tar::EntryType;

use crate::export::perm;
use crate::{MAX_DEPTH, Root, sys};

/// What an import made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Imported {
    /// Regular files.
    pub files: u64,
    /// Directories (named in the stream or implied by a path in it).
    pub dirs: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// The files' bytes.
    pub bytes: u64,
    /// Entries left out: hard links, devices, FIFOs and other kinds the format can carry, and
    /// entries naming a root itself.
    pub skipped: u64,
}

/// Removes everything beneath each root (the roots stay). Mount points beneath a root (none
/// in a sandbox's scratch) are left alone.
pub fn clear(roots: &[Root]) -> io::Result<()> {
    for root in roots {
        let dev = root.dev()?;
        // A directory deeper than MAX_DEPTH is moved up to the root (one fd is held per level)
        // and cleared on the next round; each round removes MAX_DEPTH levels at least.
        let mut counter = 0u64;
        loop {
            let dir = sys::reopen_dir(&root.dir)?;
            let mut moved = 0;
            clear_dir(&dir, &root.dir, dev, 0, &mut counter, &mut moved)?;
            if moved == 0 {
                break;
            }
        }
    }
    Ok(())
}

fn clear_dir(
    dir: &OwnedFd,
    root: &OwnedFd,
    dev: u64,
    depth: usize,
    counter: &mut u64,
    moved: &mut u64,
) -> io::Result<()> {
    // Names first: removing entries while getdents walks the directory can skip some.
    let mut names: Vec<Vec<u8>> = Vec::new();
    sys::read_dir(dir, |name, _| {
        names.push(name.to_bytes().to_vec());
        Ok(true)
    })?;
    for name in names {
        let name = OsStr::from_bytes(&name);
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => continue,
            Err(Errno::ISDIR) => {}
            Err(e) => return Err(e.into()),
        }
        if depth + 1 >= MAX_DEPTH {
            loop {
                *counter += 1;
                let to = format!(".airlock-clear-{counter}");
                match rustix::fs::renameat_with(dir, name, root, &to, RenameFlags::NOREPLACE) {
                    Ok(()) => break,
                    Err(Errno::EXIST) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            *moved += 1;
            continue;
        }
        // A mount point, or replaced since: left alone (a replacement is removed by the
        // program's next turn, not ours).
        let Some(sub) = sys::open_subdir(dir, name.as_bytes(), dev)? else {
            continue;
        };
        clear_dir(&sub, root, dev, depth + 1, counter, moved)?;
        drop(sub);
        match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Empties the roots, then makes what the tar stream holds beneath them, owned by `owner`
/// (uid, gid): directories, regular files and symlinks with their permission bits (setuid and
/// setgid dropped) and mtimes (a directory's after its contents are in). Directories a path
/// implies but the stream does not name are made with mode 0755.
///
/// An entry whose path is absolute, has a `..` component, or is not beneath one of the roots
/// (`workspace/...` for the root `/workspace`) is refused: the import stops with
/// `InvalidData`, and nothing outside the roots was touched. Running out of room keeps the
/// kernel's errno (`ENOSPC`, `EDQUOT`, `EFBIG`: `io::ErrorKind::StorageFull` or
/// `FileTooLarge`).
pub fn import(roots: &[Root], input: &mut dyn Read, owner: (u32, u32)) -> io::Result<Imported> {
    clear(roots)?;
    let mut stats = Imported::default();
    let mut archive = tar::Archive::new(input);
    // Directories named in the stream: (root, path beneath it, mode, mtime), fixed at the end.
    let mut dirs: Vec<(usize, Vec<u8>, u32, u64)> = Vec::new();
    let mut cache: Option<(usize, Vec<u8>, OwnedFd)> = None;
    // Whether what this process makes needs a chown: not when its filesystem ids are the
    // owner already (found out at the first file).
    let mut chown = true;
    let mut probed = false;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let raw = entry.path_bytes().into_owned();
        let (ri, rel) = locate(roots, &raw)?;
        if rel.is_empty() {
            stats.skipped += 1; // the root itself
            continue;
        }
        let (parent, name) = match rel.iter().rposition(|&b| b == b'/') {
            Some(i) => (&rel[..i], OsStr::from_bytes(&rel[i + 1..])),
            None => (&rel[..0], OsStr::from_bytes(&rel)),
        };
        let header = entry.header();
        let mode = perm(header.mode()?);
        let mtime = header.mtime()?;
        let kind = header.entry_type();
        let dir = parent_dir(roots, ri, parent, owner, &mut cache, &mut stats)?;
        match kind {
            EntryType::Directory => {
                match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700)) {
                    Ok(()) => stats.dirs += 1,
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                if chown {
                    rustix::fs::chownat(dir, name, uid(owner), gid(owner), AtFlags::SYMLINK_NOFOLLOW)?;
                }
                dirs.push((ri, rel.clone(), mode, mtime));
            }
            EntryType::Regular | EntryType::Continuous => {
                let flags = OFlags::WRONLY
                    | OFlags::CREATE
                    | OFlags::EXCL
                    | OFlags::NOFOLLOW
                    | OFlags::NONBLOCK
                    | OFlags::CLOEXEC;
                let fd = match rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600)) {
                    Err(Errno::EXIST) => {
                        // The stream named it twice: the later entry wins, as with tar.
                        rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
                        rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?
                    }
                    r => r?,
                };
                if !probed {
                    let st = rustix::fs::fstat(&fd)?;
                    chown = (st.st_uid, st.st_gid) != owner;
                    probed = true;
                }
                if chown {
                    rustix::fs::fchown(&fd, uid(owner), gid(owner))?;
                }
                let mut file = std::fs::File::from(fd);
                let n = copy(&mut entry, &mut file)?;
                rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))?;
                rustix::fs::futimens(&file, &times(mtime))?;
                stats.files += 1;
                stats.bytes += n;
            }
            EntryType::Symlink => {
                let Some(target) = entry.link_name_bytes().map(|t| t.into_owned()) else {
                    stats.skipped += 1;
                    continue;
                };
                if target.is_empty() {
                    stats.skipped += 1;
                    continue;
                }
                let target = OsStr::from_bytes(&target);
                match rustix::fs::symlinkat(target, dir, name) {
                    Err(Errno::EXIST) => {
                        rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
                        rustix::fs::symlinkat(target, dir, name)?;
                    }
                    r => r?,
                }
                if chown {
                    rustix::fs::chownat(dir, name, uid(owner), gid(owner), AtFlags::SYMLINK_NOFOLLOW)?;
                }
                rustix::fs::utimensat(dir, name, &times(mtime), AtFlags::SYMLINK_NOFOLLOW)?;
                stats.symlinks += 1;
            }
            _ => stats.skipped += 1,
        }
    }
    drop(cache);
    // Modes and mtimes of directories last: making their contents changed their mtimes, and a
    // read-only one would have refused them.
    for (ri, rel, mode, mtime) in dirs.iter().rev() {
        let fd = sys::open_dir_beneath(&roots[*ri].dir, rel)?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(*mode))?;
        rustix::fs::futimens(&fd, &times(*mtime))?;
    }
    Ok(stats)
}

/// `io::copy` through a larger buffer kept per thread: a file of up to 256 KiB is one
/// write.
fn copy(from: &mut dyn Read, to: &mut std::fs::File) -> io::Result<u64> {
    use std::io::Write;
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with_borrow_mut(|buf| {
        buf.resize(256 * 1024, 0);
        let mut total = 0u64;
        loop {
            // Fill the buffer as far as the stream gives, then write it.
            let mut filled = 0;
            while filled < buf.len() {
                match from.read(&mut buf[filled..]) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if filled == 0 {
                return Ok(total);
            }
            to.write_all(&buf[..filled])?;
            total += filled as u64;
            if filled < buf.len() {
                return Ok(total);
            }
        }
    })
}

fn uid(owner: (u32, u32)) -> Option<Uid> {
    Some(Uid::from_raw(owner.0))
}

fn gid(owner: (u32, u32)) -> Option<Gid> {
    Some(Gid::from_raw(owner.1))
}

fn times(mtime: u64) -> Timestamps {
    let t = rustix::fs::Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX),
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

fn refuse(raw: &[u8], why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("tar entry {:?} refused: {why}", String::from_utf8_lossy(raw)),
    )
}

/// Which root a tar path is beneath, and the path beneath it (components joined by `/`, no
/// `.` or empty ones); refuses absolute paths, `..`, and paths beneath none of the roots.
fn locate(roots: &[Root], raw: &[u8]) -> io::Result<(usize, Vec<u8>)> {
    if raw.first() == Some(&b'/') {
        return Err(refuse(raw, "absolute path"));
    }
    let parts: Vec<&[u8]> = raw
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    if parts.iter().any(|c| *c == b"..") {
        return Err(refuse(raw, "`..` in the path"));
    }
    let mut best: Option<(usize, usize)> = None;
    for (i, root) in roots.iter().enumerate() {
        let prefix: Vec<&[u8]> = root
            .tar_prefix()
            .as_bytes()
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        if !prefix.is_empty()
            && parts.len() >= prefix.len()
            && parts[..prefix.len()] == prefix[..]
            && best.is_none_or(|(_, n)| prefix.len() > n)
        {
            best = Some((i, prefix.len()));
        }
    }
    let Some((ri, n)) = best else {
        return Err(refuse(raw, "not beneath any of the roots"));
    };
    Ok((ri, parts[n..].join(&b'/')))
}

/// The directory `parent` beneath root `ri` (made, with any missing ancestors, when the
/// stream did not name it before its contents).
fn parent_dir<'a>(
    roots: &'a [Root],
    ri: usize,
    parent: &[u8],
    owner: (u32, u32),
    cache: &'a mut Option<(usize, Vec<u8>, OwnedFd)>,
    stats: &mut Imported,
) -> io::Result<&'a OwnedFd> {
    if parent.is_empty() {
        return Ok(&roots[ri].dir);
    }
    let hit = matches!(cache, Some((r, p, _)) if *r == ri && p == parent);
    if !hit {
        let fd = match sys::open_dir_beneath(&roots[ri].dir, parent) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {
                make_dirs(&roots[ri], parent, owner, stats)?
            }
            Err(e) => return Err(e),
        };
        *cache = Some((ri, parent.to_vec(), fd));
    }
    match cache {
        Some((_, _, fd)) => Ok(fd),
        None => unreachable!("the cache was just filled"),
    }
}

/// Opens `rel` beneath `root` one component at a time, making what is missing.
fn make_dirs(root: &Root, rel: &[u8], owner: (u32, u32), stats: &mut Imported) -> io::Result<OwnedFd> {
    let dev = root.dev()?;
    let mut dir = sys::reopen_dir(&root.dir)?;
    for name in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        match rustix::fs::mkdirat(&dir, OsStr::from_bytes(name), Mode::from_raw_mode(0o755)) {
            Ok(()) => {
                rustix::fs::chownat(
                    &dir,
                    OsStr::from_bytes(name),
                    uid(owner),
                    gid(owner),
                    AtFlags::SYMLINK_NOFOLLOW,
                )?;
                stats.dirs += 1;
            }
            Err(Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        dir = sys::open_subdir(&dir, name, dev)?
            .ok_or_else(|| io::Error::from_raw_os_error(Errno::NOTDIR.raw_os_error()))?;
    }
    Ok(dir)
}
