//! Moving bytes: reading a bounded head, relaying bodies by their framing, raw tunnels,
//! and the accounting every relayed byte goes through (counters, the per-proxy byte
//! budget, the idle clock).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::{Instant, sleep_until};

use crate::request::{Body, MAX_RESPONSE_HEAD_BYTES, parse_response};

/// The copy buffer of a tunnel direction: large enough for full-speed loopback copies.
const TUNNEL_BUFFER: usize = 256 * 1024;

/// The longest chunk-size line (with extensions) or trailer line accepted.
const MAX_CHUNK_LINE: usize = 4096;

/// The most trailer lines after the last chunk.
const MAX_TRAILER_LINES: usize = 100;

/// The most interim (1xx) responses before the final one.
const MAX_INTERIM_RESPONSES: usize = 8;

/// The proxy-wide byte budget was spent: the connection is closed.
#[derive(Debug, thiserror::Error)]
#[error("byte limit reached")]
pub(crate) struct ByteLimit;

/// Whether `e` is the budget running out.
pub(crate) fn is_byte_limit(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<ByteLimit>())
}

/// How a head read ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeadRead {
    /// `buf` holds a head through its blank line, and nothing after it.
    Complete,
    /// The peer closed first (`buf` holds whatever came).
    Eof,
    /// More than the bound arrived without a blank line.
    TooLarge,
}

/// Reads a message head into `buf` (cleared first), through `\r\n\r\n`, consuming nothing
/// past it from `r`. At most `max` bytes (plus one read) are held.
pub(crate) async fn read_head<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<HeadRead> {
    buf.clear();
    loop {
        let (done, used) = {
            let avail = r.fill_buf().await?;
            if avail.is_empty() {
                return Ok(HeadRead::Eof);
            }
            // The terminator may straddle what we hold and what arrived.
            let from = buf.len().saturating_sub(3);
            buf.extend_from_slice(avail);
            match find(&buf[from..], b"\r\n\r\n") {
                Some(pos) => {
                    let end = from + pos + 4;
                    let extra = buf.len() - end;
                    buf.truncate(end);
                    (true, avail.len() - extra)
                }
                None => (false, avail.len()),
            }
        };
        r.consume(used);
        if buf.len() > max {
            return Ok(HeadRead::TooLarge);
        }
        if done {
            return Ok(HeadRead::Complete);
        }
    }
}

pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// When a connection last moved a byte, for the idle timeout.
#[derive(Debug)]
pub(crate) struct Activity {
    start: Instant,
    /// Milliseconds after `start`.
    last_ms: AtomicU64,
}

impl Activity {
    pub(crate) fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    pub(crate) fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Relaxed);
    }

    /// Resolves once nothing has moved for `limit`.
    pub(crate) async fn idle(&self, limit: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Relaxed));
            let deadline = last + limit;
            if Instant::now() >= deadline {
                return;
            }
            sleep_until(deadline).await;
        }
    }
}

/// The bytes one proxy may move in all, both ways, over all its connections.
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicU64,
    max: u64,
}

impl Budget {
    pub(crate) fn new(max: u64) -> Budget {
        Budget {
            used: AtomicU64::new(0),
            max,
        }
    }

    /// Takes `n` bytes; false (and nothing may be sent) once the budget is spent.
    fn take(&self, n: u64) -> bool {
        let before = self.used.fetch_add(n, Relaxed);
        before.saturating_add(n) <= self.max
    }

    pub(crate) fn exhausted(&self) -> bool {
        self.used.load(Relaxed) >= self.max
    }

    pub(crate) fn max(&self) -> u64 {
        self.max
    }
}

/// The accounting of one direction of one connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meter<'a> {
    /// This direction's byte counter (for the log).
    pub bytes: &'a AtomicU64,
    pub budget: &'a Budget,
    pub activity: &'a Activity,
}

