//! Pulling an image from an OCI registry into the [`Store`].
//!
//! [`pull`] resolves a reference (Docker Hub conventions, see [`canonical_reference`]),
//! fetches its manifest, picks the linux/amd64 manifest when the reference names an index
//! (OCI image index or Docker manifest list), and stores in the store, as blobs verified by
//! sha256: the config, every layer (a few at a time, streamed to disk) and, last, the
//! manifest itself, so a manifest in the store always has its config and layers beside it.
//! Each layer is unpacked while it downloads ([`Store::ensure_layer`]), the largest
//! first. Blobs already stored are not fetched again; two pulls of one image at once fetch
//! each blob once (the store's per-digest locks).
//!
//! The distribution protocol is `oci-client` (the ORAS project's client, used by
//! Kubernetes-adjacent tools such as Krustlet and wasmCloud): manifests and blobs by
//! digest, Docker Hub style bearer tokens, basic auth, and HTTPS except for the registries
//! the caller marks insecure. Writing those ourselves would be a second, less tested copy of
//! the same protocol. Verification does not rely on it: every manifest and blob is checked
//! against its sha256 here and by the store, and a layer's alternate `urls` (foreign layers)
//! are never followed.
//!
//! Everything fails with one line naming the image and the registry: not found, refused
//! credentials, unreachable, timed out, HTTPS refused, digest mismatch, truncated blob, over
//! the store's budget. A failed pull leaves no partial blob (the store writes each blob to
//! a temporary file and renames it into place once verified) and no manifest; the verified
//! blobs it stored before failing stay, content-addressed, for the next try.
//!
//! [`pull`] blocks: it runs oci-client on a small tokio runtime of its own. From async code,
//! call it in `spawn_blocking`.
//!
//! ```no_run
//! use airlock_image::{PullOptions, Store, StoreOptions, pull};
//!
//! # fn main() -> Result<(), airlock_image::Error> {
//! let store = Store::open("/var/lib/airlock/images", StoreOptions::default())?;
//! let pulled = pull(&store, "python:3.12-slim", &PullOptions::default())?;
//! println!("{} {}", pulled.reference, pulled.manifest_digest);
//! # Ok(())
//! # }
//! ```

mod auth;

use std::collections::HashSet;
use std::error::Error as StdError;
use std::future::Future;
use std::io::{self, Read};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use oci_client::client::{ClientConfig, ClientProtocol, SizedStream};
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageIndex, OciImageManifest,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};

pub use auth::Credentials;

use crate::reference::{self, canonical_reference};
use crate::{BlobStatus, Digest, Error, Store};

/// The manifest media types asked for (in the `Accept` header) and accepted.
const MANIFEST_TYPES: &[&str] = &[
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
];

/// The layer media types the store unpacks. Foreign and non-distributable layers
/// (`…nondistributable…`, `…foreign…`) are refused: their bytes live elsewhere.
const LAYER_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
];

/// The config media types of container images (anything else is an OCI artifact).
const CONFIG_TYPES: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];

/// The largest manifest or index accepted: real ones are a few KiB; this bounds what is
/// parsed and stored from a hostile registry.
const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// The most layers an image may have (Docker's own limit is 127; OCI sets none).
const MAX_LAYERS: usize = 256;

/// The only platform pulled.
const OS: &str = "linux";
/// The only architecture pulled.
const ARCH: &str = "amd64";

/// How a pull is done.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// Registry hosts (`host[:port]`, as in the reference) that may be spoken to over plain
    /// HTTP. Every other registry is HTTPS only.
    pub insecure: Vec<String>,
    /// Where credentials come from (default: the docker config file).
    pub credentials: Credentials,
    /// The whole pull's limit (default 10 minutes).
    pub timeout: Duration,
    /// The longest a connection attempt or a read may wait for the registry (default 30 s).
    pub stall_timeout: Duration,
    /// Blobs fetched at once (default 3; at least 1).
    pub concurrency: usize,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            insecure: Vec::new(),
            credentials: Credentials::default(),
            timeout: Duration::from_secs(600),
            stall_timeout: Duration::from_secs(30),
            concurrency: 3,
        }
    }
}

