//! The content-addressed store: blobs by sha256, layers unpacked once per digest.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use rustix::fs::{self as rfs, FlockOperation, Mode, OFlags};
use tempfile::{NamedTempFile, TempDir};

use crate::digest::Hasher;
use crate::error::io_err;
use crate::flatten::{ApplyMode, apply_layer, parent_of};
use crate::unpack::{UnpackParams, UnpackReport, decoder, unpack};
use crate::{Digest, Error, Owner};

/// Where airlock keeps its images unless told otherwise.
pub const DEFAULT_ROOT: &str = "/var/lib/airlock/images";

/// Size of the buffer blobs are streamed through.
const CHUNK: usize = 64 * 1024;

/// How a store is configured.
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// The most bytes blobs and unpacked layers may take together (`None`: no limit).
    pub max_bytes: Option<u64>,
    /// Who owns every unpacked file (default root).
    pub owner: Owner,
}

/// What [`Store::ensure_blob`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobStatus {
    /// The blob was already stored; the fetch was not called.
    Present,
    /// The blob was fetched, verified and stored; this many bytes.
    Stored(u64),
}

/// What [`Store::unpack_layer`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerStatus {
    /// The layer was already unpacked.
    Present,
    /// The layer was unpacked now.
    Unpacked(UnpackReport),
}

/// What [`Store::prune`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Blobs removed.
    pub blobs: Vec<Digest>,
    /// Unpacked layers removed.
    pub layers: Vec<Digest>,
    /// Bytes freed (as [`Store::usage`] counts them).
    pub freed_bytes: u64,
    /// Entries removed from `tmp/` that a crashed process left there.
    pub stale_work: usize,
}

/// An image store rooted at one directory:
///
/// ```text
/// <root>/lock                 flock'd exclusively to commit, remove or prune
/// <root>/locks/<kind>-<hex>   flock'd while one digest's blob or layer is being made
///                             (prune deletes those of digests neither stored nor held)
/// <root>/blobs/sha256/<hex>   verified blobs, read-only
/// <root>/layers/sha256/<hex>/ unpacked layers
/// <root>/layers/sha256/<hex>.size  the layer's size, so `usage` need not walk it
/// <root>/roots/sha256/<hex>/  an image's prepared root, per manifest digest (root.rs)
/// <root>/roots/sha256/<hex>.size  bytes that root copied rather than linked
/// <root>/images.json          the image records (catalog.rs)
/// <root>/tmp/                 work in progress, renamed into place when complete
///                             (`blob-<hex>-*`, `layer-<hex>-*`, `root-<hex>-*`: covered
///                             by that digest's lock)
/// ```
///
/// A layer is keyed by the digest of its blob as stored (compressed), not by its
/// uncompressed `diff_id`.
#[derive(Debug)]
pub struct Store {
    /// The store's directory (owned by the store; nothing else writes in it).
    root: PathBuf,
    /// Budget and ownership.
    options: StoreOptions,
}

/// An exclusive `flock`, released when dropped (the file is closed).
#[derive(Debug)]
pub(crate) struct FileLock {
    /// Held open for the lock's lifetime; closing it releases the lock.
    _file: File,
}

impl Store {
    /// Opens (creating if needed) the store at `root`.
    pub fn open(root: impl Into<PathBuf>, options: StoreOptions) -> Result<Self, Error> {
        let root = root.into();
        for dir in ["blobs/sha256", "layers/sha256", "roots/sha256", "tmp", "locks"] {
            let p = root.join(dir);
            fs::create_dir_all(&p).map_err(io_err("create store directory", &p))?;
        }
        Ok(Self { root, options })
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Who owns the files the store writes.
    pub(crate) fn owner(&self) -> Owner {
        self.options.owner
    }

    /// Where the blob `digest` is (or would be) stored.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    /// Where the layer `digest` is (or would be) unpacked.
    pub fn layer_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("layers/sha256").join(digest.hex())
    }

    /// Whether the blob is stored.
    pub fn has_blob(&self, digest: &Digest) -> bool {
        self.blob_path(digest).is_file()
    }

    /// Whether the layer is unpacked.
    pub fn has_layer(&self, digest: &Digest) -> bool {
        self.layer_path(digest).is_dir()
    }

