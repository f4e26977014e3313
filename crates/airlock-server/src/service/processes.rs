//! A session's background processes: programs started alongside its execs (an exec with
//! `background: true`, a terminal) that run until they end, are signalled, or the session
//! ends. Each keeps the last part of its output (the session's output limit per stream),
//! counts every byte, and tells followers when something changed.

use airlock_backend::{Exit, ProcessHandle, Spawned, Stdio};
use airlock_spec::Spec;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::fdio::FdStream;
use crate::service::sessions::epoch;
use crate::state::{AppState, Session};

/// Most processes running at once in one session.
pub const MAX_RUNNING: usize = 16;

/// Most ended processes a session remembers (the oldest are forgotten first).
const MAX_ENDED: usize = 32;

/// After a program ended, how long its output may still take to drain before followers
/// are told it ended anyway.
const DRAIN: Duration = Duration::from_secs(2);

/// A session's processes, by id.
#[derive(Debug, Default)]
pub struct Processes {
    registry: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    next: u64,
    /// By number, so listing is in start order and the oldest ended go first.
    procs: BTreeMap<u64, Arc<Proc>>,
}

/// One background process.
#[derive(Debug)]
pub struct Proc {
    /// `proc-N`.
    pub id: String,
    /// Its argv.
    pub command: Vec<String>,
    /// Whether it runs on a terminal.
    pub tty: bool,
    /// When it started (seconds since the epoch).
    pub started_at: f64,
    handle: Arc<dyn ProcessHandle>,
    stdin: tokio::sync::Mutex<Option<FdStream>>,
    out: Mutex<Output>,
    changed: watch::Sender<u64>,
}

#[derive(Debug)]
struct Output {
    stdout: Ring,
    stderr: Ring,
    /// Streams still being read.
    open: u8,
    exit: Option<Exit>,
    ended_at: Option<f64>,
    timed_out: bool,
    /// Its output has drained (or stopped waiting to): followers may see the end.
    finished: bool,
}

/// The last `cap` bytes of a stream and how many were ever written.
#[derive(Debug)]
struct Ring {
    kept: VecDeque<u8>,
    cap: usize,
    total: u64,
}

impl Ring {
    fn new(cap: usize) -> Ring {
        Ring {
            kept: VecDeque::new(),
            cap,
            total: 0,
        }
    }

    fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let data = &data[data.len().saturating_sub(self.cap)..];
        let over = (self.kept.len() + data.len()).saturating_sub(self.cap);
        self.kept.drain(..over);
        self.kept.extend(data);
    }

    /// Offset of the first byte kept.
    fn start(&self) -> u64 {
        self.total - self.kept.len() as u64
    }

    /// What is kept from absolute offset `from` on (from the first kept byte when `from`
    /// was dropped already).
    fn since(&self, from: u64) -> Vec<u8> {
        let skip = from.saturating_sub(self.start()) as usize;
        self.kept.iter().skip(skip).copied().collect()
    }
}

/// A process as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessInfo {
    /// Its id in the session.
    pub process_id: String,
    /// Its argv.
    pub command: Vec<String>,
    /// Its pid as the sandbox's programs see it.
    pub pid: Option<u32>,
    /// Whether it runs on a terminal.
    pub tty: bool,
    /// `running` or `exited`.
    pub state: &'static str,
    /// When it started.
    pub started_at: f64,
    /// When it ended.
    pub ended_at: Option<f64>,
    /// Its exit status, if it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
    /// Whether its timeout killed it.
    pub timed_out: bool,
    /// Every byte it wrote to stdout.
    pub stdout_bytes: u64,
    /// Every byte it wrote to stderr.
    pub stderr_bytes: u64,
}

/// What a process's output route answers: what is kept of each stream now.
#[derive(Debug, Clone, Serialize)]
pub struct OutputShown {
    /// The kept stdout, UTF-8 with invalid bytes replaced.
    pub stdout: String,
    /// The kept stderr.
    pub stderr: String,
    /// Bytes of stdout no longer kept (the oldest).
    pub stdout_dropped: u64,
    /// Bytes of stderr no longer kept.
    pub stderr_dropped: u64,
    /// The process.
    pub process: ProcessInfo,
}

