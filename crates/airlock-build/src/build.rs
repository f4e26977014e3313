//! Running an Airlockfile's steps (see the crate's documentation).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs;
use std::io::Read;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use airlock_backend::{Backend, ImageRoot, OutputSink, Shape};
use airlock_image::manifest::{self, Descriptor, Manifest};
use airlock_image::{Digest, Image, Store};
use airlock_spec::{ImageConfig, Limits, NetworkPolicy, Outcome, Spec};
use serde::Serialize;

use crate::Error;
use crate::cache::{Cache, Hit};
use crate::layer::{self, Entry, Layer};
use crate::parse::{Instruction, MAX_AIRLOCKFILE_BYTES, parse, substitute};

/// The PATH a RUN gets when the image sets none (Docker's default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What to build and how each RUN runs.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The name to tag the image with.
    pub tag: String,
    /// The Airlockfile.
    pub airlockfile: PathBuf,
    /// The build context: COPY sources are relative to it and may not leave it.
    pub context: PathBuf,
    /// `--build-arg NAME=value`: values for the Airlockfile's ARGs.
    pub build_args: Vec<(String, String)>,
    /// The limits of each RUN's sandbox (its timeout is per step).
    pub limits: Limits,
    /// The network of each RUN.
    pub network: NetworkPolicy,
    /// Ignore the layer cache (still record what is built).
    pub no_cache: bool,
}

impl BuildOptions {
    /// Default limits, no network, no build args, the cache used.
    pub fn new(tag: impl Into<String>, airlockfile: PathBuf, context: PathBuf) -> Self {
        BuildOptions {
            tag: tag.into(),
            airlockfile,
            context,
            build_args: Vec::new(),
            limits: Limits::default(),
            network: NetworkPolicy::None,
            no_cache: false,
        }
    }
}

/// Progress, as the build goes.
#[derive(Debug, Clone, PartialEq)]
pub enum StepEvent {
    /// A step starts.
    Started {
        /// Its number (1-based).
        step: usize,
        /// How many there are.
        total: usize,
        /// Its text.
        text: String,
    },
    /// A layer step's layer came from the cache: nothing ran.
    Cached {
        /// Its number.
        step: usize,
        /// The layer's digest (`None`: the step makes no layer).
        layer: Option<String>,
    },
    /// A layer step made its layer now.
    Built {
        /// Its number.
        step: usize,
        /// The layer's digest (`None`: nothing to add).
        layer: Option<String>,
        /// Entries in the layer.
        entries: usize,
        /// Seconds it took (for a RUN: the trees, the sandbox and the diff).
        secs: f64,
    },
}

impl fmt::Display for StepEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let short = |l: &Option<String>| match l {
            Some(d) => d.get(..19).unwrap_or(d).to_owned(),
            None => "no layer".to_owned(),
        };
        match self {
            StepEvent::Started { step, total, text } => write!(f, "STEP {step}/{total}: {text}"),
            StepEvent::Cached { step, layer } => write!(f, "STEP {step}: CACHED ({})", short(layer)),
            StepEvent::Built {
                step,
                layer,
                entries,
                secs,
            } => write!(
                f,
                "STEP {step}: {} ({entries} entries, {secs:.2} s)",
                short(layer)
            ),
        }
    }
}

/// What a build made.
#[derive(Debug, Clone)]
pub struct Built {
    /// The image, as tagged.
    pub image: Image,
    /// Layer steps whose layer came from the cache.
    pub cached: usize,
    /// RUN steps that ran in a sandbox.
    pub ran: usize,
}

/// The image being built.
struct State {
    /// Layers so far, lowest first: descriptor and diff_id.
    layers: Vec<(Descriptor, String)>,
    config: ImageConfig,
    architecture: String,
    os: String,
    /// CMD was set by this Airlockfile (an ENTRYPOINT then keeps it).
    cmd_set: bool,
    /// ARGs in scope: name → value (`None`: declared without a value).
    args: BTreeMap<String, Option<String>>,
    /// The cache key chain.
    key: String,
}