impl Meter<'_> {
    /// Writes `data` if the budget allows, counting it.
    pub(crate) async fn write<W: AsyncWrite + Unpin>(&self, w: &mut W, data: &[u8]) -> io::Result<()> {
        let n = data.len() as u64;
        if !self.budget.take(n) {
            return Err(io::Error::other(ByteLimit));
        }
        w.write_all(data).await?;
        self.bytes.fetch_add(n, Relaxed);
        self.activity.touch();
        Ok(())
    }
}

/// Copies `r` to `w` until `r` ends, then half-closes `w`: one direction of a tunnel.
pub(crate) async fn pump<R, W>(r: &mut R, w: &mut W, m: Meter<'_>) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; TUNNEL_BUFFER];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            let _ = w.shutdown().await;
            return Ok(());
        }
        m.activity.touch();
        m.write(w, &buf[..n]).await?;
    }
}

/// Relays one body framed as `body`, verbatim, and nothing after it.
pub(crate) async fn forward_body<R, W>(r: &mut R, w: &mut W, body: Body, m: Meter<'_>) -> io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    match body {
        Body::None => Ok(()),
        Body::Length(n) => forward_length(r, w, n, m).await,
        Body::Chunked => forward_chunked(r, w, m).await,
        Body::UntilClose => loop {
            let n = {
                let avail = r.fill_buf().await?;
                if avail.is_empty() {
                    return Ok(());
                }
                m.activity.touch();
                m.write(w, avail).await?;
                avail.len()
            };
            r.consume(n);
        },
    }
}

async fn forward_length<R, W>(r: &mut R, w: &mut W, mut left: u64, m: Meter<'_>) -> io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    while left > 0 {
        let n = {
            let avail = r.fill_buf().await?;
            if avail.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "body shorter than its length",
                ));
            }
            m.activity.touch();
            let n = avail.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            m.write(w, &avail[..n]).await?;
            n
        };
        r.consume(n);
        left -= n as u64;
    }
    Ok(())
}

/// Relays a chunked body, checking its framing strictly (CRLF line ends, hex sizes), so
/// that both sides agree where it ends.
async fn forward_chunked<R, W>(r: &mut R, w: &mut W, m: Meter<'_>) -> io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut line = Vec::new();
    loop {
        read_line(r, &mut line, MAX_CHUNK_LINE).await?;
        let size = chunk_size(&line)?;
        m.write(w, &line).await?;
        if size == 0 {
            for _ in 0..=MAX_TRAILER_LINES {
                read_line(r, &mut line, MAX_CHUNK_LINE).await?;
                m.write(w, &line).await?;
                if line == b"\r\n" {
                    return Ok(());
                }
            }
            return Err(bad_data("too many trailer lines"));
        }
        forward_length(r, w, size, m).await?;
        read_line(r, &mut line, 2).await?;
        if line != b"\r\n" {
            return Err(bad_data("chunk not followed by CRLF"));
        }
        m.write(w, &line).await?;
    }
}

fn bad_data(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("bad chunked body: {what}"))
}

/// Reads one line ending in CRLF (kept) into `line`, at most `max` bytes.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, line: &mut Vec<u8>, max: usize) -> io::Result<()> {
    line.clear();
    loop {
        let (done, used) = {
            let avail = r.fill_buf().await?;
            if avail.is_empty() {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "body ended early"));
            }
            match avail.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    line.extend_from_slice(&avail[..=i]);
                    (true, i + 1)
                }
                None => {
                    line.extend_from_slice(avail);
                    (false, avail.len())
                }
            }
        };
        r.consume(used);
        if line.len() > max {
            return Err(bad_data("line too long"));
        }
        if done {
            if !line.ends_with(b"\r\n") || line[..line.len() - 2].contains(&b'\r') {
                return Err(bad_data("line not ended by CRLF"));
            }
            return Ok(());
        }
    }
}

