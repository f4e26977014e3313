//! The service's shared state: the engine and its spawner threads, the warm pool, the
//! sessions, the admission gate, metrics, keys, and the shutdown switches.

use airlock_backend::{Backend, Sandbox, Shape};
use airlock_spec::{Isolation, Limits};
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};
use subtle::ConstantTimeEq;
use tokio::sync::watch;

use crate::admission::{Admission, Permit, SessionQuota, SessionSlot};
use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::tier::{Tier, Tiers};

/// Expired session ids remembered (for 410 instead of 404); older ones are forgotten.
const EXPIRED_MEMORY: usize = 10_000;

/// The name of the API key a request authenticated with (`None` without auth).
#[derive(Debug, Clone, Default)]
pub struct KeyName(pub Option<String>);

/// A session sandbox: lives until deleted or its TTL passes.
#[derive(Debug)]
pub struct Session {
    /// Its id (the sandbox's, or the VM's; after `NAME--` on a daemon with `--node`).
    pub id: String,
    /// Where its execs run (fixed at creation).
    pub isolation: Isolation,
    /// When it was created.
    pub created: SystemTime,
    /// When it expires.
    pub expires: SystemTime,
    /// The same instant on the monotonic clock.
    pub deadline: Instant,
    /// The API key that owns it.
    pub key: Option<String>,
    /// Limits every exec starts from.
    pub limits: Limits,
    /// The image every exec runs in (fixed at creation), its config merged under each
    /// exec's request.
    pub image: Option<crate::images::Resolved>,
    /// Proxy mode's egress proxy (`None` in mode none): its policy changes and approvals
    /// happen while an exec holds `inner`, so it is kept apart.
    pub egress: Option<Arc<airlock_egress::Proxy>>,
    /// Opens connections to its programs' TCP ports (`None`: the tier cannot): kept apart
    /// like `egress`, so forwarded traffic flows while an exec holds `inner`.
    pub ports: Option<Arc<dyn airlock_backend::PortConnector>>,
    /// The ports exposed through airlock (`POST …/ports`), each with its token.
    pub exposed: Mutex<std::collections::BTreeMap<u16, String>>,
    /// Its background processes and terminals.
    pub processes: crate::service::processes::Processes,
    /// Its code interpreter's kernel, once started; one call at a time.
    pub kernel: tokio::sync::Mutex<Option<crate::service::kernel::Kernel>>,
    /// The sandbox and what it has used; locked by one exec or file operation at a time.
    pub inner: tokio::sync::Mutex<SessionInner>,
    /// The network policy it was created with (what a fork gets).
    pub network: airlock_spec::NetworkPolicy,
    /// What it does when idle (fixed at creation).
    pub on_idle: crate::api::OnIdle,
    /// How long without a request counts as idle.
    pub idle_timeout: std::time::Duration,
    /// The snapshot it started from, if any.
    pub from_snapshot: Option<String>,
    /// Whether it is paused, and why.
    pub paused: Mutex<Paused>,
    /// When a request last needed it (what idleness is measured from).
    pub last_used: Mutex<Instant>,
    /// Readable once the session is deleted or expired: its running exec is cancelled.
    pub cancel: Arc<OwnedFd>,
    /// Dropping it makes `cancel` readable.
    cancel_trigger: Mutex<Option<OwnedFd>>,
    /// The rest of its memory cap beyond its idle charge, held from its first background
    /// process, terminal or kernel to its end: those run between execs, so the session is
    /// no longer idle (docs/service.md, "Capacity").
    pub background: Mutex<Option<crate::admission::Reserve>>,
}

