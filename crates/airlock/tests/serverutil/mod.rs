//! Helpers for the service's end-to-end tests: start the real `airlock serve` on
//! 127.0.0.1:0, talk to it over real HTTP (ureq, blocking), and look at what it owns on
//! the host (its cgroup directories `/sys/fs/cgroup/*/airlock/<pid>-<start>/…` and the
//! processes in them).
//!
//! Host checks are scoped to one daemon's owner directory, never global counts: other
//! daemons of the same test binary (and whatever else runs airlock on the machine) own
//! sandboxes too.
#![allow(dead_code)]

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a daemon gets to print its listening line.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Generous: this is a noisy 2-core machine.
const READ_TIMEOUT: Duration = Duration::from_secs(180);

/// Serializes daemon start-up within this test binary. A starting daemon purges the
/// cgroups of dead predecessors; the kill -9 test holds this lock from the kill until its
/// own restart, so that it is *its* restart that purges (and logs) the leftovers.
static START_LOCK: Mutex<()> = Mutex::new(());

/// Takes the start-up lock (poison is harmless: it guards nothing but ordering).
pub fn start_lock() -> MutexGuard<'static, ()> {
    START_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls `f` every 50 ms until it returns `Some`, or `timeout` passes.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t0.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One running `airlock serve`; `Drop` stops it (SIGTERM, then SIGKILL after 5 s) and
/// reaps it.
#[derive(Debug)]
pub struct Daemon {
    child: Child,
    /// Its pid.
    pub pid: u32,
    /// The port it listens on.
    pub port: u16,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its cgroup owner directory name, `<pid>-<start time>`.
    pub owner: String,
    log: Arc<Mutex<String>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
    exited: Option<ExitStatus>,
    /// Its snapshot store, made for it (removed when it is dropped); `None` when the
    /// test gave `--snapshot-dir` itself.
    snapshots: Option<PathBuf>,
}

/// How `airlock serve` ended before it listened.
#[derive(Debug)]
pub struct StartFailure {
    /// Its exit status.
    pub status: ExitStatus,
    /// What it wrote on stderr.
    pub stderr: String,
    /// What it wrote on stdout.
    pub stdout: String,
}

/// A snapshot store directory of one daemon's own: daemons of one test binary run side
/// by side, and a store serves one daemon at a time.
fn fresh_snapshot_dir() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("airlock-test-snapshots-{}-{n}", std::process::id()))
}