impl State {
    fn lookup(&self, name: &str) -> Option<String> {
        self.config
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| self.args.get(name).cloned().flatten())
    }

    fn subst(&self, s: &str) -> String {
        substitute(s, &|n| self.lookup(n))
    }

    fn advance(&mut self, parts: &[&[u8]]) -> String {
        let mut buf = Vec::new();
        buf.extend_from_slice(self.key.as_bytes());
        for p in parts {
            buf.extend_from_slice(&(p.len() as u64).to_le_bytes());
            buf.extend_from_slice(p);
        }
        self.key = Digest::of(&buf).hex().to_owned();
        self.key.clone()
    }

    fn workdir(&self) -> String {
        self.config.working_dir.clone().unwrap_or_else(|| "/".into())
    }

    fn push(&mut self, l: &Layer) {
        self.layers.push((
            Descriptor {
                media_type: manifest::MEDIA_OCI_LAYER_GZIP.into(),
                digest: l.digest.clone(),
                size: l.size,
                platform: None,
                annotations: BTreeMap::new(),
            },
            l.diff_id.to_string(),
        ));
    }

    fn layer_digests(&self) -> Vec<Digest> {
        self.layers.iter().map(|(d, _)| d.digest.clone()).collect()
    }
}

/// What a layer step does on a cache miss: its layer's entries (`None`: no layer).
type MakeLayer<'a> = Box<dyn FnOnce(&State) -> Result<Option<Vec<Entry>>, Error> + 'a>;

/// A lexically normalised absolute path, as components.
fn normalize(path: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c.to_owned()),
        }
    }
    out
}

fn absolute(workdir: &str, path: &str) -> Vec<String> {
    if path.starts_with('/') {
        normalize(path)
    } else {
        normalize(&format!("{workdir}/{path}"))
    }
}

/// The image's config blob.
#[derive(Serialize)]
struct ConfigOut<'a> {
    architecture: &'a str,
    os: &'a str,
    config: RunConfigOut<'a>,
    rootfs: RootFsOut<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct RunConfigOut<'a> {
    env: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    entrypoint: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cmd: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    working_dir: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
}

#[derive(Serialize)]
struct RootFsOut<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    diff_ids: Vec<&'a str>,
}

