//! airlock's execution service: an HTTP API over airlock's isolation tiers, with a warm
//! pool per tier, sessions, admission control, API keys and metrics, and the same tools
//! over MCP ([`mcp`]: streamable HTTP at `/mcp`, or stdio).
//!
//! The service knows no tier: it is given one [`airlock_backend::Backend`] per tier it
//! serves, and picks one per request by its `isolation`. The entry point takes them, a
//! bound listener and a shutdown future, so tests (and the CLI) start it on
//! `127.0.0.1:0` and stop it cleanly:
//!
//! ```no_run
//! # async fn f(tiers: Vec<std::sync::Arc<dyn airlock_backend::Backend>>) -> Result<(), Box<dyn std::error::Error>> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let config = airlock_server::ServerConfig::default();
//! let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
//! airlock_server::run(listener, tiers, config, |addr| println!("serving {addr}"), shutdown).await?;
//! # Ok(()) }
//! ```
//!
//! Without a listener, [`Service`] holds the same state and background tasks; `airlock mcp`
//! serves it on stdio:
//!
//! ```no_run
//! # async fn f(tiers: Vec<std::sync::Arc<dyn airlock_backend::Backend>>) -> Result<(), Box<dyn std::error::Error>> {
//! let service = airlock_server::Service::start(tiers, airlock_server::ServerConfig::default())?;
//! airlock_server::mcp::serve_stdio(&service, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! service.shutdown().await;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod admission;
pub mod api;
mod auth;
mod body;
pub mod config;
mod error;
mod fdio;
pub mod hop;
pub mod images;
pub mod mcp;
mod metrics;
pub mod node;
mod pool;
mod purge;
mod routes;
mod service;
mod spawner;
mod state;
mod stop;
mod stream;
mod tier;

use airlock_backend::Backend;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use config::ServerConfig;
pub use error::ApiError;

use state::{AppState, purge_session};
use stop::stopped;

/// How often a draining node looks whether its last sandbox is gone.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// How often expired sessions are looked for.
const REAP_EVERY: Duration = Duration::from_millis(250);

/// The service without its HTTP listener: the state every interface shares (each tier's
/// warm pool and spawner threads, sessions, admission, metrics) and the background tasks
/// that keep it (pool refills, session expiry). [`run`] serves it over HTTP; `airlock mcp`
/// serves it over MCP on stdio. Start it inside a tokio runtime.
#[derive(Debug)]
pub struct Service {
    /// Shared with every request handler and MCP tool.
    state: Arc<AppState>,
    /// Keep the tiers' pools full until shutdown; awaited by [`Service::shutdown`].
    refills: Vec<tokio::task::JoinHandle<()>>,
    /// Purges expired sessions; aborted by [`Service::shutdown`].
    reaper: tokio::task::JoinHandle<()>,
}

impl Service {
    /// Builds the state around `tiers` (their spawner threads start here) and starts the
    /// pool refills and the session reaper. Fails on settings that could never work (see
    /// [`ServerConfig::validate`]).
    pub fn start(tiers: Vec<Arc<dyn Backend>>, config: ServerConfig) -> std::io::Result<Service> {
        config.validate().map_err(std::io::Error::other)?;
        let images = match &config.image_store {
            Some(dir) => {
                let options = airlock_image::StoreOptions {
                    max_bytes: config.image_store_max,
                    ..Default::default()
                };
                let store = airlock_image::Store::open(dir, options)
                    .map_err(|e| std::io::Error::other(format!("--image-store {}: {e}", dir.display())))?;
                images::reachable(store.root())
                    .map_err(|e| std::io::Error::other(format!("--image-store {}: {e}", dir.display())))?;
                Some(Arc::new(store))
            }
            None => None,
        };
        // Each image pool's image, resolved now: a pool of an image the store does not
        // hold (or a tier that cannot run images) stops the start with the reason.
        let mut image_pools = Vec::new();
        for pool in &config.image_pools {
            let flag = match pool.isolation {
                airlock_spec::Isolation::Namespaces => "--pool",
                airlock_spec::Isolation::Gvisor => "--gvisor-pool",
                airlock_spec::Isolation::Microvm => "--vm-pool",
            };
            let what = format!("{flag} {}={}", pool.image, pool.size);
            let Some(backend) = tiers.iter().find(|b| b.isolation() == pool.isolation) else {
                return Err(std::io::Error::other(format!(
                    "{what}: this service has no {} tier",
                    pool.isolation.as_str()
                )));
            };
            if !backend.runs_images() {
                return Err(std::io::Error::other(format!(
                    "{what}: isolation {} does not run images yet",
                    pool.isolation.as_str()
                )));
            }
            let resolved = images::resolve(images.as_deref(), &pool.image)
                .map_err(|e| std::io::Error::other(format!("{what}: {e}")))?;
            image_pools.push((pool.isolation, pool.image.clone(), pool.size, resolved.root));
        }
        let state = AppState::new(tiers, images, image_pools, config);
        let refills = state
            .tiers
            .iter()
            .flat_map(|t| {
                t.pools()
                    .filter(|p| p.target() > 0)
                    .map(move |p| (t.isolation(), Arc::clone(p)))
            })
            .map(|(isolation, pool)| {
                let st = Arc::clone(&state);
                tokio::spawn(async move {
                    let Ok(tier) = st.tiers.get(isolation) else { return };
                    // A pool starts by preparing its tier (a micro-VM's image may be built);
                    // a tier this host cannot run has nothing to refill (requests get why).
                    if tier.prepare().await.is_err() {
                        return;
                    }
                    pool.refill(
                        Arc::clone(&tier.spawner),
                        Arc::clone(&st.metrics),
                        st.stopping.subscribe(),
                    )
                    .await;
                })
            })
            .collect();
        let reaper = tokio::spawn(reap_sessions(Arc::clone(&state)));
        Ok(Service {
            state,
            refills,
            reaper,
        })
    }

