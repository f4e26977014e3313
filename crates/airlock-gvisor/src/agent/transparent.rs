//! Proxy mode's "no way around the proxy", inside gVisor: the same ports as the other
//! tiers' (`egress-api`: 127.0.0.1:3129 transparent TCP, 127.0.0.1:53 DNS), made by the
//! agent in the Sentry's own network stack before the first program runs.
//!
//! The sandbox has no network device (`--network=none`), only lo, and a connect() to an
//! address with no route fails before any netfilter hook sees it. So the agent gives lo
//! two addresses, `0.0.0.1/1` and `128.0.0.1/1`, whose subnet routes cover every IPv4
//! address (gVisor adds a subnet route with an address; it has no RTM_NEWROUTE), and
//! installs gVisor's iptables `nat` table (netstack implements REDIRECT and
//! SO_ORIGINAL_DST, for Istio):
//!
//! ```text
//! -A OUTPUT ! -d 127.0.0.0/8 -p tcp -j REDIRECT --to-ports 3129
//! -A OUTPUT ! -d 127.0.0.0/8 -p udp -m udp --dport 53 -j REDIRECT --to-ports 53
//! ```
//!
//! Every TCP connection to a non-loopback IPv4 address (IPv4-mapped IPv6 included) then
//! lands on the agent's transparent listener, whose `SO_ORIGINAL_DST` is the address the
//! program asked for; DNS to any address lands on the agent's resolver socket, and the
//! answer goes back from the address the program asked (conntrack undoes the NAT). Other
//! UDP loops back on lo to nothing (a connected socket sees ECONNREFUSED); IPv6 has no
//! route but ::1. Nothing can leave anyway: the sandbox has no device but lo.
//!
//! iptables in gVisor needs raw sockets (`runsc --net-raw`; the agent alone has
//! CAP_NET_RAW and CAP_NET_ADMIN, the program has no capability) and is set here with
//! IPT_SO_SET_REPLACE directly, as iptables-legacy would: no binary is needed in the
//! sandbox, so it works in an image's root as well.

use std::io;
use std::mem::size_of;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub use airlock_egress::DNS_PORT;
pub use airlock_egress::TRANSPARENT_PORT;

/// The addresses lo gets: each one's subnet route covers half of IPv4.
const ROUTES: [(Ipv4Addr, u8); 2] = [(Ipv4Addr::new(0, 0, 0, 1), 1), (Ipv4Addr::new(128, 0, 0, 1), 1)];

// <linux/netfilter_ipv4/ip_tables.h>, <linux/netfilter/x_tables.h>.
const IPT_SO_SET_REPLACE: libc::c_int = 64;
const IPT_SO_GET_INFO: libc::c_int = 64;
const IPT_INV_DSTIP: u8 = 0x10;
const SO_ORIGINAL_DST: libc::c_int = 80;
/// The nat table's hooks: PREROUTING, INPUT, OUTPUT, POSTROUTING.
const NAT_HOOKS: u32 = (1 << 0) | (1 << 1) | (1 << 3) | (1 << 4);
const NF_INET_LOCAL_OUT: usize = 3;
/// `-NF_ACCEPT - 1`: a standard target's verdict for ACCEPT.
const VERDICT_ACCEPT: i32 = -2;
/// `NF_NAT_RANGE_PROTO_SPECIFIED`.
const NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
/// sizeof(struct ipt_entry), sizeof(struct ipt_replace), sizeof(struct ipt_getinfo).
const ENTRY: usize = 112;
const REPLACE: usize = 96;
const GETINFO: usize = 84;

/// Gives lo the covering addresses and installs the redirections (see the module docs).
pub fn setup() -> io::Result<()> {
    for (addr, prefix) in ROUTES {
        add_address(addr, prefix)
            .map_err(|e| io::Error::new(e.kind(), format!("adding {addr}/{prefix} to lo: {e}")))?;
    }
    install_nat().map_err(|e| io::Error::new(e.kind(), format!("installing the nat table: {e}")))
}

