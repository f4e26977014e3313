//! Server-Sent Events for execs: `stdout` and `stderr` events as output arrives (data:
//! `{"data": "..."}`, UTF-8 with invalid bytes replaced), then one `result` event with the
//! ExecResult, or an `error` event with the API error.

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use serde_json::json;
use std::convert::Infallible;
use std::future::Future;
use tokio::sync::{mpsc, oneshot};

use crate::api::ExecResponse;
use crate::error::ApiError;
use crate::service::runner::StreamEvent;

/// Output chunks buffered between the exec and a slow client.
const BUFFER: usize = 64;

/// Streams the exec that `run` performs.
pub fn respond<F, Fut>(run: F) -> Response
where
    F: FnOnce(mpsc::Sender<StreamEvent>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<ExecResponse, ApiError>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(BUFFER);
    let (done_tx, done_rx) = oneshot::channel();
    tokio::spawn(async move {
        let _ = done_tx.send(run(tx).await);
    });
    Sse::new(events(rx, done_rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn events(
    rx: mpsc::Receiver<StreamEvent>,
    done: oneshot::Receiver<Result<ExecResponse, ApiError>>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold((Some(rx), Some(done)), |(mut rx, mut done)| async move {
        if let Some(r) = rx.as_mut() {
            match r.recv().await {
                Some(ev) => {
                    let (name, data) = match ev {
                        StreamEvent::Stdout(d) => ("stdout", d),
                        StreamEvent::Stderr(d) => ("stderr", d),
                    };
                    let text = String::from_utf8_lossy(&data);
                    let event = Event::default()
                        .event(name)
                        .data(json!({ "data": text }).to_string());
                    return Some((Ok(event), (rx, done)));
                }
                None => rx = None,
            }
        }
        let d = done.take()?;
        let event = match d.await {
            Ok(Ok(resp)) => Event::default()
                .event("result")
                .data(serde_json::to_string(&resp).unwrap_or_default()),
            Ok(Err(e)) => Event::default()
                .event("error")
                .data(json!({"error": {"code": e.code, "message": e.message, "field": e.field}}).to_string()),
            Err(_) => Event::default()
                .event("error")
                .data(r#"{"error":{"code":"internal","message":"exec task lost"}}"#),
        };
        Some((Ok(event), (rx, None)))
    })
}
