//! The store itself: `open`, `put`, `get`, `list`, `delete`, `tar`, `full_dir`, `usage`.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::FlockOperation;

use crate::error::io_err;
use crate::format::{Bytes, Digest, Entry, FORMAT_VERSION, Kind, Raw, RecordFile};
use crate::pack::{Batch, PackWriter};
use crate::tarin::{Next, Parsed, TarIn};
use crate::tarout::{HeaderMaker, TarReader, VARIANTS};
use crate::{NewSnapshot, Record, SnapshotKind, Staging, StoreError, Usage};

/// Bound on a snapshot's entries: airlock-fstree caps a scan at 100,000; ten times that
/// keeps a hostile stream from growing a record without end.
const MAX_ENTRIES: u64 = 1_000_000;

/// A snapshot as the store holds it in memory: its record file without the entries (they
/// stay on disk, read again by `tar`: a store of many large snapshots would otherwise hold
/// every path in memory) and what it costs on disk.
#[derive(Debug)]
pub(crate) struct Stored {
    pub file: RecordFile,
    /// Bytes of `records/<id>.json`.
    pub record_len: u64,
    /// `file.packs` as shared names (the owner index points into them).
    pub packs: Vec<Arc<str>>,
}

/// A pack file's bookkeeping.
#[derive(Debug)]
struct PackState {
    len: u64,
    /// Records that point into it.
    refs: u32,
    /// Puts under way that found blobs in it (it must not go before they commit or fail).
    pins: u32,
    owner: Option<String>,
}

/// Where an owner already holds a blob.
#[derive(Debug, Clone)]
struct Loc {
    pack: Arc<str>,
    offset: u64,
}

#[derive(Debug, Default)]
struct Inner {
    records: HashMap<String, Arc<Stored>>,
    packs: HashMap<Arc<str>, PackState>,
    /// Per owner (API key; `None` for the keyless daemon): digest -> a copy of that blob.
    owners: HashMap<Option<String>, HashMap<Digest, Loc>>,
    /// Bytes on disk: live packs, record files, full states.
    used: u64,
}

/// The snapshot store (see the crate docs). Send + Sync; every method takes `&self`.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    budget: u64,
    records_dir: PathBuf,
    packs_dir: PathBuf,
    full_dir: PathBuf,
    staging_dir: PathBuf,
    tmp_dir: PathBuf,
    /// The store directory, flock'd exclusively for the store's life (closing releases it).
    _lock: File,
    /// Threads that hash a batch of small files.
    workers: usize,
    /// Batch buffers kept between puts (at most `SPARE_BUFFERS`).
    spare: Mutex<Vec<Vec<u8>>>,
    inner: Mutex<Inner>,
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// 16 hex digits from the OS's random source.
fn random_hex() -> io::Result<String> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(format!("getrandom: {e}")))?;
    Ok(format!("{:016x}", u64::from_be_bytes(b)))
}

fn is_snapshot_id(s: &str) -> bool {
    s.len() == 21
        && s.starts_with("snap-")
        && s[5..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Bytes a directory tree takes on disk (allocated blocks; symlinks not followed).
pub(crate) fn dir_usage(path: &Path) -> io::Result<u64> {
    let meta = fs::symlink_metadata(path)?;
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        for e in fs::read_dir(path)? {
            total += dir_usage(&e?.path())?;
        }
    }
    Ok(total)
}

fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The record file's bytes, with `stored_bytes` = `base` + the file's own length.
fn encode(file: &mut RecordFile, base: u64) -> Result<Vec<u8>, StoreError> {
    let enc = |f: &RecordFile| {
        serde_json::to_vec(f).map_err(|e| StoreError::Io {
            op: "encoding the record of",
            path: PathBuf::from(&f.record.id),
            source: io::Error::other(e),
        })
    };
    file.record.stored_bytes = base;
    let mut json = enc(file)?;
    // The length only grows with the number's digits: a few rounds at most.
    loop {
        let total = base + json.len() as u64;
        if total == file.record.stored_bytes {
            return Ok(json);
        }
        file.record.stored_bytes = total;
        json = enc(file)?;
    }
}

/// Which canonical header reproduces the entry's header blocks (`hint` first: producers are
/// consistent), else the blocks themselves.
fn header_fidelity(maker: &mut HeaderMaker, p: &Parsed, prefix: &[u8], hint: &mut u8) -> (u8, Option<Raw>) {
    let meta = (p.mode, p.uid, p.gid, p.mtime, p.size);
    for k in 0..VARIANTS {
        let v = (*hint + k) % VARIANTS;
        if let Ok(h) = maker.make(p.kind, &p.path, p.link.as_deref(), meta, v)
            && h == prefix
        {
            *hint = v;
            return (v, None);
        }
    }
    (0, Some(Raw(prefix.to_vec())))
}

/// Packs a put under way found blobs in; released (and freed if nothing references them any
/// more) when the put ends, however it ends.
struct Pins<'a> {
    store: &'a Store,
    packs: Vec<Arc<str>>,
}

