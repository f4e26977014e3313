//! Importing images from files: a `docker save` archive, an OCI image layout directory, or
//! an OCI image layout packed in a tar archive ([`Store::import`]).
//!
//! - `docker save`: `manifest.json` lists each image's `Config`, `Layers` (member paths:
//!   `<id>/layer.tar` in older Docker, `blobs/sha256/<hex>` in Docker 25 and later) and
//!   `RepoTags`. The archive has no registry manifest, so one is made: an OCI manifest
//!   whose config descriptor and layer descriptors (media type
//!   `application/vnd.oci.image.layer.v1.tar`, `+gzip` or `+zstd` as the layer's first
//!   bytes say) carry the digests computed while reading, stored as a blob like any other.
//!   Every image record thus has a manifest blob. A member stored as `blobs/sha256/<hex>`
//!   must hash to that `<hex>`. When an archive holds both `manifest.json` and
//!   `index.json` (Docker 25), `manifest.json` is read: its `RepoTags` are full names.
//! - OCI layout (directory or tar): `oci-layout`, `index.json`, `blobs/sha256/<hex>`. The
//!   entries of `index.json` are grouped by their `org.opencontainers.image.ref.name`
//!   annotation; a group of one entry without a platform is that image, otherwise (and
//!   for a nested index) the entry for this host's platform (`linux/amd64` on x86-64) is
//!   chosen, and an error lists the platforms when there is none.
//!
//! Every blob is verified against its digest (and size) as it is stored; an archive's
//! member paths are checked (no absolute path, no `..`) and a layout's files are opened
//! without following symlinks. Names: `RepoTags` or the `ref.name` annotation, unless the
//! caller passes `name` (then the archive must hold exactly one image); an image with
//! neither is recorded under its manifest digest, `sha256:<hex>`. Every name is checked
//! before anything is stored.
//!
//! An import that fails removes the blobs and layers it stored and records nothing.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, Mode, OFlags, ResolveFlags};
use serde::Deserialize;

use crate::catalog::{Image, validate_name};
use crate::digest::Hasher;
use crate::manifest::{
    ANNOTATION_REF_NAME, Descriptor, Index, MAX_DOCUMENT_BYTES, MEDIA_OCI_CONFIG, MEDIA_OCI_LAYER,
    MEDIA_OCI_LAYER_GZIP, MEDIA_OCI_LAYER_ZSTD, MEDIA_OCI_MANIFEST, Manifest, Platform, is_index_media_type,
};
use crate::unpack::Compression;
use crate::{BlobStatus, Digest, Error, LayerStatus, Store};

/// Most images one archive may hold, and most entries in an index: a bound on the work a
/// hostile `manifest.json` or `index.json` can ask for.
const MAX_IMAGES: usize = 1024;

/// Most members a tar archive may have: a bound on the memory its member table takes.
/// A `docker save` archive has a few per layer, an OCI layout one per blob.
const MAX_ARCHIVE_MEMBERS: usize = 100_000;

/// How deep indexes may nest (an index pointing to an index…).
const MAX_INDEX_DEPTH: usize = 4;

/// Most symlinks followed to find one archive member (old `docker save` links a layer
/// seen twice to its first copy).
const MAX_MEMBER_LINKS: usize = 8;

/// The platform images are chosen for: this host's.
fn host_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    ("linux", arch)
}

/// Normalises an archive member path (`./a//b` → `a/b`), refusing absolute paths and `..`.
fn member_name(raw: &str) -> Option<String> {
    if raw.starts_with('/') {
        return None;
    }
    let mut out = Vec::new();
    for c in raw.split('/') {
        match c {
            "" | "." => {}
            ".." => return None,
            c => out.push(c),
        }
    }
    (!out.is_empty()).then(|| out.join("/"))
}

/// The member a symlink in directory `parent` pointing at `target` names: `..` steps up
/// within the archive; an absolute target or one that leaves the archive names nothing.
fn link_target(parent: &str, target: &str) -> Option<String> {
    if target.starts_with('/') {
        return None;
    }
    let mut out: Vec<&str> = parent.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(c),
        }
    }
    (!out.is_empty()).then(|| out.join("/"))
}

