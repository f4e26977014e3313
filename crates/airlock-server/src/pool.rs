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

/// Pre-provisioned sandboxes with the server's default sandbox-wide settings.
#[derive(Debug)]
pub struct Pool {
    /// Ready sandboxes, oldest first.
    ready: Mutex<VecDeque<Sandbox>>,
    /// How many to keep.
    target: usize,
    /// The settings they are built with.
    config: SandboxConfig,
    /// Wakes the refiller when one is taken.
    taken: Notify,
}

impl Pool {
    /// An empty pool that keeps `target` sandboxes built with `config`.
    pub fn new(target: usize, config: SandboxConfig) -> Pool {
        Pool {
            ready: Mutex::new(VecDeque::new()),
            target,
            config,
            taken: Notify::new(),
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
        if self.target == 0
            || config.disk_bytes != self.config.disk_bytes
            || config.rootfs != self.config.rootfs
            || config.network != self.config.network
        {
            return None;
        }
        self.ready.lock().ok()?.pop_front()
    }

    /// Lets the refiller replace what was taken. Called once the taking request's program
    /// has ended, so that building the replacement (several milliseconds of CPU) does not
    /// compete with the program it was taken for.
    pub fn taken(&self) {
        self.taken.notify_one();
    }

    /// Sandboxes ready now.
    pub fn ready(&self) -> usize {
        self.ready.lock().map_or(0, |r| r.len())
    }

    /// The configured size.
    pub fn target(&self) -> usize {
        self.target
    }

    /// Removes every ready sandbox (for shutdown).
    pub fn drain(&self) -> Vec<Sandbox> {
        self.ready
            .lock()
            .map(|mut r| r.drain(..).collect())
            .unwrap_or_default()
    }

    /// Keeps the pool full until `stop` turns true.
    pub async fn refill(
        self: Arc<Self>,
        spawner: Arc<Spawner>,
        metrics: Arc<Metrics>,
        mut stop: watch::Receiver<bool>,
    ) {
        if self.target == 0 {
            return;
        }
        loop {
            while self.ready() < self.target {
                let (created, took) = tokio::select! {
                    r = spawner.create(self.config.clone()) => r,
                    () = stopped(&mut stop) => return,
                };
                match created {
                    Ok(sandbox) => {
                        metrics.provisioned("warm", took);
                        if let Ok(mut ready) = self.ready.lock() {
                            ready.push_back(sandbox);
                        }
                        metrics.pool_ready.set(self.ready() as i64);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "warm pool: building a sandbox failed");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
            metrics.pool_ready.set(self.ready() as i64);
            tokio::select! {
                () = self.taken.notified() => {}
                () = stopped(&mut stop) => return,
            }
            metrics.pool_ready.set(self.ready() as i64);
        }
    }
}
