//! The JSON documents of an image: OCI image index and Docker manifest list, OCI image
//! manifest and Docker schema 2 manifest, and the image configuration.
//!
//! OCI and Docker schema 2 share one JSON shape and differ only in their `mediaType`
//! strings, so one type reads both ([`Manifest`], [`Index`]); the media type is kept for
//! the caller to look at. Fields airlock does not use are ignored, unknown fields too.
//! (Written here rather than taken from the `oci-spec` crate: these few fields are all
//! airlock reads, and `oci-spec` brings builders and getters it does not need.)
//!
//! Every document is bounded by [`MAX_DOCUMENT_BYTES`] before it is parsed.

use std::collections::BTreeMap;

use airlock_spec::ImageConfig;
use serde::{Deserialize, Serialize};

use crate::{Digest, Error};

/// The largest manifest, index or config accepted. Real ones are a few KiB (a config with
/// a long history reaches ~100 KiB); the bound keeps a hostile archive or registry from
/// making the parser hold an arbitrary amount of memory. Registries use the same figure.
pub const MAX_DOCUMENT_BYTES: u64 = 4 * 1024 * 1024;

/// OCI image index.
pub const MEDIA_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// OCI image manifest.
pub const MEDIA_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image config.
pub const MEDIA_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// OCI uncompressed layer.
pub const MEDIA_OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
/// OCI gzip layer.
pub const MEDIA_OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// OCI zstd layer.
pub const MEDIA_OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
/// Docker manifest list (the index's Docker name).
pub const MEDIA_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Docker schema 2 manifest.
pub const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// The annotation an OCI layout's `index.json` names an image with.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// A content descriptor: what a manifest or index says about a blob it points to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// The blob's media type.
    pub media_type: String,
    /// The blob's digest (`sha256:` only).
    #[serde(with = "digest_serde")]
    pub digest: Digest,
    /// The blob's size in bytes.
    pub size: u64,
    /// For an index entry: the platform of the manifest it points to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    /// Annotations (an OCI layout names its images with [`ANNOTATION_REF_NAME`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The platform an index entry is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// CPU architecture (`amd64`, `arm64`, …).
    pub architecture: String,
    /// Operating system (`linux`).
    pub os: String,
    /// CPU variant (`v8`, …), when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// An OCI image index or a Docker manifest list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    /// Always 2.
    pub schema_version: u32,
    /// [`MEDIA_OCI_INDEX`] or [`MEDIA_DOCKER_LIST`] (optional in OCI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The manifests (or nested indexes) it lists.
    pub manifests: Vec<Descriptor>,
}

/// An OCI image manifest or a Docker schema 2 manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`MEDIA_OCI_MANIFEST`] or [`MEDIA_DOCKER_MANIFEST`] (optional in OCI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The image config blob.
    pub config: Descriptor,
    /// The layer blobs, lowest first.
    pub layers: Vec<Descriptor>,
}

/// The image configuration blob (`application/vnd.oci.image.config.v1+json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Config {
    /// CPU architecture the image is built for.
    #[serde(default)]
    pub architecture: String,
    /// Operating system the image is built for.
    #[serde(default)]
    pub os: String,
    /// When the image was created (RFC 3339), if said.
    #[serde(default)]
    pub created: Option<String>,
    /// How to run it.
    #[serde(default)]
    pub config: Option<RunConfig>,
    /// The layers' uncompressed digests.
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

/// `config` inside the image configuration: how to run the image.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    /// `NAME=value` entries.
    #[serde(default)]
    pub env: Option<Vec<String>>,
    /// Where the image's own command starts.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// The command's fixed prefix.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// The default arguments.
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// The user the image would run as (recorded, never applied).
    #[serde(default)]
    pub user: Option<String>,
}

/// `rootfs` inside the image configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct RootFs {
    /// Always `layers`.
    #[serde(default, rename = "type")]
    pub kind: String,
    /// The uncompressed digest of each layer, lowest first.
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// Whether a media type names an index (OCI index or Docker manifest list).
pub fn is_index_media_type(media_type: &str) -> bool {
    media_type == MEDIA_OCI_INDEX || media_type == MEDIA_DOCKER_LIST
}

/// Parses a JSON document of at most [`MAX_DOCUMENT_BYTES`]; `what` names it in errors.
fn parse<'a, T: Deserialize<'a>>(what: &str, bytes: &'a [u8]) -> Result<T, Error> {
    if bytes.len() as u64 > MAX_DOCUMENT_BYTES {
        return Err(Error::InvalidDocument {
            what: what.to_owned(),
            reason: format!(
                "{} bytes, more than the {MAX_DOCUMENT_BYTES}-byte limit",
                bytes.len()
            ),
        });
    }
    serde_json::from_slice(bytes).map_err(|e| Error::InvalidDocument {
        what: what.to_owned(),
        reason: e.to_string(),
    })
}

impl Index {
    /// Parses an index (or manifest list); `what` names it in errors.
    pub fn parse(what: &str, bytes: &[u8]) -> Result<Self, Error> {
        let index: Self = parse(what, bytes)?;
        if index.schema_version != 2 {
            return Err(Error::InvalidDocument {
                what: what.to_owned(),
                reason: format!("schemaVersion {} (expected 2)", index.schema_version),
            });
        }
        Ok(index)
    }
}