/// What [`pull`] stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The canonical reference (`docker.io/library/python:3.12-slim`).
    pub reference: String,
    /// The linux/amd64 image manifest, stored as a blob.
    pub manifest_digest: Digest,
    /// The image config, stored as a blob.
    pub config_digest: Digest,
    /// The layers in order, bottom first, with their media types; each stored and unpacked.
    pub layers: Vec<(Digest, String)>,
    /// Bytes of the blobs this pull stored (blobs already in the store not counted).
    pub bytes_fetched: u64,
    /// Blobs this pull stored (manifest, config, layers not already there).
    pub blobs_fetched: usize,
}

/// Pulls `reference` (linux/amd64) into `store`.
///
/// Fetches the manifest (an index or manifest list resolves to its linux/amd64 entry),
/// checks every layer's media type before fetching anything, stores the config and the
/// layers as blobs verified by sha256 (those already stored are not fetched; a few are
/// fetched at once, each streamed to disk), unpacks each layer, and stores the manifest
/// last. A failed pull leaves no partial blob and no manifest; the error names the image
/// and the registry.
///
/// Blocks, on a small tokio runtime of its own: from async code, call it in
/// `spawn_blocking`, never on a runtime's worker thread.
pub fn pull(store: &Store, reference: &str, options: &PullOptions) -> Result<Pulled, Error> {
    let image = reference::parse(reference)?;
    let canonical = canonical_reference(reference)?;
    let registry = image.registry().to_owned();
    let (auth, tried) = auth::resolve(&options.credentials, &registry)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("airlock-pull")
        .enable_all()
        .build()
        .map_err(|e| Error::Registry {
            registry: registry.clone(),
            message: format!("cannot start the async runtime: {e}"),
        })?;
    let config = ClientConfig {
        protocol: ClientProtocol::HttpsExcept(options.insecure.clone()),
        platform_resolver: None,
        read_timeout: Some(options.stall_timeout),
        connect_timeout: Some(options.stall_timeout),
        ..ClientConfig::default()
    };
    let insecure = options.insecure.iter().any(|h| h == image.resolve_registry());
    let puller = Puller {
        store,
        client: Client::try_from(config).map_err(|e| Error::Registry {
            registry: registry.clone(),
            message: format!("cannot build the HTTP client: {}", chain(&e)),
        })?,
        runtime,
        image,
        canonical,
        registry,
        auth,
        tried,
        options,
        deadline: Instant::now() + options.timeout,
        insecure,
    };
    puller.pull()
}

/// One pull's state, shared by the threads that fetch its blobs.
struct Puller<'a> {
    /// Where blobs go.
    store: &'a Store,
    client: Client,
    /// Drives `client`; blocked on from the calling thread and the blob threads.
    runtime: tokio::runtime::Runtime,
    image: Reference,
    /// `image`, canonical, for messages and [`Pulled::reference`].
    canonical: String,
    /// The registry as the reference names it, for messages.
    registry: String,
    auth: RegistryAuth,
    /// Which credentials `auth` is, for messages.
    tried: String,
    options: &'a PullOptions,
    /// When the whole pull's timeout expires.
    deadline: Instant,
    /// Whether the registry is one the caller allowed plain HTTP for.
    insecure: bool,
}

/// A blob to fetch: the config or a layer.
struct Job {
    digest: Digest,
    size: u64,
    media_type: String,
    /// Whether to unpack it once stored (layers).
    unpack: bool,
}

/// Why fetching a blob's bytes failed, carried through the store's `io::Error`.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("the pull's timeout expired")]
    Deadline,
    #[error("request failed")]
    Request(#[source] OciDistributionError),
    #[error("download interrupted after {got} bytes")]
    Body {
        #[source]
        source: io::Error,
        got: u64,
    },
}

