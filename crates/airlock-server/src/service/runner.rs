//! Running an exec for a request: admission, a sandbox (warm, cold, or the session's),
//! the blocking supervision, metrics and the log line.
//!
//! The work runs in a task of its own that owns everything it uses (the admission
//! permit, the sandbox): a client that goes away cannot release capacity that a sandbox
//! still uses, nor lose a session's sandbox. What the client's departure does is cancel
//! the exec, through a pipe whose write end the request holds.

use airlock_backend::{OutputSink, Shape};
use airlock_spec::{ExecResult, Spec};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

use crate::admission::Permit;
use crate::api::ExecResponse;
use crate::error::ApiError;
use crate::pool::Pool;
use crate::purge::Purge;
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

/// A cancel pipe: the read end is polled by the exec, the write end's drop triggers it.
pub fn cancel_pipe() -> Result<(OwnedFd, OwnedFd), ApiError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| ApiError::internal(format!("pipe: {e}")))
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

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The memory a one-shot exec of `spec` is admitted for: its cap, plus what a sandbox
/// of its tier costs beyond that (a micro-VM's kernel and VMM, gVisor's Sentry).
pub fn admitted_bytes(state: &AppState, spec: &Spec) -> Result<u64, ApiError> {
    let tier = state.tiers.get(spec.isolation)?;
    Ok(spec.limits.memory_bytes + tier.backend.overhead_bytes())
}

/// Waits for admission for one sandbox of `memory_bytes`; refusals are counted.
pub async fn admit(
    state: &AppState,
    key: &KeyName,
    memory_bytes: u64,
) -> Result<(Permit, Duration), ApiError> {
    if *state.stopping.borrow() {
        return Err(ApiError::shutting_down());
    }
    match state.admission.admit(key.0.as_deref(), memory_bytes).await {
        Ok((permit, queued)) => {
            state.metrics.queue_wait.observe(queued.as_secs_f64());
            state.metrics.sandboxes_active.set(state.active() as i64);
            Ok((permit, queued))
        }
        Err(e) => {
            state.metrics.reject(e.code);
            Err(e)
        }
    }
}

/// The longest a taken sandbox's replacement waits for the program to end.
const REFILL_DELAY_MAX: Duration = Duration::from_millis(10);

/// Lets the refiller replace a sandbox taken from the pool once the returned sender is
/// dropped (when the taken one has been purged), or after [`REFILL_DELAY_MAX`]: building
/// the replacement takes milliseconds of CPU, which a short program and its answer should
/// not have to share, and a long program should not keep the pool depleted.
fn refill_after(pool: &Arc<Pool>) -> oneshot::Sender<()> {
    let (done, ended) = oneshot::channel::<()>();
    let pool = Arc::clone(pool);
    tokio::spawn(async move {
        let _ = tokio::time::timeout(REFILL_DELAY_MAX, ended).await;
        pool.taken();
    });
    done
}

/// Runs `spec` in a fresh sandbox (warm when the pool can serve it). The sandbox is purged
/// when the returned [`Purge`] is dropped: hold it until the answer is out
/// ([`crate::purge::after`]). `permit` is the request's admission; it is released with the
/// sandbox. The exec is cancelled if the client leaves (this future is dropped).
pub async fn one_shot(
    state: Arc<AppState>,
    key: KeyName,
    spec: Spec,
    (permit, queued): (Permit, Duration),
    stream: Option<mpsc::Sender<StreamEvent>>,
) -> Result<(ExecResponse, Purge), ApiError> {
    // Nobody to answer when the client left: the purge runs as the result drops.
    detached(move |gone| async move { one_shot_task(&state, &key, spec, permit, queued, gone, stream).await })
        .await
}

