//! The warm pool: sandboxes built ahead of time (namespaces, mounts, cgroup and filters
//! ready, init waiting), so a request pays only for handing over its command. A pooled
//! sandbox serves one request and is then destroyed; the pool refills in the background.

use airlock_sandbox::{Sandbox, SandboxConfig};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};

use crate::metrics::Metrics;
use crate::spawner::Spawner;
use crate::state::stopped;

/// Sandboxes built at once at most. One build keeps a core busy for a few milliseconds;
/// back-to-back requests drain the pool faster than one builder refills it.
const BUILDERS: usize = 2;

/// The pool's sandboxes and the builds under way, under one lock.
#[derive(Debug, Default)]
struct Ready {
    /// Ready sandboxes, oldest first.
    sandboxes: VecDeque<Sandbox>,
    /// Sandboxes the refiller is building now.
    building: usize,
    /// Requests waiting for one of those.
    waiting: usize,
}

/// Pre-provisioned sandboxes with the server's default sandbox-wide settings.
#[derive(Debug)]
pub struct Pool {
    /// Ready sandboxes and builds under way.
    ready: Mutex<Ready>,
    /// How many to keep.
    target: usize,
    /// The settings they are built with.
    config: SandboxConfig,
    /// Wakes the refiller when one is taken.
    taken: Notify,
    /// Wakes the requests waiting for a sandbox when one is ready, or a build failed.
    added: Notify,
}

/// Counts a waiting request until dropped (also when its future is).
struct Waiting<'a>(&'a Pool);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Ok(mut ready) = self.0.ready.lock() {
            ready.waiting -= 1;
        }
    }
}

/// Counts a build under way until dropped, then wakes the waiting requests.
struct Building<'a>(&'a Pool);

impl<'a> Building<'a> {
    #[cfg(test)]
    fn start(pool: &'a Pool) -> Self {
        if let Ok(mut ready) = pool.ready.lock() {
            ready.building += 1;
        }
        Building(pool)
    }

    /// Counts one more build if the pool, with the builds under way, is short of its
    /// target.
    fn start_if_short(pool: &'a Pool) -> Option<Self> {
        let mut ready = pool.ready.lock().ok()?;
        if ready.sandboxes.len() + ready.building >= pool.target {
            return None;
        }
        ready.building += 1;
        Some(Building(pool))
    }
}

impl Drop for Building<'_> {
    fn drop(&mut self) {
        if let Ok(mut ready) = self.0.ready.lock() {
            ready.building -= 1;
        }
        self.0.added.notify_waiters();
    }
}

impl Pool {
    /// An empty pool that keeps `target` sandboxes built with `config`.
    pub fn new(target: usize, config: SandboxConfig) -> Pool {
        Pool {
            ready: Mutex::new(Ready::default()),
            target,
            config,
            taken: Notify::new(),
            added: Notify::new(),
        }
    }

    /// Takes a ready sandbox when `config` can be served by one: same disk size, rootfs
    /// and network (memory, CPU and pids limits are applied per exec). The refiller
    /// starts on its replacement at once.
    pub fn take(&self, config: &SandboxConfig) -> Option<Sandbox> {
        let sandbox = self.take_deferred(config);
        if sandbox.is_some() {
            self.taken();
        }
        sandbox
    }

    /// Like [`Pool::take`], but the replacement waits for a call to [`Pool::taken`].
    pub fn take_deferred(&self, config: &SandboxConfig) -> Option<Sandbox> {
        if !self.serves(config) {
            return None;
        }
        self.ready.lock().ok()?.sandboxes.pop_front()
    }

    /// Like [`Pool::take_deferred`], but when the pool is empty while the refiller is
    /// building a sandbox no other request waits for, waits for that one: it is ready
    /// sooner than one built from scratch for this request (which would also compete
    /// with it for the CPU). `None` means: build one.
    pub async fn take_or_wait(&self, config: &SandboxConfig) -> Option<Sandbox> {
        if !self.serves(config) {
            return None;
        }
        loop {
            // Registered before the check, so a sandbox added in between still wakes us.
            let added = self.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            let _waiting = {
                let mut ready = self.ready.lock().ok()?;
                if let Some(sandbox) = ready.sandboxes.pop_front() {
                    return Some(sandbox);
                }
                if ready.building <= ready.waiting {
                    return None;
                }
                ready.waiting += 1;
                Waiting(self)
            };
            added.await;
        }
    }

