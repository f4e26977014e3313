//! Secrets that never enter the sandbox: the program sees a random placeholder in an
//! environment variable; the proxy puts the value in its place, in request heads to the
//! hosts the secret names, and blocks a request carrying the placeholder anywhere else.

use std::fmt;

use base64::Engine as _;

use crate::policy::{Pattern, PolicyError, Target, parse_host, parse_pattern};

/// The placeholder's prefix: `airlock-ph-` and 32 lower-case hex digits (128 random bits).
pub const PLACEHOLDER_PREFIX: &str = "airlock-ph-";

/// The most secrets per sandbox, and the most host patterns per secret.
pub const MAX_SECRETS: usize = 64;

/// The longest value (it goes into a request head, which servers bound at 8-16 KiB).
pub const MAX_VALUE_BYTES: usize = 8192;

/// One secret as configured: `NAME` is the environment variable the program reads, which
/// holds a placeholder; `value` replaces it in requests to `hosts` (allow-pattern syntax:
/// `api.github.com`, `*.example.com`, `host:8443`); with `query`, also in the request
/// target's query string. Debug never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretConfig {
    /// The environment variable: letters, digits and `_`, not starting with a digit.
    pub name: String,
    /// The real value: never in the sandbox, a log, a reason or Debug output.
    pub value: String,
    /// Where the value may go.
    pub hosts: Vec<String>,
    /// Replace in the URL query too (for APIs taking `?key=`).
    pub query: bool,
}

impl fmt::Debug for SecretConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretConfig")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .field("hosts", &self.hosts)
            .field("query", &self.query)
            .finish()
    }
}

/// One secret, ready: its placeholder and parsed hosts.
struct Secret {
    name: String,
    value: Vec<u8>,
    placeholder: String,
    hosts: Vec<Pattern>,
    /// The host patterns as written, for reasons.
    hosts_text: String,
    query: bool,
}

impl Secret {
    fn names(&self, target: &Target, port: u16) -> bool {
        self.hosts.iter().any(|p| p.matches(target, port))
    }

    /// Names `target` with this very port written (`host:80`): plain HTTP allowed.
    fn names_port(&self, target: &Target, port: u16) -> bool {
        self.hosts
            .iter()
            .any(|p| p.matches(target, port) && p.port() == Some(port))
    }
}

/// The secrets of one proxy (one sandbox), each with a placeholder made for this proxy.
/// Debug shows names and hosts only.
#[derive(Default)]
pub struct Secrets {
    secrets: Vec<Secret>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(
                self.secrets
                    .iter()
                    .map(|s| format!("{} for {} (value redacted)", s.name, s.hosts_text)),
            )
            .finish()
    }
}

/// Why a request head may not go where it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blocked {
    pub reason: String,
}