impl Session {
    /// A session around `sandbox`, of tier `isolation`.
    pub fn new(
        sandbox: Box<dyn Sandbox>,
        isolation: Isolation,
        ttl: std::time::Duration,
        key: Option<String>,
        limits: Limits,
        permit: Permit,
        slot: SessionSlot,
    ) -> std::io::Result<Session> {
        let (cancel, trigger) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let now = SystemTime::now();
        Ok(Session {
            id: sandbox.id().to_owned(),
            egress: sandbox.egress(),
            ports: sandbox.ports(),
            exposed: Mutex::new(std::collections::BTreeMap::new()),
            processes: Default::default(),
            kernel: tokio::sync::Mutex::new(None),
            isolation,
            created: now,
            expires: now + ttl,
            deadline: Instant::now() + ttl,
            key,
            limits,
            image: None,
            inner: tokio::sync::Mutex::new(SessionInner {
                sandbox: Some(sandbox),
                execs: 0,
                cpu_ms: 0.0,
                memory_peak_bytes: 0,
                permit: Some(permit),
                slot: Some(slot),
            }),
            network: airlock_spec::NetworkPolicy::None,
            on_idle: crate::api::OnIdle::None,
            idle_timeout: std::time::Duration::from_secs(60),
            from_snapshot: None,
            paused: Mutex::new(Paused::No),
            last_used: Mutex::new(Instant::now()),
            cancel: Arc::new(cancel),
            cancel_trigger: Mutex::new(Some(trigger)),
            background: Mutex::new(None),
        })
    }

    /// The same session, doing `on_idle` after `timeout` without a request.
    pub fn with_idle(mut self, on_idle: crate::api::OnIdle, timeout: std::time::Duration) -> Session {
        self.on_idle = on_idle;
        self.idle_timeout = timeout;
        self
    }

    /// The same session, its id handed out as the node `node`'s (`NAME--<sandbox id>`,
    /// see [`crate::node`]).
    pub fn with_node(mut self, node: Option<&str>) -> Session {
        self.id = crate::node::qualify(node, &self.id);
        self
    }

    /// The same session, created with the network policy `network`.
    pub fn with_network(mut self, network: airlock_spec::NetworkPolicy) -> Session {
        self.network = network;
        self
    }

    /// The same session, started from the snapshot `id`.
    pub fn with_origin(mut self, id: Option<String>) -> Session {
        self.from_snapshot = id;
        self
    }

    /// Whether it is paused now, and why.
    pub fn pause_state(&self) -> Paused {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pauses (`Some(why)`) or resumes (`None`) its sandbox, waiting for a running exec
    /// or file operation to end first.
    pub async fn set_paused(self: &Arc<Self>, to: Paused) -> Result<(), ApiError> {
        let session = Arc::clone(self);
        self.with_sandbox(move |sb| {
            let mut state = session.paused.lock().unwrap_or_else(|e| e.into_inner());
            let done = match (to, *state) {
                (Paused::No, Paused::No) => Ok(()),
                (Paused::No, _) => sb.resume(),
                (_, Paused::No) => sb.pause(),
                // Paused already: only the reason changes (an explicit pause of an idle
                // one stays paused until resumed).
                _ => Ok(()),
            };
            if done.is_ok() {
                *state = to;
            }
            done
        })
        .await?
        .map_err(ApiError::from)
    }

    /// Marks it used now, and makes it ready for a request that needs its sandbox: an
    /// idle-paused session resumes; one paused by request is a 409 `paused`.
    pub async fn wake(self: &Arc<Self>) -> Result<(), ApiError> {
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
        match self.pause_state() {
            Paused::No => Ok(()),
            Paused::Idle => {
                self.set_paused(Paused::No).await?;
                tracing::info!(id = %self.id, "idle session resumed");
                Ok(())
            }
            Paused::Requested => Err(ApiError::paused(&self.id)),
        }
    }

    /// The same session, running `image` (its config merged under every exec).
    pub fn with_image(mut self, image: Option<crate::images::Resolved>) -> Session {
        self.image = image;
        self
    }

    /// Cancels whatever runs in it now and from now on (it is being purged).
    pub fn cancel_execs(&self) {
        if let Ok(mut t) = self.cancel_trigger.lock() {
            t.take();
        }
    }

    /// Runs `f` on the sandbox on a blocking thread, in a task of its own: a request that
    /// goes away meanwhile cannot lose the sandbox.
    pub async fn with_sandbox<R, F>(self: &Arc<Self>, f: F) -> Result<R, crate::error::ApiError>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn Sandbox) -> R + Send + 'static,
    {
        self.run_on_sandbox(None, f).await
    }

