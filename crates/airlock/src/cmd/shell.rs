//! `airlock shell [ID]`: this terminal attached to a terminal inside a session of an
//! `airlock serve` (`GET /v1/sandboxes/{id}/pty`, a WebSocket). Without an ID it creates a
//! session first and deletes it afterwards. The local terminal is in raw mode while
//! attached (restored on every way out), window size changes follow, and the command
//! exits with the remote program's status.

use anyhow::{Context, Result, bail};
use clap::Args;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::termios::{self, SetArg, Termios};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tungstenite::{Message, WebSocket};

/// How often the window size is compared with what the remote terminal was told.
const SIZE_CHECK: Duration = Duration::from_millis(200);

#[derive(Debug, Args)]
pub struct ShellArgs {
    /// The session to attach to (default: a new one, deleted when the shell ends).
    id: Option<String>,
    /// The airlock service (its `airlock serve` address).
    #[arg(long, env = "AIRLOCK_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// The API key (when the service has keys).
    #[arg(long, env = "AIRLOCK_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The command to run on the terminal (a shell command; default: bash, or sh).
    #[arg(long)]
    cmd: Option<String>,
    /// A new session's image.
    #[arg(long, conflicts_with = "id")]
    image: Option<String>,
    /// A new session's isolation (namespaces, gvisor, microvm).
    #[arg(long, conflicts_with = "id")]
    isolation: Option<String>,
}

pub fn run(args: ShellArgs) -> Result<ExitCode> {
    let base = args.url.trim_end_matches('/').to_owned();
    let Some(authority) = base.strip_prefix("http://") else {
        bail!(
            "--url: only http:// service addresses are supported by `airlock shell` (got {base:?}); reach a TLS service through a local tunnel"
        );
    };
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(60)).build();
    let auth = args.api_key.as_deref().map(|k| format!("Bearer {k}"));
    let (id, created) = match args.id.clone() {
        Some(id) => (id, false),
        None => (create(&agent, &base, auth.as_deref(), &args)?, true),
    };
    let attached = attach(authority, &id, auth.as_deref(), args.cmd.as_deref());
    if created {
        let mut req = agent.delete(&format!("{base}/v1/sandboxes/{id}"));
        if let Some(a) = &auth {
            req = req.set("Authorization", a);
        }
        let _ = req.call();
    }
    attached
}

/// Creates a session; its id.
fn create(agent: &ureq::Agent, base: &str, auth: Option<&str>, args: &ShellArgs) -> Result<String> {
    let mut body = serde_json::Map::new();
    if let Some(image) = &args.image {
        body.insert("image".into(), image.clone().into());
    }
    if let Some(isolation) = &args.isolation {
        body.insert("isolation".into(), isolation.clone().into());
    }
    let mut req = agent.post(&format!("{base}/v1/sandboxes"));
    if let Some(a) = auth {
        req = req.set("Authorization", a);
    }
    let answer: serde_json::Value = match req.send_json(serde_json::Value::Object(body)) {
        Ok(r) => r.into_json().context("reading the new session")?,
        Err(ureq::Error::Status(code, r)) => bail!("creating a session: {code}: {}", error_text(r)),
        Err(e) => {
            bail!("creating a session at {base}: {e} (is `airlock serve` running there? --url sets where)")
        }
    };
    answer["id"]
        .as_str()
        .map(str::to_owned)
        .context("the service answered no session id")
}

/// The API error's message.
fn error_text(r: ureq::Response) -> String {
    r.into_json::<serde_json::Value>()
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "no message".into())
}

/// This terminal's size (rows, cols), 24x80 when it has none.
fn window_size() -> (u16, u16) {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into `size`, which lives through the call.
    let ok = unsafe { libc::ioctl(libc::STDIN_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    if ok && size.ws_row > 0 && size.ws_col > 0 {
        (size.ws_row, size.ws_col)
    } else {
        (24, 80)
    }
}

/// Puts stdin's terminal in raw mode until dropped (nothing when stdin is no terminal).
struct Raw(Option<Termios>);

impl Raw {
    fn enter() -> Raw {
        let stdin = std::io::stdin();
        let Ok(saved) = termios::tcgetattr(stdin.as_fd()) else {
            return Raw(None);
        };
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        if termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw).is_err() {
            return Raw(None);
        }
        Raw(Some(saved))
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, saved);
        }
    }
}