/// Builds the Airlockfile of `options` and tags the result. `from` finds (or pulls) the
/// image a FROM names; RUN output goes to `sink`; a readable `cancel` fd kills a running
/// step's sandbox (the build then fails with the backend's `Cancelled`); `progress` hears
/// of every step.
pub fn build(
    store: &Store,
    backend: &dyn Backend,
    options: &BuildOptions,
    from: &mut dyn FnMut(&str) -> Result<Image, String>,
    sink: &mut dyn OutputSink,
    cancel: &[BorrowedFd<'_>],
    progress: &mut dyn FnMut(&StepEvent),
) -> Result<Built, Error> {
    airlock_image::validate_name(&options.tag)?;
    let source = read_airlockfile(&options.airlockfile)?;
    let steps = parse(&source)?;
    let context = fs::canonicalize(&options.context).map_err(|e| Error::Airlockfile {
        path: options.context.clone(),
        reason: format!("the build context: {e}"),
    })?;
    let build_args: HashMap<&str, &str> = options
        .build_args
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (work, _held) = work_dir(store)?;
    let mut cache = Cache::load(store);
    let mut st = State {
        layers: Vec::new(),
        config: ImageConfig::default(),
        architecture: "amd64".into(),
        os: "linux".into(),
        cmd_set: false,
        args: BTreeMap::new(),
        key: String::new(),
    };
    let (mut cached, mut ran) = (0, 0);
    let total = steps.len();
    for (i, step) in steps.iter().enumerate() {
        let n = i + 1;
        progress(&StepEvent::Started {
            step: n,
            total,
            text: step.text.clone(),
        });
        let fail = |reason: String| Error::Step {
            step: n,
            line: step.line,
            text: step.text.clone(),
            reason,
        };
        let t0 = Instant::now();
        // The layer step's key and entries-maker, for the shared cache logic below.
        let (key, make): (String, MakeLayer<'_>) = match &step.instruction {
            Instruction::Arg(name, default) => {
                let value = build_args
                    .get(name.as_str())
                    .map(|v| v.to_string())
                    .or_else(|| default.as_ref().map(|d| st.subst(d)));
                st.advance(&[
                    b"ARG",
                    name.as_bytes(),
                    value.as_deref().unwrap_or("\0").as_bytes(),
                ]);
                st.args.insert(name.clone(), value);
                continue;
            }
            Instruction::From(reference) => {
                let reference = st.subst(reference);
                st.args.clear();
                if reference == "scratch" {
                    st.advance(&[b"FROM scratch"]);
                    continue;
                }
                let image = from(&reference).map_err(|e| fail(format!("image {reference}: {e}")))?;
                base(store, &image, &mut st).map_err(|e| fail(e.to_string()))?;
                st.advance(&[b"FROM", image.manifest_digest.to_string().as_bytes()]);
                continue;
            }
            Instruction::Env(pairs) => {
                for (k, v) in pairs {
                    let v = st.subst(v);
                    st.advance(&[b"ENV", k.as_bytes(), v.as_bytes()]);
                    st.config.env.retain(|(e, _)| e != k);
                    st.config.env.push((k.clone(), v));
                }
                continue;
            }
            Instruction::Cmd(cmd) => {
                st.advance(&[b"CMD", serde_json::to_string(cmd).unwrap_or_default().as_bytes()]);
                st.config.cmd = cmd.clone();
                st.cmd_set = true;
                continue;
            }
            Instruction::Entrypoint(ep) => {
                st.advance(&[
                    b"ENTRYPOINT",
                    serde_json::to_string(ep).unwrap_or_default().as_bytes(),
                ]);
                st.config.entrypoint = ep.clone();
                if !st.cmd_set {
                    // As Docker: an ENTRYPOINT drops the base image's CMD.
                    st.config.cmd.clear();
                }
                continue;
            }
            Instruction::Workdir(dir) => {
                let comps = absolute(&st.workdir(), &st.subst(dir));
                let path = format!("/{}", comps.join("/"));
                st.config.working_dir = Some(path.clone());
                let key = st.advance(&[b"WORKDIR", path.as_bytes()]);
                let work = work.path().to_path_buf();
                (
                    key,
                    Box::new(move |st: &State| {
                        let tree = materialize(store, st, &work, "tree")?;
                        let mut entries = BTreeMap::new();
                        parents(&tree, &comps, &mut entries).map_err(fail)?;
                        let _ = fs::remove_dir_all(&tree);
                        if entries.values().all(|e| matches!(e, Parent::Exists(_))) {
                            return Ok(None);
                        }
                        Ok(Some(entries.into_iter().map(|(p, e)| e.entry(p)).collect()))
                    }),
                )
            }
            Instruction::Copy { sources, dest } => {
                let items = copy_items(&context, &st, sources, dest).map_err(&fail)?;
                let hash = content_hash(&items)?;
                let text = format!("{sources:?} {}", st.subst(dest));
                let key = st.advance(&[b"COPY", text.as_bytes(), hash.as_bytes()]);
                let work = work.path().to_path_buf();
                (
                    key,
                    Box::new(move |st: &State| {
                        let tree = materialize(store, st, &work, "tree")?;
                        let mut entries = BTreeMap::new();
                        for (e, marker) in &items {
                            let path = entry_path(e);
                            let comps: Vec<String> = if path.is_empty() {
                                Vec::new()
                            } else {
                                path.split('/').map(str::to_owned).collect()
                            };
                            // A directory source's destination is itself a parent.
                            let upto = if marker.is_some() {
                                comps.len()
                            } else {
                                comps.len().saturating_sub(1)
                            };
                            parents(&tree, &comps[..upto], &mut entries).map_err(&fail)?;
                        }
                        let _ = fs::remove_dir_all(&tree);
                        let mut out: BTreeMap<String, Entry> = entries
                            .into_iter()
                            .map(|(p, e)| (p.clone(), e.entry(p)))
                            .collect();
                        for (e, marker) in items {
                            if marker.is_none() {
                                out.insert(entry_path(&e).to_owned(), e);
                            }
                        }
                        Ok(Some(out.into_values().collect()))
                    }),
                )
            }
            Instruction::Run(cmd) => {
                let args: Vec<String> = st
                    .args
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_deref().unwrap_or("")))
                    .collect();
                let key = st.advance(&[
                    b"RUN",
                    serde_json::to_string(cmd).unwrap_or_default().as_bytes(),
                    args.join("\n").as_bytes(),
                ]);
                let work = work.path().to_path_buf();
                let sink = &mut *sink;
                (
                    key,
                    Box::new(move |st: &State| {
                        run_step(
                            store, backend, options, st, cmd, &work, sink, cancel, n, step.line, &step.text,
                        )
                        .map(Some)
                    }),
                )
            }
        };
        let hit = if options.no_cache {
            Hit::Miss
        } else {
            cache.get(store, &key)
        };
        match hit {
            Hit::Layer(l) => {
                st.push(&l);
                cached += 1;
                progress(&StepEvent::Cached {
                    step: n,
                    layer: Some(l.digest.to_string()),
                });
            }
            Hit::Empty => {
                cached += 1;
                progress(&StepEvent::Cached { step: n, layer: None });
            }
            Hit::Miss => {
                if matches!(step.instruction, Instruction::Run(_)) {
                    ran += 1;
                }
                let entries = make(&st)?;
                let (layer, count) = match entries {
                    Some(entries) => (Some(layer::write(store, &entries, work.path())?), entries.len()),
                    None => (None, 0),
                };
                cache.put(store, &key, layer.as_ref())?;
                if let Some(l) = &layer {
                    st.push(l);
                }
                progress(&StepEvent::Built {
                    step: n,
                    layer: layer.map(|l| l.digest.to_string()),
                    entries: count,
                    secs: t0.elapsed().as_secs_f64(),
                });
            }
        }
    }
    let image = commit(store, &st, &options.tag)?;
    Ok(Built { image, cached, ran })
}