    /// [`Session::with_sandbox`] on one of `spawner`'s long-lived threads: for work that
    /// may start the sandbox's processes again (a checkpoint), which die with the thread
    /// that started them.
    pub async fn with_sandbox_on<R, F>(
        self: &Arc<Self>,
        spawner: Arc<crate::spawner::Spawner>,
        f: F,
    ) -> Result<R, crate::error::ApiError>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn Sandbox) -> R + Send + 'static,
    {
        self.run_on_sandbox(Some(spawner), f).await
    }

    async fn run_on_sandbox<R, F>(
        self: &Arc<Self>,
        spawner: Option<Arc<crate::spawner::Spawner>>,
        f: F,
    ) -> Result<R, crate::error::ApiError>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn Sandbox) -> R + Send + 'static,
    {
        use crate::error::ApiError;
        let session = Arc::clone(self);
        let task = tokio::spawn(async move {
            let mut inner = session.inner.lock().await;
            let Some(mut sandbox) = inner.sandbox.take() else {
                return Err(ApiError::gone(format!("sandbox {} was deleted", session.id)));
            };
            let job = move || {
                let r = f(sandbox.as_mut());
                (r, sandbox)
            };
            // Where the job cannot run or finish (the service stopping, a panic), the
            // sandbox goes with it.
            let ran = match spawner {
                Some(spawner) => spawner.run(move |_| job()).await.map_err(ApiError::from),
                None => tokio::task::spawn_blocking(job)
                    .await
                    .map_err(|e| ApiError::internal(format!("sandbox task: {e}"))),
            };
            let (r, sandbox) = ran?;
            inner.sandbox = Some(sandbox);
            Ok(r)
        });
        task.await
            .unwrap_or_else(|e| Err(ApiError::internal(format!("sandbox task: {e}"))))
    }

    /// Whether it was deleted or expired.
    pub fn deleted(&self) -> bool {
        self.cancel_trigger.lock().map_or(true, |t| t.is_none())
    }
}

/// Whether a session is paused, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paused {
    /// It runs.
    No,
    /// `POST …/pause`: it stays paused until `POST …/resume`.
    Requested,
    /// It was idle (`on_idle: pause`): the next request that needs it resumes it.
    Idle,
}

/// The mutable part of a session.
#[derive(Debug)]
pub struct SessionInner {
    /// The sandbox; `None` once purged.
    pub sandbox: Option<Box<dyn Sandbox>>,
    /// Execs run so far.
    pub execs: u64,
    /// CPU time of all execs.
    pub cpu_ms: f64,
    /// Highest memory peak seen.
    pub memory_peak_bytes: u64,
    /// Its admission (a session is a live sandbox).
    pub permit: Option<Permit>,
    /// Its place in its key's session quota.
    pub slot: Option<SessionSlot>,
}

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// Settings.
    pub config: ServerConfig,
    /// Each tier: its backend, build threads and warm pool.
    pub tiers: Tiers,
    /// The admission gate.
    pub admission: Admission,
    /// Sessions per API key (`--max-sessions-per-key`).
    pub session_quota: SessionQuota,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Live sessions by id.
    pub sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Recently expired session ids, for 410.
    expired: Mutex<(HashSet<String>, VecDeque<String>)>,
    /// Readable once running execs must be killed (shutdown grace over). Polled, never read.
    pub cancel: Arc<OwnedFd>,
    /// Dropping it makes `cancel` readable.
    pub cancel_trigger: Mutex<Option<OwnedFd>>,
    /// True once shutdown began: no new sessions or one-shot execs (a fleet member with
    /// `--node` drains: its sessions keep working until `closing`).
    pub stopping: watch::Sender<bool>,
    /// True once the listener stops taking requests (at once without `--node`; after the
    /// drain with it): no new exec in a session either.
    pub closing: watch::Sender<bool>,
    /// The snapshot store (`--snapshot-dir`), or why the service has none.
    pub snapshots: Result<Arc<airlock_snapshot::Store>, String>,
    /// The image store (`--image-store`), shared with other airlock processes on the
    /// host through its locks.
    pub images: Option<Arc<airlock_image::Store>>,
}

