//! Image references with Docker Hub's conventions, parsed by `oci_client::Reference`:
//! `python:3.12-slim` is `docker.io/library/python:3.12-slim`, a reference without tag or
//! digest means `:latest`, `localhost:5000/x/y@sha256:…` names a registry by host and port.

use oci_client::Reference;

use crate::Error;

/// The longest reference accepted (the distribution spec caps names at 255 characters; a
/// tag adds up to 128 and a digest 71).
const MAX_REFERENCE_LEN: usize = 512;

/// Parses `reference`, refusing what a registry could not be asked for.
pub(crate) fn parse(reference: &str) -> Result<Reference, Error> {
    let invalid = |reason: String| Error::InvalidReference {
        reference: reference.to_owned(),
        reason,
    };
    if reference.len() > MAX_REFERENCE_LEN {
        return Err(invalid(format!("longer than {MAX_REFERENCE_LEN} characters")));
    }
    if reference.trim() != reference || reference.is_empty() {
        return Err(invalid("empty, or has surrounding whitespace".into()));
    }
    let parsed = Reference::try_from(reference).map_err(|e| {
        let name = reference.split('@').next().unwrap_or(reference);
        let name = match (name.rfind(':'), name.rfind('/')) {
            (Some(colon), slash) if slash.is_none_or(|s| colon > s) => &name[..colon],
            _ => name,
        };
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            invalid("repository name must be lowercase".into())
        } else {
            invalid(e.to_string())
        }
    })?;
    if let Some(d) = parsed.digest() {
        d.parse::<crate::Digest>()
            .map_err(|_| invalid(format!("digest {d} is not sha256:<64 lowercase hex digits>")))?;
    }
    Ok(parsed)
}

/// The canonical full name of `reference`: registry, repository, and tag and/or digest,
/// with Docker Hub's defaults filled in (`python` → `docker.io/library/python:latest`).
pub fn canonical_reference(reference: &str) -> Result<String, Error> {
    Ok(parse(reference)?.whole())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_hub_defaults_are_filled_in() {
        assert_eq!(
            canonical_reference("python:3.12-slim").unwrap(),
            "docker.io/library/python:3.12-slim"
        );
        assert_eq!(
            canonical_reference("busybox").unwrap(),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(
            canonical_reference("someone/tool:1").unwrap(),
            "docker.io/someone/tool:1"
        );
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            canonical_reference(&format!("localhost:5000/x/y@{d}")).unwrap(),
            format!("localhost:5000/x/y@{d}")
        );
        assert_eq!(
            canonical_reference("ghcr.io/org/img:v1").unwrap(),
            "ghcr.io/org/img:v1"
        );
    }

    #[test]
    fn invalid_references_name_the_reference_and_the_problem() {
        for (bad, why) in [
            ("", "empty"),
            ("Python:3", "lowercase"),
            ("python:bad tag", "invalid"),
            ("x@sha256:abc", "invalid reference format"),
        ] {
            let err = canonical_reference(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }
}