/// Attaches to session `id`'s terminal until its program ends; its exit status.
fn attach(authority: &str, id: &str, auth: Option<&str>, cmd: Option<&str>) -> Result<ExitCode> {
    let (rows, cols) = window_size();
    let mut url = format!("ws://{authority}/v1/sandboxes/{id}/pty?rows={rows}&cols={cols}");
    if let Some(cmd) = cmd {
        url.push_str("&cmd=");
        url.push_str(&percent(cmd));
    }
    let mut request = tungstenite::client::IntoClientRequest::into_client_request(url.as_str())?;
    if let Some(a) = auth {
        request.headers_mut().insert("Authorization", a.parse()?);
    }
    let host = authority.split('/').next().unwrap_or(authority);
    let stream = TcpStream::connect(host).with_context(|| format!("connecting to {host}"))?;
    let (mut ws, _) = match tungstenite::client(request, stream) {
        Ok(ok) => ok,
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp))) => {
            let body = resp
                .body()
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            let message = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| body.into_owned());
            bail!(
                "opening the terminal of sandbox {id}: {}: {message}",
                resp.status()
            );
        }
        Err(e) => bail!("opening the terminal of sandbox {id}: {e}"),
    };
    ws.get_mut().set_nonblocking(true)?;
    let raw = Raw::enter();
    let code = pump(&mut ws, (rows, cols));
    drop(raw);
    code
}

/// Carries bytes both ways until the remote program ends.
fn pump(ws: &mut WebSocket<TcpStream>, mut told: (u16, u16)) -> Result<ExitCode> {
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let mut stdin_open = true;
    let mut buf = vec![0u8; 16 << 10];
    let mut checked = Instant::now();
    loop {
        let socket = ws.get_ref().as_fd();
        // SAFETY: fd 0 stays open for the whole process.
        let input = unsafe { BorrowedFd::borrow_raw(libc::STDIN_FILENO) };
        let mut fds = vec![PollFd::new(socket, PollFlags::POLLIN)];
        if stdin_open {
            fds.push(PollFd::new(input, PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::from(SIZE_CHECK.as_millis() as u16)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => bail!("waiting for the terminal: {e}"),
        }
        let typed = stdin_open
            && fds
                .get(1)
                .and_then(PollFd::revents)
                .is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP));
        if typed {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => stdin_open = false,
                Ok(n) => send(ws, Message::Binary(buf[..n].to_vec().into()))?,
            }
        }
        if checked.elapsed() >= SIZE_CHECK {
            checked = Instant::now();
            let now = window_size();
            if now != told {
                told = now;
                let resize = serde_json::json!({"type": "resize", "rows": now.0, "cols": now.1});
                send(ws, Message::Text(resize.to_string().into()))?;
            }
        }
        loop {
            match ws.read() {
                Ok(Message::Binary(data)) => {
                    stdout.write_all(&data)?;
                    stdout.flush()?;
                }
                Ok(Message::Text(text)) => {
                    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                    match v["type"].as_str() {
                        Some("exit") => {
                            let code = match (v["exit_code"].as_i64(), v["signal"].as_i64()) {
                                (Some(c), _) => c,
                                (None, Some(s)) => 128 + s,
                                _ => 1,
                            };
                            let _ = ws.close(None);
                            let _ = ws.flush();
                            return Ok(ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)));
                        }
                        Some("error") => {
                            eprint!("\r\nairlock: {}\r\n", v["message"].as_str().unwrap_or_default());
                        }
                        _ => {}
                    }
                }
                Ok(Message::Close(_)) => bail!("the service closed the terminal before its program ended"),
                Ok(_) => {}
                Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::WouldBlock => break,
                Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                    bail!("the connection to the service closed")
                }
                Err(e) => bail!("reading from the terminal: {e}"),
            }
        }
        // Frames queued while the socket was full go out now.
        match ws.flush() {
            Ok(()) => {}
            Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => bail!("writing to the terminal: {e}"),
        }
    }
}

/// Queues `msg` (a full socket keeps it queued for the next flush).
fn send(ws: &mut WebSocket<TcpStream>, msg: Message) -> Result<()> {
    match ws.send(msg) {
        Ok(()) => Ok(()),
        Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::WouldBlock => Ok(()),
        Err(e) => bail!("writing to the terminal: {e}"),
    }
}

/// `s` escaped for a URL's query.
fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
