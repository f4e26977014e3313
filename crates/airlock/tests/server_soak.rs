//! SOAK: 2,000 one-shot execs of /bin/true through the real `airlock serve` (concurrency
//! 4), after which the daemon's open fds, threads and RSS are back near their values after
//! warm-up, and the host's cgroups and processes owned by the daemon are back where they
//! started (its warm pool, nothing more; no zombie children).
//!
//! A single test: cargo runs test binaries one after another, so nothing else of this
//! project's suites runs airlock while it counts. Prints execs/s for information only.

mod serverutil;

use serde_json::json;
use serverutil::{Client, Daemon, poll};
use std::time::{Duration, Instant};

const EXECS: usize = 2000;
const CONCURRENCY: usize = 4;
const WARM_UP: usize = 200;
/// Slack for what comes and goes on its own (in-flight purges, idle blocking threads
/// that have not timed out yet, allocator caches).
const FD_SLACK: usize = 10;
const THREAD_SLACK: u64 = 16;
const RSS_FACTOR: f64 = 1.5;
const RSS_SLACK: u64 = 20 << 20;
/// How long things get to settle after the load (tokio's idle blocking threads linger 10 s).
const SETTLE: Duration = Duration::from_secs(45);

/// Runs `n` execs of /bin/true at `CONCURRENCY`; panics on anything but a 200 that exited 0.
fn blast(d: &Daemon, n: usize) -> Duration {
    let t0 = Instant::now();
    let threads: Vec<_> = (0..CONCURRENCY)
        .map(|t| {
            let c: Client = d.client();
            let share = n / CONCURRENCY + usize::from(t < n % CONCURRENCY);
            std::thread::spawn(move || {
                let body = json!({"cmd": ["/bin/true"]});
                for i in 0..share {
                    let r = c.exec(&body);
                    assert_eq!(r.status, 200, "exec {i} of thread {t}: {}", r.text());
                    let v = r.json();
                    assert_eq!(v["outcome"], "exited", "{v}");
                    assert_eq!(v["exit_code"], 0, "{v}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client thread failed");
    }
    t0.elapsed()
}

/// What the daemon holds, in its own process and on the host.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    fds: usize,
    threads: u64,
    rss: u64,
    cgroups: usize,
    processes: usize,
    children: usize,
    zombies: usize,
}

fn snapshot(d: &Daemon) -> Snapshot {
    let children = d.children();
    Snapshot {
        fds: d.fd_count(),
        threads: d.threads(),
        rss: d.rss_bytes(),
        cgroups: d.sandbox_cgroups().len(),
        processes: d.sandbox_processes().len(),
        children: children.len(),
        zombies: children.iter().filter(|p| p.state == "Z").count(),
    }
}

/// Waits until the warm pool is full again and nothing else of the daemon's is live.
fn settled(d: &Daemon, pool_target: u64) -> bool {
    let c = d.client();
    poll(SETTLE, || {
        let v = c.get("/readyz").json();
        (v["pool_ready"].as_u64() == Some(pool_target)
            && v["sandboxes_active"].as_u64() == Some(0)
            && d.sandbox_cgroups().len() as u64 == pool_target)
            .then_some(())
    })
    .is_some()
}

#[test]
fn soak_2000_execs_leave_the_daemon_and_the_host_where_they_started() {
    let d = Daemon::start(&["--queue-timeout", "120s"]);
    d.wait_ready();
    let pool_target = d.client().get("/readyz").expect(200).json()["pool_target"]
        .as_u64()
        .expect("pool_target");

    blast(&d, WARM_UP);
    assert!(settled(&d, pool_target), "the pool never refilled after warm-up");
    // Let idle blocking threads of the warm-up retire before taking the baseline.
    std::thread::sleep(Duration::from_secs(12));
    let before = snapshot(&d);
    eprintln!("after warm-up ({WARM_UP} execs): {before:?}");

    let took = blast(&d, EXECS);
    eprintln!(
        "soak: {EXECS} execs of /bin/true at concurrency {CONCURRENCY} in {:.1} s: {:.0} execs/s",
        took.as_secs_f64(),
        EXECS as f64 / took.as_secs_f64()
    );
    let during = snapshot(&d);
    eprintln!("right after the soak: {during:?}");

    assert!(settled(&d, pool_target), "the pool never refilled after the soak");
    let rss_cap = (before.rss as f64 * RSS_FACTOR) as u64 + RSS_SLACK;
    let back = poll(SETTLE, || {
        let now = snapshot(&d);
        (now.fds <= before.fds + FD_SLACK
            && now.threads <= before.threads + THREAD_SLACK
            && now.rss <= rss_cap
            && now.cgroups == before.cgroups
            && now.processes == before.processes
            && now.children == before.children
            && now.zombies == 0)
            .then_some(now)
    });
    let after = back.clone().unwrap_or_else(|| snapshot(&d));
    eprintln!("after settling: {after:?}");
    assert!(
        back.is_some(),
        "the daemon did not come back to its post-warm-up state within {SETTLE:?}:\n  before {before:?}\n  after  {after:?}\n  \
         (allowed: fds +{FD_SLACK}, threads +{THREAD_SLACK}, rss <= {rss_cap}, cgroups, processes and children \
         equal, no zombie)\n  \
         cgroups now: {:?}\n  processes now: {:?}",
        d.sandbox_cgroups(),
        d.sandbox_processes()
    );
}