/// This build's work directory under `<store>/build-work/`, with the lock that says it is
/// in use (held until the build ends). Directories there whose lock is free were left by a
/// build that crashed (a killed airlock): they are removed first.
fn work_dir(store: &Store) -> Result<(tempfile::TempDir, fs::File), Error> {
    let root = store.root().join("build-work");
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io {
            op: "prepare the build's work directory",
            path,
            source,
        }
    };
    fs::create_dir_all(&root).map_err(io(&root))?;
    for e in fs::read_dir(&root).map_err(io(&root))? {
        let p = e.map_err(io(&root))?.path();
        let Ok(lock) = fs::File::open(p.join(".lock")) else {
            continue; // Being created: its lock is not there yet.
        };
        if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok() {
            let _ = fs::remove_dir_all(&p);
        }
    }
    let work = tempfile::Builder::new()
        .prefix("build-")
        .tempdir_in(&root)
        .map_err(io(&root))?;
    // Locked under another name, then renamed: whoever opens `.lock` finds it held.
    let fresh = work.path().join(".lock-new");
    let lock = fs::File::create(&fresh).map_err(io(&fresh))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).map_err(|e| io(&fresh)(e.into()))?;
    fs::rename(&fresh, work.path().join(".lock")).map_err(io(&fresh))?;
    Ok((work, lock))
}

