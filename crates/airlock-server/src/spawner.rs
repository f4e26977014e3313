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

/// Hands sandbox creation to the spawner threads.
#[derive(Debug)]
pub struct Spawner {
    /// Jobs for the threads; dropping it lets them exit.
    jobs: Mutex<Option<mpsc::Sender<(SandboxConfig, Reply)>>>,
}

impl Spawner {
    /// Starts `threads` spawner threads.
    pub fn new(engine: Arc<Engine>, threads: usize) -> Spawner {
        let (tx, rx) = mpsc::channel::<(SandboxConfig, Reply)>();
        let rx = Arc::new(Mutex::new(rx));
        for n in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            let engine = Arc::clone(&engine);
            std::thread::Builder::new()
                .name(format!("airlock-spawner-{n}"))
                .spawn(move || {
                    loop {
                        let job = rx.lock().map(|r| r.recv());
                        let Ok(Ok((config, reply))) = job else { return };
                        let t0 = Instant::now();
                        let created = engine.create(&config);
                        let _ = reply.send((created, t0.elapsed()));
                    }
                })
                .expect("spawning a spawner thread");
        }
        Spawner {
            jobs: Mutex::new(Some(tx)),
        }
    }

    /// Creates a sandbox; returns it with the time provisioning took.
    pub async fn create(&self, config: SandboxConfig) -> (Result<Sandbox, SandboxError>, Duration) {
        let (tx, rx) = oneshot::channel();
        let sent = self
            .jobs
            .lock()
            .ok()
            .and_then(|jobs| jobs.as_ref().map(|j| j.send((config, tx)).is_ok()))
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

    /// Lets the threads exit once their current job is done.
    pub fn stop(&self) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.take();
        }
    }
}
