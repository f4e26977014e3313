//! The one place the binary knows every isolation tier: it builds the backend for an
//! `--isolation`, or every backend a service runs. Everything after goes through
//! [`airlock_backend::Backend`] and never asks which tier it is.

use airlock_backend::Backend;
use airlock_microvm::{HostOptions, VmBackend};
use airlock_sandbox::Engine;
use airlock_spec::{Isolation, Limits};
use std::sync::Arc;

/// The namespace tier: checks the host (root, landlock, cgroups), builds the seccomp
/// filter, and purges sandboxes a previous airlock left behind.
fn namespaces() -> anyhow::Result<Engine> {
    let engine = Engine::new()?;
    if engine.purged_at_start() > 0 {
        tracing::warn!(
            sandboxes = engine.purged_at_start(),
            "purged sandboxes a previous airlock left behind"
        );
    }
    Ok(engine)
}

/// The backend of `isolation`, for one run.
pub fn one(isolation: Isolation) -> anyhow::Result<Box<dyn Backend>> {
    Ok(match isolation {
        Isolation::Namespaces => Box::new(namespaces()?),
        Isolation::Microvm => Box::new(VmBackend::new(HostOptions::from_env(), None)),
        Isolation::Gvisor => anyhow::bail!("--isolation gvisor: not available in this build yet"),
    })
}

/// Every backend a service runs. Micro-VMs are prepared on first use (or when their pool
/// starts); with a pool (`vm_pool` > 0), VMs of the pool's size (`defaults`) are cloned
/// from templates.
pub fn all(defaults: &Limits, vm_pool: usize) -> anyhow::Result<Vec<Arc<dyn Backend>>> {
    let templates = (vm_pool > 0).then(|| defaults.clone());
    Ok(vec![
        Arc::new(namespaces()?),
        Arc::new(VmBackend::new(HostOptions::from_env(), templates)),
    ])
}
