//! Writing one snapshot's pack: the blobs its owner does not hold yet, back to back.
//!
//! Content is read from the tar stream straight into the write buffer and hashed there; when
//! the digest turns out to be known, the bytes are taken back (`rollback`). The file is
//! created on the first flush, so a snapshot whose every blob is known creates no pack.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use sha2::{Digest as _, Sha256};

use crate::StoreError;
use crate::error::io_err;
use crate::format::Digest;

/// Buffered bytes written to the file at once.
const FLUSH_AT: usize = 4 << 20;
/// Bytes read from the stream per step (hashed as they arrive).
const CHUNK: u64 = 1 << 20;

pub(crate) struct PackWriter {
    pub path: PathBuf,
    file: Option<File>,
    buf: Vec<u8>,
    /// Bytes written to the file (or discarded, in discard mode).
    flushed: u64,
    /// Over budget: keep counting, write nothing.
    discard: bool,
}

impl PackWriter {
    pub fn new(path: PathBuf) -> Self {
        PackWriter {
            path,
            file: None,
            buf: Vec::with_capacity(FLUSH_AT + CHUNK as usize),
            flushed: 0,
            discard: false,
        }
    }

    /// Logical length: where the next blob starts.
    pub fn pos(&self) -> u64 {
        self.flushed + self.buf.len() as u64
    }

    /// Appends `size` bytes read from `r`; returns their SHA-256, or `None` when the stream
    /// ends before `size` bytes.
    pub fn append_from(&mut self, r: &mut dyn Read, size: u64) -> Result<Option<Digest>, StoreError> {
        let mut h = Sha256::new();
        let mut left = size;
        while left > 0 {
            let want = left.min(CHUNK);
            let start = self.buf.len();
            let got = r
                .take(want)
                .read_to_end(&mut self.buf)
                .map_err(StoreError::Input)? as u64;
            h.update(&self.buf[start..]);
            if got < want {
                return Ok(None);
            }
            left -= got;
            if self.buf.len() >= FLUSH_AT {
                self.flush()?;
            }
        }
        Ok(Some(Digest(h.finalize().into())))
    }

    /// Forgets everything after `to` (a blob that turned out to be known).
    pub fn rollback(&mut self, to: u64) -> Result<(), StoreError> {
        if to >= self.flushed {
            self.buf.truncate((to - self.flushed) as usize);
        } else {
            self.buf.clear();
            if let Some(f) = &self.file {
                f.set_len(to).map_err(io_err("truncating", &self.path))?;
            }
            self.flushed = to;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        if self.buf.is_empty() {
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
            f.write_all_at(&self.buf, self.flushed)
                .map_err(io_err("writing", &self.path))?;
        }
        self.flushed += self.buf.len() as u64;
        self.buf.clear();
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

    /// Writes what is buffered; the pack's length (0: no file was made).
    pub fn finish(&mut self) -> Result<u64, StoreError> {
        self.flush()?;
        if self.file.is_none() {
            return Ok(0);
        }
        Ok(self.flushed)
    }
}

impl Drop for PackWriter {
    /// A pack that was not adopted (renamed away) is removed.
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl PackWriter {
    /// After the pack was renamed into place: nothing to remove on drop.
    pub fn adopted(&mut self) {
        self.file = None;
    }
}
