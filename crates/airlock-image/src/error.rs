//! The crate's one error type: every variant names what failed and on what.

use std::io;
use std::path::PathBuf;

use crate::Digest;

/// Why a store, unpack or flatten operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A string that is not `sha256:` followed by 64 lowercase hex digits.
    #[error("invalid digest {0:?}: expected sha256:<64 lowercase hex digits>")]
    InvalidDigest(String),
    /// A blob's content hashes to another digest than the one it was stored under.
    #[error("blob digest mismatch: expected {expected}, content is {actual}")]
    DigestMismatch {
        /// The digest the caller asked for.
        expected: Digest,
        /// The digest of the bytes received.
        actual: Digest,
    },
    /// The stream ended before the blob's declared size.
    #[error("blob {digest} truncated: expected {expected} bytes, got {got}")]
    Truncated {
        /// The blob.
        digest: Digest,
        /// The size its descriptor declared.
        expected: u64,
        /// The bytes that arrived.
        got: u64,
    },
    /// The stream went on past the blob's declared size.
    #[error("blob {digest} longer than its declared {expected} bytes")]
    TooLong {
        /// The blob.
        digest: Digest,
        /// The size its descriptor declared.
        expected: u64,
    },
    /// Storing this would take the store past its disk budget.
    #[error("image store budget of {budget} bytes exceeded: {usage} bytes in use, {size} more needed")]
    OverBudget {
        /// The store's `max_bytes`.
        budget: u64,
        /// Bytes in the store before this write.
        usage: u64,
        /// Bytes this write needed (at least; a stream is cut off as soon as it is over).
        size: u64,
    },
    /// The blob is not in the store.
    #[error("blob {0} is not in the store")]
    BlobMissing(Digest),
    /// The layer has not been unpacked.
    #[error("layer {0} is not unpacked in the store")]
    LayerMissing(Digest),
    /// A tar entry would land outside the layer root or go through a symlink.
    #[error("layer {layer}: entry {entry:?} refused: {reason}")]
    UnsafeEntry {
        /// The layer.
        layer: Digest,
        /// The entry's path as written in the archive.
        entry: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A tar entry of a kind the unpacker does not handle (e.g. GNU sparse files).
    #[error("layer {layer}: entry {entry:?} has unsupported type {kind}")]
    UnsupportedEntry {
        /// The layer.
        layer: Digest,
        /// The entry's path as written in the archive.
        entry: String,
        /// The tar type flag.
        kind: String,
    },
    /// The layer archive could not be read (corrupt tar or compressed stream).
    #[error("layer {layer}: cannot read archive")]
    Archive {
        /// The layer.
        layer: Digest,
        /// The decoder's or tar reader's error.
        #[source]
        source: io::Error,
    },
    /// `flatten`'s destination already exists.
    #[error("flatten destination {0} already exists")]
    DestinationExists(PathBuf),
    /// An image reference that does not parse (`registry/repository[:tag][@digest]`).
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference {
        /// The reference as given.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The registry answered 404 for the image's repository, tag or digest.
    #[error("image {image} not found in registry {registry}")]
    NotInRegistry {
        /// The canonical reference.
        image: String,
        /// The registry host.
        registry: String,
    },
    /// The registry refused the credentials, or wanted some and none were given.
    #[error(
        "registry {registry} refused access to {image} ({tried}): log in to it (docker login {registry}) or pass credentials"
    )]
    Unauthorized {
        /// The registry host.
        registry: String,
        /// The canonical reference.
        image: String,
        /// Which credentials were tried.
        tried: String,
    },
    /// The registry could not be connected to (refused, no route, DNS).
    #[error("registry {registry} unreachable: {reason}")]
    RegistryUnreachable {
        /// The registry host.
        registry: String,
        /// The connection error.
        reason: String,
    },
    /// HTTPS to a registry failed; plain HTTP is only tried for registries marked insecure.
    #[error(
        "registry {registry}: HTTPS connection failed ({reason}); plain HTTP is used only for registries marked insecure"
    )]
    InsecureRefused {
        /// The registry host.
        registry: String,
        /// The TLS error.
        reason: String,
    },
    /// The registry stopped answering for longer than a timeout allows.
    #[error("registry {registry} timed out after {seconds} s ({what})")]
    RegistryTimeout {
        /// The registry host.
        registry: String,
        /// The timeout that expired, in seconds.
        seconds: f64,
        /// Which timeout: the whole pull's, or one request's stall limit.
        what: &'static str,
    },
    /// Any other answer from a registry that is not what the protocol says.
    #[error("registry {registry}: {message}")]
    Registry {
        /// The registry host.
        registry: String,
        /// What it answered.
        message: String,
    },
    /// A manifest or index that cannot be used.
    #[error("image {image}: {reason}")]
    InvalidManifest {
        /// The canonical reference.
        image: String,
        /// What is wrong.
        reason: String,
    },
    /// An index without a linux/amd64 manifest.
    #[error("image {image} has no linux/amd64 manifest; its index lists: {available}")]
    PlatformMissing {
        /// The canonical reference.
        image: String,
        /// The platforms the index lists.
        available: String,
    },
    /// A layer (or manifest) of a media type airlock does not unpack.
    #[error("image {image}: layer {digest} has unsupported media type {media_type}")]
    UnsupportedMediaType {
        /// The canonical reference.
        image: String,
        /// The layer's digest.
        digest: String,
        /// Its media type.
        media_type: String,
    },
    /// The docker config file with registry credentials could not be read.
    #[error("registry credentials {path}: {reason}")]
    Credentials {
        /// The config file.
        path: PathBuf,
        /// Why it could not be used.
        reason: String,
    },
    /// A manifest, index or config that cannot be used.
    #[error("invalid {what}: {reason}")]
    InvalidDocument {
        /// Which document (e.g. `manifest sha256:…`, `index.json`).
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No image record matches the name or digest.
    #[error("image {0:?} is not in the store: pull or import it first")]
    ImageNotFound(String),
    /// A digest prefix that more than one image record matches.
    #[error("image {prefix:?} is ambiguous: {matches} images match; give more of the digest")]
    AmbiguousImage {
        /// The prefix given.
        prefix: String,
        /// How many records matched.
        matches: usize,
    },
    /// A string that cannot name an image.
    #[error("invalid image name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// An image cannot be recorded or used because a part of it is not in the store.
    #[error("image {manifest}: {missing}: pull or import it again")]
    ImageIncomplete {
        /// The image's manifest digest.
        manifest: Digest,
        /// What is missing (e.g. `layer 2 of 3 sha256:… is not unpacked`).
        missing: String,
    },
    /// An image archive or OCI layout that cannot be imported.
    #[error("import {path}: {reason}")]
    Import {
        /// The archive or directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A filesystem operation failed.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Shorthand for [`Error::Io`] in `map_err`.
pub(crate) fn io_err(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { op, path, source }
}
