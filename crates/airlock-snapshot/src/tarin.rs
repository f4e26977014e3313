//! Reading the input tar stream: block framing done here (so each entry's header blocks can
//! be kept byte for byte), field decoding by the `tar` crate's `Header`.
//!
//! Accepted: regular files, directories and symlinks under `workspace/`, `tmp/` and
//! `dev/shm/`, with GNU long-name/long-link and PAX (`path`, `linkpath`, `size`, other keys
//! kept verbatim) extensions, ended by the end-of-archive marker. Refused: hard links,
//! devices, FIFOs, sparse and other entry types, global PAX headers, absolute paths, `.` or
//! `..` components, bad checksums, a stream cut short.

use std::io::{self, Read};

use tar::Header;

use crate::StoreError;
use crate::format::Kind;

/// Bound on a GNU long name or long link: Linux paths are at most 4,096 bytes.
const MAX_LONG_NAME: u64 = 64 << 10;
/// Bound on a PAX extended header's data: the keys we accept are short.
const MAX_PAX: u64 = 1 << 20;
/// Bound on a path: airlock-fstree walks 128 levels of up to 255-byte names through *at()
/// calls, past PATH_MAX.
const MAX_PATH: usize = 64 << 10;
/// Bound on a symlink target: the kernel's (PATH_MAX).
const MAX_LINK: usize = 4096;
/// Bound on the zeros after the end-of-archive marker (GNU tar pads to 10 KiB records).
const MAX_TRAILER: u64 = 1 << 20;

/// One accepted entry's metadata.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub kind: Kind,
    pub path: Vec<u8>,
    pub link: Option<Vec<u8>>,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: u64,
    /// Content bytes that follow the header (0 for directories and symlinks).
    pub size: u64,
}

/// What the stream holds next.
#[derive(Debug)]
pub(crate) enum Next {
    Entry(Parsed),
    /// The end-of-archive marker: how many zero bytes from it to the end of the stream.
    End {
        trailer: u64,
    },
}

pub(crate) struct TarIn<'a> {
    r: &'a mut dyn Read,
    /// Index of the entry being read.
    pub index: u64,
    /// The current entry's header blocks exactly as read (extension entries first).
    pub prefix: Vec<u8>,
    path_seen: String,
    /// Symlinks of the stream so far (paths without a trailing `/`): nothing may come beneath
    /// one (the classic way to make an unpacker write through a link).
    symlinks: std::collections::HashSet<Vec<u8>>,
}

fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> Result<usize, StoreError> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(StoreError::Input(e)),
        }
    }
    Ok(n)
}

fn padded(size: u64) -> u64 {
    size.div_ceil(512) * 512
}

impl<'a> TarIn<'a> {
    pub fn new(r: &'a mut dyn Read) -> Self {
        TarIn {
            r,
            index: 0,
            prefix: Vec::with_capacity(2048),
            path_seen: String::new(),
            symlinks: std::collections::HashSet::new(),
        }
    }

    /// The input, for the caller to read an entry's content from.
    pub fn input(&mut self) -> &mut dyn Read {
        &mut *self.r
    }

    pub fn invalid(&self, reason: impl Into<String>) -> StoreError {
        StoreError::InvalidTar {
            entry: self.index,
            path: self.path_seen.clone(),
            reason: reason.into(),
        }
    }

    /// Reads exactly `buf.len()` bytes or fails as a truncated archive.
    fn exact(&mut self, buf: &mut [u8]) -> Result<(), StoreError> {
        if read_full(self.r, buf)? != buf.len() {
            return Err(self.invalid("the stream ends in the middle of an entry (truncated archive)"));
        }
        Ok(())
    }

    /// Reads the zero padding after `size` content bytes.
    pub fn skip_padding(&mut self, size: u64) -> Result<(), StoreError> {
        let pad = (padded(size) - size) as usize;
        let mut zeros = [0u8; 512];
        self.exact(&mut zeros[..pad])
    }

    /// An extension entry's data (with its padding) appended to `prefix`; returns the data.
    fn extension_data(&mut self, size: u64, max: u64, what: &str) -> Result<Vec<u8>, StoreError> {
        if size > max {
            return Err(self.invalid(format!("{what} of {size} bytes (at most {max})")));
        }
        let start = self.prefix.len();
        self.prefix.resize(start + padded(size) as usize, 0);
        let mut buf = std::mem::take(&mut self.prefix);
        let r = self.exact(&mut buf[start..]);
        self.prefix = buf;
        r?;
        Ok(self.prefix[start..start + size as usize].to_vec())
    }

