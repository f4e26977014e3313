//! `POST /v1/sandboxes` (create a session), `GET /v1/sandboxes` (list),
//! `GET /v1/sandboxes/{id}` (show), `DELETE /v1/sandboxes/{id}` (purge now).

use airlock_sandbox::SandboxConfig;
use airlock_spec::{Isolation, Spec};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::admission::{SESSION_QUOTA, SessionSlot};
use crate::api::{CreateSandboxRequest, limits};
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::runner::api_error;
use crate::state::{AppState, KeyName, Session, SessionSandbox, purge_session};

/// Seconds since the epoch, with millisecond precision.
pub(crate) fn epoch(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| (d.as_millis() as f64) / 1e3)
}

/// What `POST /v1/sandboxes` answers.
#[derive(Serialize)]
struct Created {
    id: String,
    expires_at: f64,
}

/// One entry of `GET /v1/sandboxes`.
#[derive(Serialize)]
pub struct Info {
    id: String,
    isolation: Isolation,
    created_at: f64,
    expires_at: f64,
    usage: Usage,
}

#[derive(Serialize)]
struct Usage {
    execs: u64,
    cpu_ms: f64,
    memory_peak_bytes: u64,
}

async fn info(s: &Session) -> Info {
    let inner = s.inner.lock().await;
    Info {
        id: s.id.clone(),
        isolation: s.isolation,
        created_at: epoch(s.created),
        expires_at: epoch(s.expires),
        usage: Usage {
            execs: inner.execs,
            cpu_ms: inner.cpu_ms,
            memory_peak_bytes: inner.memory_peak_bytes,
        },
    }
}

pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    JsonBody(req): JsonBody<CreateSandboxRequest>,
) -> Result<Response, ApiError> {
    let session = create_session(&state, &key, &req).await?;
    let body = Created {
        id: session.id.clone(),
        expires_at: epoch(session.expires),
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Creates a session owned by `key`: admission, a sandbox (warm when the pool can serve
/// it) or a micro-VM (likewise from the VM pool), then the registry. The REST route and
/// the MCP tool share it.
pub(crate) async fn create_session(
    state: &Arc<AppState>,
    key: &KeyName,
    req: &CreateSandboxRequest,
) -> Result<Arc<Session>, ApiError> {
    if *state.stopping.borrow() {
        return Err(ApiError::shutting_down());
    }
    let ttl = Duration::from_secs(req.ttl_s.unwrap_or(state.config.default_ttl.as_secs()));
    if ttl.is_zero() || ttl > state.config.max_ttl {
        let max = state.config.max_ttl;
        return Err(ApiError::invalid(
            "ttl_s",
            format!(
                "must be between 1 and {} seconds (this server's --max-session-ttl is {}), got {}",
                max.as_secs(),
                airlock_spec::format_duration(max),
                ttl.as_secs()
            ),
        ));
    }
    let limits = limits(&req.limits, &state.config, &state.config.defaults)?;
    crate::api::check_network(req.network.as_ref())?;
    let mut spec = Spec::new(vec!["true".into()]);
    spec.limits = limits.clone();
    spec.network = req.network.clone().unwrap_or_default();
    spec.isolation = req.isolation.unwrap_or_default();
    // Validated once here, not at each exec.
    spec.validate()
        .map_err(|e| ApiError::invalid(e.field, e.message))?;
    // The key's quota before admission: a caller at its quota does not wait for (or take)
    // a slot another caller could use.
    let slot = reserve_session(state, key)?;
    let (sandbox, permit) = match spec.isolation {
        Isolation::Namespaces => {
            let (permit, _) = crate::runner::admit(state, key, limits.memory_bytes).await?;
            let config = SandboxConfig::of(&spec);
            // A warm sandbox serves a session too: limits are applied at each exec.
            let sandbox = match state.pool.take(&config) {
                Some(mut sb) => {
                    // Its file operations may come before any exec: out of the
                    // background now.
                    sb.leave_background().map_err(api_error)?;
                    sb
                }
                None => {
                    let (created, took) = state.spawner.create(config, false).await;
                    state.metrics.provisioned("cold", took);
                    created.map_err(api_error)?
                }
            };
            (SessionSandbox::Namespaces(sandbox), permit)
        }
        Isolation::Microvm => {
            // Admitted like a one-shot micro-VM exec: the program's memory plus the VM's.
            let memory = limits.memory_bytes + crate::microvm::VM_OVERHEAD_BYTES;
            let (permit, _) = crate::runner::admit(state, key, memory).await?;
            // A pooled VM (its guest's sandbox built already) or one started now, which
            // then gets its sandbox before it is handed over.
            let (mut vm, _) = state.vm.provision_session(&limits, &state.metrics).await?;
            // Proxy mode: the VM's relay and the guest's listener, once for the session.
            if spec.network != airlock_spec::NetworkPolicy::None {
                let network = spec.network.clone();
                let (started, returned) =
                    tokio::task::spawn_blocking(move || (vm.start_egress(&network), vm))
                        .await
                        .map_err(|e| ApiError::internal(format!("starting the egress proxy: {e}")))?;
                vm = returned;
                started.map_err(crate::microvm::vm_error)?;
            }
            (SessionSandbox::Microvm(vm), permit)
        }
    };
    let session = Arc::new(
        Session::new(sandbox, ttl, key.0.clone(), limits, permit, slot)
            .map_err(|e| ApiError::internal(format!("pipe: {e}")))?,
    );
    if let Ok(mut map) = state.sessions.lock() {
        map.insert(session.id.clone(), Arc::clone(&session));
    }
    state.metrics.sandboxes_active.set(state.active() as i64);
    tracing::info!(id = %session.id, key = key.0.as_deref().unwrap_or("-"), ttl_s = ttl.as_secs(), isolation = session.isolation.as_str(), "session created");
    Ok(session)
}

/// A place in `key`'s session quota, or a 429 `session_quota` that names the quota and
/// says when the caller's oldest session expires (`Retry-After`).
fn reserve_session(state: &AppState, key: &KeyName) -> Result<SessionSlot, ApiError> {
    if let Some(slot) = state.session_quota.reserve(key.0.as_deref()) {
        return Ok(slot);
    }
    let now = std::time::Instant::now();
    let first_expiry = state
        .sessions
        .lock()
        .ok()
        .and_then(|m| {
            m.values()
                .filter(|s| s.key == key.0)
                .map(|s| s.deadline.saturating_duration_since(now))
                .min()
        })
        .map_or(1, |d| d.as_secs().max(1));
    let cap = state.session_quota.cap();
    let who = match &key.0 {
        Some(name) => format!("API key {name:?}"),
        None => "the anonymous caller (no API keys are configured)".to_owned(),
    };
    state.metrics.reject(SESSION_QUOTA);
    Err(ApiError::rate_limited(
        SESSION_QUOTA,
        format!(
            "session quota reached: {who} holds {cap} session(s), the most --max-sessions-per-key ({cap}) allows; \
delete one (GET /v1/sandboxes lists them) or wait until one expires (the first in {first_expiry} s)"
        ),
        first_expiry,
    ))
}

pub async fn list(State(state): State<Arc<AppState>>, Extension(key): Extension<KeyName>) -> Json<Vec<Info>> {
    let sessions: Vec<Arc<Session>> = state
        .sessions
        .lock()
        .map(|m| m.values().filter(|s| s.key == key.0).cloned().collect())
        .unwrap_or_default();
    let mut out = Vec::with_capacity(sessions.len());
    for s in sessions {
        out.push(info(&s).await);
    }
    out.sort_by(|a, b| a.created_at.total_cmp(&b.created_at));
    Json(out)
}

pub async fn show(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
) -> Result<Json<Info>, ApiError> {
    let session = state.session(&id, &key)?;
    Ok(Json(info(&session).await))
}

pub async fn delete(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    delete_session(&state, &key, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Purges the session `id` if `key` owns it (404 when unknown, 410 when expired).
pub(crate) async fn delete_session(state: &AppState, key: &KeyName, id: &str) -> Result<(), ApiError> {
    state.session(id, key)?;
    let session = state
        .remove_session(id, false)
        .ok_or_else(|| ApiError::not_found(format!("no sandbox {id}")))?;
    purge_session(session).await;
    state.metrics.sandboxes_active.set(state.active() as i64);
    tracing::info!(id = %id, "session deleted");
    Ok(())
}