fn read_airlockfile(path: &Path) -> Result<String, Error> {
    let err = |reason: String| Error::Airlockfile {
        path: path.to_path_buf(),
        reason,
    };
    let f = fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let mut buf = Vec::new();
    f.take(MAX_AIRLOCKFILE_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| err(e.to_string()))?;
    if buf.len() as u64 > MAX_AIRLOCKFILE_BYTES {
        return Err(err(format!(
            "larger than the {MAX_AIRLOCKFILE_BYTES}-byte limit for an Airlockfile"
        )));
    }
    String::from_utf8(buf).map_err(|_| err("not UTF-8 text".into()))
}

fn read_blob(store: &Store, d: &Digest) -> Result<Vec<u8>, Error> {
    let mut buf = Vec::new();
    store
        .open_blob(d)?
        .take(manifest::MAX_DOCUMENT_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::Io {
            op: "read blob",
            path: store.blob_path(d),
            source: e,
        })?;
    Ok(buf)
}

/// The base image's layers and config into `st`.
fn base(store: &Store, image: &Image, st: &mut State) -> Result<(), Error> {
    let m = Manifest::parse("manifest", &read_blob(store, &image.manifest_digest)?)?;
    let c = manifest::Config::parse("config", &read_blob(store, &image.config_digest)?)?;
    let diff_ids = c.rootfs.map(|r| r.diff_ids).unwrap_or_default();
    if diff_ids.len() != m.layers.len() {
        return Err(Error::Store(airlock_image::Error::InvalidDocument {
            what: "config".into(),
            reason: format!("{} diff_ids for {} layers", diff_ids.len(), m.layers.len()),
        }));
    }
    st.layers = m.layers.into_iter().zip(diff_ids).collect();
    st.config = image.config.clone();
    if !c.architecture.is_empty() {
        st.architecture = c.architecture;
    }
    if !c.os.is_empty() {
        st.os = c.os;
    }
    Ok(())
}

/// The image so far as a fresh tree under `work` (with the sandbox's mount points).
fn materialize(store: &Store, st: &State, work: &Path, name: &str) -> Result<PathBuf, Error> {
    let dest = work.join(name);
    if dest.exists() {
        fs::remove_dir_all(&dest).map_err(|e| Error::Io {
            op: "remove",
            path: dest.clone(),
            source: e,
        })?;
    }
    for d in st.layer_digests() {
        if !store.has_layer(&d) {
            store.unpack_layer(&d, None)?;
        }
    }
    store.flatten(&st.layer_digests(), &dest)?;
    add_mount_points(&dest).map_err(|e| Error::Io {
        op: "prepare mount points in",
        path: dest.clone(),
        source: e,
    })?;
    Ok(dest)
}

/// The directories and empty files the sandbox mounts over, where missing (never
/// following a symlink: one in their place is replaced).
fn add_mount_points(root: &Path) -> std::io::Result<()> {
    for d in airlock_image::ROOT_MOUNT_DIRS {
        let p = root.join(d.trim_start_matches('/'));
        match fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => fs::remove_file(&p)?,
            Err(_) => {}
        }
        fs::create_dir(&p)?;
    }
    for f in airlock_image::ROOT_MOUNT_FILES {
        let p = root.join(f.trim_start_matches('/'));
        match fs::symlink_metadata(&p) {
            Ok(m) if m.is_file() => continue,
            Ok(m) if m.is_dir() => fs::remove_dir_all(&p)?,
            Ok(_) => fs::remove_file(&p)?,
            Err(_) => {}
        }
        fs::write(&p, b"")?;
    }
    Ok(())
}

/// A directory on the way to what a step writes.
enum Parent {
    /// In the image already, with this mode.
    Exists(u32),
    /// To be created.
    New,
}

impl Parent {
    fn entry(self, path: String) -> Entry {
        match self {
            Parent::Exists(mode) => Entry::Dir { path, mode },
            Parent::New => Entry::Dir { path, mode: 0o755 },
        }
    }
}

