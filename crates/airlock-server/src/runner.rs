//! Running an exec for a request: admission, a sandbox (warm, cold, or the session's),
//! the blocking supervision on a blocking thread, metrics and the log line.

use airlock_sandbox::{OutputSink, SandboxConfig, SandboxError};
use airlock_spec::{ExecResult, Spec};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

use crate::api::ExecResponse;
use crate::error::ApiError;
use crate::state::{AppState, KeyName, Session};

/// What a streaming exec sends as it runs.
#[derive(Debug)]
pub enum StreamEvent {
    /// Output on stdout.
    Stdout(Vec<u8>),
    /// Output on stderr.
    Stderr(Vec<u8>),
}

/// Forwards output to a streaming response. A slow client slows the exec's draining (the
/// channel is bounded), which the program's own deadline still bounds; a client gone
/// away just stops receiving.
struct ChannelSink(Option<mpsc::Sender<StreamEvent>>);

impl OutputSink for ChannelSink {
    fn stdout(&mut self, data: &[u8]) {
        if let Some(tx) = &self.0
            && tx.blocking_send(StreamEvent::Stdout(data.to_vec())).is_err()
        {
            self.0 = None;
        }
    }
    fn stderr(&mut self, data: &[u8]) {
        if let Some(tx) = &self.0
            && tx.blocking_send(StreamEvent::Stderr(data.to_vec())).is_err()
        {
            self.0 = None;
        }
    }
}

/// Maps an engine error to the API's.
pub fn api_error(e: SandboxError) -> ApiError {
    match e {
        SandboxError::Spec(e) => ApiError::invalid(e.field, e.message),
        SandboxError::Setup(m) if m.contains("command not found") || m.contains("no such executable") => {
            ApiError::invalid("cmd", m)
        }
        SandboxError::File(m) => ApiError::invalid("path", m),
        SandboxError::Cancelled => ApiError::shutting_down(),
        SandboxError::Gone => {
            ApiError::conflict("the sandbox is gone (its init was killed, e.g. by the OOM killer)")
        }
        other => {
            tracing::error!(error = %other, "sandbox failure");
            ApiError::internal(other.to_string())
        }
    }
}

fn outcome_label(r: &ExecResult) -> &'static str {
    match r.outcome {
        airlock_spec::Outcome::Exited => "exited",
        airlock_spec::Outcome::Signaled => "signaled",
        airlock_spec::Outcome::Timeout => "timeout",
        airlock_spec::Outcome::Oom => "oom",
    }
}

fn record(state: &AppState, key: &KeyName, r: &ExecResponse) {
    state.metrics.exec(
        outcome_label(&r.result),
        Duration::from_secs_f64(r.result.wall_ms / 1e3),
    );
    state.metrics.egress(&r.result.egress);
    tracing::info!(
        id = %r.result.id,
        key = key.0.as_deref().unwrap_or("-"),
        outcome = outcome_label(&r.result),
        exit_code = r.result.exit_code,
        queue_ms = r.queue_ms,
        setup_ms = r.result.setup_ms,
        wall_ms = r.result.wall_ms,
        memory_peak_bytes = r.result.memory_peak_bytes,
        "exec"
    );
}

/// Runs `spec` in a fresh sandbox (warm when the pool can serve it), then purges it.
pub async fn one_shot(
    state: &Arc<AppState>,
    key: &KeyName,
    spec: Spec,
    stream: Option<mpsc::Sender<StreamEvent>>,
) -> Result<ExecResponse, ApiError> {
    if *state.stopping.borrow() {
        return Err(ApiError::shutting_down());
    }
    let (permit, queued) = match state
        .admission
        .admit(key.0.as_deref(), spec.limits.memory_bytes)
        .await
    {
        Ok(p) => p,
        Err(e) => {
            state.metrics.reject(e.code);
            return Err(e);
        }
    };
    state.metrics.queue_wait.observe(queued.as_secs_f64());
    state.metrics.sandboxes_active.set(state.active() as i64);
    let config = SandboxConfig::of(&spec);
    let (mut sandbox, cold_setup) = match state.pool.take(&config) {
        Some(sb) => (sb, Duration::ZERO),
        None => {
            let (created, took) = state.spawner.create(config).await;
            state.metrics.provisioned("cold", took);
            (created.map_err(api_error)?, took)
        }
    };
    let cancel = Arc::clone(&state.cancel);
    let ran = tokio::task::spawn_blocking(move || {
        let mut sink = ChannelSink(stream);
        let r = sandbox.exec_once(&spec, &mut sink, Some(cancel.as_fd()));
        (r, sandbox)
    })
    .await;
    let (result, sandbox) = ran.map_err(|e| ApiError::internal(format!("exec task: {e}")))?;
    // Purge off the request's path: the response does not wait for the cgroup removal.
    let state2 = Arc::clone(state);
    tokio::task::spawn_blocking(move || {
        drop(sandbox);
        drop(permit);
        state2.metrics.sandboxes_active.set(state2.active() as i64);
    });
    let mut result = result.map_err(api_error)?;
    result.setup_ms = ((result.setup_ms + cold_setup.as_secs_f64() * 1e3) * 1e3).round() / 1e3;
    let resp = ExecResponse {
        result,
        queue_ms: (queued.as_secs_f64() * 1e6).round() / 1e3,
    };
    record(state, key, &resp);
    Ok(resp)
}

/// Runs `spec` in a session's sandbox; its files stay for the next exec.
pub async fn in_session(
    state: &Arc<AppState>,
    key: &KeyName,
    session: Arc<Session>,
    spec: Spec,
    stream: Option<mpsc::Sender<StreamEvent>>,
) -> Result<ExecResponse, ApiError> {
    if *state.stopping.borrow() {
        return Err(ApiError::shutting_down());
    }
    let t0 = std::time::Instant::now();
    let mut inner = session.inner.lock().await;
    let queued = t0.elapsed();
    let Some(mut sandbox) = inner.sandbox.take() else {
        return Err(ApiError::gone(format!("sandbox {} was deleted", session.id)));
    };
    let cancel = Arc::clone(&state.cancel);
    let ran = tokio::task::spawn_blocking(move || {
        let mut sink = ChannelSink(stream);
        let r = sandbox.exec(&spec, &mut sink, Some(cancel.as_fd()));
        (r, sandbox)
    })
    .await;
    let (result, sandbox) = ran.map_err(|e| ApiError::internal(format!("exec task: {e}")))?;
    inner.sandbox = Some(sandbox);
    let result = result.map_err(api_error)?;
    inner.execs += 1;
    inner.cpu_ms += result.cpu_ms;
    inner.memory_peak_bytes = inner.memory_peak_bytes.max(result.memory_peak_bytes);
    drop(inner);
    let resp = ExecResponse {
        result,
        queue_ms: (queued.as_secs_f64() * 1e6).round() / 1e3,
    };
    record(state, key, &resp);
    Ok(resp)
}