/// `airlock serve ARGS`; without `--snapshot-dir` in them, with `snapshots` as its store.
fn serve_command_in(args: &[&str], env: &[(&str, &str)], snapshots: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlock"));
    cmd.arg("serve");
    if !args.contains(&"--listen") {
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    if !args.contains(&"--snapshot-dir") {
        cmd.arg("--snapshot-dir").arg(snapshots);
    }
    cmd.args(args)
        .env_remove("AIRLOCK_API_KEYS")
        .env_remove("AIRLOCK_LOG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `airlock serve ARGS` expecting it to refuse to start; returns how it ended.
pub fn serve_refuses(args: &[&str]) -> StartFailure {
    let snapshots = fresh_snapshot_dir();
    let mut child = serve_command_in(args, &[], &snapshots)
        .spawn()
        .expect("spawn airlock serve");
    let status = poll(START_TIMEOUT, || child.try_wait().expect("try_wait"));
    let _ = std::fs::remove_dir_all(&snapshots);
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("airlock serve {args:?} did not exit within {START_TIMEOUT:?}");
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    StartFailure {
        status,
        stderr,
        stdout,
    }
}

impl Daemon {
    /// Starts `airlock serve --listen 127.0.0.1:0 ARGS` and waits for its listening line.
    pub fn start(args: &[&str]) -> Daemon {
        let _g = start_lock();
        Daemon::start_locked(args, &[])
    }

    /// Same, with extra environment variables for the daemon.
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let _g = start_lock();
        Daemon::start_locked(args, env)
    }

    /// Same, for a caller that already holds [`start_lock`].
    pub fn start_locked(args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let snapshots = (!args.contains(&"--snapshot-dir")).then(fresh_snapshot_dir);
        let mut child = serve_command_in(args, env, snapshots.as_deref().unwrap_or(Path::new("")))
            .spawn()
            .expect("spawn airlock serve");
        let pid = child.id();
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let log2 = Arc::clone(&log);
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut l = log2.lock().unwrap_or_else(|e| e.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            // Keep draining so the daemon never blocks on a full pipe.
            for _ in lines {}
        });
        let line = match rx.recv_timeout(START_TIMEOUT) {
            Ok(line) => line,
            Err(_) => {
                let status = child.try_wait().ok().flatten();
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(200));
                panic!(
                    "airlock serve {args:?} printed no listening line (status {status:?}); stderr:\n{}",
                    log.lock().unwrap_or_else(|e| e.into_inner())
                );
            }
        };
        let port: u16 = line
            .strip_prefix("airlock: listening on http://")
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first stdout line: {line:?}"));
        let host = line
            .strip_prefix("airlock: listening on http://")
            .and_then(|a| a.rsplit_once(':'))
            .map(|(h, _)| h.to_owned())
            .unwrap();
        let host = if host == "0.0.0.0" {
            "127.0.0.1".to_owned()
        } else {
            host
        };
        let owner = format!("{pid}-{}", start_time(pid).expect("daemon start time"));
        Daemon {
            child,
            pid,
            port,
            base: format!("http://{host}:{port}"),
            owner,
            log,
            stderr_reader: Some(stderr_reader),
            exited: None,
            snapshots,
        }
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// An HTTP client without a key.
    pub fn client(&self) -> Client {
        Client::new(&self.base, None)
    }

    /// An HTTP client that sends `Authorization: Bearer KEY`.
    pub fn client_with_key(&self, key: &str) -> Client {
        Client::new(&self.base, Some(key))
    }

    /// Polls `/readyz` until it answers 200.
    pub fn wait_ready(&self) {
        let c = self.client();
        let ready = poll(Duration::from_secs(90), || {
            c.try_request("GET", "/readyz", &[], None)
                .ok()
                .filter(|r| r.status == 200)
        });
        assert!(
            ready.is_some(),
            "/readyz never answered 200; log:\n{}",
            self.log()
        );
    }

    /// Sends `sig` to the daemon.
    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid as i32), sig).expect("kill");
    }

    /// Waits up to `timeout` for the daemon to exit; its status, or `None` if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exited {
            return Some(s);
        }
        let child = &mut self.child;
        let s = poll(timeout, || child.try_wait().expect("try_wait"));
        self.exited = s;
        s
    }

    /// The daemon's open file descriptors.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .expect("read the daemon's fds")
            .count()
    }

    /// The daemon's threads.
    pub fn threads(&self) -> u64 {
        status_field(self.pid, "Threads:").expect("Threads")
    }

    /// The daemon's resident set size in bytes.
    pub fn rss_bytes(&self) -> u64 {
        status_field(self.pid, "VmRSS:").expect("VmRSS") * 1024
    }

    /// Sandbox ids with a cgroup directory under this daemon's owner directory.
    pub fn sandbox_cgroups(&self) -> BTreeSet<String> {
        owner_sandbox_dirs(&self.owner)
    }

    /// The daemon's child processes (zombies included).
    pub fn children(&self) -> Vec<ProcInfo> {
        all_pids()
            .into_iter()
            .filter_map(proc_info)
            .filter(|p| p.ppid == self.pid)
            .collect()
    }

    /// Processes in this daemon's sandbox cgroups.
    pub fn sandbox_processes(&self) -> Vec<ProcInfo> {
        owner_processes(&self.owner)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM first so that the daemon purges what it owns (a SIGKILLed one leaves its
        // cgroup directories to the next start); SIGKILL if it takes more than a few seconds.
        if self.exited.is_none() && self.child.try_wait().ok().flatten().is_none() {
            let _ = kill(Pid::from_raw(self.pid as i32), Signal::SIGTERM);
            let child = &mut self.child;
            if poll(Duration::from_secs(5), || child.try_wait().ok().flatten()).is_none() {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
        if let Some(dir) = &self.snapshots {
            let _ = std::fs::remove_dir_all(dir);
        }
        // Read the rest of its stderr (bounded: a leaked descendant could hold the pipe).
        if let Some(reader) = self.stderr_reader.take() {
            let _ = poll(Duration::from_secs(5), || reader.is_finished().then_some(()));
        }
        if !std::thread::panicking() {
            let log = self.log();
            assert!(
                !log.contains("panicked at"),
                "airlock serve (pid {}) panicked; stderr:\n{log}",
                self.pid
            );
            return;
        }
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(60)..];
        eprintln!(
            "--- airlock serve (pid {}) stderr, last {} lines ---\n{}",
            self.pid,
            tail.len(),
            tail.join("\n")
        );
    }
}

/// A response: status, headers and the whole body.
#[derive(Debug, Clone)]
pub struct Resp {
    /// HTTP status.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Resp {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics, showing it, when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("status {}: body is not JSON ({e}): {}", self.status, self.text()))
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Asserts the status; returns self for chaining.
    #[track_caller]
    pub fn expect(self, status: u16) -> Resp {
        assert_eq!(self.status, status, "unexpected status; body: {}", self.text());
        self
    }

    /// Asserts an API error: this status, `{"error":{"code","message"}}`, and returns
    /// the error object.
    #[track_caller]
    pub fn api_error(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "unexpected status; body: {}", self.text());
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["code"].is_string(), "no error.code: {v}");
        assert!(e["message"].is_string(), "no error.message: {v}");
        e
    }
}