/// Records each directory of `comps` (each prefix, the whole included) as it is in
/// `tree`; a symlink or a non-directory there is refused.
fn parents(tree: &Path, comps: &[String], out: &mut BTreeMap<String, Parent>) -> Result<(), String> {
    let mut missing = false;
    for i in 1..=comps.len() {
        let rel = comps[..i].join("/");
        if out.contains_key(&rel) {
            continue;
        }
        let p = if missing {
            Parent::New
        } else {
            match fs::symlink_metadata(tree.join(&rel)) {
                Ok(m) if m.is_dir() => Parent::Exists(m.mode() & 0o7777),
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(format!(
                        "/{rel} is a symbolic link in the image; name the directory it points to"
                    ));
                }
                Ok(_) => return Err(format!("/{rel} is not a directory in the image")),
                Err(_) => {
                    missing = true;
                    Parent::New
                }
            }
        };
        out.insert(rel, p);
    }
    Ok(())
}

fn entry_path(e: &Entry) -> &str {
    match e {
        Entry::Dir { path, .. }
        | Entry::File { path, .. }
        | Entry::Symlink { path, .. }
        | Entry::Whiteout { path } => path,
    }
}

/// What a COPY writes: entries (paths in the image), each with `Some(())` when it is the
/// destination directory of a directory source's contents.
type CopyItems = Vec<(Entry, Option<()>)>;

fn copy_items(context: &Path, st: &State, sources: &[String], dest: &str) -> Result<CopyItems, String> {
    let dest_raw = st.subst(dest);
    let dest = absolute(&st.workdir(), &dest_raw);
    let mut resolved = Vec::new();
    for s in sources {
        let s = st.subst(s);
        let mut depth = 0i32;
        for c in s.split('/') {
            match c {
                "" | "." => {}
                ".." => depth -= 1,
                _ => depth += 1,
            }
            if depth < 0 {
                return Err(format!("{s}: outside the build context"));
            }
        }
        let p = context.join(s.trim_start_matches('/'));
        let real = fs::canonicalize(&p).map_err(|_| format!("{s}: not found in the build context"))?;
        if !real.starts_with(context) {
            return Err(format!("{s}: outside the build context"));
        }
        let meta = fs::metadata(&real).map_err(|e| format!("{s}: {e}"))?;
        resolved.push((s, real, meta));
    }
    let to_dir = dest_raw.ends_with('/') || resolved.len() > 1 || resolved.iter().any(|(_, _, m)| m.is_dir());
    let mut items = Vec::new();
    for (s, real, meta) in resolved {
        if meta.is_dir() {
            let rel = dest.join("/");
            // A marker for the destination directory itself (its parents and itself are
            // taken from the image).
            items.push((
                Entry::Dir {
                    path: rel.clone(),
                    mode: 0o755,
                },
                Some(()),
            ));
            let mut below = Vec::new();
            layer::add_tree(&real, &rel, &mut below).map_err(|e| format!("{s}: {e}"))?;
            items.extend(below.into_iter().map(|e| (e, None)));
        } else if meta.is_file() {
            let mut comps = dest.clone();
            if to_dir {
                let name = real
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                comps.push(name);
            }
            if comps.is_empty() {
                return Err(format!("{s}: cannot be copied onto /"));
            }
            items.push((
                Entry::File {
                    path: comps.join("/"),
                    mode: meta.mode() & 0o777,
                    src: real,
                },
                None,
            ));
        } else {
            return Err(format!("{s}: not a file or directory"));
        }
    }
    // The directory markers are not entries of their own: the parents logic adds them.
    Ok(items)
}

