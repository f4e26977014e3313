//! A tier's warm pool: sandboxes built ahead of time (a namespace sandbox with its init
//! waiting; a micro-VM cloned and warmed up), so a request pays only for handing over its
//! command. A pooled sandbox serves one request (or becomes a session) and is then
//! destroyed; the pool refills in the background, with as many builds at once as the
//! tier asks for ([`Backend::pool_builders`]).

use airlock_backend::{Backend, Purpose, Sandbox, Shape};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};

use crate::metrics::Metrics;
use crate::spawner::Spawner;
use crate::stop::stopped;

/// The pool's sandboxes and the builds under way, under one lock.
#[derive(Debug, Default)]
struct Ready {
    /// Ready sandboxes, oldest first.
    sandboxes: VecDeque<Box<dyn Sandbox>>,
    /// Sandboxes the refiller is building now.
    building: usize,
    /// Requests waiting for one of those.
    waiting: usize,
}

impl Ready {
    /// The oldest ready sandbox that is still alive. One that died while it waited (its
    /// init or VM killed from outside) is not handed to a request that would only get
    /// "gone" from it: it goes to `dead`, for the caller to purge once the lock is
    /// released.
    fn pop_alive(&mut self, dead: &mut Vec<Box<dyn Sandbox>>) -> Option<Box<dyn Sandbox>> {
        while let Some(mut sandbox) = self.sandboxes.pop_front() {
            if sandbox.is_alive() {
                return Some(sandbox);
            }
            tracing::warn!(
                id = sandbox.id(),
                "warm pool: a ready sandbox died while it waited; purged"
            );
            dead.push(sandbox);
        }
        None
    }
}

/// Pre-provisioned sandboxes of one tier, of one shape: the server's default, or an
/// image's (`--pool IMAGE=N`).
#[derive(Debug)]
pub struct Pool {
    /// The image its sandboxes run, as the flag named it (`None`: the default pool).
    image: Option<String>,
    /// The tier: it builds them, and says which requests they serve.
    backend: Arc<dyn Backend>,
    /// Ready sandboxes and builds under way.
    ready: Mutex<Ready>,
    /// How many to keep.
    target: usize,
    /// The shape they are built with.
    shape: Shape,
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
    /// An empty pool that keeps `target` sandboxes of `backend` built with `shape`.
    pub fn new(backend: Arc<dyn Backend>, target: usize, shape: Shape) -> Pool {
        Pool {
            image: None,
            backend,
            ready: Mutex::new(Ready::default()),
            target,
            shape,
            taken: Notify::new(),
            added: Notify::new(),
        }
    }

    /// The same pool, of sandboxes of `image` (its name, for metrics and logs).
    pub fn for_image(mut self, image: String) -> Pool {
        self.image = Some(image);
        self
    }

    /// The image its sandboxes run (`None`: the default pool).
    pub fn image(&self) -> Option<&str> {
        self.image.as_deref()
    }

    /// Takes a ready sandbox when one can serve `shape` ([`Backend::serves`]: memory,
    /// CPU and pids limits are applied per exec). The refiller starts on its replacement
    /// at once.
    pub fn take(&self, shape: &Shape) -> Option<Box<dyn Sandbox>> {
        let sandbox = self.take_deferred(shape);
        if sandbox.is_some() {
            self.taken();
        }
        sandbox
    }

    /// Like [`Pool::take`], but the replacement waits for a call to [`Pool::taken`].
    pub fn take_deferred(&self, shape: &Shape) -> Option<Box<dyn Sandbox>> {
        if !self.serves(shape) {
            return None;
        }
        let mut dead = Vec::new();
        let sandbox = self.ready.lock().ok()?.pop_alive(&mut dead);
        self.purge(dead);
        sandbox
    }

