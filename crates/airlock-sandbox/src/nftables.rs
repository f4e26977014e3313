//! The proxy mode's nf_tables rules, installed by init in the sandbox's own network
//! namespace (never the host's): every TCP connection to a non-loopback address is
//! redirected to the transparent proxy port on the sandbox's loopback, every UDP datagram
//! to port 53 of any non-loopback address to airlock's resolver there, and everything
//! else that would leave loopback is rejected (a local sender gets `EPERM`). The ruleset,
//! in `nft` syntax (what `nft list ruleset` shows in such a namespace):
//!
//! ```text
//! table ip airlock {
//!     chain nat {
//!         type nat hook output priority -100; policy accept;
//!         meta l4proto tcp ip daddr != 127.0.0.0/8 redirect to :3129
//!         udp dport 53 ip daddr != 127.0.0.0/8 redirect to :53
//!     }
//!     chain filter {
//!         type filter hook output priority filter; policy accept;
//!         oif "lo" accept
//!         ip daddr 127.0.0.0/8 accept
//!         reject
//!     }
//! }
//! table ip6 airlock {
//!     chain filter {
//!         type filter hook output priority filter; policy accept;
//!         oif "lo" accept
//!         reject
//!     }
//! }
//! ```
//!
//! `ip daddr 127.0.0.0/8 accept` is what lets a redirected packet through: the output
//! interface the filter chain sees is the one the packet was first routed to (the
//! namespace's TUN device, see `netns`), also after the nat chain rewrote its
//! destination to loopback. `oif "lo" accept` lets through what is routed to the
//! sandbox's own addresses (the replies of the proxy's sockets to a redirected client).
//! IPv6 has no route but loopback's; its table rejects the rest all the same.
//!
//! The rules are sent as one batch (all or nothing) over a `NETLINK_NETFILTER` socket,
//! encoded here by hand, because no well-kept crate under a compatible licence has the
//! NAT/redirect expressions (rustables is GPL; nf_tables 0.1 has no NAT) and the `nft`
//! binary costs about 4 ms per sandbox and is not in the micro-VM guest. The encoding
//! follows `linux/netfilter/nf_tables.h`; the expressions are the ones `nft -d netlink`
//! prints for the ruleset above, and a test checks `nft list ruleset` against it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The table's name, in both families.
pub const TABLE: &str = "airlock";

// linux/netlink.h
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLMSG_ERROR: u16 = 0x2;
const NLA_F_NESTED: u16 = 0x8000;

// linux/netfilter/nfnetlink.h
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;

// linux/netfilter.h
const NFPROTO_UNSPEC: u8 = 0;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_ACCEPT: u32 = 1;

// linux/netfilter/nf_tables.h: messages
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
// attributes of a table, a chain, a hook, a rule, an expression
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
// data: a value, or a verdict
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
// registers: the verdict, and the first 16-byte data register
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
// meta
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFT_META_OIF: u32 = 5;
const NFT_META_L4PROTO: u32 = 16;
// cmp
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
// payload
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
// immediate
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
// redir (linux/netfilter/nf_nat.h for the flag)
const NFTA_REDIR_REG_PROTO_MIN: u16 = 1;
const NFTA_REDIR_FLAGS: u16 = 3;
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 1 << 1;
// reject: an ICMP "port unreachable" (v4 code 3, v6 code 4), as plain `reject` does
const NFTA_REJECT_TYPE: u16 = 1;
const NFTA_REJECT_ICMP_CODE: u16 = 2;
const NFT_REJECT_ICMP_UNREACH: u32 = 0;
const ICMP_PORT_UNREACH: u8 = 3;
const ICMPV6_PORT_UNREACH: u8 = 4;

/// Protocol numbers (netinet/in.h).
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
/// The first octet of 127.0.0.0/8: the rules compare one byte, as `nft` does.
const LOOPBACK_NET: u8 = 127;
/// Offset of the destination address in the IPv4 header.
const IPV4_DADDR: u32 = 16;
/// Offset of the destination port in the TCP and UDP headers.
const L4_DPORT: u32 = 2;
/// Loopback's interface index: the first device of every network namespace.
const LOOPBACK_IFINDEX: u32 = 1;

