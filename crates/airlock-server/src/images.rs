//! A request's `image`, resolved against the image store: the prepared root a tier builds
//! the sandbox on, and the image's config merged under the request
//! ([`Spec::apply_image_config`]). Shared by the service and `airlock run`.

use airlock_backend::{Error, ImageRoot};
use airlock_image::{Image, Store};
use airlock_spec::{ImageConfig, Spec, SpecError};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// An image ready to run: its root and what its config says.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The prepared root and the manifest digest (what pools compare).
    pub root: ImageRoot,
    /// The image's config.
    pub config: ImageConfig,
    /// The name it is recorded under.
    pub name: String,
}

impl Resolved {
    /// Merges the image's config under `spec` (its Env under the request's; its command
    /// when the request gives none) and validates the result.
    pub fn apply(&self, spec: &mut Spec) -> Result<(), Error> {
        spec.apply_image_config(&self.config)?;
        spec.validate()?;
        Ok(())
    }
}

/// The image `reference` names in `store`, its root prepared (built on first use: this
/// blocks for as long as flattening takes, so async callers call it off their threads).
/// An image the store does not hold, or a service without a store, is an invalid
/// request naming `image`.
pub fn resolve(store: Option<&Store>, reference: &str) -> Result<Resolved, Error> {
    let Some(store) = store else {
        return Err(invalid(
            "this service has no image store (airlock serve --image-store DIR)",
        ));
    };
    let image = airlock_image::resolve(store, reference).map_err(|e| lookup_error(reference, e))?;
    prepare(store, &image)
}

/// `image` (found in `store`) ready to run: its root prepared (built on first use).
pub fn prepare(store: &Store, image: &Image) -> Result<Resolved, Error> {
    reachable(store.root()).map_err(|e| Error::host("the image store", e))?;
    let root = store
        .image_root(image)
        .map_err(|e| Error::host(format!("preparing the root of image {}", image.name), e))?;
    Ok(Resolved {
        root: ImageRoot {
            digest: image.manifest_digest.to_string(),
            root,
        },
        config: image.config.clone(),
        name: image.name.clone(),
    })
}

/// Resolves `spec.image` (if any) and merges its config into `spec`.
pub fn resolve_spec(store: Option<&Store>, spec: &mut Spec) -> Result<Option<Resolved>, Error> {
    let Some(reference) = spec.image.clone() else {
        return Ok(None);
    };
    let resolved = resolve(store, &reference)?;
    resolved.apply(spec)?;
    Ok(Some(resolved))
}

/// Checks that sandboxes can reach roots below `store_root`: a sandbox's own root user
/// (not the host's) opens the prepared root by its path, so every directory above it must
/// be searchable by others. A store below a private directory (a 0700 home or temporary
/// directory) is refused with the directory to fix, rather than failing in each sandbox.
pub fn reachable(store_root: &Path) -> Result<(), String> {
    let mut dir = store_root;
    loop {
        let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o001 == 0 {
            return Err(format!(
                "{} (mode {mode:04o}) is not searchable by others, so sandboxes cannot reach the image store {} below it: give it o+x, or use an --image-store whose parent directories are searchable",
                dir.display(),
                store_root.display()
            ));
        }
        match dir.parent() {
            Some(parent) => dir = parent,
            None => return Ok(()),
        }
    }
}

fn invalid(message: impl Into<String>) -> Error {
    Error::Invalid(SpecError::new("image", message))
}

/// Lookup failures the caller can fix are invalid requests on `image`; the rest are the
/// host's.
fn lookup_error(reference: &str, e: airlock_image::Error) -> Error {
    use airlock_image::Error as E;
    match e {
        E::ImageNotFound(_) => invalid(format!(
            "{reference:?} is not in the image store; pull or import it first (airlock image pull {reference})"
        )),
        E::AmbiguousImage { .. } | E::InvalidName { .. } | E::InvalidReference { .. } => {
            invalid(e.to_string())
        }
        E::ImageIncomplete { .. } => invalid(format!("{reference:?}: {e}")),
        other => Error::host(format!("looking up image {reference:?}"), other),
    }
}