    /// Whether a pooled sandbox can serve `config`.
    fn serves(&self, config: &SandboxConfig) -> bool {
        self.target > 0
            && config.disk_bytes == self.config.disk_bytes
            && config.rootfs == self.config.rootfs
            && config.network == self.config.network
    }

    /// Lets the refiller replace what was taken. Called once the taking request's program
    /// has ended (or a few milliseconds after the take, for a long one), so that building
    /// the replacement (several milliseconds of CPU) does not compete with a short program
    /// it was taken for.
    pub fn taken(&self) {
        self.taken.notify_waiters();
    }

    /// Sandboxes ready now.
    pub fn ready(&self) -> usize {
        self.ready.lock().map_or(0, |r| r.sandboxes.len())
    }

    /// The configured size.
    pub fn target(&self) -> usize {
        self.target
    }

    /// Removes every ready sandbox (for shutdown).
    pub fn drain(&self) -> Vec<Sandbox> {
        self.ready
            .lock()
            .map(|mut r| r.sandboxes.drain(..).collect())
            .unwrap_or_default()
    }

    /// Keeps the pool full until `stop` turns true, with up to [`BUILDERS`] sandboxes
    /// under way at once.
    pub async fn refill(
        self: Arc<Self>,
        spawner: Arc<Spawner>,
        metrics: Arc<Metrics>,
        stop: watch::Receiver<bool>,
    ) {
        if self.target == 0 {
            return;
        }
        let builders = (0..BUILDERS)
            .map(|_| Arc::clone(&self).builder(Arc::clone(&spawner), Arc::clone(&metrics), stop.clone()));
        futures_util::future::join_all(builders).await;
    }

    /// One builder: builds while the pool (with what is under way) is short.
    async fn builder(
        self: Arc<Self>,
        spawner: Arc<Spawner>,
        metrics: Arc<Metrics>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            // Registered before the check, so a take in between still wakes us.
            let taken = self.taken.notified();
            tokio::pin!(taken);
            taken.as_mut().enable();
            let Some(building) = Building::start_if_short(&self) else {
                metrics.pool_ready.set(self.ready() as i64);
                tokio::select! {
                    () = taken => {}
                    () = stopped(&mut stop) => return,
                }
                continue;
            };
            // While a sandbox is ready for the next request, this one is built in the
            // background's CPU share; when none is, a request is likely to wait for this
            // one, so it is built at an ordinary share.
            let ahead = self.ready() > 0;
            let (created, took) = tokio::select! {
                r = spawner.create(self.config.clone(), ahead) => r,
                () = stopped(&mut stop) => return,
            };
            match created {
                Ok(sandbox) => {
                    metrics.provisioned("warm", took);
                    if let Ok(mut ready) = self.ready.lock() {
                        ready.sandboxes.push_back(sandbox);
                    }
                    drop(building);
                    metrics.pool_ready.set(self.ready() as i64);
                }
                Err(e) => {
                    drop(building);
                    tracing::error!(error = %e, "warm pool: building a sandbox failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_spec::Spec;

    fn config() -> SandboxConfig {
        SandboxConfig::of(&Spec::new(vec!["true".into()]))
    }

    #[tokio::test]
    async fn an_empty_pool_with_nothing_under_way_says_build_one() {
        let pool = Pool::new(2, config());
        assert!(pool.take_or_wait(&config()).await.is_none());
        assert!(Pool::new(0, config()).take_or_wait(&config()).await.is_none());
    }

    #[tokio::test]
    async fn a_request_waits_for_a_build_under_way_and_only_one_does() {
        let pool = Arc::new(Pool::new(2, config()));
        let building = Building::start(&pool);
        let waiter = tokio::spawn({
            let pool = Arc::clone(&pool);
            async move { pool.take_or_wait(&config()).await.is_none() }
        });
        // Until the waiter counts itself, a second request could take its place.
        while pool.ready.lock().map(|r| r.waiting).unwrap() == 0 {
            tokio::task::yield_now().await;
        }
        // The one build under way is spoken for: the next request builds its own.
        assert!(pool.take_or_wait(&config()).await.is_none());
        assert!(!waiter.is_finished());
        // The build failed (nothing was added): the waiter is told to build one.
        drop(building);
        assert!(waiter.await.unwrap());
        let ready = pool.ready.lock().unwrap();
        assert_eq!((ready.building, ready.waiting), (0, 0));
    }
}