/// sha256 over what a COPY writes: paths, kinds, modes, link targets and contents.
fn content_hash(items: &CopyItems) -> Result<String, Error> {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for (e, _) in items {
        match e {
            Entry::Dir { path, mode } => h.update(format!("d {path} {mode:o}\0").as_bytes()),
            Entry::File { path, mode, src } => {
                h.update(format!("f {path} {mode:o}\0").as_bytes());
                let mut f = fs::File::open(src).map_err(|e| Error::Io {
                    op: "read",
                    path: src.clone(),
                    source: e,
                })?;
                layer::hash_reader(&mut f, &mut h).map_err(|e| Error::Io {
                    op: "read",
                    path: src.clone(),
                    source: e,
                })?;
            }
            Entry::Symlink { path, target } => {
                h.update(format!("l {path}\0").as_bytes());
                h.update(target);
            }
            Entry::Whiteout { path } => h.update(format!("w {path}\0").as_bytes()),
        }
        h.update(b"\0");
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// One RUN: two trees of the image so far, the step in a sandbox on one, the diff.
#[allow(clippy::too_many_arguments)]
fn run_step(
    store: &Store,
    backend: &dyn Backend,
    options: &BuildOptions,
    st: &State,
    cmd: &[String],
    work: &Path,
    sink: &mut dyn OutputSink,
    cancel: &[BorrowedFd<'_>],
    n: usize,
    line: usize,
    text: &str,
) -> Result<Vec<Entry>, Error> {
    let base = materialize(store, st, work, "base")?;
    let tree = materialize(store, st, work, "step")?;
    let workdir = st.workdir();
    let wd = tree.join(workdir.trim_start_matches('/'));
    if fs::symlink_metadata(&wd).is_err() {
        let _ = fs::create_dir_all(&wd);
    }
    let mut spec = Spec::new(cmd.to_vec());
    spec.limits = options.limits.clone();
    spec.network = options.network.clone();
    spec.workdir = Some(workdir);
    let mut env: Vec<(String, String)> = st
        .args
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
        .filter(|(k, _)| !st.config.env.iter().any(|(e, _)| e == k))
        .collect();
    env.extend(st.config.env.iter().cloned());
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    spec.env = env;
    let mut shape = Shape::of(&spec);
    shape.image = Some(ImageRoot {
        digest: format!("build-step:{}", st.key),
        root: tree.clone(),
    });
    let (result, overflow) = run_watched(backend, &shape, &spec, sink, cancel, &tree)?;
    if let Some(what) = overflow {
        let _ = fs::remove_dir_all(&base);
        let _ = fs::remove_dir_all(&tree);
        return Err(Error::RunFailed {
            step: n,
            line,
            text: text.to_owned(),
            status: format!("killed: wrote more than {what} into the image's tree (--disk)"),
        });
    }
    let result = result.map_err(|source| Error::Sandbox {
        step: n,
        line,
        source,
    })?;
    let status = match result.outcome {
        Outcome::Exited if result.exit_code == Some(0) => None,
        Outcome::Exited => Some(format!("exit code {}", result.exit_code.unwrap_or(-1))),
        Outcome::Timeout => Some(format!(
            "killed at the {} ms deadline (--timeout)",
            options.limits.timeout_ms
        )),
        Outcome::Oom => Some("killed: exceeded the memory limit (--memory)".into()),
        Outcome::Signaled => Some(format!("killed by signal {}", result.signal.unwrap_or(0))),
    };
    if let Some(status) = status {
        let _ = fs::remove_dir_all(&base);
        let _ = fs::remove_dir_all(&tree);
        return Err(Error::RunFailed {
            step: n,
            line,
            text: text.to_owned(),
            status,
        });
    }
    let entries = layer::diff(&base, &tree)?;
    // Entries read their content from the step's tree at write time: keep it until then
    // (the caller writes the layer, then the next materialize replaces it).
    let _ = fs::remove_dir_all(&base);
    Ok(entries)
}

/// A step's result, and what it wrote too much of, if it did.
type Watched = (
    Result<airlock_spec::ExecResult, airlock_backend::Error>,
    Option<String>,
);

/// How often a RUN's writes into its tree are measured.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Runs the step, and kills it when the filesystem holding its tree has lost more than the
/// step's `--disk` in bytes (or `--disk`/4 KiB in inodes) since it started: the tree is on
/// the host's disk, not on the sandbox's capped tmpfs, and RLIMIT_FSIZE bounds one file
/// only. Measured on the whole filesystem (statvfs), so others' writes meanwhile count
/// too: the bound errs towards stopping the step. Returns what was exceeded, if it was.
fn run_watched(
    backend: &dyn Backend,
    shape: &Shape,
    spec: &Spec,
    sink: &mut dyn OutputSink,
    cancel: &[BorrowedFd<'_>],
    tree: &Path,
) -> Result<Watched, Error> {
    use std::os::fd::AsFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    let usage = |p: &Path| {
        rustix::fs::statvfs(p)
            .ok()
            .map(|v| ((v.f_blocks - v.f_bfree) * v.f_frsize, v.f_files - v.f_ffree))
    };
    let max_bytes = spec.limits.disk_bytes;
    let max_inodes = (spec.limits.disk_bytes / 4096).max(4096);
    let (reader, mut writer) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => {
            return Err(Error::Io {
                op: "create the watch pipe for",
                path: tree.to_path_buf(),
                source: e,
            });
        }
    };
    let done = AtomicBool::new(false);
    let start = usage(tree);
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let (b0, i0) = start?;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(WATCH_EVERY);
                let Some((b, i)) = usage(tree) else { continue };
                let over = if b.saturating_sub(b0) > max_bytes {
                    Some(airlock_spec::format_size(max_bytes))
                } else if i.saturating_sub(i0) > max_inodes {
                    Some(format!("{max_inodes} files"))
                } else {
                    None
                };
                if over.is_some() {
                    use std::io::Write;
                    let _ = writer.write_all(b"x");
                    return over;
                }
            }
            None
        });
        let mut fds: Vec<BorrowedFd<'_>> = cancel.to_vec();
        fds.push(reader.as_fd());
        let result = backend.run_in(shape, spec, sink, &fds);
        done.store(true, Ordering::Relaxed);
        let over = watcher.join().unwrap_or(None);
        Ok((result, over))
    })
}

