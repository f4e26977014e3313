//! airlock's image store: the part of running OCI images that needs no network.
//!
//! - [`Store`]: a content-addressed directory. Blobs are kept under `blobs/sha256/<hex>`,
//!   each written to a temporary file in the store, hashed while written, and renamed into
//!   place only once its sha256 (and its declared size, when known) matched: a blob whose
//!   bytes are wrong, short or too long is refused with an error naming both digests or
//!   sizes, and leaves nothing behind.
//! - [`Store::unpack_layer`]: a layer blob (plain, gzip or zstd tar) unpacked once per
//!   digest into `layers/sha256/<hex>/`, in a temporary directory renamed into place when
//!   every entry was accepted. Each path is created component by component from directory
//!   descriptors with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` and `O_NOFOLLOW`, so
//!   no symlink, earlier or in the archive, can redirect a write outside the layer. Entries
//!   with absolute paths, `..`, a path through a symlink, or a hard link to anything but an
//!   earlier file of the same layer refuse the whole layer ([`Error::UnsafeEntry`] names
//!   the entry). Device nodes and FIFOs are dropped; setuid, setgid and sticky bits are
//!   cleared; every file is owned by the store's [`Owner`] (root by default), never the
//!   archive's uids. Symlinks are kept with whatever target text they have. OCI whiteouts
//!   are kept as the files they are, for [`Store::flatten`] to apply.
//! - [`Store::flatten`]: the layers of an image applied in order into one new tree,
//!   whiteouts (`.wh.<name>`) and opaque directories (`.wh..wh..opq`) honoured, hard links
//!   within a layer kept.
//! - Sharing: an exclusive `flock` on `<root>/lock` serialises commits, removals and
//!   prunes across processes; a per-digest `flock` makes two threads or processes that want
//!   the same blob or layer do the work once (the second waits and finds it there).
//! - A disk budget ([`StoreOptions::max_bytes`]) over blobs plus unpacked layers: a write
//!   that would exceed it is refused ([`Error::OverBudget`] names the budget and the size),
//!   a stream as soon as it passes it, and nothing half-stored remains. [`Store::prune`]
//!   removes what the caller does not name as kept, and work in progress that a crashed
//!   process left behind.
//! - [`pull`]: an image (linux/amd64) fetched from an OCI registry with `oci-client` into
//!   the store: manifest, config and layers as verified blobs, layers unpacked; see
//!   [`PullOptions`] for insecure registries, credentials and timeouts.
//! - [`manifest`]: the JSON documents of an image (OCI index and Docker manifest list,
//!   OCI and Docker schema 2 manifests, image config), bounded in size, and the config
//!   turned into [`airlock_spec::ImageConfig`].
//! - Image records ([`Store::tag`], [`Store::images`], [`Store::image`], [`Store::untag`],
//!   [`Store::remove_image`], [`Store::prune_images`]): names bound to manifest digests in
//!   `<root>/images.json`, surviving restarts; an [`Image`] is read from its stored
//!   manifest and config.
//! - [`Store::import`]: `docker save` archives and OCI image layouts (a directory or a
//!   tar), every blob verified, member paths checked, nothing left behind on failure.
//! - [`Store::image_root`]: an image's prepared root, flattened once per manifest digest under
//!   `<root>/roots/sha256/<hex>/`, with airlock's mount points ([`ROOT_MOUNT_DIRS`],
//!   [`ROOT_MOUNT_FILES`]), modes readable by the sandbox user, files hard-linked to the
//!   layers where that changes no layer file.
//!
//! Not restored from archives: extended attributes (so no file capabilities), the
//! archive's uids and gids, sub-second timestamps. Modification times are kept (Python
//! trusts a `.pyc` only while its source's mtime matches the one it recorded). Trees from [`Store::flatten`] are written outside the
//! store and are not counted in its budget; prepared roots are inside it and are.
//!
//! Unpacking needs to be able to `chown` to the configured owner (root, or the owner being
//! the process's own uid).
//!
//! ```no_run
//! use airlock_image::{Digest, Store, StoreOptions};
//!
//! # fn main() -> Result<(), airlock_image::Error> {
//! let store = Store::open("/var/lib/airlock/images", StoreOptions::default())?;
//! let layer: Digest = "sha256:4f2a…".parse()?;
//! store.ensure_blob(&layer, Some(1234), || std::fs::File::open("layer.tar.gz"))?;
//! store.unpack_layer(&layer, Some("application/vnd.oci.image.layer.v1.tar+gzip"))?;
//! store.flatten(&[layer], std::path::Path::new("/var/lib/airlock/roots/img"))?;
//! # Ok(())
//! # }
//! ```
//!
//! Importing an image and preparing its root for a sandbox:
//!
//! ```no_run
//! use airlock_image::{Store, StoreOptions};
//!
//! # fn main() -> Result<(), airlock_image::Error> {
//! let store = Store::open("/var/lib/airlock/images", StoreOptions::default())?;
//! store.import("busybox.tar".as_ref(), Some("docker.io/library/busybox:latest"))?;
//! let image = store.image("docker.io/library/busybox:latest")?;
//! let root = store.image_root(&image)?; // <store>/roots/sha256/<hex>/, built once
//! println!("{} runs {:?} in {}", image.name, image.config.default_command(), root.display());
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod catalog;
mod digest;
mod error;
mod flatten;
mod fsutil;
mod import;
pub mod manifest;
mod owner;
mod reference;
mod registry;
mod root;
mod store;
mod unpack;

pub use catalog::{Image, MIN_DIGEST_PREFIX, resolve, validate_name};
pub use digest::Digest;
pub use error::Error;
pub use owner::Owner;
pub use reference::canonical_reference;
pub use registry::{Credentials, PullOptions, Pulled, pull};
pub use root::{ROOT_MOUNT_DIRS, ROOT_MOUNT_FILES, RootStatus};
pub use store::{BlobStatus, DEFAULT_ROOT, LayerStatus, PruneReport, Store, StoreOptions};
pub use unpack::{Compression, MAX_ENTRIES, UnpackReport};
