//! Image records: names bound to manifest digests, kept in the store so they outlive the
//! process.
//!
//! The records are one JSON file, `<root>/images.json` (`{"version":1,"images":{name:
//! digest}}`), rewritten whole (temporary file, fsync, rename) with the store lock held, so a
//! reader sees the old or the new file, never half of one. A record holds only the name and
//! the manifest digest: everything else an [`Image`] says is read from the manifest and
//! config blobs, which are in the store as long as a record names them
//! ([`Store::prune_images`] keeps them).
//!
//! Names are taken as the caller gives them (canonical, e.g.
//! `docker.io/library/busybox:latest`), checked only for the syntax of an image reference.
//! An image imported without any name is recorded under its manifest digest,
//! `sha256:<hex>`.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io::{self, Read, Write};

use airlock_spec::ImageConfig;
use serde::{Deserialize, Serialize};

use crate::error::io_err;
use crate::manifest::{Config, MAX_DOCUMENT_BYTES, Manifest};
use crate::{Digest, Error, PruneReport, Store};

/// The shortest digest prefix (hex digits) [`Store::image`] accepts, as `docker` does.
pub const MIN_DIGEST_PREFIX: usize = 12;

/// The longest image name accepted (the Docker reference grammar's limit on the name).
const MAX_NAME_LEN: usize = 255;

/// An image the store holds: a record's name, and what its manifest and config say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The name it was recorded under (or its manifest digest, when it has none).
    pub name: String,
    /// The digest of its manifest blob.
    pub manifest_digest: Digest,
    /// The digest of its config blob.
    pub config_digest: Digest,
    /// Its layers' blob digests, lowest first.
    pub layers: Vec<Digest>,
    /// What its config says about running it.
    pub config: ImageConfig,
    /// The sum of its layers' blob sizes (compressed, as stored).
    pub size: u64,
    /// When it was created, as its config says (RFC 3339).
    pub created: Option<String>,
}

impl Image {
    /// Every blob and layer digest the image needs: manifest, config and layers.
    pub fn digests(&self) -> impl Iterator<Item = &Digest> {
        [&self.manifest_digest, &self.config_digest]
            .into_iter()
            .chain(&self.layers)
    }
}

/// The records file's format version (written; a newer one is refused, not overwritten).
const RECORDS_VERSION: u32 = 1;

/// The records file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Records {
    version: u32,
    /// Name → manifest digest (as a string; checked when read).
    images: BTreeMap<String, String>,
}

/// Checks that `name` can name an image: a Docker-style reference
/// (`[host[:port]/]path[:tag][@sha256:<hex>]`, path components lowercase) or a bare
/// manifest digest `sha256:<hex>`.
pub fn validate_name(name: &str) -> Result<(), Error> {
    let bad = |reason| Error::InvalidName {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(bad("longer than 255 characters"));
    }
    if name.starts_with("sha256:") {
        return name
            .parse::<Digest>()
            .map(|_| ())
            .map_err(|_| bad("not a sha256 digest"));
    }
    let (rest, digest) = match name.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (name, None),
    };
    if let Some(d) = digest {
        d.parse::<Digest>()
            .map_err(|_| bad("the part after `@` is not a sha256 digest"))?;
    }
    let (path, tag) = match rest.rfind(':') {
        Some(i) if !rest[i..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
        _ => (rest, None),
    };
    if let Some(tag) = tag {
        let ok = tag.len() <= 128
            && tag
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            && tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-');
        if !ok {
            return Err(bad("the tag is not [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"));
        }
    }
    let comps: Vec<&str> = path.split('/').collect();
    for (i, c) in comps.iter().enumerate() {
        if c.is_empty() {
            return Err(bad("an empty path component"));
        }
        let host = i == 0 && comps.len() > 1 && (c.contains('.') || c.contains(':') || *c == "localhost");
        if host {
            let (h, port) = match c.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (*c, None),
            };
            let ok_host = h.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && h.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
                && !h.contains("..")
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
            let ok_port = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
            if !ok_host || !ok_port {
                return Err(bad("the registry host is not host[:port]"));
            }
            continue;
        }
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let bytes = c.as_bytes();
        let ok = alnum(bytes[0])
            && alnum(bytes[bytes.len() - 1])
            && bytes
                .iter()
                .all(|&b| alnum(b) || b == b'.' || b == b'_' || b == b'-')
            && !c.contains("..")
            && !c.contains("___");
        if !ok {
            return Err(bad(
                "a path component is not lowercase letters and digits separated by `.`, `_`, `__` or `-`",
            ));
        }
    }
    Ok(())
}

