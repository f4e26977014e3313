//! `POST /v1/exec`: one-shot — provision (or take a warm sandbox), run, purge.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use std::sync::Arc;

use crate::api::ExecRequest;
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::service::runner;
use crate::state::{AppState, KeyName};
use crate::stream;

pub async fn handle(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    headers: HeaderMap,
    JsonBody(req): JsonBody<ExecRequest>,
) -> Result<Response, ApiError> {
    if req.background {
        return Err(ApiError::invalid(
            "background",
            "needs a session: a one-shot exec's sandbox ends with its program (create one with POST /v1/sandboxes)",
        ));
    }
    let spec = req.to_spec(&state.config, &state.config.defaults)?;
    if spec
        .network
        .proxy()
        .is_some_and(|p| p.on_denied == airlock_spec::OnDenied::Ask)
    {
        return Err(ApiError::invalid(
            "network.on_denied",
            "\"ask\" needs a session: a one-shot exec has nobody to answer (create one with POST /v1/sandboxes)",
        ));
    }
    // Admission first, so overload is a 429 whatever the response format.
    let admitted = runner::admit(&state, &key, runner::admitted_bytes(&state, &spec)?).await?;
    if super::wants_stream(&headers) {
        return Ok(stream::respond(move |tx| {
            // The result event is the last: the purge may start with it.
            async move {
                let (response, _purge) = runner::one_shot(state, key, spec, admitted, Some(tx)).await?;
                Ok(response)
            }
        }));
    }
    let (response, purge) = runner::one_shot(state, key, spec, admitted, None).await?;
    Ok(crate::purge::after(Json(response).into_response(), purge))
}
