//! The network a sandbox gets: none, or egress by policy through airlock's proxy, with
//! secrets the program can use but never read, and approvals for what the policy denies.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::SpecError;

/// What network the sandbox gets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum NetworkPolicy {
    /// Own network namespace with only loopback: no route out.
    #[default]
    None,
    /// Every connection out goes through airlock's egress proxy, which lets it out by
    /// policy: to the hosts in `allow` (not those in `deny`), never to private, loopback,
    /// link-local (cloud metadata) or other special addresses unless listed in
    /// `allow_cidrs`. Programs that ignore the proxy variables are redirected to it, and
    /// names resolve only through airlock's resolver, under the same policy.
    Proxy(ProxyPolicy),
}

/// The policy of proxy mode.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyPolicy {
    /// Host patterns: `pypi.org`, `*.pythonhosted.org`, `api.example.com:8443` (without a
    /// port: 80 and 443), or `*`: any public host.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Address ranges allowed even though they are private or special
    /// (`10.1.2.3/32`, `fd00::/8`): how to reach an internal service on purpose.
    #[serde(default)]
    pub allow_cidrs: Vec<String>,
    /// Hosts (`example.com`, `*.internal.example.com`) and ranges (`203.0.113.0/24`) never
    /// reached, whatever `allow` says: deny wins.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Values the program may use but never read: it sees a placeholder in the variable,
    /// which the proxy replaces with the value only in requests to the secret's hosts.
    #[serde(default)]
    pub secrets: Vec<Secret>,
    /// What happens to a connection the allowlist denies: `deny`, or `ask` (held while
    /// airlock asks, over MCP or the approvals route; unanswered means denied).
    #[serde(default)]
    pub on_denied: OnDenied,
    /// How long a held connection waits for an answer, in milliseconds.
    #[serde(default = "default_approval_timeout")]
    pub approval_timeout_ms: u64,
}

fn default_approval_timeout() -> u64 {
    30_000
}

impl Default for ProxyPolicy {
    /// Nothing allowed, no secrets, denials refused at once, 30 s to answer an approval.
    fn default() -> Self {
        ProxyPolicy {
            allow: Vec::new(),
            allow_cidrs: Vec::new(),
            deny: Vec::new(),
            secrets: Vec::new(),
            on_denied: OnDenied::Deny,
            approval_timeout_ms: default_approval_timeout(),
        }
    }
}

impl fmt::Debug for ProxyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyPolicy")
            .field("allow", &self.allow)
            .field("allow_cidrs", &self.allow_cidrs)
            .field("deny", &self.deny)
            .field("secrets", &self.secrets)
            .field("on_denied", &self.on_denied)
            .field("approval_timeout_ms", &self.approval_timeout_ms)
            .finish()
    }
}

/// A secret for the egress proxy to put into requests.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Secret {
    /// The environment variable the program finds the placeholder in.
    pub name: String,
    /// The value. Never shown: a sandbox's description omits it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// Host patterns (as in `allow`) the value may go to.
    pub hosts: Vec<String>,
    /// Whether the placeholder is also replaced in the URL's query string (headers always).
    #[serde(default)]
    pub query: bool,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .field("hosts", &self.hosts)
            .field("query", &self.query)
            .finish()
    }
}

/// What happens to a connection the allowlist denies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDenied {
    /// Refused at once.
    #[default]
    Deny,
    /// Held while airlock asks; refused when the answer is no or does not come in time.
    Ask,
}

/// A change to a running session's policy: each field given replaces that list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkPatch {
    /// New allow patterns.
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    /// New address ranges allowed on purpose.
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub allow_cidrs: Option<Vec<String>>,
    /// New deny rules.
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub deny: Option<Vec<String>>,
    /// New answer to denials.
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub on_denied: Option<OnDenied>,
}

/// A field of a patch, when given: absent is "no change", `null` is no value at all (an
/// error), not "no change".
fn given<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl NetworkPatch {
    /// `policy` with this change applied (secrets are kept: they cannot change live).
    pub fn apply(&self, policy: &ProxyPolicy) -> ProxyPolicy {
        let mut next = policy.clone();
        if let Some(v) = &self.allow {
            next.allow = v.clone();
        }
        if let Some(v) = &self.allow_cidrs {
            next.allow_cidrs = v.clone();
        }
        if let Some(v) = &self.deny {
            next.deny = v.clone();
        }
        if let Some(v) = self.on_denied {
            next.on_denied = v;
        }
        next
    }
}

/// At most this many entries in each list: every connection is checked against all.
const MAX_ENTRIES: usize = 256;
/// At most this many secrets per sandbox.
const MAX_SECRETS: usize = 32;
/// A secret's value: at most this many (ASCII) characters.
const MAX_SECRET_BYTES: usize = 4096;
/// A secret's name: at most this many bytes.
const MAX_SECRET_NAME: usize = 128;
/// Bounds of `approval_timeout_ms`.
const APPROVAL_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 100..=600_000;

