//! A sandbox's proxy, served on the host: on a thread of its own with its own small
//! runtime (so one sandbox flooding its proxy cannot slow another's), stopped and joined
//! when dropped. Each tier hands it the sockets its sandbox reaches the proxy through.

use std::future::Future;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use airlock_spec::EgressEntry;
use tokio::sync::watch;

use crate::Proxy;

/// Resolves when the proxy is to stop; clone one per server.
#[derive(Debug, Clone)]
pub struct Stop(watch::Receiver<bool>);

impl Stop {
    /// The future each server of the proxy stops on.
    pub async fn stopped(mut self) {
        let _ = self.0.wait_for(|s| *s).await;
    }
}

/// A proxy being served; dropping it stops every server and waits for them (held
/// connections for approval are refused first).
#[derive(Debug)]
pub struct Served {
    proxy: Arc<Proxy>,
    /// Entries of the log already returned by [`Served::take_new`].
    seen: usize,
    /// How long a log may take to settle after a program ends.
    settle: Duration,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl Served {
    /// Runs `serve(proxy, stop)` on a new thread named after `id`; `settle` bounds how
    /// long [`Served::take_new`] waits for connections still closing.
    pub fn start<F, Fut>(proxy: Arc<Proxy>, id: &str, settle: Duration, serve: F) -> std::io::Result<Served>
    where
        F: FnOnce(Arc<Proxy>, Stop) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = watch::channel(false);
        let served = Arc::clone(&proxy);
        let thread = std::thread::Builder::new()
            .name(format!("airlock-proxy-{id}"))
            .spawn(move || runtime.block_on(serve(served, Stop(stopped))))?;
        Ok(Served {
            proxy,
            seen: 0,
            settle,
            stop,
            thread: Some(thread),
        })
    }

    /// The proxy served.
    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    /// Log entries recorded since the last call (one exec's egress), waiting a bounded
    /// time for connections still closing (each is logged when it ends).
    pub fn take_new(&mut self) -> Vec<EgressEntry> {
        self.proxy.log_since(&mut self.seen, self.settle)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.proxy.control().refuse_all();
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
