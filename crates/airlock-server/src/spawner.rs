//! Creates sandboxes on dedicated, long-lived threads.
//!
//! A sandbox's init carries `PR_SET_PDEATHSIG`, which fires when the *thread* that cloned
//! it exits, not the process. Tokio's blocking threads exit when idle, so a session or a
//! pooled sandbox created on one would be killed seconds later. These threads live as
//! long as the service; when it dies, they die, and every sandbox with them.

use airlock_sandbox::{Engine, Sandbox, SandboxConfig, SandboxError};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

type Reply = oneshot::Sender<(Result<Sandbox, SandboxError>, Duration)>;

/// One sandbox to build: its settings, whether it is built ahead of need (for the pool:
/// see [`Engine::create_ahead`]), and where it goes.
type Job = (SandboxConfig, bool, Reply);

/// Hands sandbox creation to the spawner threads.
#[derive(Debug)]
pub struct Spawner {
    /// Jobs for the threads; dropping it lets them exit.
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// The threads, joined by [`Spawner::stop`].
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Spawner {
    /// Starts `threads` spawner threads, and the engine's zygote (the service creates
    /// many sandboxes: each one then costs the host less; see
    /// [`Engine::start_zygote`]).
    pub fn new(engine: Arc<Engine>, threads: usize) -> Spawner {
        if let Err(e) = engine.start_zygote() {
            tracing::warn!(error = %e, "no zygote: sandboxes are cloned from the service itself");
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut handles = Vec::new();
        for n in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            let engine = Arc::clone(&engine);
            let handle = std::thread::Builder::new()
                .name(format!("airlock-spawner-{n}"))
                .spawn(move || {
                    loop {
                        let job = rx.lock().map(|r| r.recv());
                        let Ok(Ok((config, ahead, reply))) = job else {
                            return;
                        };
                        let t0 = Instant::now();
                        let created = if ahead {
                            engine.create_ahead(&config)
                        } else {
                            engine.create(&config)
                        };
                        let _ = reply.send((created, t0.elapsed()));
                    }
                })
                .expect("spawning a spawner thread");
            handles.push(handle);
        }
        Spawner {
            jobs: Mutex::new(Some(tx)),
            threads: Mutex::new(handles),
        }
    }

    /// Creates a sandbox; returns it with the time provisioning took. With `ahead` (built
    /// before anyone asked for it), in the background's CPU share until its first exec
    /// ([`Engine::create_ahead`]).
    pub async fn create(
        &self,
        config: SandboxConfig,
        ahead: bool,
    ) -> (Result<Sandbox, SandboxError>, Duration) {
        let (tx, rx) = oneshot::channel();
        let sent = self
            .jobs
            .lock()
            .ok()
            .and_then(|jobs| jobs.as_ref().map(|j| j.send((config, ahead, tx)).is_ok()))
            .unwrap_or(false);
        if !sent {
            return (
                Err(SandboxError::Host("the service is shutting down".into())),
                Duration::ZERO,
            );
        }
        rx.await.unwrap_or((
            Err(SandboxError::Host("the spawner stopped".into())),
            Duration::ZERO,
        ))
    }

    /// Lets the threads exit once their current job is done, and waits for them: a
    /// sandbox built for a caller that went away is purged by its thread before this
    /// returns. Blocking: call it off the async threads.
    pub fn stop(&self) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.take();
        }
        let threads = self
            .threads
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for t in threads {
            let _ = t.join();
        }
    }
}