/// One piece of a followed process's output, or its end.
#[derive(Debug, Clone)]
pub enum Follow {
    /// Bytes of stdout.
    Stdout(Vec<u8>),
    /// Bytes of stderr.
    Stderr(Vec<u8>),
    /// It ended (or, not following, everything kept was sent).
    End(ProcessInfo),
}

impl Proc {
    /// How it looks now.
    pub fn info(&self) -> ProcessInfo {
        let out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let (exit_code, signal) = match out.exit {
            Some(Exit::Code(c)) => (Some(c), None),
            Some(Exit::Signal(s)) => (None, Some(s)),
            None => (None, None),
        };
        ProcessInfo {
            process_id: self.id.clone(),
            command: self.command.clone(),
            pid: self.handle.pid(),
            tty: self.tty,
            state: if out.exit.is_some() { "exited" } else { "running" },
            started_at: self.started_at,
            ended_at: out.ended_at,
            exit_code,
            signal,
            timed_out: out.timed_out,
            stdout_bytes: out.stdout.total,
            stderr_bytes: out.stderr.total,
        }
    }

    /// Whether it has ended.
    pub fn ended(&self) -> bool {
        self.out.lock().is_ok_and(|o| o.exit.is_some())
    }

    fn finished(&self) -> bool {
        self.out.lock().is_ok_and(|o| o.finished)
    }

    fn touch(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// What is kept of its output.
    pub fn output(&self) -> OutputShown {
        let (stdout, stderr, stdout_dropped, stderr_dropped) = {
            let out = self.out.lock().unwrap_or_else(|e| e.into_inner());
            (
                String::from_utf8_lossy(&out.stdout.since(0)).into_owned(),
                String::from_utf8_lossy(&out.stderr.since(0)).into_owned(),
                out.stdout.start(),
                out.stderr.start(),
            )
        };
        OutputShown {
            stdout,
            stderr,
            stdout_dropped,
            stderr_dropped,
            process: self.info(),
        }
    }

    /// Its output from the start of what is kept, then (with `follow`) what comes, until
    /// it ends; `End` last. Sent into `tx` until the receiver goes away.
    pub async fn follow(self: Arc<Self>, follow: bool, tx: tokio::sync::mpsc::Sender<Follow>) {
        let mut changed = self.changed.subscribe();
        let (mut at_out, mut at_err) = (0u64, 0u64);
        loop {
            changed.borrow_and_update();
            let (out, err, finished) = {
                let o = self.out.lock().unwrap_or_else(|e| e.into_inner());
                let got = (o.stdout.since(at_out), o.stderr.since(at_err), o.finished);
                at_out = o.stdout.total;
                at_err = o.stderr.total;
                got
            };
            if !out.is_empty() && tx.send(Follow::Stdout(out)).await.is_err() {
                return;
            }
            if !err.is_empty() && tx.send(Follow::Stderr(err)).await.is_err() {
                return;
            }
            if finished || !follow {
                let _ = tx.send(Follow::End(self.info())).await;
                return;
            }
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                () = tx.closed() => return,
            }
        }
    }

