//! Writing a snapshot back as a tar stream.
//!
//! Each entry's header blocks are either rebuilt by the `tar` crate's `Builder` (the way a
//! producer using that crate writes them: `HeaderMaker`, one of four variants) or, when no
//! variant reproduced the input byte for byte at `put`, copied from the record. Content is
//! read from the packs with `pread` as the consumer reads; the pack files are opened when
//! the stream is made, so deleting the snapshot meanwhile does not cut it short.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;

use tar::{Builder, EntryType, Header};

use crate::format::{Entry, Kind, RecordFile};

/// Number of header variants `HeaderMaker` knows.
pub(crate) const VARIANTS: u8 = 4;

/// Rebuilds an entry's header blocks. Variant bits: 1 = uid/gid fields left blank (not set),
/// 2 = ustar header instead of GNU.
pub(crate) struct HeaderMaker {
    b: Builder<Vec<u8>>,
}

impl std::fmt::Debug for HeaderMaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeaderMaker")
    }
}

impl HeaderMaker {
    pub fn new() -> Self {
        HeaderMaker {
            b: Builder::new(Vec::with_capacity(2048)),
        }
    }

    /// The header blocks of `e` in `variant` (extension entries first).
    pub fn make(
        &mut self,
        kind: Kind,
        path: &[u8],
        link: Option<&[u8]>,
        meta: (u32, u64, u64, u64, u64),
        variant: u8,
    ) -> io::Result<&[u8]> {
        let (mode, uid, gid, mtime, size) = meta;
        self.b.get_mut().clear();
        let mut h = if variant & 2 == 0 {
            Header::new_gnu()
        } else {
            Header::new_ustar()
        };
        h.set_mode(mode);
        if variant & 1 == 0 {
            h.set_uid(uid);
            h.set_gid(gid);
        }
        h.set_mtime(mtime);
        let path = Path::new(OsStr::from_bytes(path));
        match kind {
            Kind::File => {
                h.set_entry_type(EntryType::Regular);
                h.set_size(size);
                self.b.append_data(&mut h, path, io::empty())?;
            }
            Kind::Dir => {
                h.set_entry_type(EntryType::Directory);
                h.set_size(0);
                self.b.append_data(&mut h, path, io::empty())?;
            }
            Kind::Symlink => {
                h.set_entry_type(EntryType::Symlink);
                h.set_size(0);
                let target = Path::new(OsStr::from_bytes(link.unwrap_or_default()));
                self.b.append_link(&mut h, path, target)?;
            }
        }
        Ok(self.b.get_ref())
    }

    fn make_entry(&mut self, e: &Entry) -> io::Result<&[u8]> {
        let meta = (e.mode, e.uid, e.gid, e.mtime, e.size);
        self.make(
            e.kind,
            &e.path.0,
            e.link.as_ref().map(|l| &l.0[..]),
            meta,
            e.variant,
        )
    }
}

/// Bytes of headers gathered before handing them out.
const HEADER_BATCH: usize = 64 << 10;

/// The tar stream of one snapshot.
pub(crate) struct TarReader {
    /// The snapshot's record, read from disk for this stream (entries are not kept in memory).
    file: RecordFile,
    /// Open pack files, by index in the record's pack table.
    packs: Vec<File>,
    maker: HeaderMaker,
    /// Header and padding bytes to hand out, from `buf_pos`.
    buf: Vec<u8>,
    buf_pos: usize,
    /// Next entry to emit.
    next: usize,
    /// Content being emitted: (pack index, offset, bytes left, padding after).
    content: Option<(usize, u64, u64, usize)>,
    done: bool,
}

impl std::fmt::Debug for TarReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TarReader")
            .field("id", &self.file.record.id)
            .field("next", &self.next)
            .finish()
    }
}

impl TarReader {
    pub fn new(file: RecordFile, packs: Vec<File>) -> Self {
        TarReader {
            file,
            packs,
            maker: HeaderMaker::new(),
            buf: Vec::with_capacity(HEADER_BATCH + 4096),
            buf_pos: 0,
            next: 0,
            content: None,
            done: false,
        }
    }

    /// Refills `buf` with the headers up to the next entry with content (or the trailer).
    fn fill(&mut self, pad: usize) -> io::Result<()> {
        self.buf.clear();
        self.buf_pos = 0;
        self.buf.resize(pad, 0);
        let entries = &self.file.entries;
        while self.next < entries.len() && self.buf.len() < HEADER_BATCH {
            let e = &entries[self.next];
            self.next += 1;
            match &e.raw {
                Some(raw) => self.buf.extend_from_slice(&raw.0),
                None => {
                    let h = self.maker.make_entry(e)?;
                    self.buf.extend_from_slice(h);
                }
            }
            if e.kind == Kind::File && e.size > 0 {
                let pack = e
                    .pack
                    .ok_or_else(|| io::Error::other("snapshot record: a file without a pack"))?;
                let pad = ((512 - e.size % 512) % 512) as usize;
                self.content = Some((pack as usize, e.offset, e.size, pad));
                return Ok(());
            }
        }
        if self.next >= entries.len() && !self.done {
            self.done = true;
            self.buf.resize(self.buf.len() + self.file.trailer as usize, 0);
        }
        Ok(())
    }
}

impl Read for TarReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            if self.buf_pos < self.buf.len() {
                let n = (self.buf.len() - self.buf_pos).min(out.len());
                out[..n].copy_from_slice(&self.buf[self.buf_pos..self.buf_pos + n]);
                self.buf_pos += n;
                return Ok(n);
            }
            if let Some((pack, off, left, pad)) = self.content {
                if left > 0 {
                    let want = left.min(out.len() as u64) as usize;
                    let file = self
                        .packs
                        .get(pack)
                        .ok_or_else(|| io::Error::other("snapshot record: bad pack index"))?;
                    let n = file.read_at(&mut out[..want], off)?;
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "snapshot pack is shorter than its record says",
                        ));
                    }
                    self.content = Some((pack, off + n as u64, left - n as u64, pad));
                    return Ok(n);
                }
                self.content = None;
                self.fill(pad)?;
                continue;
            }
            if self.done {
                return Ok(0);
            }
            self.fill(0)?;
        }
    }
}
