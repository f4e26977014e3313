//! The sandbox's writable filesystem seen whole (airlock-fstree): an exec's changeset,
//! and the tar stream of a snapshot out and in, in frames on the agent's port.

use super::Port;
use super::ready::SANDBOX_ID;
use crate::wire::{GvRequest, ToGvAgent};
use airlock_fstree::{Index, Root};
use airlock_spec::FileChange;
use airlock_vmwire::frame::{self as proto, CHUNK, ToHost};
use std::io::{self, BufRead, Read, Write};
use std::path::Path;

/// The writable filesystem: what a snapshot holds.
const ALL_ROOTS: [&str; 3] = ["/workspace", "/tmp", "/dev/shm"];

/// Opens the directories `names` (absolute paths inside the sandbox).
fn open_roots<S: AsRef<str>>(names: &[S]) -> io::Result<Vec<Root>> {
    names
        .iter()
        .map(|n| Root::open(Path::new(n.as_ref()), n.as_ref()))
        .collect()
}

/// An exec's changeset in the making: the scan before the program starts.
pub struct Before {
    names: Vec<String>,
    roots: Vec<Root>,
    index: Index,
}

/// The last exec's scan after it ended, kept as the next exec's scan before it starts
/// while nothing can have changed the files in between: a scan costs a system call a
/// file, and gVisor's system calls are slow (measured here, ptrace platform: 80 µs an
/// entry, 1,000 files cost 90 ms a scan).
#[derive(Default)]
pub struct Kept {
    last: Option<(Vec<String>, Index)>,
    /// Programs spawned when it was made (see `jobs::Jobs::programs_started`).
    pub programs: u64,
}

impl Kept {
    /// Something may have changed the files (a file written or imported by the host,
    /// a spawned program running): the next exec scans afresh.
    pub fn forget(&mut self) {
        self.last = None;
    }
}

/// Scans `roots` before an exec (or takes `kept`'s scan of them, when it is still
/// true: `fresh` says no spawned program ran since it was made); `None` when there are
/// none. A scan
/// that fails is logged (runsc's log) and the exec goes on: its changeset is then empty
/// and marked truncated.
pub fn before(names: &[String], kept: &mut Kept, fresh: bool) -> Option<io::Result<Before>> {
    let last = kept.last.take();
    if names.is_empty() {
        return None;
    }
    Some(open_roots(names).and_then(|roots| {
        let index = match last {
            Some((last_names, index)) if fresh && last_names == names => index,
            _ => Index::scan(&roots)?,
        };
        Ok(Before {
            names: names.to_vec(),
            roots,
            index,
        })
    }))
}

/// The changes since `before` (sorted, at most `MAX_FILES_CHANGED`) and whether more
/// changed than are listed; the scan after is kept in `kept`.
pub fn after(before: io::Result<Before>, kept: &mut Kept) -> (Vec<FileChange>, bool) {
    let scanned = before.and_then(|b| Ok((Index::scan(&b.roots)?, b.index, b.names)));
    match scanned {
        Ok((after, before, names)) => {
            let changes = airlock_fstree::diff(&before, &after);
            // A truncated scan is not kept: the next one may see further.
            if !after.truncated() {
                kept.last = Some((names, after));
            }
            changes
        }
        Err(e) => {
            eprintln!("airlock gVisor agent: scanning for files_changed: {e}");
            (Vec::new(), true)
        }
    }
}

/// Bytes written go out as `FileChunk` frames of [`CHUNK`] bytes.
struct ChunkWriter<'a> {
    port: &'a Port,
    buf: Vec<u8>,
}

impl Write for ChunkWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == CHUNK {
            self.port.send(&ToHost::FileChunk { last: false }, &self.buf)?;
            self.buf.clear();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Serves `ExportFiles`: the tar stream of /workspace, /tmp and /dev/shm in
/// `FileChunk`s, or an `Error` (after some chunks, too: the host drops them).
pub fn export(port: &Port) -> io::Result<()> {
    let mut out = ChunkWriter {
        port,
        buf: Vec::with_capacity(CHUNK),
    };
    let result = open_roots(&ALL_ROOTS).and_then(|roots| airlock_fstree::export(&roots, &mut out));
    match result {
        Ok(_) => port.send(&ToHost::FileChunk { last: true }, &out.buf),
        // The port itself failed: the host is gone.
        Err(e) if out.port_failed(&e) => Err(e),
        Err(e) => port.error(format!("exporting the files: {e}")),
    }
}

impl ChunkWriter<'_> {
    /// Whether `e` is the port's own failure (a broken pipe to the host).
    fn port_failed(&self, e: &io::Error) -> bool {
        e.kind() == io::ErrorKind::BrokenPipe
    }
}

/// The parts of an import as one stream, read from the port as the import needs
/// them: `first` is the payload of the `ImportFiles` frame just read.
struct PartReader<'a, R: BufRead> {
    input: &'a mut R,
    part: Vec<u8>,
    pos: usize,
    /// The last part has been read.
    done: bool,
}

impl<R: BufRead> PartReader<'_, R> {
    /// Reads the next part; an unexpected frame ends the stream with an error (the
    /// host broke the protocol).
    fn next_part(&mut self) -> io::Result<()> {
        match proto::read::<GvRequest>(self.input) {
            Ok(Some(f)) => match f.msg {
                GvRequest::Gv(ToGvAgent::ImportFiles { last }) => {
                    self.part = f.payload;
                    self.pos = 0;
                    self.done = last;
                    Ok(())
                }
                other => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{other:?} in the middle of an import"),
                )),
            },
            Ok(None) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the host went away in the middle of an import",
            )),
            Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
        }
    }

    /// Reads and drops what is left of the stream.
    fn drain(&mut self) -> io::Result<()> {
        while !self.done {
            self.next_part()?;
        }
        Ok(())
    }
}

impl<R: BufRead> Read for PartReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.part.len() {
            if self.done {
                return Ok(0);
            }
            self.next_part()?;
        }
        let n = buf.len().min(self.part.len() - self.pos);
        buf[..n].copy_from_slice(&self.part[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Serves `ImportFiles`: the first part is `first` (`last` says whether more follow
/// on `input`). /workspace, /tmp and /dev/shm are cleared, then the stream is unpacked
/// into them as it comes, everything owned by the sandbox user. Answered once the last
/// part is in: `Ok`, `NoRoom` (the disk is full: what was unpacked so far stays) or
/// `Error`.
pub fn import<R: BufRead>(port: &Port, input: &mut R, first: Vec<u8>, last: bool) -> io::Result<()> {
    let mut parts = PartReader {
        input,
        part: first,
        pos: 0,
        done: last,
    };
    let result = open_roots(&ALL_ROOTS)
        .and_then(|roots| airlock_fstree::import(&roots, &mut parts, (SANDBOX_ID, SANDBOX_ID)));
    // The rest of the stream, if the import stopped early; a broken stream is the
    // port's failure.
    parts.drain()?;
    match result {
        Ok(_) => port.send(&ToHost::Ok, &[]),
        Err(e) if super::files::is_no_room(&e) || e.kind() == io::ErrorKind::StorageFull => port.send(
            &ToHost::NoRoom {
                free_bytes: super::files::free_bytes().ok(),
                memory_bytes: None,
            },
            &[],
        ),
        // Not the system's failure: the stream's (not a tar, a path out of the roots,
        // cut short).
        Err(e) if e.raw_os_error().is_none() => port.fail(
            airlock_backend::ErrorKind::Invalid,
            Some("files"),
            format!("the tar stream: {e}"),
        ),
        Err(e) => port.error(format!("importing the files: {e}")),
    }
}