    /// The shared state, for the HTTP routes and the MCP tools.
    pub(crate) fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// Stops the service: refuses new work, kills whatever still runs, and purges every
    /// sandbox and session before returning.
    pub async fn shutdown(self) {
        let Service {
            state,
            refills,
            reaper,
        } = self;
        state.stopping.send_replace(true);
        state.closing.send_replace(true);
        state.cancel_all();
        for refill in refills {
            let _ = refill.await;
        }
        reaper.abort();
        let sessions: Vec<_> = state
            .sessions
            .lock()
            .map(|mut m| m.drain().map(|(_, s)| s).collect())
            .unwrap_or_default();
        for s in sessions {
            purge_session(s).await;
        }
        for tier in state.tiers.iter() {
            let pooled: Vec<_> = tier.pools().flat_map(|p| p.drain()).collect();
            let spawner = Arc::clone(&tier.spawner);
            let _ = tokio::task::spawn_blocking(move || {
                drop(pooled);
                spawner.stop();
            })
            .await;
            // A sandbox a spawner finished after the pool stopped taking them was purged
            // on its thread; one that still reached the pool goes now.
            let late: Vec<_> = tier.pools().flat_map(|p| p.drain()).collect();
            let backend = Arc::clone(&tier.backend);
            let _ = tokio::task::spawn_blocking(move || {
                drop(late);
                backend.stop_service();
            })
            .await;
        }
        tracing::info!("stopped; every sandbox purged");
    }
}

/// Serves the API on `listener` until `shutdown` resolves (calling `started` once the
/// service is up and about to accept); then stops accepting, lets
/// running execs finish within the grace period, kills the rest, and purges every
/// sandbox and session before returning.
pub async fn run(
    listener: tokio::net::TcpListener,
    tiers: Vec<Arc<dyn Backend>>,
    config: ServerConfig,
    started: impl FnOnce(std::net::SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    config.check(addr).map_err(std::io::Error::other)?;
    let service = Service::start(tiers, config)?;
    started(addr);
    let state = Arc::clone(service.state());

    let app = routes::router(Arc::clone(&state), addr);
    let grace = state.config.grace;
    let st = Arc::clone(&state);
    let signal = async move {
        shutdown.await;
        let deadline = tokio::time::Instant::now() + grace;
        st.stopping.send_replace(true);
        // Past the grace period, running execs are killed (their requests end with 503).
        let st2 = Arc::clone(&st);
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            st2.cancel_all();
        });
        // A fleet member drains: a router sends new work elsewhere (readyz says 503, new
        // sessions and one-shot execs get 503 `shutting_down`), while the sessions it holds
        // keep answering until none is left or the grace period ends.
        if st.config.node.is_some() {
            tracing::info!("draining: no new sessions or one-shot execs; the live ones get {grace:?}");
            while st.active() > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(DRAIN_POLL).await;
            }
        }
        tracing::info!("shutting down: no new requests; running execs get what is left of {grace:?}");
        st.closing.send_replace(true);
    };
    let tiers: Vec<_> = state
        .tiers
        .iter()
        .map(|t| {
            let images: String = t
                .pools()
                .filter_map(|p| Some(format!(" {}={}", p.image()?, p.target())))
                .collect();
            format!("{}(pool {}{images})", t.isolation().as_str(), t.pool().target())
        })
        .collect();
    tracing::info!(%addr, tiers = tiers.join(" "), max_sandboxes = state.config.max_sandboxes, "listening");
    // A response's head and body can go out as two writes (a streamed body, a forwarded
    // port's answer): without TCP_NODELAY the second waits for the client's delayed ACK,
    // 40 ms here (bench/interactive.py's port GETs, p90).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp: &mut tokio::net::TcpStream| {
        let _ = tcp.set_nodelay(true);
    });
    let served = axum::serve(listener, app).with_graceful_shutdown(signal).await;
    // Purge everything, also when serving failed.
    drop(state);
    service.shutdown().await;
    served
}

/// Purges sessions whose TTL has passed.
async fn reap_sessions(state: Arc<AppState>) {
    // Sessions still expire while a fleet member drains.
    let mut stop = state.closing.subscribe();
    loop {
        tokio::select! {
            () = tokio::time::sleep(REAP_EVERY) => {}
            () = stopped(&mut stop) => return,
        }
        service::snapshots::pause_idle(&state);
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
