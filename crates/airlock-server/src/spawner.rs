//! Creates a tier's sandboxes on dedicated, long-lived threads.
//!
//! A sandbox's processes may be tied to the *thread* that created it: a namespace
//! sandbox's init and a micro-VM's VMM carry `PR_SET_PDEATHSIG`, which fires when that
//! thread exits, not the process. Tokio's blocking threads exit when idle, so a session
//! or a pooled sandbox created on one would be killed seconds later. These threads live
//! as long as the service; when it dies, they die, and every sandbox with them.

use airlock_backend::{Backend, Error, Purpose, Sandbox, Shape};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// A built sandbox (or why not), and how long building it took.
pub type Created = (Result<Box<dyn Sandbox>, Error>, Duration);

/// Work for a spawner thread: building a sandbox, or anything else that may start
/// processes tied to the thread (restoring a snapshot, taking a checkpoint that starts
/// the sandbox again).
type Job = Box<dyn FnOnce(&dyn Backend) + Send>;

/// Hands sandbox creation to one tier's spawner threads.
#[derive(Debug)]
pub struct Spawner {
    /// Jobs for the threads; dropping it lets them exit.
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// The threads, joined by [`Spawner::stop`].
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Spawner {
    /// Starts `threads` threads that build `backend`'s sandboxes.
    pub fn new(backend: Arc<dyn Backend>, threads: usize) -> Spawner {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut handles = Vec::new();
        for n in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            let backend = Arc::clone(&backend);
            let spawned = std::thread::Builder::new()
                .name(format!("airlock-{}-{n}", backend.isolation().as_str()))
                .spawn(move || {
                    loop {
                        let job = rx.lock().map(|r| r.recv());
                        let Ok(Ok(job)) = job else {
                            return;
                        };
                        job(backend.as_ref());
                    }
                });
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => tracing::error!(error = %e, "starting a spawner thread"),
            }
        }
        Spawner {
            jobs: Mutex::new(Some(tx)),
            threads: Mutex::new(handles),
        }
    }

    /// Builds a sandbox of `shape` for `purpose`; returns it with the time building took.
    pub async fn create(&self, shape: Shape, purpose: Purpose) -> Created {
        let made = self
            .run(move |backend| {
                let t0 = Instant::now();
                // A caller that went away drops the sandbox on this thread (with the
                // reply): purged on the thread that made it.
                (backend.create(&shape, purpose), t0.elapsed())
            })
            .await;
        made.unwrap_or_else(|e| (Err(e), Duration::ZERO))
    }

    /// Runs `f` on one of the threads and returns what it returned: for work that may
    /// start processes that must live as long as the service (a sandbox restored from a
    /// snapshot, a sandbox started again after its checkpoint). What `f` returns and the
    /// caller no longer wants is dropped on that thread.
    pub async fn run<R, F>(&self, f: F) -> Result<R, Error>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Backend) -> R + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |backend| {
            let r = f(backend);
            if let Err(unwanted) = tx.send(r) {
                drop(unwanted);
            }
        });
        let sent = self
            .jobs
            .lock()
            .ok()
            .and_then(|jobs| jobs.as_ref().map(|j| j.send(job).is_ok()))
            .unwrap_or(false);
        if !sent {
            return Err(Error::Cancelled);
        }
        rx.await
            .map_err(|_| Error::host("building a sandbox", "the spawner thread stopped"))
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
