//! The framing of the egress port: the program's connections to its proxy, carried
//! between the guest agent (which accepts them inside the guest's sandbox) and the host
//! (which serves each with airlock's egress proxy), many at once over one byte stream.
//!
//! A frame is `u32 connection id (LE) | u8 kind | u32 value (LE)`, followed by `value`
//! bytes for `Data`. The guest opens connections (ids it picks, never reused while
//! open); either side sends `Data`, `Eof` (no more data this way: a half-close) and
//! `Reset` (the connection is gone both ways).
//!
//! Flow control keeps connections independent: a side may have at most [`WINDOW`] bytes
//! of a connection's data sent and not yet acknowledged (`Ack` with the count, sent once
//! the bytes were handed to the connection's socket). A receiver therefore never blocks
//! the shared port on one slow connection: it queues what arrives (at most a window per
//! connection) and keeps reading; a peer that overruns a window gets the connection reset.

use std::io::{self, Read};

/// Name of the egress port (the guest finds it in /sys/class/virtio-ports).
pub const EGRESS_PORT: &str = "airlock.egress";
/// Unacknowledged bytes per connection and direction: enough for a few round trips of
/// the port at full speed, small enough that 128 connections hold 32 MiB at most.
pub const WINDOW: u32 = 256 * 1024;
/// Payload bytes per `Data` frame.
pub const MUX_CHUNK: usize = 16 * 1024;
/// Connections open at once through one VM's port (the proxy's own cap is lower; this
/// bounds the agent's threads and the host's buffers).
pub const MAX_CONNECTIONS: usize = 128;
/// Bytes of a frame's header.
const HEADER: usize = 9;

/// One frame of the egress port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MuxFrame {
    /// Guest -> host: the program opened connection `id`.
    Open(u32),
    /// Bytes of connection `id` (at most [`MUX_CHUNK`]).
    Data(u32, Vec<u8>),
    /// The sender sends nothing more on `id` (its reading side may go on).
    Eof(u32),
    /// Connection `id` is gone, both ways.
    Reset(u32),
    /// The receiver handed this many more bytes of `id` to its socket.
    Ack(u32, u32),
}

impl MuxFrame {
    /// The frame's bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let (id, kind, value, data): (u32, u8, u32, &[u8]) = match self {
            MuxFrame::Open(id) => (*id, 1, 0, &[]),
            MuxFrame::Data(id, d) => (*id, 2, d.len() as u32, d),
            MuxFrame::Eof(id) => (*id, 3, 0, &[]),
            MuxFrame::Reset(id) => (*id, 4, 0, &[]),
            MuxFrame::Ack(id, n) => (*id, 5, *n, &[]),
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
        let value = u32::from_le_bytes([buf[5], buf[6], buf[7], buf[8]]);
        let frame = match buf[4] {
            1 => MuxFrame::Open(id),
            2 => {
                let len = value as usize;
                if len > MUX_CHUNK {
                    return Err(format!("data frame of {len} bytes (at most {MUX_CHUNK})"));
                }
                if buf.len() < HEADER + len {
                    return Ok(None);
                }
                return Ok(Some((
                    MuxFrame::Data(id, buf[HEADER..HEADER + len].to_vec()),
                    HEADER + len,
                )));
            }
            3 => MuxFrame::Eof(id),
            4 => MuxFrame::Reset(id),
            5 => MuxFrame::Ack(id, value),
            k => return Err(format!("unknown frame kind {k}")),
        };
        Ok(Some((frame, HEADER)))
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
    if header[4] == 2 {
        let len = u32::from_le_bytes([header[5], header[6], header[7], header[8]]) as usize;
        if len > MUX_CHUNK {
            return Err(io::Error::other(format!("data frame of {len} bytes")));
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
            MuxFrame::Eof(7),
            MuxFrame::Reset(u32::MAX),
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
        d.push(&[0, 0, 0, 0, 9, 0, 0, 0, 0]);
        assert!(d.next_frame().is_err());
    }
}
