//! The JSON the API speaks, and the one path from a request body to a validated `Spec`.
//! Unknown fields are rejected, naming the field; limits above the server's maxima get a
//! 400 naming the field and the maximum.

use airlock_spec::{ExecResult, FileSpec, Isolation, Limits, NetworkPolicy, Spec};
use base64::Engine as _;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

use crate::config::ServerConfig;
use crate::error::ApiError;

/// Per-request limits; each absent one takes the server's default.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    /// Memory cap in bytes.
    #[serde(default, deserialize_with = "integer")]
    pub memory_bytes: Option<u64>,
    /// CPU quota in cores.
    pub cpus: Option<f64>,
    /// Processes plus threads.
    #[serde(default, deserialize_with = "integer")]
    pub pids: Option<u32>,
    /// Wall-clock limit in milliseconds.
    #[serde(default, deserialize_with = "integer")]
    pub timeout_ms: Option<u64>,
    /// Writable tmpfs size in bytes.
    #[serde(default, deserialize_with = "integer")]
    pub disk_bytes: Option<u64>,
    /// Bytes kept per output stream.
    #[serde(default, deserialize_with = "integer")]
    pub output_bytes: Option<u64>,
}

/// A file placed in /workspace before the program starts.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileRequest {
    /// Path relative to /workspace.
    pub path: String,
    /// Content, in `encoding`.
    pub content: String,
    /// `utf8` (default) or `base64`.
    #[serde(default)]
    pub encoding: Encoding,
    /// Permission bits (default 0o644).
    #[serde(default, deserialize_with = "integer")]
    pub mode: Option<u32>,
}

/// How a file's content is encoded in JSON.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Text.
    #[default]
    Utf8,
    /// Bytes.
    Base64,
}

/// A language whose code is run by its interpreter.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// `python3 -c CODE`.
    Python,
    /// `node -e CODE`.
    Javascript,
    /// `bash -c CODE`.
    Bash,
}

/// `POST /v1/exec` and `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// argv (or give `language` and `code`).
    pub cmd: Option<Vec<String>>,
    /// The language of `code`.
    pub language: Option<Language>,
    /// Source code to run.
    pub code: Option<String>,
    /// What the program reads on stdin.
    pub stdin: Option<String>,
    /// Files to write first.
    #[serde(default, deserialize_with = "objects")]
    pub files: Vec<FileRequest>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Limits.
    #[serde(default, deserialize_with = "object")]
    pub limits: LimitsRequest,
    /// Network policy (`{"mode": "none"}`).
    #[serde(default, deserialize_with = "network")]
    pub network: Option<NetworkPolicy>,
    /// `namespaces` (default) or `microvm`; in a session, the session's.
    pub isolation: Option<Isolation>,
    /// An image from the service's image store to run in (`python:3.12-slim`,
    /// `sha256:…`); default: the host's system directories. In a session, the session's.
    pub image: Option<String>,
    /// Where the program starts: an absolute path that exists in the sandbox (default
    /// /workspace, or the image's WorkingDir when the image gives the command).
    pub workdir: Option<String>,
    /// In a session: start the program as a background process and answer at once (201,
    /// its process); it runs until it ends, `limits.timeout_ms` passes (only when given),
    /// or the session ends.
    #[serde(default)]
    pub background: bool,
    /// Where the result's `files_changed` looks: `"/workspace"` (the default), `"/tmp"`;
    /// `[]` for no changeset.
    pub files_changed_in: Option<Vec<String>>,
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    /// Lifetime in seconds.
    #[serde(default, deserialize_with = "integer")]
    pub ttl_s: Option<u64>,
    /// Limits for every exec (each exec may lower or raise them within the maxima; disk
    /// is fixed at creation).
    #[serde(default, deserialize_with = "object")]
    pub limits: LimitsRequest,
    /// Network policy.
    #[serde(default, deserialize_with = "network")]
    pub network: Option<NetworkPolicy>,
    /// `namespaces` (default) or `microvm`: every exec of the session runs in it.
    pub isolation: Option<Isolation>,
    /// An image from the service's image store: every exec of the session runs in it.
    pub image: Option<String>,
    /// A snapshot (`snap-…`) the session starts from: its files (and, for a full
    /// snapshot, its memory and processes), its image and isolation; its limits and
    /// network unless given here.
    pub from_snapshot: Option<String>,
    /// What happens when the session has had no request for `idle_timeout_s`: `none`
    /// (default) or `pause` (frozen until the next request that needs it).
    pub on_idle: Option<OnIdle>,
    /// Seconds without a request before `on_idle` applies (default 60).
    #[serde(default, deserialize_with = "integer")]
    pub idle_timeout_s: Option<u64>,
}

