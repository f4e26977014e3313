//! Registry credentials: explicit, or from a docker config file's `auths` map.
//!
//! Only the `auths` entries are read (`auth`: base64 of `user:password`, or `username` and
//! `password`); credential helpers (`credsStore`, `credHelpers`) are not run.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

use crate::Error;

/// The largest docker config file read (they hold a few short entries).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Where a pull's registry credentials come from.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// None: anonymous pulls only.
    Anonymous,
    /// A docker config file's `auths` map: this file, or (`None`)
    /// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`. A missing file means no
    /// credentials.
    DockerConfig(Option<PathBuf>),
    /// This user and password, for whichever registry the image is on.
    Basic {
        /// User name.
        username: String,
        /// Password or token.
        password: String,
    },
}

impl Default for Credentials {
    fn default() -> Self {
        Self::DockerConfig(None)
    }
}

impl std::fmt::Debug for Credentials {
    // By hand, so that a password never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Anonymous => f.write_str("Anonymous"),
            Self::DockerConfig(p) => f.debug_tuple("DockerConfig").field(p).finish(),
            Self::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
        }
    }
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

/// The credentials to use for `registry` (as written in the reference, e.g. `docker.io`,
/// `localhost:5000`), and a description of them (never the password) for error messages.
pub(crate) fn resolve(creds: &Credentials, registry: &str) -> Result<(RegistryAuth, String), Error> {
    match creds {
        Credentials::Anonymous => Ok((RegistryAuth::Anonymous, "no credentials".into())),
        Credentials::Basic { username, password } => Ok((
            RegistryAuth::Basic(username.clone(), password.clone()),
            format!("user {username:?} given explicitly"),
        )),
        Credentials::DockerConfig(path) => {
            let Some(path) = path.clone().or_else(default_config_path) else {
                return Ok((
                    RegistryAuth::Anonymous,
                    "no credentials (no docker config found)".into(),
                ));
            };
            from_config_file(&path, registry)
        }
    }
}

fn default_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json"))
}

fn from_config_file(path: &Path, registry: &str) -> Result<(RegistryAuth, String), Error> {
    let bad = |reason: String| Error::Credentials {
        path: path.to_owned(),
        reason,
    };
    let text = match fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok((
                RegistryAuth::Anonymous,
                format!("no credentials ({} does not exist)", path.display()),
            ));
        }
        Err(e) => return Err(bad(e.to_string())),
        Ok(md) if md.len() > MAX_CONFIG_BYTES => {
            return Err(bad(format!("larger than {MAX_CONFIG_BYTES} bytes")));
        }
        Ok(_) => fs::read_to_string(path).map_err(|e| bad(e.to_string()))?,
    };
    let config: DockerConfig = serde_json::from_str(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let want = normalize(registry);
    let Some(entry) = config
        .auths
        .iter()
        .find(|(key, _)| normalize(key) == want)
        .map(|(_, e)| e)
    else {
        return Ok((
            RegistryAuth::Anonymous,
            format!("no credentials (none for {registry} in {})", path.display()),
        ));
    };
    let (user, password) = match (&entry.auth, &entry.username, &entry.password) {
        (Some(auth), _, _) if !auth.is_empty() => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|e| bad(format!("auth of {registry} is not base64: {e}")))?;
            let decoded =
                String::from_utf8(decoded).map_err(|_| bad(format!("auth of {registry} is not UTF-8")))?;
            let (u, p) = decoded
                .split_once(':')
                .ok_or_else(|| bad(format!("auth of {registry} is not user:password")))?;
            (u.to_owned(), p.to_owned())
        }
        (_, Some(u), Some(p)) => (u.clone(), p.clone()),
        _ => {
            return Err(bad(format!(
                "entry for {registry} has neither auth nor username and password"
            )));
        }
    };
    let described = format!("user {user:?} from {}", path.display());
    Ok((RegistryAuth::Basic(user, password), described))
}

/// A registry key as docker writes them (`https://index.docker.io/v1/`, `host:port`,
/// `http://host:port/`) reduced to the host[:port] a reference names.
fn normalize(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => "docker.io".into(),
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(a: &RegistryAuth) -> (String, String) {
        match a {
            RegistryAuth::Basic(u, p) => (u.clone(), p.clone()),
            _ => panic!("not basic"),
        }
    }

    #[test]
    fn docker_config_auths_are_matched_by_host() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let b64 = base64::engine::general_purpose::STANDARD.encode("alice:s3cret:x");
        fs::write(
            &path,
            format!(
                r#"{{"auths": {{"https://index.docker.io/v1/": {{"auth": "{b64}"}},
                    "localhost:5000": {{"username": "bob", "password": "pw"}}}},
                   "credsStore": "desktop"}}"#
            ),
        )
        .unwrap();
        let c = Credentials::DockerConfig(Some(path.clone()));
        let (a, d) = resolve(&c, "docker.io").unwrap();
        assert_eq!(basic(&a), ("alice".into(), "s3cret:x".into()));
        assert!(d.contains("alice") && !d.contains("s3cret"), "{d}");
        assert_eq!(
            basic(&resolve(&c, "localhost:5000").unwrap().0),
            ("bob".into(), "pw".into())
        );
        let (a, d) = resolve(&c, "ghcr.io").unwrap();
        assert!(matches!(a, RegistryAuth::Anonymous));
        assert!(d.contains("none for ghcr.io"), "{d}");
    }

    #[test]
    fn missing_file_is_anonymous_and_bad_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Credentials::DockerConfig(Some(dir.path().join("nope.json")));
        assert!(matches!(
            resolve(&missing, "x").unwrap().0,
            RegistryAuth::Anonymous
        ));
        let path = dir.path().join("config.json");
        fs::write(&path, "{not json").unwrap();
        let err = resolve(&Credentials::DockerConfig(Some(path)), "x").unwrap_err();
        assert!(err.to_string().contains("invalid JSON"), "{err}");
    }

    #[test]
    fn debug_hides_the_password() {
        let c = Credentials::Basic {
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