    /// Waits until it has ended and its output drained, at most `timeout`.
    pub async fn wait(&self, timeout: Duration) {
        let mut changed = self.changed.subscribe();
        let _ = tokio::time::timeout(timeout, async {
            while !self.finished() {
                if changed.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }

    /// Sends it `signal` (off the async threads: a tier may answer over a wire).
    pub async fn signal(&self, signal: i32) -> Result<(), ApiError> {
        let handle = Arc::clone(&self.handle);
        tokio::task::spawn_blocking(move || handle.signal(signal))
            .await
            .map_err(|e| ApiError::internal(format!("signal task: {e}")))?
            .map_err(ApiError::from)
    }

    /// Resizes its terminal.
    pub async fn resize(&self, rows: u16, cols: u16) -> Result<(), ApiError> {
        let handle = Arc::clone(&self.handle);
        tokio::task::spawn_blocking(move || handle.resize(rows, cols))
            .await
            .map_err(|e| ApiError::internal(format!("resize task: {e}")))?
            .map_err(ApiError::from)
    }

    /// Writes `data` to its stdin, then closes it with `eof`.
    pub async fn write_stdin(&self, data: &[u8], eof: bool) -> Result<(), ApiError> {
        let mut stdin = self.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            if data.is_empty() && eof {
                return Ok(());
            }
            return Err(ApiError::conflict(format!(
                "process {}'s stdin is closed (it was sent eof, or the process is a terminal's: write to the terminal)",
                self.id
            )));
        };
        if !data.is_empty() {
            // A program that reads nothing must not hang the request: the pipe's buffer
            // takes 64 KiB, and the rest waits at most this long.
            match tokio::time::timeout(Duration::from_secs(10), pipe.write_all(data)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    *stdin = None;
                    return Err(ApiError::conflict(format!(
                        "process {} closed its stdin (or ended)",
                        self.id
                    )));
                }
                Ok(Err(e)) => return Err(ApiError::internal(format!("writing stdin: {e}"))),
                Err(_) => {
                    return Err(ApiError::conflict(format!(
                        "process {} did not read its stdin for 10 s (part of the data may have been written)",
                        self.id
                    )));
                }
            }
        }
        if eof {
            *stdin = None;
        }
        Ok(())
    }
}

impl Processes {
    /// The process `id` of this session (404 naming it).
    pub fn get(&self, id: &str) -> Result<Arc<Proc>, ApiError> {
        let reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        id.strip_prefix("proc-")
            .and_then(|n| n.parse::<u64>().ok())
            .and_then(|n| reg.procs.get(&n).cloned())
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "no process {id:?} in this sandbox (GET /v1/sandboxes/{{id}}/processes lists them)"
                ))
            })
    }

    /// Every process it remembers, in start order.
    pub fn list(&self) -> Vec<ProcessInfo> {
        let procs: Vec<_> = self
            .registry
            .lock()
            .map(|r| r.procs.values().cloned().collect())
            .unwrap_or_default();
        procs.iter().map(|p| p.info()).collect()
    }

    /// Kills every running process and waits a little for them to end (a restore
    /// ends what ran on the files it replaces).
    pub async fn kill_all(&self) {
        let running: Vec<Arc<Proc>> = self
            .registry
            .lock()
            .map(|r| r.procs.values().filter(|p| !p.ended()).cloned().collect())
            .unwrap_or_default();
        for p in &running {
            let _ = p.signal(libc::SIGKILL).await;
        }
        for p in &running {
            p.wait(Duration::from_secs(5)).await;
        }
    }

    /// A place for one more running process (409 at [`MAX_RUNNING`]).
    fn check_room(&self) -> Result<(), ApiError> {
        let running = self
            .registry
            .lock()
            .map(|r| r.procs.values().filter(|p| !p.ended()).count())
            .unwrap_or(0);
        if running >= MAX_RUNNING {
            return Err(ApiError::conflict(format!(
                "this sandbox already runs {running} background processes, the most it may; signal one (POST …/processes/{{process_id}}/signal) or wait for one to end"
            )));
        }
        Ok(())
    }

    fn add(&self, make: impl FnOnce(String) -> Proc) -> Arc<Proc> {
        let mut reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        reg.next += 1;
        let n = reg.next;
        let proc = Arc::new(make(format!("proc-{n}")));
        reg.procs.insert(n, Arc::clone(&proc));
        // Forget the oldest ended ones beyond the memory.
        let ended: Vec<u64> = reg
            .procs
            .iter()
            .filter(|(_, p)| p.ended())
            .map(|(n, _)| *n)
            .collect();
        for n in ended.iter().take(ended.len().saturating_sub(MAX_ENDED)) {
            reg.procs.remove(n);
        }
        proc
    }
}