/// Where an image's files come from.
trait Source {
    /// The member's size, `None` when it is not there.
    fn size(&self, member: &str) -> io::Result<Option<u64>>;
    /// Opens the member (which exists) for reading.
    fn open(&self, member: &str) -> io::Result<Box<dyn Read + '_>>;
}

/// An OCI layout directory: files opened beneath it, through no symlink.
struct DirSource {
    /// The layout directory, open for the import's lifetime.
    dir: std::os::fd::OwnedFd,
}

impl DirSource {
    /// Opens a regular file beneath the layout, through no symlink. `O_NONBLOCK` so that a
    /// FIFO planted in the layout cannot stall the open; anything but a regular file is
    /// refused.
    fn open_file(&self, member: &str) -> io::Result<Option<File>> {
        let f = match rfs::openat2(
            &self.dir,
            member,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => File::from(fd),
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if !f.metadata()?.is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file"));
        }
        Ok(Some(f))
    }
}

impl Source for DirSource {
    fn size(&self, member: &str) -> io::Result<Option<u64>> {
        match self.open_file(member)? {
            None => Ok(None),
            Some(f) => Ok(Some(f.metadata()?.len())),
        }
    }

    fn open(&self, member: &str) -> io::Result<Box<dyn Read + '_>> {
        let f = self.open_file(member)?.ok_or(io::ErrorKind::NotFound)?;
        Ok(Box::new(f))
    }
}

/// A member of a tar archive.
enum Member {
    /// A regular file: where its bytes start, and how many.
    File { offset: u64, size: u64 },
    /// A symlink, with its target resolved to a member path (or `None` if it escapes).
    Link(Option<String>),
}

/// A tar archive, scanned once for where each member's bytes are.
struct TarSource {
    path: PathBuf,
    members: HashMap<String, Member>,
}

impl TarSource {
    fn scan(path: &Path) -> Result<Self, Error> {
        let bad = |reason: String| Error::Import {
            path: path.to_path_buf(),
            reason,
        };
        let file = File::open(path).map_err(crate::error::io_err("open archive", path))?;
        let len = file
            .metadata()
            .map_err(crate::error::io_err("stat archive", path))?
            .len();
        let mut ar = tar::Archive::new(io::BufReader::new(file));
        let mut members = HashMap::new();
        let entries = ar
            .entries()
            .map_err(|e| bad(format!("not a readable tar archive: {e}")))?;
        // Where the last member's data (padded to a block) ends: the end-of-archive
        // marker must follow. The tar reader takes a missing one for the end, so an archive
        // cut between members would otherwise look whole.
        let mut end = 0u64;
        for (i, entry) in entries.enumerate() {
            let entry = entry.map_err(|e| bad(format!("truncated or corrupt tar archive: {e}")))?;
            if i >= MAX_ARCHIVE_MEMBERS {
                return Err(bad(format!("more than {MAX_ARCHIVE_MEMBERS} members")));
            }
            end = entry
                .raw_file_position()
                .saturating_add(entry.size().div_ceil(512).saturating_mul(512));
            let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            // Members with unsafe names are never looked up; skip them.
            let Some(name) = member_name(&raw) else { continue };
            match entry.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let offset = entry.raw_file_position();
                    let size = entry.size();
                    if offset.saturating_add(size) > len {
                        return Err(bad(format!(
                            "truncated tar archive: member {name:?} ends past the end of the file"
                        )));
                    }
                    members.insert(name, Member::File { offset, size });
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name_bytes()
                        .map(|t| String::from_utf8_lossy(&t).into_owned())
                        .unwrap_or_default();
                    let parent = name.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
                    members.insert(name.clone(), Member::Link(link_target(parent, &target)));
                }
                _ => {}
            }
        }
        drop(ar);
        let mut f = File::open(path).map_err(crate::error::io_err("open archive", path))?;
        let mut marker = [0u8; 512];
        let whole = f.seek(SeekFrom::Start(end)).is_ok()
            && f.read_exact(&mut marker).is_ok()
            && marker.iter().all(|b| *b == 0);
        if !whole {
            return Err(bad(
                "truncated tar archive: no end-of-archive marker after the last member".into(),
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
            members,
        })
    }

    /// The regular file `member` is, following symlinks within the archive.
    fn resolve(&self, member: &str) -> Option<(u64, u64)> {
        let mut name = member.to_owned();
        for _ in 0..=MAX_MEMBER_LINKS {
            match self.members.get(&name)? {
                Member::File { offset, size } => return Some((*offset, *size)),
                Member::Link(Some(target)) => name = target.clone(),
                Member::Link(None) => return None,
            }
        }
        None
    }
}