/// What an idle session does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnIdle {
    /// Nothing: it runs until deleted or expired.
    #[default]
    None,
    /// It pauses (frozen, no CPU) and resumes by itself at the next request that needs it.
    Pause,
}

impl OnIdle {
    /// Its name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            OnIdle::None => "none",
            OnIdle::Pause => "pause",
        }
    }
}

/// `POST /v1/sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// `auto` (default: `full` where the tier can, else `filesystem`), `filesystem` or
    /// `full`.
    pub kind: Option<SnapshotKindRequest>,
}

/// What a snapshot is asked to hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKindRequest {
    /// The most the tier can hold.
    #[default]
    Auto,
    /// The writable filesystem only.
    Filesystem,
    /// Memory, processes and files (gVisor and micro-VMs).
    Full,
}

/// `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many copies (1 to the server's `--max-fork`).
    #[serde(deserialize_with = "required_integer")]
    pub count: u64,
    /// Each copy's lifetime in seconds (default: the server's default TTL).
    #[serde(default, deserialize_with = "integer")]
    pub ttl_s: Option<u64>,
}

/// `POST /v1/sandboxes/{id}/restore`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// The snapshot to roll the session back to.
    pub snapshot_id: String,
}

/// The result of an exec: the CLI's `ExecResult` plus the time spent queued.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecResponse {
    /// Everything `airlock run --json` reports.
    #[serde(flatten)]
    pub result: ExecResult,
    /// Waiting for admission, in milliseconds.
    pub queue_ms: f64,
}

/// `n` as the request gave it (bytes or milliseconds) and, when different, in the unit
/// `show` picks: `2147483648 (2 GiB)`, `4500 ms`.
fn exact(show: fn(u64) -> String, n: u64) -> String {
    let human = show(n);
    if human.starts_with(&format!("{n} ")) {
        human
    } else {
        format!("{n} ({human})")
    }
}

/// An optional non-negative integer that JSON may spell `2998` or `2998.0`: JSON Schema
/// (and so the OpenAPI document) counts an integral number as an integer whatever its
/// spelling, and clients that compute sizes in floating point send them so.
pub(crate) fn integer<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    let value = n.as_u64().or_else(|| {
        let f = n.as_f64()?;
        // 2^64 is exact in f64; anything below it and integral converts exactly.
        (f.is_finite() && f.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&f))
            .then_some(f as u64)
    });
    let value = value.ok_or_else(|| D::Error::custom(format!("expected a non-negative integer, got {n}")))?;
    T::try_from(value)
        .map(Some)
        .map_err(|_| D::Error::custom(format!("{n} is too large")))
}

/// A required non-negative integer, spelled as [`integer`] allows.
fn required_integer<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    integer::<D, u64>(d)?.ok_or_else(|| D::Error::custom("expected a non-negative integer, got null"))
}

/// A struct from a JSON object only: serde's derive also builds one from an array of its
/// fields in order (`"limits": [null, null]`), which no schema allows.
fn object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    struct Fields<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Fields<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_map(Fields(std::marker::PhantomData))
}

/// A list of structs, each from a JSON object only (see [`object`]).
fn objects<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    struct Object<T>(T);
    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            object(d).map(Object)
        }
    }
    Ok(Vec::<Object<T>>::deserialize(d)?
        .into_iter()
        .map(|o| o.0)
        .collect())
}