    /// The next entry, or the end of the archive.
    pub fn next(&mut self) -> Result<Next, StoreError> {
        self.prefix.clear();
        self.path_seen.clear();
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        let mut pax_path: Option<Vec<u8>> = None;
        let mut pax_link: Option<Vec<u8>> = None;
        let mut pax_size: Option<u64> = None;
        loop {
            let mut block = [0u8; 512];
            let n = read_full(self.r, &mut block)?;
            if n == 0 && self.prefix.is_empty() {
                return Err(
                    self.invalid("the stream ends without the end-of-archive marker (truncated archive)")
                );
            }
            if n < 512 {
                return Err(self.invalid("the stream ends in the middle of a header (truncated archive)"));
            }
            if block.iter().all(|&b| b == 0) {
                if !self.prefix.is_empty() {
                    return Err(self.invalid("end-of-archive marker right after an extension header"));
                }
                return self.trailer();
            }
            let h = Header::from_byte_slice(&block);
            let sum: u32 = block
                .iter()
                .enumerate()
                .map(|(i, &b)| {
                    if (148..156).contains(&i) {
                        u32::from(b' ')
                    } else {
                        u32::from(b)
                    }
                })
                .sum();
            match h.cksum() {
                Ok(c) if c == sum => {}
                _ => return Err(self.invalid("bad header checksum (not a tar stream?)")),
            }
            self.prefix.extend_from_slice(&block);
            let size = match h.entry_size() {
                Ok(s) => s,
                // Left blank: 0, as for the other numeric fields below.
                Err(_) if block[124..136].iter().all(|&b| b == 0) => 0,
                Err(e) => return Err(self.invalid(format!("bad size field: {e}"))),
            };
            let kind = match h.entry_type().as_byte() {
                b'L' => {
                    let mut d = self.extension_data(size, MAX_LONG_NAME, "GNU long name")?;
                    d.truncate(d.iter().position(|&b| b == 0).unwrap_or(d.len()));
                    self.path_seen = String::from_utf8_lossy(&d).into_owned();
                    long_name = Some(d);
                    continue;
                }
                b'K' => {
                    let mut d = self.extension_data(size, MAX_LONG_NAME, "GNU long link name")?;
                    d.truncate(d.iter().position(|&b| b == 0).unwrap_or(d.len()));
                    long_link = Some(d);
                    continue;
                }
                b'x' | b'X' => {
                    let d = self.extension_data(size, MAX_PAX, "PAX extended header")?;
                    for (key, value) in pax_records(&d).map_err(|e| self.invalid(e))? {
                        match key {
                            b"path" => {
                                self.path_seen = String::from_utf8_lossy(value).into_owned();
                                pax_path = Some(value.to_vec());
                            }
                            b"linkpath" => pax_link = Some(value.to_vec()),
                            b"size" => {
                                let s = std::str::from_utf8(value)
                                    .ok()
                                    .and_then(|s| s.parse::<u64>().ok());
                                pax_size = Some(s.ok_or_else(|| self.invalid("bad PAX size"))?);
                            }
                            k if k.starts_with(b"GNU.sparse") => {
                                return Err(self.invalid("sparse file (GNU.sparse PAX keys)"));
                            }
                            _ => {}
                        }
                    }
                    continue;
                }
                b'g' => return Err(self.invalid("global PAX header")),
                b'0' | 0 => Kind::File,
                b'5' => Kind::Dir,
                b'2' => Kind::Symlink,
                b'1' => return Err(self.invalid("hard link")),
                b'3' => return Err(self.invalid("character device")),
                b'4' => return Err(self.invalid("block device")),
                b'6' => return Err(self.invalid("FIFO")),
                b'S' => return Err(self.invalid("sparse file")),
                other => return Err(self.invalid(format!("unsupported entry type {:?}", other as char))),
            };
            let path = long_name
                .or(pax_path)
                .unwrap_or_else(|| h.path_bytes().into_owned());
            self.path_seen = String::from_utf8_lossy(&path).into_owned();
            check_path(&path, kind).map_err(|e| self.invalid(e))?;
            let trimmed = path.strip_suffix(b"/").unwrap_or(&path);
            if !self.symlinks.is_empty() {
                let beneath = trimmed
                    .iter()
                    .enumerate()
                    .any(|(i, &b)| b == b'/' && self.symlinks.contains(&trimmed[..i]));
                if beneath {
                    return Err(self.invalid("an entry beneath a symlink of the same stream"));
                }
            }
            if kind == Kind::Symlink {
                self.symlinks.insert(trimmed.to_vec());
            }
            let link = match kind {
                Kind::Symlink => {
                    let l = long_link
                        .or(pax_link)
                        .or_else(|| h.link_name_bytes().map(|l| l.into_owned()))
                        .unwrap_or_default();
                    if l.is_empty() || l.contains(&0) || l.len() > MAX_LINK {
                        return Err(
                            self.invalid("symlink target empty, longer than 4096 bytes or with a NUL")
                        );
                    }
                    Some(l)
                }
                _ => None,
            };
            let size = pax_size.unwrap_or(size);
            if kind != Kind::File && size != 0 {
                return Err(self.invalid("a directory or symlink with content"));
            }
            // A numeric field left blank (all NUL: a producer that did not set it) reads as 0.
            let field = |r: std::ops::Range<usize>, v: io::Result<u64>, what: &str| match v {
                Ok(v) => Ok(v),
                Err(_) if block[r].iter().all(|&b| b == 0) => Ok(0),
                Err(_) => Err(self.invalid(format!("bad {what} field"))),
            };
            let mode = field(100..108, h.mode().map(u64::from), "mode")? as u32;
            let uid = field(108..116, h.uid(), "uid")?;
            let gid = field(116..124, h.gid(), "gid")?;
            let mtime = field(136..148, h.mtime(), "mtime")?;
            return Ok(Next::Entry(Parsed {
                kind,
                path,
                link,
                mode,
                uid,
                gid,
                mtime,
                size,
            }));
        }
    }

