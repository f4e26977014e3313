//! Sessions: creating one (the key's quota, admission, a pooled or new sandbox or
//! micro-VM, the registry), the spec of an exec in one, and deleting one.

use airlock_backend::Shape;
use airlock_spec::Spec;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::admission::{SESSION_QUOTA, SessionSlot};
use crate::api::{CreateSandboxRequest, ExecRequest, limits};
use crate::error::ApiError;
use crate::state::{AppState, KeyName, Session, purge_session};

use super::snapshots::Origin;

/// Seconds since the epoch, with millisecond precision.
pub(crate) fn epoch(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| (d.as_millis() as f64) / 1e3)
}

/// Creates a session owned by `key`: admission, a sandbox of its tier (warm when the
/// tier's pool can serve it, or restored from a snapshot), then the registry.
pub(crate) async fn create_session(
    state: &Arc<AppState>,
    key: &KeyName,
    req: &CreateSandboxRequest,
) -> Result<Arc<Session>, ApiError> {
    if *state.stopping.borrow() {
        return Err(ApiError::shutting_down());
    }
    let plan = match &req.from_snapshot {
        Some(id) => super::snapshots::plan_from(state, key, req, id)?,
        None => Plan {
            ttl_s: req.ttl_s,
            limits: limits(&req.limits, &state.config, &state.config.defaults)?,
            network: req.network.clone().unwrap_or_default(),
            isolation: req.isolation.unwrap_or_default(),
            image: req.image.clone(),
            image_name: None,
            on_idle: req.on_idle.unwrap_or_default(),
            idle_timeout: Duration::from_secs(req.idle_timeout_s.unwrap_or(DEFAULT_IDLE_S)),
            origin: Origin::Fresh,
        },
    };
    if req.network.is_some() {
        crate::api::check_network(req.network.as_ref())?;
    }
    if let Some(t) = req.idle_timeout_s
        && !(1..=MAX_IDLE_S).contains(&t)
    {
        return Err(ApiError::invalid(
            "idle_timeout_s",
            format!("must be between 1 and {MAX_IDLE_S} seconds, got {t}"),
        ));
    }
    open(state, key, plan).await
}

/// A session's idle timeout when the request gives none.
const DEFAULT_IDLE_S: u64 = 60;

/// The longest idle timeout a request may give (a day).
const MAX_IDLE_S: u64 = 86_400;

/// Everything a new session is made of, whoever asked for it (a create, a create from a
/// snapshot, a fork).
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Its lifetime in seconds (`None`: the server's default).
    pub ttl_s: Option<u64>,
    /// Its limits, checked against the server's maxima.
    pub limits: airlock_spec::Limits,
    /// Its network.
    pub network: airlock_spec::NetworkPolicy,
    /// Its tier.
    pub isolation: airlock_spec::Isolation,
    /// Its image, as a reference or digest the store resolves.
    pub image: Option<String>,
    /// The name to record the image under, when `image` is a digest.
    pub image_name: Option<String>,
    /// What it does when idle.
    pub on_idle: crate::api::OnIdle,
    /// After how long without a request.
    pub idle_timeout: Duration,
    /// Where its contents come from.
    pub origin: Origin,
}