impl Source for TarSource {
    fn size(&self, member: &str) -> io::Result<Option<u64>> {
        Ok(self.resolve(member).map(|(_, size)| size))
    }

    fn open(&self, member: &str) -> io::Result<Box<dyn Read + '_>> {
        let (offset, size) = self.resolve(member).ok_or(io::ErrorKind::NotFound)?;
        let mut f = File::open(&self.path)?;
        f.seek(SeekFrom::Start(offset))?;
        Ok(Box::new(io::BufReader::new(f).take(size)))
    }
}

/// One entry of `docker save`'s `manifest.json`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SaveEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// What an import stored, removed again unless the import completes.
struct Added<'a> {
    store: &'a Store,
    digests: Vec<Digest>,
    done: bool,
}

impl Drop for Added<'_> {
    fn drop(&mut self) {
        if !self.done {
            for d in &self.digests {
                // Best effort: the error being returned matters more than this one.
                let _ = self.store.remove(d);
            }
        }
    }
}

/// An image ready to be recorded: its names and its manifest blob.
struct Planned {
    names: Vec<String>,
    manifest: Digest,
}

impl Store {
    /// Imports the images in `path`: a `docker save` archive, an OCI image layout
    /// directory, or an OCI image layout in a tar archive (see the module's
    /// documentation). Stores and unpacks their blobs, records each under its names
    /// (`name`, when given, replaces the archive's), and returns one [`Image`] per record.
    pub fn import(&self, path: &Path, name: Option<&str>) -> Result<Vec<Image>, Error> {
        if let Some(n) = name {
            validate_name(n)?;
        }
        let md = std::fs::metadata(path).map_err(crate::error::io_err("import", path))?;
        let source: Box<dyn Source> = if md.is_dir() {
            let fd = rfs::open(
                path,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| crate::error::io_err("open layout directory", path)(e.into()))?;
            Box::new(DirSource { dir: fd })
        } else {
            Box::new(TarSource::scan(path)?)
        };
        let mut import = Importer {
            store: self,
            path,
            source: &*source,
            added: Added {
                store: self,
                digests: Vec::new(),
                done: false,
            },
        };
        let has = |m: &str| {
            source
                .size(m)
                .map(|s| s.is_some())
                .map_err(import.io("cannot read", m))
        };
        let (docker, oci) = (has("manifest.json")?, has("index.json")?);
        let planned = if docker {
            import.docker(name)?
        } else if oci {
            import.oci(name)?
        } else {
            return Err(import.bad(
                "neither a docker save archive (manifest.json) nor an OCI image layout (index.json)".into(),
            ));
        };
        let mut images: Vec<Image> = Vec::new();
        for p in &planned {
            for n in &p.names {
                match self.tag(n, &p.manifest) {
                    Ok(image) => images.push(image),
                    Err(e) => {
                        // Records made so far would name blobs about to be removed.
                        for done in &images {
                            let _ = self.untag(&done.name);
                        }
                        return Err(e);
                    }
                }
            }
        }
        import.added.done = true;
        Ok(images)
    }
}

/// One import in progress.
struct Importer<'a> {
    store: &'a Store,
    path: &'a Path,
    source: &'a dyn Source,
    added: Added<'a>,
}