/// An optional network policy, strict about unknown fields in every mode: serde does not
/// deny unknown fields beside the tag of a unit variant (`{"mode": "none", "x": 1}`).
fn network<'de, D: Deserializer<'de>>(d: D) -> Result<Option<NetworkPolicy>, D::Error> {
    let Some(mut value) = Option::<serde_json::Value>::deserialize(d)? else {
        return Ok(None);
    };
    // An integral number is an integer whatever its spelling (`6191.0`), as for every
    // other integer of the API (see `integer`).
    if let Some(t) = value.get_mut("approval_timeout_ms")
        && t.as_u64().is_none()
        && let Some(f) = t.as_f64()
        && f.fract() == 0.0
        && (0.0..18_446_744_073_709_551_616.0).contains(&f)
    {
        *t = serde_json::Value::from(f as u64);
    }
    if !value.is_object() {
        return Err(D::Error::custom(format!(
            "invalid type: {value}, expected a JSON object"
        )));
    }
    if value.get("mode").and_then(serde_json::Value::as_str) == Some("none")
        && let Some(extra) = value
            .as_object()
            .and_then(|o| o.keys().find(|k| k.as_str() != "mode"))
    {
        return Err(D::Error::custom(format!(
            "unknown field `{extra}` (mode none takes no other field)"
        )));
    }
    serde_json::from_value(value).map(Some).map_err(D::Error::custom)
}

/// The network policy's entries in the grammar the OpenAPI document gives (its patterns):
/// the egress proxy accepts more spellings (`0` for 0.0.0.0, as inet_aton reads it), which
/// a schema cannot describe and a reader could misread; the API takes these only.
pub fn check_network(network: Option<&NetworkPolicy>) -> Result<(), ApiError> {
    let Some(NetworkPolicy::Proxy(policy)) = network else {
        return Ok(());
    };
    check_proxy_policy(policy)
}

/// [`check_network`] for a proxy policy (a session's, after a change too).
pub fn check_proxy_policy(policy: &airlock_spec::ProxyPolicy) -> Result<(), ApiError> {
    let airlock_spec::ProxyPolicy {
        allow,
        allow_cidrs,
        deny,
        secrets,
        ..
    } = policy;
    for (i, entry) in allow.iter().enumerate() {
        check_allow_entry(entry).map_err(|why| {
            ApiError::invalid(
                format!("network.allow[{i}]"),
                format!(
                    "{entry:?} is not a host pattern ({why}); expected NAME, *.DOMAIN, an IPv4 address or [IPv6], each optionally with :PORT (1-65535), or a bare IPv6 address"
                ),
            )
        })?;
    }
    for (i, entry) in allow_cidrs.iter().enumerate() {
        check_cidr_entry(entry).map_err(|why| {
            ApiError::invalid(
                format!("network.allow_cidrs[{i}]"),
                format!("{entry:?} is not a CIDR ({why}); expected ADDRESS/PREFIX such as 10.1.2.3/32 or fd00::/8, or a single address"),
            )
        })?;
    }
    for (i, entry) in deny.iter().enumerate() {
        let host_ok = || -> Result<(), String> {
            if entry == "*" || entry.starts_with("*:") {
                return Err("* allows, it does not deny".into());
            }
            let has_port = if entry.starts_with('[') {
                !entry.ends_with(']')
            } else {
                entry.contains(':')
            };
            if has_port {
                return Err("a deny rule takes no port".into());
            }
            check_allow_entry(entry)
        };
        if check_cidr_entry(entry).is_err()
            && let Err(why) = host_ok()
        {
            return Err(ApiError::invalid(
                format!("network.deny[{i}]"),
                format!(
                    "{entry:?} is not a deny rule ({why}); expected NAME, *.DOMAIN, an IP address or a CIDR such as 203.0.113.0/24 (no port: a rule covers every port)"
                ),
            ));
        }
    }
    for (i, secret) in secrets.iter().enumerate() {
        for (j, entry) in secret.hosts.iter().enumerate() {
            check_allow_entry(entry).map_err(|why| {
                ApiError::invalid(
                    format!("network.secrets[{i}].hosts[{j}]"),
                    format!(
                        "{entry:?} is not a host pattern ({why}); expected NAME or *.DOMAIN, optionally with :PORT"
                    ),
                )
            })?;
        }
    }
    Ok(())
}

/// An IPv4 address in dotted-quad form (Rust's parser: no leading zeros).
fn is_ipv4(s: &str) -> bool {
    s.parse::<std::net::Ipv4Addr>().is_ok()
}