impl Puller<'_> {
    fn pull(&self) -> Result<Pulled, Error> {
        // Authenticate first: a refused login or an unreachable registry is reported as
        // such rather than as the first request's 401.
        self.block(self.client.auth(&self.image, &self.auth, RegistryOperation::Pull))?;
        let (mut bytes, mut digest) = self.fetch_manifest(&self.image, self.image.digest())?;
        let mut manifest = parse_json(&self.canonical, &bytes)?;
        if is_index(&manifest) {
            let index: OciImageIndex = serde_json::from_value(manifest).map_err(|e| self.invalid(e))?;
            let entry = self.pick_platform(&index)?;
            let child = self.image.clone_with_digest(entry.clone());
            (bytes, digest) = self.fetch_manifest(&child, Some(&entry))?;
            manifest = parse_json(&self.canonical, &bytes)?;
            if is_index(&manifest) {
                return Err(self.invalid("the linux/amd64 entry of the index is itself an index"));
            }
        }
        let manifest: OciImageManifest = serde_json::from_value(manifest).map_err(|e| self.invalid(e))?;
        let jobs = self.jobs(&manifest)?;
        let (mut bytes_fetched, mut blobs_fetched) = self.fetch_all(&jobs)?;
        // The manifest last: once it is in the store, so is everything it names.
        if let BlobStatus::Stored(n) = self
            .store
            .ensure_blob(&digest, Some(bytes.len() as u64), || Ok(&bytes[..]))?
        {
            bytes_fetched += n;
            blobs_fetched += 1;
        }
        let config_digest = jobs[0].digest.clone();
        let layers = manifest
            .layers
            .iter()
            .map(|l| Ok((l.digest.parse()?, l.media_type.clone())))
            .collect::<Result<_, Error>>()?;
        Ok(Pulled {
            reference: self.canonical.clone(),
            manifest_digest: digest,
            config_digest,
            layers,
            bytes_fetched,
            blobs_fetched,
        })
    }

    /// Fetches the manifest or index `image` names, checks it against `expected` (the
    /// reference's or the index's digest) or the registry's `Docker-Content-Digest`, and
    /// returns its bytes and digest.
    fn fetch_manifest(&self, image: &Reference, expected: Option<&str>) -> Result<(Vec<u8>, Digest), Error> {
        let (bytes, header) = self.block(self.client.pull_manifest_raw(image, &self.auth, MANIFEST_TYPES))?;
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(self.invalid(format!("manifest larger than {MAX_MANIFEST_BYTES} bytes")));
        }
        let actual = Digest::of(&bytes);
        // oci-client already compared the body with both; compare again, in the store's
        // terms (a digest of another algorithm in the header is left to oci-client).
        for claimed in expected.into_iter().chain(Some(header.as_str())) {
            if let Ok(claimed) = claimed.parse::<Digest>()
                && claimed != actual
            {
                return Err(Error::DigestMismatch {
                    expected: claimed,
                    actual,
                });
            }
        }
        Ok((bytes, actual))
    }

    /// The digest of the index's linux/amd64 manifest.
    fn pick_platform(&self, index: &OciImageIndex) -> Result<String, Error> {
        let found = index.manifests.iter().find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os == OS && p.architecture == ARCH)
        });
        match found {
            Some(m) => Ok(m.digest.clone()),
            None => {
                let available: Vec<String> = index
                    .manifests
                    .iter()
                    .map(|m| match &m.platform {
                        Some(p) => match &p.variant {
                            Some(v) => format!("{}/{}/{v}", p.os, p.architecture),
                            None => format!("{}/{}", p.os, p.architecture),
                        },
                        None => "(no platform)".into(),
                    })
                    .collect();
                Err(Error::PlatformMissing {
                    image: self.canonical.clone(),
                    available: if available.is_empty() {
                        "nothing".into()
                    } else {
                        available.join(", ")
                    },
                })
            }
        }
    }

    /// The config and the layers to fetch, checked before anything is fetched.
    fn jobs(&self, manifest: &OciImageManifest) -> Result<Vec<Job>, Error> {
        if let Some(mt) = &manifest.media_type
            && mt != OCI_IMAGE_MEDIA_TYPE
            && mt != IMAGE_MANIFEST_MEDIA_TYPE
        {
            return Err(self.invalid(format!("unsupported manifest media type {mt}")));
        }
        if !CONFIG_TYPES.contains(&manifest.config.media_type.as_str()) {
            return Err(self.invalid(format!(
                "not a container image: config media type {}",
                manifest.config.media_type
            )));
        }
        if manifest.layers.len() > MAX_LAYERS {
            return Err(self.invalid(format!("more than {MAX_LAYERS} layers")));
        }
        let descriptor = |d: &OciDescriptor| -> Result<(Digest, u64), Error> {
            let digest = d.digest.parse::<Digest>()?;
            let size = u64::try_from(d.size)
                .map_err(|_| self.invalid(format!("blob {digest} has negative size {}", d.size)))?;
            Ok((digest, size))
        };
        let (digest, size) = descriptor(&manifest.config)?;
        let mut jobs = vec![Job {
            digest,
            size,
            media_type: manifest.config.media_type.clone(),
            unpack: false,
        }];
        let mut seen = HashSet::new();
        for layer in &manifest.layers {
            let (digest, size) = descriptor(layer)?;
            if !LAYER_TYPES.contains(&layer.media_type.as_str()) {
                return Err(Error::UnsupportedMediaType {
                    image: self.canonical.clone(),
                    digest: digest.to_string(),
                    media_type: layer.media_type.clone(),
                });
            }
            if seen.insert(digest.clone()) {
                jobs.push(Job {
                    digest,
                    size,
                    media_type: layer.media_type.clone(),
                    unpack: true,
                });
            }
        }
        Ok(jobs)
    }

    /// Fetches (and unpacks) `jobs` on up to `concurrency` threads, the largest first (the
    /// largest layer is the longest download and unpack: started last, it would finish
    /// last); stops taking new jobs at the first error, which it returns. Returns the
    /// bytes and blobs stored.
    fn fetch_all(&self, jobs: &[Job]) -> Result<(u64, usize), Error> {
        let mut jobs: Vec<&Job> = jobs.iter().collect();
        jobs.sort_by_key(|job| std::cmp::Reverse(job.size));
        let next = AtomicUsize::new(0);
        let first_error: Mutex<Option<Error>> = Mutex::new(None);
        let totals = Mutex::new((0u64, 0usize));
        let workers = self.options.concurrency.clamp(1, jobs.len().max(1));
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| {
                    loop {
                        if lock(&first_error).is_some() {
                            return;
                        }
                        let Some(job) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            return;
                        };
                        match self.fetch(job) {
                            Ok(Some(n)) => {
                                let mut t = lock(&totals);
                                t.0 += n;
                                t.1 += 1;
                            }
                            Ok(None) => {}
                            Err(e) => {
                                lock(&first_error).get_or_insert(e);
                                return;
                            }
                        }
                    }
                });
            }
        });
        match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(totals.into_inner().unwrap_or_else(|p| p.into_inner())),
        }
    }

    /// Stores one blob (fetching it only if missing) and unpacks it if it is a layer,
    /// while it downloads ([`Store::ensure_layer`]); returns the bytes fetched, if it was.
    fn fetch(&self, job: &Job) -> Result<Option<u64>, Error> {
        let status = if job.unpack {
            self.store
                .ensure_layer(&job.digest, Some(job.size), Some(&job.media_type), || {
                    self.open_blob(job)
                })
                .map(|(blob, _layer)| blob)
        } else {
            self.store
                .ensure_blob(&job.digest, Some(job.size), || self.open_blob(job))
        }
        .map_err(|e| self.fetch_error(e, job))?;
        Ok(match status {
            BlobStatus::Stored(n) => Some(n),
            BlobStatus::Present => None,
        })
    }

    /// Starts the blob's download (called by the store only when the blob is missing).
    fn open_blob(&self, job: &Job) -> io::Result<BlobReader<'_>> {
        let descriptor = OciDescriptor {
            media_type: job.media_type.clone(),
            digest: job.digest.to_string(),
            size: i64::try_from(job.size).unwrap_or(i64::MAX),
            // Never follow a descriptor's alternate locations (CVE-2020-15157).
            urls: None,
            annotations: None,
        };
        let stream = self
            .within_deadline(self.client.pull_blob_stream(&self.image, &descriptor))
            .ok_or_else(|| io::Error::other(Failure::Deadline))?
            .map_err(|e| io::Error::other(Failure::Request(e)))?;
        Ok(BlobReader {
            puller: self,
            stream,
            chunk: Vec::new(),
            pos: 0,
            got: 0,
        })
    }

    /// Turns the store's "fetch blob" I/O error back into what the registry did.
    fn fetch_error(&self, e: Error, job: &Job) -> Error {
        let Error::Io { op, path, source } = e else {
            return e;
        };
        if op != "fetch blob" || !source.get_ref().is_some_and(|i| i.is::<Failure>()) {
            return Error::Io { op, path, source };
        }
        let failure = source
            .into_inner()
            .and_then(|inner| inner.downcast::<Failure>().ok());
        match failure.map(|b| *b) {
            Some(Failure::Deadline) => self.deadline_error(),
            Some(Failure::Request(e)) => match self.classify(e) {
                // The manifest was found; what is missing is one of its blobs.
                Error::NotInRegistry { .. } => self.registry_error(format!(
                    "blob {} of image {} not found (the manifest names it, the registry does not have it)",
                    job.digest, self.canonical
                )),
                other => other,
            },
            Some(Failure::Body { source, got }) => {
                if find::<reqwest::Error>(&source).is_some_and(|r| r.is_timeout()) {
                    self.stall_error()
                } else {
                    Error::Truncated {
                        digest: job.digest.clone(),
                        expected: job.size,
                        got,
                    }
                }
            }
            None => Error::Registry {
                registry: self.registry.clone(),
                message: "blob download failed".into(),
            },
        }
    }

    /// Runs `f` on the runtime, within the whole pull's deadline.
    fn block<T>(&self, f: impl Future<Output = Result<T, OciDistributionError>>) -> Result<T, Error> {
        match self.within_deadline(f) {
            None => Err(self.deadline_error()),
            Some(r) => r.map_err(|e| self.classify(e)),
        }
    }

    /// Runs `f` on the runtime; `None` when the whole pull's deadline passes first.
    fn within_deadline<T>(&self, f: impl Future<Output = T>) -> Option<T> {
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        // The timer is made inside the runtime (it needs the runtime's clock).
        self.runtime
            .block_on(async { tokio::time::timeout(remaining, f).await })
            .ok()
    }

    /// One line for what oci-client reported.
    fn classify(&self, e: OciDistributionError) -> Error {
        match e {
            OciDistributionError::RegistryError { envelope, .. } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::BlobUnknown
                            | OciErrorCode::NotFound
                    )
                }) {
                    self.not_found()
                } else if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    self.unauthorized(None)
                } else {
                    let messages: Vec<String> = envelope
                        .errors
                        .iter()
                        .map(|e| format!("{:?}: {}", e.code, e.message))
                        .collect();
                    self.registry_error(messages.join("; "))
                }
            }
            OciDistributionError::ServerError { code, message, .. } => match code {
                404 => self.not_found(),
                401 | 403 => self.unauthorized(None),
                _ => self.registry_error(format!("HTTP {code}: {}", short(&message))),
            },
            OciDistributionError::UnauthorizedError { .. } => self.unauthorized(None),
            OciDistributionError::AuthenticationFailure(reason) => self.unauthorized(Some(&reason)),
            OciDistributionError::RequestError(r) => self.classify_request(&r),
            OciDistributionError::DigestError(DigestError::VerificationError { expected, actual }) => {
                match (expected.parse(), actual.parse()) {
                    (Ok(expected), Ok(actual)) => Error::DigestMismatch { expected, actual },
                    _ => self.registry_error(format!("digest mismatch: expected {expected}, got {actual}")),
                }
            }
            other => self.registry_error(chain(&other)),
        }
    }

    fn classify_request(&self, r: &reqwest::Error) -> Error {
        if r.is_timeout() {
            return self.stall_error();
        }
        if let Some(status) = r.status() {
            return match status.as_u16() {
                404 => self.not_found(),
                401 | 403 => self.unauthorized(None),
                code => self.registry_error(format!("HTTP {code}")),
            };
        }
        if r.is_connect() {
            let refused = find::<io::Error>(r).is_some_and(|e| e.kind() == io::ErrorKind::ConnectionRefused);
            if refused {
                return Error::RegistryUnreachable {
                    registry: self.registry.clone(),
                    reason: "connection refused".into(),
                };
            }
            if !self.insecure && r.url().is_some_and(|u| u.scheme() == "https") && mentions_tls(r) {
                return Error::InsecureRefused {
                    registry: self.registry.clone(),
                    reason: chain(r),
                };
            }
            return Error::RegistryUnreachable {
                registry: self.registry.clone(),
                reason: chain(r),
            };
        }
        self.registry_error(chain(r))
    }

    fn not_found(&self) -> Error {
        Error::NotInRegistry {
            image: self.canonical.clone(),
            registry: self.registry.clone(),
        }
    }

    fn unauthorized(&self, reason: Option<&str>) -> Error {
        Error::Unauthorized {
            registry: self.registry.clone(),
            image: self.canonical.clone(),
            tried: match reason {
                Some(r) => format!("{}; the token service said: {}", self.tried, short(r)),
                None => self.tried.clone(),
            },
        }
    }

    fn registry_error(&self, message: String) -> Error {
        Error::Registry {
            registry: self.registry.clone(),
            message,
        }
    }

    fn deadline_error(&self) -> Error {
        Error::RegistryTimeout {
            registry: self.registry.clone(),
            seconds: self.options.timeout.as_secs_f64(),
            what: "the whole pull's timeout",
        }
    }

    fn stall_error(&self) -> Error {
        Error::RegistryTimeout {
            registry: self.registry.clone(),
            seconds: self.options.stall_timeout.as_secs_f64(),
            what: "no answer within the per-request stall timeout",
        }
    }

    fn invalid(&self, reason: impl std::fmt::Display) -> Error {
        Error::InvalidManifest {
            image: self.canonical.clone(),
            reason: reason.to_string(),
        }
    }
}