impl Pins<'_> {
    fn release(&mut self, inner: &mut Inner) {
        for p in self.packs.drain(..) {
            if let Some(ps) = inner.packs.get_mut(&p) {
                ps.pins -= 1;
            }
            self.store.maybe_free(inner, &p);
        }
    }
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        if !self.packs.is_empty() {
            let mut inner = self.store.lock();
            self.release(&mut inner);
        }
    }
}

/// Small files' content is hashed in batches of this many bytes (on `workers` threads).
const BATCH_BYTES: usize = 2 << 20;
/// Batch buffers kept for the next puts (3 MiB each).
const SPARE_BUFFERS: usize = 2;
/// Files larger than this are streamed into the pack, hashed on one thread.
const BIG_FILE: u64 = 1 << 20;

fn empty_digest() -> Digest {
    use sha2::Digest as _;
    Digest(sha2::Sha256::digest([]).into())
}

/// A put's dedup decisions: which blobs the owner holds, which go into this snapshot's pack.
struct Placer<'a> {
    store: &'a Store,
    /// This snapshot's id: the name of its pack.
    own_name: Arc<str>,
    owner: Option<String>,
    pins: Pins<'a>,
    /// The record's pack table, and each name's index in it.
    table: Vec<Arc<str>>,
    table_idx: HashMap<Arc<str>, u32>,
    /// This snapshot's pack in `table`, once it holds a blob.
    own: Option<u32>,
    /// Blobs already in this snapshot's pack: digest -> offset.
    local: HashMap<Digest, u64>,
    pack: PackWriter,
    /// Bytes the pack may take before the put is over budget (a first check; the real one
    /// is made under the lock at commit).
    room: u64,
}

