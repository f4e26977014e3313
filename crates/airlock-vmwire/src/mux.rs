//! The framing of the egress port: the program's connections to its proxy, carried
//! between the guest agent (which accepts them inside the guest's sandbox) and the host
//! (which serves each with airlock's egress proxy), many at once over one byte stream,
//! and the program's DNS queries to airlock's resolver.
//!
//! A frame is `u32 id (LE) | u8 kind | u32 value (LE)`, followed by `value` bytes for
//! the kinds that carry a payload (`Data`, `OpenTo`, `DnsQuery`, `DnsAnswer`). The guest
//! opens connections (ids it picks, never reused while open): `Open` for one the program
//! made to the explicit proxy port, `OpenTo` for one the sandbox's nf_tables redirected,
//! with its original destination. Either side sends `Data`, `Eof` (no more data this
//! way: a half-close) and `Reset` (the connection is gone both ways).
//!
//! Flow control keeps connections independent: a side may have at most [`WINDOW`] bytes
//! of a connection's data sent and not yet acknowledged (`Ack` with the count, sent once
//! the bytes were handed to the connection's socket). A receiver therefore never blocks
//! the shared port on one slow connection: it queues what arrives (at most a window per
//! connection) and keeps reading; a peer that overruns a window gets the connection reset.
//!
//! DNS: the guest sends each datagram the program sent to the resolver's port as a
//! `DnsQuery` (ids it picks, in a space of their own, not the connections'); the host
//! answers every query exactly once, with `DnsAnswer` (the answer's bytes) or `DnsNone`
//! (no answer: the program's resolver times out, as for a lost datagram).
//!
//! # Versions
//!
//! [`MUX_VERSION`] names the set of kinds a side understands; the guest reports its own
//! in its `Ready` (`GuestInfo::mux_version`, 1 when absent). Kinds are only ever added,
//! with a new version, never changed or reused; a frame of a kind the receiver does not
//! know is a framing error (the port is closed), so a side sends a newer kind only to a
//! peer that announced the version that has it.
//!
//! - 1: `Open` (1), `Data` (2), `Eof` (3), `Reset` (4), `Ack` (5);
//! - 2: `OpenTo` (6), `DnsQuery` (7), `DnsAnswer` (8), `DnsNone` (9);
//! - 3: `Connect` (10), `Connected` (11), `Signal` (12), `Resize` (13), `Exited` (14).
//!
//! Version 3 lets the host open streams too: to a TCP port on the sandbox's loopback
//! (`Connect`, answered by `Connected` or `Reset`), and the stdio of programs spawned
//! alongside the execs (registered by the agent's `Spawn` request, no frame opens them).
//! The host's ids have [`HOST_IDS`] set, the guest's never. A spawned program is named by
//! an id of its own in `Signal`, `Resize` and `Exited`.

use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Name of the egress port (the guest finds it in /sys/class/virtio-ports).
pub const EGRESS_PORT: &str = "airlock.egress";
/// The newest set of frame kinds this build speaks (see the module's documentation).
pub const MUX_VERSION: u32 = 4;
/// Set in every id the host picks (streams it opens, spawned programs); never in the
/// guest's.
pub const HOST_IDS: u32 = 1 << 31;
/// Unacknowledged bytes per connection and direction: enough for a few round trips of
/// the port at full speed, small enough that 128 connections hold 32 MiB at most.
pub const WINDOW: u32 = 256 * 1024;
/// Payload bytes per `Data` frame.
pub const MUX_CHUNK: usize = 16 * 1024;
/// Bytes of a DNS message (query or answer) that cross the port: more than any resolver
/// sends over UDP (EDNS buffers are 1232 to 4096 bytes); a larger datagram is not a DNS
/// message airlock answers.
pub const MAX_DNS: usize = 16 * 1024;
/// Connections open at once through one VM's port (the proxy's own cap is lower; this
/// bounds the agent's threads and the host's buffers).
pub const MAX_CONNECTIONS: usize = 128;
/// DNS queries awaiting their answer at once, per VM: past it the guest drops a query
/// (the program's resolver retries, as for a lost datagram) and the host answers
/// `DnsNone`.
pub const MAX_DNS_QUERIES: usize = 64;
/// Bytes of a frame's header.
const HEADER: usize = 9;