/// A blob's download as a `Read` for [`Store::ensure_blob`]: each read waits (within the
/// deadline) for the next chunk of the response body.
struct BlobReader<'a> {
    puller: &'a Puller<'a>,
    stream: SizedStream,
    /// The chunk being handed out, and how far.
    chunk: Vec<u8>,
    pos: usize,
    /// Bytes handed out so far.
    got: u64,
}

impl Read for BlobReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.chunk.len() {
            match self.puller.within_deadline(self.stream.next()) {
                None => return Err(io::Error::other(Failure::Deadline)),
                Some(None) => return Ok(0),
                Some(Some(Ok(bytes))) => {
                    self.chunk.clear();
                    self.chunk.extend_from_slice(&bytes);
                    self.pos = 0;
                }
                // oci-client's own check of the digest at the end of the body: end the
                // stream here and let the store check it too, reporting both digests.
                Some(Some(Err(e))) if e.get_ref().is_some_and(|i| i.is::<DigestError>()) => return Ok(0),
                Some(Some(Err(source))) => {
                    return Err(io::Error::other(Failure::Body {
                        source,
                        got: self.got,
                    }));
                }
            }
        }
        let n = out.len().min(self.chunk.len() - self.pos);
        out[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        self.got += n as u64;
        Ok(n)
    }
}

