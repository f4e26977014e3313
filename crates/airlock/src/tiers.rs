//! The one place the binary knows every isolation tier: it builds the backend for an
//! `--isolation`, or every backend a service runs. Everything after goes through
//! [`airlock_backend::Backend`] and never asks which tier it is.

use airlock_backend::Backend;
use airlock_gvisor::{GvisorBackend, GvisorOptions};
use airlock_microvm::{HostOptions, VmBackend};
use airlock_sandbox::Engine;
use airlock_spec::{Isolation, Limits};
use std::sync::Arc;

/// The namespace tier: checks the host (root, landlock, cgroups), builds the seccomp
/// filter, and purges sandboxes a previous airlock left behind.
fn namespaces(service: bool) -> anyhow::Result<Engine> {
    // One run checks the host only if its sandbox fails (see `Engine::for_one_run`); a
    // service refuses to start on a host it cannot serve.
    let engine = if service {
        Engine::new()?
    } else {
        Engine::for_one_run()?
    };
    if engine.purged_at_start() > 0 {
        tracing::warn!(
            sandboxes = engine.purged_at_start(),
            "purged sandboxes a previous airlock left behind"
        );
    }
    Ok(engine)
}

/// gVisor's options: the environment's, with airlock itself as the agent inside each
/// sandbox (it serves as one when runsc starts it with the agent's argument), unless
/// `AIRLOCK_GVISOR_AGENT` names another binary: one program to install, not two.
pub fn gvisor_options() -> GvisorOptions {
    let mut options = GvisorOptions::from_env();
    if std::env::var_os("AIRLOCK_GVISOR_AGENT").is_none_or(|v| v.is_empty())
        && let Ok(exe) = std::env::current_exe()
    {
        options.agent = exe;
    }
    options
}

/// The backend of `isolation`, for one run.
pub fn one(isolation: Isolation) -> anyhow::Result<Box<dyn Backend>> {
    Ok(match isolation {
        Isolation::Namespaces => Box::new(namespaces(false)?),
        Isolation::Microvm => Box::new(VmBackend::new(HostOptions::from_env(), None)),
        Isolation::Gvisor => Box::new(GvisorBackend::new(gvisor_options())),
    })
}

/// Every backend a service runs. gVisor and micro-VMs are prepared on first use (or when
/// their pool starts); with a pool (`vm_pool` > 0), VMs of the pool's size (`defaults`)
/// are cloned from templates.
pub fn all(defaults: &Limits, vm_pool: usize) -> anyhow::Result<Vec<Arc<dyn Backend>>> {
    let templates = (vm_pool > 0).then(|| defaults.clone());
    Ok(vec![
        Arc::new(namespaces(true)?),
        Arc::new(GvisorBackend::new(gvisor_options())),
        Arc::new(VmBackend::new(HostOptions::from_env(), templates)),
    ])
}
