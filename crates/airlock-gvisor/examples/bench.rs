//! Measures the gVisor tier beside the namespace tier, through their libraries (no HTTP):
//! what `bench/gvisor.py` runs. Prints one JSON object per measurement on stdout.
//!
//! ```text
//! cargo build --release -p airlock-gvisor --example bench --bin airlock-gvisor-agent
//! sudo target/release/examples/bench pooled 200     # /bin/true through pooled sandboxes
//! sudo target/release/examples/bench cold 20        # build, run /bin/true, purge
//! sudo target/release/examples/bench python 10      # python3 -c pass, cold and pooled
//! sudo target/release/examples/bench pss 8          # host PSS per idle pooled sandbox
//! ```

use airlock_backend::{Backend, Capture, Purpose, Sandbox, Shape};
use airlock_gvisor::{GvisorBackend, GvisorOptions};
use airlock_spec::Spec;
use std::time::Instant;

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn spec(argv: &[&str]) -> Spec {
    Spec::new(argv.iter().map(|s| s.to_string()).collect())
}

fn emit(tier: &str, what: &str, samples: &[f64]) {
    let list = samples
        .iter()
        .map(|x| format!("{x:.3}"))
        .collect::<Vec<_>>()
        .join(",");
    println!("{{\"tier\":\"{tier}\",\"what\":\"{what}\",\"ms\":[{list}]}}");
}

/// `n` execs of `argv`, each in a sandbox built ahead (as a pool's) and dropped after.
/// Also emits what the agent measured inside (`wall_ms`: from the program's start to
/// its end).
fn pooled_gvisor(backend: &GvisorBackend, argv: &[&str], n: usize) -> Vec<f64> {
    let s = spec(argv);
    let mut out = Vec::new();
    let mut inside = Vec::new();
    for _ in 0..n {
        let mut sb = backend
            .create(&Shape::of(&s), Purpose::Pool { behind: false })
            .expect("a pooled gVisor sandbox");
        let t = Instant::now();
        let r = sb.exec_once(&s, &mut Capture, &[]).expect("exec");
        out.push(ms(t));
        inside.push(r.wall_ms);
        assert_eq!(r.exit_code, Some(0), "{r:?}");
        drop(sb);
    }
    emit(
        "gvisor",
        &format!("{} (agent's wall_ms)", argv.join(" ")),
        &inside,
    );
    out
}

fn pooled_namespaces(engine: &airlock_sandbox::Engine, argv: &[&str], n: usize) -> Vec<f64> {
    let s = spec(argv);
    let mut out = Vec::new();
    for _ in 0..n {
        let mut sb = engine
            .create(&airlock_sandbox::SandboxConfig::of(&s))
            .expect("a namespace sandbox");
        let t = Instant::now();
        let r = sb.exec_once(&s, &mut Capture, &[]).expect("exec");
        out.push(ms(t));
        assert_eq!(r.exit_code, Some(0), "{r:?}");
    }
    out
}

fn cold_gvisor(backend: &GvisorBackend, argv: &[&str], n: usize) -> Vec<f64> {
    let s = spec(argv);
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let r = backend.run(&s, &mut Capture, &[]).expect("run");
            assert_eq!(r.exit_code, Some(0), "{r:?}");
            ms(t)
        })
        .collect()
}

fn cold_namespaces(engine: &airlock_sandbox::Engine, argv: &[&str], n: usize) -> Vec<f64> {
    let s = spec(argv);
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let r = engine.run(&s, &mut Capture, &[]).expect("run");
            assert_eq!(r.exit_code, Some(0), "{r:?}");
            ms(t)
        })
        .collect()
}

/// PSS in kB of `pid` (smaps_rollup).
fn pss_kb(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Host processes of the sandbox `id`: the members of its cgroup2 (or memory) directory.
fn members(id: &str) -> Vec<String> {
    for base in [
        "/sys/fs/cgroup/unified/airlock",
        "/sys/fs/cgroup/memory/airlock",
        "/sys/fs/cgroup/airlock",
    ] {
        for owner in std::fs::read_dir(base).into_iter().flatten().flatten() {
            let procs = owner.path().join(id).join("cgroup.procs");
            if let Ok(text) = std::fs::read_to_string(procs) {
                return text.lines().map(str::to_owned).collect();
            }
        }
    }
    Vec::new()
}

fn main() {
    // With AIRLOCK_GVISOR_AGENT pointing at this binary, it is the agent as well.
    airlock_gvisor::agent::maybe_serve();
    airlock_sandbox::maybe_run_init();
    let args: Vec<String> = std::env::args().collect();
    let what = args.get(1).map(String::as_str).unwrap_or("pooled");
    let n: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(50);
    let backend = GvisorBackend::new(GvisorOptions::from_env());
    backend.prepare().expect("gVisor available");
    let platform = backend.platform().map_or("?", |p| p.as_str());
    eprintln!("gvisor platform: {platform}");
    let engine = airlock_sandbox::Engine::new().expect("namespace engine");
    let _ = engine.start_zygote();
    match what {
        "pooled" => {
            // Warm-up: page cache, the agent binary, runsc.
            pooled_gvisor(&backend, &["/bin/true"], 3);
            pooled_namespaces(&engine, &["/bin/true"], 3);
            emit(
                "gvisor",
                "pooled /bin/true",
                &pooled_gvisor(&backend, &["/bin/true"], n),
            );
            emit(
                "namespaces",
                "pooled /bin/true",
                &pooled_namespaces(&engine, &["/bin/true"], n),
            );
        }
        "cold" => {
            cold_gvisor(&backend, &["/bin/true"], 2);
            emit(
                "gvisor",
                "cold /bin/true",
                &cold_gvisor(&backend, &["/bin/true"], n),
            );
            emit(
                "namespaces",
                "cold /bin/true",
                &cold_namespaces(&engine, &["/bin/true"], n),
            );
        }
        "python" => {
            let py = ["python3", "-c", "pass"];
            emit("gvisor", "cold python3 -c pass", &cold_gvisor(&backend, &py, n));
            emit(
                "gvisor",
                "pooled python3 -c pass",
                &pooled_gvisor(&backend, &py, n),
            );
            emit(
                "namespaces",
                "cold python3 -c pass",
                &cold_namespaces(&engine, &py, n),
            );
            emit(
                "namespaces",
                "pooled python3 -c pass",
                &pooled_namespaces(&engine, &py, n),
            );
        }
        "pss" => {
            let s = spec(&["/bin/true"]);
            let pool: Vec<Box<dyn Sandbox>> = (0..n)
                .map(|_| {
                    backend
                        .create(&Shape::of(&s), Purpose::Pool { behind: false })
                        .expect("a pooled gVisor sandbox")
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_secs(2));
            if std::env::var_os("BENCH_HOLD").is_some() {
                std::thread::sleep(std::time::Duration::from_secs(20));
            }
            let per: Vec<f64> = pool
                .iter()
                .map(|sb| {
                    let kb: u64 = members(sb.id()).iter().map(|p| pss_kb(p)).sum();
                    kb as f64 / 1024.0
                })
                .collect();
            println!(
                "{{\"tier\":\"gvisor\",\"what\":\"PSS per pooled sandbox (MB)\",\"mb\":[{}]}}",
                per.iter()
                    .map(|x| format!("{x:.1}"))
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
        other => panic!("unknown measurement {other}"),
    }
}
