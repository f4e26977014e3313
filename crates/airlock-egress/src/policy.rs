//! The egress policy: which hosts and ports a sandbox may reach (the allowlist), and which
//! addresses it may never reach unless a CIDR allows them on purpose (the SSRF guard).

use std::net::{IpAddr, Ipv6Addr};

use crate::addr::{self, Cidr};

/// Without a port, a pattern allows these (plain HTTP and HTTPS) and no others.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// At most this many entries in each list: every request is checked against all of them
/// (the spec validator has the same bound).
pub const MAX_ENTRIES: usize = 256;

/// Cloud metadata services reachable by name; denied by name whatever the allowlist says
/// (their addresses are denied too, but a resolver might map them anywhere).
const METADATA_NAMES: &[&str] = &[
    "metadata.google.internal",
    "metadata",
    "metadata.goog",
    "instance-data",
    "instance-data.ec2.internal",
];

/// A host name's longest legal length (RFC 1035), without the trailing dot.
const MAX_NAME_LEN: usize = 253;

/// What a request asks to reach, once its host is understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An IP literal in any spelling, by the address it means.
    Addr(IpAddr),
    /// A DNS name: lower case, without a trailing dot.
    Name(String),
}

/// A policy entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PolicyError {
    /// The entry: `network.allow[2]`, `network.allow_cidrs[0]`.
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

/// One allow pattern, as parsed (also a secret's host pattern).
#[derive(Debug, Clone)]
pub(crate) struct Pattern {
    /// The entry as written, for "allowed by …" reasons.
    text: String,
    host: HostPattern,
    /// `None`: [`DEFAULT_PORTS`].
    port: Option<u16>,
}

#[derive(Debug, Clone)]
enum HostPattern {
    /// This name exactly.
    Exact(String),
    /// `*.domain`: any name with at least one more label before `.domain`.
    Subdomains(String),
    /// This address (requested as a literal, in any spelling).
    Addr(IpAddr),
    /// `*`: any host (its addresses still pass the SSRF guard).
    Any,
}

impl Pattern {
    /// Whether this pattern allows `target` on `port`.
    pub(crate) fn matches(&self, target: &Target, port: u16) -> bool {
        self.host_matches(target) && self.port_ok(port)
    }

    /// The port written in the pattern (`None`: [`DEFAULT_PORTS`]).
    pub(crate) fn port(&self) -> Option<u16> {
        self.port
    }

    fn port_ok(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }

    fn host_matches(&self, target: &Target) -> bool {
        match (&self.host, target) {
            (HostPattern::Exact(p), Target::Name(n)) => p == n,
            (HostPattern::Subdomains(domain), Target::Name(n)) => n
                .strip_suffix(domain.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty()),
            (HostPattern::Addr(p), Target::Addr(a)) => p == a,
            (HostPattern::Any, _) => true,
            _ => false,
        }
    }
}

/// A request the policy let through, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Allowed {
    pub target: Target,
    /// `"allowed by pypi.org"`, `"allowed by allow_cidrs 127.0.0.1/32"`.
    pub reason: String,
}

/// A request the policy denied, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Denied {
    pub reason: String,
    /// The address the host means, when it was a literal.
    pub addr: Option<IpAddr>,
}

/// The parsed allowlist and address exceptions of one sandbox.
///
/// A request is allowed when its host matches an allow pattern (with the port rule:
/// the pattern's port, or 80 and 443 without one) and every address it means is
/// allowed by [`Policy::check_addr`]. An IP-literal host is also allowed, on any port,
/// when its address is inside an `allow_cidrs` range.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    patterns: Vec<Pattern>,
    /// With the entries as written, for reasons.
    cidrs: Vec<(Cidr, String)>,
    /// Deny rules by host (any port), as parsed.
    deny_hosts: Vec<Pattern>,
    /// Deny rules by address range, with the entries as written.
    deny_cidrs: Vec<(Cidr, String)>,
}