impl AppState {
    /// Builds the state around the tiers' `backends`; their spawner threads start here.
    /// Each tier's pool keeps the number of sandboxes the config asks of it, of the
    /// default limits.
    ///
    /// `image_pools` are the images of [`ServerConfig::image_pools`], resolved: `(tier,
    /// name, size, the image's root)`.
    pub fn new(
        backends: Vec<Arc<dyn Backend>>,
        images: Option<Arc<airlock_image::Store>>,
        image_pools: Vec<(airlock_spec::Isolation, String, usize, airlock_backend::ImageRoot)>,
        config: ServerConfig,
    ) -> Arc<AppState> {
        let shape = Shape {
            limits: config.defaults.clone(),
            rootfs: None,
            network: airlock_spec::NetworkPolicy::None,
            image: None,
        };
        let admission = Admission::new(&config).holding(backends.clone());
        let tiers = backends
            .into_iter()
            .map(|b| {
                let target = config.pool_target(b.isolation());
                let pools = image_pools
                    .iter()
                    .filter(|(tier, ..)| *tier == b.isolation())
                    .map(|(_, name, size, root)| {
                        let shape = Shape {
                            image: Some(root.clone()),
                            ..shape.clone()
                        };
                        (name.clone(), *size, shape)
                    })
                    .collect();
                Tier::new(b, target, shape.clone(), pools)
            })
            .collect();
        let (cancel, trigger) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
        Arc::new(AppState {
            tiers: Tiers::new(tiers),
            admission,
            session_quota: SessionQuota::new(config.max_sessions_per_key),
            metrics: Arc::new(Metrics::new()),
            sessions: Mutex::new(HashMap::new()),
            expired: Mutex::new((HashSet::new(), VecDeque::new())),
            cancel: Arc::new(cancel),
            cancel_trigger: Mutex::new(Some(trigger)),
            stopping: watch::Sender::new(false),
            closing: watch::Sender::new(false),
            snapshots: crate::service::snapshots::open_store(
                config.snapshot_dir.as_deref(),
                config.snapshot_budget,
            ),
            images,
            config,
        })
    }

    /// The name of the key `token` is, compared in constant time against every key.
    pub fn key_name(&self, token: &str) -> Option<String> {
        let mut found = None;
        for (name, key) in &self.config.api_keys {
            if bool::from(key.as_bytes().ct_eq(token.as_bytes())) {
                found = Some(name.clone());
            }
        }
        found
    }

    /// The session `id`, if `key` may use it: 404 when unknown (or another key's), 410
    /// when it expired.
    pub fn session(&self, id: &str, key: &KeyName) -> Result<Arc<Session>, ApiError> {
        let found = self.sessions.lock().ok().and_then(|m| m.get(id).cloned());
        match found {
            Some(s) if s.key == key.0 => {
                if Instant::now() >= s.deadline {
                    return Err(ApiError::gone(format!("sandbox {id} expired")));
                }
                Ok(s)
            }
            _ if self.expired.lock().is_ok_and(|e| e.0.contains(id)) => {
                Err(ApiError::gone(format!("sandbox {id} expired")))
            }
            _ => Err(ApiError::not_found(format!("no sandbox {id}"))),
        }
    }

    /// Removes a session from the registry (its sandbox is purged by [`purge_session`]).
    pub fn remove_session(&self, id: &str, expired: bool) -> Option<Arc<Session>> {
        let removed = self.sessions.lock().ok()?.remove(id);
        if removed.is_some()
            && expired
            && let Ok(mut e) = self.expired.lock()
        {
            if e.0.insert(id.to_owned()) {
                e.1.push_back(id.to_owned());
            }
            while e.1.len() > EXPIRED_MEMORY {
                if let Some(old) = e.1.pop_front() {
                    e.0.remove(&old);
                }
            }
        }
        removed
    }

    /// Sandboxes live now: admitted execs and sessions.
    pub fn active(&self) -> usize {
        self.admission.active(self.config.max_sandboxes)
    }

    /// Makes every running exec end (shutdown grace over).
    pub fn cancel_all(&self) {
        if let Ok(mut t) = self.cancel_trigger.lock() {
            t.take();
        }
    }
}

/// Purges a removed session: cancels its running exec, if any, then destroys the sandbox
/// off the async threads.
pub async fn purge_session(session: Arc<Session>) {
    // A running exec is cancelled, so the purge happens now, not when it would end.
    session.cancel_execs();
    let mut inner = session.inner.lock().await;
    let sandbox = inner.sandbox.take();
    inner.permit.take();
    inner.slot.take();
    drop(inner);
    if let Ok(mut held) = session.background.lock() {
        held.take();
    }
    if let Some(sb) = sandbox {
        let _ = tokio::task::spawn_blocking(move || drop(sb)).await;
    }
}
