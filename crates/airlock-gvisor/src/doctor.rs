//! `airlock doctor`'s gVisor section: whether runsc is here, which platform works (each
//! tried with a deadline, unless `probe` is off and a cached verdict exists), and a
//! sandbox booted to run `/bin/true` with the walls it applied.

use airlock_backend::{Backend, Capture};
use airlock_sandbox::doctor::Check;
use airlock_spec::Spec;
use std::time::Instant;

use crate::backend::{GvisorBackend, GvisorOptions};
use crate::platform;

fn check(name: &'static str, ok: bool, detail: String, fix: &'static str) -> Check {
    Check {
        name,
        ok,
        slow: false,
        required: false,
        detail,
        fix,
    }
}

/// The walls a gVisor sandbox applies, for the report: outside, runsc's own seccomp
/// filter on the Sentry and the host cgroup; inside, the agent's drops for the program.
pub const WALLS: &str = "outside: the Sentry (gVisor's user-space kernel, running as uid 65534 on the host) and the Gofer under runsc's seccomp filters, a host cgroup (memory, CPU, host tasks) around runsc, Sentry and Gofer, --network=none (proxy mode: only a Unix socket to airlock's egress proxy); inside: uid 1000, no capabilities, no_new_privs, airlock's seccomp filter, RLIMIT_NPROC (the pids limit)/NOFILE/FSIZE/CORE, read-only system directories; landlock: not implemented by this gVisor";

/// Probes gVisor readiness with `options`; `probe`: try every platform again rather
/// than trusting the cached verdict.
pub fn run(options: &GvisorOptions, probe: bool) -> Vec<Check> {
    let mut checks = Vec::new();
    if !airlock_sandbox::doctor::is_root() {
        checks.push(check(
            "gvisor",
            false,
            "not checked as this user".into(),
            airlock_sandbox::doctor::NEEDS_ROOT,
        ));
        return checks;
    }
    let Some(runsc) = options.runsc.clone().or_else(platform::find_runsc) else {
        checks.push(check(
            "gvisor runsc",
            false,
            "runsc not found".into(),
            "apt-get install runsc",
        ));
        return checks;
    };
    let version = platform::runsc_version(&runsc).unwrap_or_else(|e| format!("unknown ({e})"));
    checks.push(check(
        "gvisor runsc",
        true,
        format!("{} ({version})", runsc.display()),
        "",
    ));
    let mut options = options.clone();
    if probe && options.platform.is_none() {
        // The probe's scratch state, named like this process's cgroups' owner so that a
        // later airlock purges it should this one be killed mid-probe.
        let owner = airlock_sandbox::cgroup::CgroupHost::detect()
            .map(|c| c.owner().to_owned())
            .unwrap_or_else(|_| format!("doctor-{}", std::process::id()));
        let scratch = options.state.join(owner);
        let _ = std::fs::create_dir_all(&scratch);
        let verdict = platform::probe(&runsc, &scratch);
        let _ = std::fs::remove_dir(&scratch);
        let tried = verdict
            .trials
            .iter()
            .map(|t| match &t.failure {
                None => format!("{}: ok in {} ms", t.platform.as_str(), t.elapsed.as_millis()),
                Some(why) => format!("{}: {why}", t.platform.as_str()),
            })
            .collect::<Vec<_>>()
            .join("; ");
        checks.push(check(
            "gvisor platform",
            verdict.platform.is_some(),
            tried,
            "no gVisor platform works: check that ptrace is allowed (no Yama ptrace_scope 3)",
        ));
        match verdict.platform {
            Some(p) => {
                let cache = options.cache.join("platform");
                let _ = platform::store(&cache, &version, p);
                options.platform = Some(p);
            }
            None => return checks,
        }
    }
    let backend = GvisorBackend::new(options);
    if let Err(e) = backend.prepare() {
        checks.push(check(
            "gvisor",
            false,
            e.to_string(),
            "apt-get install runsc; build airlock-gvisor-agent",
        ));
        return checks;
    }
    let platform = backend.platform().map_or("?", |p| p.as_str());
    let t0 = Instant::now();
    let spec = Spec::new(vec!["/bin/true".into()]);
    match backend.run(&spec, &mut Capture, &[]) {
        Ok(r) if r.exit_code == Some(0) => checks.push(check(
            "gvisor sandbox",
            true,
            format!(
                "platform {platform}: /bin/true in a fresh sandbox in {} ms; walls: {WALLS}",
                t0.elapsed().as_millis()
            ),
            "",
        )),
        Ok(r) => checks.push(check(
            "gvisor sandbox",
            false,
            format!(
                "platform {platform}: /bin/true ended {:?} {:?}: {}",
                r.exit_code,
                r.signal,
                r.stderr.trim()
            ),
            "",
        )),
        Err(e) => checks.push(check(
            "gvisor sandbox",
            false,
            format!("platform {platform}: {e}"),
            "",
        )),
    }
    checks
}