    /// After the first zero block: the rest of the stream must be zeros too.
    fn trailer(&mut self) -> Result<Next, StoreError> {
        let mut trailer = 512u64;
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let n = read_full(self.r, &mut buf)?;
            if buf[..n].iter().any(|&b| b != 0) {
                return Err(self.invalid("data after the end-of-archive marker"));
            }
            trailer += n as u64;
            if trailer > MAX_TRAILER {
                return Err(self.invalid("more than 1 MiB of zeros after the end-of-archive marker"));
            }
            if n < buf.len() {
                return Ok(Next::End { trailer });
            }
        }
    }
}

/// A PAX record: key and value.
type PaxRecord<'a> = (&'a [u8], &'a [u8]);

/// PAX records: `<len> <key>=<value>\n`.
fn pax_records(mut d: &[u8]) -> Result<Vec<PaxRecord<'_>>, &'static str> {
    let mut out = Vec::new();
    while !d.is_empty() {
        if d.iter().all(|&b| b == 0) {
            break;
        }
        let sp = d.iter().position(|&b| b == b' ').ok_or("bad PAX record")?;
        let len: usize = std::str::from_utf8(&d[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("bad PAX record length")?;
        if len <= sp + 1 || len > d.len() || d[len - 1] != b'\n' {
            return Err("bad PAX record length");
        }
        let rec = &d[sp + 1..len - 1];
        let eq = rec
            .iter()
            .position(|&b| b == b'=')
            .ok_or("PAX record without '='")?;
        out.push((&rec[..eq], &rec[eq + 1..]));
        d = &d[len..];
    }
    Ok(out)
}

/// A path the store keeps: relative, no `.`/`..`/empty components (one trailing `/`
/// allowed), no NUL, at most PATH_MAX, under `workspace`, `tmp` or `dev/shm` (a bare `dev`
/// directory is let through: a producer may emit the parent of `dev/shm`).
pub(crate) fn check_path(p: &[u8], kind: Kind) -> Result<(), &'static str> {
    if p.is_empty() {
        return Err("empty path");
    }
    if p[0] == b'/' {
        return Err("absolute path");
    }
    if p.contains(&0) {
        return Err("NUL in path");
    }
    if p.len() > MAX_PATH {
        return Err("path longer than 64 KiB");
    }
    let trimmed = p.strip_suffix(b"/").unwrap_or(p);
    let comps: Vec<&[u8]> = trimmed.split(|&b| b == b'/').collect();
    for c in &comps {
        match *c {
            b"" => return Err("empty path component"),
            b"." | b".." => return Err("`.` or `..` path component"),
            _ => {}
        }
    }
    let root = matches!(comps[..], [b"workspace"] | [b"tmp"] | [b"dev"] | [b"dev", b"shm"]);
    if root && kind != Kind::Dir {
        return Err("a root (workspace, tmp, dev/shm) that is not a directory");
    }
    let ok = match comps[0] {
        b"workspace" | b"tmp" => true,
        b"dev" => (comps.len() >= 2 && comps[1] == b"shm") || (comps.len() == 1 && kind == Kind::Dir),
        _ => false,
    };
    if !ok {
        return Err("path outside workspace/, tmp/ and dev/shm/");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert!(check_path(b"workspace", Kind::Symlink).is_err());
        assert!(check_path(b"dev/shm/", Kind::File).is_err());
        assert_eq!(check_path(b"tmp/", Kind::Dir), Ok(()));
        for ok in [
            "workspace",
            "workspace/",
            "workspace/a/b",
            "tmp/x",
            "dev/shm/y",
            "dev/shm",
            "workspace/..a/b..",
            "workspace/.x",
        ] {
            assert_eq!(check_path(ok.as_bytes(), Kind::Dir), Ok(()), "{ok}");
        }
        assert_eq!(check_path(b"dev", Kind::Dir), Ok(()));
        for bad in [
            "",
            "/workspace/a",
            "workspace/../etc",
            "workspace/./a",
            "workspace//a",
            "etc/passwd",
            "dev/sda",
            "dev",
            "./workspace",
            "workspace/a\0b",
        ] {
            assert!(check_path(bad.as_bytes(), Kind::File).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pax() {
        let d = b"20 path=workspace/x\n11 size=42\n";
        let r = pax_records(d).unwrap();
        assert_eq!(
            r,
            vec![(&b"path"[..], &b"workspace/x"[..]), (&b"size"[..], &b"42"[..])]
        );
        assert!(pax_records(b"99 path=x\n").is_err());
    }
}
