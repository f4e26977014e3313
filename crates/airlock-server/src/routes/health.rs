//! `GET /healthz` (the process answers) and `GET /readyz` (the pool is warm and the
//! service is not shutting down).

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
    let pool = state.pool.ready();
    let warm = state.pool.target() == 0 || pool > 0;
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
            "pool_target": state.pool.target(),
            "stopping": stopping,
            "sandboxes_active": state.active(),
        })),
    )
}