/// The size of a chunk-size line `HEX[;ext]\r\n` (whitespace allowed before `;`).
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    let line = &line[..line.len() - 2];
    let (size, ext) = match line.iter().position(|&b| b == b';') {
        Some(i) => (&line[..i], Some(&line[i + 1..])),
        None => (line, None),
    };
    if ext.is_some_and(|e| e.iter().any(|&b| b == 0 || (b.is_ascii_control() && b != b'\t'))) {
        return Err(bad_data("control character in a chunk extension"));
    }
    let size = size.trim_ascii_end();
    if size.is_empty() || size.len() > 16 || !size.iter().all(u8::is_ascii_hexdigit) {
        return Err(bad_data("invalid chunk size"));
    }
    let text = std::str::from_utf8(size).map_err(|_| bad_data("invalid chunk size"))?;
    u64::from_str_radix(text, 16).map_err(|_| bad_data("invalid chunk size"))
}

/// Reads one response head into `head`: an error when the upstream ends before it is
/// whole or it is larger than [`MAX_RESPONSE_HEAD_BYTES`].
pub(crate) async fn read_response_head<R: AsyncBufRead + Unpin>(
    r: &mut R,
    head: &mut Vec<u8>,
) -> io::Result<()> {
    match read_head(r, head, MAX_RESPONSE_HEAD_BYTES).await? {
        HeadRead::Complete => Ok(()),
        HeadRead::Eof => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the upstream closed before a complete response head",
        )),
        HeadRead::TooLarge => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "response head larger than 64 KiB",
        )),
    }
}