/// Starts `spec`'s program in `session` alongside its execs (after writing `spec.files`),
/// on `stdio`. Waits for a running exec to end first (the sandbox serves one request at
/// a time).
pub async fn spawn(
    state: &AppState,
    session: &Arc<Session>,
    spec: Spec,
    stdio: Stdio,
) -> Result<Spawned, ApiError> {
    session.processes.check_room()?;
    hold_cap(state, session).await?;
    let mut inner = session.inner.lock().await;
    let Some(mut sandbox) = inner.sandbox.take() else {
        return Err(ApiError::gone(format!("sandbox {} was deleted", session.id)));
    };
    let deleted = Arc::clone(&session.cancel);
    let (result, sandbox) = tokio::task::spawn_blocking(move || {
        let result = (|| {
            for f in &spec.files {
                sandbox.write_file(&f.path, f.mode, &f.content, &[deleted.as_fd()])?;
            }
            sandbox.spawn(&spec, stdio)
        })();
        (result, sandbox)
    })
    .await
    .map_err(|e| ApiError::internal(format!("spawn task: {e}")))?;
    inner.sandbox = Some(sandbox);
    drop(inner);
    result.map_err(ApiError::from)
}

/// Makes `session` hold its whole memory cap from now on, if it does not already: a
/// program that runs between execs may use it while the session looks idle.
async fn hold_cap(state: &AppState, session: &Session) -> Result<(), ApiError> {
    if session.background.lock().is_ok_and(|b| b.is_some()) {
        return Ok(());
    }
    let reserve =
        crate::service::runner::reserve_beyond_idle(state, session, session.limits.memory_bytes).await?;
    if let Ok(mut held) = session.background.lock() {
        // Two spawns at once: the second's reserve is given back here.
        held.get_or_insert(reserve);
    }
    Ok(())
}

/// Registers a spawned program as one of `session`'s processes: its output is read into
/// its buffers (keeping `keep` bytes per stream), its stdin kept for the stdin route, and
/// with `timeout` it is killed when that passes.
pub fn register(
    session: &Arc<Session>,
    command: Vec<String>,
    spawned: Spawned,
    keep: usize,
    timeout: Option<Duration>,
) -> Result<Arc<Proc>, ApiError> {
    let tty = false;
    let Spawned {
        stdin,
        stdout,
        stderr,
        handle,
    } = spawned;
    let handle: Arc<dyn ProcessHandle> = Arc::from(handle);
    let stdin = FdStream::new(stdin).map_err(|e| ApiError::internal(format!("stdin: {e}")))?;
    let mut readers = vec![(false, stdout)];
    readers.extend(stderr.map(|fd| (true, fd)));
    let (changed, _) = watch::channel(0);
    let proc = session.processes.add(|id| Proc {
        id,
        command,
        tty,
        started_at: epoch(SystemTime::now()),
        handle: Arc::clone(&handle),
        stdin: tokio::sync::Mutex::new(Some(stdin)),
        out: Mutex::new(Output {
            stdout: Ring::new(keep),
            stderr: Ring::new(keep),
            open: readers.len() as u8,
            exit: None,
            ended_at: None,
            timed_out: false,
            finished: false,
        }),
        changed,
    });
    for (is_err, fd) in readers {
        let mut stream = FdStream::new(fd).map_err(|e| ApiError::internal(format!("output: {e}")))?;
        let proc = Arc::clone(&proc);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if let Ok(mut o) = proc.out.lock() {
                            if is_err { &mut o.stderr } else { &mut o.stdout }.push(&buf[..n]);
                        }
                        proc.touch();
                    }
                }
            }
            if let Ok(mut o) = proc.out.lock() {
                o.open -= 1;
                o.finished = o.open == 0 && o.exit.is_some();
            }
            proc.touch();
        });
    }
    watch_exit(session, &proc, timeout);
    Ok(proc)
}

/// Registers a terminal's program: listed and signalled like any process, its output
/// the caller's.
pub fn register_terminal(
    session: &Arc<Session>,
    command: Vec<String>,
    handle: Box<dyn ProcessHandle>,
) -> Arc<Proc> {
    let (changed, _) = watch::channel(0);
    let proc = session.processes.add(|id| Proc {
        id,
        command,
        tty: true,
        started_at: epoch(SystemTime::now()),
        handle: Arc::from(handle),
        stdin: tokio::sync::Mutex::new(None),
        out: Mutex::new(Output {
            stdout: Ring::new(0),
            stderr: Ring::new(0),
            open: 0,
            exit: None,
            ended_at: None,
            timed_out: false,
            finished: false,
        }),
        changed,
    });
    watch_exit(session, &proc, None);
    proc
}

