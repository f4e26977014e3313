//! `GET /healthz` (the process answers) and `GET /readyz` (the pool is warm and the
//! service is not shutting down or draining), with the node's name and free capacity
//! for a fleet's router.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use std::sync::Arc;

use crate::state::AppState;

pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, Json<Value>) {
    let stopping = *state.stopping.borrow();
    // The pools of every tier, summed. Ready follows the default tier's pool: the
    // others (a micro-VM pool booting under emulation) may take long to fill, or never
    // on a host that cannot run them, and requests for them still work meanwhile.
    let pool: usize = state.tiers.iter().map(|t| t.pool().ready()).sum();
    let target: usize = state.tiers.iter().map(|t| t.pool().target()).sum();
    let warm = state
        .tiers
        .get(airlock_spec::Isolation::default())
        .map_or(true, |t| t.pool().target() == 0 || t.pool().ready() > 0);
    let ready = warm && !stopping;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({
            "ready": ready,
            "pool_ready": pool,
            "pool_target": target,
            "stopping": stopping,
            "sandboxes_active": state.active(),
            // What a fleet's router (`airlock serve --route`) places new work by.
            "node": state.config.node,
            "sandboxes_max": state.config.max_sandboxes,
            "sandboxes_free": state.admission.free_slots(),
            "memory_budget_bytes": state.config.memory_budget,
            "memory_free_bytes": state.admission.free_memory(),
            "sessions": state.sessions.lock().map_or(0, |m| m.len()),
            "queued": state.admission.queued(),
        })),
    )
}
