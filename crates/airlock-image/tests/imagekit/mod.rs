//! Image archives built in the test: `docker save` archives (old and Docker 25 style), OCI
//! image layouts as directories and tars, and a snapshot of what a store holds.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use airlock_image::Digest;
use serde_json::{Value, json};

/// A config blob with `Env`, `Cmd` and `WorkingDir`.
pub fn config(env: &[&str], cmd: &[&str], layers: usize) -> Vec<u8> {
    let diff_ids: Vec<String> = (0..layers).map(|i| Digest::of(&[i as u8]).to_string()).collect();
    serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "created": "2024-05-06T07:08:09Z",
        "config": {"Env": env, "Cmd": cmd, "WorkingDir": "/app", "User": "nobody"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap()
}

/// Appends a regular member to a tar being built.
pub fn member(b: &mut tar::Builder<Vec<u8>>, path: &str, bytes: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(bytes.len() as u64);
    b.append_data(&mut h, path, bytes).unwrap();
}

/// Appends a member whose name is written as given (bypassing `tar::Builder`'s checks).
pub fn raw_member(b: &mut tar::Builder<Vec<u8>>, path: &str, bytes: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(bytes.len() as u64);
    h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
    h.set_cksum();
    b.append(&h, bytes).unwrap();
}

pub fn symlink_member(b: &mut tar::Builder<Vec<u8>>, path: &str, target: &str) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_mode(0o777);
    h.set_size(0);
    b.append_link(&mut h, path, target).unwrap();
}

/// One image of a `docker save` archive.
pub struct SaveImage {
    pub config: Vec<u8>,
    pub layers: Vec<Vec<u8>>,
    pub tags: Vec<String>,
}

/// A `docker save` archive. `blobs_style`: members under `blobs/sha256/<hex>` (Docker 25);
/// otherwise `<id>.json` and `<id>/layer.tar`, a layer seen twice symlinked to its first
/// copy (older Docker).
pub fn docker_save(images: &[SaveImage], blobs_style: bool) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut manifest = Vec::new();
    let mut seen = BTreeMap::new();
    for img in images {
        let cd = Digest::of(&img.config);
        let config = if blobs_style {
            format!("blobs/sha256/{}", cd.hex())
        } else {
            format!("{}.json", cd.hex())
        };
        if !seen.contains_key(&config) {
            member(&mut b, &config, &img.config);
            seen.insert(config.clone(), ());
        }
        let mut layers = Vec::new();
        for (i, l) in img.layers.iter().enumerate() {
            let d = Digest::of(l);
            let path = if blobs_style {
                format!("blobs/sha256/{}", d.hex())
            } else {
                format!("{}{i}/layer.tar", &d.hex()[..16])
            };
            let first = format!("{}/layer.tar", d.hex());
            if blobs_style {
                if !seen.contains_key(&path) {
                    member(&mut b, &path, l);
                    seen.insert(path.clone(), ());
                }
            } else if let std::collections::btree_map::Entry::Vacant(e) = seen.entry(first.clone()) {
                member(&mut b, &first, l);
                e.insert(());
                symlink_member(&mut b, &path, &format!("../{first}"));
            } else {
                symlink_member(&mut b, &path, &format!("../{first}"));
            }
            layers.push(path);
        }
        manifest.push(json!({"Config": config, "RepoTags": img.tags, "Layers": layers}));
    }
    member(&mut b, "manifest.json", &serde_json::to_vec(&manifest).unwrap());
    b.into_inner().unwrap()
}

/// A descriptor as JSON.
pub fn desc(media_type: &str, bytes: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": Digest::of(bytes).to_string(), "size": bytes.len()})
}

/// An OCI image layout being built: blobs, then `index.json` entries.
#[derive(Default)]
pub struct Oci {
    pub blobs: BTreeMap<String, Vec<u8>>,
    pub index: Vec<Value>,
}

pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";

impl Oci {
    pub fn blob(&mut self, bytes: &[u8]) -> Digest {
        let d = Digest::of(bytes);
        self.blobs.insert(d.hex().to_owned(), bytes.to_vec());
        d
    }

    /// Adds an image's config, layers (gzip or plain tar) and manifest; returns the manifest bytes.
    pub fn image(&mut self, config: &[u8], layers: &[Vec<u8>]) -> Vec<u8> {
        self.blob(config);
        let mut descs = Vec::new();
        for l in layers {
            self.blob(l);
            let media_type = if l.starts_with(&[0x1f, 0x8b]) {
                LAYER_GZIP
            } else {
                LAYER_TAR
            };
            descs.push(desc(media_type, l));
        }
        let m = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": desc("application/vnd.oci.image.config.v1+json", config),
            "layers": descs,
        }))
        .unwrap();
        self.blob(&m);
        m
    }

    /// An index blob over `(manifest, os/arch)` entries; returns its bytes.
    pub fn index_blob(&mut self, entries: &[(&[u8], &str, &str)]) -> Vec<u8> {
        let manifests: Vec<Value> = entries
            .iter()
            .map(|(m, os, arch)| {
                let mut d = desc(MANIFEST, m);
                d["platform"] = json!({"os": os, "architecture": arch});
                d
            })
            .collect();
        let i = serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}))
            .unwrap();
        self.blob(&i);
        i
    }

    /// An `index.json` entry for `bytes` of `media_type`, named `name` if given.
    pub fn entry(&mut self, media_type: &str, bytes: &[u8], name: Option<&str>) {
        let mut d = desc(media_type, bytes);
        if let Some(n) = name {
            d["annotations"] = json!({"org.opencontainers.image.ref.name": n});
        }
        self.index.push(d);
    }

    fn index_json(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": self.index})).unwrap()
    }

    pub fn write_dir(&self, dir: &Path) {
        fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        fs::write(dir.join("index.json"), self.index_json()).unwrap();
        for (hex, bytes) in &self.blobs {
            fs::write(dir.join("blobs/sha256").join(hex), bytes).unwrap();
        }
    }

    pub fn tar(&self) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        member(&mut b, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
        member(&mut b, "index.json", &self.index_json());
        for (hex, bytes) in &self.blobs {
            member(&mut b, &format!("blobs/sha256/{hex}"), bytes);
        }
        b.into_inner().unwrap()
    }
}

/// What a store holds: its blobs, layers, roots, work in progress and records, to compare
/// before and after a failed operation.
pub fn snapshot(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for dir in ["blobs/sha256", "layers/sha256", "roots/sha256", "tmp"] {
        for e in fs::read_dir(root.join(dir)).unwrap() {
            out.push(format!("{dir}/{}", e.unwrap().file_name().to_string_lossy()));
        }
    }
    if let Ok(records) = fs::read_to_string(root.join("images.json")) {
        out.push(records);
    }
    out.sort();
    out
}
