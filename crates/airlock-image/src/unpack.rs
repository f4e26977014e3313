//! Unpacking one layer archive into a directory, refusing every entry that could escape it.
//!
//! What lands in the directory is the layer as written, with these exceptions:
//! - device nodes and FIFOs are dropped (listed in [`UnpackReport::dropped`]);
//! - setuid, setgid and sticky bits are cleared; ownership is the store's [`Owner`];
//! - extended attributes are not restored; modification times are, to the second (for
//!   files, symlinks and directories);
//! - OCI whiteouts (`.wh.<name>`, `.wh..wh..opq`) stay as the empty files they are in the
//!   archive: [`crate::Store::flatten`] interprets them when layers are stacked.
//!
//! Refused (the whole layer, with an [`Error::UnsafeEntry`] naming the entry): absolute
//! paths, `..` components, a path whose parent is a symlink or a file, hard links whose
//! target is outside the layer or not (yet) in it.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufRead, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use rustix::io::Errno;
use tar::EntryType;

use crate::fsutil::{self, cstr, is_dir, lstat, open_dir_path, remove_all_at};
use crate::{Digest, Error, Owner};

/// Most entries one layer may hold: a bound on the work a hostile archive of empty entries
/// can cause (large distribution images have ~100k files).
pub const MAX_ENTRIES: u64 = 2_000_000;

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar archive.
    None,
    /// gzip (`+gzip` media types, magic `1f 8b`).
    Gzip,
    /// zstd (`+zstd` media types, magic `28 b5 2f fd`).
    Zstd,
}

impl Compression {
    /// From an OCI or Docker layer media type, when it names a compression; `None` for
    /// media types that do not say (the caller then sniffs the magic bytes).
    pub fn from_media_type(media_type: &str) -> Option<Self> {
        if media_type.ends_with("+gzip") || media_type.ends_with(".tar.gzip") {
            Some(Self::Gzip)
        } else if media_type.ends_with("+zstd") {
            Some(Self::Zstd)
        } else if media_type.ends_with(".tar") {
            Some(Self::None)
        } else {
            None
        }
    }

    /// From the first bytes of a blob.
    pub fn sniff(head: &[u8]) -> Self {
        if head.starts_with(&[0x1f, 0x8b]) {
            Self::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Self::Zstd
        } else {
            Self::None
        }
    }
}

/// What unpacking a layer did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnpackReport {
    /// Tar entries processed (including dropped ones).
    pub entries: u64,
    /// Bytes of regular-file content written.
    pub bytes: u64,
    /// Paths of entries not created (device nodes, FIFOs), as written in the archive.
    pub dropped: Vec<String>,
}

/// Limits and ownership for one unpack.
pub(crate) struct UnpackParams {
    pub(crate) owner: Owner,
    /// Content bytes this layer may write before the store's budget is exceeded.
    pub(crate) max_bytes: Option<u64>,
    /// For the over-budget error: the budget and the usage it was measured against.
    pub(crate) budget: u64,
    pub(crate) usage: u64,
}

/// The decompressing reader for the layer blob `blob`.
pub(crate) fn decoder<'a>(
    mut blob: impl BufRead + 'a,
    media_type: Option<&str>,
) -> io::Result<Box<dyn Read + 'a>> {
    let compression = match media_type.and_then(Compression::from_media_type) {
        Some(c) => c,
        None => Compression::sniff(blob.fill_buf()?),
    };
    Ok(match compression {
        Compression::None => Box::new(blob),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(blob)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(blob)?),
    })
}

/// Splits an archive path into components, refusing absolute paths and `..`.
fn components(raw: &[u8]) -> Result<Vec<&OsStr>, &'static str> {
    if raw.first() == Some(&b'/') {
        return Err("absolute path");
    }
    let mut out = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("`..` component escapes the layer root"),
            c => out.push(OsStr::from_bytes(c)),
        }
    }
    Ok(out)
}

