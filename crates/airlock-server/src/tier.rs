//! The tiers a service runs: for each isolation the binary gave it a backend for, the
//! backend, the long-lived threads that build its sandboxes, and its warm pool. Requests
//! get a sandbox from here and never look at which tier it is.

use airlock_backend::{Backend, Purpose, Sandbox, Shape};
use airlock_spec::Isolation;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::spawner::Spawner;

/// One tier of the service.
#[derive(Debug)]
pub struct Tier {
    /// What builds its sandboxes.
    pub backend: Arc<dyn Backend>,
    /// Its long-lived build threads.
    pub spawner: Arc<Spawner>,
    /// Its warm pools: the default shape's first (target 0: none), then one per image
    /// the service keeps warm (`--pool IMAGE=N`).
    pools: Vec<Arc<Pool>>,
    /// [`Backend::prepare`]'s verdict, once: a tier this host cannot run says why to
    /// every request rather than retrying per request.
    prepared: OnceCell<Result<(), String>>,
}

/// A sandbox a request got, and how.
#[derive(Debug)]
pub struct Got {
    /// The sandbox.
    pub sandbox: Box<dyn Sandbox>,
    /// How long the request waited for it (zero when a pooled one was ready).
    pub took: Duration,
    /// The pool it came from (`None`: built for the request).
    pub pool: Option<Arc<Pool>>,
}

impl Tier {
    /// A tier around `backend` whose pool keeps `pool_target` sandboxes of `pool_shape`,
    /// and whose image pools keep theirs (`(image name, target, shape)`). Its spawner
    /// threads start here, and so does what the tier keeps for a long-running service
    /// ([`Backend::start_service`]).
    pub fn new(
        backend: Arc<dyn Backend>,
        pool_target: usize,
        pool_shape: Shape,
        image_pools: Vec<(String, usize, Shape)>,
    ) -> Tier {
        if let Err(e) = backend.start_service() {
            tracing::warn!(error = %e, isolation = backend.isolation().as_str(), "a tier's service helpers did not start");
        }
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        // Pool builds plus requests that find the pool empty, within reason.
        let threads = (backend.pool_builders() + cores).clamp(2, 8);
        let mut pools = vec![Arc::new(Pool::new(Arc::clone(&backend), pool_target, pool_shape))];
        pools.extend(image_pools.into_iter().map(|(image, target, shape)| {
            Arc::new(Pool::new(Arc::clone(&backend), target, shape).for_image(image))
        }));
        Tier {
            spawner: Arc::new(Spawner::new(Arc::clone(&backend), threads)),
            pools,
            backend,
            prepared: OnceCell::new(),
        }
    }

    /// The default shape's pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pools[0]
    }

    /// Every pool: the default shape's, then the images'.
    pub fn pools(&self) -> impl Iterator<Item = &Arc<Pool>> {
        self.pools.iter()
    }

    /// Which tier it is.
    pub fn isolation(&self) -> Isolation {
        self.backend.isolation()
    }

    /// Prepares the tier on first call (on a blocking thread: a micro-VM's guest image
    /// may be built); later calls return the same verdict.
    pub async fn prepare(&self) -> Result<(), ApiError> {
        let backend = Arc::clone(&self.backend);
        let verdict = self
            .prepared
            .get_or_init(|| async move {
                let tier = backend.isolation();
                match tokio::task::spawn_blocking(move || backend.prepare()).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, isolation = tier.as_str(), "tier unavailable");
                        Err(match e {
                            airlock_backend::Error::Unavailable { reason, .. } => reason,
                            e => e.to_string(),
                        })
                    }
                    Err(e) => Err(format!("preparing: {e}")),
                }
            })
            .await;
        verdict.clone().map_err(|reason| {
            ApiError::from(airlock_backend::Error::Unavailable {
                tier: self.isolation(),
                reason,
            })
        })
    }

    /// A sandbox of `shape` for one program: a pooled one (also one the refiller is
    /// building now, when no other request waits for it), or one built for it.
    pub async fn for_one_shot(&self, shape: &Shape, metrics: &Metrics) -> Result<Got, ApiError> {
        let t0 = Instant::now();
        // At most one pool serves a shape (pools differ by image, or are the default).
        for pool in &self.pools {
            if let Some(sandbox) = pool.take_or_wait(shape).await {
                pool.report(metrics);
                return Ok(Got {
                    sandbox,
                    took: t0.elapsed(),
                    pool: Some(Arc::clone(pool)),
                });
            }
        }
        self.build(shape, Purpose::OneShot, metrics).await
    }

    /// A sandbox of `shape` for a session: a pooled one, or one built for it; ready for
    /// its files and execs ([`Sandbox::open_session`]).
    pub async fn for_session(&self, shape: &Shape, metrics: &Metrics) -> Result<Box<dyn Sandbox>, ApiError> {
        let pooled = self.pools.iter().find_map(|pool| {
            let sb = pool.take(shape)?;
            pool.report(metrics);
            Some(sb)
        });
        let mut sandbox = match pooled {
            Some(sb) => sb,
            None => self.build(shape, Purpose::Session, metrics).await?.sandbox,
        };
        let shape = shape.clone();
        let (opened, sandbox) = tokio::task::spawn_blocking(move || (sandbox.open_session(&shape), sandbox))
            .await
            .map_err(|e| ApiError::internal(format!("opening the session: {e}")))?;
        opened?;
        Ok(sandbox)
    }

    async fn build(&self, shape: &Shape, purpose: Purpose, metrics: &Metrics) -> Result<Got, ApiError> {
        self.prepare().await?;
        let (created, took) = self.spawner.create(shape.clone(), purpose).await;
        metrics.provisioned(self.isolation(), "cold", took);
        Ok(Got {
            sandbox: created?,
            took,
            pool: None,
        })
    }
}

/// Every tier of the service.
#[derive(Debug)]
pub struct Tiers(Vec<Tier>);

impl Tiers {
    /// The service's tiers.
    pub fn new(tiers: Vec<Tier>) -> Tiers {
        Tiers(tiers)
    }

    /// The tier for `isolation`: 503 `<tier>_unavailable` when this service has none.
    pub fn get(&self, isolation: Isolation) -> Result<&Tier, ApiError> {
        self.0.iter().find(|t| t.isolation() == isolation).ok_or_else(|| {
            ApiError::from(airlock_backend::Error::Unavailable {
                tier: isolation,
                reason: "this server was started without it".into(),
            })
        })
    }

    /// Each tier.
    pub fn iter(&self) -> impl Iterator<Item = &Tier> {
        self.0.iter()
    }
}
