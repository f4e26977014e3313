//! airlock's execution service: an HTTP API over the sandbox engine, with a warm pool of
//! pre-provisioned sandboxes, sessions, admission control, API keys and metrics.
//!
//! The entry point takes a bound listener and a shutdown future, so tests (and the CLI)
//! start it on `127.0.0.1:0` and stop it cleanly:
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = std::sync::Arc::new(airlock_sandbox::Engine::new()?);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let config = airlock_server::ServerConfig::default();
//! airlock_server::run(listener, engine, config, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod admission;
pub mod api;
mod auth;
mod body;
pub mod config;
mod error;
mod metrics;
mod pool;
mod routes;
mod runner;
mod spawner;
mod state;
mod stream;

use airlock_sandbox::{Engine, SandboxConfig};
use airlock_spec::Spec;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use config::ServerConfig;
pub use error::ApiError;

use state::{AppState, purge_session, stopped};

/// How often expired sessions are looked for.
const REAP_EVERY: Duration = Duration::from_millis(250);

/// Serves the API on `listener` until `shutdown` resolves; then stops accepting, lets
/// running execs finish within the grace period, kills the rest, and purges every
/// sandbox and session before returning.
pub async fn run(
    listener: tokio::net::TcpListener,
    engine: Arc<Engine>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    config.check(addr).map_err(std::io::Error::other)?;
    let mut pool_spec = Spec::new(vec!["true".into()]);
    pool_spec.limits = config.defaults.clone();
    let state = AppState::new(engine, config, SandboxConfig::of(&pool_spec));

    let refill = tokio::spawn(Arc::clone(&state.pool).refill(
        Arc::clone(&state.spawner),
        Arc::clone(&state.metrics),
        state.stopping.subscribe(),
    ));
    let reaper = tokio::spawn(reap_sessions(Arc::clone(&state)));

    let app = routes::router(Arc::clone(&state));
    let grace = state.config.grace;
    let st = Arc::clone(&state);
    let signal = async move {
        shutdown.await;
        tracing::info!("shutting down: no new requests; running execs get {grace:?}");
        st.stopping.send_replace(true);
        // Past the grace period, running execs are killed (their requests end with 503).
        let st2 = Arc::clone(&st);
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            st2.cancel_all();
        });
    };
    tracing::info!(%addr, pool = state.pool.target(), max_sandboxes = state.config.max_sandboxes, "listening");
    axum::serve(listener, app).with_graceful_shutdown(signal).await?;

    // Purge everything.
    state.stopping.send_replace(true);
    state.cancel_all();
    let _ = refill.await;
    reaper.abort();
    let sessions: Vec<_> = state
        .sessions
        .lock()
        .map(|mut m| m.drain().map(|(_, s)| s).collect())
        .unwrap_or_default();
    for s in sessions {
        purge_session(s).await;
    }
    let pooled = state.pool.drain();
    let spawner = Arc::clone(&state.spawner);
    let _ = tokio::task::spawn_blocking(move || {
        drop(pooled);
        spawner.stop();
    })
    .await;
    // A sandbox a spawner finished after the pool stopped taking them was purged on its
    // thread; one that still reached the pool goes now.
    let late = state.pool.drain();
    let _ = tokio::task::spawn_blocking(move || drop(late)).await;
    tracing::info!("stopped; every sandbox purged");
    Ok(())
}

/// Purges sessions whose TTL has passed.
async fn reap_sessions(state: Arc<AppState>) {
    let mut stop = state.stopping.subscribe();
    loop {
        tokio::select! {
            () = tokio::time::sleep(REAP_EVERY) => {}
            () = stopped(&mut stop) => return,
        }
        let now = std::time::Instant::now();
        let expired: Vec<String> = state
            .sessions
            .lock()
            .map(|m| {
                m.values()
                    .filter(|s| s.deadline <= now)
                    .map(|s| s.id.clone())
                    .collect()
            })
            .unwrap_or_default();
        for id in expired {
            if let Some(s) = state.remove_session(&id, true) {
                tracing::info!(id = %id, "session expired");
                let st = Arc::clone(&state);
                tokio::spawn(async move {
                    purge_session(s).await;
                    st.metrics.sandboxes_active.set(st.active() as i64);
                });
            }
        }
    }
}