/// An IPv6 address without an embedded IPv4 part or a zone.
fn is_ipv6(s: &str) -> bool {
    !s.contains('.') && s.parse::<std::net::Ipv6Addr>().is_ok()
}

/// Decimal digits without a leading zero (but `0` itself), at most `max`.
fn number_up_to(s: &str, max: u32) -> bool {
    !s.is_empty()
        && s.len() <= 5
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'))
        && s.parse::<u32>().is_ok_and(|n| n <= max)
}

fn check_allow_entry(s: &str) -> Result<(), String> {
    if s == "*"
        || s.strip_prefix("*:")
            .is_some_and(|p| p != "0" && number_up_to(p, 65535))
    {
        return Ok(());
    }
    if s.chars().count() > 253 {
        return Err("longer than 253 characters".into());
    }
    if is_ipv6(s) {
        return Ok(());
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or("unclosed [")?;
        if !is_ipv6(v6) {
            return Err(format!("{v6:?} is not an IPv6 address"));
        }
        match after {
            "" => return Ok(()),
            p => (None, Some(p.strip_prefix(':').ok_or("text after ]")?)),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(s), None),
        }
    };
    if let Some(p) = port
        && (p == "0" || !number_up_to(p, 65535))
    {
        return Err(format!("port {p:?} is not a number from 1 to 65535"));
    }
    let Some(host) = host else { return Ok(()) };
    if is_ipv4(host) {
        return Ok(());
    }
    let name = host.strip_prefix("*.").unwrap_or(host);
    let labels: Vec<&str> = name.split('.').collect();
    let label_ok = |l: &&str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if !labels.iter().all(label_ok) {
        return Err("a name is labels of 1 to 63 letters, digits, - or _ separated by dots".into());
    }
    if !labels
        .last()
        .is_some_and(|l| l.starts_with(|c: char| c.is_ascii_alphabetic()))
    {
        return Err("a name's last label starts with a letter".into());
    }
    Ok(())
}

fn check_cidr_entry(s: &str) -> Result<(), String> {
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let max = if is_ipv4(addr) {
        32
    } else if is_ipv6(addr) {
        128
    } else {
        return Err(format!("{addr:?} is not an IP address"));
    };
    match prefix {
        Some(p) if !number_up_to(p, max) => {
            Err(format!("prefix length {p:?} is not a number from 0 to {max}"))
        }
        _ => Ok(()),
    }
}

/// A path relative to /workspace as the API accepts it: segments separated by single
/// slashes, none empty, `.` or `..`, no NUL (the OpenAPI document's pattern says the same).
pub fn check_relative_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("is empty: give a path relative to /workspace".into());
    }
    if path.contains('\0') {
        return Err("contains a NUL byte".into());
    }
    if path.starts_with('/') {
        return Err(format!(
            "{path:?} must be relative to /workspace (or start with /workspace/)"
        ));
    }
    if path
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err(format!(
            "{path:?}: each part between slashes must be a name (not empty, `.` or `..`)"
        ));
    }
    // The kernel's NAME_MAX: a longer name is not a file name anywhere.
    if path.split('/').any(|seg| seg.len() > 255) {
        return Err(format!("{path:?}: a name between slashes is at most 255 bytes"));
    }
    Ok(())
}