/// Unpacks the tar stream `archive` into the directory `root`.
pub(crate) fn unpack(
    layer: &Digest,
    archive: impl Read,
    root: &OwnedFd,
    params: &UnpackParams,
) -> Result<UnpackReport, Error> {
    let archive_err = |source| Error::Archive {
        layer: layer.clone(),
        source,
    };
    let mut report = UnpackReport::default();
    // Directory modes and mtimes are applied last so a read-only directory can still be
    // filled (and its mtime is not moved by its entries); a directory listed twice gets
    // the later entry's.
    let mut dir_modes: BTreeMap<Vec<std::ffi::OsString>, (u32, u64)> = BTreeMap::new();
    // Normalised paths of dropped nodes: a hard link to one is dropped too.
    let mut dropped: HashSet<Vec<std::ffi::OsString>> = HashSet::new();
    let mut ar = tar::Archive::new(archive);
    for entry in ar.entries().map_err(archive_err)? {
        let mut entry = entry.map_err(archive_err)?;
        report.entries += 1;
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let unsafe_entry = |reason| Error::UnsafeEntry {
            layer: layer.clone(),
            entry: name.clone(),
            reason,
        };
        if report.entries > MAX_ENTRIES {
            return Err(unsafe_entry("layer has more entries than MAX_ENTRIES"));
        }
        let kind = entry.header().entry_type();
        match kind {
            EntryType::Regular
            | EntryType::Continuous
            | EntryType::Directory
            | EntryType::Symlink
            | EntryType::Link => {}
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                if let Ok(comps) = components(&raw) {
                    dropped.insert(comps.iter().map(|c| c.to_os_string()).collect());
                }
                report.dropped.push(name);
                continue;
            }
            // PAX global headers carry defaults only; nothing to create.
            EntryType::XGlobalHeader => continue,
            other => {
                return Err(Error::UnsupportedEntry {
                    layer: layer.clone(),
                    entry: name,
                    kind: format!("{other:?}"),
                });
            }
        }
        let comps = components(&raw).map_err(unsafe_entry)?;
        let mode = entry.header().mode().map_err(archive_err)? & 0o777;
        // Kept because programs compare them: Python trusts a .pyc only while its
        // source's mtime (and size) match what the .pyc recorded.
        let mtime = entry.header().mtime().unwrap_or(0);
        let Some((last, parents)) = comps.split_last() else {
            // The layer root itself ("./"): its mode is the store's, not the archive's.
            if kind == EntryType::Directory {
                continue;
            }
            return Err(unsafe_entry("empty path"));
        };
        let io_fail = |e: io::Error| Error::Io {
            op: "unpack entry",
            path: name.clone().into(),
            source: e,
        };
        let parent =
            open_dir_path(root, parents, Some(params.owner)).map_err(|e| match Errno::from_io_error(&e) {
                Some(Errno::LOOP) | Some(Errno::XDEV) => unsafe_entry("path goes through a symlink"),
                Some(Errno::NOTDIR) => unsafe_entry("path goes through a non-directory"),
                _ => io_fail(e),
            })?;
        let cname = cstr(last).map_err(io_fail)?;
        // An earlier entry of the same path is replaced (tar semantics), except that a
        // directory only merges with a directory.
        let existing = lstat(&parent, &cname).map_err(io_fail)?;
        if let Some(st) = &existing {
            match (is_dir(st), kind == EntryType::Directory) {
                (true, true) => {}
                (true, false) => return Err(unsafe_entry("replaces a directory of the same layer")),
                (false, _) => remove_all_at(&parent, &cname).map_err(io_fail)?,
            }
        }
        // Whatever was dropped at this path before is replaced by this entry.
        dropped.remove(&comps.iter().map(|c| c.to_os_string()).collect::<Vec<_>>());
        match kind {
            EntryType::Directory => {
                if existing.is_none() {
                    rfs::mkdirat(&parent, &*cname, Mode::from_raw_mode(0o700))
                        .map_err(|e| io_fail(e.into()))?;
                }
                let fd = fsutil::open_dir(&parent, last).map_err(io_fail)?;
                params.owner.apply(&fd).map_err(io_fail)?;
                dir_modes.insert(comps.iter().map(|c| c.to_os_string()).collect(), (mode, mtime));
            }
            EntryType::Regular | EntryType::Continuous => {
                let size = entry.size();
                if let Some(max) = params.max_bytes
                    && report.bytes.saturating_add(size) > max
                {
                    return Err(Error::OverBudget {
                        budget: params.budget,
                        usage: params.usage,
                        size: report.bytes.saturating_add(size),
                    });
                }
                let fd = rfs::openat(
                    &parent,
                    &*cname,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| io_fail(e.into()))?;
                let mut file = File::from(fd);
                let n = io::copy(&mut entry, &mut file).map_err(archive_err)?;
                report.bytes += n;
                params.owner.apply(&file).map_err(io_fail)?;
                rfs::fchmod(&file, Mode::from_raw_mode(mode)).map_err(|e| io_fail(e.into()))?;
                rfs::futimens(&file, &times(mtime)).map_err(|e| io_fail(e.into()))?;
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| unsafe_entry("symlink without a target"))?
                    .into_owned();
                let target = cstr(OsStr::from_bytes(&target)).map_err(io_fail)?;
                rfs::symlinkat(&*target, &parent, &*cname).map_err(|e| io_fail(e.into()))?;
                params.owner.apply_at(&parent, &cname).map_err(io_fail)?;
                rfs::utimensat(&parent, &*cname, &times(mtime), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| io_fail(e.into()))?;
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| unsafe_entry("hard link without a target"))?
                    .into_owned();
                let tcomps = components(&target)
                    .map_err(|_| unsafe_entry("hard link target escapes the layer root"))?;
                let key: Vec<_> = tcomps.iter().map(|c| c.to_os_string()).collect();
                if dropped.contains(&key) {
                    report.dropped.push(name);
                    continue;
                }
                let Some((tlast, tparents)) = tcomps.split_last() else {
                    return Err(unsafe_entry("hard link to the layer root"));
                };
                let tparent = open_dir_path(root, tparents, None)
                    .map_err(|_| unsafe_entry("hard link target is not a file of this layer"))?;
                let tname = cstr(tlast).map_err(io_fail)?;
                match lstat(&tparent, &tname).map_err(io_fail)? {
                    Some(st) if !is_dir(&st) => {}
                    _ => return Err(unsafe_entry("hard link target is not a file of this layer")),
                }
                rfs::linkat(&tparent, &*tname, &parent, &*cname, AtFlags::empty())
                    .map_err(|e| io_fail(e.into()))?;
            }
            _ => unreachable!("filtered above"),
        }
    }
    for (comps, (mode, mtime)) in dir_modes.iter().rev() {
        let refs: Vec<&OsStr> = comps.iter().map(|c| c.as_os_str()).collect();
        let fd = open_dir_path(root, &refs, None).map_err(|e| Error::Io {
            op: "set directory mode",
            path: comps.iter().collect(),
            source: e,
        })?;
        rfs::fchmod(&fd, Mode::from_raw_mode(*mode)).map_err(|e| Error::Io {
            op: "set directory mode",
            path: comps.iter().collect(),
            source: e.into(),
        })?;
        rfs::futimens(&fd, &times(*mtime)).map_err(|e| Error::Io {
            op: "set directory mtime",
            path: comps.iter().collect(),
            source: e.into(),
        })?;
    }
    Ok(report)
}

