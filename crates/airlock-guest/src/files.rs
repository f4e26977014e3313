//! The sandbox's writable filesystem from the agent's side (airlock-fstree), reached
//! through its init's root (`/proc/<init>/root/...`, the sandbox's mounts): an exec's
//! changeset (a scan before the program, one after, the difference), and the whole
//! of /workspace, /tmp and /dev/shm as a tar stream out and in.

use airlock_fstree::{Index, Root};
use airlock_spec::FileChange;
use std::io::{self, Read};
use std::path::Path;
use std::sync::mpsc;

/// The sandbox's user inside its user namespace.
const SANDBOX_ID: u32 = 1000;
/// What an export and an import cover.
pub const WRITABLE: [&str; 3] = ["/workspace", "/tmp", "/dev/shm"];
/// Parts of an import waiting for the unpacking thread: a few chunks, so the port's
/// reader and the unpacking overlap without holding much of the stream in memory.
const IMPORT_QUEUE: usize = 4;

/// Opens `names` (absolute paths inside the sandbox) as roots, through the root of the
/// sandbox's init `pid`.
pub fn roots(pid: u32, names: &[impl AsRef<str>]) -> io::Result<Vec<Root>> {
    names
        .iter()
        .map(|name| {
            let name = name.as_ref();
            let path = format!("/proc/{pid}/root{name}");
            Root::open(Path::new(&path), name).map_err(|e| io::Error::new(e.kind(), format!("{name}: {e}")))
        })
        .collect()
}

/// An exec's changeset under way: the scan before the program.
pub struct Changes {
    roots: Vec<Root>,
    before: Index,
}

impl Changes {
    /// Scans `names` of the sandbox of init `pid` before a program.
    pub fn start(pid: u32, names: &[String]) -> io::Result<Changes> {
        let roots = roots(pid, names)?;
        let before = Index::scan(&roots)?;
        Ok(Changes { roots, before })
    }

    /// Scans again after the program: what changed (sorted, bounded) and whether more
    /// did (or a scan was cut short).
    pub fn finish(self) -> io::Result<(Vec<FileChange>, bool)> {
        let after = Index::scan(&self.roots)?;
        let (changes, truncated) = airlock_fstree::diff(&self.before, &after);
        Ok((changes, truncated || self.before.truncated() || after.truncated()))
    }
}

/// The id outside a user namespace of id `inside`, from its `uid_map` or `gid_map`.
fn outer_id(map: &str, inside: u32) -> io::Result<u32> {
    let text = std::fs::read_to_string(map)?;
    text.lines()
        .find_map(|l| {
            let mut f = l.split_whitespace().map(|x| x.parse::<u32>().ok());
            let (start, outer, count) = (f.next()??, f.next()??, f.next()??);
            (start <= inside && inside - start < count).then(|| outer + (inside - start))
        })
        .ok_or_else(|| io::Error::other(format!("{map} maps no id {inside}")))
}

/// The sandbox user's uid and gid as the agent sees them (what it writes files as).
pub fn sandbox_owner(pid: u32) -> io::Result<(u32, u32)> {
    Ok((
        outer_id(&format!("/proc/{pid}/uid_map"), SANDBOX_ID)?,
        outer_id(&format!("/proc/{pid}/gid_map"), SANDBOX_ID)?,
    ))
}

/// A tar stream being unpacked into the sandbox on a thread of its own, fed part by
/// part as the host's frames arrive.
pub struct Import {
    /// The parts, to the thread; `None` once it stopped taking them.
    parts: Option<mpsc::SyncSender<Vec<u8>>>,
    thread: std::thread::JoinHandle<io::Result<airlock_fstree::Imported>>,
}

impl Import {
    /// Clears /workspace, /tmp and /dev/shm of the sandbox of init `pid` and starts
    /// unpacking what [`Import::push`] gives.
    pub fn start(pid: u32) -> io::Result<Import> {
        let roots = roots(pid, &WRITABLE)?;
        let owner = sandbox_owner(pid)?;
        let (tx, rx) = mpsc::sync_channel(IMPORT_QUEUE);
        let thread = std::thread::Builder::new().name("import".into()).spawn(move || {
            // The sandbox's tmpfs belongs to its user namespace, where the agent's
            // ids are not mapped (the kernel refuses to create a file of theirs with
            // EOVERFLOW): this thread acts as the sandbox's user, for the files it
            // makes and for what it may remove. Filesystem ids are per thread.
            // SAFETY: setfsgid/setfsuid change only this thread's filesystem ids;
            // the thread does nothing else but this import.
            unsafe {
                libc::setfsgid(owner.1);
                libc::setfsuid(owner.0);
            }
            let mut input = Parts {
                rx,
                part: Vec::new(),
                at: 0,
            };
            let imported = airlock_fstree::import(&roots, &mut input, owner);
            // Whatever is left of the stream is read and dropped by the agent.
            drop(input);
            imported
        })?;
        Ok(Import {
            parts: Some(tx),
            thread,
        })
    }

    /// Hands the next part of the stream to the thread (dropped once it stopped: it
    /// failed, or the stream ended early).
    pub fn push(&mut self, part: Vec<u8>) {
        if let Some(tx) = &self.parts
            && tx.send(part).is_err()
        {
            self.parts = None;
        }
    }

    /// Ends the stream and waits for the thread.
    pub fn finish(mut self) -> io::Result<airlock_fstree::Imported> {
        self.parts = None;
        self.thread
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the import thread panicked")))
    }
}

/// The parts of a stream as a `Read`: the end of the stream when the sender is gone.
struct Parts {
    rx: mpsc::Receiver<Vec<u8>>,
    part: Vec<u8>,
    at: usize,
}

impl Read for Parts {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.part.len() {
            match self.rx.recv() {
                Ok(part) => {
                    self.part = part;
                    self.at = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.part.len() - self.at);
        buf[..n].copy_from_slice(&self.part[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Whether `e` says the disk is full.
pub fn is_no_room(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull
        || e.kind() == io::ErrorKind::QuotaExceeded
        || e.kind() == io::ErrorKind::FileTooLarge
        || matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_mapped_through_the_right_line() {
        let dir = std::env::temp_dir().join(format!("airlock-guest-map-{}", std::process::id()));
        std::fs::write(
            &dir,
            "         0     100000          1\n      1000     101000       1000\n",
        )
        .unwrap();
        let map = dir.to_str().unwrap();
        assert_eq!(outer_id(map, 0).unwrap(), 100000);
        assert_eq!(outer_id(map, 1000).unwrap(), 101000);
        assert_eq!(outer_id(map, 1999).unwrap(), 101999);
        assert!(outer_id(map, 2000).is_err());
        let _ = std::fs::remove_file(&dir);
    }

    #[test]
    fn parts_read_as_one_stream() {
        let (tx, rx) = mpsc::sync_channel(4);
        tx.send(b"ab".to_vec()).unwrap();
        tx.send(Vec::new()).unwrap();
        tx.send(b"cde".to_vec()).unwrap();
        drop(tx);
        let mut r = Parts {
            rx,
            part: Vec::new(),
            at: 0,
        };
        let mut all = String::new();
        r.read_to_string(&mut all).unwrap();
        assert_eq!(all, "abcde");
    }
}