impl Placer<'_> {
    /// Where the blob already is (this pack, or one of the owner's): (table index, offset).
    fn known(&mut self, digest: &Digest) -> Option<(u32, u64)> {
        if let Some(&off) = self.local.get(digest) {
            return Some((self.own.expect("local blobs are in the own pack"), off));
        }
        let mut inner = self.store.lock();
        let loc = inner.owners.get(&self.owner)?.get(digest)?.clone();
        if let Some(&i) = self.table_idx.get(&loc.pack) {
            return Some((i, loc.offset));
        }
        // Pinned: the pack stays until this put ends, whatever deletes happen meanwhile.
        inner.packs.get_mut(&loc.pack)?.pins += 1;
        self.pins.packs.push(loc.pack.clone());
        let i = self.table.len() as u32;
        self.table.push(loc.pack.clone());
        self.table_idx.insert(loc.pack, i);
        Some((i, loc.offset))
    }

    /// A new blob at `offset` of this snapshot's pack; its table index.
    fn added(&mut self, digest: Digest, offset: u64) -> u32 {
        self.local.insert(digest, offset);
        match self.own {
            Some(i) => i,
            None => {
                let i = self.table.len() as u32;
                self.table.push(self.own_name.clone());
                self.table_idx.insert(self.own_name.clone(), i);
                self.own = Some(i);
                i
            }
        }
    }

    fn check_room(&mut self, pending: u64) {
        if !self.pack.discarding() && self.pack.pos() + pending > self.room {
            self.pack.discard();
        }
    }

    /// Hashes the batch, decides each file, writes the new blobs (runs of them at once).
    fn place_batch(
        &mut self,
        batch: &mut Batch,
        entries: &mut [Entry],
        workers: usize,
    ) -> Result<(), StoreError> {
        if batch.files.is_empty() {
            return Ok(());
        }
        let digests = batch.digests(workers);
        // The run of new blobs not written yet: [start, end) of the batch buffer.
        let (mut run_start, mut run_end) = (0usize, 0usize);
        for (&(ei, start, len), digest) in batch.files.iter().zip(digests) {
            let e = &mut entries[ei];
            e.digest = Some(digest);
            if let Some((i, off)) = self.known(&digest) {
                (e.pack, e.offset) = (Some(i), off);
                continue;
            }
            if run_end != start {
                self.pack.write(&batch.buf[run_start..run_end])?;
                (run_start, run_end) = (start, start);
            }
            let offset = self.pack.pos() + (run_end - run_start) as u64;
            run_end = start + len;
            let i = self.added(digest, offset);
            (e.pack, e.offset) = (Some(i), offset);
            self.check_room((run_end - run_start) as u64);
        }
        self.pack.write(&batch.buf[run_start..run_end])?;
        batch.clear();
        Ok(())
    }

    /// A large file, streamed into the pack and taken back if known; false when the stream
    /// ended first.
    fn place_streamed(&mut self, r: &mut dyn Read, size: u64, e: &mut Entry) -> Result<bool, StoreError> {
        let start = self.pack.pos();
        let Some(digest) = self.pack.append_stream(r, size)? else {
            return Ok(false);
        };
        e.digest = Some(digest);
        if let Some((i, off)) = self.known(&digest) {
            self.pack.rollback(start)?;
            (e.pack, e.offset) = (Some(i), off);
        } else {
            let i = self.added(digest, start);
            (e.pack, e.offset) = (Some(i), start);
            self.check_room(0);
        }
        Ok(true)
    }
}

/// A file removed on drop unless disarmed.
struct TmpFile(Option<PathBuf>);

impl Drop for TmpFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// How long an open waits for a held store lock before it gives up: a lock released a
/// moment ago may live on for that long in a child forked meanwhile by any thread of the
/// process (the fd is close-on-exec, but the child holds it until its exec).
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(250);