const OPEN: u8 = 1;
const DATA: u8 = 2;
const EOF: u8 = 3;
const RESET: u8 = 4;
const ACK: u8 = 5;
const OPEN_TO: u8 = 6;
const DNS_QUERY: u8 = 7;
const DNS_ANSWER: u8 = 8;
const DNS_NONE: u8 = 9;
const CONNECT: u8 = 10;
const CONNECTED: u8 = 11;
const SIGNAL: u8 = 12;
const RESIZE: u8 = 13;
const EXITED: u8 = 14;

/// One frame of the egress port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MuxFrame {
    /// Guest -> host: the program opened connection `id` to the explicit proxy's port.
    Open(u32),
    /// Guest -> host: the program opened connection `id` to this address, and the
    /// sandbox's nf_tables redirected it to the guest agent (version 2).
    OpenTo(u32, SocketAddr),
    /// Bytes of connection `id` (at most [`MUX_CHUNK`]).
    Data(u32, Vec<u8>),
    /// The sender sends nothing more on `id` (its reading side may go on).
    Eof(u32),
    /// Connection `id` is gone, both ways.
    Reset(u32),
    /// The receiver handed this many more bytes of `id` to its socket.
    Ack(u32, u32),
    /// Guest -> host: DNS query `id`, a datagram the program sent to the resolver
    /// (1 to [`MAX_DNS`] bytes; version 2).
    DnsQuery(u32, Vec<u8>),
    /// Host -> guest: the answer to query `id` (1 to [`MAX_DNS`] bytes; version 2).
    DnsAnswer(u32, Vec<u8>),
    /// Host -> guest: query `id` has no answer (version 2).
    DnsNone(u32),
    /// Host -> guest: open stream `id` to this TCP port on the sandbox's loopback
    /// (version 3); answered by `Connected` or, when nothing listens, `Reset`.
    Connect(u32, u16),
    /// Guest -> host: stream `id` of a `Connect` is open (version 3).
    Connected(u32),
    /// Host -> guest: send this signal to spawned program `id` (version 3).
    Signal(u32, u32),
    /// Host -> guest: spawned program `id`'s terminal is now `rows` x `cols` (version 3).
    Resize(u32, u16, u16),
    /// Guest -> host: spawned program `id` ended (version 3).
    Exited(u32, ExitStatus),
}

/// How a spawned program ended, as `Exited` carries it: a code in the low byte, or a
/// signal with bit 16 set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this status.
    Code(u8),
    /// This signal ended it.
    Signal(u8),
}

impl ExitStatus {
    fn encode(self) -> u32 {
        match self {
            ExitStatus::Code(c) => u32::from(c),
            ExitStatus::Signal(s) => 1 << 16 | u32::from(s),
        }
    }

    fn decode(value: u32) -> Result<ExitStatus, String> {
        match value {
            0..=0xff => Ok(ExitStatus::Code(value as u8)),
            0x1_0001..=0x1_00ff => Ok(ExitStatus::Signal(value as u8)),
            _ => Err(format!("exit status {value:#x}")),
        }
    }
}

/// Whether frames of `kind` carry a payload of `value` bytes.
fn has_payload(kind: u8) -> bool {
    matches!(kind, DATA | OPEN_TO | DNS_QUERY | DNS_ANSWER)
}

/// The largest payload a frame of `kind` may carry.
fn max_payload(kind: u8) -> usize {
    match kind {
        DATA => MUX_CHUNK,
        OPEN_TO => 19,
        _ => MAX_DNS,
    }
}

/// An address as `OpenTo` carries it: `4 | 4 bytes | port (BE)` or `6 | 16 bytes | port`.
fn encode_addr(addr: &SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(19);
    match addr.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&addr.port().to_be_bytes());
    out
}