/// Writes the config and manifest and tags them.
fn commit(store: &Store, st: &State, tag: &str) -> Result<Image, Error> {
    let env: Vec<String> = st.config.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let config = ConfigOut {
        architecture: &st.architecture,
        os: &st.os,
        config: RunConfigOut {
            env,
            entrypoint: (!st.config.entrypoint.is_empty()).then_some(&st.config.entrypoint[..]),
            cmd: (!st.config.cmd.is_empty()).then_some(&st.config.cmd[..]),
            working_dir: st.config.working_dir.as_deref(),
            user: st.config.user.as_deref(),
        },
        rootfs: RootFsOut {
            kind: "layers",
            diff_ids: st.layers.iter().map(|(_, d)| d.as_str()).collect(),
        },
    };
    let config = serde_json::to_vec(&config).expect("plain data serializes");
    let config_digest = put_blob(store, &config)?;
    let m = Manifest {
        schema_version: 2,
        media_type: Some(manifest::MEDIA_OCI_MANIFEST.into()),
        config: Descriptor {
            media_type: manifest::MEDIA_OCI_CONFIG.into(),
            digest: config_digest,
            size: config.len() as u64,
            platform: None,
            annotations: BTreeMap::new(),
        },
        layers: st.layers.iter().map(|(d, _)| d.clone()).collect(),
    };
    let m = serde_json::to_vec(&m).expect("plain data serializes");
    let manifest_digest = put_blob(store, &m)?;
    Ok(store.tag(tag, &manifest_digest)?)
}

fn put_blob(store: &Store, bytes: &[u8]) -> Result<Digest, Error> {
    let d = Digest::of(bytes);
    store.ensure_blob(&d, Some(bytes.len() as u64), || Ok(bytes))?;
    Ok(d)
}
