//! Addresses: IP literals in every spelling a resolver would accept, the ranges the SSRF
//! guard denies, IPv6 forms that embed an IPv4 address, and CIDR ranges.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Parses an IPv4 literal the way `inet_aton(3)` (and so `getaddrinfo`, curl and the URL
/// standard) reads it: 1 to 4 dot-separated parts, each decimal, octal (leading `0`) or
/// hex (`0x`); the last part fills all the remaining bytes. `2852039166`, `0xa9fea9fe`,
/// `0251.0376.0251.0376` and `169.254.43518` all mean 169.254.169.254. One trailing dot
/// is ignored.
///
/// ```
/// use airlock_egress::parse_ipv4_literal;
/// assert_eq!(parse_ipv4_literal("169.254.43518"), Some([169, 254, 169, 254].into()));
/// assert_eq!(parse_ipv4_literal("1.2.3.4.5"), None);
/// ```
pub fn parse_ipv4_literal(s: &str) -> Option<Ipv4Addr> {
    let s = s.strip_suffix('.').unwrap_or(s);
    if s.is_empty() {
        return None;
    }
    let mut parts = [0u64; 4];
    let mut n = 0;
    for part in s.split('.') {
        if n == 4 {
            return None;
        }
        parts[n] = parse_part(part)?;
        n += 1;
    }
    let mut value: u64 = 0;
    for &part in &parts[..n - 1] {
        if part > 0xff {
            return None;
        }
        value = (value << 8) | part;
    }
    // The last part fills what the others left: 32 bits alone, 8 bits after three others.
    let rest_bits = 8 * (5 - n as u32);
    let last = parts[n - 1];
    if last >= 1u64 << rest_bits {
        return None;
    }
    value = (value << rest_bits) | last;
    Some(Ipv4Addr::from(u32::try_from(value).ok()?))
}

/// One part of an `inet_aton` literal: `0x..` hex, `0..` octal, else decimal.
fn parse_part(part: &str) -> Option<u64> {
    let (digits, radix) = if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        if hex.is_empty() {
            // "0x" alone is 0 to inet_aton and to the URL standard.
            return Some(0);
        }
        (hex, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if digits.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    for c in digits.chars() {
        let d = c.to_digit(radix)?;
        value = value.checked_mul(u64::from(radix))?.checked_add(u64::from(d))?;
        if value > u64::from(u32::MAX) {
            return None;
        }
    }
    Some(value)
}

/// Whether `host` must be read as an IPv4 literal rather than a name: its last label is a
/// number (decimal digits, or `0x` and hex digits), as the URL standard's "ends in a
/// number" rule says. `example.123` is then an invalid literal, never a name.
pub(crate) fn ends_in_number(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    let last = host.rsplit('.').next().unwrap_or("");
    if last.is_empty() {
        return false;
    }
    if let Some(hex) = last.strip_prefix("0x").or_else(|| last.strip_prefix("0X")) {
        return hex.chars().all(|c| c.is_ascii_hexdigit());
    }
    last.chars().all(|c| c.is_ascii_digit())
}

/// IPv4 ranges denied unless allowed by a CIDR; the first match names the reason, so the
/// broadcast address comes before 240.0.0.0/4.
const DENIED_V4: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::new(255, 255, 255, 255), 32, "broadcast"),
    (Ipv4Addr::new(0, 0, 0, 0), 8, "unspecified"),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private"),
    (Ipv4Addr::new(100, 64, 0, 0), 10, "CGNAT"),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback"),
    (Ipv4Addr::new(169, 254, 0, 0), 16, "link-local"),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private"),
    (Ipv4Addr::new(192, 0, 0, 0), 24, "IETF protocol assignment"),
    (Ipv4Addr::new(192, 0, 2, 0), 24, "documentation"),
    (Ipv4Addr::new(192, 168, 0, 0), 16, "private"),
    (Ipv4Addr::new(198, 18, 0, 0), 15, "benchmarking"),
    (Ipv4Addr::new(198, 51, 100, 0), 24, "documentation"),
    (Ipv4Addr::new(203, 0, 113, 0), 24, "documentation"),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast"),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "reserved"),
];