fn decode_addr(b: &[u8]) -> Result<SocketAddr, String> {
    let port = |p: &[u8]| u16::from_be_bytes([p[0], p[1]]);
    match b {
        [4, rest @ ..] if rest.len() == 6 => {
            let ip = Ipv4Addr::new(rest[0], rest[1], rest[2], rest[3]);
            Ok(SocketAddr::new(ip.into(), port(&rest[4..])))
        }
        [6, rest @ ..] if rest.len() == 18 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&rest[..16]);
            Ok(SocketAddr::new(Ipv6Addr::from(octets).into(), port(&rest[16..])))
        }
        [family, ..] => Err(format!(
            "open-to frame with a {}-byte address of family {family} (4 with 7 bytes, or 6 with 19)",
            b.len()
        )),
        [] => Err("open-to frame without an address".into()),
    }
}

impl MuxFrame {
    /// The frame's bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let addr;
        let (id, kind, value, data): (u32, u8, u32, &[u8]) = match self {
            MuxFrame::Open(id) => (*id, OPEN, 0, &[]),
            MuxFrame::OpenTo(id, to) => {
                addr = encode_addr(to);
                (*id, OPEN_TO, addr.len() as u32, &addr)
            }
            MuxFrame::Data(id, d) => (*id, DATA, d.len() as u32, d),
            MuxFrame::Eof(id) => (*id, EOF, 0, &[]),
            MuxFrame::Reset(id) => (*id, RESET, 0, &[]),
            MuxFrame::Ack(id, n) => (*id, ACK, *n, &[]),
            MuxFrame::DnsQuery(id, q) => (*id, DNS_QUERY, q.len() as u32, q),
            MuxFrame::DnsAnswer(id, a) => (*id, DNS_ANSWER, a.len() as u32, a),
            MuxFrame::DnsNone(id) => (*id, DNS_NONE, 0, &[]),
            MuxFrame::Connect(id, port) => (*id, CONNECT, u32::from(*port), &[]),
            MuxFrame::Connected(id) => (*id, CONNECTED, 0, &[]),
            MuxFrame::Signal(id, sig) => (*id, SIGNAL, *sig, &[]),
            MuxFrame::Resize(id, rows, cols) => (*id, RESIZE, u32::from(*rows) << 16 | u32::from(*cols), &[]),
            MuxFrame::Exited(id, status) => (*id, EXITED, status.encode(), &[]),
        };
        let mut buf = Vec::with_capacity(HEADER + data.len());
        buf.extend_from_slice(&id.to_le_bytes());
        buf.push(kind);
        buf.extend_from_slice(&value.to_le_bytes());
        buf.extend_from_slice(data);
        buf
    }

    /// Decodes a frame from the start of `buf`: the frame and its length, `Ok(None)`
    /// when more bytes are needed.
    fn decode(buf: &[u8]) -> Result<Option<(MuxFrame, usize)>, String> {
        if buf.len() < HEADER {
            return Ok(None);
        }
        let id = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let kind = buf[4];
        let value = u32::from_le_bytes([buf[5], buf[6], buf[7], buf[8]]);
        if !(OPEN..=EXITED).contains(&kind) {
            return Err(format!("unknown frame kind {kind}"));
        }
        if !has_payload(kind) {
            let frame = match kind {
                OPEN => MuxFrame::Open(id),
                EOF => MuxFrame::Eof(id),
                RESET => MuxFrame::Reset(id),
                ACK => MuxFrame::Ack(id, value),
                DNS_NONE => MuxFrame::DnsNone(id),
                CONNECT => MuxFrame::Connect(
                    id,
                    u16::try_from(value).map_err(|_| format!("connect to port {value}"))?,
                ),
                CONNECTED => MuxFrame::Connected(id),
                SIGNAL => MuxFrame::Signal(id, value),
                RESIZE => MuxFrame::Resize(id, (value >> 16) as u16, value as u16),
                _ => MuxFrame::Exited(id, ExitStatus::decode(value)?),
            };
            return Ok(Some((frame, HEADER)));
        }
        let len = value as usize;
        let max = max_payload(kind);
        if len > max {
            return Err(format!("frame of kind {kind} with {len} bytes (at most {max})"));
        }
        if buf.len() < HEADER + len {
            return Ok(None);
        }
        let payload = &buf[HEADER..HEADER + len];
        let frame = match kind {
            DATA => MuxFrame::Data(id, payload.to_vec()),
            OPEN_TO => MuxFrame::OpenTo(id, decode_addr(payload)?),
            _ if payload.is_empty() => return Err(format!("empty DNS message in a frame of kind {kind}")),
            DNS_QUERY => MuxFrame::DnsQuery(id, payload.to_vec()),
            _ => MuxFrame::DnsAnswer(id, payload.to_vec()),
        };
        Ok(Some((frame, HEADER + len)))
    }
}