    /// Opens a stored blob for reading.
    pub fn open_blob(&self, digest: &Digest) -> Result<File, Error> {
        File::open(self.blob_path(digest)).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => Error::BlobMissing(digest.clone()),
            _ => Error::Io {
                op: "open blob",
                path: self.blob_path(digest),
                source: e,
            },
        })
    }

    fn lock(&self, path: PathBuf) -> Result<FileLock, Error> {
        self.lock_with(path, FlockOperation::LockExclusive)
    }

    /// Locks the file at `path`. Prune deletes the lock files of digests nobody holds, so
    /// a lock is only taken once the locked file is still the one at `path` (else a second
    /// process could lock a fresh file of the same name at the same time).
    fn lock_with(&self, path: PathBuf, op: FlockOperation) -> Result<FileLock, Error> {
        loop {
            let f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(io_err("open lock file", &path))?;
            rfs::flock(&f, op).map_err(|e| Error::Io {
                op: "lock",
                path: path.clone(),
                source: e.into(),
            })?;
            let held = f.metadata().map_err(io_err("stat lock file", &path))?;
            match fs::metadata(&path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                    return Ok(FileLock { _file: f });
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("stat lock file", &path)(e)),
            }
        }
    }

    /// The store-wide lock: commits, removals and prunes hold it.
    pub(crate) fn store_lock(&self) -> Result<FileLock, Error> {
        self.lock(self.root.join("lock"))
    }

    /// One digest's lock, so that its blob or layer is made once.
    pub(crate) fn digest_lock(&self, kind: &str, digest: &Digest) -> Result<FileLock, Error> {
        self.lock(self.root.join("locks").join(format!("{kind}-{}", digest.hex())))
    }

    /// Bytes the store holds: the sizes of blobs plus the sizes of the regular files of
    /// unpacked layers (each inode once), plus what each prepared root copied rather than
    /// hard-linked (see [`Store::image_root`](crate::Store::image_root)). Directories, symlinks and work
    /// in progress are not counted.
    pub fn usage(&self) -> Result<u64, Error> {
        let _lock = self.store_lock()?;
        self.usage_unlocked()
    }

    pub(crate) fn usage_unlocked(&self) -> Result<u64, Error> {
        let mut total = 0;
        for d in self.list_dir("blobs/sha256")? {
            total += self.blob_size(&d)?;
        }
        for d in self.list_dir("layers/sha256")? {
            total += self.layer_size(&d)?;
        }
        for d in self.list_dir("roots/sha256")? {
            total += self.root_size(&d);
        }
        Ok(total)
    }

    /// An unpacked layer's size: recorded beside it when it was stored, measured when the
    /// record is missing (a crash between storing the layer and writing the record).
    fn layer_size(&self, d: &Digest) -> Result<u64, Error> {
        let recorded = fs::read_to_string(self.layer_size_path(d))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        match recorded {
            Some(size) => Ok(size),
            None => tree_size(&self.layer_path(d)),
        }
    }

    fn layer_size_path(&self, d: &Digest) -> PathBuf {
        self.root.join("layers/sha256").join(format!("{}.size", d.hex()))
    }

    fn blob_size(&self, d: &Digest) -> Result<u64, Error> {
        let p = self.blob_path(d);
        Ok(fs::symlink_metadata(&p).map_err(io_err("stat blob", &p))?.len())
    }

    /// The digests named by the entries of `dir` (`blobs/sha256`, `layers/sha256`,
    /// `roots/sha256`; other names are ignored), sorted.
    pub(crate) fn list_dir(&self, dir: &str) -> Result<Vec<Digest>, Error> {
        let p = self.root.join(dir);
        let mut out = Vec::new();
        for e in fs::read_dir(&p).map_err(io_err("list", &p))? {
            let e = e.map_err(io_err("list", &p))?;
            if let Some(d) = e.file_name().to_str().and_then(|n| Digest::from_hex(n).ok()) {
                out.push(d);
            }
        }
        out.sort();
        Ok(out)
    }

    /// The stored blobs.
    pub fn blobs(&self) -> Result<Vec<Digest>, Error> {
        self.list_dir("blobs/sha256")
    }

    /// The unpacked layers.
    pub fn layers(&self) -> Result<Vec<Digest>, Error> {
        self.list_dir("layers/sha256")
    }

    /// The budget and the usage measured now (`None`: no budget).
    fn headroom(&self) -> Result<Option<(u64, u64)>, Error> {
        match self.options.max_bytes {
            None => Ok(None),
            Some(budget) => Ok(Some((budget, self.usage()?))),
        }
    }

    /// Makes sure the blob `digest` is stored: if it is not, calls `fetch` and stores what
    /// it reads, after checking it hashes to `digest` (and has `size` bytes, when given).
    ///
    /// When several threads or processes ask for one digest at once, one fetches and the
    /// others wait and get [`BlobStatus::Present`]. Nothing is left in the store when the
    /// content is wrong, short, long or over the budget.
    pub fn ensure_blob<R: Read>(
        &self,
        digest: &Digest,
        size: Option<u64>,
        fetch: impl FnOnce() -> io::Result<R>,
    ) -> Result<BlobStatus, Error> {
        let _lock = self.digest_lock("blob", digest)?;
        if self.has_blob(digest) {
            return Ok(BlobStatus::Present);
        }
        let headroom = self.headroom()?;
        if let (Some((budget, usage)), Some(size)) = (headroom, size)
            && usage.saturating_add(size) > budget
        {
            return Err(Error::OverBudget { budget, usage, size });
        }
        let mut reader = fetch().map_err(fetch_err(digest))?;
        let mut blob = self.blob_writer(digest, size, headroom)?;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(fetch_err(digest)(e)),
            };
            blob.write(&buf[..n])?;
        }
        let (tmp, got) = blob.finish()?;
        let _store = self.store_lock()?;
        self.check_budget(got)?;
        self.persist_blob(tmp, digest)?;
        Ok(BlobStatus::Stored(got))
    }

    /// Starts writing the blob `digest` to a temporary file (removed on drop).
    fn blob_writer<'d>(
        &self,
        digest: &'d Digest,
        size: Option<u64>,
        headroom: Option<(u64, u64)>,
    ) -> Result<BlobWriter<'d>, Error> {
        let tmp_dir = self.root.join("tmp");
        let tmp = tempfile::Builder::new()
            .prefix(&format!("blob-{}-", digest.hex()))
            .tempfile_in(&tmp_dir)
            .map_err(io_err("create temporary blob", &tmp_dir))?;
        Ok(BlobWriter {
            digest,
            size,
            headroom,
            tmp,
            hasher: Hasher::new(),
            got: 0,
        })
    }

    /// With the store lock held and the budget checked: renames a finished blob into place.
    fn persist_blob(&self, tmp: NamedTempFile, digest: &Digest) -> Result<(), Error> {
        let dest = self.blob_path(digest);
        tmp.persist(&dest).map_err(|e| Error::Io {
            op: "store blob",
            path: dest,
            source: e.error,
        })?;
        Ok(())
    }

    /// Makes sure the layer `digest` is both stored as a blob and unpacked, like
    /// [`Store::ensure_blob`] then [`Store::unpack_layer`], but when neither is there yet,
    /// unpacks the layer while it downloads: the bytes `fetch` reads are hashed and
    /// written to the temporary blob on this thread and, as they arrive, decompressed and
    /// unpacked into the temporary layer directory on another, so the two costs overlap
    /// instead of adding up.
    ///
    /// Nothing unverified becomes visible: the blob and the layer are renamed into place
    /// (under the store lock, with the budget checked for both) only once the download
    /// hashed to `digest` and the unpack accepted every entry. A wrong, short, long or
    /// over-budget download leaves neither (its error wins over whatever the unpack made
    /// of those bytes); a layer the unpack refuses leaves only its verified blob, as the
    /// two steps would. Both digest locks are held throughout (layer first, then blob), so
    /// concurrent calls for one digest do the work once.
    pub fn ensure_layer<R: Read>(
        &self,
        digest: &Digest,
        size: Option<u64>,
        media_type: Option<&str>,
        fetch: impl FnOnce() -> io::Result<R>,
    ) -> Result<(BlobStatus, LayerStatus), Error> {
        let layer_lock = self.digest_lock("layer", digest)?;
        let blob_lock = self.digest_lock("blob", digest)?;
        if self.has_blob(digest) || self.has_layer(digest) {
            // At most one of the two left to make: each step takes its own lock again (a
            // second flock of the same file from this process would wait for this one).
            drop((blob_lock, layer_lock));
            let blob = self.ensure_blob(digest, size, fetch)?;
            let layer = self.unpack_layer(digest, media_type)?;
            return Ok((blob, layer));
        }
        let headroom = self.headroom()?;
        if let (Some((budget, usage)), Some(size)) = (headroom, size)
            && usage.saturating_add(size) > budget
        {
            return Err(Error::OverBudget { budget, usage, size });
        }
        let mut reader = fetch().map_err(fetch_err(digest))?;
        let blob = self.blob_writer(digest, size, headroom)?;
        let (layer_dir, root_fd) = self.layer_work(digest)?;
        // The blob will take its declared size of the budget too.
        let params = self.unpack_params(headroom, size.unwrap_or(0));
        // Three stages, each on its own thread, so that on a multi-core machine the
        // download (with hashing), the decompression and the writing of files overlap:
        // download -> compressed chunks -> decompressor -> plain chunks -> unpacker.
        let (fetched, unpacked) = std::thread::scope(|s| {
            let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(TEE_CHUNKS);
            let (plain_tx, plain_rx) = mpsc::sync_channel::<Vec<u8>>(TEE_CHUNKS);
            let (root_fd, params) = (&root_fd, &params);
            let decompressor = s.spawn(move || decompress(ChunkReader::new(rx), media_type, plain_tx));
            let unpacker = s.spawn(move || unpack(digest, ChunkReader::new(plain_rx), root_fd, params));
            // `tx` is dropped when `tee` returns, so the decompressor sees the end of the
            // stream (or of a failed download), and then the unpacker sees the end of its.
            let fetched = tee(&mut reader, blob, tx);
            let decompressed = decompressor
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            let unpacked = unpacker.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            // A decompression error cut the unpacker's stream short: it is the cause.
            let unpacked = match decompressed {
                Err(source) => Err(Error::Archive {
                    layer: digest.clone(),
                    source,
                }),
                Ok(()) => unpacked,
            };
            (fetched, unpacked)
        });
        let (tmp, got) = fetched?;
        let report = match unpacked {
            Ok(report) => report,
            Err(e) => {
                // The layer is refused; its blob is verified and stays, as it would have.
                let _store = self.store_lock()?;
                self.check_budget(got)?;
                self.persist_blob(tmp, digest)?;
                return Err(e);
            }
        };
        let layer_size = self.finish_layer(&layer_dir, &root_fd)?;
        let _store = self.store_lock()?;
        self.check_budget(got.saturating_add(layer_size))?;
        self.persist_blob(tmp, digest)?;
        self.persist_layer(layer_dir, digest, layer_size)?;
        Ok((BlobStatus::Stored(got), LayerStatus::Unpacked(report)))
    }

    /// Writes the layer's size record, so that `usage` need not walk every layer.
    fn record_layer_size(&self, d: &Digest, size: u64) -> Result<(), Error> {
        self.write_size_record(&self.layer_size_path(d), size)
    }

    /// Writes a tree's size record at `dest` (a temporary file in `tmp/`, renamed).
    pub(crate) fn write_size_record(&self, dest: &Path, size: u64) -> Result<(), Error> {
        let tmp_dir = self.root.join("tmp");
        let mut tmp = tempfile::Builder::new()
            .prefix("size-")
            .tempfile_in(&tmp_dir)
            .map_err(io_err("create temporary file", &tmp_dir))?;
        tmp.write_all(size.to_string().as_bytes())
            .map_err(io_err("write size record", tmp.path()))?;
        tmp.persist(dest).map_err(|e| Error::Io {
            op: "store size record",
            path: dest.to_path_buf(),
            source: e.error,
        })?;
        Ok(())
    }

    /// With the store lock held: refuses `size` more bytes if they exceed the budget.
    pub(crate) fn check_budget(&self, size: u64) -> Result<(), Error> {
        if let Some(budget) = self.options.max_bytes {
            let usage = self.usage_unlocked()?;
            if usage.saturating_add(size) > budget {
                return Err(Error::OverBudget { budget, usage, size });
            }
        }
        Ok(())
    }

    /// Makes sure the layer whose (stored) blob is `digest` is unpacked under
    /// `layers/sha256/<hex>/`. `media_type` picks the decompressor when it names one
    /// (`…+gzip`, `…+zstd`, `….tar`); otherwise the blob's magic bytes do.
    ///
    /// The layer is unpacked into a temporary directory and renamed into place only when
    /// every entry was accepted, so a refused layer leaves nothing. Concurrent calls for one
    /// digest unpack it once.
    pub fn unpack_layer(&self, digest: &Digest, media_type: Option<&str>) -> Result<LayerStatus, Error> {
        let _lock = self.digest_lock("layer", digest)?;
        if self.has_layer(digest) {
            return Ok(LayerStatus::Present);
        }
        let blob = self.open_blob(digest)?;
        let reader = decoder(BufReader::new(blob), media_type).map_err(|source| Error::Archive {
            layer: digest.clone(),
            source,
        })?;
        let (tmp, root_fd) = self.layer_work(digest)?;
        let params = self.unpack_params(self.headroom()?, 0);
        let report = unpack(digest, reader, &root_fd, &params)?;
        let size = self.finish_layer(&tmp, &root_fd)?;
        let _store = self.store_lock()?;
        self.check_budget(size)?;
        self.persist_layer(tmp, digest, size)?;
        Ok(LayerStatus::Unpacked(report))
    }

    /// A temporary directory (removed on drop) to unpack the layer `digest` into, and
    /// its descriptor.
    fn layer_work(&self, digest: &Digest) -> Result<(TempDir, OwnedFd), Error> {
        let tmp_dir = self.root.join("tmp");
        let tmp = tempfile::Builder::new()
            .prefix(&format!("layer-{}-", digest.hex()))
            .tempdir_in(&tmp_dir)
            .map_err(io_err("create temporary layer directory", &tmp_dir))?;
        let root_fd = open_dir_fd(tmp.path())?;
        Ok((tmp, root_fd))
    }

    /// The unpack's limits: what is left of the budget measured as `headroom`, less
    /// `reserved` bytes that something else stored with the layer will take.
    fn unpack_params(&self, headroom: Option<(u64, u64)>, reserved: u64) -> UnpackParams {
        let (budget, usage) = headroom.unwrap_or((u64::MAX, 0));
        let usage = usage.saturating_add(reserved);
        UnpackParams {
            owner: self.options.owner,
            max_bytes: self.options.max_bytes.map(|_| budget.saturating_sub(usage)),
            budget,
            usage,
        }
    }

    /// Gives an unpacked layer's root the store's owner and mode; returns its size.
    fn finish_layer(&self, tmp: &TempDir, root_fd: &OwnedFd) -> Result<u64, Error> {
        self.options
            .owner
            .apply(root_fd)
            .map_err(io_err("chown layer", tmp.path()))?;
        rfs::fchmod(root_fd, Mode::from_raw_mode(0o755)).map_err(|e| Error::Io {
            op: "chmod layer",
            path: tmp.path().into(),
            source: e.into(),
        })?;
        tree_size(tmp.path())
    }

    /// With the store lock held and the budget checked: renames an unpacked layer into
    /// place and records its size.
    fn persist_layer(&self, tmp: TempDir, digest: &Digest, size: u64) -> Result<(), Error> {
        let dest = self.layer_path(digest);
        fs::rename(tmp.path(), &dest).map_err(io_err("store layer", &dest))?;
        // The directory now lives at `dest`; nothing for the guard to remove.
        let _ = tmp.keep();
        self.record_layer_size(digest, size)
    }

    /// Builds at `dest` (which must not exist) one tree of `layers` applied in order.
    ///
    /// In each directory of a layer, first an opaque marker (`.wh..wh..opq`) empties the
    /// directory as the lower layers left it, then each whiteout `.wh.<name>` deletes
    /// `<name>` from below, then the layer's other entries are copied in: a directory
    /// merges with a directory of the same name, anything else replaces what was there.
    /// Whiteout files never reach the result; files sharing an inode within one layer
    /// share one in the result. Modes and owners are the unpacked layers'.
    ///
    /// Every layer must be unpacked. The tree is built in a temporary sibling of `dest`
    /// and renamed into place when complete.
    pub fn flatten(&self, layers: &[Digest], dest: &Path) -> Result<(), Error> {
        self.flatten_with(layers, dest, ApplyMode::Copy).map(|_| ())
    }

    /// [`Store::flatten`], copying or linking files as `mode` says; returns the bytes of
    /// regular files copied (not linked).
    pub(crate) fn flatten_with(&self, layers: &[Digest], dest: &Path, mode: ApplyMode) -> Result<u64, Error> {
        if fs::symlink_metadata(dest).is_ok() {
            return Err(Error::DestinationExists(dest.to_path_buf()));
        }
        let parent = parent_of(dest);
        let tmp = tempfile::Builder::new()
            .prefix(".flatten-")
            .tempdir_in(&parent)
            .map_err(io_err("create temporary tree", &parent))?;
        let dst = open_dir_fd(tmp.path())?;
        let mut copied = 0;
        for layer in layers {
            if !self.has_layer(layer) {
                return Err(Error::LayerMissing(layer.clone()));
            }
            let src = open_dir_fd(&self.layer_path(layer))?;
            copied += apply_layer(&src, &dst, mode).map_err(io_err("apply layer onto", dest))?;
        }
        self.options
            .owner
            .apply(&dst)
            .map_err(io_err("chown tree", dest))?;
        rfs::fchmod(&dst, Mode::from_raw_mode(0o755)).map_err(|e| Error::Io {
            op: "chmod tree",
            path: dest.into(),
            source: e.into(),
        })?;
        fs::rename(tmp.path(), dest).map_err(io_err("rename tree to", dest))?;
        let _ = tmp.keep();
        Ok(copied)
    }

    /// Removes the blob and the unpacked layer of `digest`, if present; returns the bytes
    /// freed.
    pub fn remove(&self, digest: &Digest) -> Result<u64, Error> {
        let _store = self.store_lock()?;
        let mut freed = 0;
        if self.has_blob(digest) {
            freed += self.remove_blob(digest)?;
        }
        if self.has_layer(digest) {
            freed += self.remove_layer(digest)?;
        }
        Ok(freed)
    }

    /// Removes every blob and unpacked layer whose digest is not in `keep`.
    pub fn prune(&self, keep: &HashSet<Digest>) -> Result<PruneReport, Error> {
        let _store = self.store_lock()?;
        let mut report = PruneReport::default();
        for d in self.list_dir("blobs/sha256")? {
            if !keep.contains(&d) {
                report.freed_bytes += self.remove_blob(&d)?;
                report.blobs.push(d);
            }
        }
        for d in self.list_dir("layers/sha256")? {
            if !keep.contains(&d) {
                report.freed_bytes += self.remove_layer(&d)?;
                report.layers.push(d);
            }
        }
        report.stale_work = self.remove_stale_work()?;
        self.remove_idle_locks()?;
        Ok(report)
    }

    /// With the store lock held: removes from `tmp/` what no live process is working on.
    /// A blob's or layer's work in progress is named after its digest and covered by that
    /// digest's lock, so it is stale when the lock is free; anything else there (size
    /// records, removed layers) is only made with the store lock held, so it is stale now.
    fn remove_stale_work(&self) -> Result<usize, Error> {
        let tmp_dir = self.root.join("tmp");
        let mut removed = 0;
        for e in fs::read_dir(&tmp_dir).map_err(io_err("list", &tmp_dir))? {
            let e = e.map_err(io_err("list", &tmp_dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let owner = ["blob", "layer", "root"].into_iter().find_map(|kind| {
                let hex = name.strip_prefix(kind)?.strip_prefix('-')?.get(..64)?;
                Some((kind, Digest::from_hex(hex).ok()?))
            });
            // Held until the entry is gone, so no process starts on it meanwhile.
            let _guard = match owner {
                Some((kind, d)) => {
                    let path = self.root.join("locks").join(format!("{kind}-{}", d.hex()));
                    match self.lock_with(path, FlockOperation::NonBlockingLockExclusive) {
                        Ok(guard) => Some(guard),
                        Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::WouldBlock => {
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
                None => None,
            };
            let path = e.path();
            let is_dir = fs::symlink_metadata(&path)
                .map_err(io_err("stat", &path))?
                .is_dir();
            if is_dir {
                fs::remove_dir_all(&path).map_err(io_err("remove stale work", &path))?;
            } else {
                fs::remove_file(&path).map_err(io_err("remove stale work", &path))?;
            }
            removed += 1;
        }
        Ok(removed)
    }

    /// With the store lock held: deletes the lock files of digests that are neither stored
    /// nor being worked on (each taken without waiting first, and deleted while held).
    fn remove_idle_locks(&self) -> Result<(), Error> {
        let dir = self.root.join("locks");
        for e in fs::read_dir(&dir).map_err(io_err("list", &dir))? {
            let e = e.map_err(io_err("list", &dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((kind, hex)) = name.split_once('-') else {
                continue;
            };
            let Ok(d) = Digest::from_hex(hex) else { continue };
            let in_use = match kind {
                "blob" => self.has_blob(&d),
                "layer" => self.has_layer(&d),
                "root" => self.has_root(&d),
                _ => continue,
            };
            if in_use {
                continue;
            }
            let _guard = match self.lock_with(e.path(), FlockOperation::NonBlockingLockExclusive) {
                Ok(guard) => guard,
                Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::WouldBlock => {
                    continue;
                }
                Err(e) => return Err(e),
            };
            fs::remove_file(e.path()).map_err(io_err("remove lock file", e.path()))?;
        }
        Ok(())
    }

    fn remove_blob(&self, d: &Digest) -> Result<u64, Error> {
        let size = self.blob_size(d)?;
        let p = self.blob_path(d);
        fs::remove_file(&p).map_err(io_err("remove blob", &p))?;
        Ok(size)
    }

    /// Renames the layer out of `layers/` first, so it disappears at once, then deletes it.
    fn remove_layer(&self, d: &Digest) -> Result<u64, Error> {
        let size = self.layer_size(d)?;
        self.remove_tree(&self.layer_path(d), &self.layer_size_path(d))?;
        Ok(size)
    }

    /// Removes the tree `tree` (a layer or a prepared root) and its size record: renamed
    /// into `tmp/` first, so it disappears from where readers look at once (a crash
    /// mid-way leaves it for `prune` to finish), then deleted.
    pub(crate) fn remove_tree(&self, tree: &Path, size_record: &Path) -> Result<(), Error> {
        let tmp_dir = self.root.join("tmp");
        let graveyard = tempfile::Builder::new()
            .prefix("removed-")
            .tempdir_in(&tmp_dir)
            .map_err(io_err("create temporary directory", &tmp_dir))?;
        let moved = graveyard.path().join("tree");
        fs::rename(tree, &moved).map_err(io_err("remove", tree))?;
        match fs::remove_file(size_record) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove size record", size_record)(e)),
        }
        fs::remove_dir_all(&moved).map_err(io_err("remove", &moved))?;
        Ok(())
    }
}

/// How many chunks (of at most [`CHUNK`] bytes) each stage of [`Store::ensure_layer`] may
/// run ahead of the next: at most 2 x 4 MiB held in memory per layer, enough to keep each
/// stage fed while a slower one makes it wait.
const TEE_CHUNKS: usize = 64;

/// The store's error for a failed `fetch` or a failed read of what it returned.
fn fetch_err(digest: &Digest) -> impl Fn(io::Error) -> Error + '_ {
    move |source| Error::Io {
        op: "fetch blob",
        path: digest.to_string().into(),
        source,
    }
}

/// A blob being downloaded into `tmp/`: counted, bounded and hashed as it is written.
struct BlobWriter<'d> {
    digest: &'d Digest,
    /// The size the manifest declares, if known.
    size: Option<u64>,
    /// The budget and the usage measured before the download.
    headroom: Option<(u64, u64)>,
    /// Removed on drop unless persisted.
    tmp: NamedTempFile,
    hasher: Hasher,
    /// Bytes written so far.
    got: u64,
}

impl BlobWriter<'_> {
    /// Appends `bytes`, refusing them past the declared size or the budget.
    fn write(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.got += bytes.len() as u64;
        if let Some(expected) = self.size
            && self.got > expected
        {
            return Err(Error::TooLong {
                digest: self.digest.clone(),
                expected,
            });
        }
        if let Some((budget, usage)) = self.headroom
            && usage.saturating_add(self.got) > budget
        {
            return Err(Error::OverBudget {
                budget,
                usage,
                size: self.got,
            });
        }
        self.hasher.update(bytes);
        self.tmp
            .write_all(bytes)
            .map_err(io_err("write temporary blob", self.tmp.path()))
    }

    /// Checks the length and the digest, makes the file read-only and syncs it, so that a
    /// blob under its final name is whole after a crash; returns it and its size.
    fn finish(self) -> Result<(NamedTempFile, u64), Error> {
        if let Some(expected) = self.size
            && self.got < expected
        {
            return Err(Error::Truncated {
                digest: self.digest.clone(),
                expected,
                got: self.got,
            });
        }
        let actual = self.hasher.finish();
        if actual != *self.digest {
            return Err(Error::DigestMismatch {
                expected: self.digest.clone(),
                actual,
            });
        }
        let file = self.tmp.as_file();
        file.set_permissions(fs::Permissions::from_mode(0o444))
            .map_err(io_err("chmod temporary blob", self.tmp.path()))?;
        file.sync_all()
            .map_err(io_err("sync temporary blob", self.tmp.path()))?;
        Ok((self.tmp, self.got))
    }
}

/// Reads the download to its end into `blob`, sending each chunk to the unpacker too
/// while it still takes them (it stops taking them when it is done or has failed; the
/// blob is still read to its end and verified). Dropping `tx` on return ends the
/// unpacker's stream.
fn tee(
    reader: &mut impl Read,
    mut blob: BlobWriter<'_>,
    tx: mpsc::SyncSender<Vec<u8>>,
) -> Result<(NamedTempFile, u64), Error> {
    let mut tx = Some(tx);
    loop {
        let mut buf = vec![0u8; CHUNK];
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(fetch_err(blob.digest)(e)),
        };
        buf.truncate(n);
        blob.write(&buf)?;
        if let Some(sender) = &tx
            && sender.send(buf).is_err()
        {
            tx = None;
        }
    }
    drop(tx);
    // Synced while the unpacker may still be working.
    blob.finish()
}

/// Decompresses the layer's chunks from `compressed` and sends them on to the unpacker
/// until the end, or until the unpacker stops taking them (done or failed).
fn decompress(
    compressed: impl BufRead,
    media_type: Option<&str>,
    plain: mpsc::SyncSender<Vec<u8>>,
) -> io::Result<()> {
    let mut archive = decoder(compressed, media_type)?;
    loop {
        let mut buf = vec![0u8; CHUNK];
        let n = match archive.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        buf.truncate(n);
        if plain.send(buf).is_err() {
            return Ok(());
        }
    }
}

/// The receiving side of a stage of [`Store::ensure_layer`]: the chunks as a `Read`, ending when the sender is
/// dropped.
struct ChunkReader {
    rx: mpsc::Receiver<Vec<u8>>,
    /// The chunk being handed out, and how far.
    chunk: Vec<u8>,
    pos: usize,
}

impl ChunkReader {
    fn new(rx: mpsc::Receiver<Vec<u8>>) -> Self {
        Self {
            rx,
            chunk: Vec::new(),
            pos: 0,
        }
    }
}

impl BufRead for ChunkReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.pos == self.chunk.len() {
            match self.rx.recv() {
                Ok(chunk) => {
                    self.chunk = chunk;
                    self.pos = 0;
                }
                // The sender is gone: the end of the stream.
                Err(mpsc::RecvError) => break,
            }
        }
        Ok(&self.chunk[self.pos..])
    }

    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.chunk.len());
    }
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = out.len().min(available.len());
        out[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

pub(crate) fn open_dir_fd(path: &Path) -> Result<OwnedFd, Error> {
    rfs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::Io {
        op: "open directory",
        path: path.into(),
        source: e.into(),
    })
}

/// The sizes of the regular files below `path`, each inode once; symlinks not followed.
pub(crate) fn tree_size(path: &Path) -> Result<u64, Error> {
    fn walk(p: &Path, seen: &mut HashSet<(u64, u64)>, total: &mut u64) -> Result<(), Error> {
        for e in fs::read_dir(p).map_err(io_err("list", p))? {
            let e = e.map_err(io_err("list", p))?;
            let path = e.path();
            let md = fs::symlink_metadata(&path).map_err(io_err("stat", &path))?;
            if md.is_dir() {
                walk(&path, seen, total)?;
            } else if md.is_file() && seen.insert((md.dev(), md.ino())) {
                *total += md.len();
            }
        }
        Ok(())
    }
    let mut total = 0;
    walk(path, &mut HashSet::new(), &mut total)?;
    Ok(total)
}