/// The destination a redirected connection asked for (`SO_ORIGINAL_DST`).
pub fn original_destination(conn: &TcpStream) -> io::Result<SocketAddr> {
    // SAFETY: an all-zero sockaddr_in is valid.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `sin` is writable for `len` bytes, and `len` is a valid socklen_t.
    let r = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_IP,
            SO_ORIGINAL_DST,
            (&raw mut sin).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
    Ok(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
}

/// `ip addr add ADDR/PREFIX dev lo`, over rtnetlink.
fn add_address(addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
    // SAFETY: plain socket(2); the fd is owned right after.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    let mut msg = Vec::with_capacity(40);
    let len: u32 = 16 + 8 + 8 + 8;
    msg.extend_from_slice(&len.to_ne_bytes());
    msg.extend_from_slice(&libc::RTM_NEWADDR.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK | libc::NLM_F_CREATE | libc::NLM_F_EXCL) as u16;
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
    // struct ifaddrmsg
    msg.extend_from_slice(&[libc::AF_INET as u8, prefix, 0, libc::RT_SCOPE_UNIVERSE]);
    msg.extend_from_slice(&index.to_ne_bytes());
    for kind in [libc::IFA_LOCAL, libc::IFA_ADDRESS] {
        msg.extend_from_slice(&8u16.to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&addr.octets());
    }
    // SAFETY: `msg` is readable for its length.
    if unsafe { libc::send(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut answer = [0u8; 512];
    // SAFETY: `answer` is writable for its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), answer.as_mut_ptr().cast(), answer.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // The acknowledgement: an NLMSG_ERROR whose error is 0.
    let n = n as usize;
    if n < 20 || u16::from_ne_bytes([answer[4], answer[5]]) != libc::NLMSG_ERROR as u16 {
        return Err(io::Error::other("rtnetlink sent no acknowledgement"));
    }
    match i32::from_ne_bytes([answer[16], answer[17], answer[18], answer[19]]) {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(-e)),
    }
}

/// A rule's `struct ipt_entry` with its matches and target. `proto` 0 is any protocol;
/// `not_loopback`: `! -d 127.0.0.0/8`.
fn entry(proto: u16, not_loopback: bool, matches: &[u8], target: &[u8]) -> Vec<u8> {
    let mut e = vec![0u8; ENTRY];
    if not_loopback {
        e[4..8].copy_from_slice(&[127, 0, 0, 0]); // dst
        e[12..16].copy_from_slice(&[255, 0, 0, 0]); // dmsk
        e[83] = IPT_INV_DSTIP; // invflags
    }
    e[80..82].copy_from_slice(&proto.to_ne_bytes());
    let target_offset = (ENTRY + matches.len()) as u16;
    let next_offset = target_offset + target.len() as u16;
    e[88..90].copy_from_slice(&target_offset.to_ne_bytes());
    e[90..92].copy_from_slice(&next_offset.to_ne_bytes());
    e.extend_from_slice(matches);
    e.extend_from_slice(target);
    e
}

/// A `struct xt_entry_target` / `xt_entry_match` header (32 bytes) of `size` in all.
fn header(size: u16, name: &str) -> Vec<u8> {
    let mut h = vec![0u8; 32];
    h[0..2].copy_from_slice(&size.to_ne_bytes());
    h[2..2 + name.len()].copy_from_slice(name.as_bytes());
    h
}

/// The standard target with `verdict` (40 bytes).
fn standard(verdict: i32) -> Vec<u8> {
    let mut t = header(40, "");
    t.extend_from_slice(&verdict.to_ne_bytes());
    t.extend_from_slice(&[0; 4]);
    t
}

/// `-j REDIRECT --to-ports PORT` (56 bytes: nf_nat_ipv4_multi_range_compat, aligned).
fn redirect(port: u16) -> Vec<u8> {
    let mut t = header(56, "REDIRECT");
    t.extend_from_slice(&1u32.to_ne_bytes()); // rangesize
    t.extend_from_slice(&NAT_RANGE_PROTO_SPECIFIED.to_ne_bytes());
    t.extend_from_slice(&[0; 8]); // min_ip, max_ip
    t.extend_from_slice(&port.to_be_bytes());
    t.extend_from_slice(&port.to_be_bytes());
    t.extend_from_slice(&[0; 4]);
    t
}

/// `-m udp --dport PORT` (48 bytes: xt_udp, aligned).
fn udp_dport(port: u16) -> Vec<u8> {
    let mut m = header(48, "udp");
    for p in [0, u16::MAX, port, port] {
        m.extend_from_slice(&p.to_ne_bytes());
    }
    m.extend_from_slice(&[0; 8]); // invflags, padding
    m
}

/// The ERROR target that ends a table (64 bytes).
fn error_target() -> Vec<u8> {
    let mut t = header(64, "ERROR");
    let mut name = [0u8; 32];
    name[..5].copy_from_slice(b"ERROR");
    t.extend_from_slice(&name);
    t
}

/// Replaces gVisor's nat table with the redirections of the module docs.
fn install_nat() -> io::Result<()> {
    // SAFETY: plain socket(2); the fd is owned right after.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_RAW,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // How many entries the table has now: the replacement hands back their counters.
    let mut info = [0u8; GETINFO];
    info[..3].copy_from_slice(b"nat");
    let mut len = GETINFO as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes.
    if unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_IP,
            IPT_SO_GET_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    let old_entries = u32::from_ne_bytes([info[76], info[77], info[78], info[79]]);

    let accept = || entry(0, false, &[], &standard(VERDICT_ACCEPT));
    // PREROUTING, INPUT, OUTPUT's rules and policy, POSTROUTING, the end.
    let entries = [
        accept(),
        accept(),
        entry(libc::IPPROTO_TCP as u16, true, &[], &redirect(TRANSPARENT_PORT)),
        entry(
            libc::IPPROTO_UDP as u16,
            true,
            &udp_dport(DNS_PORT),
            &redirect(DNS_PORT),
        ),
        accept(),
        accept(),
        entry(0, false, &[], &error_target()),
    ];
    let offsets: Vec<u32> = entries
        .iter()
        .scan(0u32, |at, e| {
            let here = *at;
            *at += e.len() as u32;
            Some(here)
        })
        .collect();
    let size: u32 = entries.iter().map(|e| e.len() as u32).sum();
    // hook_entry and underflow, by hook (FORWARD, absent from nat, stays 0).
    let mut hook_entry = [0u32; 5];
    let mut underflow = [0u32; 5];
    hook_entry[0] = offsets[0];
    underflow[0] = offsets[0];
    hook_entry[1] = offsets[1];
    underflow[1] = offsets[1];
    hook_entry[NF_INET_LOCAL_OUT] = offsets[2];
    underflow[NF_INET_LOCAL_OUT] = offsets[4];
    hook_entry[4] = offsets[5];
    underflow[4] = offsets[5];
    let mut counters = vec![0u8; 16 * old_entries.max(1) as usize];

    let mut blob = vec![0u8; REPLACE];
    blob[..3].copy_from_slice(b"nat");
    blob[32..36].copy_from_slice(&NAT_HOOKS.to_ne_bytes());
    blob[36..40].copy_from_slice(&(entries.len() as u32).to_ne_bytes());
    blob[40..44].copy_from_slice(&size.to_ne_bytes());
    for (i, (h, u)) in hook_entry.iter().zip(&underflow).enumerate() {
        blob[44 + 4 * i..48 + 4 * i].copy_from_slice(&h.to_ne_bytes());
        blob[64 + 4 * i..68 + 4 * i].copy_from_slice(&u.to_ne_bytes());
    }
    blob[84..88].copy_from_slice(&old_entries.to_ne_bytes());
    blob[88..96].copy_from_slice(&(counters.as_mut_ptr() as u64).to_ne_bytes());
    for e in &entries {
        blob.extend_from_slice(e);
    }
    // SAFETY: `blob` is readable for its length; the counters pointer in it is valid
    // and writable for `old_entries` counters until the call returns.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_IP,
            IPT_SO_SET_REPLACE,
            blob.as_ptr().cast(),
            blob.len() as libc::socklen_t,
        )
    };
    drop(counters);
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