fn to_resp(r: ureq::Response) -> Resp {
    let status = r.status();
    let headers = r
        .headers_names()
        .into_iter()
        .filter_map(|n| r.header(&n).map(|v| (n.to_ascii_lowercase(), v.to_owned())))
        .collect();
    let mut body = Vec::new();
    let _ = r.into_reader().take(256 << 20).read_to_end(&mut body);
    Resp {
        status,
        headers,
        body,
    }
}

/// A blocking HTTP client bound to one daemon (and optionally one API key).
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    key: Option<String>,
    agent: ureq::Agent,
}

impl Client {
    /// A client for `base`, sending `key` as a bearer token if given.
    pub fn new(base: &str, key: Option<&str>) -> Client {
        Client {
            base: base.to_owned(),
            key: key.map(str::to_owned),
            agent: ureq::AgentBuilder::new()
                .timeout_connect(Duration::from_secs(10))
                .timeout_read(READ_TIMEOUT)
                .timeout_write(Duration::from_secs(60))
                .build(),
        }
    }

    fn build(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> ureq::Request {
        let mut req = self.agent.request(method, &format!("{}{path}", self.base));
        if let Some(k) = &self.key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        for (n, v) in headers {
            req = req.set(n, v);
        }
        req
    }

    /// One request; `Err` only for transport failures (any HTTP status is `Ok`).
    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<Resp, String> {
        let req = self.build(method, path, headers);
        let r = match body {
            Some(b) => req.send_bytes(b),
            None => req.call(),
        };
        match r {
            Ok(r) => Ok(to_resp(r)),
            Err(ureq::Error::Status(_, r)) => Ok(to_resp(r)),
            Err(e) => Err(format!("{method} {path}: {e}")),
        }
    }

    /// One request; panics on a transport failure.
    #[track_caller]
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Resp {
        self.try_request(method, path, headers, body)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// GET.
    #[track_caller]
    pub fn get(&self, path: &str) -> Resp {
        self.request("GET", path, &[], None)
    }

    /// DELETE.
    #[track_caller]
    pub fn delete(&self, path: &str) -> Resp {
        self.request("DELETE", path, &[], None)
    }

    /// PUT of raw bytes.
    #[track_caller]
    pub fn put(&self, path: &str, body: &[u8]) -> Resp {
        self.request(
            "PUT",
            path,
            &[("Content-Type", "application/octet-stream")],
            Some(body),
        )
    }

    /// PUT of `len` bytes at `path` in session `id`, asserting 507 `disk_full`; its message.
    #[track_caller]
    pub fn put_disk_full(&self, id: &str, path: &str, len: usize) -> String {
        let e = self
            .put(&format!("/v1/sandboxes/{id}/files?path={path}"), &vec![7u8; len])
            .api_error(507);
        assert_eq!(e["code"], "disk_full", "{e}");
        e["message"].as_str().unwrap().to_owned()
    }

    /// POST of a JSON body.
    #[track_caller]
    pub fn post_json(&self, path: &str, body: &Value) -> Resp {
        self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            Some(body.to_string().as_bytes()),
        )
    }

    /// POST /v1/exec.
    #[track_caller]
    pub fn exec(&self, body: &Value) -> Resp {
        self.post_json("/v1/exec", body)
    }

    /// POST /v1/exec, asserting 200; the ExecResult.
    #[track_caller]
    pub fn exec_ok(&self, body: &Value) -> Value {
        self.exec(body).expect(200).json()
    }

    /// POST /v1/sandboxes with `body`, asserting 201; the new id.
    #[track_caller]
    pub fn create_session(&self, body: &Value) -> String {
        let v = self.post_json("/v1/sandboxes", body).expect(201).json();
        v["id"].as_str().expect("id").to_owned()
    }

    /// POST /v1/sandboxes/{id}/exec.
    #[track_caller]
    pub fn session_exec(&self, id: &str, body: &Value) -> Resp {
        self.post_json(&format!("/v1/sandboxes/{id}/exec"), body)
    }

    /// POST an exec with `Accept: text/event-stream`; the open event stream.
    pub fn sse(&self, path: &str, body: &Value) -> SseStream {
        let r = self
            .build(
                "POST",
                path,
                &[
                    ("Content-Type", "application/json"),
                    ("Accept", "text/event-stream"),
                ],
            )
            .send_bytes(body.to_string().as_bytes());
        Self::event_stream(r)
    }

    /// GET `path` with `Accept: text/event-stream`; the open event stream.
    #[allow(dead_code)]
    pub fn sse_get(&self, path: &str) -> SseStream {
        let r = self.build("GET", path, &[("Accept", "text/event-stream")]).call();
        Self::event_stream(r)
    }

    fn event_stream(r: Result<ureq::Response, ureq::Error>) -> SseStream {
        match r {
            Ok(r) => {
                let ct = r.header("content-type").unwrap_or("").to_owned();
                assert!(ct.starts_with("text/event-stream"), "content-type {ct:?}");
                SseStream {
                    reader: Box::new(BufReader::new(r.into_reader())),
                }
            }
            Err(ureq::Error::Status(s, r)) => panic!("SSE request answered {s}: {}", to_resp(r).text()),
            Err(e) => panic!("SSE request failed: {e}"),
        }
    }
}

/// One Server-Sent Event, with when it arrived.
#[derive(Debug, Clone)]
pub struct SseEvent {
    /// `event:` (empty when none).
    pub event: String,
    /// `data:` lines joined with newlines.
    pub data: String,
    /// When its terminating blank line was read.
    pub at: Instant,
}

impl SseEvent {
    /// The data as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("event {} data is not JSON ({e}): {}", self.event, self.data))
    }
}

