//! The code interpreter: a Jupyter kernel (ipykernel) living in a session, started at its
//! first `run_code` and kept until the session ends, so variables, imports and open files
//! persist between calls. The kernel runs behind a small driver (`kernel/driver.py`) that
//! the server starts in the sandbox as a process with pipes: requests go to its stdin and
//! events come back on its stdout, one JSON object per line (`kernel/README.md`). Nothing
//! here uses TCP, so it works under network mode `none`.
//!
//! Everything the driver says is the sandbox's word: it is parsed with bounds (line length,
//! total size) and never trusted beyond the answer of its own session's call.

use airlock_backend::{ProcessHandle, Stdio};
use serde::Serialize;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::api::ExecRequest;
use crate::error::ApiError;
use crate::fdio::FdStream;
use crate::service::processes;
use crate::service::sessions::session_spec;
use crate::state::{AppState, Session};

/// The driver, passed to `python3 -c` whole.
const DRIVER: &str = include_str!("../kernel/driver.py");

/// Longest line the driver may send (a large figure's PNG is one line).
const MAX_LINE: usize = 32 << 20;

/// Most bytes of results, logs and tracebacks one call keeps; past it, results are dropped
/// and the call says so in its stderr log.
const MAX_EXECUTION: usize = 64 << 20;

/// How long a kernel may take to start (importing IPython on a loaded sandbox with half a
/// core takes seconds; an emulated micro-VM, more).
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// How long past a call's own timeout the driver has to answer (it interrupts the kernel,
/// and restarts it if the interrupt does not take) before it is killed.
const ANSWER_GRACE: Duration = Duration::from_secs(20);

/// Bytes of the driver's stderr kept for an error message.
const STDERR_TAIL: usize = 8 << 10;

/// The least a session needs to run a kernel (IPython and ipykernel take about 110 MiB
/// and 20 threads, and a few seconds of a quarter core to start): below, a call is
/// refused at once, naming the limit, rather than left to fail or crawl.
pub const MIN_MEMORY: u64 = 128 << 20;
/// See [`MIN_MEMORY`].
pub const MIN_PIDS: u32 = 32;
/// See [`MIN_MEMORY`].
pub const MIN_CPUS: f64 = 0.25;

/// Refuses a session whose limits cannot run a kernel, naming the limit.
fn check_limits(limits: &airlock_spec::Limits) -> Result<(), ApiError> {
    let refuse = |field: &str, need: String, has: String| {
        Err(ApiError::invalid(
            field,
            format!(
                "the code interpreter needs at least {need} (a Jupyter kernel); this sandbox has {has}: create one with more"
            ),
        ))
    };
    if limits.memory_bytes < MIN_MEMORY {
        return refuse(
            "limits.memory_bytes",
            airlock_spec::format_size(MIN_MEMORY),
            airlock_spec::format_size(limits.memory_bytes),
        );
    }
    if limits.pids < MIN_PIDS {
        return refuse(
            "limits.pids",
            format!("{MIN_PIDS} processes"),
            limits.pids.to_string(),
        );
    }
    if limits.cpus < MIN_CPUS {
        return refuse(
            "limits.cpus",
            format!("{MIN_CPUS} cores"),
            format!("{} cores", limits.cpus),
        );
    }
    Ok(())
}

/// A session's running kernel.
#[derive(Debug)]
pub struct Kernel {
    stdin: FdStream,
    stdout: BufReader<FdStream>,
    handle: Arc<dyn ProcessHandle>,
    /// Set once the driver has ended.
    ended: Arc<std::sync::atomic::AtomicBool>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    calls: u64,
}

/// The result of one `run_code`.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct Execution {
    /// The kernel's count of executions (`In [n]`).
    pub execution_count: Option<u64>,
    /// What the code printed.
    pub logs: Logs,
    /// Rich results: the value of the last expression (`execute_result`) and what the code
    /// displayed (`display_data`: figures, tables).
    pub results: Vec<CodeResult>,
    /// The exception that ended it.
    pub error: Option<CodeError>,
    /// Whether its timeout interrupted it (the kernel's state is kept).
    pub timed_out: bool,
    /// From request to answer, in milliseconds, the kernel's start excluded.
    pub duration_ms: f64,
    /// Time this call spent starting the kernel (0 once it runs).
    pub kernel_start_ms: f64,
}

/// Printed output, chunk by chunk.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct Logs {
    /// stdout chunks.
    pub stdout: Vec<String>,
    /// stderr chunks.
    pub stderr: Vec<String>,
}

/// One rich result: a MIME bundle.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CodeResult {
    /// `execute_result` or `display_data`.
    pub kind: String,
    /// MIME type -> value (images base64).
    pub data: Map<String, Value>,
}