/// The ports the rules redirect to, on the namespace's loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redirect {
    /// Where TCP connections to non-loopback addresses go.
    pub transparent_port: u16,
    /// Where UDP datagrams to port 53 of non-loopback addresses go.
    pub dns_port: u16,
}

/// Why the rules could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The netlink socket could not be opened or used.
    #[error("nf_tables netlink socket: {0}")]
    Socket(#[source] io::Error),
    /// The kernel refused a message of the batch (nothing of it was applied).
    #[error("nf_tables refused message {seq} of the batch: {source}")]
    Refused {
        /// The message's sequence number (1: the first table).
        seq: u32,
        /// The kernel's errno.
        #[source]
        source: io::Error,
    },
    /// The kernel's answer could not be read.
    #[error("nf_tables answered something unreadable: {0}")]
    Answer(&'static str),
}

/// A netlink message under construction.
struct Msg {
    buf: Vec<u8>,
    /// Starts of the nested attributes still open.
    open: Vec<usize>,
}

impl Msg {
    /// A message of `kind` with its `nfgenmsg` header for `family`.
    fn new(kind: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> Msg {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set by `finish`
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
        buf.push(family);
        buf.push(0); // NFNETLINK_V0
        buf.extend_from_slice(&res_id.to_be_bytes());
        Msg {
            buf,
            open: Vec::new(),
        }
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn attr(&mut self, kind: u16, data: &[u8]) -> &mut Self {
        let len = (4 + data.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
        self
    }

    fn str(&mut self, kind: u16, s: &str) -> &mut Self {
        let mut data = s.as_bytes().to_vec();
        data.push(0);
        self.attr(kind, &data)
    }

    /// A 32-bit attribute: in network byte order, as nf_tables wants them.
    fn u32(&mut self, kind: u16, v: u32) -> &mut Self {
        self.attr(kind, &v.to_be_bytes())
    }

    fn begin(&mut self, kind: u16) -> &mut Self {
        self.open.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        self
    }

    fn end(&mut self) -> &mut Self {
        let start = self.open.pop().expect("end matches a begin");
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    /// One expression: `name` with its attributes written by `data`.
    fn expr(&mut self, name: &str, data: impl FnOnce(&mut Msg)) -> &mut Self {
        self.begin(NFTA_LIST_ELEM)
            .str(NFTA_EXPR_NAME, name)
            .begin(NFTA_EXPR_DATA);
        data(self);
        self.end().end()
    }

    fn meta(&mut self, key: u32) -> &mut Self {
        self.expr("meta", |m| {
            m.u32(NFTA_META_KEY, key).u32(NFTA_META_DREG, NFT_REG_1);
        })
    }

    fn cmp(&mut self, op: u32, value: &[u8]) -> &mut Self {
        self.expr("cmp", |m| {
            m.u32(NFTA_CMP_SREG, NFT_REG_1)
                .u32(NFTA_CMP_OP, op)
                .begin(NFTA_CMP_DATA)
                .attr(NFTA_DATA_VALUE, value)
                .end();
        })
    }

    fn payload(&mut self, base: u32, offset: u32, len: u32) -> &mut Self {
        self.expr("payload", |m| {
            m.u32(NFTA_PAYLOAD_DREG, NFT_REG_1)
                .u32(NFTA_PAYLOAD_BASE, base)
                .u32(NFTA_PAYLOAD_OFFSET, offset)
                .u32(NFTA_PAYLOAD_LEN, len);
        })
    }

    fn accept(&mut self) -> &mut Self {
        self.expr("immediate", |m| {
            m.u32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT)
                .begin(NFTA_IMMEDIATE_DATA)
                .begin(NFTA_DATA_VERDICT)
                .u32(NFTA_VERDICT_CODE, NF_ACCEPT)
                .end()
                .end();
        })
    }

    /// `redirect to :port` (the port loaded into register 1 first).
    fn redirect(&mut self, port: u16) -> &mut Self {
        self.expr("immediate", |m| {
            m.u32(NFTA_IMMEDIATE_DREG, NFT_REG_1)
                .begin(NFTA_IMMEDIATE_DATA)
                .attr(NFTA_DATA_VALUE, &port.to_be_bytes())
                .end();
        })
        .expr("redir", |m| {
            m.u32(NFTA_REDIR_REG_PROTO_MIN, NFT_REG_1)
                .u32(NFTA_REDIR_FLAGS, NF_NAT_RANGE_PROTO_SPECIFIED);
        })
    }

    fn reject(&mut self, icmp_code: u8) -> &mut Self {
        self.expr("reject", |m| {
            m.u32(NFTA_REJECT_TYPE, NFT_REJECT_ICMP_UNREACH)
                .attr(NFTA_REJECT_ICMP_CODE, &[icmp_code]);
        })
    }

    /// `ip daddr != 127.0.0.0/8` (or `==` with `NFT_CMP_EQ`).
    fn loopback_daddr(&mut self, op: u32) -> &mut Self {
        self.payload(NFT_PAYLOAD_NETWORK_HEADER, IPV4_DADDR, 1)
            .cmp(op, &[LOOPBACK_NET])
    }

    fn finish(mut self, out: &mut Vec<u8>) {
        debug_assert!(self.open.is_empty());
        let len = self.buf.len() as u32;
        self.buf[..4].copy_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&self.buf);
    }
}

/// The batch's messages, appended to `out` one by one with consecutive sequence numbers.
struct Batch {
    out: Vec<u8>,
    seq: u32,
    /// Messages that ask for an acknowledgement.
    acked: u32,
}

impl Batch {
    fn new() -> Batch {
        let mut b = Batch {
            out: Vec::with_capacity(2048),
            seq: 0,
            acked: 0,
        };
        Msg::new(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            0,
            NFPROTO_UNSPEC,
            NFNL_SUBSYS_NFTABLES,
        )
        .finish(&mut b.out);
        b
    }

    /// A message of the nf_tables subsystem, acknowledged, created (never replacing);
    /// a rule is appended to its chain (without `NLM_F_APPEND` it would go first).
    fn msg(&mut self, kind: u16, family: u8) -> Msg {
        self.seq += 1;
        self.acked += 1;
        let append = if kind == NFT_MSG_NEWRULE { NLM_F_APPEND } else { 0 };
        Msg::new(
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK | append,
            self.seq,
            family,
            0,
        )
    }

    fn table(&mut self, family: u8) {
        let mut m = self.msg(NFT_MSG_NEWTABLE, family);
        m.str(NFTA_TABLE_NAME, TABLE).u32(NFTA_TABLE_FLAGS, 0);
        m.finish(&mut self.out);
    }

    /// A base chain on the output hook.
    fn chain(&mut self, family: u8, name: &str, kind: &str, priority: i32) {
        let mut m = self.msg(NFT_MSG_NEWCHAIN, family);
        m.str(NFTA_CHAIN_TABLE, TABLE)
            .str(NFTA_CHAIN_NAME, name)
            .begin(NFTA_CHAIN_HOOK)
            .u32(NFTA_HOOK_HOOKNUM, NF_INET_LOCAL_OUT)
            .u32(NFTA_HOOK_PRIORITY, priority as u32)
            .end()
            .u32(NFTA_CHAIN_POLICY, NF_ACCEPT)
            .str(NFTA_CHAIN_TYPE, kind);
        m.finish(&mut self.out);
    }

    /// A rule appended to `chain`, its expressions written by `exprs`.
    fn rule(&mut self, family: u8, chain: &str, exprs: impl FnOnce(&mut Msg)) {
        let mut m = self.msg(NFT_MSG_NEWRULE, family);
        m.str(NFTA_RULE_TABLE, TABLE)
            .str(NFTA_RULE_CHAIN, chain)
            .begin(NFTA_RULE_EXPRESSIONS);
        exprs(&mut m);
        m.end();
        m.finish(&mut self.out);
    }

    fn finish(mut self) -> (Vec<u8>, u32) {
        self.seq += 1;
        Msg::new(
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            self.seq,
            NFPROTO_UNSPEC,
            NFNL_SUBSYS_NFTABLES,
        )
        .finish(&mut self.out);
        (self.out, self.acked)
    }
}

/// The whole ruleset as one batch, and how many of its messages ask for an
/// acknowledgement.
fn batch(ports: Redirect) -> (Vec<u8>, u32) {
    let lo = LOOPBACK_IFINDEX.to_ne_bytes();
    let mut b = Batch::new();
    b.table(NFPROTO_IPV4);
    // priority -100: NF_IP_PRI_NAT_DST, where DNAT happens on the output hook.
    b.chain(NFPROTO_IPV4, "nat", "nat", -100);
    b.rule(NFPROTO_IPV4, "nat", |m| {
        m.meta(NFT_META_L4PROTO)
            .cmp(NFT_CMP_EQ, &[IPPROTO_TCP])
            .loopback_daddr(NFT_CMP_NEQ)
            .redirect(ports.transparent_port);
    });
    b.rule(NFPROTO_IPV4, "nat", |m| {
        m.meta(NFT_META_L4PROTO)
            .cmp(NFT_CMP_EQ, &[IPPROTO_UDP])
            .payload(NFT_PAYLOAD_TRANSPORT_HEADER, L4_DPORT, 2)
            .cmp(NFT_CMP_EQ, &53u16.to_be_bytes())
            .loopback_daddr(NFT_CMP_NEQ)
            .redirect(ports.dns_port);
    });
    b.chain(NFPROTO_IPV4, "filter", "filter", 0);
    b.rule(NFPROTO_IPV4, "filter", |m| {
        m.meta(NFT_META_OIF).cmp(NFT_CMP_EQ, &lo).accept();
    });
    b.rule(NFPROTO_IPV4, "filter", |m| {
        m.loopback_daddr(NFT_CMP_EQ).accept();
    });
    b.rule(NFPROTO_IPV4, "filter", |m| {
        m.reject(ICMP_PORT_UNREACH);
    });
    b.table(NFPROTO_IPV6);
    b.chain(NFPROTO_IPV6, "filter", "filter", 0);
    b.rule(NFPROTO_IPV6, "filter", |m| {
        m.meta(NFT_META_OIF).cmp(NFT_CMP_EQ, &lo).accept();
    });
    b.rule(NFPROTO_IPV6, "filter", |m| {
        m.reject(ICMPV6_PORT_UNREACH);
    });
    b.finish()
}

/// Installs the ruleset in the calling thread's network namespace, all or nothing.
/// Needs CAP_NET_ADMIN over that namespace (init: root of the sandbox's user namespace).
pub fn install(ports: Redirect) -> Result<(), NftError> {
    let (batch, mut acks) = batch(ports);
    // SAFETY: socket(2) with constant arguments; the fd is owned at once below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(NftError::Socket(io::Error::last_os_error()));
    }
    // SAFETY: a fresh fd nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: an all-zero sockaddr_nl (pid 0, no groups) addresses the kernel.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `batch` and `kernel` are live for the call and their lengths are passed.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            batch.as_ptr().cast(),
            batch.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(NftError::Socket(io::Error::last_os_error()));
    }
    if sent as usize != batch.len() {
        return Err(NftError::Answer("the batch was sent in part"));
    }
    // Every message asked for an acknowledgement: an error (for the first message that
    // failed; the batch is then aborted) or one zero-error answer each.
    let mut buf = vec![0u8; 8192];
    while acks > 0 {
        // SAFETY: the buffer is live and its length is passed.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(NftError::Socket(e));
        }
        let mut rest = &buf[..n as usize];
        while rest.len() >= 16 {
            let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
            let kind = u16::from_ne_bytes(rest[4..6].try_into().expect("2 bytes"));
            let seq = u32::from_ne_bytes(rest[8..12].try_into().expect("4 bytes"));
            if len < 16 || len > rest.len() {
                return Err(NftError::Answer("a message's length is out of bounds"));
            }
            if kind == NLMSG_ERROR {
                let errno = rest
                    .get(16..20)
                    .map(|b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
                    .ok_or(NftError::Answer("an error message without its code"))?;
                if errno != 0 {
                    return Err(NftError::Refused {
                        seq,
                        source: io::Error::from_raw_os_error(-errno),
                    });
                }
                acks -= 1;
            }
            rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks the netlink messages of a batch: (type, flags, seq, length) each.
    fn messages(batch: &[u8]) -> Vec<(u16, u16, u32, usize)> {
        let mut out = Vec::new();
        let mut rest = batch;
        while !rest.is_empty() {
            let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
            let kind = u16::from_ne_bytes(rest[4..6].try_into().unwrap());
            let flags = u16::from_ne_bytes(rest[6..8].try_into().unwrap());
            let seq = u32::from_ne_bytes(rest[8..12].try_into().unwrap());
            assert!(len >= 20 && len.is_multiple_of(4) && len <= rest.len(), "{len}");
            out.push((kind, flags, seq, len));
            rest = &rest[len..];
        }
        out
    }

    #[test]
    fn the_batch_is_framed_by_begin_and_end_and_every_message_is_acked() {
        let (b, acks) = batch(Redirect {
            transparent_port: 3129,
            dns_port: 53,
        });
        let msgs = messages(&b);
        // begin, 2 tables, 3 chains, 7 rules, end
        assert_eq!(msgs.len(), 14, "{msgs:?}");
        assert_eq!(acks, 12);
        assert_eq!(msgs[0].0, NFNL_MSG_BATCH_BEGIN);
        assert_eq!(msgs[13].0, NFNL_MSG_BATCH_END);
        let kinds: Vec<u16> = msgs[1..13].iter().map(|m| m.0 & 0xff).collect();
        assert_eq!(kinds, [0, 3, 6, 6, 3, 6, 6, 6, 0, 3, 6, 6]);
        for (i, m) in msgs[1..13].iter().enumerate() {
            assert_eq!(m.0 >> 8, NFNL_SUBSYS_NFTABLES);
            let append = if m.0 & 0xff == NFT_MSG_NEWRULE {
                NLM_F_APPEND
            } else {
                0
            };
            assert_eq!(m.1, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK | append);
            assert_eq!(m.2, i as u32 + 1);
        }
    }

    #[test]
    fn the_redirect_ports_are_encoded_in_network_order() {
        let (b, _) = batch(Redirect {
            transparent_port: 0x1234,
            dns_port: 0x5678,
        });
        let has = |needle: &[u8]| b.windows(needle.len()).any(|w| w == needle);
        // NFTA_DATA_VALUE (len 6, type 1) holding the port, big-endian.
        assert!(has(&[6, 0, 1, 0, 0x12, 0x34]));
        assert!(has(&[6, 0, 1, 0, 0x56, 0x78]));
    }
}

/// The ruleset installed for real, in a network namespace of the test's own (a thread's:
/// nothing of the host's is touched), as `nft` lists it. Needs root and `nft`.
#[cfg(test)]
mod kernel_tests {
    use super::*;

    /// Runs `f` on a thread in a fresh network namespace; `None` when the test cannot
    /// make one (not root).
    fn in_new_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
            Some(f())
        })
        .join()
        .expect("the namespace thread panicked")
    }

    #[test]
    fn nft_lists_the_installed_ruleset_as_documented() {
        if !std::path::Path::new("/usr/sbin/nft").exists() {
            eprintln!("NOTE: /usr/sbin/nft is absent: the listing check is skipped");
            return;
        }
        let Some(listing) = in_new_netns(|| {
            install(Redirect {
                transparent_port: 3129,
                dns_port: 53,
            })
            .expect("installing the ruleset");
            // A child forked by this thread lives in its network namespace.
            let out = std::process::Command::new("/usr/sbin/nft")
                .args(["list", "ruleset"])
                .output()
                .expect("running nft");
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap()
        }) else {
            eprintln!("NOTE: no network namespace (not root?): skipped");
            return;
        };
        let lines: Vec<&str> = listing.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let expected = [
            "table ip airlock {",
            "chain nat {",
            "type nat hook output priority -100; policy accept;",
            "meta l4proto tcp ip daddr != 127.0.0.0/8 redirect to :3129",
            "udp dport 53 ip daddr != 127.0.0.0/8 redirect to :53",
            "}",
            "chain filter {",
            "type filter hook output priority filter; policy accept;",
            "oif \"lo\" accept",
            "ip daddr 127.0.0.0/8 accept",
            "reject",
            "}",
            "}",
            "table ip6 airlock {",
            "chain filter {",
            "type filter hook output priority filter; policy accept;",
            "oif \"lo\" accept",
            "reject",
            "}",
            "}",
        ];
        assert_eq!(lines, expected, "{listing}");
    }
}