impl Secrets {
    /// Checks every secret and makes its placeholder. An error names the field
    /// (`network.secrets[1].value`) and says what is allowed; it never quotes a value.
    pub fn new(configs: &[SecretConfig]) -> Result<Secrets, PolicyError> {
        if configs.len() > MAX_SECRETS {
            return Err(PolicyError {
                field: "network.secrets".into(),
                message: format!("at most {MAX_SECRETS} secrets"),
            });
        }
        let mut secrets: Vec<Secret> = Vec::with_capacity(configs.len());
        for (i, c) in configs.iter().enumerate() {
            let field = |f: &str| format!("network.secrets[{i}].{f}");
            let err = |f: &str, message: String| PolicyError {
                field: field(f),
                message,
            };
            check_name(&c.name).map_err(|m| err("name", m))?;
            if secrets.iter().any(|s| s.name == c.name) {
                return Err(err("name", format!("{:?} is named by an earlier secret", c.name)));
            }
            check_value(&c.value).map_err(|m| err("value", m))?;
            if c.hosts.is_empty() {
                return Err(err("hosts", "at least one host the secret may go to".into()));
            }
            if c.hosts.len() > MAX_SECRETS {
                return Err(err("hosts", format!("at most {MAX_SECRETS} hosts")));
            }
            let hosts = c
                .hosts
                .iter()
                .enumerate()
                .map(|(j, h)| {
                    parse_pattern(h).map_err(|why| {
                        err(
                            &format!("hosts[{j}]"),
                            format!(
                                "{h:?} is not a host pattern ({why}); expected NAME, *.DOMAIN or an IP \
                                 address ([...] for IPv6), each optionally with :PORT (1-65535)"
                            ),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let placeholder = new_placeholder().map_err(|m| err("name", m))?;
            secrets.push(Secret {
                name: c.name.clone(),
                value: c.value.as_bytes().to_vec(),
                placeholder,
                hosts,
                hosts_text: c.hosts.join(", "),
                query: c.query,
            });
        }
        Ok(Secrets { secrets })
    }

    /// No secrets at all.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// The sandbox's environment: `(NAME, placeholder)` per secret.
    pub fn env(&self) -> Vec<(String, String)> {
        self.secrets
            .iter()
            .map(|s| (s.name.clone(), s.placeholder.clone()))
            .collect()
    }

    /// Whether any secret names `host:port` (then its TLS is intercepted).
    pub fn carries(&self, host: &str, port: u16) -> bool {
        !self.carried_by(host, port).is_empty()
    }

    /// The names of the secrets `host:port` carries.
    pub fn carried_by(&self, host: &str, port: u16) -> Vec<&str> {
        let Ok(target) = parse_host(host) else {
            return Vec::new();
        };
        self.secrets
            .iter()
            .filter(|s| s.names(&target, port))
            .map(|s| s.name.as_str())
            .collect()
    }

    /// Rewrites one HTTP/1.x request head (request line through the blank line, already
    /// parsed once, so well formed) bound for `host:port`: every placeholder (in any letter
    /// case) in a header value, and in the target's query string for a `query` secret, is
    /// replaced by its value. `Ok(None)`: no placeholder, send the head as it is. A
    /// placeholder anywhere in the head of a request to a host its secret does not name
    /// blocks the whole request. With `cleartext` (plain HTTP) the value goes only where
    /// a host pattern names the port explicitly (`host:80`): `host` alone, which covers 80
    /// and 443, means the value is sent over TLS only.
    pub(crate) fn rewrite(
        &self,
        head: &[u8],
        host: &str,
        port: u16,
        cleartext: bool,
    ) -> Result<Option<Vec<u8>>, Blocked> {
        if self.secrets.is_empty() {
            return Ok(None);
        }
        // Searched: the head, and the credentials of Basic authorization (git, pip and
        // npm send `user:token` that way).
        let mut lower = head.to_ascii_lowercase();
        for line in split_lines(head) {
            if let Some((_, decoded)) = basic_credentials(line) {
                lower.extend_from_slice(&decoded.to_ascii_lowercase());
            }
        }
        let found: Vec<&Secret> = self
            .secrets
            .iter()
            .filter(|s| find(&lower, s.placeholder.as_bytes(), 0).is_some())
            .collect();
        if found.is_empty() {
            return Ok(None);
        }
        let target = parse_host(host).ok();
        let shown = if crate::DEFAULT_PORTS.contains(&port) {
            host.to_string()
        } else {
            format!("{host}:{port}")
        };
        for s in &found {
            let Some(t) = target.as_ref().filter(|t| s.names(t, port)) else {
                return Err(Blocked {
                    reason: format!(
                        "placeholder of secret {} sent to {shown} (it may go only to {})",
                        s.name, s.hosts_text
                    ),
                });
            };
            if cleartext && !s.names_port(t, port) {
                return Err(Blocked {
                    reason: format!(
                        "placeholder of secret {} sent to {shown} over plain HTTP (its value goes \
                         there only over TLS; a host pattern with the port, {host}:{port}, allows \
                         plain HTTP)",
                        s.name
                    ),
                });
            }
        }
        let mut out = Vec::with_capacity(head.len() + 256);
        let mut lines = split_lines(head);
        // The request line: METHOD SP TARGET SP VERSION.
        let request_line = lines.next().unwrap_or_default();
        let mut parts = request_line.splitn(3, |&b| b == b' ');
        let (method, target, version) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        out.extend_from_slice(method);
        out.push(b' ');
        match target.iter().position(|&b| b == b'?') {
            Some(q) => {
                out.extend_from_slice(&target[..=q]);
                let mut query = target[q + 1..].to_vec();
                for s in found.iter().filter(|s| s.query) {
                    query = replace(&query, s.placeholder.as_bytes(), &percent_encode(&s.value));
                }
                out.extend_from_slice(&query);
            }
            None => out.extend_from_slice(target),
        }
        out.push(b' ');
        out.extend_from_slice(version);
        out.extend_from_slice(b"\r\n");
        for line in lines {
            if line.is_empty() {
                break;
            }
            if let Some((scheme_end, mut credentials)) = basic_credentials(line) {
                for s in &found {
                    credentials = replace(&credentials, s.placeholder.as_bytes(), &s.value);
                }
                out.extend_from_slice(&line[..scheme_end]);
                out.extend_from_slice(
                    base64::engine::general_purpose::STANDARD
                        .encode(&credentials)
                        .as_bytes(),
                );
                out.extend_from_slice(b"\r\n");
                continue;
            }
            match line.iter().position(|&b| b == b':') {
                Some(colon) => {
                    out.extend_from_slice(&line[..=colon]);
                    let mut value = line[colon + 1..].to_vec();
                    for s in &found {
                        value = replace(&value, s.placeholder.as_bytes(), &s.value);
                    }
                    out.extend_from_slice(&value);
                }
                None => out.extend_from_slice(line),
            }
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        Ok(Some(out))
    }
}

impl Secrets {
    /// A response head from `host:port` with the value of every secret that host carries
    /// (as is, and percent-encoded for a `query` secret) put back to its placeholder: a
    /// server echoing a credential (a debug endpoint, a redirect keeping the query) does
    /// not hand it to the program. `None`: no value in it.
    pub(crate) fn scrub(&self, head: &[u8], host: &str, port: u16) -> Option<Vec<u8>> {
        let target = parse_host(host).ok()?;
        let mut out: Option<Vec<u8>> = None;
        for s in self.secrets.iter().filter(|s| s.names(&target, port)) {
            let encoded = percent_encode(&s.value);
            let forms: &[&[u8]] = if s.query && encoded != s.value {
                &[&s.value, &encoded]
            } else {
                &[&s.value]
            };
            for form in forms {
                let current = out.as_deref().unwrap_or(head);
                if current.windows(form.len()).any(|w| w == *form) {
                    out = Some(replace_exact(current, form, s.placeholder.as_bytes()));
                }
            }
        }
        out
    }
}

/// `s` with every `needle` (exactly) replaced by `with`.
fn replace_exact(s: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut at = 0;
    while let Some(i) = find(s, needle, at) {
        out.extend_from_slice(&s[at..i]);
        out.extend_from_slice(with);
        at = i + needle.len();
    }
    out.extend_from_slice(&s[at..]);
    out
}

/// For an `Authorization: Basic CREDENTIALS` (or `Proxy-Authorization`) line: where the
/// encoded credentials start, and the credentials decoded.
fn basic_credentials(line: &[u8]) -> Option<(usize, Vec<u8>)> {
    let colon = line.iter().position(|&b| b == b':')?;
    let name = &line[..colon];
    if !(name.eq_ignore_ascii_case(b"authorization") || name.eq_ignore_ascii_case(b"proxy-authorization")) {
        return None;
    }
    let value = &line[colon + 1..];
    let lead = value.len() - value.trim_ascii_start().len();
    let value = value.trim_ascii_start();
    if value.len() < 6 || !value[..6].eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let token = &value[6..];
    let spaces = token.len() - token.trim_ascii_start().len();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim_ascii())
        .ok()?;
    Some((colon + 1 + lead + 6 + spaces, decoded))
}

/// The lines of a head, without their CRLF.
fn split_lines(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    head.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
}

/// `needle` (lower case) in `lower` from `from`.
fn find(lower: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    lower
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// `s` with every `needle` (lower case; matched in any case) replaced by `with`.
fn replace(s: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let lower = s.to_ascii_lowercase();
    let mut out = Vec::with_capacity(s.len());
    let mut at = 0;
    while let Some(i) = find(&lower, needle, at) {
        out.extend_from_slice(&s[at..i]);
        out.extend_from_slice(with);
        at = i + needle.len();
    }
    out.extend_from_slice(&s[at..]);
    out
}

/// The value as it goes in a query string: every byte but `A-Z a-z 0-9 - . _ ~`
/// percent-encoded, so it can neither end the target nor add a parameter.
fn percent_encode(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    for &b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out
}

/// Variables airlock sets in a sandbox with a proxy and secrets: a secret may not take
/// one's place (compared ignoring case: `http_proxy` is read too).
const RESERVED_NAMES: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "PATH",
    "HOME",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
];

fn check_name(name: &str) -> Result<(), String> {
    if let Some(r) = RESERVED_NAMES.iter().find(|r| r.eq_ignore_ascii_case(name)) {
        return Err(format!(
            "{name:?} is a variable airlock sets itself ({r}); name the secret otherwise"
        ));
    }
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not an environment variable name: 1-128 letters, digits and _, not \
             starting with a digit"
        ))
    }
}

/// A value goes into a header as is: no CR, LF, NUL or other control character (tab
/// aside), which could end the header or the head. The value itself is never quoted.
fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("empty value".into());
    }
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!("value longer than {MAX_VALUE_BYTES} bytes"));
    }
    if value.bytes().any(|b| b == b'\r' || b == b'\n') {
        return Err("the value contains CR or LF, which cannot go into an HTTP header".into());
    }
    if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
        return Err(
            "the value contains a control character (NUL, DEL, ...), which cannot go into an HTTP header"
                .into(),
        );
    }
    if value.to_ascii_lowercase().contains(PLACEHOLDER_PREFIX) {
        return Err(format!(
            "the value contains {PLACEHOLDER_PREFIX:?}, the placeholder prefix"
        ));
    }
    Ok(())
}