/// Reassembles frames from bytes read off the port.
#[derive(Debug, Default)]
pub struct MuxDecoder {
    buf: Vec<u8>,
    /// Bytes of `buf` already decoded.
    start: usize,
}

impl MuxDecoder {
    /// Appends bytes read from the port.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, if one has arrived; an error when the bytes are not
    /// frames (the port is then useless).
    pub fn next_frame(&mut self) -> Result<Option<MuxFrame>, String> {
        match MuxFrame::decode(&self.buf[self.start..])? {
            Some((frame, len)) => {
                self.start += len;
                Ok(Some(frame))
            }
            None => Ok(None),
        }
    }
}

/// Reads one frame from a blocking stream; `None` at a clean end of stream.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<MuxFrame>> {
    let mut header = [0u8; HEADER];
    match r.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut d = MuxDecoder::default();
    d.push(&header);
    if has_payload(header[4]) {
        let len = u32::from_le_bytes([header[5], header[6], header[7], header[8]]) as usize;
        if len > max_payload(header[4]) {
            return Err(io::Error::other(format!(
                "frame of kind {} with {len} bytes",
                header[4]
            )));
        }
        let mut data = vec![0u8; len];
        r.read_exact(&mut data)?;
        d.push(&data);
    }
    d.next_frame()
        .map_err(io::Error::other)?
        .map(Some)
        .ok_or_else(|| io::Error::other("truncated frame"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_split_anywhere() {
        let frames = [
            MuxFrame::Open(7),
            MuxFrame::Data(7, b"GET / HTTP/1.1\r\n".to_vec()),
            MuxFrame::Data(9, vec![0xab; MUX_CHUNK]),
            MuxFrame::Ack(7, WINDOW),
            MuxFrame::OpenTo(8, "10.9.9.9:80".parse().unwrap()),
            MuxFrame::OpenTo(9, "[2001:db8::1]:443".parse().unwrap()),
            MuxFrame::DnsQuery(0, b"\x12\x34query".to_vec()),
            MuxFrame::DnsAnswer(0, vec![0xcd; MAX_DNS]),
            MuxFrame::DnsNone(u32::MAX),
            MuxFrame::Eof(7),
            MuxFrame::Reset(u32::MAX),
            MuxFrame::Connect(HOST_IDS | 1, 8000),
            MuxFrame::Connected(HOST_IDS | 1),
            MuxFrame::Signal(HOST_IDS | 2, 15),
            MuxFrame::Resize(HOST_IDS | 2, 40, 132),
            MuxFrame::Exited(HOST_IDS | 2, ExitStatus::Code(3)),
            MuxFrame::Exited(HOST_IDS | 2, ExitStatus::Signal(9)),
        ];
        let wire: Vec<u8> = frames.iter().flat_map(MuxFrame::encode).collect();
        let mut d = MuxDecoder::default();
        let mut got = Vec::new();
        for piece in wire.chunks(5) {
            d.push(piece);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames);
        let mut r = wire.as_slice();
        for f in &frames {
            assert_eq!(read_frame(&mut r).unwrap().as_ref(), Some(f));
        }
        assert_eq!(read_frame(&mut r).unwrap(), None);
    }

    #[test]
    fn oversized_and_unknown_frames_are_refused() {
        let mut big = MuxFrame::Data(1, Vec::new()).encode();
        big[5..9].copy_from_slice(&((MUX_CHUNK as u32) + 1).to_le_bytes());
        let mut d = MuxDecoder::default();
        d.push(&big);
        assert!(d.next_frame().is_err());
        assert!(read_frame(&mut big.as_slice()).is_err());
        let mut d = MuxDecoder::default();
        d.push(&[0, 0, 0, 0, 15, 0, 0, 0, 0]);
        assert!(d.next_frame().unwrap_err().contains("unknown frame kind 15"));
        let mut d = MuxDecoder::default();
        d.push(&[0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(d.next_frame().is_err());
    }

    /// The version-1 kinds keep their bytes: a guest or host of either version reads them.
    #[test]
    fn version_one_frames_are_unchanged() {
        assert_eq!(MuxFrame::Open(1).encode(), [1, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(
            MuxFrame::Data(2, b"ab".to_vec()).encode(),
            [2, 0, 0, 0, 2, 2, 0, 0, 0, b'a', b'b']
        );
        assert_eq!(MuxFrame::Eof(3).encode(), [3, 0, 0, 0, 3, 0, 0, 0, 0]);
        assert_eq!(MuxFrame::Reset(4).encode(), [4, 0, 0, 0, 4, 0, 0, 0, 0]);
        assert_eq!(MuxFrame::Ack(5, 6).encode(), [5, 0, 0, 0, 5, 6, 0, 0, 0]);
        assert_eq!(
            MuxFrame::OpenTo(1, "10.9.9.9:80".parse().unwrap()).encode(),
            [1, 0, 0, 0, 6, 7, 0, 0, 0, 4, 10, 9, 9, 9, 0, 80]
        );
    }

    fn decode_all(bytes: &[u8]) -> Result<Option<MuxFrame>, String> {
        let mut d = MuxDecoder::default();
        d.push(bytes);
        let frame = d.next_frame();
        if let Ok(Some(f)) = &frame {
            // What the decoder accepts, the blocking reader accepts identically.
            assert_eq!(read_frame(&mut &bytes[..]).unwrap().as_ref(), Some(f));
        } else if frame.is_err() {
            assert!(read_frame(&mut &bytes[..]).is_err());
        }
        frame
    }

    #[test]
    fn malformed_addresses_and_dns_messages_are_refused() {
        let header = |kind: u8, len: u32| {
            let mut h = vec![1, 0, 0, 0, kind];
            h.extend_from_slice(&len.to_le_bytes());
            h
        };
        let with = |kind: u8, payload: &[u8]| {
            let mut f = header(kind, payload.len() as u32);
            f.extend_from_slice(payload);
            f
        };
        // Addresses: no family, an unknown one, a family with the other's length, a
        // truncated one, one too long.
        for bad in [
            &[][..],
            &[5, 1, 2, 3, 4, 0, 80],
            &[4; 19],
            &[6, 1, 2, 3, 4, 0, 80],
            &[4, 10, 9, 9, 9, 0],
            &[4, 10, 9, 9, 9, 0, 80, 0],
        ] {
            let err = decode_all(&with(6, bad)).unwrap_err();
            assert!(err.contains("open-to frame"), "{bad:?}: {err}");
        }
        // An address longer than any family's is refused before it is read.
        assert!(decode_all(&header(6, 20)).unwrap_err().contains("at most 19"));
        // DNS messages: empty, or larger than MAX_DNS (refused from the header alone).
        for kind in [7, 8] {
            assert!(
                decode_all(&with(kind, &[]))
                    .unwrap_err()
                    .contains("empty DNS message")
            );
            let err = decode_all(&header(kind, MAX_DNS as u32 + 1)).unwrap_err();
            assert!(err.contains(&format!("at most {MAX_DNS}")), "{err}");
        }
        // A partial frame is not an error: more bytes are needed.
        let whole = MuxFrame::DnsQuery(3, vec![1; 40]).encode();
        let mut d = MuxDecoder::default();
        d.push(&whole[..20]);
        assert_eq!(d.next_frame(), Ok(None));
        d.push(&whole[20..]);
        assert_eq!(d.next_frame(), Ok(Some(MuxFrame::DnsQuery(3, vec![1; 40]))));
        // A stream that ends inside a frame is an error for the blocking reader.
        assert!(read_frame(&mut &whole[..20]).is_err());
        // DnsNone carries nothing.
        assert_eq!(decode_all(&header(9, 0)), Ok(Some(MuxFrame::DnsNone(1))));
    }
}