    /// Like [`Pool::take_deferred`], but when the pool is empty while the refiller is
    /// building a sandbox no other request waits for, waits for that one: it is ready
    /// sooner than one built from scratch for this request (which would also compete
    /// with it for the CPU). `None` means: build one.
    pub async fn take_or_wait(&self, shape: &Shape) -> Option<Box<dyn Sandbox>> {
        if !self.serves(shape) {
            return None;
        }
        loop {
            // Registered before the check, so a sandbox added in between still wakes us.
            let added = self.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            let _waiting = {
                let mut ready = self.ready.lock().ok()?;
                let mut dead = Vec::new();
                let alive = ready.pop_alive(&mut dead);
                if alive.is_some() || !dead.is_empty() {
                    drop(ready);
                    self.purge(dead);
                    match alive {
                        Some(sandbox) => return Some(sandbox),
                        // Looked at again from the start: the lock was released.
                        None => continue,
                    }
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

    /// Whether a pooled sandbox can serve `shape`.
    fn serves(&self, shape: &Shape) -> bool {
        self.target > 0 && self.backend.serves(&self.shape, shape)
    }

    /// Purges sandboxes that died while they waited, off the async threads (on this
    /// thread outside a runtime), and has the refiller replace them at once.
    fn purge(&self, dead: Vec<Box<dyn Sandbox>>) {
        if dead.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || drop(dead))),
            Err(_) => drop(dead),
        }
        self.taken();
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

    /// Sets the pool's gauge to what is ready now.
    pub fn report(&self, metrics: &Metrics) {
        match &self.image {
            None => metrics.pool_ready(self.backend.isolation(), self.ready()),
            Some(image) => metrics.image_pool_ready(self.backend.isolation(), image, self.ready()),
        }
    }

    /// Removes every ready sandbox (for shutdown).
    pub fn drain(&self) -> Vec<Box<dyn Sandbox>> {
        self.ready
            .lock()
            .map(|mut r| r.sandboxes.drain(..).collect())
            .unwrap_or_default()
    }

    /// Keeps the pool full until `stop` turns true, with up to the tier's
    /// [`Backend::pool_builders`] sandboxes under way at once.
    pub async fn refill(
        self: Arc<Self>,
        spawner: Arc<Spawner>,
        metrics: Arc<Metrics>,
        stop: watch::Receiver<bool>,
    ) {
        if self.target == 0 {
            return;
        }
        let builders = (0..self.backend.pool_builders().max(1))
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
                self.report(&metrics);
                tokio::select! {
                    () = taken => {}
                    () = stopped(&mut stop) => return,
                }
                continue;
            };
            // While a sandbox is ready for the next request, this one is built in the
            // background's CPU share; when none is, a request is likely to wait for this
            // one, so it is built at an ordinary share.
            let behind = self.ready() > 0;
            let (created, took) = tokio::select! {
                r = spawner.create(self.shape.clone(), Purpose::Pool { behind }) => r,
                () = stopped(&mut stop) => return,
            };
            match created {
                Ok(sandbox) => {
                    metrics.provisioned(self.backend.isolation(), "warm", took);
                    if let Ok(mut ready) = self.ready.lock() {
                        ready.sandboxes.push_back(sandbox);
                    }
                    drop(building);
                    self.report(&metrics);
                }
                Err(e) => {
                    drop(building);
                    tracing::error!(error = %e, isolation = self.backend.isolation().as_str(), "warm pool: building a sandbox failed");
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

    /// A tier that builds nothing: these tests count the pool's waits and builds, and
    /// never ask it for a sandbox.
    #[derive(Debug)]
    struct Unbuilt;

    impl Backend for Unbuilt {
        fn isolation(&self) -> airlock_spec::Isolation {
            airlock_spec::Isolation::Namespaces
        }
        fn create(&self, _: &Shape, _: Purpose) -> Result<Box<dyn Sandbox>, airlock_backend::Error> {
            Err(airlock_backend::Error::host("building", "not in these tests"))
        }
    }

    fn config() -> Shape {
        Shape::of(&Spec::new(vec!["true".into()]))
    }

    fn unbuilt(target: usize) -> Pool {
        Pool::new(Arc::new(Unbuilt), target, config())
    }

    #[tokio::test]
    async fn an_empty_pool_with_nothing_under_way_says_build_one() {
        let pool = unbuilt(2);
        assert!(pool.take_or_wait(&config()).await.is_none());
        assert!(unbuilt(0).take_or_wait(&config()).await.is_none());
    }

    #[tokio::test]
    async fn a_request_waits_for_a_build_under_way_and_only_one_does() {
        let pool = Arc::new(unbuilt(2));
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