/// Runs `task` on a task of its own, handing it the read end of a cancel pipe whose write
/// end this future holds: when the client goes away (this future is dropped), the end
/// turns readable and the exec is cancelled, while the task still finishes its clean-up.
async fn detached<T, F>(task: impl FnOnce(OwnedFd) -> F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
{
    let (gone_r, gone_w) = cancel_pipe()?;
    let _client = gone_w;
    let (tx, rx) = oneshot::channel();
    let work = task(gone_r);
    tokio::spawn(async move {
        let _ = tx.send(work.await);
    });
    rx.await
        .unwrap_or_else(|_| Err(ApiError::internal("exec task lost")))
}

async fn one_shot_task(
    state: &Arc<AppState>,
    key: &KeyName,
    spec: Spec,
    permit: Permit,
    queued: Duration,
    gone: OwnedFd,
    stream: Option<mpsc::Sender<StreamEvent>>,
) -> Result<(ExecResponse, Purge), ApiError> {
    let tier = state.tiers.get(spec.isolation)?;
    let (spec, image) = resolve_image(state, spec).await?;
    let mut shape = Shape::of(&spec);
    shape.image = image.map(|i| i.root);
    // The time spent waiting for the refiller's sandbox counts as setup, like a cold one.
    let got = tier.for_one_shot(&shape, &state.metrics).await?;
    let refill = got.pool.as_ref().map(refill_after);
    let mut sandbox = got.sandbox;
    let cancel = Arc::clone(&state.cancel);
    let ran = tokio::task::spawn_blocking(move || {
        let mut sink = ChannelSink(stream);
        let r = sandbox.exec_once(&spec, &mut sink, &[cancel.as_fd(), gone.as_fd()]);
        (r, sandbox)
    })
    .await;
    let (result, mut sandbox) = ran.map_err(|e| ApiError::internal(format!("exec task: {e}")))?;
    let purge = purge(
        state,
        move || {
            // Nobody waits for its end.
            sandbox.enter_background();
            drop(sandbox);
        },
        permit,
        refill,
    );
    Ok((answer(state, key, result?, got.took, queued), purge))
}

/// The purge of a one-shot's sandbox (or VM): `destroy` goes first, then its admission
/// (capacity is free only once the sandbox is gone), then the pool may build its
/// replacement (one after the other, not side by side).
fn purge(
    state: &Arc<AppState>,
    destroy: impl FnOnce() + Send + 'static,
    permit: Permit,
    refill: Option<oneshot::Sender<()>>,
) -> Purge {
    let state = Arc::clone(state);
    Purge::new(move || {
        destroy();
        drop(permit);
        state.metrics.sandboxes_active.set(state.active() as i64);
        drop(refill);
    })
}

/// A one-shot's answer: `result` with the time its sandbox (or VM) took to provision
/// counted as setup; logged and counted.
fn answer(
    state: &AppState,
    key: &KeyName,
    mut result: ExecResult,
    provisioned: Duration,
    queued: Duration,
) -> ExecResponse {
    result.setup_ms = ((result.setup_ms + provisioned.as_secs_f64() * 1e3) * 1e3).round() / 1e3;
    let resp = ExecResponse {
        result,
        queue_ms: ms(queued),
    };
    record(state, key, &resp);
    resp
}

/// Runs `spec` in a session's sandbox; its files stay for the next exec.
/// Waits for the part of `memory_bytes` that `session`'s idle charge does not cover
/// (see docs/service.md, "Capacity and admission"): what an exec, or a program running
/// between execs, holds on top of the session's idle charge.
pub(crate) async fn reserve_beyond_idle(
    state: &AppState,
    session: &Session,
    memory_bytes: u64,
) -> Result<crate::admission::Reserve, ApiError> {
    let idle = state
        .config
        .session_charge(session.isolation, session.limits.memory_bytes);
    state
        .admission
        .reserve(memory_bytes.saturating_sub(idle))
        .await
        .inspect_err(|e| state.metrics.reject(e.code))
}

pub async fn in_session(
    state: Arc<AppState>,
    key: KeyName,
    session: Arc<Session>,
    spec: Spec,
    stream: Option<mpsc::Sender<StreamEvent>>,
) -> Result<ExecResponse, ApiError> {
    // A draining node's sessions keep working; only a closing one refuses.
    if *state.closing.borrow() {
        return Err(ApiError::shutting_down());
    }
    detached(move |gone| async move { in_session_task(&state, &key, session, spec, gone, stream).await })
        .await
}

async fn in_session_task(
    state: &Arc<AppState>,
    key: &KeyName,
    session: Arc<Session>,
    spec: Spec,
    gone: OwnedFd,
    stream: Option<mpsc::Sender<StreamEvent>>,
) -> Result<ExecResponse, ApiError> {
    let t0 = std::time::Instant::now();
    let mut inner = session.inner.lock().await;
    // The session holds its idle charge; the exec holds the rest of its cap while it runs.
    let _reserve = reserve_beyond_idle(state, &session, spec.limits.memory_bytes).await?;
    let queued = t0.elapsed();
    let Some(mut sandbox) = inner.sandbox.take() else {
        return Err(ApiError::gone(format!("sandbox {} was deleted", session.id)));
    };
    let cancel = Arc::clone(&state.cancel);
    let deleted = Arc::clone(&session.cancel);
    let ran = tokio::task::spawn_blocking(move || {
        let mut sink = ChannelSink(stream);
        let r = sandbox.exec(&spec, &mut sink, &[cancel.as_fd(), deleted.as_fd(), gone.as_fd()]);
        (r, sandbox)
    })
    .await;
    let (result, sandbox) = ran.map_err(|e| ApiError::internal(format!("exec task: {e}")))?;
    inner.sandbox = Some(sandbox);
    let mut result = match result {
        Ok(r) => r,
        Err(_) if session.deleted() => {
            return Err(ApiError::gone(format!(
                "sandbox {} was deleted or expired",
                session.id
            )));
        }
        Err(e) => return Err(e.into()),
    };
    // The result names the session as the API does (`NAME--<id>` with `--node`).
    result.id.clone_from(&session.id);
    inner.execs += 1;
    inner.cpu_ms += result.cpu_ms;
    inner.memory_peak_bytes = inner.memory_peak_bytes.max(result.memory_peak_bytes);
    drop(inner);
    let resp = ExecResponse {
        result,
        queue_ms: ms(queued),
    };
    record(state, key, &resp);
    Ok(resp)
}

/// `spec` with its image's config merged in, and the image (resolved off the async
/// threads: a first use flattens the image's root).
pub(crate) async fn resolve_image(
    state: &Arc<AppState>,
    mut spec: Spec,
) -> Result<(Spec, Option<crate::images::Resolved>), ApiError> {
    if spec.image.is_none() {
        return Ok((spec, None));
    }
    let store = state.images.clone();
    tokio::task::spawn_blocking(move || {
        let image = crate::images::resolve_spec(store.as_deref(), &mut spec)?;
        Ok((spec, image))
    })
    .await
    .map_err(|e| ApiError::internal(format!("image task: {e}")))?
}