/// Merges request limits into the server's defaults and checks them against its maxima.
pub fn limits(req: &LimitsRequest, config: &ServerConfig, base: &Limits) -> Result<Limits, ApiError> {
    let max = &config.max;
    let l = Limits {
        memory_bytes: req.memory_bytes.unwrap_or(base.memory_bytes),
        cpus: req.cpus.unwrap_or(base.cpus),
        pids: req.pids.unwrap_or(base.pids),
        timeout_ms: req.timeout_ms.unwrap_or(base.timeout_ms),
        disk_bytes: req.disk_bytes.unwrap_or(base.disk_bytes),
        output_bytes: req.output_bytes.unwrap_or(base.output_bytes),
    };
    let over = |field: &str, value: String, maximum: String| {
        ApiError::invalid(
            format!("limits.{field}"),
            format!("{value} is above this server's maximum of {maximum}"),
        )
    };
    if l.memory_bytes > max.memory_bytes {
        return Err(over(
            "memory_bytes",
            exact(airlock_spec::format_size, l.memory_bytes),
            exact(airlock_spec::format_size, max.memory_bytes),
        ));
    }
    if l.cpus > max.cpus {
        return Err(over("cpus", l.cpus.to_string(), max.cpus.to_string()));
    }
    if l.pids > max.pids {
        return Err(over("pids", l.pids.to_string(), max.pids.to_string()));
    }
    if l.timeout_ms > max.timeout_ms {
        return Err(over(
            "timeout_ms",
            exact(airlock_spec::format_ms, l.timeout_ms),
            exact(airlock_spec::format_ms, max.timeout_ms),
        ));
    }
    if l.disk_bytes > max.disk_bytes {
        return Err(over(
            "disk_bytes",
            exact(airlock_spec::format_size, l.disk_bytes),
            exact(airlock_spec::format_size, max.disk_bytes),
        ));
    }
    if l.output_bytes > max.output_bytes {
        return Err(over(
            "output_bytes",
            exact(airlock_spec::format_size, l.output_bytes),
            exact(airlock_spec::format_size, max.output_bytes),
        ));
    }
    l.validate().map_err(|e| ApiError::invalid(e.field, e.message))?;
    Ok(l)
}

impl ExecRequest {
    /// The validated spec this request asks for, with `base` limits as defaults.
    pub fn to_spec(&self, config: &ServerConfig, base: &Limits) -> Result<Spec, ApiError> {
        let command = match (&self.cmd, self.language, &self.code) {
            (Some(cmd), None, None) if cmd.is_empty() => {
                return Err(ApiError::invalid(
                    "cmd",
                    "is empty: give the program to run (or, with `image`, omit `cmd` to run the image's own command)",
                ));
            }
            (Some(cmd), None, None) => cmd.clone(),
            (None, Some(lang), Some(code)) => {
                let (prog, flag) = match lang {
                    Language::Python => ("python3", "-c"),
                    Language::Javascript => ("node", "-e"),
                    Language::Bash => ("bash", "-c"),
                };
                vec![prog.to_owned(), flag.to_owned(), code.clone()]
            }
            (None, None, Some(_)) => {
                return Err(ApiError::invalid(
                    "language",
                    "code needs a language: python, javascript or bash",
                ));
            }
            (None, Some(_), None) => return Err(ApiError::invalid("code", "language needs code")),
            // The image's Entrypoint and Cmd give the command.
            (None, None, None) if self.image.is_some() => Vec::new(),
            (None, None, None) => return Err(ApiError::invalid("cmd", "give cmd, or language and code")),
            (Some(_), _, _) => {
                return Err(ApiError::invalid(
                    "cmd",
                    "give either cmd or language and code, not both",
                ));
            }
        };
        check_network(self.network.as_ref())?;
        let mut spec = Spec::new(command);
        spec.limits = limits(&self.limits, config, base)?;
        spec.env = self.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        spec.stdin = self.stdin.clone().unwrap_or_default().into_bytes();
        spec.network = self.network.clone().unwrap_or_default();
        spec.isolation = self.isolation.unwrap_or_default();
        spec.image = self.image.clone();
        spec.workdir = self.workdir.clone();
        if let Some(dirs) = &self.files_changed_in {
            spec.files_changed_in = dirs.clone();
        }
        // No file may be a directory of another: `d/f` and `d` cannot both be written.
        let dirs: std::collections::HashSet<&str> = self
            .files
            .iter()
            .flat_map(|f| f.path.match_indices('/').map(|(at, _)| &f.path[..at]))
            .collect();
        for (i, f) in self.files.iter().enumerate() {
            check_relative_path(&f.path).map_err(|m| ApiError::invalid(format!("files[{i}].path"), m))?;
            if dirs.contains(f.path.as_str()) {
                return Err(ApiError::invalid(
                    format!("files[{i}].path"),
                    format!("{:?} is also the directory of another file in `files`", f.path),
                ));
            }
            let content = match f.encoding {
                Encoding::Utf8 => f.content.clone().into_bytes(),
                Encoding::Base64 => base64::engine::general_purpose::STANDARD
                    .decode(&f.content)
                    .map_err(|e| {
                        ApiError::invalid(format!("files[{i}].content"), format!("not valid base64: {e}"))
                    })?,
            };
            spec.files.push(FileSpec {
                path: f.path.clone(),
                content,
                mode: f.mode.unwrap_or(0o644),
            });
        }
        let from_code = self.cmd.is_none();
        spec.validate()
            .map_err(|e| ApiError::invalid(crate::error::request_field(&e.field, from_code), e.message))?;
        Ok(spec)
    }
}