impl NetworkPolicy {
    /// Checks the shape of every field (the egress proxy parses the patterns fully).
    pub fn validate(&self) -> Result<(), SpecError> {
        match self {
            NetworkPolicy::None => Ok(()),
            NetworkPolicy::Proxy(p) => p.validate(),
        }
    }

    /// Refuses an environment variable that a secret's placeholder also sets.
    pub fn validate_env(&self, env: &[(String, String)]) -> Result<(), SpecError> {
        let NetworkPolicy::Proxy(p) = self else {
            return Ok(());
        };
        for (i, s) in p.secrets.iter().enumerate() {
            if env.iter().any(|(k, _)| *k == s.name) {
                return Err(SpecError::new(
                    format!("network.secrets[{i}].name"),
                    format!(
                        "{} is also set in env; the secret's placeholder is that variable",
                        s.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The policy with every secret's value blanked: what may be shown, logged or sent
    /// into a sandbox.
    pub fn redacted(&self) -> NetworkPolicy {
        match self {
            NetworkPolicy::None => NetworkPolicy::None,
            NetworkPolicy::Proxy(p) => NetworkPolicy::Proxy(p.redacted()),
        }
    }

    /// The proxy policy, in proxy mode.
    pub fn proxy(&self) -> Option<&ProxyPolicy> {
        match self {
            NetworkPolicy::None => None,
            NetworkPolicy::Proxy(p) => Some(p),
        }
    }
}

impl ProxyPolicy {
    /// A policy allowing `allow` and nothing else.
    pub fn allowing(allow: &[&str]) -> ProxyPolicy {
        ProxyPolicy {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            ..ProxyPolicy::default()
        }
    }

    /// This policy with every secret's value blanked.
    pub fn redacted(&self) -> ProxyPolicy {
        let mut p = self.clone();
        for s in &mut p.secrets {
            s.value.clear();
        }
        p
    }

    /// Checks the shape of every field.
    pub fn validate(&self) -> Result<(), SpecError> {
        for (name, list) in [
            ("network.allow", &self.allow),
            ("network.allow_cidrs", &self.allow_cidrs),
            ("network.deny", &self.deny),
        ] {
            check_entries(name, list, "a host pattern or CIDR")?;
        }
        if self.secrets.len() > MAX_SECRETS {
            return Err(SpecError::new(
                "network.secrets",
                format!("at most {MAX_SECRETS} secrets"),
            ));
        }
        for (i, s) in self.secrets.iter().enumerate() {
            let field = |f: &str| format!("network.secrets[{i}].{f}");
            let name_ok = !s.name.is_empty()
                && s.name.len() <= MAX_SECRET_NAME
                && !s.name.starts_with(|c: char| c.is_ascii_digit())
                && s.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !name_ok {
                return Err(SpecError::new(
                    field("name"),
                    format!(
                        "{:?} is not an environment variable name (letters, digits and _, not starting with a digit, at most {MAX_SECRET_NAME} bytes)",
                        s.name
                    ),
                ));
            }
            if self.secrets[..i].iter().any(|o| o.name == s.name) {
                return Err(SpecError::new(
                    field("name"),
                    format!("{} is given twice", s.name),
                ));
            }
            if s.value.is_empty() || s.value.len() > MAX_SECRET_BYTES {
                return Err(SpecError::new(
                    field("value"),
                    format!("must be 1 to {MAX_SECRET_BYTES} characters"),
                ));
            }
            if !s.value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
                return Err(SpecError::new(
                    field("value"),
                    "must be printable ASCII (no control characters such as CR or LF: it goes into HTTP headers)",
                ));
            }
            if s.hosts.is_empty() {
                return Err(SpecError::new(
                    field("hosts"),
                    "is empty: name the hosts the value may go to",
                ));
            }
            check_entries(&field("hosts"), &s.hosts, "a host pattern")?;
            if let Some(j) = s.hosts.iter().position(|h| h == "*" || h.starts_with("*:")) {
                return Err(SpecError::new(
                    format!("network.secrets[{i}].hosts[{j}]"),
                    "a secret goes only to hosts it names: * is not allowed here",
                ));
            }
        }
        if !APPROVAL_TIMEOUT_MS.contains(&self.approval_timeout_ms) {
            return Err(SpecError::new(
                "network.approval_timeout_ms",
                format!(
                    "{} is out of range; allowed: {} to {}",
                    self.approval_timeout_ms,
                    APPROVAL_TIMEOUT_MS.start(),
                    APPROVAL_TIMEOUT_MS.end()
                ),
            ));
        }
        Ok(())
    }
}

/// The shape every pattern list shares: bounded, no spaces or control characters.
fn check_entries(name: &str, list: &[String], what: &str) -> Result<(), SpecError> {
    if list.len() > MAX_ENTRIES {
        return Err(SpecError::new(name, format!("at most {MAX_ENTRIES} entries")));
    }
    for (i, entry) in list.iter().enumerate() {
        if entry.is_empty()
            || entry.chars().count() > 260
            || entry.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(SpecError::new(
                format!("{name}[{i}]"),
                format!("{entry:?} is not {what} (no spaces or control characters, at most 260 characters)"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, value: &str) -> Secret {
        Secret {
            name: name.into(),
            value: value.into(),
            hosts: vec!["api.example.com".into()],
            query: false,
        }
    }

    #[test]
    fn the_json_form_reads_with_defaults_and_refuses_unknown_fields() {
        let p: NetworkPolicy = serde_json::from_str(r#"{"mode":"proxy","allow":["pypi.org"]}"#).unwrap();
        let NetworkPolicy::Proxy(p) = p else { panic!() };
        assert_eq!(p.allow, ["pypi.org"]);
        assert_eq!((p.on_denied, p.approval_timeout_ms), (OnDenied::Deny, 30_000));
        assert!(serde_json::from_str::<NetworkPolicy>(r#"{"mode":"proxy","alow":[]}"#).is_err());
        assert_eq!(
            serde_json::from_str::<NetworkPolicy>(r#"{"mode":"none"}"#).unwrap(),
            NetworkPolicy::None
        );
        let p: NetworkPolicy = serde_json::from_str(
            r#"{"mode":"proxy","deny":["*.internal"],"on_denied":"ask","secrets":[{"name":"T","value":"v","hosts":["a.b"],"query":true}]}"#,
        )
        .unwrap();
        let p = p.proxy().unwrap();
        assert_eq!(p.on_denied, OnDenied::Ask);
        assert!(p.secrets[0].query);
    }

    #[test]
    fn a_secret_value_is_never_shown() {
        let p = NetworkPolicy::Proxy(ProxyPolicy {
            secrets: vec![secret("GITHUB_TOKEN", "ghp_supersecret")],
            ..ProxyPolicy::default()
        });
        assert!(!format!("{p:?}").contains("supersecret"));
        let shown = serde_json::to_string(&p.redacted()).unwrap();
        assert!(!shown.contains("supersecret"), "{shown}");
        assert!(shown.contains("GITHUB_TOKEN"), "{shown}");
        p.validate().unwrap();
    }

    #[test]
    fn bad_secrets_name_the_field() {
        let with = |s: Secret| {
            NetworkPolicy::Proxy(ProxyPolicy {
                secrets: vec![s],
                ..ProxyPolicy::default()
            })
            .validate()
            .unwrap_err()
            .field
        };
        assert_eq!(with(secret("1X", "v")), "network.secrets[0].name");
        assert_eq!(with(secret("A-B", "v")), "network.secrets[0].name");
        assert_eq!(with(secret("T", "")), "network.secrets[0].value");
        assert_eq!(with(secret("T", "a\r\nX-Evil: 1")), "network.secrets[0].value");
        let mut s = secret("T", "v");
        s.hosts.clear();
        assert_eq!(with(s), "network.secrets[0].hosts");
        let mut s = secret("T", "v");
        s.hosts = vec!["a b".into()];
        assert_eq!(with(s), "network.secrets[0].hosts[0]");
        let twice = NetworkPolicy::Proxy(ProxyPolicy {
            secrets: vec![secret("T", "v"), secret("T", "w")],
            ..ProxyPolicy::default()
        });
        assert_eq!(twice.validate().unwrap_err().field, "network.secrets[1].name");
        let env = vec![("T".to_string(), "x".to_string())];
        let one = NetworkPolicy::Proxy(ProxyPolicy {
            secrets: vec![secret("T", "v")],
            ..ProxyPolicy::default()
        });
        assert_eq!(
            one.validate_env(&env).unwrap_err().field,
            "network.secrets[0].name"
        );
    }

    #[test]
    fn deny_entries_and_the_timeout_are_checked() {
        let p = ProxyPolicy {
            deny: vec!["ok.example".into(), "bad entry".into()],
            ..ProxyPolicy::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "network.deny[1]");
        let p = ProxyPolicy {
            approval_timeout_ms: 5,
            ..ProxyPolicy::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "network.approval_timeout_ms");
    }

    #[test]
    fn a_patch_replaces_only_the_lists_it_names() {
        let p = ProxyPolicy {
            allow: vec!["a.example".into()],
            deny: vec!["b.example".into()],
            secrets: vec![secret("T", "v")],
            ..ProxyPolicy::default()
        };
        let patch: NetworkPatch = serde_json::from_str(r#"{"allow":["c.example"]}"#).unwrap();
        let next = patch.apply(&p);
        assert_eq!(next.allow, ["c.example"]);
        assert_eq!(next.deny, ["b.example"]);
        assert_eq!(next.secrets, p.secrets);
        assert!(serde_json::from_str::<NetworkPatch>(r#"{"secrets":[]}"#).is_err());
        assert!(serde_json::from_str::<NetworkPatch>(r#"{"allow":null}"#).is_err());
        assert_eq!(
            serde_json::from_str::<NetworkPatch>("{}").unwrap(),
            NetworkPatch::default()
        );
    }
}