impl Manifest {
    /// Parses a manifest; `what` names it in errors. A schema 1 manifest or an index given
    /// where a manifest is expected is refused.
    pub fn parse(what: &str, bytes: &[u8]) -> Result<Self, Error> {
        let m: Self = parse(what, bytes)?;
        if m.schema_version != 2 {
            return Err(Error::InvalidDocument {
                what: what.to_owned(),
                reason: format!("schemaVersion {} (expected 2)", m.schema_version),
            });
        }
        if let Some(mt) = &m.media_type
            && mt != MEDIA_OCI_MANIFEST
            && mt != MEDIA_DOCKER_MANIFEST
        {
            return Err(Error::InvalidDocument {
                what: what.to_owned(),
                reason: format!("media type {mt:?} is not an image manifest"),
            });
        }
        for d in std::iter::once(&m.config).chain(&m.layers) {
            if d.size > i64::MAX as u64 {
                return Err(Error::InvalidDocument {
                    what: what.to_owned(),
                    reason: format!("descriptor {} declares an impossible size", d.digest),
                });
            }
        }
        Ok(m)
    }

    /// The sum of the layers' (stored) sizes.
    pub fn layers_size(&self) -> u64 {
        self.layers.iter().fold(0u64, |t, l| t.saturating_add(l.size))
    }
}

impl Config {
    /// Parses an image configuration; `what` names it in errors.
    pub fn parse(what: &str, bytes: &[u8]) -> Result<Self, Error> {
        parse(what, bytes)
    }

    /// The parts airlock uses, as [`ImageConfig`]; an `Env` entry that is not
    /// `NAME=value` is refused.
    pub fn image_config(&self, what: &str) -> Result<ImageConfig, Error> {
        let c = self.config.clone().unwrap_or_default();
        let env = ImageConfig::parse_env(&c.env.unwrap_or_default()).map_err(|e| Error::InvalidDocument {
            what: what.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(ImageConfig {
            env,
            working_dir: c.working_dir.filter(|d| !d.is_empty()),
            entrypoint: c.entrypoint.unwrap_or_default(),
            cmd: c.cmd.unwrap_or_default(),
            user: c.user.filter(|u| !u.is_empty()),
        })
    }
}

/// Digests as strings in JSON.
mod digest_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::Digest;

    pub(super) fn serialize<S: Serializer>(d: &Digest, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(d)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Digest, D::Error> {
        let s = String::deserialize(de)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOCKER_MANIFEST: &str = r#"{
      "schemaVersion": 2,
      "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
      "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 1469,
        "digest": "sha256:9d5226e6ce3fb6aee2822206a5ef85f38c303d2b37bfc894b419fca2c0501269"},
      "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": 2107098,
        "digest": "sha256:5758d4e389a3f662e94a85fb76143dbe338b64f8d2a65f45536a9663b05305ad"}]
    }"#;

    #[test]
    fn docker_schema2_and_oci_manifests_parse_alike() {
        let m = Manifest::parse("manifest", DOCKER_MANIFEST.as_bytes()).unwrap();
        assert_eq!(m.layers.len(), 1);
        assert_eq!(m.layers_size(), 2107098);
        let oci = DOCKER_MANIFEST
            .replace(MEDIA_DOCKER_MANIFEST, MEDIA_OCI_MANIFEST)
            .replace(
                "application/vnd.docker.image.rootfs.diff.tar.gzip",
                MEDIA_OCI_LAYER_GZIP,
            );
        assert_eq!(
            Manifest::parse("manifest", oci.as_bytes()).unwrap().layers[0].size,
            2107098
        );
        let list = DOCKER_MANIFEST.replace(MEDIA_DOCKER_MANIFEST, MEDIA_DOCKER_LIST);
        let err = Manifest::parse("manifest", list.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("is not an image manifest"), "{err}");
    }

    #[test]
    fn config_becomes_image_config() {
        let cfg = br#"{"architecture":"amd64","os":"linux","created":"2024-01-01T00:00:00Z",
          "config":{"Env":["PATH=/usr/bin","A=b=c"],"WorkingDir":"/app","Entrypoint":["sh"],
          "Cmd":["-c","true"],"User":"1000"},
          "rootfs":{"type":"layers","diff_ids":["sha256:aa"]}}"#;
        let c = Config::parse("config", cfg).unwrap();
        let ic = c.image_config("config").unwrap();
        assert_eq!(ic.env[1], ("A".to_string(), "b=c".to_string()));
        assert_eq!(ic.working_dir.as_deref(), Some("/app"));
        assert_eq!(ic.default_command(), ["sh", "-c", "true"]);
        assert_eq!(ic.user.as_deref(), Some("1000"));
        assert_eq!(c.rootfs.unwrap().diff_ids.len(), 1);
        // `config` may be absent or null.
        let bare = Config::parse("config", br#"{"config":null}"#).unwrap();
        assert_eq!(bare.image_config("config").unwrap(), ImageConfig::default());
    }

    #[test]
    fn oversized_and_malformed_documents_are_refused() {
        let big = vec![b' '; MAX_DOCUMENT_BYTES as usize + 1];
        assert!(
            Config::parse("config", &big)
                .unwrap_err()
                .to_string()
                .contains("limit")
        );
        let bad_digest = DOCKER_MANIFEST.replace("sha256:9d52", "sha512:9d52");
        assert!(Manifest::parse("manifest", bad_digest.as_bytes()).is_err());
        let bad_env = br#"{"config":{"Env":["NOEQUALS"]}}"#;
        let c = Config::parse("config", bad_env).unwrap();
        assert!(
            c.image_config("config")
                .unwrap_err()
                .to_string()
                .contains("NOEQUALS")
        );
    }
}