impl Importer<'_> {
    fn bad(&self, reason: String) -> Error {
        Error::Import {
            path: self.path.to_path_buf(),
            reason,
        }
    }

    fn io(&self, what: &'static str, member: &str) -> impl FnOnce(io::Error) -> Error {
        let path = self.path.to_path_buf();
        let member = member.to_owned();
        move |e| Error::Import {
            path,
            reason: format!("{what} {member:?}: {e}"),
        }
    }

    /// A small member's bytes (at most [`MAX_DOCUMENT_BYTES`]).
    fn read_small(&self, member: &str) -> Result<Vec<u8>, Error> {
        let size = self
            .source
            .size(member)
            .map_err(self.io("cannot read", member))?
            .ok_or_else(|| self.bad(format!("{member:?} is not in the archive")))?;
        if size > MAX_DOCUMENT_BYTES {
            return Err(self.bad(format!(
                "{member:?} is {size} bytes, more than the {MAX_DOCUMENT_BYTES}-byte limit"
            )));
        }
        let mut bytes = Vec::new();
        self.source
            .open(member)
            .and_then(|r| r.take(MAX_DOCUMENT_BYTES).read_to_end(&mut bytes))
            .map_err(self.io("cannot read", member))?;
        Ok(bytes)
    }

    /// The digest and size of a member, hashed now.
    fn hash_member(&self, member: &str) -> Result<(Digest, u64, Compression), Error> {
        let mut r = self.source.open(member).map_err(self.io("cannot read", member))?;
        let mut hasher = Hasher::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut head = Vec::new();
        let mut total = 0u64;
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io("cannot read", member)(e)),
            };
            if head.len() < 4 {
                head.extend_from_slice(&buf[..n.min(4)]);
            }
            hasher.update(&buf[..n]);
            total += n as u64;
        }
        Ok((hasher.finish(), total, Compression::sniff(&head)))
    }

    /// Stores the member as the blob `digest` (verified by the store).
    fn store_member(&mut self, member: &str, digest: &Digest, size: u64) -> Result<(), Error> {
        let source = self.source;
        let status = self
            .store
            .ensure_blob(digest, Some(size), || source.open(member))?;
        if let BlobStatus::Stored(_) = status {
            self.added.digests.push(digest.clone());
        }
        Ok(())
    }

    fn store_bytes(&mut self, bytes: &[u8]) -> Result<Digest, Error> {
        let d = Digest::of(bytes);
        let status = self
            .store
            .ensure_blob(&d, Some(bytes.len() as u64), || Ok(bytes))?;
        if let BlobStatus::Stored(_) = status {
            self.added.digests.push(d.clone());
        }
        Ok(d)
    }

    fn unpack(&mut self, layer: &Descriptor) -> Result<(), Error> {
        let status = self.store.unpack_layer(&layer.digest, Some(&layer.media_type))?;
        if matches!(status, LayerStatus::Unpacked(_)) && !self.added.digests.contains(&layer.digest) {
            self.added.digests.push(layer.digest.clone());
        }
        Ok(())
    }

    /// The names for images found, checked: `name` if given, else the archive's.
    fn names(
        &self,
        name: Option<&str>,
        found: Vec<String>,
        count: usize,
    ) -> Result<Option<Vec<String>>, Error> {
        if let Some(n) = name {
            if count != 1 {
                return Err(self.bad(format!(
                    "holds {count} images; a name can only be given for an archive of one"
                )));
            }
            return Ok(Some(vec![n.to_owned()]));
        }
        for n in &found {
            validate_name(n)?;
        }
        Ok((!found.is_empty()).then_some(found))
    }

    fn docker(&mut self, name: Option<&str>) -> Result<Vec<Planned>, Error> {
        let bytes = self.read_small("manifest.json")?;
        let entries: Vec<SaveEntry> =
            serde_json::from_slice(&bytes).map_err(|e| self.bad(format!("manifest.json: {e}")))?;
        if entries.is_empty() || entries.len() > MAX_IMAGES {
            return Err(self.bad(format!(
                "manifest.json lists {} images (1 to {MAX_IMAGES} expected)",
                entries.len()
            )));
        }
        // Check every path and name before storing anything.
        let safe = |p: &str| {
            member_name(p).ok_or_else(|| self.bad(format!("manifest.json names an unsafe path {p:?}")))
        };
        let mut checked = Vec::new();
        for e in &entries {
            let config = safe(&e.config)?;
            let layers = e.layers.iter().map(|l| safe(l)).collect::<Result<Vec<_>, _>>()?;
            for m in std::iter::once(&config).chain(&layers) {
                if self.source.size(m).map_err(self.io("cannot read", m))?.is_none() {
                    return Err(self.bad(format!("manifest.json names {m:?}, which is not in the archive")));
                }
            }
            let names = self.names(name, e.repo_tags.clone().unwrap_or_default(), entries.len())?;
            checked.push((config, layers, names));
        }
        let mut planned = Vec::new();
        for (config, layers, names) in checked {
            let config_bytes = self.read_small(&config)?;
            self.claimed_digest(&config, &Digest::of(&config_bytes))?;
            let config_digest = self.store_bytes(&config_bytes)?;
            let mut descs = Vec::new();
            for l in &layers {
                let (digest, size, compression) = self.hash_member(l)?;
                self.claimed_digest(l, &digest)?;
                self.store_member(l, &digest, size)?;
                let media_type = match compression {
                    Compression::None => MEDIA_OCI_LAYER,
                    Compression::Gzip => MEDIA_OCI_LAYER_GZIP,
                    Compression::Zstd => MEDIA_OCI_LAYER_ZSTD,
                };
                descs.push(Descriptor {
                    media_type: media_type.into(),
                    digest,
                    size,
                    platform: None,
                    annotations: BTreeMap::new(),
                });
            }
            let manifest = Manifest {
                schema_version: 2,
                media_type: Some(MEDIA_OCI_MANIFEST.into()),
                config: Descriptor {
                    media_type: MEDIA_OCI_CONFIG.into(),
                    digest: config_digest,
                    size: config_bytes.len() as u64,
                    platform: None,
                    annotations: BTreeMap::new(),
                },
                layers: descs,
            };
            let json =
                serde_json::to_vec(&manifest).map_err(|e| self.bad(format!("encode manifest: {e}")))?;
            let manifest_digest = self.store_bytes(&json)?;
            for l in &manifest.layers {
                self.unpack(l)?;
            }
            planned.push(Planned {
                names: names.unwrap_or_else(|| vec![manifest_digest.to_string()]),
                manifest: manifest_digest,
            });
        }
        Ok(planned)
    }

    /// A member at `blobs/sha256/<hex>` claims that digest: it must be what it hashes to.
    fn claimed_digest(&self, member: &str, actual: &Digest) -> Result<(), Error> {
        if let Some(hex) = member.strip_prefix("blobs/sha256/") {
            let expected = Digest::from_hex(hex)?;
            if expected != *actual {
                return Err(Error::DigestMismatch {
                    expected,
                    actual: actual.clone(),
                });
            }
        }
        Ok(())
    }

    fn blob_member(d: &Digest) -> String {
        format!("blobs/sha256/{}", d.hex())
    }

    /// Stores the blob a descriptor names, from `blobs/sha256/`.
    fn store_descriptor(&mut self, d: &Descriptor) -> Result<(), Error> {
        let member = Self::blob_member(&d.digest);
        if self
            .source
            .size(&member)
            .map_err(self.io("cannot read", &member))?
            .is_none()
        {
            return Err(self.bad(format!("blob {} is not in the layout", d.digest)));
        }
        self.store_member(&member, &d.digest, d.size)
    }

    /// Stores a small document (manifest, index, config) a descriptor names and returns
    /// its bytes.
    fn store_document(&mut self, d: &Descriptor) -> Result<Vec<u8>, Error> {
        if d.size > MAX_DOCUMENT_BYTES {
            return Err(self.bad(format!(
                "{} is {} bytes, more than the {MAX_DOCUMENT_BYTES}-byte limit",
                d.digest, d.size
            )));
        }
        self.store_descriptor(d)?;
        self.store.read_document(&d.digest)
    }

    /// Picks the entry for this host's platform among `entries`.
    fn choose<'d>(&self, what: &str, entries: &[&'d Descriptor]) -> Result<&'d Descriptor, Error> {
        if let [only] = entries
            && only.platform.is_none()
        {
            return Ok(only);
        }
        let (os, arch) = host_platform();
        if let Some(d) = entries.iter().find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == os && p.architecture == arch)
        }) {
            return Ok(d);
        }
        let listed: Vec<String> = entries
            .iter()
            .map(|d| {
                d.platform
                    .as_ref()
                    .map_or("(no platform)".to_string(), Platform::to_string)
            })
            .collect();
        Err(self.bad(format!(
            "{what} has no {os}/{arch} image; it has: {}",
            listed.join(", ")
        )))
    }

    /// Follows `d` through nested indexes to a manifest, storing each index on the way.
    fn resolve_manifest(&mut self, mut d: Descriptor) -> Result<Descriptor, Error> {
        for _ in 0..MAX_INDEX_DEPTH {
            if !is_index_media_type(&d.media_type) {
                return Ok(d);
            }
            let what = format!("index {}", d.digest);
            let index = Index::parse(&what, &self.store_document(&d)?)?;
            if index.manifests.len() > MAX_IMAGES {
                return Err(self.bad(format!("{what} lists more than {MAX_IMAGES} entries")));
            }
            let refs: Vec<&Descriptor> = index.manifests.iter().collect();
            d = self.choose(&what, &refs)?.clone();
        }
        Err(self.bad(format!("indexes nested more than {MAX_INDEX_DEPTH} deep")))
    }

    fn oci(&mut self, name: Option<&str>) -> Result<Vec<Planned>, Error> {
        let layout = self.read_small("oci-layout")?;
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Layout {
            image_layout_version: String,
        }
        let layout: Layout =
            serde_json::from_slice(&layout).map_err(|e| self.bad(format!("oci-layout: {e}")))?;
        if !layout.image_layout_version.starts_with("1.") {
            return Err(self.bad(format!(
                "oci-layout version {:?} (1.x expected)",
                layout.image_layout_version
            )));
        }
        let index = Index::parse("index.json", &self.read_small("index.json")?)?;
        if index.manifests.is_empty() || index.manifests.len() > MAX_IMAGES {
            return Err(self.bad(format!(
                "index.json lists {} entries (1 to {MAX_IMAGES} expected)",
                index.manifests.len()
            )));
        }
        let mut groups: BTreeMap<Option<&String>, Vec<&Descriptor>> = BTreeMap::new();
        for d in &index.manifests {
            groups
                .entry(d.annotations.get(ANNOTATION_REF_NAME))
                .or_default()
                .push(d);
        }
        let mut chosen = Vec::new();
        for (ref_name, entries) in &groups {
            let what = match ref_name {
                Some(n) => format!("index.json entry {n:?}"),
                None => "index.json".to_string(),
            };
            let d = self.choose(&what, entries)?.clone();
            let found = ref_name.map(|n| vec![n.clone()]).unwrap_or_default();
            chosen.push((d, self.names(name, found, groups.len())?));
        }
        let mut planned = Vec::new();
        for (d, names) in chosen {
            let d = self.resolve_manifest(d)?;
            let what = format!("manifest {}", d.digest);
            let manifest = Manifest::parse(&what, &self.store_document(&d)?)?;
            if manifest.config.size > MAX_DOCUMENT_BYTES {
                return Err(self.bad(format!(
                    "config {} is {} bytes, more than the {MAX_DOCUMENT_BYTES}-byte limit",
                    manifest.config.digest, manifest.config.size
                )));
            }
            self.store_descriptor(&manifest.config)?;
            for l in &manifest.layers {
                self.store_descriptor(l)?;
            }
            for l in &manifest.layers {
                self.unpack(l)?;
            }
            planned.push(Planned {
                names: names.unwrap_or_else(|| vec![d.digest.to_string()]),
                manifest: d.digest,
            });
        }
        Ok(planned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_are_normalised_and_escapes_refused() {
        assert_eq!(member_name("./a//b/./c").as_deref(), Some("a/b/c"));
        assert_eq!(member_name("/etc/passwd"), None);
        assert_eq!(member_name("a/../../b"), None);
        assert_eq!(member_name("../x"), None);
        assert_eq!(member_name("./"), None);
        assert_eq!(link_target("x", "../y/layer.tar").as_deref(), Some("y/layer.tar"));
        assert_eq!(link_target("x", "../../y"), None);
        assert_eq!(link_target("x", "/etc/passwd"), None);
    }
}
