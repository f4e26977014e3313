//! Warm exec latency of the namespace tier, measured: `/bin/true` run again and again in
//! one session's sandbox (cloned by the zygote), the time of each `Sandbox::exec` from
//! the call to its result. Prints p50 and p90 (a figure for the README and for
//! before/after comparisons; timing is never asserted, every exec must succeed). The
//! sandbox's init is this test binary re-executed (`harness = false`).

use airlock_sandbox::{Capture, Engine, SandboxConfig};
use airlock_spec::Spec;
use std::time::Instant;

/// Execs measured (after as many warm-up ones).
const EXECS: usize = 300;

fn main() {
    airlock_sandbox::maybe_run_init();
    let engine = Engine::new().expect("the namespace tier (run as root)");
    engine.start_zygote().expect("the zygote");
    let spec = Spec::new(vec!["/bin/true".into()]);
    let mut sb = engine.create(&SandboxConfig::of(&spec)).expect("a sandbox");
    let mut times = Vec::with_capacity(EXECS);
    for i in 0..2 * EXECS {
        let t = Instant::now();
        let r = sb.exec(&spec, &mut Capture, &[]).expect("exec");
        assert_eq!(r.exit_code, Some(0), "{r:#?}");
        if i >= EXECS {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    println!(
        "warm exec of /bin/true: p50 {:.3} ms, p90 {:.3} ms over {EXECS}",
        times[EXECS / 2],
        times[EXECS * 9 / 10]
    );
    println!("test result: 1 passed; 0 failed");
}