impl Store {
    fn records_path(&self) -> std::path::PathBuf {
        self.root().join("images.json")
    }

    /// Reads the records (none when the file does not exist yet).
    fn read_records(&self) -> Result<Records, Error> {
        let p = self.records_path();
        let bytes = match fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Records::default()),
            Err(e) => return Err(io_err("read image records", &p)(e)),
        };
        let records: Records = serde_json::from_slice(&bytes).map_err(|e| Error::InvalidDocument {
            what: p.display().to_string(),
            reason: e.to_string(),
        })?;
        if records.version > RECORDS_VERSION {
            return Err(Error::InvalidDocument {
                what: p.display().to_string(),
                reason: format!(
                    "version {} is newer than this airlock's {RECORDS_VERSION}",
                    records.version
                ),
            });
        }
        Ok(records)
    }

    /// With the store lock held: replaces the records file.
    fn write_records(&self, records: &Records) -> Result<(), Error> {
        let tmp_dir = self.root().join("tmp");
        let mut tmp = tempfile::Builder::new()
            .prefix("images-")
            .tempfile_in(&tmp_dir)
            .map_err(io_err("create temporary file", &tmp_dir))?;
        let json = serde_json::to_vec_pretty(records)
            .map_err(|e| io_err("encode image records", tmp.path())(e.into()))?;
        tmp.write_all(&json)
            .map_err(io_err("write image records", tmp.path()))?;
        tmp.as_file()
            .sync_all()
            .map_err(io_err("sync image records", tmp.path()))?;
        let dest = self.records_path();
        tmp.persist(&dest).map_err(|e| Error::Io {
            op: "store image records",
            path: dest,
            source: e.error,
        })?;
        Ok(())
    }

    /// Reads a stored JSON blob of at most [`MAX_DOCUMENT_BYTES`].
    pub(crate) fn read_document(&self, digest: &Digest) -> Result<Vec<u8>, Error> {
        let f = self.open_blob(digest)?;
        let mut bytes = Vec::new();
        f.take(MAX_DOCUMENT_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io_err("read blob", self.blob_path(digest)))?;
        Ok(bytes)
    }

    /// Reads the image whose manifest is `manifest_digest` from its stored blobs. With
    /// `check_layers`, also requires every layer blob stored and unpacked.
    fn load_image(&self, name: &str, manifest_digest: &Digest, check_layers: bool) -> Result<Image, Error> {
        let incomplete = |missing: String| Error::ImageIncomplete {
            manifest: manifest_digest.clone(),
            missing,
        };
        if !self.has_blob(manifest_digest) {
            return Err(incomplete("the manifest blob is not in the store".into()));
        }
        let what = format!("manifest {manifest_digest}");
        let manifest = Manifest::parse(&what, &self.read_document(manifest_digest)?)?;
        let config_digest = manifest.config.digest.clone();
        if !self.has_blob(&config_digest) {
            return Err(incomplete(format!(
                "config blob {config_digest} is not in the store"
            )));
        }
        let what = format!("config {config_digest}");
        let config = Config::parse(&what, &self.read_document(&config_digest)?)?;
        let n = manifest.layers.len();
        if check_layers {
            for (i, l) in manifest.layers.iter().enumerate() {
                if !self.has_blob(&l.digest) {
                    return Err(incomplete(format!(
                        "layer {} of {n} ({}) is not in the store",
                        i + 1,
                        l.digest
                    )));
                }
                if !self.has_layer(&l.digest) {
                    return Err(incomplete(format!(
                        "layer {} of {n} ({}) is not unpacked",
                        i + 1,
                        l.digest
                    )));
                }
            }
        }
        Ok(Image {
            name: name.to_owned(),
            manifest_digest: manifest_digest.clone(),
            config_digest,
            layers: manifest.layers.iter().map(|l| l.digest.clone()).collect(),
            config: config.image_config(&what)?,
            size: manifest.layers_size(),
            created: config.created,
        })
    }

    /// Records `name` → the image whose manifest blob is `manifest_digest`, replacing what
    /// `name` named before. The manifest and config blobs must be stored and every layer
    /// stored and unpacked; the error names the first part missing.
    ///
    /// A name is recorded in its canonical form ([`crate::canonical_reference`]:
    /// `busybox:1` is `docker.io/library/busybox:1`), so every spelling of it finds it
    /// ([`resolve`]); a bare manifest digest is recorded as it is.
    pub fn tag(&self, name: &str, manifest_digest: &Digest) -> Result<Image, Error> {
        validate_name(name)?;
        let canonical = canonical_name(name)?;
        let name = canonical.as_str();
        let _lock = self.store_lock()?;
        let image = self.load_image(name, manifest_digest, true)?;
        let mut records = self.read_records()?;
        records.version = RECORDS_VERSION;
        records
            .images
            .insert(name.to_owned(), manifest_digest.to_string());
        self.write_records(&records)?;
        Ok(image)
    }

    /// Every recorded image, by name. A record whose blobs are gone (removed by hand) is
    /// skipped.
    pub fn images(&self) -> Result<Vec<Image>, Error> {
        let records = {
            let _lock = self.store_lock()?;
            self.read_records()?
        };
        let mut out = Vec::new();
        for (name, digest) in &records.images {
            let Ok(d) = digest.parse::<Digest>() else { continue };
            match self.load_image(name, &d, false) {
                Ok(image) => out.push(image),
                Err(Error::ImageIncomplete { .. } | Error::BlobMissing(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The image named `name_or_digest`: a recorded name, a manifest digest
    /// (`sha256:<hex>`), or a unique prefix of at least [`MIN_DIGEST_PREFIX`] hex digits
    /// of one (with or without `sha256:`).
    pub fn image(&self, name_or_digest: &str) -> Result<Image, Error> {
        let records = {
            let _lock = self.store_lock()?;
            self.read_records()?
        };
        if let Some(d) = records.images.get(name_or_digest) {
            let d: Digest = d.parse()?;
            return self.load_image(name_or_digest, &d, false);
        }
        let hex = name_or_digest.strip_prefix("sha256:").unwrap_or(name_or_digest);
        let is_hex = hex.len() >= MIN_DIGEST_PREFIX
            && hex.len() <= 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if is_hex {
            let mut matches: Vec<(&String, &String)> = records
                .images
                .iter()
                .filter(|(_, d)| d.strip_prefix("sha256:").is_some_and(|h| h.starts_with(hex)))
                .collect();
            // Several names for one manifest are one image.
            let distinct: HashSet<&String> = matches.iter().map(|(_, d)| *d).collect();
            if distinct.len() > 1 {
                return Err(Error::AmbiguousImage {
                    prefix: name_or_digest.to_owned(),
                    matches: distinct.len(),
                });
            }
            if let Some((name, d)) = matches.drain(..).next() {
                return self.load_image(name, &d.parse()?, false);
            }
        }
        Err(Error::ImageNotFound(name_or_digest.to_owned()))
    }

    /// Removes the record `name`; the image's blobs stay until pruned. Returns the
    /// manifest digest it named.
    pub fn untag(&self, name: &str) -> Result<Digest, Error> {
        let _lock = self.store_lock()?;
        let mut records = self.read_records()?;
        let d = records
            .images
            .remove(name)
            .or_else(|| {
                let canonical = canonical_name(name).ok()?;
                records.images.remove(&canonical)
            })
            .ok_or_else(|| Error::ImageNotFound(name.to_owned()))?;
        self.write_records(&records)?;
        d.parse()
    }

    /// The digests every recorded image needs, and their manifest digests (for roots).
    fn referenced(&self) -> Result<(HashSet<Digest>, HashSet<Digest>), Error> {
        let mut keep = HashSet::new();
        let mut manifests = HashSet::new();
        for image in self.images()? {
            keep.extend(image.digests().cloned());
            manifests.insert(image.manifest_digest);
        }
        // A record whose config is gone still protects its manifest.
        let records = {
            let _lock = self.store_lock()?;
            self.read_records()?
        };
        for d in records.images.values().filter_map(|d| d.parse::<Digest>().ok()) {
            keep.insert(d.clone());
            manifests.insert(d);
        }
        Ok((keep, manifests))
    }

    /// Removes every blob, unpacked layer and prepared root that no image record needs
    /// (and work in progress a crashed process left), as [`Store::prune`] does.
    ///
    /// A blob stored by a pull or import that has not recorded its image yet is not
    /// needed by any record, so pruning meanwhile removes it and that `tag` then fails
    /// naming the missing part.
    pub fn prune_images(&self) -> Result<PruneReport, Error> {
        let (keep, manifests) = self.referenced()?;
        let mut report = self.prune(&keep)?;
        for d in self.roots()? {
            if !manifests.contains(&d) {
                report.freed_bytes += self.remove_root(&d)?;
            }
        }
        Ok(report)
    }

    /// Removes the record `name` (or the one record [`Store::image`] finds for a digest or
    /// prefix; other names of the same manifest stay), then the blobs, layers and root of
    /// its image that no remaining record needs. Returns the bytes freed.
    pub fn remove_image(&self, name: &str) -> Result<u64, Error> {
        let image = resolve(self, name)?;
        let name = image.name.clone();
        self.untag(&name)?;
        let (keep, manifests) = self.referenced()?;
        let mut freed = 0;
        for d in image.digests() {
            if !keep.contains(d) {
                freed += self.remove(d)?;
            }
        }
        if !manifests.contains(&image.manifest_digest) {
            freed += self.remove_root(&image.manifest_digest)?;
        }
        Ok(freed)
    }
}

/// `name` as records keep it: a bare manifest digest as it is, a reference canonical.
fn canonical_name(name: &str) -> Result<String, Error> {
    if name.starts_with("sha256:") {
        return Ok(name.to_owned());
    }
    crate::canonical_reference(name)
}

/// The image `reference` names in `store`: a recorded name as written or in any spelling
/// of it (`python:3.12-slim` finds `docker.io/library/python:3.12-slim`), a manifest
/// digest, or a unique prefix of one ([`Store::image`]). An unknown one is
/// [`Error::ImageNotFound`].
pub fn resolve(store: &Store, reference: &str) -> Result<Image, Error> {
    match store.image(reference) {
        Err(Error::ImageNotFound(_)) => {}
        found => return found,
    }
    match canonical_name(reference) {
        Ok(canonical) if canonical != reference => match store.image(&canonical) {
            Err(Error::ImageNotFound(_)) => Err(Error::ImageNotFound(reference.to_owned())),
            found => found,
        },
        _ => Err(Error::ImageNotFound(reference.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_reference_grammar() {
        for ok in [
            "busybox",
            "busybox:latest",
            "docker.io/library/busybox:1.36",
            "localhost:5000/a/b_c__d-e:v1.2-rc",
            "ghcr.io/org/img@sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        ] {
            validate_name(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        for bad in [
            "",
            "Busybox",
            "../etc",
            "a//b",
            "a/b:",
            "a:b/c",
            "a:-x",
            "/abs",
            "a..b",
            "sha256:abc",
            "x@sha256:nothex",
            "a b",
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }
}