/// IPv6 ranges denied unless allowed by a CIDR (forms embedding an IPv4 address are
/// judged by that address first, see [`embedded_v4`]).
const DENIED_V6: &[(Ipv6Addr, u8, &str)] = &[
    (Ipv6Addr::UNSPECIFIED, 128, "unspecified"),
    (Ipv6Addr::LOCALHOST, 128, "loopback"),
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10, "link-local"),
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10, "site-local"),
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7, "unique-local"),
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8, "multicast"),
    (
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0),
        32,
        "documentation",
    ),
    // Teredo hides an (obfuscated) IPv4 address; nothing a sandbox needs.
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 32, "Teredo"),
    (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64, "discard-only"),
    // Local-use NAT64 (RFC 8215): the IPv4 address may sit anywhere in it.
    (
        Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0),
        48,
        "local-use NAT64",
    ),
];

/// The IPv4 address an IPv6 address carries and the name of the form, for the forms a
/// stack may turn into an IPv4 connection: IPv4-mapped `::ffff:0:0/96`, IPv4-translated
/// `::ffff:0:0:0/96`, IPv4-compatible `::/96` (except `::` and `::1`), NAT64
/// `64:ff9b::/96` and 6to4 `2002::/16`.
pub(crate) fn embedded_v4(a: &Ipv6Addr) -> Option<(&'static str, Ipv4Addr)> {
    let s = a.segments();
    let o = a.octets();
    let last32 = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if s[..5] == [0; 5] && s[5] == 0xffff {
        Some(("IPv4-mapped", last32))
    } else if s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0 {
        Some(("IPv4-translated", last32))
    } else if s[..6] == [0; 6] && *a != Ipv6Addr::UNSPECIFIED && *a != Ipv6Addr::LOCALHOST {
        Some(("IPv4-compatible", last32))
    } else if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4] {
        Some(("NAT64", last32))
    } else if s[0] == 0x2002 {
        Some(("6to4", Ipv4Addr::new(o[2], o[3], o[4], o[5])))
    } else {
        None
    }
}

/// The kind of special address `a` is (`"link-local"`, `"private"`, …), or `None` for an
/// ordinary public IPv4 address.
pub(crate) fn special_v4(a: Ipv4Addr) -> Option<&'static str> {
    DENIED_V4
        .iter()
        .find(|(net, len, _)| prefix_match_v4(*net, *len, a))
        .map(|(_, _, what)| *what)
}

/// The kind of special address `a` is, by the IPv6 table alone.
pub(crate) fn special_v6(a: Ipv6Addr) -> Option<&'static str> {
    DENIED_V6
        .iter()
        .find(|(net, len, _)| prefix_match_v6(*net, *len, a))
        .map(|(_, _, what)| *what)
}

fn prefix_match_v4(net: Ipv4Addr, len: u8, a: Ipv4Addr) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    u32::from(net) & mask == u32::from(a) & mask
}

fn prefix_match_v6(net: Ipv6Addr, len: u8, a: Ipv6Addr) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    };
    u128::from(net) & mask == u128::from(a) & mask
}