/// Access and modification times both set to `mtime` (seconds since the epoch; a time
/// past what the kernel's timespec holds is clamped).
fn times(mtime: u64) -> rfs::Timestamps {
    let t = rfs::Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX),
        tv_nsec: 0,
    };
    rfs::Timestamps {
        last_access: t,
        last_modification: t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_refuse_escapes() {
        assert_eq!(components(b"./a//b/./c").unwrap(), ["a", "b", "c"]);
        assert!(components(b"/etc/passwd").is_err());
        assert!(components(b"a/../../b").is_err());
        assert!(components(b"..").is_err());
        assert!(components(b"./").unwrap().is_empty());
    }

    #[test]
    fn compression_from_media_type_and_magic() {
        assert_eq!(
            Compression::from_media_type("application/vnd.oci.image.layer.v1.tar+zstd"),
            Some(Compression::Zstd)
        );
        assert_eq!(
            Compression::from_media_type("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(
            Compression::from_media_type("application/vnd.oci.image.layer.v1.tar"),
            Some(Compression::None)
        );
        assert_eq!(Compression::from_media_type("application/octet-stream"), None);
        assert_eq!(Compression::sniff(&[0x1f, 0x8b, 8]), Compression::Gzip);
        assert_eq!(Compression::sniff(&[0x28, 0xb5, 0x2f, 0xfd]), Compression::Zstd);
        assert_eq!(Compression::sniff(b"usr/"), Compression::None);
    }
}