/// Parses a JSON body into `T`: 415 unless JSON, 400 with the position (and the field, for
/// unknown fields) when malformed.
pub fn parse_json<T: serde::de::DeserializeOwned>(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<T, ApiError> {
    let json = content_type.is_some_and(|ct| {
        let ct = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        ct == "application/json" || ct.ends_with("+json")
    });
    if !json {
        return Err(ApiError::unsupported_media_type());
    }
    // No body at all is `{}` (`curl -X POST …/v1/sandboxes`); anything else must be JSON
    // (a body of only whitespace is not).
    let body = if body.is_empty() { b"{}".as_slice() } else { body };
    // A request is a JSON object (serde would also build a struct from an array).
    if let Some(first) = body.iter().find(|b| !b.is_ascii_whitespace())
        && *first != b'{'
        && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
    {
        return Err(ApiError::invalid("body", "the body must be a JSON object"));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let text = inner.to_string();
        let at = format!("line {}, column {}", inner.line(), inner.column());
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::malformed(format!("invalid JSON at {at}: {text}"));
        }
        // serde names unknown fields as: unknown field `name`, expected ...
        if let Some(rest) = text.strip_prefix("unknown field `")
            && let Some(name) = rest.split('`').next()
        {
            // The path already ends with the unknown key.
            let field = if path == "." { name.to_owned() } else { path };
            return ApiError::invalid(field, format!("unknown field ({at})"));
        }
        // … and missing ones as: missing field `name`.
        if let Some(rest) = text.strip_prefix("missing field `")
            && let Some(name) = rest.split('`').next()
        {
            let field = if path == "." {
                name.to_owned()
            } else {
                format!("{path}.{name}")
            };
            return ApiError::invalid(field, format!("is required ({at})"));
        }
        let field = if path == "." { "body".to_owned() } else { path };
        ApiError::invalid(field, text)
    })?;
    de.end().map_err(|e| {
        ApiError::malformed(format!(
            "invalid JSON at line {}, column {}: {e}",
            e.line(),
            e.column()
        ))
    })?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ServerConfig {
        ServerConfig::default()
    }

    #[test]
    fn language_and_code() {
        let req: ExecRequest = parse_json(
            Some("application/json"),
            br#"{"language":"python","code":"print(1)"}"#,
        )
        .unwrap();
        let spec = req.to_spec(&config(), &Limits::default()).unwrap();
        assert_eq!(spec.command, ["python3", "-c", "print(1)"]);
    }

    #[test]
    fn errors_name_fields() {
        let err =
            parse_json::<ExecRequest>(Some("application/json"), br#"{"cmd":["x"],"bogus":1}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("bogus"));
        let err = parse_json::<ExecRequest>(
            Some("application/json"),
            br#"{"cmd":["x"],"limits":{"memroy_bytes":1}}"#,
        )
        .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("limits.memroy_bytes"));
        let err = parse_json::<ExecRequest>(Some("application/json"), br#"{"language":"ruby","code":"1"}"#)
            .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("language"));
        assert_eq!(err.status, 400);
        let err = parse_json::<ExecRequest>(Some("text/plain"), b"{}").unwrap_err();
        assert_eq!(err.status, 415);
        let err = parse_json::<ExecRequest>(Some("application/json"), b"{\"cmd\": [").unwrap_err();
        assert!(err.message.contains("line 1"), "{}", err.message);
        let req: ExecRequest = parse_json(
            Some("application/json"),
            br#"{"cmd":["x"],"limits":{"memory_bytes":99999999999999}}"#,
        )
        .unwrap();
        let err = req.to_spec(&config(), &Limits::default()).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("limits.memory_bytes"));
        assert!(err.message.contains("maximum"));
    }
}
