//! Helpers shared by the store's tests: tar streams built the way airlock-fstree builds them
//! (the `tar` crate's Builder, GNU headers), stores in the target directory (on disk, not
//! tmpfs), and a look at what the store left on disk.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use airlock_snapshot::{NewSnapshot, Store};
use tar::{Builder, EntryType, Header};

/// One entry of a test stream.
#[derive(Clone, Debug)]
pub enum Item {
    Dir(Vec<u8>, u32),
    File(Vec<u8>, u32, Vec<u8>),
    Link(Vec<u8>, Vec<u8>),
}

pub fn dir(p: &str) -> Item {
    Item::Dir(p.as_bytes().to_vec(), 0o755)
}
pub fn file(p: &str, content: &[u8]) -> Item {
    Item::File(p.as_bytes().to_vec(), 0o644, content.to_vec())
}
pub fn link(p: &str, target: &str) -> Item {
    Item::Link(p.as_bytes().to_vec(), target.as_bytes().to_vec())
}

/// A tar stream of `items` (GNU headers, uid/gid 1000, distinct mtimes).
pub fn build(items: &[Item]) -> Vec<u8> {
    let mut b = Builder::new(Vec::new());
    for (i, it) in items.iter().enumerate() {
        let mut h = Header::new_gnu();
        h.set_uid(1000);
        h.set_gid(1000);
        h.set_mtime(1_764_000_000 + i as u64);
        let p = |b: &Vec<u8>| Path::new(OsStr::from_bytes(b)).to_path_buf();
        match it {
            Item::Dir(path, mode) => {
                h.set_entry_type(EntryType::Directory);
                h.set_mode(*mode);
                h.set_size(0);
                b.append_data(&mut h, p(path), std::io::empty()).unwrap();
            }
            Item::File(path, mode, content) => {
                h.set_entry_type(EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(content.len() as u64);
                b.append_data(&mut h, p(path), &content[..]).unwrap();
            }
            Item::Link(path, target) => {
                h.set_entry_type(EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, p(path), p(target)).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

/// Deterministic pseudo-random bytes (xorshift), distinct per seed.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A workspace of `n` files of `size` bytes each (in 10 directories), content from `seed`.
pub fn workspace(n: usize, size: usize, seed: u64) -> Vec<Item> {
    let mut items = vec![dir("workspace/")];
    for d in 0..10 {
        items.push(dir(&format!("workspace/d{d}/")));
        for f in (0..n).filter(|f| f % 10 == d) {
            items.push(file(
                &format!("workspace/d{d}/f{f}.bin"),
                &noise(seed * 1_000_003 + f as u64, size),
            ));
        }
    }
    items
}

/// A fresh directory on the target's disk.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("snapstore")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

pub fn snap(owner: Option<&str>) -> NewSnapshot {
    NewSnapshot {
        owner: owner.map(str::to_string),
        session: "sb-test".into(),
        attributes: serde_json::json!({"isolation": "namespaces", "image": "host"}),
        full: None,
    }
}

pub fn tar_of(store: &Store, id: &str) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut store.tar(id).unwrap(), &mut out).unwrap();
    out
}

/// Names in `<store>/<sub>`, sorted.
pub fn names(store_dir: &Path, sub: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(store_dir.join(sub))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Everything the store holds besides its (empty) subdirectories.
pub fn assert_empty(store_dir: &Path) {
    for sub in ["records", "packs", "full", "staging", "tmp"] {
        assert_eq!(
            names(store_dir, sub),
            Vec::<String>::new(),
            "{sub}/ of {}",
            store_dir.display()
        );
    }
}

pub fn store_dir(t: &tempfile::TempDir) -> PathBuf {
    t.path().join("store")
}