/// Relays the upstream's response: interim 1xx heads as they come, then the final head
/// rewritten (`Connection: close`) and its body by its framing. Returns the final status.
pub(crate) async fn relay_response<R, W>(r: &mut R, w: &mut W, method: &str, m: Meter<'_>) -> io::Result<u16>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut head = Vec::new();
    for _ in 0..=MAX_INTERIM_RESPONSES {
        read_response_head(r, &mut head).await?;
        m.activity.touch();
        let resp =
            parse_response(&head, method).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        m.write(w, &resp.head).await?;
        if (100..200).contains(&resp.code) && resp.code != 101 {
            continue;
        }
        forward_body(r, w, resp.body, m).await?;
        let _ = w.shutdown().await;
        return Ok(resp.code);
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "too many interim responses",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    fn meter<'a>(bytes: &'a AtomicU64, budget: &'a Budget, activity: &'a Activity) -> Meter<'a> {
        Meter {
            bytes,
            budget,
            activity,
        }
    }

    #[tokio::test]
    async fn read_head_stops_at_the_blank_line() {
        let data: &[u8] = b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\nBODY";
        // A tiny buffer makes the terminator straddle reads.
        let mut r = BufReader::with_capacity(3, data);
        let mut head = Vec::new();
        assert_eq!(
            read_head(&mut r, &mut head, 1024).await.unwrap(),
            HeadRead::Complete
        );
        assert_eq!(head, &data[..data.len() - 4]);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"BODY");

        let mut r = BufReader::new(&b"GET http://a/ HTTP/1.1\r\n"[..]);
        assert_eq!(read_head(&mut r, &mut head, 1024).await.unwrap(), HeadRead::Eof);
        let big = vec![b'a'; 5000];
        let mut r = BufReader::with_capacity(1024, &big[..]);
        assert_eq!(
            read_head(&mut r, &mut head, 2048).await.unwrap(),
            HeadRead::TooLarge
        );
        assert!(head.len() <= 2048 + 1024);
    }

    async fn chunked(input: &[u8]) -> (io::Result<()>, Vec<u8>, Vec<u8>) {
        let (bytes, budget, activity) = (AtomicU64::new(0), Budget::new(u64::MAX), Activity::new());
        let mut r = BufReader::with_capacity(7, input);
        let mut out = Vec::new();
        let res = forward_body(&mut r, &mut out, Body::Chunked, meter(&bytes, &budget, &activity)).await;
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.unwrap();
        assert_eq!(bytes.load(Relaxed), out.len() as u64);
        (res, out, rest)
    }

    #[tokio::test]
    async fn chunked_bodies_are_relayed_verbatim_and_end_where_they_end() {
        let body = b"5\r\nhello\r\n6;name=v\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n";
        let mut input = body.to_vec();
        input.extend_from_slice(b"GET http://smuggled/ HTTP/1.1\r\n\r\n");
        let (res, out, rest) = chunked(&input).await;
        res.unwrap();
        assert_eq!(out, body);
        assert_eq!(rest, b"GET http://smuggled/ HTTP/1.1\r\n\r\n");
        let (res, out, _) = chunked(b"A \r\n0123456789\r\n0\r\n\r\n").await;
        res.unwrap();
        assert_eq!(out, b"A \r\n0123456789\r\n0\r\n\r\n");
    }

    #[tokio::test]
    async fn bad_chunked_bodies_are_refused() {
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b"x\r\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"11111111111111111\r\n",
            b"5\r\nhel",
            b"5;a\0\r\nhello\r\n0\r\n\r\n",
            b"5\rx\r\nhello\r\n0\r\n\r\n",
            b"\r\n",
        ] {
            let (res, _, _) = chunked(bad).await;
            assert!(res.is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let long = format!("5;{}\r\nhello\r\n0\r\n\r\n", "e".repeat(MAX_CHUNK_LINE));
        assert!(chunked(long.as_bytes()).await.0.is_err());
    }

    #[tokio::test]
    async fn length_bodies_stop_at_their_length() {
        let (bytes, budget, activity) = (AtomicU64::new(0), Budget::new(u64::MAX), Activity::new());
        let mut r = BufReader::with_capacity(4, &b"0123456789rest"[..]);
        let mut out = Vec::new();
        forward_body(
            &mut r,
            &mut out,
            Body::Length(10),
            meter(&bytes, &budget, &activity),
        )
        .await
        .unwrap();
        assert_eq!(out, b"0123456789");
        let mut r = BufReader::new(&b"short"[..]);
        let e = forward_body(
            &mut r,
            &mut Vec::new(),
            Body::Length(10),
            meter(&bytes, &budget, &activity),
        )
        .await;
        assert_eq!(e.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn the_budget_stops_writes() {
        let (bytes, budget, activity) = (AtomicU64::new(0), Budget::new(10), Activity::new());
        let m = meter(&bytes, &budget, &activity);
        let mut out = Vec::new();
        m.write(&mut out, b"0123456789").await.unwrap();
        assert!(budget.exhausted());
        let e = m.write(&mut out, b"x").await.unwrap_err();
        assert!(is_byte_limit(&e));
        assert_eq!(out, b"0123456789");
        assert_eq!(bytes.load(Relaxed), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_resolves_after_the_last_activity() {
        let activity = Activity::new();
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_millis(300)).await;
        activity.touch();
        activity.idle(Duration::from_millis(500)).await;
        assert!(t0.elapsed() >= Duration::from_millis(800));
    }

    #[tokio::test]
    async fn responses_are_relayed_with_interim_heads() {
        let (bytes, budget, activity) = (AtomicU64::new(0), Budget::new(u64::MAX), Activity::new());
        let input = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nokEXTRA";
        let mut r = BufReader::new(&input[..]);
        let mut out = Vec::new();
        let code = relay_response(&mut r, &mut out, "POST", meter(&bytes, &budget, &activity))
            .await
            .unwrap();
        assert_eq!(code, 200);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
        );
        let mut r = BufReader::new(&b"HTTP/1.1 200 OK\r\n"[..]);
        assert!(
            relay_response(&mut r, &mut Vec::new(), "GET", meter(&bytes, &budget, &activity))
                .await
                .is_err()
        );
    }
}