/// An event stream read incrementally.
pub struct SseStream {
    reader: Box<dyn BufRead + Send>,
}

impl std::fmt::Debug for SseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SseStream")
    }
}

impl SseStream {
    /// The next event; `None` at the end of the stream.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        let mut event = String::new();
        let mut data: Vec<String> = Vec::new();
        loop {
            let mut line = String::new();
            let n = self
                .reader
                .read_line(&mut line)
                .expect("reading the event stream");
            if n == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if event.is_empty() && data.is_empty() {
                    continue;
                }
                return Some(SseEvent {
                    event,
                    data: data.join("\n"),
                    at: Instant::now(),
                });
            }
            if line.starts_with(':') {
                continue; // comment (keep-alive)
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => event = value.to_owned(),
                "data" => data.push(value.to_owned()),
                _ => {}
            }
        }
    }

    /// Every remaining event.
    pub fn collect_all(&mut self) -> Vec<SseEvent> {
        std::iter::from_fn(|| self.next_event()).collect()
    }
}

/// A host process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    /// Pid.
    pub pid: u32,
    /// Real uid.
    pub uid: u32,
    /// `comm`.
    pub name: String,
    /// Start time (field 22 of stat), to tell a reused pid apart.
    pub start: u64,
    /// State letter.
    pub state: String,
    /// Parent pid.
    pub ppid: u32,
}