impl Policy {
    /// Parses allow patterns (`pypi.org`, `*.pythonhosted.org`, `api.example.com:8443`,
    /// `93.184.215.14`, `[2606:2800::1]:443`) and CIDRs (`10.1.2.3/32`, `fd00::/8`).
    /// An error names the entry (`network.allow[2]`, `network.allow_cidrs[0]`) and says
    /// what is allowed.
    pub fn new(allow: &[String], allow_cidrs: &[String]) -> Result<Policy, PolicyError> {
        for (field, list) in [("network.allow", allow), ("network.allow_cidrs", allow_cidrs)] {
            if list.len() > MAX_ENTRIES {
                return Err(PolicyError {
                    field: field.into(),
                    message: format!("at most {MAX_ENTRIES} entries"),
                });
            }
        }
        let patterns = allow
            .iter()
            .enumerate()
            .map(|(i, s)| {
                parse_pattern(s).map_err(|why| PolicyError {
                    field: format!("network.allow[{i}]"),
                    message: format!(
                        "{s:?} is not a host pattern ({why}); expected NAME, *.DOMAIN or an IP \
                         address ([...] for IPv6), each optionally with :PORT (1-65535)"
                    ),
                })
            })
            .collect::<Result<_, _>>()?;
        let cidrs = allow_cidrs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.parse::<Cidr>()
                    .map(|c| (c, s.clone()))
                    .map_err(|why| PolicyError {
                        field: format!("network.allow_cidrs[{i}]"),
                        message: format!(
                            "{s:?} is not a CIDR ({why}); expected ADDRESS/PREFIX such as \
                         10.1.2.3/32 or fd00::/8, or a single address"
                        ),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Policy {
            patterns,
            cidrs,
            deny_hosts: Vec::new(),
            deny_cidrs: Vec::new(),
        })
    }

    /// The policy of a sandbox in proxy mode: its allow patterns, address exceptions and
    /// deny rules (`HOST`, `*.DOMAIN` or a CIDR: deny wins over allow).
    pub fn from_proxy(p: &airlock_spec::ProxyPolicy) -> Result<Policy, PolicyError> {
        let mut policy = Policy::new(&p.allow, &p.allow_cidrs)?;
        if p.deny.len() > MAX_ENTRIES {
            return Err(PolicyError {
                field: "network.deny".into(),
                message: format!("at most {MAX_ENTRIES} entries"),
            });
        }
        for (i, s) in p.deny.iter().enumerate() {
            if let Ok(cidr) = s.parse::<Cidr>() {
                policy.deny_cidrs.push((cidr, s.clone()));
                continue;
            }
            let pattern = parse_pattern(s)
                .ok()
                .filter(|p| p.port.is_none() && !matches!(p.host, HostPattern::Any))
                .ok_or_else(|| PolicyError {
                    field: format!("network.deny[{i}]"),
                    message: format!(
                        "{s:?} is not a deny rule; expected NAME, *.DOMAIN, an IP address or \
                         a CIDR such as 203.0.113.0/24 (no port: a deny rule covers every port)"
                    ),
                })?;
            policy.deny_hosts.push(pattern);
        }
        Ok(policy)
    }

    /// The deny rule covering `target`, if any.
    fn denied_host(&self, target: &Target) -> Option<&str> {
        if let Some(p) = self.deny_hosts.iter().find(|p| p.host_matches(target)) {
            return Some(&p.text);
        }
        match target {
            Target::Addr(a) => self.denied_addr(*a),
            Target::Name(_) => None,
        }
    }

    /// The deny range holding `a`, if any.
    fn denied_addr(&self, a: IpAddr) -> Option<&str> {
        self.deny_cidrs
            .iter()
            .find(|(c, _)| c.contains(a))
            .map(|(_, text)| text.as_str())
    }

    /// Whether `host` is only missing from the allowlist: not a special address, not a
    /// metadata name, not a deny rule's, not malformed. Only such a denial may be put to
    /// a person for approval.
    pub fn askable(reason: &str) -> bool {
        reason == "not in allowlist" || reason.starts_with("port ")
    }

    /// The decision for a host (as requested) and port, before resolution: `Err(reason)`
    /// when denied by name or port (not in the allowlist, a cloud metadata name, a host
    /// that is no valid name or literal). An IP literal is judged here by the address it
    /// means (with [`Policy::check_addr`]); a name's addresses are judged after
    /// resolution.
    pub fn check_name(&self, host: &str, port: u16) -> Result<Target, String> {
        self.decide_name(host, port)
            .map(|a| a.target)
            .map_err(|d| d.reason)
    }

    /// [`Policy::check_name`] with the reason for an allowed request and the address of a
    /// denied literal.
    pub(crate) fn decide_name(&self, host: &str, port: u16) -> Result<Allowed, Denied> {
        let deny = |reason: String| Denied { reason, addr: None };
        if port == 0 {
            return Err(deny("port 0".into()));
        }
        let target = parse_host(host).map_err(|why| deny(format!("bad host: {why}")))?;
        match &target {
            Target::Name(name) => {
                if METADATA_NAMES.contains(&name.as_str()) {
                    return Err(deny("cloud metadata name".into()));
                }
            }
            Target::Addr(a) => {
                self.check_addr(*a).map_err(|reason| Denied {
                    reason,
                    addr: Some(*a),
                })?;
            }
        }
        if let Some(rule) = self.denied_host(&target) {
            let addr = match target {
                Target::Addr(a) => Some(a),
                Target::Name(_) => None,
            };
            return Err(Denied {
                reason: format!("denied by {rule}"),
                addr,
            });
        }
        let mut port_mismatch = None;
        for p in &self.patterns {
            if p.host_matches(&target) {
                if p.port_ok(port) {
                    return Ok(Allowed {
                        reason: format!("allowed by {}", p.text),
                        target,
                    });
                }
                port_mismatch.get_or_insert(p);
            }
        }
        if let Target::Addr(a) = target
            && let Some((_, text)) = self.cidr_for(a)
        {
            return Ok(Allowed {
                reason: format!("allowed by allow_cidrs {text}"),
                target,
            });
        }
        let addr = match target {
            Target::Addr(a) => Some(a),
            Target::Name(_) => None,
        };
        Err(Denied {
            reason: match port_mismatch {
                Some(p) => format!(
                    "port {port} not in allowlist (allowed by {}: {})",
                    p.text,
                    match p.port {
                        Some(p) => p.to_string(),
                        None => "80 and 443".into(),
                    }
                ),
                None => "not in allowlist".into(),
            },
            addr,
        })
    }

    /// The decision for a DNS query of `name` (no port: any allow pattern's host will
    /// do): `Ok(reason)` when the name may be resolved, `Err(reason)` when not.
    pub(crate) fn decide_dns(&self, name: &str) -> Result<String, String> {
        let target = match parse_host(name).map_err(|why| format!("bad name: {why}"))? {
            Target::Addr(_) => return Err("an address, not a name".into()),
            t => t,
        };
        if let Target::Name(n) = &target
            && METADATA_NAMES.contains(&n.as_str())
        {
            return Err("cloud metadata name".into());
        }
        if let Some(rule) = self.denied_host(&target) {
            return Err(format!("denied by {rule}"));
        }
        self.patterns
            .iter()
            .find(|p| p.host_matches(&target))
            .map(|p| format!("allowed by {}", p.text))
            .ok_or_else(|| "not in allowlist".into())
    }

    /// The decision for one resolved address: `Err(reason)` such as `"link-local address
    /// 169.254.169.254"`, `"private address 10.0.0.5"`, `"loopback address 127.0.0.1"`,
    /// `"IPv4-mapped address ::ffff:a9fe:a9fe embeds link-local address
    /// 169.254.169.254"`, unless an `allow_cidrs` range holds the address (or the IPv4
    /// address it embeds).
    pub fn check_addr(&self, addr: IpAddr) -> Result<(), String> {
        if let Some(rule) = self.denied_addr(addr) {
            return Err(format!("address {} denied by {rule}", addr::format_ip(&addr)));
        }
        if self.cidr_for(addr).is_some() {
            return Ok(());
        }
        match addr {
            IpAddr::V4(v4) => match addr::special_v4(v4) {
                Some(what) => Err(format!("{what} address {v4}")),
                None => Ok(()),
            },
            IpAddr::V6(v6) => {
                if let Some((form, v4)) = addr::embedded_v4(&v6) {
                    return match self.check_addr(IpAddr::V4(v4)) {
                        Ok(()) => Ok(()),
                        Err(inner) => Err(format!(
                            "{form} address {} embeds {inner}",
                            addr::format_ipv6(&v6)
                        )),
                    };
                }
                match addr::special_v6(v6) {
                    Some(what) => Err(format!("{what} address {}", addr::format_ipv6(&v6))),
                    None => Ok(()),
                }
            }
        }
    }

    /// The first `allow_cidrs` range holding `a`.
    fn cidr_for(&self, a: IpAddr) -> Option<&(Cidr, String)> {
        self.cidrs.iter().find(|(c, _)| c.contains(a))
    }
}

/// Reads a host as a request writes it: an IP literal in any spelling (`[v6]`, a bare
/// IPv6 address, an `inet_aton` IPv4 literal) or a DNS name (lower-cased, trailing dot
/// dropped). `Err` says why it is neither.
///
/// ```
/// use airlock_egress::{Target, parse_host};
/// assert_eq!(parse_host("0xA9.0xFE.0xA9.0xFE"), Ok(Target::Addr([169, 254, 169, 254].into())));
/// assert_eq!(parse_host("PyPI.org."), Ok(Target::Name("pypi.org".into())));
/// assert!(parse_host("a b").is_err());
/// ```
pub fn parse_host(host: &str) -> Result<Target, String> {
    if host.is_empty() {
        return Err("empty host".into());
    }
    if host.bytes().any(|b| matches!(b, b'\r' | b'\n' | b'\0')) {
        return Err(format!("{host:?} contains CR, LF or NUL"));
    }
    if host.bytes().any(|b| b == b' ' || b == b'\t') {
        return Err(format!("{host:?} contains a space"));
    }
    if host.bytes().any(|b| b.is_ascii_control()) {
        return Err(format!("{host:?} contains a control character"));
    }
    if !host.is_ascii() {
        return Err(format!("{host:?} is not ASCII (use its punycode form)"));
    }
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| format!("{host:?} has an unclosed ["))?;
        return inner
            .parse::<Ipv6Addr>()
            .map(|a| Target::Addr(IpAddr::V6(a)))
            .map_err(|_| format!("{host:?} is not an IPv6 address"));
    }
    if host.contains(':') {
        return host
            .parse::<Ipv6Addr>()
            .map(|a| Target::Addr(IpAddr::V6(a)))
            .map_err(|_| format!("{host:?} is not a name or an IP address"));
    }
    if addr::ends_in_number(host) {
        return addr::parse_ipv4_literal(host)
            .map(|a| Target::Addr(IpAddr::V4(a)))
            .ok_or_else(|| format!("{host:?} is not a valid IPv4 address"));
    }
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if name.len() > MAX_NAME_LEN {
        return Err(format!("name longer than {MAX_NAME_LEN} characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!("{host:?} contains {c:?}"));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(format!("{host:?} has an empty label"));
        }
        if label.len() > 63 {
            return Err(format!("{host:?} has a label longer than 63 characters"));
        }
    }
    Ok(Target::Name(name))
}