/// Records `proc`'s end when it comes (the session's end is SIGKILL), and kills it when
/// `timeout` passes first.
fn watch_exit(session: &Arc<Session>, proc: &Arc<Proc>, timeout: Option<Duration>) {
    let waiter = Arc::clone(proc);
    let deleted = Arc::clone(&session.cancel);
    tokio::spawn(async move {
        let handle = Arc::clone(&waiter.handle);
        let exit = tokio::task::spawn_blocking(move || handle.wait(&[deleted.as_fd()]))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(Exit::Signal(libc::SIGKILL));
        if let Ok(mut o) = waiter.out.lock() {
            o.exit = Some(exit);
            o.ended_at = Some(epoch(SystemTime::now()));
            o.finished = o.open == 0;
        }
        waiter.touch();
        // Output still in the pipes drains now; followers are not kept waiting on a
        // stream that does not close.
        tokio::time::sleep(DRAIN).await;
        if let Ok(mut o) = waiter.out.lock() {
            o.finished = true;
        }
        waiter.touch();
    });
    if let Some(timeout) = timeout {
        let proc = Arc::clone(proc);
        tokio::spawn(async move {
            let mut changed = proc.changed.subscribe();
            let ended = tokio::time::timeout(timeout, async {
                while !proc.ended() {
                    if changed.changed().await.is_err() {
                        return;
                    }
                }
            })
            .await;
            if ended.is_err() && !proc.ended() {
                if let Ok(mut o) = proc.out.lock() {
                    o.timed_out = true;
                }
                let _ = proc.signal(libc::SIGKILL).await;
            }
        });
    }
}

/// A signal by name (`SIGTERM`, `TERM`) or number, among those a caller may send.
pub fn parse_signal(value: &serde_json::Value) -> Result<i32, ApiError> {
    const ALLOWED: [(&str, i32); 9] = [
        ("SIGTERM", libc::SIGTERM),
        ("SIGKILL", libc::SIGKILL),
        ("SIGINT", libc::SIGINT),
        ("SIGHUP", libc::SIGHUP),
        ("SIGQUIT", libc::SIGQUIT),
        ("SIGUSR1", libc::SIGUSR1),
        ("SIGUSR2", libc::SIGUSR2),
        ("SIGSTOP", libc::SIGSTOP),
        ("SIGCONT", libc::SIGCONT),
    ];
    let found = match value {
        serde_json::Value::String(s) => {
            let upper = s.to_ascii_uppercase();
            let name = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            ALLOWED.iter().find(|(n, _)| *n == name)
        }
        serde_json::Value::Number(n) => n
            .as_i64()
            .and_then(|n| ALLOWED.iter().find(|(_, s)| i64::from(*s) == n)),
        _ => None,
    };
    found.map(|(_, s)| *s).ok_or_else(|| {
        ApiError::invalid(
            "signal",
            format!(
                "must be one of {} (or its number), got {value}",
                ALLOWED.map(|(n, _)| n).join(", ")
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_the_last_bytes_and_counts_them_all() {
        let mut r = Ring::new(5);
        r.push(b"abc");
        r.push(b"defg");
        assert_eq!(r.since(0), b"cdefg");
        assert_eq!((r.total, r.start()), (7, 2));
        assert_eq!(r.since(5), b"fg");
        r.push(b"0123456789");
        assert_eq!(r.since(0), b"56789");
        assert_eq!(r.start(), 12);
    }

    #[test]
    fn signals_are_named_or_numbered_and_only_those_allowed() {
        use serde_json::json;
        assert_eq!(parse_signal(&json!("SIGTERM")).unwrap(), libc::SIGTERM);
        assert_eq!(parse_signal(&json!("int")).unwrap(), libc::SIGINT);
        assert_eq!(parse_signal(&json!(9)).unwrap(), libc::SIGKILL);
        for bad in [json!("SIGSEGV"), json!(11), json!(null), json!("")] {
            let e = parse_signal(&bad).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("signal"), "{bad}");
        }
    }
}