fn new_placeholder() -> Result<String, String> {
    let mut random = [0u8; 16];
    getrandom::fill(&mut random).map_err(|e| format!("no randomness for a placeholder: {e}"))?;
    let mut s = String::with_capacity(PLACEHOLDER_PREFIX.len() + 32);
    s.push_str(PLACEHOLDER_PREFIX);
    for b in random {
        s.push_str(&format!("{b:02x}"));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, value: &str, hosts: &[&str], query: bool) -> SecretConfig {
        SecretConfig {
            name: name.into(),
            value: value.into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            query,
        }
    }

    fn github() -> Secrets {
        Secrets::new(&[
            secret("GITHUB_TOKEN", "ghp_realvalue", &["api.github.com"], false),
            secret("MAPS_KEY", "k=v&x y", &["*.maps.test:8443"], true),
        ])
        .unwrap()
    }

    fn placeholder(s: &Secrets, name: &str) -> String {
        s.env().into_iter().find(|(n, _)| n == name).unwrap().1
    }

    #[test]
    fn placeholders_are_random_per_proxy_and_look_like_tokens() {
        let (a, b) = (github(), github());
        let pa = placeholder(&a, "GITHUB_TOKEN");
        assert_ne!(pa, placeholder(&b, "GITHUB_TOKEN"));
        assert_ne!(pa, placeholder(&a, "MAPS_KEY"));
        let hex = pa.strip_prefix(PLACEHOLDER_PREFIX).unwrap();
        assert_eq!(hex.len(), 32);
        assert!(
            hex.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(
            a.env().iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["GITHUB_TOKEN", "MAPS_KEY"]
        );
    }

    #[test]
    fn debug_never_shows_a_value() {
        let s = github();
        let shown = format!("{s:?} {:?}", secret("A", "ghp_realvalue", &["a.test"], false));
        assert!(!shown.contains("ghp_realvalue"), "{shown}");
        assert!(
            shown.contains("GITHUB_TOKEN for api.github.com (value redacted)"),
            "{shown}"
        );
    }

    #[test]
    fn carries_uses_the_allow_pattern_rules() {
        let s = github();
        assert!(s.carries("api.github.com", 443));
        assert!(s.carries("API.GitHub.com.", 80));
        assert!(!s.carries("api.github.com", 8443));
        assert!(!s.carries("github.com", 443));
        assert!(s.carries("eu.maps.test", 8443));
        assert!(!s.carries("maps.test", 8443));
        assert!(!s.carries("eu.maps.test", 443));
        assert_eq!(s.carried_by("api.github.com", 443), ["GITHUB_TOKEN"]);
    }

    #[test]
    fn headers_get_the_value_on_a_named_host_only() {
        let s = github();
        let ph = placeholder(&s, "GITHUB_TOKEN");
        let head = format!(
            "GET /user?t={ph} HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer {}\r\nX-Two: {ph},{ph}\r\n\r\n",
            ph.to_ascii_uppercase().replace("AIRLOCK-PH-", "airlock-ph-")
        );
        let out = s
            .rewrite(head.as_bytes(), "api.github.com", 443, false)
            .unwrap()
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        // Not a query secret: the target keeps the placeholder.
        assert_eq!(
            out,
            format!(
                "GET /user?t={ph} HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer ghp_realvalue\r\nX-Two: ghp_realvalue,ghp_realvalue\r\n\r\n"
            )
        );
        assert_eq!(
            s.rewrite(
                b"GET / HTTP/1.1\r\nHost: api.github.com\r\n\r\n",
                "api.github.com",
                443,
                false
            ),
            Ok(None)
        );
    }

    #[test]
    fn values_echoed_in_a_response_head_are_put_back_to_placeholders() {
        let s = github();
        let ph = placeholder(&s, "GITHUB_TOKEN");
        let head = b"HTTP/1.1 200 OK\r\nX-Echo: Bearer ghp_realvalue\r\n\r\n";
        let out = s.scrub(head, "api.github.com", 443).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("HTTP/1.1 200 OK\r\nX-Echo: Bearer {ph}\r\n\r\n")
        );
        assert_eq!(s.scrub(b"HTTP/1.1 200 OK\r\n\r\n", "api.github.com", 443), None);
        let maps = placeholder(&s, "MAPS_KEY");
        let head = b"HTTP/1.1 302 Found\r\nLocation: https://b.maps.test/?key=k%3Dv%26x%20y\r\n\r\n";
        let out = s.scrub(head, "a.maps.test", 8443).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("HTTP/1.1 302 Found\r\nLocation: https://b.maps.test/?key={maps}\r\n\r\n")
        );
    }

    #[test]
    fn basic_credentials_are_decoded_rewritten_and_checked() {
        use base64::engine::general_purpose::STANDARD;
        let s = github();
        let ph = placeholder(&s, "GITHUB_TOKEN");
        let creds = STANDARD.encode(format!("x-access-token:{ph}"));
        let head = format!("GET /repo.git/info/refs HTTP/1.1\r\nAuthorization: Basic {creds}\r\n\r\n");
        let out = s
            .rewrite(head.as_bytes(), "api.github.com", 443, false)
            .unwrap()
            .unwrap();
        let expected = STANDARD.encode("x-access-token:ghp_realvalue");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("GET /repo.git/info/refs HTTP/1.1\r\nAuthorization: Basic {expected}\r\n\r\n")
        );
        let blocked = s.rewrite(head.as_bytes(), "example.com", 443, false).unwrap_err();
        assert!(
            blocked
                .reason
                .starts_with("placeholder of secret GITHUB_TOKEN sent to example.com")
        );
        // Other Basic credentials pass untouched.
        let other = format!(
            "GET / HTTP/1.1\r\nAuthorization: Basic {}\r\n\r\n",
            STANDARD.encode("u:p")
        );
        assert_eq!(s.rewrite(other.as_bytes(), "example.com", 443, false), Ok(None));
    }

    #[test]
    fn a_placeholder_to_another_host_is_blocked_wherever_it_is() {
        let s = github();
        let ph = placeholder(&s, "GITHUB_TOKEN");
        for head in [
            format!("GET / HTTP/1.1\r\nHost: example.com\r\nAuthorization: token {ph}\r\n\r\n"),
            format!("GET /{ph} HTTP/1.1\r\nHost: example.com\r\n\r\n"),
            format!("GET / HTTP/1.1\r\nX-{ph}: 1\r\n\r\n"),
        ] {
            let blocked = s.rewrite(head.as_bytes(), "example.com", 443, false).unwrap_err();
            assert_eq!(
                blocked.reason,
                "placeholder of secret GITHUB_TOKEN sent to example.com (it may go only to api.github.com)"
            );
            assert!(!blocked.reason.contains("ghp_realvalue"));
        }
        let head = format!("GET / HTTP/1.1\r\nA: {ph}\r\n\r\n");
        assert_eq!(
            s.rewrite(head.as_bytes(), "api.github.com", 8443, false)
                .unwrap_err()
                .reason,
            "placeholder of secret GITHUB_TOKEN sent to api.github.com:8443 (it may go only to api.github.com)"
        );
    }

    #[test]
    fn over_plain_http_the_value_goes_only_where_a_pattern_names_the_port() {
        let s = Secrets::new(&[
            secret("GITHUB_TOKEN", "ghp_realvalue", &["api.github.com"], false),
            secret("LOCAL", "local-value", &["svc.test:80", "svc.test"], false),
        ])
        .unwrap();
        let gh = placeholder(&s, "GITHUB_TOKEN");
        let head = format!("GET / HTTP/1.1\r\nAuthorization: Bearer {gh}\r\n\r\n");
        assert_eq!(
            s.rewrite(head.as_bytes(), "api.github.com", 80, true)
                .unwrap_err()
                .reason,
            "placeholder of secret GITHUB_TOKEN sent to api.github.com over plain HTTP (its value goes \
             there only over TLS; a host pattern with the port, api.github.com:80, allows plain HTTP)"
        );
        // Over TLS (intercepted) port 80 is as good as 443.
        assert!(
            s.rewrite(head.as_bytes(), "api.github.com", 80, false)
                .unwrap()
                .is_some()
        );
        let local = placeholder(&s, "LOCAL");
        let head = format!("GET / HTTP/1.1\r\nX-Key: {local}\r\n\r\n");
        let out = s.rewrite(head.as_bytes(), "svc.test", 80, true).unwrap().unwrap();
        assert!(String::from_utf8(out).unwrap().contains("X-Key: local-value\r\n"));
    }

    #[test]
    fn query_secrets_are_replaced_percent_encoded_in_the_query_only() {
        let s = github();
        let ph = placeholder(&s, "MAPS_KEY");
        let head = format!("GET /{ph}/x?key={ph}&a=1 HTTP/1.1\r\nX-Key: {ph}\r\n\r\n");
        let out = s
            .rewrite(head.as_bytes(), "eu.maps.test", 8443, false)
            .unwrap()
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("GET /{ph}/x?key=k%3Dv%26x%20y&a=1 HTTP/1.1\r\nX-Key: k=v&x y\r\n\r\n")
        );
    }

    #[test]
    fn bad_secrets_are_refused_naming_the_field_never_the_value() {
        let cases = [
            (
                secret("A", "abc\r\nX-Injected: 1", &["a.test"], false),
                "network.secrets[0].value",
                "CR or LF",
            ),
            (
                secret("A", "abc\ndef", &["a.test"], false),
                "network.secrets[0].value",
                "CR or LF",
            ),
            (
                secret("A", "a\0b", &["a.test"], false),
                "network.secrets[0].value",
                "control character",
            ),
            (
                secret("A", "", &["a.test"], false),
                "network.secrets[0].value",
                "empty",
            ),
            (
                secret("1A", "v", &["a.test"], false),
                "network.secrets[0].name",
                "environment variable",
            ),
            (
                secret("A-B", "v", &["a.test"], false),
                "network.secrets[0].name",
                "environment variable",
            ),
            (
                secret("A", "v", &[], false),
                "network.secrets[0].hosts",
                "at least one",
            ),
            (
                secret("https_proxy", "v", &["a.test"], false),
                "network.secrets[0].name",
                "airlock sets itself",
            ),
            (
                secret("SSL_CERT_FILE", "v", &["a.test"], false),
                "network.secrets[0].name",
                "airlock sets itself",
            ),
            (
                secret("A", "v", &["a.test", "*x.test"], false),
                "network.secrets[0].hosts[1]",
                "not a host pattern",
            ),
            (
                secret("A", "v", &["metadata.google.internal"], false),
                "network.secrets[0].hosts[0]",
                "metadata",
            ),
        ];
        for (config, field, message) in cases {
            let e = Secrets::new(std::slice::from_ref(&config)).unwrap_err();
            assert_eq!(e.field, field, "{config:?}");
            assert!(e.message.contains(message), "{config:?}: {e}");
            assert!(
                !e.to_string().contains("abc") && !e.to_string().contains("a\0b"),
                "{e}"
            );
        }
        let dup = [
            secret("A", "v", &["a.test"], false),
            secret("A", "w", &["b.test"], false),
        ];
        assert_eq!(Secrets::new(&dup).unwrap_err().field, "network.secrets[1].name");
    }
}
