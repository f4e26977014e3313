//! airlock's snapshot store: the files of a sandbox (and, for tiers that can, its memory and
//! processes) kept on disk under `--snapshot-dir`, within a byte budget, across restarts of
//! the daemon.
//!
//! ```no_run
//! use airlock_snapshot::{NewSnapshot, Store};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Store::open("/var/lib/airlock/snapshots".as_ref(), 10 << 30)?;
//! let tar: Vec<u8> = Vec::new(); // airlock_fstree::export(...) writes this
//! let rec = store.put(
//!     NewSnapshot {
//!         owner: Some("key-1".into()),
//!         session: "sb-123".into(),
//!         attributes: serde_json::json!({"isolation": "namespaces"}),
//!         full: None,
//!     },
//!     &mut &tar[..],
//! )?;
//! let mut again = Vec::new();
//! store.tar(&rec.id)?.read_to_end(&mut again)?;
//! # use std::io::Read;
//! store.delete(&rec.id)?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! ```text
//! <dir>/records/<id>.json   one per snapshot: the Record, then its entries in stream order
//! <dir>/packs/<id>.pack     the blobs snapshot <id> added, back to back (absent if it added none)
//! <dir>/full/<id>/          a full state (what the tier's checkpoint wrote), moved in by rename
//! <dir>/staging/<rand>/     full states being written by a tier (Store::staging)
//! <dir>/tmp/                packs and records being written; deleted full states
//! ```
//!
//! # Why packs
//!
//! Content is addressed by SHA-256, but blobs are not files of their own: a 1,000-file
//! workspace would cost 1,000 file creations (and as many inodes and directory entries) per
//! snapshot, most of the time of a put. A snapshot writes the blobs its owner does not hold
//! yet into one pack, sequentially, and its record lists each entry's (digest, pack, offset,
//! size): a put is one pack and one record, a second put of the same files only a record.
//! The price is granularity: a pack lives as long as any record points into it, so deleting
//! an old snapshot frees nothing while a newer one still shares one of its blobs (a later
//! compaction could rewrite such packs; not done). An in-memory index per owner (digest ->
//! pack, offset) is built from the records at open; the entries themselves stay on disk
//! (`tar` reads the record again), so memory grows with unique blobs, not with snapshots.
//!
//! Small files (up to 1 MiB) are read into 2 MiB batches and hashed on up to four threads at
//! once; the new ones go to the pack straight from the batch, one `pwrite` per run. SHA-256
//! is most of a put's time (about 1 GB/s per core here, with the SHA extensions), so a second
//! put of the same files costs about what hashing them does. Larger files are streamed: read,
//! hashed and written a MiB at a time, and cut off the pack again when they turn out known.
//!
//! Dedup never crosses owners (`NewSnapshot::owner`, the API key): whether a put costs bytes
//! would tell a tenant whether another tenant holds a file.
//!
//! # Fidelity
//!
//! [`Store::tar`] gives back the stream `put` read, byte for byte: each entry's header
//! blocks are rebuilt with the `tar` crate's `Builder` (what airlock-fstree writes with) when
//! that reproduces them exactly, otherwise kept verbatim in the record; the end-of-archive
//! zeros are kept by count.
//!
//! # What is refused
//!
//! Hard links, devices, FIFOs, sparse files, global PAX headers, absolute paths, `.`/`..` or
//! empty components, paths outside `workspace/`, `tmp/`, `dev/shm/`, a root that is not a
//! directory, an entry beneath a symlink of the same stream, a bad checksum, a stream cut
//! short or with data after its end. The importer (airlock-fstree) must still not trust what
//! it unpacks; these are a second line.
//!
//! # Durability
//!
//! Writes go to `tmp/` and are renamed into place, pack first and record last, so a daemon
//! killed at any point leaves either a whole snapshot or files no record owns, which the next
//! `open` removes. There is no fsync: a snapshot survives a kill -9 of the daemon (the data is
//! in the page cache) but power loss or a kernel crash may lose recent snapshots or leave a
//! record whose pack holds zeros (content is not re-hashed when read). Syncing 10 MB would
//! cost more than the whole put.
//!
//! # Budget
//!
//! `usage` counts bytes on disk: pack and record lengths, and the allocated blocks of full
//! states. A put that would go over the budget fails with [`StoreError::Budget`] and leaves
//! nothing; one already far over it stops writing its pack and only counts.
//!
//! One store per directory: `open` takes an exclusive flock on it.

#![deny(missing_docs)]

mod error;
mod format;
mod pack;
mod store;
mod tarin;
mod tarout;

use std::path::{Path, PathBuf};

pub use error::StoreError;
pub use store::Store;

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// The writable filesystem (/workspace, /tmp, /dev/shm).
    Filesystem,
    /// The filesystem and a full state (memory, processes) the tier wrote.
    Full,
}

/// A stored snapshot, as the store reports it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// `snap-` and 16 hex digits from the OS's random source.
    pub id: String,
    /// Seconds since the Unix epoch.
    pub created: f64,
    /// The API key that made it (`None`: the daemon runs without keys).
    pub owner: Option<String>,
    /// The sandbox it was taken from.
    pub session: String,
    /// Filesystem only, or with a full state.
    pub kind: SnapshotKind,
    /// Logical size of its regular files' content.
    pub bytes: u64,
    /// What it added on disk when it was made: its pack, its record, its full state.
    pub stored_bytes: u64,
    /// Number of regular files.
    pub files: u64,
    /// The server's (isolation, image, limits, network...); opaque to the store.
    pub attributes: serde_json::Value,
}

/// What `put` is asked to store besides the tar stream.
#[derive(Debug)]
pub struct NewSnapshot {
    /// The API key: blobs are shared only between snapshots of the same owner.
    pub owner: Option<String>,
    /// The sandbox it is taken from.
    pub session: String,
    /// Kept with the record, opaque to the store.
    pub attributes: serde_json::Value,
    /// A full state written into a staging directory of this store (see [`Store::staging`]).
    pub full: Option<Staging>,
}

/// A directory inside the store for a tier to write a full state into. Removed (with its
/// content) when dropped, unless `put` adopted it.
#[derive(Debug)]
pub struct Staging {
    /// Empty once adopted.
    pub(crate) path: PathBuf,
}

impl Staging {
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The store's use of its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Bytes on disk: packs, records, full states.
    pub used_bytes: u64,
    /// The budget given to `open`.
    pub budget_bytes: u64,
    /// Number of snapshots.
    pub snapshots: u64,
}
