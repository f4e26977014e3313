//! What a one-shot exec leaves to do once its answer is out: destroy the sandbox (or VM),
//! free its admission, let the pool replace it. That is milliseconds of CPU (namespaces,
//! mounts and cgroups torn down, another sandbox built); done while the answer is being
//! written it delays the answer on a small host. So it is held by the response body and
//! runs on a blocking thread once the body has been sent (or the client went away).

use axum::body::{Body, HttpBody};
use axum::response::Response;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The work, run on a blocking thread when this is dropped.
pub struct Purge(Option<Box<dyn FnOnce() + Send>>);

impl Purge {
    /// Runs `work` when dropped.
    pub fn new(work: impl FnOnce() + Send + 'static) -> Purge {
        Purge(Some(Box::new(work)))
    }
}

impl Drop for Purge {
    fn drop(&mut self) {
        let Some(work) = self.0.take() else { return };
        match tokio::runtime::Handle::try_current() {
            // The sandbox's tier lowers what its purge costs others (see
            // `Sandbox::enter_background`).
            Ok(runtime) => drop(runtime.spawn_blocking(work)),
            // Outside the runtime (its shutdown): here and now.
            Err(_) => work(),
        }
    }
}

impl std::fmt::Debug for Purge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Purge")
    }
}

/// `response`, whose body runs `purge` once it has been sent or dropped.
pub fn after(response: Response, purge: Purge) -> Response {
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(Held {
            body,
            purge: Some(purge),
        }),
    )
}

/// A body that holds a [`Purge`] until its last frame has been taken.
struct Held {
    body: Body,
    purge: Option<Purge>,
}

impl HttpBody for Held {
    type Data = <Body as HttpBody>::Data;
    type Error = <Body as HttpBody>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        if this.body.is_end_stream() {
            // The answer is in the connection's buffer: start now rather than when the
            // connection gets round to dropping the body.
            this.purge = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn the_purge_runs_once_the_body_is_read_and_the_length_is_kept() {
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        let response = after(
            Response::new(Body::from("{\"ok\":true}")),
            Purge::new(move || flag.store(true, Ordering::SeqCst)),
        );
        let body = response.into_body();
        assert_eq!(body.size_hint().exact(), Some(11));
        assert!(!done.load(Ordering::SeqCst));
        let bytes = axum::body::to_bytes(body, 1024).await.unwrap();
        assert_eq!(&bytes[..], b"{\"ok\":true}");
        // On a blocking thread: wait for it.
        for _ in 0..1000 {
            if done.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        panic!("the purge did not run");
    }

    #[test]
    fn outside_a_runtime_the_purge_runs_at_once() {
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        drop(Purge::new(move || flag.store(true, Ordering::SeqCst)));
        assert!(done.load(Ordering::SeqCst));
    }
}
