//! What files_changed, export and import cost on the namespace tier, measured (figures for
//! the README and before/after comparisons; timing is never asserted, every step must
//! succeed). The sandbox's init is this test binary re-executed (`harness = false`).
//!
//!     cargo test --release -p airlock-sandbox --test snapshot_costs

use airlock_sandbox::{Capture, Engine, Sandbox, SandboxConfig};
use airlock_spec::Spec;
use std::time::Instant;

fn sh(script: &str) -> Spec {
    Spec::new(vec!["/bin/sh".into(), "-c".into(), script.into()])
}

/// p50 in milliseconds of `n` calls of `f` (after a few warm-up ones).
fn p50(n: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[n / 2]
}

fn exec(sb: &mut Sandbox, spec: &Spec) -> usize {
    let r = sb.exec(spec, &mut Capture, &[]).expect("exec");
    assert_eq!(r.exit_code, Some(0), "{r:#?}");
    r.files_changed.len()
}

/// p50 of an exec of `script` with the changeset on and off, and the difference.
fn with_and_without(sb: &mut Sandbox, what: &str, script: &str, n: usize) {
    let on = sh(script);
    let mut off = sh(script);
    off.files_changed_in = vec![];
    // In blocks (a session asks the same way exec after exec; switching the changeset off
    // and on makes the next exec walk before as well), alternating, so the host's load
    // hits both alike.
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut listed = 0;
    for _ in 0..n / 10 {
        for (spec, times) in [(&on, &mut a), (&off, &mut b)] {
            exec(sb, spec); // the first of a block walks before (the setting changed)
            for _ in 0..10 {
                let s = Instant::now();
                let k = exec(sb, spec);
                times.push(s.elapsed().as_secs_f64() * 1e3);
                if std::ptr::eq(spec, &on) {
                    listed = k;
                }
            }
        }
    }
    let n = a.len();
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (a, b) = (a[n / 2], b[n / 2]);
    println!(
        "{what}: exec p50 {a:.3} ms with files_changed ({listed} listed), {b:.3} ms without: +{:.3} ms",
        a - b
    );
}

fn main() {
    airlock_sandbox::maybe_run_init();
    let engine = Engine::new().expect("the namespace tier (run as root)");
    engine.start_zygote().expect("the zygote");
    let config = SandboxConfig::of(&sh("true"));
    let mut sb = engine.create(&config).expect("a sandbox");

    with_and_without(&mut sb, "empty workspace, nothing changed", "true", 200);
    exec(
        &mut sb,
        &sh(
            "for d in $(seq 0 19); do mkdir d$d; done; for i in $(seq 1 1000); do head -c 10240 /dev/zero > d$((i % 20))/f$i; done",
        ),
    );
    with_and_without(&mut sb, "1,000 files (10 MB), nothing changed", "true", 200);
    with_and_without(
        &mut sb,
        "1,000 files (10 MB), 1,000 rewritten",
        "sleep 0.01; touch d*/*",
        40,
    );

    let mut tar = Vec::with_capacity(16 << 20);
    let export = p50(30, || {
        tar.clear();
        sb.export_files(&mut tar, &[]).expect("export");
    });
    println!(
        "export of 1,000 files (10 MB): p50 {export:.3} ms ({} tar bytes)",
        tar.len()
    );
    let mut other = engine.create(&config).expect("a sandbox");
    let import = p50(30, || other.import_files(&mut &tar[..], &[]).expect("import"));
    println!("import of 1,000 files (10 MB) over the same (cleared first): p50 {import:.3} ms");
    let mut fresh: Vec<Sandbox> = (0..11)
        .map(|_| engine.create(&config).expect("a sandbox"))
        .collect();
    let mut times: Vec<f64> = fresh
        .iter_mut()
        .map(|sb| {
            let s = Instant::now();
            sb.import_files(&mut &tar[..], &[]).expect("import");
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    println!(
        "import of 1,000 files (10 MB) into a fresh sandbox: p50 {:.3} ms",
        times[times.len() / 2]
    );
    println!("changes watched without walking: {}", sb.watches_changes());
    println!("test result: 1 passed; 0 failed");
}