/// An IPv6 address in RFC 5952 form with hex groups only: `::ffff:a9fe:a9fe`, never the
/// dotted `::ffff:169.254.169.254` that `Display` prints for mapped addresses, so a reason
/// shows the embedded IPv4 address once, spelled as such.
pub fn format_ipv6(a: &Ipv6Addr) -> String {
    let s = a.segments();
    // The longest run of two or more zero groups (the first on a tie) becomes "::".
    let (mut best_start, mut best_len) = (0, 0);
    let mut i = 0;
    while i < 8 {
        if s[i] == 0 {
            let start = i;
            while i < 8 && s[i] == 0 {
                i += 1;
            }
            if i - start > best_len {
                (best_start, best_len) = (start, i - start);
            }
        } else {
            i += 1;
        }
    }
    let join = |groups: &[u16]| {
        groups
            .iter()
            .map(|g| format!("{g:x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    if best_len < 2 {
        return join(&s);
    }
    format!(
        "{}::{}",
        join(&s[..best_start]),
        join(&s[best_start + best_len..])
    )
}

/// An address as the log and the reasons print it (IPv6 via [`format_ipv6`]).
pub fn format_ip(a: &IpAddr) -> String {
    match a {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format_ipv6(v6),
    }
}

/// An address range: `10.0.0.0/8`, `fd00::/8`, `127.0.0.1/32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The network address (host bits cleared).
    addr: IpAddr,
    /// The prefix length: at most 32 for IPv4, 128 for IPv6.
    len: u8,
}

/// Why a string is not a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CidrError(String);

impl Cidr {
    /// The range of the addresses whose first `len` bits are those of `addr`; `None` if
    /// `len` is longer than the address.
    pub fn new(addr: IpAddr, len: u8) -> Option<Cidr> {
        match addr {
            IpAddr::V4(a) if len <= 32 => {
                let mask = if len == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(len))
                };
                Some(Cidr {
                    addr: IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask)),
                    len,
                })
            }
            IpAddr::V6(a) if len <= 128 => {
                let mask = if len == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(len))
                };
                Some(Cidr {
                    addr: IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask)),
                    len,
                })
            }
            _ => None,
        }
    }

    /// Whether `a` is in the range (an IPv4 address is never in an IPv6 range, nor the
    /// reverse: embedded forms are unwrapped by the caller).
    pub fn contains(&self, a: IpAddr) -> bool {
        match (self.addr, a) {
            (IpAddr::V4(net), IpAddr::V4(a)) => prefix_match_v4(net, self.len, a),
            (IpAddr::V6(net), IpAddr::V6(a)) => prefix_match_v6(net, self.len, a),
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    /// `ADDRESS/PREFIX` in canonical notation (no octal or hex IPv4 parts); a bare
    /// address is a single-address range. Host bits past the prefix are cleared.
    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let (addr, len) = match s.split_once('/') {
            Some((addr, len)) => (addr, Some(len)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| CidrError(format!("{addr:?} is not an IP address")))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) if !l.is_empty() && l.len() <= 3 && l.bytes().all(|b| b.is_ascii_digit()) => {
                l.parse::<u8>().unwrap_or(u8::MAX)
            }
            Some(l) => return Err(CidrError(format!("prefix length {l:?} is not a number"))),
        };
        Cidr::new(addr, len).ok_or_else(|| CidrError(format!("prefix length {len} is longer than {max}")))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", format_ip(&self.addr), self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn every_inet_aton_spelling_of_the_metadata_address() {
        let meta = v4("169.254.169.254");
        for s in [
            "169.254.169.254",
            "169.254.169.254.",
            "2852039166",
            "0xa9fea9fe",
            "0XA9FEA9FE",
            "0251.0376.0251.0376",
            "00251.0376.0251.0376",
            "169.254.43518",
            "169.0xfea9fe",
            "0xA9.0xFE.0xA9.0xFE",
            "0xa9.254.0251.0xfe",
            "025177524776",
        ] {
            assert_eq!(parse_ipv4_literal(s), Some(meta), "{s}");
        }
    }

    #[test]
    fn other_literals_and_invalid_ones() {
        assert_eq!(parse_ipv4_literal("0"), Some(v4("0.0.0.0")));
        assert_eq!(parse_ipv4_literal("0x"), Some(v4("0.0.0.0")));
        assert_eq!(parse_ipv4_literal("127.1"), Some(v4("127.0.0.1")));
        assert_eq!(parse_ipv4_literal("1.2.65535"), Some(v4("1.2.255.255")));
        assert_eq!(parse_ipv4_literal("4294967295"), Some(v4("255.255.255.255")));
        for bad in [
            "",
            ".",
            "1..2",
            "1.2.3.4.5",
            "256.1.1.1",
            "1.2.3.256",
            "1.2.65536",
            "1.16777216",
            "4294967296",
            "0x100000000",
            "08.1.1.1",
            "09",
            "1.2.3.-4",
            "1.2.3.+4",
            "1.2.3.4..",
            "0x1g",
            "99999999999999999999999",
        ] {
            assert_eq!(parse_ipv4_literal(bad), None, "{bad}");
        }
    }

    #[test]
    fn ends_in_a_number() {
        for s in ["1.2.3.4", "2852039166", "a.0x1f", "example.123", "1.2.3.4."] {
            assert!(ends_in_number(s), "{s}");
        }
        for s in ["example.com", "1.2.3.com", "0x1g", "a.0xz", "1e5", "", "."] {
            assert!(!ends_in_number(s), "{s}");
        }
    }

    #[test]
    fn every_denied_ipv4_range_and_its_edges() {
        let cases = [
            ("0.0.0.0", Some("unspecified")),
            ("0.255.255.255", Some("unspecified")),
            ("10.0.0.5", Some("private")),
            ("100.64.0.1", Some("CGNAT")),
            ("100.127.255.255", Some("CGNAT")),
            ("100.128.0.0", None),
            ("127.0.0.1", Some("loopback")),
            ("127.255.255.254", Some("loopback")),
            ("169.254.169.254", Some("link-local")),
            ("172.16.0.1", Some("private")),
            ("172.31.255.255", Some("private")),
            ("172.32.0.0", None),
            ("172.15.255.255", None),
            ("192.0.0.8", Some("IETF protocol assignment")),
            ("192.0.2.1", Some("documentation")),
            ("192.168.1.1", Some("private")),
            ("198.18.0.1", Some("benchmarking")),
            ("198.19.255.255", Some("benchmarking")),
            ("198.20.0.0", None),
            ("198.51.100.7", Some("documentation")),
            ("203.0.113.9", Some("documentation")),
            ("224.0.0.1", Some("multicast")),
            ("239.255.255.250", Some("multicast")),
            ("240.0.0.1", Some("reserved")),
            ("255.255.255.254", Some("reserved")),
            ("255.255.255.255", Some("broadcast")),
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("151.101.0.223", None),
        ];
        for (a, want) in cases {
            assert_eq!(special_v4(v4(a)), want, "{a}");
        }
    }

    #[test]
    fn every_denied_ipv6_range() {
        let cases = [
            ("::", Some("unspecified")),
            ("::1", Some("loopback")),
            ("fe80::1", Some("link-local")),
            ("febf::1", Some("link-local")),
            ("fec0::1", Some("site-local")),
            ("fc00::1", Some("unique-local")),
            ("fd00:ec2::254", Some("unique-local")),
            ("ff02::1", Some("multicast")),
            ("2001:db8::1", Some("documentation")),
            ("2001::1", Some("Teredo")),
            ("100::1", Some("discard-only")),
            ("64:ff9b:1::a9fe:a9fe", Some("local-use NAT64")),
            ("2606:4700:4700::1111", None),
            ("2a04:4e42::223", None),
        ];
        for (a, want) in cases {
            assert_eq!(special_v6(a.parse().unwrap()), want, "{a}");
        }
    }

    #[test]
    fn ipv6_forms_that_embed_an_ipv4_address() {
        let meta = v4("169.254.169.254");
        let cases = [
            ("::ffff:a9fe:a9fe", "IPv4-mapped"),
            ("::ffff:169.254.169.254", "IPv4-mapped"),
            ("::ffff:0:a9fe:a9fe", "IPv4-translated"),
            ("::a9fe:a9fe", "IPv4-compatible"),
            ("::169.254.169.254", "IPv4-compatible"),
            ("64:ff9b::a9fe:a9fe", "NAT64"),
            ("2002:a9fe:a9fe::", "6to4"),
            ("2002:a9fe:a9fe:1234::1", "6to4"),
        ];
        for (a, form) in cases {
            let a: Ipv6Addr = a.parse().unwrap();
            assert_eq!(embedded_v4(&a), Some((form, meta)), "{a}");
        }
        for a in ["::", "::1", "2606:4700::1111", "fe80::a9fe:a9fe"] {
            assert_eq!(embedded_v4(&a.parse().unwrap()), None, "{a}");
        }
    }

    #[test]
    fn ipv6_is_printed_in_hex_groups() {
        for (a, want) in [
            ("::ffff:169.254.169.254", "::ffff:a9fe:a9fe"),
            ("::", "::"),
            ("::1", "::1"),
            ("fd00:ec2::254", "fd00:ec2::254"),
            ("2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1"),
            ("1:0:0:2:0:0:0:3", "1:0:0:2::3"),
            ("1:0:0:2:2:0:0:3", "1::2:2:0:0:3"),
            ("2002:a9fe:a9fe::", "2002:a9fe:a9fe::"),
        ] {
            assert_eq!(format_ipv6(&a.parse().unwrap()), want, "{a}");
        }
    }

    #[test]
    fn cidrs() {
        let c: Cidr = "10.1.2.3/8".parse().unwrap();
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert!(c.contains("10.200.0.1".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(!c.contains("::ffff:10.0.0.1".parse().unwrap()));
        let one: Cidr = "127.0.0.1".parse().unwrap();
        assert_eq!(one.to_string(), "127.0.0.1/32");
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd00:ec2::254".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/x",
            "010.0.0.1/32",
            "host/8",
            "10.0.0.0/-1",
            "10.0.0.0/0008",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