/// Makes the session `plan` describes, owned by `key`: the key's quota, admission, its
/// sandbox, the registry.
pub(crate) async fn open(state: &Arc<AppState>, key: &KeyName, plan: Plan) -> Result<Arc<Session>, ApiError> {
    if *state.stopping.borrow() {
        return Err(ApiError::shutting_down());
    }
    let ttl = Duration::from_secs(plan.ttl_s.unwrap_or(state.config.default_ttl.as_secs()));
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
    let limits = plan.limits.clone();
    let mut spec = Spec::new(vec!["true".into()]);
    spec.limits = limits.clone();
    spec.network = plan.network.clone();
    spec.isolation = plan.isolation;
    spec.image = plan.image.clone();
    // Validated once here, not at each exec.
    spec.validate()
        .map_err(|e| ApiError::invalid(e.field, e.message))?;
    // The key's quota before admission: a caller at its quota does not wait for (or take)
    // a slot another caller could use.
    let slot = reserve_session(state, key)?;
    let tier = state.tiers.get(spec.isolation)?;
    // Admitted at its idle charge plus the tier's own memory; each exec holds the rest of
    // its cap while it runs (`runner::in_session`; docs/service.md, "Capacity").
    let memory =
        state.config.session_charge(spec.isolation, limits.memory_bytes) + tier.backend.overhead_bytes();
    let (permit, _) = super::runner::admit(state, key, memory).await?;
    // A warm sandbox serves a session too: limits are applied at each exec.
    let (spec, mut image) = match super::runner::resolve_image(state, spec).await {
        Err(e) if plan.image_name.is_some() => {
            return Err(ApiError::incompatible_snapshot(format!(
                "the snapshot's image {} is not usable here: {}",
                plan.image_name.as_deref().unwrap_or_default(),
                e.message
            )));
        }
        r => r?,
    };
    if let (Some(image), Some(name)) = (image.as_mut(), &plan.image_name) {
        image.name = name.clone();
    }
    let mut shape = Shape::of(&spec);
    shape.image = image.as_ref().map(|i| i.root.clone());
    let sandbox = super::snapshots::build(state, tier, &shape, &plan.origin).await?;
    // The snapshot it came from, as the API names it (the store's id after the node's).
    let node = state.config.node.as_deref();
    let from = match &plan.origin {
        Origin::Snapshot(id) | Origin::Full(_, Some(id)) => Some(crate::node::qualify(node, id)),
        _ => None,
    };
    let session = Arc::new(
        Session::new(sandbox, spec.isolation, ttl, key.0.clone(), limits, permit, slot)
            .map_err(|e| ApiError::internal(format!("pipe: {e}")))?
            .with_node(node)
            .with_image(image)
            .with_network(plan.network.clone())
            .with_idle(plan.on_idle, plan.idle_timeout)
            .with_origin(from),
    );
    if let Ok(mut map) = state.sessions.lock() {
        map.insert(session.id.clone(), Arc::clone(&session));
    }
    state.metrics.sandboxes_active.set(state.active() as i64);
    tracing::info!(id = %session.id, key = key.0.as_deref().unwrap_or("-"), ttl_s = ttl.as_secs(), isolation = session.isolation.as_str(), from_snapshot = session.from_snapshot.as_deref().unwrap_or("-"), "session created");
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

/// The validated spec of an exec in `session`.
pub(crate) fn session_spec(state: &AppState, session: &Session, req: &ExecRequest) -> Result<Spec, ApiError> {
    if req.isolation.is_some_and(|i| i != session.isolation) {
        return Err(ApiError::invalid(
            "isolation",
            format!(
                "this sandbox runs with isolation {} (a session's isolation is set when it is created)",
                session.isolation.as_str()
            ),
        ));
    }
    // The session's image, whose config goes under every exec's request; an exec may
    // name it again (as it must to run the image's own command without `cmd`, as a
    // one-shot exec does), never another.
    let mut spec = req.to_spec(&state.config, &session.limits)?;
    spec.isolation = session.isolation;
    if spec.image.is_none() {
        spec.image = session.image.as_ref().map(|i| i.name.clone());
    }
    match (&req.image, &session.image) {
        (None, _) => {}
        (Some(asked), Some(image)) if *asked == image.name || same_image(state, asked, image) => {}
        (Some(asked), None) => {
            return Err(ApiError::invalid(
                "image",
                format!(
                    "this sandbox runs on the host's system directories, not {asked:?} (a session's image is set when it is created)"
                ),
            ));
        }
        (Some(asked), Some(image)) => {
            return Err(ApiError::invalid(
                "image",
                format!(
                    "this sandbox runs image {}, not {asked:?} (a session's image is set when it is created)",
                    image.name
                ),
            ));
        }
    }
    if let Some(image) = &session.image {
        image.apply(&mut spec)?;
    }
    // The disk is the session's own, fixed when it was created; its memory was admitted
    // at creation, so an exec may not raise it.
    spec.limits.disk_bytes = session.limits.disk_bytes;
    if spec.limits.memory_bytes > session.limits.memory_bytes {
        return Err(ApiError::invalid(
            "limits.memory_bytes",
            format!(
                "{} is above this sandbox's {} (set when it was created)",
                spec.limits.memory_bytes, session.limits.memory_bytes
            ),
        ));
    }
    Ok(spec)
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

/// Whether `asked` names the session's image (any spelling of its name, or its digest).
fn same_image(state: &AppState, asked: &str, image: &crate::images::Resolved) -> bool {
    state
        .images
        .as_deref()
        .and_then(|store| airlock_image::resolve(store, asked).ok())
        .is_some_and(|found| found.manifest_digest.to_string() == image.root.digest)
}