/// An exception.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CodeError {
    /// Its class (`ZeroDivisionError`).
    pub name: String,
    /// Its message.
    pub value: String,
    /// The traceback's lines, without colours.
    pub traceback: Vec<String>,
}

/// What a streaming call sends as it happens.
#[derive(Debug, Clone)]
pub enum CodeEvent {
    /// Printed to stdout.
    Stdout(String),
    /// Printed to stderr.
    Stderr(String),
    /// A rich result.
    Result(CodeResult),
    /// The exception.
    Error(CodeError),
}

/// Runs `code` in `session`'s kernel (started first if it has none), for at most
/// `timeout`; events go to `events` as they come.
pub async fn run(
    state: &Arc<AppState>,
    session: &Arc<Session>,
    code: &str,
    timeout: Duration,
    events: Option<mpsc::Sender<CodeEvent>>,
) -> Result<Execution, ApiError> {
    let mut slot = session.kernel.lock().await;
    let mut kernel_start_ms = 0.0;
    if slot.as_ref().is_none_or(|k| k.ended()) {
        check_limits(&session.limits)?;
        let t0 = Instant::now();
        *slot = Some(start(state, session).await?);
        kernel_start_ms = ms(t0.elapsed());
    }
    let Some(kernel) = slot.as_mut() else {
        return Err(ApiError::internal("no kernel"));
    };
    kernel.calls += 1;
    let id = format!("run-{}", kernel.calls);
    let timeout_ms = timeout.as_millis() as u64;
    let t0 = Instant::now();
    let request = json!({"op": "run", "id": id, "code": code, "timeout_ms": timeout_ms});
    let mut exec = Execution {
        kernel_start_ms,
        ..Execution::default()
    };
    let answered = match kernel.send(&request).await {
        Ok(()) => {
            tokio::time::timeout(
                timeout + ANSWER_GRACE,
                kernel.collect(&id, &mut exec, events.as_ref()),
            )
            .await
        }
        Err(e) => Ok(Err(e)),
    };
    exec.duration_ms = ms(t0.elapsed());
    match answered {
        Ok(Ok(())) => Ok(exec),
        // The session ended meanwhile: that is the answer.
        _ if session.deleted() => {
            *slot = None;
            Err(ApiError::gone(format!(
                "sandbox {} was deleted or expired",
                session.id
            )))
        }
        // The driver died or stopped answering: it goes, with the kernel's state; the next
        // call starts a new one.
        failed => {
            let why = match failed {
                Ok(Err(e)) => e,
                _ => format!(
                    "it did not answer within {} s of the call's timeout",
                    ANSWER_GRACE.as_secs()
                ),
            };
            let tail = kernel.stderr_tail();
            kernel.kill().await;
            *slot = None;
            let error = CodeError {
                name: "KernelDied".into(),
                value: format!(
                    "the code interpreter stopped ({why}); its state is lost, and the next call starts a new kernel{}",
                    if tail.is_empty() {
                        String::new()
                    } else {
                        format!(" (its last words: {tail})")
                    }
                ),
                traceback: Vec::new(),
            };
            if let Some(tx) = &events {
                let _ = tx.send(CodeEvent::Error(error.clone())).await;
            }
            exec.error = Some(error);
            exec.timed_out = exec.duration_ms >= timeout_ms as f64;
            Ok(exec)
        }
    }
}

/// Restarts `session`'s kernel: its state is gone. A session without one starts one.
pub async fn restart(state: &Arc<AppState>, session: &Arc<Session>) -> Result<(), ApiError> {
    let mut slot = session.kernel.lock().await;
    if let Some(kernel) = slot.as_mut().filter(|k| !k.ended()) {
        kernel.calls += 1;
        let id = format!("restart-{}", kernel.calls);
        let asked = kernel.send(&json!({"op": "restart", "id": id})).await;
        let answered = match asked {
            Ok(()) => tokio::time::timeout(START_TIMEOUT, kernel.restarted(&id)).await,
            Err(e) => Ok(Err(e)),
        };
        if matches!(answered, Ok(Ok(()))) {
            return Ok(());
        }
        kernel.kill().await;
    }
    *slot = None;
    check_limits(&session.limits)?;
    *slot = Some(start(state, session).await?);
    Ok(())
}