/// `/proc/PID/status` field as a number (the first word after the label).
pub fn status_field(pid: u32, label: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(label))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Field 22 of `/proc/PID/stat`.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

fn proc_info(pid: u32) -> Option<ProcInfo> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .unwrap_or("")
            .to_owned()
    };
    Some(ProcInfo {
        pid,
        uid: field("Uid:").parse().ok()?,
        name: field("Name:"),
        start: start_time(pid)?,
        state: field("State:"),
        ppid: field("PPid:").parse().ok()?,
    })
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Whether `p` still runs (same pid, same start time).
pub fn alive(p: &ProcInfo) -> bool {
    start_time(p.pid) == Some(p.start)
}

/// Processes (any uid) whose cgroup lies below `airlock/<owner>` in any hierarchy.
pub fn owner_processes(owner: &str) -> Vec<ProcInfo> {
    let needle = format!("/airlock/{owner}/");
    let exact = format!("/airlock/{owner}");
    all_pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.lines().any(|l| l.contains(&needle) || l.ends_with(&exact)))
        })
        .filter_map(proc_info)
        .collect()
}

/// Host processes with a sandbox uid (>= `HOST_UID_BASE`), of any owner.
pub fn sandbox_uid_processes() -> Vec<ProcInfo> {
    all_pids()
        .into_iter()
        .filter_map(proc_info)
        .filter(|p| p.uid >= airlock_sandbox::HOST_UID_BASE)
        .collect()
}

/// `airlock` directories of every cgroup hierarchy (v1 controllers, unified, v2 root).
fn airlock_bases() -> Vec<PathBuf> {
    let mut bases = vec![PathBuf::from("/sys/fs/cgroup/airlock")];
    if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        bases.extend(entries.flatten().map(|e| e.path().join("airlock")));
    }
    bases.into_iter().filter(|p| p.is_dir()).collect()
}

fn subdirs(p: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Every `airlock/<owner>` directory that exists, in any hierarchy.
pub fn owner_dirs(owner: &str) -> Vec<PathBuf> {
    airlock_bases()
        .into_iter()
        .map(|b| b.join(owner))
        .filter(|p| p.is_dir())
        .collect()
}

/// Sandbox ids with a directory under `airlock/<owner>` in any hierarchy (not the
/// directories a service keeps for its next sandboxes, `.spare-N`).
pub fn owner_sandbox_dirs(owner: &str) -> BTreeSet<String> {
    owner_dirs(owner)
        .iter()
        .flat_map(|d| subdirs(d))
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| !n.starts_with(".spare-"))
        .collect()
}

/// Each of `owner`'s sandboxes with whether its CPU share is the background's: `cpu.idle`
/// where the kernel has it, else the least `cpu.shares` (v1) or `cpu.weight` (v2). Read in
/// the hierarchy that holds the cpu controller.
pub fn cpu_background(owner: &str) -> BTreeMap<String, bool> {
    let mut shares = BTreeMap::new();
    for dir in owner_dirs(owner).iter().flat_map(|d| subdirs(d)) {
        if dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(".spare-"))
        {
            continue;
        }
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .ok()
                .map(|s| s.trim().to_owned())
        };
        let background = match (read("cpu.idle"), read("cpu.shares"), read("cpu.weight")) {
            (Some(idle), _, _) => idle == "1",
            (None, Some(shares), _) => shares == "2",
            (None, None, Some(weight)) => weight == "1",
            _ => continue, // not the cpu controller's hierarchy
        };
        if let Some(id) = dir.file_name() {
            shares.insert(id.to_string_lossy().into_owned(), background);
        }
    }
    shares
}

/// Writes an API keys file (`name:key` lines) into `dir`; its path.
pub fn keys_file(dir: &Path, keys: &[(&str, &str)]) -> PathBuf {
    let path = dir.join("keys");
    let text: String = keys.iter().map(|(n, k)| format!("{n}:{k}\n")).collect();
    std::fs::write(&path, text).expect("write keys file");
    path
}

/// The value of the first sample line that starts with `prefix` (name plus labels).
pub fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
