//! Writing one snapshot's pack: the blobs its owner does not hold yet, back to back.
//!
//! Small files are gathered in a batch (`Batch`), hashed on several threads at once, and the
//! new ones written from the batch buffer with one `pwrite` per run. A large file is streamed:
//! read, hashed and written chunk by chunk, and taken back (`rollback`) when its digest
//! turns out to be known. The pack file is created by the first write, so a snapshot whose
//! every blob is known creates none.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use sha2::{Digest as _, Sha256};

use crate::StoreError;
use crate::error::io_err;
use crate::format::Digest;

/// Bytes of a large file read, hashed and written per step.
const CHUNK: usize = 1 << 20;

pub(crate) struct PackWriter {
    pub path: PathBuf,
    file: Option<File>,
    /// Logical length: bytes written (or counted, in discard mode).
    len: u64,
    /// Over budget: keep counting, write nothing.
    discard: bool,
    scratch: Vec<u8>,
}

impl PackWriter {
    pub fn new(path: PathBuf) -> Self {
        PackWriter {
            path,
            file: None,
            len: 0,
            discard: false,
            scratch: Vec::new(),
        }
    }

    /// Where the next blob starts.
    pub fn pos(&self) -> u64 {
        self.len
    }

    /// Appends `data`.
    pub fn write(&mut self, data: &[u8]) -> Result<(), StoreError> {
        if data.is_empty() {
            return Ok(());
        }
        if !self.discard {
            if self.file.is_none() {
                let f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&self.path)
                    .map_err(io_err("creating", &self.path))?;
                self.file = Some(f);
            }
            let f = self.file.as_ref().expect("opened above");
            f.write_all_at(data, self.len)
                .map_err(io_err("writing", &self.path))?;
        }
        self.len += data.len() as u64;
        Ok(())
    }

    /// Appends `size` bytes read from `r`, hashing them on the way; their SHA-256, or `None`
    /// when the stream ends before `size` bytes.
    pub fn append_stream(&mut self, r: &mut dyn Read, size: u64) -> Result<Option<Digest>, StoreError> {
        let mut h = Sha256::new();
        let mut left = size;
        let mut scratch = std::mem::take(&mut self.scratch);
        while left > 0 {
            let want = left.min(CHUNK as u64);
            scratch.clear();
            let got = r
                .take(want)
                .read_to_end(&mut scratch)
                .map_err(StoreError::Input)? as u64;
            h.update(&scratch);
            let w = self.write(&scratch);
            if let Err(e) = w {
                self.scratch = scratch;
                return Err(e);
            }
            if got < want {
                self.scratch = scratch;
                return Ok(None);
            }
            left -= got;
        }
        self.scratch = scratch;
        Ok(Some(Digest(h.finalize().into())))
    }

    /// Forgets everything after `to` (a streamed blob that turned out to be known).
    pub fn rollback(&mut self, to: u64) -> Result<(), StoreError> {
        if let Some(f) = &self.file {
            f.set_len(to).map_err(io_err("truncating", &self.path))?;
        }
        self.len = to;
        Ok(())
    }

    /// Stops writing (the snapshot is over budget) and removes what was written; `pos` keeps
    /// counting so the error can say how much the snapshot needed.
    pub fn discard(&mut self) {
        if !self.discard {
            self.discard = true;
            if self.file.take().is_some() {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }

    pub fn discarding(&self) -> bool {
        self.discard
    }

    /// The pack's length on disk (0: no file was made, or nothing is left in it).
    pub fn finish(&mut self) -> u64 {
        if self.file.is_none() { 0 } else { self.len }
    }

    /// After the pack was renamed into place: nothing to remove on drop.
    pub fn adopted(&mut self) {
        self.file = None;
    }
}

impl Drop for PackWriter {
    /// A pack that was not adopted (renamed into place) is removed.
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Small files' content, hashed together.
#[derive(Debug)]
pub(crate) struct Batch {
    pub buf: Vec<u8>,
    /// (entry index, start in `buf`, length)
    pub files: Vec<(usize, usize, usize)>,
}

impl Batch {
    /// Appends `size` bytes read from `r`; false when the stream ends first.
    pub fn read(&mut self, entry: usize, r: &mut dyn Read, size: u64) -> Result<bool, StoreError> {
        let start = self.buf.len();
        let got = r
            .take(size)
            .read_to_end(&mut self.buf)
            .map_err(StoreError::Input)?;
        self.files.push((entry, start, got));
        Ok(got as u64 == size)
    }

    /// SHA-256 of each file, on up to `workers` threads (split by bytes, in order).
    pub fn digests(&self, workers: usize) -> Vec<Digest> {
        let hash = |files: &[(usize, usize, usize)]| -> Vec<Digest> {
            files
                .iter()
                .map(|&(_, s, l)| Digest(Sha256::digest(&self.buf[s..s + l]).into()))
                .collect()
        };
        let total = self.buf.len();
        // Below ~256 KiB a thread costs more than it saves.
        if workers <= 1 || self.files.len() < 2 || total < (256 << 10) {
            return hash(&self.files);
        }
        // Cut the list where each part holds about total/workers bytes.
        let mut cuts = vec![0];
        let mut acc = 0;
        for (i, &(_, _, l)) in self.files.iter().enumerate() {
            acc += l;
            if acc * workers >= total * cuts.len() && cuts.len() < workers && i + 1 < self.files.len() {
                cuts.push(i + 1);
            }
        }
        cuts.push(self.files.len());
        let parts: Vec<&[(usize, usize, usize)]> = cuts.windows(2).map(|w| &self.files[w[0]..w[1]]).collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = parts[1..].iter().map(|p| s.spawn(move || hash(p))).collect();
            let mut out = hash(parts[0]);
            for h in handles {
                out.extend(h.join().expect("hashing thread panicked"));
            }
            out
        })
    }

    pub fn clear(&mut self) {
        self.buf.clear();
        self.files.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parallel hashing gives every file its own digest, in order, however the list is cut.
    #[test]
    fn batch_digests_match_sequential() {
        let mut b = Batch {
            buf: Vec::new(),
            files: Vec::new(),
        };
        let sizes = [0usize, 1, 70_000, 3, 200_000, 10, 500_000, 7, 64, 300_000];
        for (i, &n) in sizes.iter().enumerate() {
            let start = b.buf.len();
            b.buf.extend((0..n).map(|k| (k * 31 + i * 7) as u8));
            b.files.push((i, start, n));
        }
        let want: Vec<Digest> = b
            .files
            .iter()
            .map(|&(_, s, l)| Digest(Sha256::digest(&b.buf[s..s + l]).into()))
            .collect();
        for workers in 1..=5 {
            assert_eq!(b.digests(workers), want, "{workers} workers");
        }
    }
}