/// Starts the driver in `session` and waits for its kernel to be ready.
async fn start(state: &Arc<AppState>, session: &Arc<Session>) -> Result<Kernel, ApiError> {
    let req = ExecRequest {
        cmd: Some(vec!["python3".into(), "-u".into(), "-c".into(), DRIVER.into()]),
        env: BTreeMap::from([("PYTHONDONTWRITEBYTECODE".to_owned(), "1".to_owned())]),
        ..ExecRequest::default()
    };
    let spec = session_spec(state, session, &req)?;
    let spawned = processes::spawn(state, session, spec, Stdio::Pipes).await?;
    let stderr = Arc::new(Mutex::new(VecDeque::new()));
    let mut stderr_done = None;
    if let Some(fd) = spawned.stderr {
        let mut pipe = FdStream::new(fd).map_err(|e| ApiError::internal(format!("kernel: {e}")))?;
        let tail = Arc::clone(&stderr);
        stderr_done = Some(tokio::spawn(async move {
            let mut buf = vec![0u8; 8 << 10];
            while let Ok(n @ 1..) = pipe.read(&mut buf).await {
                if let Ok(mut t) = tail.lock() {
                    t.extend(&buf[..n]);
                    let over = t.len().saturating_sub(STDERR_TAIL);
                    t.drain(..over);
                }
            }
        }));
    }
    let mut kernel = Kernel {
        stdin: FdStream::new(spawned.stdin).map_err(|e| ApiError::internal(format!("kernel: {e}")))?,
        stdout: BufReader::new(
            FdStream::new(spawned.stdout).map_err(|e| ApiError::internal(format!("kernel: {e}")))?,
        ),
        handle: Arc::from(spawned.handle),
        ended: Arc::default(),
        stderr,
        calls: 0,
    };
    {
        let (handle, ended, deleted) = (
            Arc::clone(&kernel.handle),
            Arc::clone(&kernel.ended),
            Arc::clone(&session.cancel),
        );
        tokio::task::spawn_blocking(move || {
            let _ = handle.wait(&[std::os::fd::AsFd::as_fd(&*deleted)]);
            ended.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
    let first = tokio::time::timeout(START_TIMEOUT, kernel.line()).await;
    if session.deleted() {
        kernel.kill().await;
        return Err(ApiError::gone(format!(
            "sandbox {} was deleted or expired",
            session.id
        )));
    }
    let refused = |message: String| ApiError::invalid("image", message);
    match first {
        Ok(Ok(Some(event))) => match event.get("event").and_then(Value::as_str) {
            Some("ready") => {
                tracing::info!(id = %session.id, python = %event["python"], ipykernel = %event["ipykernel"], "kernel ready");
                Ok(kernel)
            }
            Some("fatal") => {
                kernel.kill().await;
                let message = event["message"]
                    .as_str()
                    .unwrap_or("the kernel did not start")
                    .to_owned();
                match event["reason"].as_str() {
                    Some("no_kernel") => Err(refused(message)),
                    _ => Err(ApiError::internal(format!(
                        "the code interpreter did not start: {message}"
                    ))),
                }
            }
            _ => {
                kernel.kill().await;
                Err(ApiError::internal(format!(
                    "the code interpreter said {event} before it was ready"
                )))
            }
        },
        // Nothing at all: python3 itself is missing (the shell says so), or died.
        Ok(Ok(None)) => {
            let exit = kernel.handle_wait().await;
            // What it said on stderr is all read only once that pipe closed too.
            if let Some(done) = stderr_done {
                let _ = tokio::time::timeout(Duration::from_secs(2), done).await;
            }
            let tail = kernel.stderr_tail();
            if session.deleted() {
                Err(ApiError::gone(format!(
                    "sandbox {} was deleted or expired",
                    session.id
                )))
            } else if exit == Some(airlock_backend::Exit::Signal(libc::SIGKILL)) {
                Err(ApiError::invalid(
                    "limits.memory_bytes",
                    format!(
                        "the code interpreter was killed while it started: this sandbox's memory limit ({}) is likely too small for a Jupyter kernel with what already runs in it",
                        airlock_spec::format_size(session.limits.memory_bytes)
                    ),
                ))
            } else if tail.contains("not found") || tail.contains("No such file") {
                Err(refused(format!(
                    "this sandbox has no python3, which the code interpreter needs (with ipykernel): {tail}"
                )))
            } else {
                Err(ApiError::internal(format!(
                    "the code interpreter ended before it was ready: {}",
                    if tail.is_empty() { "it said nothing" } else { &tail }
                )))
            }
        }
        Ok(Err(e)) => {
            kernel.kill().await;
            Err(ApiError::internal(format!(
                "the code interpreter did not start: {e}"
            )))
        }
        Err(_) => {
            kernel.kill().await;
            Err(ApiError::internal(format!(
                "the code interpreter did not start within {} s",
                START_TIMEOUT.as_secs()
            )))
        }
    }
}

impl Kernel {
    fn ended(&self) -> bool {
        self.ended.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Its exit, waited for a few seconds at most.
    async fn handle_wait(&self) -> Option<airlock_backend::Exit> {
        let handle = Arc::clone(&self.handle);
        tokio::time::timeout(
            Duration::from_secs(5),
            tokio::task::spawn_blocking(move || handle.wait(&[])),
        )
        .await
        .ok()?
        .ok()?
        .ok()
    }

    pub(crate) async fn kill(&self) {
        let handle = Arc::clone(&self.handle);
        let _ = tokio::task::spawn_blocking(move || handle.signal(libc::SIGKILL)).await;
    }

    fn stderr_tail(&self) -> String {
        let tail = self
            .stderr
            .lock()
            .map(|t| t.iter().copied().collect::<Vec<u8>>())
            .unwrap_or_default();
        String::from_utf8_lossy(&tail)
            .trim()
            .lines()
            .last()
            .unwrap_or_default()
            .to_owned()
    }

    async fn send(&mut self, request: &Value) -> Result<(), String> {
        let mut line = request.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("writing to it: {e}"))
    }

    /// The next event line (`None` at end of file). A line over [`MAX_LINE`] is an error.
    async fn line(&mut self) -> Result<Option<Value>, String> {
        loop {
            let mut line = Vec::new();
            let n = (&mut self.stdout)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line)
                .await
                .map_err(|e| format!("reading from it: {e}"))?;
            if n == 0 {
                return Ok(None);
            }
            if line.len() > MAX_LINE {
                return Err(format!("it sent a line over {} MiB", MAX_LINE >> 20));
            }
            match serde_json::from_slice::<Value>(&line) {
                Ok(v @ Value::Object(_)) => return Ok(Some(v)),
                // Not the protocol: skipped.
                _ => continue,
            }
        }
    }

    /// Reads the events of call `id` into `exec` until its `done`.
    async fn collect(
        &mut self,
        id: &str,
        exec: &mut Execution,
        events: Option<&mpsc::Sender<CodeEvent>>,
    ) -> Result<(), String> {
        let mut size = 0usize;
        let mut dropped = false;
        loop {
            let Some(event) = self.line().await? else {
                return Err("it ended".into());
            };
            if event.get("id").and_then(Value::as_str) != Some(id) {
                continue;
            }
            let text = |key: &str| {
                event
                    .get(key)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            let sent = match event.get("event").and_then(Value::as_str) {
                Some(stream @ ("stdout" | "stderr")) => {
                    let t = text("text");
                    if size + t.len() > MAX_EXECUTION {
                        dropped = true;
                        None
                    } else {
                        size += t.len();
                        if stream == "stdout" {
                            exec.logs.stdout.push(t.clone());
                            Some(CodeEvent::Stdout(t))
                        } else {
                            exec.logs.stderr.push(t.clone());
                            Some(CodeEvent::Stderr(t))
                        }
                    }
                }
                Some("result") => {
                    let data = event
                        .get("data")
                        .and_then(Value::as_object)
                        .cloned()
                        .unwrap_or_default();
                    let bytes: usize = data.values().map(|v| v.to_string().len()).sum();
                    if size + bytes > MAX_EXECUTION {
                        dropped = true;
                        None
                    } else {
                        size += bytes;
                        let result = CodeResult {
                            kind: text("kind"),
                            data,
                        };
                        exec.results.push(result.clone());
                        Some(CodeEvent::Result(result))
                    }
                }
                Some("error") => {
                    let traceback = event
                        .get("traceback")
                        .and_then(Value::as_array)
                        .map(|lines| {
                            lines
                                .iter()
                                .filter_map(Value::as_str)
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default();
                    let error = CodeError {
                        name: text("name"),
                        value: text("value"),
                        traceback,
                    };
                    exec.error = Some(error.clone());
                    Some(CodeEvent::Error(error))
                }
                Some("done") => {
                    exec.execution_count = event.get("execution_count").and_then(Value::as_u64);
                    exec.timed_out = event.get("timed_out").and_then(Value::as_bool).unwrap_or(false);
                    if dropped {
                        exec.logs.stderr.push(format!(
                            "[airlock: output and results past {} MiB were dropped]\n",
                            MAX_EXECUTION >> 20
                        ));
                    }
                    return Ok(());
                }
                _ => None,
            };
            if let (Some(tx), Some(ev)) = (events, sent) {
                let _ = tx.send(ev).await;
            }
        }
    }

    /// Waits for the `restarted` of call `id`.
    async fn restarted(&mut self, id: &str) -> Result<(), String> {
        loop {
            let Some(event) = self.line().await? else {
                return Err("it ended".into());
            };
            if event.get("id").and_then(Value::as_str) == Some(id) {
                return match event.get("event").and_then(Value::as_str) {
                    Some("restarted") => Ok(()),
                    _ => Err(format!("it answered {event}")),
                };
            }
        }
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}
