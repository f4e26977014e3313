//! API errors: `{"error": {"code", "message", "field"}}` with the right status. Overload is
//! always a 429, never a 5xx.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// One API error.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// What is wrong, for a person.
    pub message: String,
    /// The request field at fault, in the API's spelling.
    pub field: Option<String>,
    /// Seconds after which a retry may succeed (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after: None,
        }
    }

    /// 400: the request is invalid; `field` names what.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::BAD_REQUEST, "invalid_request", message);
        e.field = Some(field.into());
        e
    }

    /// 400 without a specific field (malformed JSON).
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed_json", message)
    }

    /// 401.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid API key is required (Authorization: Bearer KEY)",
        )
    }

    /// 404.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", what)
    }

    /// 410: the sandbox existed and expired.
    pub fn gone(what: impl Into<String>) -> Self {
        Self::new(StatusCode::GONE, "expired", what)
    }

    /// 409: the sandbox is busy with another exec.
    pub fn conflict(what: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "busy", what)
    }

    /// 409 `paused`: the session was paused by request and must be resumed first.
    pub fn paused(id: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "paused",
            format!("sandbox {id} is paused; resume it first (POST /v1/sandboxes/{id}/resume)"),
        )
    }

    /// 409 `incompatible_snapshot`: the snapshot cannot go into this session.
    pub fn incompatible_snapshot(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "incompatible_snapshot", message)
    }

    /// 507 `snapshot_budget`: the snapshot store's disk budget would be passed.
    pub fn snapshot_budget(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INSUFFICIENT_STORAGE, "snapshot_budget", message)
    }

    /// 503 `snapshots_unavailable`: this service has no usable snapshot store.
    pub fn snapshots_unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "snapshots_unavailable", message)
    }

    /// 413.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the body exceeds {limit} bytes (--max-body)"),
        )
    }

    /// 507: a file does not fit the sandbox's disk; the message names the disk's size,
    /// the file and its size. The sandbox stays usable.
    pub fn disk_full(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INSUFFICIENT_STORAGE, "disk_full", message)
    }

    /// 415.
    pub fn unsupported_media_type() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the request as JSON (Content-Type: application/json)",
        )
    }

    /// 429 with Retry-After.
    pub fn rate_limited(reason: &'static str, message: impl Into<String>, retry_after: u64) -> Self {
        let mut e = Self::new(StatusCode::TOO_MANY_REQUESTS, reason, message);
        e.retry_after = Some(retry_after);
        e
    }

    /// 503: the service is shutting down (or, a fleet member, draining: it takes no new
    /// sessions or one-shot execs; its sessions keep working until it exits).
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the service is shutting down: it takes no new sandboxes or execs (another node may)",
        )
    }

    /// 503: the isolation tier asked for cannot run on this host (a host condition, not
    /// the client's fault): `microvm_unavailable`, `gvisor_unavailable`,
    /// `namespaces_unavailable`.
    pub fn tier_unavailable(tier: airlock_spec::Isolation, message: impl Into<String>) -> Self {
        let code = match tier {
            airlock_spec::Isolation::Namespaces => "namespaces_unavailable",
            airlock_spec::Isolation::Gvisor => "gvisor_unavailable",
            airlock_spec::Isolation::Microvm => "microvm_unavailable",
        };
        Self::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
    }

    /// 502: what a session's program should have answered could not be had (nothing
    /// listens on an exposed port, its connection failed).
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "bad_gateway", message)
    }

    /// 504: a session's program did not answer in time.
    pub fn gateway_timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::GATEWAY_TIMEOUT, "gateway_timeout", message)
    }

    /// Any other error status (405 from the router, a rejection of a framework
    /// extractor), in the envelope: `message` is what the framework said.
    pub fn from_status(status: StatusCode, message: impl Into<String>) -> Self {
        let code = match status.as_u16() {
            400 => "invalid_request",
            404 => "not_found",
            405 => "method_not_allowed",
            413 => "body_too_large",
            415 => "unsupported_media_type",
            s if s >= 500 => "internal",
            _ => "error",
        };
        Self::new(status, code, message)
    }

    /// 500: the sandbox could not be built (a host problem, logged).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "sandbox_error", message)
    }
}

/// The request's own name for a spec field: the engine says `command`, a request gives
/// `cmd` (or `code`, which becomes the command's last argument).
pub fn request_field(field: &str, from_code: bool) -> String {
    match field.strip_prefix("command") {
        Some(_) if from_code => "code".into(),
        Some(rest) => format!("cmd{rest}"),
        None => field.to_owned(),
    }
}

/// A tier's error as the API's: the kind decides the status, never the message.
impl From<airlock_backend::Error> for ApiError {
    fn from(e: airlock_backend::Error) -> Self {
        use airlock_backend::Error;
        match e {
            Error::Invalid(e) => ApiError::invalid(request_field(&e.field, false), e.message),
            Error::NotFound(m) => ApiError::not_found(m),
            Error::DiskFull(e) => ApiError::disk_full(e.to_string()),
            Error::Gone(m) => ApiError::conflict(m),
            Error::Cancelled => ApiError::shutting_down(),
            e @ Error::Unavailable { .. } => {
                let Error::Unavailable { tier, .. } = &e else {
                    unreachable!()
                };
                ApiError::tier_unavailable(*tier, format!("{e} (see `airlock doctor`)"))
            }
            Error::OverCapacity(m) => ApiError::rate_limited("over_capacity", m, 1),
            e @ Error::Host { .. } => {
                tracing::error!(error = %e, "sandbox failure");
                ApiError::internal(e.to_string())
            }
        }
    }
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    code: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: Inner {
                code: self.code,
                message: &self.message,
                field: self.field.as_deref(),
            },
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of an over-size body may not have been read: start afresh.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}