fn parse_json(image: &str, bytes: &[u8]) -> Result<serde_json::Value, Error> {
    let invalid = |reason: String| Error::InvalidManifest {
        image: image.to_owned(),
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| invalid(format!("manifest is not JSON: {e}")))?;
    match value.get("schemaVersion").and_then(|v| v.as_i64()) {
        Some(2) => Ok(value),
        Some(v) => Err(invalid(format!(
            "manifest schema version {v} is not supported (only 2)"
        ))),
        None => Err(invalid("manifest has no schemaVersion".into())),
    }
}

/// Whether a (schema 2) manifest is an index / manifest list rather than an image manifest.
fn is_index(manifest: &serde_json::Value) -> bool {
    match manifest.get("mediaType").and_then(|m| m.as_str()) {
        Some(mt) => mt == OCI_IMAGE_INDEX_MEDIA_TYPE || mt == IMAGE_MANIFEST_LIST_MEDIA_TYPE,
        None => manifest.get("manifests").is_some(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The first error of type `T` in `e`'s source chain (including `e`).
fn find<'e, T: StdError + 'static>(e: &'e (dyn StdError + 'static)) -> Option<&'e T> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<T>() {
            return Some(t);
        }
        cur = err.source();
    }
    None
}

/// `e` and its sources, `: `-separated, each message once.
fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(e);
    while let Some(err) = cur {
        let s = err.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cur = err.source();
    }
    short(&parts.join(": "))
}

/// Whether a connection error came from the TLS handshake (as when HTTPS meets a plain
/// HTTP server).
fn mentions_tls(e: &(dyn StdError + 'static)) -> bool {
    let text = chain(e).to_ascii_lowercase();
    [
        "tls",
        "ssl",
        "certificate",
        "handshake",
        "corrupt message",
        "invalidcontenttype",
    ]
    .iter()
    .any(|w| text.contains(w))
}

/// At most 300 characters of a registry's message.
fn short(s: &str) -> String {
    const MAX: usize = 300;
    let s = s.trim();
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}