/// Splits `HOST[:PORT]` (`[v6]:PORT`, or a bare IPv6 address without a port) and parses
/// the host part into a pattern.
pub(crate) fn parse_pattern(s: &str) -> Result<Pattern, String> {
    let (host, port) = if s.starts_with('[') {
        let end = s.find(']').ok_or("unclosed [")?;
        match &s[end + 1..] {
            "" => (&s[..=end], None),
            rest => {
                let port = rest.strip_prefix(':').ok_or("text after ]")?;
                (&s[..=end], Some(port))
            }
        }
    } else if s.matches(':').count() > 1 {
        (s, None)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = port.map(parse_port).transpose()?;
    let host = if host == "*" {
        HostPattern::Any
    } else if let Some(domain) = host.strip_prefix("*.") {
        match parse_host(domain)? {
            Target::Name(d) => HostPattern::Subdomains(d),
            Target::Addr(_) => return Err("*. needs a domain, not an address".into()),
        }
    } else if host.contains('*') {
        return Err("* only alone (any host) or as a whole first label: *.example.com".into());
    } else {
        match parse_host(host)? {
            Target::Name(n) if METADATA_NAMES.contains(&n.as_str()) => {
                return Err(format!("{n} is a cloud metadata name, always denied"));
            }
            Target::Name(n) => HostPattern::Exact(n),
            Target::Addr(a) => HostPattern::Addr(a),
        }
    };
    Ok(Pattern {
        text: s.to_string(),
        host,
        port,
    })
}

/// A port as written in a pattern or a request: decimal digits, 1 to 65535.
pub(crate) fn parse_port(p: &str) -> Result<u16, String> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port {p:?} is not a number"));
    }
    match p.parse::<u32>() {
        Ok(n @ 1..=65535) => Ok(n as u16),
        _ => Err(format!("port {p} is not between 1 and 65535")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], cidrs: &[&str]) -> Policy {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Policy::new(&s(allow), &s(cidrs)).unwrap()
    }

    fn allowed(p: &Policy, host: &str, port: u16) -> bool {
        p.check_name(host, port).is_ok()
    }

    #[test]
    fn exact_names_are_case_insensitive_and_ignore_a_trailing_dot() {
        let p = policy(&["pypi.org", "Files.PythonHosted.org."], &[]);
        for host in ["pypi.org", "PYPI.ORG", "pypi.org.", "PyPi.Org."] {
            assert_eq!(
                p.check_name(host, 443),
                Ok(Target::Name("pypi.org".into())),
                "{host}"
            );
        }
        assert!(allowed(&p, "files.pythonhosted.org", 443));
        assert!(!allowed(&p, "pypi.org..", 443));
        assert!(!allowed(&p, "www.pypi.org", 443));
        assert!(!allowed(&p, "evilpypi.org", 443));
        assert!(!allowed(&p, "pypi.org.evil.com", 443));
        assert!(!allowed(&p, "pypi.or", 443));
        assert_eq!(p.check_name("example.com", 443), Err("not in allowlist".into()));
    }

    #[test]
    fn default_ports_are_80_and_443_only() {
        let p = policy(&["pypi.org"], &[]);
        assert!(allowed(&p, "pypi.org", 80));
        assert!(allowed(&p, "pypi.org", 443));
        for port in [22, 25, 8080, 8443, 6379] {
            assert_eq!(
                p.check_name("pypi.org", port),
                Err(format!(
                    "port {port} not in allowlist (allowed by pypi.org: 80 and 443)"
                ))
            );
        }
        assert_eq!(p.check_name("pypi.org", 0), Err("port 0".into()));
    }

    #[test]
    fn an_explicit_port_allows_that_port_only() {
        let p = policy(&["api.example.com:8443", "*.svc.example:9000"], &[]);
        assert!(allowed(&p, "api.example.com", 8443));
        assert!(!allowed(&p, "api.example.com", 443));
        assert!(!allowed(&p, "api.example.com", 80));
        assert!(allowed(&p, "a.svc.example", 9000));
        assert!(!allowed(&p, "a.svc.example", 443));
        // Two patterns for one host: either port.
        let p = policy(&["api.example.com:8443", "api.example.com"], &[]);
        assert!(allowed(&p, "api.example.com", 8443));
        assert!(allowed(&p, "api.example.com", 443));
    }

    #[test]
    fn wildcards_are_label_aware() {
        let p = policy(&["*.pypi.org"], &[]);
        assert!(allowed(&p, "a.pypi.org", 443));
        assert!(allowed(&p, "a.b.pypi.org", 443));
        assert!(allowed(&p, "A.PyPI.org.", 443));
        assert!(!allowed(&p, "pypi.org", 443));
        assert!(!allowed(&p, "evilpypi.org", 443));
        assert!(!allowed(&p, "a.evilpypi.org", 443));
        assert!(!allowed(&p, "pypi.org.evil.com", 443));
        assert!(!allowed(&p, "a.pypi.org.evil.com", 443));
        assert!(!allowed(&p, ".pypi.org", 443));
        // The exact pattern does not match lookalikes either.
        let p = policy(&["pypi.org"], &[]);
        assert!(!allowed(&p, "pypi.org.evil.com", 443));
        assert!(!allowed(&p, "evilpypi.org", 443));
    }

    #[test]
    fn ip_literal_patterns_match_exactly_by_address() {
        let p = policy(
            &[
                "93.184.215.14",
                "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:443",
                "2001:4860::8888",
                "8.8.4.4:853",
            ],
            &[],
        );
        assert!(allowed(&p, "93.184.215.14", 80));
        // Any spelling of the same address.
        assert!(allowed(&p, "1572394766", 443));
        assert!(!allowed(&p, "93.184.215.15", 80));
        assert!(!allowed(&p, "93.184.215.14", 22));
        assert!(allowed(&p, "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]", 443));
        assert!(!allowed(&p, "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]", 80));
        assert!(allowed(&p, "[2001:4860::8888]", 80));
        assert!(allowed(&p, "8.8.4.4", 853));
        assert!(!allowed(&p, "8.8.4.4", 443));
        // A literal pattern does not match a name and a name pattern not a literal.
        assert!(!allowed(&p, "dns.google", 443));
        let p = policy(&["example.com"], &[]);
        assert!(!allowed(&p, "93.184.215.14", 443));
    }

    #[test]
    fn a_literal_pattern_still_needs_allow_cidrs_for_a_private_address() {
        let p = policy(&["10.0.0.5"], &[]);
        assert_eq!(
            p.check_name("10.0.0.5", 80),
            Err("private address 10.0.0.5".into())
        );
        let p = policy(&["10.0.0.5"], &["10.0.0.0/8"]);
        assert!(allowed(&p, "10.0.0.5", 80));
    }

    #[test]
    fn allow_cidrs_allow_literals_on_any_port_but_not_names() {
        let p = policy(&[], &["127.0.0.1/32", "fd00::/8"]);
        assert_eq!(
            p.check_name("127.0.0.1", 5555),
            Ok(Target::Addr("127.0.0.1".parse().unwrap()))
        );
        assert!(allowed(&p, "[fd00:ec2::254]", 80));
        assert_eq!(
            p.check_name("127.0.0.2", 80),
            Err("loopback address 127.0.0.2".into())
        );
        assert_eq!(p.check_name("localhost", 80), Err("not in allowlist".into()));
        assert!(p.check_addr("127.0.0.1".parse().unwrap()).is_ok());
        assert!(p.check_addr("::ffff:127.0.0.1".parse().unwrap()).is_ok());
        assert!(p.check_addr("fd00:ec2::254".parse().unwrap()).is_ok());
        assert_eq!(
            p.check_addr("169.254.169.254".parse().unwrap()),
            Err("link-local address 169.254.169.254".into())
        );
        assert_eq!(
            p.check_name("1.1.1.1", 443),
            Err("not in allowlist".into()),
            "a public literal outside every range"
        );
    }

    #[test]
    fn every_literal_spelling_is_judged_by_its_address() {
        let p = policy(&["*.example.com", "example.com"], &[]);
        let want = Err("link-local address 169.254.169.254".to_string());
        for host in [
            "169.254.169.254",
            "2852039166",
            "0xa9fea9fe",
            "0251.0376.0251.0376",
            "169.254.43518",
            "0xA9.0xFE.0xA9.0xFE",
            "169.254.169.254.",
        ] {
            assert_eq!(p.check_name(host, 80), want, "{host}");
        }
        for host in [
            "[::ffff:a9fe:a9fe]",
            "[::ffff:169.254.169.254]",
            "::ffff:a9fe:a9fe",
        ] {
            assert_eq!(
                p.check_name(host, 80),
                Err("IPv4-mapped address ::ffff:a9fe:a9fe embeds link-local address 169.254.169.254".into()),
                "{host}"
            );
        }
        assert_eq!(p.check_name("[::1]", 443), Err("loopback address ::1".into()));
        assert_eq!(
            p.check_name("127.1", 80),
            Err("loopback address 127.0.0.1".into())
        );
        assert_eq!(p.check_name("0", 80), Err("unspecified address 0.0.0.0".into()));
        assert_eq!(
            p.check_name("[fd00:ec2::254]", 80),
            Err("unique-local address fd00:ec2::254".into())
        );
        // Numeric-looking hosts that are no address are bad hosts, never names.
        for host in ["1.2.3.4.5", "example.123", "256.0.0.1", "08.8.8.8"] {
            assert!(
                p.check_name(host, 80).unwrap_err().starts_with("bad host"),
                "{host}"
            );
        }
    }

    #[test]
    fn denied_reasons_for_addresses() {
        let p = Policy::default();
        let cases = [
            ("169.254.169.254", "link-local address 169.254.169.254"),
            ("10.0.0.5", "private address 10.0.0.5"),
            ("172.20.1.1", "private address 172.20.1.1"),
            ("192.168.0.1", "private address 192.168.0.1"),
            ("127.0.0.1", "loopback address 127.0.0.1"),
            ("0.0.0.0", "unspecified address 0.0.0.0"),
            ("100.100.100.200", "CGNAT address 100.100.100.200"),
            ("192.0.0.170", "IETF protocol assignment address 192.0.0.170"),
            ("198.18.0.1", "benchmarking address 198.18.0.1"),
            ("192.0.2.1", "documentation address 192.0.2.1"),
            ("198.51.100.1", "documentation address 198.51.100.1"),
            ("203.0.113.1", "documentation address 203.0.113.1"),
            ("224.0.0.251", "multicast address 224.0.0.251"),
            ("240.0.0.1", "reserved address 240.0.0.1"),
            ("255.255.255.255", "broadcast address 255.255.255.255"),
            ("::1", "loopback address ::1"),
            ("::", "unspecified address ::"),
            ("fe80::1", "link-local address fe80::1"),
            ("fd00:ec2::254", "unique-local address fd00:ec2::254"),
            ("fc00::1", "unique-local address fc00::1"),
            ("ff02::1", "multicast address ff02::1"),
            ("2001:db8::1", "documentation address 2001:db8::1"),
            (
                "::ffff:169.254.169.254",
                "IPv4-mapped address ::ffff:a9fe:a9fe embeds link-local address 169.254.169.254",
            ),
            (
                "::ffff:10.0.0.5",
                "IPv4-mapped address ::ffff:a00:5 embeds private address 10.0.0.5",
            ),
            (
                "::ffff:127.0.0.1",
                "IPv4-mapped address ::ffff:7f00:1 embeds loopback address 127.0.0.1",
            ),
            (
                "::a9fe:a9fe",
                "IPv4-compatible address ::a9fe:a9fe embeds link-local address 169.254.169.254",
            ),
            (
                "::127.0.0.1",
                "IPv4-compatible address ::7f00:1 embeds loopback address 127.0.0.1",
            ),
            (
                "64:ff9b::a9fe:a9fe",
                "NAT64 address 64:ff9b::a9fe:a9fe embeds link-local address 169.254.169.254",
            ),
            (
                "64:ff9b::10.0.0.5",
                "NAT64 address 64:ff9b::a00:5 embeds private address 10.0.0.5",
            ),
            (
                "2002:a9fe:a9fe::1",
                "6to4 address 2002:a9fe:a9fe::1 embeds link-local address 169.254.169.254",
            ),
            (
                "2002:c0a8:0101::",
                "6to4 address 2002:c0a8:101:: embeds private address 192.168.1.1",
            ),
            (
                "::ffff:0:a9fe:a9fe",
                "IPv4-translated address ::ffff:0:a9fe:a9fe embeds link-local address 169.254.169.254",
            ),
        ];
        for (a, want) in cases {
            assert_eq!(p.check_addr(a.parse().unwrap()), Err(want.to_string()), "{a}");
        }
        for a in [
            "8.8.8.8",
            "151.101.0.223",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert_eq!(p.check_addr(a.parse().unwrap()), Ok(()), "{a}");
        }
    }

    #[test]
    fn allow_cidrs_apply_to_the_embedded_ipv4_address() {
        let p = policy(&[], &["10.0.0.0/8"]);
        assert!(p.check_addr("::ffff:10.0.0.5".parse().unwrap()).is_ok());
        assert!(p.check_addr("64:ff9b::10.0.0.5".parse().unwrap()).is_ok());
        assert!(p.check_addr("::ffff:169.254.169.254".parse().unwrap()).is_err());
    }

    #[test]
    fn metadata_names_are_denied_by_name() {
        let p = policy(
            &["*.google.internal", "*.internal", "*.goog", "*.ec2.internal"],
            &[],
        );
        for host in [
            "metadata.google.internal",
            "metadata.google.internal.",
            "METADATA.Google.Internal",
            "metadata",
            "metadata.",
            "Metadata",
            "metadata.goog",
            "instance-data",
            "instance-data.",
            "instance-data.ec2.internal",
            "INSTANCE-DATA.EC2.INTERNAL.",
        ] {
            assert_eq!(
                p.check_name(host, 80),
                Err("cloud metadata name".into()),
                "{host}"
            );
        }
        // Other names under an allowed wildcard are fine.
        assert!(allowed(&p, "storage.google.internal", 443));
    }

    #[test]
    fn bad_hosts_are_denied() {
        let p = policy(&["*.example.com"], &[]);
        for host in [
            "",
            "a\r\nb.example.com",
            "a\nb.example.com",
            "a\rb.example.com",
            "a\0.example.com",
            "a b.example.com",
            "a\tb.example.com",
            "a\x07.example.com",
            "a%2e.example.com",
            "a/.example.com",
            "a@b.example.com",
            "a..example.com",
            ".example.com",
            "é.example.com",
            "[::1",
            "[169.254.169.254]",
            "[fe80::1%eth0]",
            "1:2:3",
            "a*.example.com",
        ] {
            let r = p.check_name(host, 80);
            assert!(
                r.as_ref().is_err_and(|e| e.starts_with("bad host: ")),
                "{host:?}: {r:?}"
            );
        }
        let long = format!("{}.example.com", "a".repeat(64));
        assert!(p.check_name(&long, 80).is_err());
        let long = format!("{}example.com", "a.".repeat(130));
        assert!(p.check_name(&long, 80).is_err());
        assert!(allowed(&p, "under_score.example.com", 80));
    }

    #[test]
    fn errors_name_the_entry_and_say_what_is_allowed() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let e = Policy::new(&s(&["pypi.org", "ok.example", "bad host"]), &[]).unwrap_err();
        assert_eq!(e.field, "network.allow[2]");
        assert!(
            e.message.contains("expected NAME, *.DOMAIN or an IP address"),
            "{}",
            e.message
        );
        assert!(
            e.to_string()
                .starts_with("network.allow[2]: \"bad host\" is not a host pattern")
        );
        for bad in [
            "a:0",
            "a:65536",
            "a:x",
            "a:",
            "*.",
            "a.*.com",
            "*.1.2.3.4",
            "[::1]x",
            "[::1",
            "metadata.google.internal",
            "https://pypi.org",
            "a/b",
            "",
        ] {
            let e = Policy::new(&s(&[bad]), &[]).unwrap_err();
            assert_eq!(e.field, "network.allow[0]", "{bad}");
        }
        let e = Policy::new(&[], &s(&["10.0.0.0/8", "10.0.0.0/33"])).unwrap_err();
        assert_eq!(e.field, "network.allow_cidrs[1]");
        assert!(e.message.contains("expected ADDRESS/PREFIX"), "{}", e.message);
        let e = Policy::new(&s(&vec!["a.example"; MAX_ENTRIES + 1]), &[]).unwrap_err();
        assert_eq!(e.field, "network.allow");
        // Good ones.
        Policy::new(
            &s(&[
                "pypi.org",
                "*.pythonhosted.org",
                "api.example.com:8443",
                "1.2.3.4",
                "1.2.3.4:80",
                "[::1]:8080",
                "2001:db8::1",
                "EXAMPLE.com.",
            ]),
            &s(&["10.0.0.0/8", "fd00::/8", "127.0.0.1"]),
        )
        .unwrap();
    }

    fn with_deny(allow: &[&str], deny: &[&str]) -> Policy {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Policy::from_proxy(&airlock_spec::ProxyPolicy {
            allow: s(allow),
            deny: s(deny),
            ..airlock_spec::ProxyPolicy::default()
        })
        .unwrap()
    }

    #[test]
    fn star_allows_any_public_host_and_still_guards_addresses() {
        let p = policy(&["*"], &[]);
        assert!(allowed(&p, "example.com", 443));
        assert!(allowed(&p, "a.b.example.org", 80));
        assert!(!allowed(&p, "example.com", 22), "* keeps the default ports");
        assert!(allowed(&p, "93.184.215.14", 443));
        for host in [
            "169.254.169.254",
            "0xa9fea9fe",
            "[::ffff:a9fe:a9fe]",
            "127.0.0.1",
            "10.0.0.1",
            "[fd00:ec2::254]",
        ] {
            assert!(!allowed(&p, host, 80), "{host}");
        }
        assert_eq!(
            p.check_name("metadata.google.internal", 80),
            Err("cloud metadata name".into())
        );
        assert_eq!(
            p.check_addr("169.254.169.254".parse().unwrap()),
            Err("link-local address 169.254.169.254".into())
        );
        let any_port = policy(&["*:8443"], &[]);
        assert!(allowed(&any_port, "example.com", 8443));
        assert!(!allowed(&any_port, "example.com", 443));
    }

    #[test]
    fn deny_wins_over_allow_by_name_domain_and_range() {
        let p = with_deny(
            &["*"],
            &["*.internal.example", "blocked.example", "203.0.113.0/24"],
        );
        assert_eq!(
            p.check_name("db.internal.example", 443),
            Err("denied by *.internal.example".into())
        );
        assert_eq!(
            p.check_name("BLOCKED.example.", 80),
            Err("denied by blocked.example".into())
        );
        assert!(
            allowed(&p, "internal.example", 443),
            "*.domain is subdomains only"
        );
        assert_eq!(
            p.check_name("203.0.113.9", 443),
            Err("address 203.0.113.9 denied by 203.0.113.0/24".into())
        );
        assert_eq!(
            p.check_addr("203.0.113.9".parse().unwrap()),
            Err("address 203.0.113.9 denied by 203.0.113.0/24".into())
        );
        let exact = with_deny(&["api.example.com"], &["api.example.com"]);
        assert_eq!(
            exact.check_name("api.example.com", 443),
            Err("denied by api.example.com".into())
        );
        assert!(Policy::askable("not in allowlist"));
        assert!(!Policy::askable("denied by api.example.com"));
        assert!(!Policy::askable("link-local address 169.254.169.254"));
    }

    #[test]
    fn bad_deny_rules_name_the_entry() {
        for bad in ["*", "a.example:443", "a b", "*.1.2.3.4"] {
            let err = Policy::from_proxy(&airlock_spec::ProxyPolicy {
                deny: vec!["ok.example".into(), bad.into()],
                ..airlock_spec::ProxyPolicy::default()
            })
            .unwrap_err();
            assert_eq!(err.field, "network.deny[1]", "{bad}");
            assert!(
                err.message.contains("a deny rule covers every port"),
                "{}",
                err.message
            );
        }
    }
}
