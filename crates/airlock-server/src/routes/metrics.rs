//! `GET /metrics`: Prometheus text exposition.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use std::sync::Arc;

use crate::state::AppState;

pub async fn handle(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    for tier in state.tiers.iter() {
        for pool in tier.pools() {
            pool.report(&state.metrics);
        }
    }
    state.metrics.sandboxes_active.set(state.active() as i64);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
}