/// Takes the exclusive flock on `lock`, retrying within [`LOCK_PATIENCE`] while another
/// holds it.
fn lock_exclusive(lock: &File) -> rustix::io::Result<()> {
    let deadline = std::time::Instant::now() + LOCK_PATIENCE;
    loop {
        match rustix::fs::flock(lock, FlockOperation::NonBlockingLockExclusive) {
            Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

impl Store {
    /// Opens (creating it if needed) the store in `dir` with a budget of `budget_bytes`.
    ///
    /// Takes an exclusive `flock` on `dir` (a second open, from this process or another
    /// daemon, fails with `WouldBlock`), loads the records, and cleans up: temporary files
    /// and staging directories, records whose packs or full state are missing (or that do not
    /// parse), then packs and full-state directories no record owns. Each removal is logged.
    pub fn open(dir: &Path, budget_bytes: u64) -> io::Result<Store> {
        let sub = |s: &str| dir.join(s);
        let (records_dir, packs_dir, full_dir, staging_dir, tmp_dir) = (
            sub("records"),
            sub("packs"),
            sub("full"),
            sub("staging"),
            sub("tmp"),
        );
        let mut b = fs::DirBuilder::new();
        b.recursive(true).mode(0o700);
        for d in [dir, &records_dir, &packs_dir, &full_dir, &staging_dir, &tmp_dir] {
            b.create(d)
                .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", d.display())))?;
        }
        let lock = File::open(dir)
            .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", dir.display())))?;
        match lock_exclusive(&lock) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "snapshot store {} is in use by another store (another airlock daemon?): its flock is held",
                        dir.display()
                    ),
                ));
            }
            Err(e) => {
                return Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("flock {}: {e}", dir.display()),
                ));
            }
        }
        let store = Store {
            dir: dir.to_path_buf(),
            budget: budget_bytes,
            records_dir,
            packs_dir,
            full_dir,
            staging_dir,
            tmp_dir,
            _lock: lock,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
            spare: Mutex::new(Vec::new()),
            inner: Mutex::new(Inner::default()),
        };
        store.load()?;
        Ok(store)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pack_path(&self, id: &str) -> PathBuf {
        self.packs_dir.join(format!("{id}.pack"))
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.records_dir.join(format!("{id}.json"))
    }

    /// Startup: clean, load, check, index.
    fn load(&self) -> io::Result<()> {
        for d in [&self.tmp_dir, &self.staging_dir] {
            for e in fs::read_dir(d)? {
                let p = e?.path();
                tracing::info!(path = %p.display(), "snapshot store: removing a leftover temporary file");
                remove_any(&p)?;
            }
        }
        let mut pack_lens: HashMap<String, Option<u64>> = HashMap::new();
        let mut pack_len = |name: &str| -> Option<u64> {
            *pack_lens.entry(name.to_string()).or_insert_with(|| {
                fs::metadata(self.pack_path(name))
                    .ok()
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
            })
        };
        let mut inner = Inner::default();
        for e in fs::read_dir(&self.records_dir)? {
            let e = e?;
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name.strip_suffix(".json").filter(|id| is_snapshot_id(id));
            let Some(id) = id else {
                tracing::warn!(path = %path.display(), "snapshot store: removing a file that is not a record");
                remove_any(&path)?;
                continue;
            };
            let problem = match fs::read(&path) {
                Err(e) => Err(format!("unreadable: {e}")),
                Ok(bytes) => match serde_json::from_slice::<RecordFile>(&bytes) {
                    Err(e) => Err(format!("does not parse: {e}")),
                    Ok(file) => self
                        .check_record(id, &file, &mut pack_len)
                        .map(|()| (file, bytes.len() as u64)),
                },
            };
            match problem {
                Ok((mut file, record_len)) => {
                    file.record.created = file.created_ms as f64 / 1000.0;
                    let packs: Vec<Arc<str>> =
                        file.packs.iter().map(|p| Arc::<str>::from(p.as_str())).collect();
                    // The owner's blob index, from the entries, which are then let go.
                    let index = inner.owners.entry(file.record.owner.clone()).or_default();
                    for e in std::mem::take(&mut file.entries) {
                        if let (Some(d), Some(i)) = (e.digest, e.pack)
                            && e.size > 0
                        {
                            let pack = packs[i as usize].clone();
                            index.entry(d).or_insert(Loc {
                                pack,
                                offset: e.offset,
                            });
                        }
                    }
                    inner.records.insert(
                        id.to_string(),
                        Arc::new(Stored {
                            file,
                            record_len,
                            packs,
                        }),
                    );
                }
                Err(why) => {
                    tracing::warn!(snapshot = id, reason = %why, "snapshot store: dropping a record whose data is missing or damaged");
                    fs::remove_file(&path)?;
                }
            }
        }
        // Packs and full states that no record owns.
        let mut wanted_packs = HashSet::new();
        let mut wanted_full = HashSet::new();
        for s in inner.records.values() {
            wanted_packs.extend(s.file.packs.iter().cloned());
            if s.file.record.kind == SnapshotKind::Full {
                wanted_full.insert(s.file.record.id.clone());
            }
        }
        for e in fs::read_dir(&self.packs_dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let keep = name
                .strip_suffix(".pack")
                .is_some_and(|id| wanted_packs.contains(id));
            if !keep {
                tracing::warn!(path = %e.path().display(), "snapshot store: removing a pack no record references");
                remove_any(&e.path())?;
            }
        }
        for e in fs::read_dir(&self.full_dir)? {
            let e = e?;
            if !wanted_full.contains(&*e.file_name().to_string_lossy()) {
                tracing::warn!(path = %e.path().display(), "snapshot store: removing a full state no record owns");
                remove_any(&e.path())?;
            }
        }
        // Bookkeeping.
        let stored: Vec<Arc<Stored>> = inner.records.values().cloned().collect();
        for s in &stored {
            inner.used += s.record_len + s.file.full_bytes;
            for p in &s.packs {
                let len = pack_len(p).unwrap_or(0);
                let ps = inner.packs.entry(p.clone()).or_insert_with(|| PackState {
                    len,
                    refs: 0,
                    pins: 0,
                    owner: s.file.record.owner.clone(),
                });
                if ps.refs == 0 {
                    inner.used += len;
                }
                ps.refs += 1;
            }
        }
        inner.owners.retain(|_, index| !index.is_empty());
        tracing::info!(
            dir = %self.dir.display(),
            snapshots = inner.records.len(),
            used_bytes = inner.used,
            budget_bytes = self.budget,
            "snapshot store open"
        );
        *self.lock() = inner;
        Ok(())
    }

    /// A record loaded at open points only at data that is there.
    fn check_record(
        &self,
        id: &str,
        file: &RecordFile,
        pack_len: &mut dyn FnMut(&str) -> Option<u64>,
    ) -> Result<(), String> {
        if file.version != FORMAT_VERSION {
            return Err(format!(
                "record format {} (this store reads {FORMAT_VERSION})",
                file.version
            ));
        }
        if file.record.id != id {
            return Err(format!("the record inside says {}", file.record.id));
        }
        let mut lens = Vec::with_capacity(file.packs.len());
        for p in &file.packs {
            if !is_snapshot_id(p) {
                return Err(format!("bad pack name {p:?}"));
            }
            lens.push(pack_len(p).ok_or_else(|| format!("pack {p} is missing"))?);
        }
        for e in &file.entries {
            if e.kind == Kind::File && e.size > 0 {
                let i = e.pack.ok_or("a file without a pack")? as usize;
                let len = *lens.get(i).ok_or("a bad pack index")?;
                if e.offset.checked_add(e.size).is_none_or(|end| end > len) {
                    return Err(format!("pack {} is shorter than the record says", file.packs[i]));
                }
            }
        }
        if file.record.kind == SnapshotKind::Full && !self.full_dir.join(id).is_dir() {
            return Err("its full state is missing".into());
        }
        Ok(())
    }

    /// A directory for a tier to write a full (memory and processes) state into; give it to
    /// `put` in `NewSnapshot::full`. Removed when dropped unless `put` adopted it.
    pub fn staging(&self) -> io::Result<Staging> {
        loop {
            let path = self.staging_dir.join(random_hex()?);
            match fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Staging { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("creating {}: {e}", path.display()),
                    ));
                }
            }
        }
    }

    fn new_id(&self) -> Result<String, StoreError> {
        loop {
            let id = format!(
                "snap-{}",
                random_hex().map_err(io_err("drawing an id for", &self.dir))?
            );
            let inner = self.lock();
            if !inner.records.contains_key(&id)
                && !inner.packs.contains_key(id.as_str())
                && !self.record_path(&id).exists()
                && !self.pack_path(&id).exists()
            {
                return Ok(id);
            }
        }
    }

    /// Stores a snapshot: the files of `tar` (airlock-fstree's export format) and, with
    /// `new.full`, a full state a tier wrote into a [`Store::staging`] directory.
    ///
    /// Each file's content is hashed (SHA-256); only blobs `new.owner` does not hold yet are
    /// written, into this snapshot's pack. Refused: a hostile or malformed stream
    /// ([`StoreError::InvalidTar`]), a snapshot that would take the store over budget
    /// ([`StoreError::Budget`]). Whatever fails, nothing of the snapshot is left (its
    /// staging directory included).
    pub fn put(&self, new: NewSnapshot, tar: &mut dyn Read) -> Result<Record, StoreError> {
        let NewSnapshot {
            owner,
            session,
            attributes,
            full,
        } = new;
        let mut full = full;
        let full_bytes = match &full {
            Some(s) if s.path.parent() != Some(self.staging_dir.as_path()) => {
                return Err(StoreError::ForeignStaging(s.path.clone()));
            }
            Some(s) => dir_usage(&s.path).map_err(io_err("measuring", &s.path))?,
            None => 0,
        };
        let id = self.new_id()?;
        let used_start = self.lock().used;
        let mut placer = Placer {
            store: self,
            own_name: Arc::from(id.as_str()),
            owner,
            pins: Pins {
                store: self,
                packs: Vec::new(),
            },
            table: Vec::new(),
            table_idx: HashMap::new(),
            own: None,
            local: HashMap::new(),
            pack: PackWriter::new(self.tmp_dir.join(format!("{id}.pack"))),
            room: self.budget.saturating_sub(used_start + full_bytes),
        };
        // A batch buffer from the last put: fresh pages cost a fault each (2 MiB: 512 faults).
        let mut batch = Batch {
            buf: self
                .spare
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop()
                .unwrap_or_default(),
            files: Vec::new(),
        };
        batch.buf.clear();
        batch.buf.reserve(BATCH_BYTES + BIG_FILE as usize);
        let mut entries = Vec::new();
        let (mut bytes, mut files) = (0u64, 0u64);
        let mut maker = HeaderMaker::new();
        let mut hint = 0u8;

        let mut input = TarIn::new(tar);
        let trailer = loop {
            let p = match input.next()? {
                Next::End { trailer } => break trailer,
                Next::Entry(p) => p,
            };
            if input.index >= MAX_ENTRIES {
                return Err(input.invalid(format!("more than {MAX_ENTRIES} entries")));
            }
            let (variant, raw) = header_fidelity(&mut maker, &p, &input.prefix, &mut hint);
            let Parsed {
                kind,
                path,
                link,
                mode,
                uid,
                gid,
                mtime,
                size,
            } = p;
            entries.push(Entry {
                path: Bytes(path),
                kind,
                mode,
                uid,
                gid,
                mtime,
                size,
                digest: None,
                pack: None,
                offset: 0,
                link: link.map(Bytes),
                variant,
                raw,
            });
            if kind == Kind::File {
                files += 1;
                bytes += size;
                let complete = if size == 0 {
                    entries.last_mut().expect("pushed above").digest = Some(empty_digest());
                    true
                } else if size <= BIG_FILE {
                    let ok = batch.read(entries.len() - 1, input.input(), size)?;
                    if batch.buf.len() >= BATCH_BYTES {
                        placer.place_batch(&mut batch, &mut entries, self.workers)?;
                    }
                    ok
                } else {
                    placer.place_batch(&mut batch, &mut entries, self.workers)?;
                    placer.place_streamed(input.input(), size, entries.last_mut().expect("pushed above"))?
                };
                if !complete {
                    return Err(input.invalid("the stream ends in the middle of a file (truncated archive)"));
                }
                input.skip_padding(size)?;
            }
            input.index += 1;
        };
        placer.place_batch(&mut batch, &mut entries, self.workers)?;
        {
            let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
            if spare.len() < SPARE_BUFFERS {
                spare.push(std::mem::take(&mut batch.buf));
            }
        }
        let Placer {
            pins,
            table,
            own,
            local,
            mut pack,
            owner,
            ..
        } = placer;
        let mut pins = pins;

        let kind = if full.is_some() {
            SnapshotKind::Full
        } else {
            SnapshotKind::Filesystem
        };
        let created_ms = now_ms();
        let record = Record {
            id: id.clone(),
            created: created_ms as f64 / 1000.0,
            owner,
            session,
            kind,
            bytes,
            stored_bytes: 0,
            files,
            attributes,
        };
        let mut file = RecordFile {
            version: FORMAT_VERSION,
            record,
            created_ms,
            full_bytes,
            packs: table.iter().map(|p| p.to_string()).collect(),
            trailer,
            entries,
        };
        let pack_logical = pack.pos();
        let json = encode(&mut file, pack_logical + full_bytes)?;
        let needed = file.record.stored_bytes;
        if pack.discarding() {
            let used = self.lock().used;
            return Err(StoreError::Budget {
                needed,
                used,
                budget: self.budget,
            });
        }
        let pack_len = pack.finish();
        let tmp_record = self.tmp_dir.join(format!("{id}.json"));
        let mut tmp_guard = TmpFile(Some(tmp_record.clone()));
        {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp_record)
                .map_err(io_err("creating", &tmp_record))?;
            f.write_all(&json).map_err(io_err("writing", &tmp_record))?;
        }

        let mut inner = self.lock();
        if inner.used + needed > self.budget {
            let used = inner.used;
            drop(inner);
            return Err(StoreError::Budget {
                needed,
                used,
                budget: self.budget,
            });
        }
        // Into place: pack first, full state next, the record last (it makes the snapshot).
        let pack_path = self.pack_path(&id);
        if pack_len > 0 {
            if let Err(e) = fs::rename(&pack.path, &pack_path) {
                drop(inner);
                return Err(io_err("renaming into place", &pack_path)(e));
            }
            pack.adopted();
        }
        let full_path = self.full_dir.join(&id);
        if let Some(s) = full.as_mut() {
            if let Err(e) = fs::rename(&s.path, &full_path) {
                let _ = fs::remove_file(&pack_path);
                drop(inner);
                return Err(io_err("renaming into place", &full_path)(e));
            }
            s.path = PathBuf::new();
        }
        let record_path = self.record_path(&id);
        if let Err(e) = fs::rename(&tmp_record, &record_path) {
            let _ = fs::remove_file(&pack_path);
            let _ = remove_any(&full_path);
            drop(inner);
            return Err(io_err("renaming into place", &record_path)(e));
        }
        tmp_guard.0 = None;

        let owner = file.record.owner.clone();
        let record = file.record.clone();
        file.entries = Vec::new();
        let stored = Arc::new(Stored {
            file,
            record_len: json.len() as u64,
            packs: table,
        });
        for p in &stored.packs {
            if own.is_some_and(|i| &*stored.packs[i as usize] == p.as_ref()) {
                inner.packs.insert(
                    p.clone(),
                    PackState {
                        len: pack_len,
                        refs: 1,
                        pins: 0,
                        owner: owner.clone(),
                    },
                );
            } else if let Some(ps) = inner.packs.get_mut(p) {
                ps.refs += 1;
            }
        }
        if let Some(i) = own {
            let name = stored.packs[i as usize].clone();
            let index = inner.owners.entry(owner).or_default();
            for (digest, offset) in local {
                index.entry(digest).or_insert(Loc {
                    pack: name.clone(),
                    offset,
                });
            }
        }
        inner.used += needed;
        inner.records.insert(id, stored);
        pins.release(&mut inner);
        Ok(record)
    }

    /// Frees a pack that no record references and no put has pinned.
    fn maybe_free(&self, inner: &mut Inner, pack: &Arc<str>) {
        let Some(ps) = inner.packs.get(pack) else { return };
        if ps.refs > 0 || ps.pins > 0 {
            return;
        }
        let path = self.pack_path(pack);
        if let Err(e) = fs::remove_file(&path)
            && e.kind() != io::ErrorKind::NotFound
        {
            // Left for the next open to remove (no record references it).
            tracing::warn!(path = %path.display(), error = %e, "snapshot store: could not remove a pack");
        }
        let ps = inner.packs.remove(pack).expect("looked up above");
        inner.used -= ps.len;
        // Blobs the owner also holds in another pack (two puts of the same new files side by
        // side) are forgotten too: a later put stores them again, nothing worse.
        if let Some(index) = inner.owners.get_mut(&ps.owner) {
            index.retain(|_, loc| loc.pack != *pack);
            if index.is_empty() {
                inner.owners.remove(&ps.owner);
            }
        }
    }

    /// The record of snapshot `id`.
    pub fn get(&self, id: &str) -> Option<Record> {
        self.lock().records.get(id).map(|s| s.file.record.clone())
    }

    /// Every record, oldest first.
    pub fn list(&self) -> Vec<Record> {
        let mut out: Vec<Record> = self
            .lock()
            .records
            .values()
            .map(|s| s.file.record.clone())
            .collect();
        out.sort_by(|a, b| a.created.total_cmp(&b.created).then_with(|| a.id.cmp(&b.id)));
        out
    }

    /// Deletes snapshot `id`: its record, its full state, and the packs no other record
    /// references any more. Returns the record.
    pub fn delete(&self, id: &str) -> Result<Record, StoreError> {
        let mut inner = self.lock();
        let stored = inner
            .records
            .remove(id)
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        let record_path = self.record_path(id);
        if let Err(e) = fs::remove_file(&record_path)
            && e.kind() != io::ErrorKind::NotFound
        {
            inner.records.insert(id.to_string(), stored);
            return Err(io_err("removing", record_path)(e));
        }
        inner.used -= stored.record_len + stored.file.full_bytes;
        for p in &stored.packs {
            if let Some(ps) = inner.packs.get_mut(p) {
                ps.refs -= 1;
            }
            self.maybe_free(&mut inner, p);
        }
        // The full state leaves the store at once (renamed into tmp/, which open clears);
        // removing a large tree is done without the lock.
        let mut trash = None;
        if stored.file.record.kind == SnapshotKind::Full {
            let t = self.tmp_dir.join(format!("{id}.deleted"));
            match fs::rename(self.full_dir.join(id), &t) {
                Ok(()) => trash = Some(t),
                Err(e) => {
                    tracing::warn!(snapshot = id, error = %e, "snapshot store: could not move a full state away")
                }
            }
        }
        drop(inner);
        if let Some(t) = trash
            && let Err(e) = fs::remove_dir_all(&t)
        {
            tracing::warn!(path = %t.display(), error = %e, "snapshot store: could not remove a deleted full state");
        }
        Ok(stored.file.record.clone())
    }

    /// The files of snapshot `id` as a tar stream: the same entries, in the same order, with
    /// the same header blocks, content and end-of-archive padding as the stream given to
    /// `put`. Content is not re-hashed on the way out.
    pub fn tar(&self, id: &str) -> Result<Box<dyn Read + Send>, StoreError> {
        let inner = self.lock();
        let stored = inner
            .records
            .get(id)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        // Opened under the lock: a delete after this point does not cut the stream short.
        let record_path = self.record_path(id);
        let mut record_file = File::open(&record_path).map_err(io_err("opening", &record_path))?;
        let mut files = Vec::with_capacity(stored.packs.len());
        for p in &stored.packs {
            let path = self.pack_path(p);
            files.push(File::open(&path).map_err(io_err("opening", path))?);
        }
        drop(inner);
        let mut json = Vec::with_capacity(stored.record_len as usize);
        record_file
            .read_to_end(&mut json)
            .map_err(io_err("reading", &record_path))?;
        let file: RecordFile = serde_json::from_slice(&json)
            .map_err(|e| io_err("parsing", &record_path)(io::Error::new(io::ErrorKind::InvalidData, e)))?;
        Ok(Box::new(TarReader::new(file, files)))
    }

    /// The directory holding snapshot `id`'s full state (a tier's `Backend::restore` reads
    /// it); `None` for an unknown id or a filesystem-only snapshot.
    pub fn full_dir(&self, id: &str) -> Option<PathBuf> {
        let inner = self.lock();
        let s = inner.records.get(id)?;
        (s.file.record.kind == SnapshotKind::Full).then(|| self.full_dir.join(id))
    }

    /// Bytes on disk against the budget, and the number of snapshots.
    pub fn usage(&self) -> Usage {
        let inner = self.lock();
        Usage {
            used_bytes: inner.used,
            budget_bytes: self.budget,
            snapshots: inner.records.len() as u64,
        }
    }
}
