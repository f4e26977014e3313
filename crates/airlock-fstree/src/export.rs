//! The roots' trees as a tar stream.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use airlock_spec::FileKind;
use rustix::fs::{FileType, Stat};
use rustix::io::Errno;
use tar::{EntryType, Header};

use crate::{MAX_DEPTH, Root, sys};

/// What an export wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exported {
    /// Regular files (a hard link is one more copy).
    pub files: u64,
    /// Directories (not the roots themselves).
    pub dirs: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// The files' bytes.
    pub bytes: u64,
    /// Entries left out: FIFOs, sockets, devices, mount points, directories past
    /// [`MAX_DEPTH`], and entries that vanished while the export ran.
    pub skipped: u64,
}

/// Writes everything beneath each root as a tar stream: paths are the root's name without the
/// leading slash and the path beneath it (`workspace/a/b.txt`, `dev/shm/x`), a directory comes
/// before its contents, names within a directory in byte order. Directories, regular files and
/// symlinks with their permission bits (setuid and setgid dropped) and mtimes (seconds); no
/// owners (the importer says whose they are). A file that changes size while it is read is
/// written with the size it had when opened: cut there, or padded with zeros.
pub fn export(roots: &[Root], out: &mut dyn Write) -> io::Result<Exported> {
    let mut builder = tar::Builder::new(out);
    let mut stats = Exported::default();
    for root in roots {
        let dev = root.dev()?;
        let dir = sys::reopen_dir(&root.dir)?;
        let mut path = root.tar_prefix().as_bytes().to_vec();
        export_dir(&dir, dev, &mut path, 0, &mut builder, &mut stats)?;
    }
    builder.finish()?;
    Ok(stats)
}

/// Permission bits as exported and imported: setuid and setgid never survive.
pub(crate) fn perm(mode: u32) -> u32 {
    mode & 0o1777
}

// The stat fields' integer types differ between architectures.
#[allow(clippy::unnecessary_cast)]
fn header(kind: EntryType, st: &Stat, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(perm(st.st_mode as u32));
    h.set_mtime((st.st_mtime as i64).max(0) as u64);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h
}

fn export_dir(
    dir: &OwnedFd,
    dev: u64,
    path: &mut Vec<u8>,
    depth: usize,
    builder: &mut tar::Builder<&mut dyn Write>,
    stats: &mut Exported,
) -> io::Result<()> {
    let mut names: Vec<(Vec<u8>, FileType)> = Vec::new();
    sys::read_dir(dir, |name, kind| {
        names.push((name.to_bytes().to_vec(), kind));
        Ok(true)
    })?;
    names.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    for (name, listed) in names {
        let len = path.len();
        path.push(b'/');
        path.extend_from_slice(&name);
        let result = export_entry(dir, &name, listed, dev, path, depth, builder, stats);
        path.truncate(len);
        result?;
    }
    Ok(())
}

// Each argument is a different piece of the walk's state.
#[allow(clippy::too_many_arguments)]
fn export_entry(
    dir: &OwnedFd,
    name: &[u8],
    listed: FileType,
    dev: u64,
    path: &mut Vec<u8>,
    depth: usize,
    builder: &mut tar::Builder<&mut dyn Write>,
    stats: &mut Exported,
) -> io::Result<()> {
    // What the listing says it is spares a stat for files and directories: they are
    // opened (never following a symlink) and what was opened is checked.
    let mut lstat = None;
    let kind = match listed {
        FileType::RegularFile => Some(FileKind::File),
        FileType::Directory => Some(FileKind::Dir),
        FileType::Symlink | FileType::Unknown => {
            let Some(st) = sys::lstat_at(dir, &cstr(name)?)? else {
                stats.skipped += 1;
                return Ok(());
            };
            if st.st_dev != dev {
                stats.skipped += 1;
                return Ok(());
            }
            let kind = sys::kind_of(&st);
            lstat = Some(st);
            kind
        }
        _ => None,
    };
    let tar_path = Path::new(OsStr::from_bytes(path));
    match kind {
        Some(FileKind::Dir) => {
            if depth + 1 >= MAX_DEPTH {
                stats.skipped += 1;
                return Ok(());
            }
            let Some(sub) = sys::open_subdir(dir, name, dev)? else {
                stats.skipped += 1;
                return Ok(());
            };
            // What was opened, not what was listed: the program may have swapped them.
            let st = rustix::fs::fstat(&sub)?;
            builder.append_data(&mut header(EntryType::Directory, &st, 0), tar_path, io::empty())?;
            stats.dirs += 1;
            export_dir(&sub, dev, path, depth + 1, builder, stats)
        }
        Some(FileKind::Symlink) => {
            let target = match rustix::fs::readlinkat(dir, &cstr(name)?, Vec::new()) {
                Ok(t) => t,
                // Gone or no longer a symlink.
                Err(Errno::NOENT | Errno::INVAL) => {
                    stats.skipped += 1;
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            };
            let target = Path::new(OsStr::from_bytes(target.to_bytes()));
            let Some(st) = lstat else {
                stats.skipped += 1;
                return Ok(());
            };
            let mut h = header(EntryType::Symlink, &st, 0);
            h.set_mode(0o777);
            builder.append_link(&mut h, tar_path, target)?;
            stats.symlinks += 1;
            Ok(())
        }
        Some(FileKind::File) => {
            let Some((fd, st)) = sys::open_file(dir, name, dev)? else {
                stats.skipped += 1;
                return Ok(());
            };
            #[allow(clippy::unnecessary_cast)]
            let size = st.st_size as u64;
            let mut h = header(EntryType::Regular, &st, size);
            let mut data = Sized {
                file: std::fs::File::from(fd),
                left: size,
            };
            if size <= SMALL {
                // Read whole, in as few reads as the file allows; written in one piece.
                SMALL_BUF.with_borrow_mut(|buf| {
                    buf.clear();
                    buf.resize(size as usize, 0);
                    data.read_exact(buf)?;
                    builder.append_data(&mut h, tar_path, &buf[..])
                })?;
            } else {
                builder.append_data(&mut h, tar_path, &mut data)?;
            }
            stats.files += 1;
            stats.bytes += size;
            Ok(())
        }
        None => {
            stats.skipped += 1;
            Ok(())
        }
    }
}

/// Files up to this size are read whole into a buffer kept per thread.
const SMALL: u64 = 1 << 20;

thread_local! {
    static SMALL_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn cstr(name: &[u8]) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// A file read as exactly `left` bytes: cut there if it grew, zeros after its end if it shrank.
struct Sized {
    file: std::fs::File,
    left: u64,
}

impl Read for Sized {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = match self.file.read(&mut buf[..want]) {
            Ok(0) => {
                buf[..want].fill(0);
                want
            }
            Ok(n) => n,
            Err(e) => return Err(e),
        };
        self.left -= n as u64;
        Ok(n)
    }
}
