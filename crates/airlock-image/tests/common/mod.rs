//! Helpers shared by the integration suites: layer archives built in memory, and a store
//! in a temporary directory.

#![allow(dead_code)]

use std::io::Write;
use std::path::Path;

use airlock_image::{Digest, Store, StoreOptions};
use tar::{EntryType, Header};

/// A tar archive being built in memory.
pub struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    pub fn new() -> Self {
        Self(tar::Builder::new(Vec::new()))
    }

    fn header(kind: EntryType, mode: u32, size: u64) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_uid(1234);
        h.set_gid(1234);
        h.set_mtime(1_700_000_000);
        h
    }

    pub fn file(mut self, path: &str, content: &[u8], mode: u32) -> Self {
        let mut h = Self::header(EntryType::Regular, mode, content.len() as u64);
        self.0.append_data(&mut h, path, content).unwrap();
        self
    }

    pub fn dir(mut self, path: &str, mode: u32) -> Self {
        let mut h = Self::header(EntryType::Directory, mode, 0);
        self.0.append_data(&mut h, path, &[][..]).unwrap();
        self
    }

    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        let mut h = Self::header(EntryType::Symlink, 0o777, 0);
        self.0.append_link(&mut h, path, target).unwrap();
        self
    }

    pub fn hardlink(mut self, path: &str, target: &str) -> Self {
        let mut h = Self::header(EntryType::Link, 0o644, 0);
        self.0.append_link(&mut h, path, target).unwrap();
        self
    }

    pub fn node(mut self, path: &str, kind: EntryType) -> Self {
        let mut h = Self::header(kind, 0o666, 0);
        h.set_device_major(1).unwrap();
        h.set_device_minor(3).unwrap();
        self.0.append_data(&mut h, path, &[][..]).unwrap();
        self
    }

    /// An entry whose name and link name are written as given, bypassing the checks of
    /// `tar::Builder` (which refuses `..` and absolute paths).
    pub fn raw(mut self, kind: EntryType, path: &str, link: &str, content: &[u8]) -> Self {
        let mut h = Self::header(kind, 0o644, content.len() as u64);
        let old = h.as_old_mut();
        old.name[..path.len()].copy_from_slice(path.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_cksum();
        self.0.append(&h, content).unwrap();
        self
    }

    /// A PAX extended header that renames the next entry to `path`, whatever its own
    /// header says.
    pub fn pax_path(mut self, path: &str) -> Self {
        self.0.append_pax_extensions([("path", path.as_bytes())]).unwrap();
        self
    }

    pub fn tar(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }

    pub fn gzip(self) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&self.tar()).unwrap();
        enc.finish().unwrap()
    }

    pub fn zstd(self) -> Vec<u8> {
        zstd::encode_all(&self.tar()[..], 3).unwrap()
    }
}

pub fn store(root: &Path) -> Store {
    Store::open(root, StoreOptions::default()).unwrap()
}

pub fn store_with(root: &Path, options: StoreOptions) -> Store {
    Store::open(root, options).unwrap()
}

/// Stores `blob` under its own digest and returns the digest.
pub fn put(store: &Store, blob: &[u8]) -> Digest {
    let d = Digest::of(blob);
    store
        .ensure_blob(&d, Some(blob.len() as u64), || Ok(blob))
        .unwrap();
    d
}

/// The names in the store's work directory (empty when nothing was left behind).
pub fn leftovers(store: &Store) -> Vec<String> {
    std::fs::read_dir(store.root().join("tmp"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}
