//! Micro-VM execs in the service (`"isolation": "microvm"`): the VM host, prepared on
//! first use (or at start when the VM pool is on), a pool of booted VMs waiting for one
//! program each, and one-shot runs in them.
//!
//! A VM serves one exec and is then destroyed, like a pooled namespace sandbox, or one
//! session (`POST /v1/sandboxes` with `"isolation": "microvm"`): its execs and file
//! requests until the session is deleted or expires. Pooled VMs are all of one size (the server's default limits); a request whose limits need a
//! bigger VM boots one for itself. The limits themselves are enforced inside the guest,
//! by its sandbox's cgroup, so a VM bigger than a request needs is still a tight fit.

use airlock_microvm::{BootedVm, HostOptions, MicroVmHost, VmError, VmSize};
use airlock_sandbox::OutputSink;
use airlock_spec::{ExecResult, Limits, Spec};
use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, OnceCell, watch};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::state::stopped;

/// Host memory a VM costs beyond its program's memory cap, for admission: the guest
/// kernel and agent, and the VMM itself.
pub const VM_OVERHEAD_BYTES: u64 = 128 << 20;

/// A boot job: the host, the size, how, and where the booted VM goes.
type BootJob = (
    Arc<MicroVmHost>,
    VmSize,
    Start,
    Option<Limits>,
    tokio::sync::oneshot::Sender<(Result<BootedVm, VmError>, Duration)>,
);

/// How a VM is started.
#[derive(Debug, Clone, PartialEq)]
enum Start {
    /// A cold boot.
    Boot,
    /// A clone of the host's template of that size: about a tenth of a boot, RAM shared
    /// with the template; booting when no template can be made. With limits, of the
    /// template saved with its guest's sandbox built for them
    /// ([`MicroVmHost::clone_prepared`]), else of the plain one
    /// ([`MicroVmHost::clone_vm`]).
    Clone(Option<Limits>),
    /// For the pool: a clone of the template prepared with these limits, then warmed up
    /// ([`BootedVm::warm_up`]) so its one exec finds the exec path translated.
    Pooled(Limits),
}

/// A clone of `host`'s template of `size` (the one prepared with `prepared`, else the
/// plain one), or a boot when no template can be made.
fn clone_or_boot(host: &MicroVmHost, size: VmSize, prepared: Option<&Limits>) -> Result<BootedVm, VmError> {
    match prepared {
        Some(limits) => host.clone_prepared(size, limits),
        None => host.clone_vm(size),
    }
    .or_else(|e| {
        tracing::warn!(error = %e, "micro-VMs: cloning failed; booting instead");
        host.boot(size)
    })
}

/// Boots VMs on long-lived threads of its own. A VMM gets SIGKILL when the thread that
/// started it exits (PR_SET_PDEATHSIG follows the thread), so VMs are never booted on
/// tokio's blocking threads, which end after a while idle.
#[derive(Debug)]
struct Booter {
    /// Jobs for the threads; dropping it lets them exit.
    jobs: Mutex<Option<std::sync::mpsc::Sender<BootJob>>>,
}

impl Booter {
    fn new(threads: usize) -> Booter {
        let (tx, rx) = std::sync::mpsc::channel::<BootJob>();
        let rx = Arc::new(Mutex::new(rx));
        for n in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            let spawned = std::thread::Builder::new()
                .name(format!("airlock-vm-boot-{n}"))
                .spawn(move || {
                    loop {
                        let job = rx.lock().map(|r| r.recv());
                        let Ok(Ok((host, size, start, prepare, reply))) = job else {
                            return;
                        };
                        let t0 = Instant::now();
                        let started = match &start {
                            Start::Boot => host.boot(size),
                            Start::Clone(prepared) => clone_or_boot(&host, size, prepared.as_ref()),
                            Start::Pooled(limits) => clone_or_boot(&host, size, Some(limits)),
                        };
                        let booted = started.and_then(|mut vm| {
                            if let Some(limits) = &prepare {
                                vm.ensure_sandbox(limits)?;
                            }
                            if let Start::Pooled(limits) = &start {
                                // The warm-up's exec finds (or builds) the sandbox.
                                vm.warm_up(limits)?;
                            }
                            Ok(vm)
                        });
                        let _ = reply.send((booted, t0.elapsed()));
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "starting a VM boot thread");
            }
        }
        Booter {
            jobs: Mutex::new(Some(tx)),
        }
    }

    /// Boots a VM of `size` on a boot thread; with `prepare`, also builds the guest's
    /// sandbox for those limits (see [`BootedVm::prepare`]).
    async fn boot(
        &self,
        host: Arc<MicroVmHost>,
        size: VmSize,
        start: Start,
        prepare: Option<Limits>,
    ) -> (Result<BootedVm, VmError>, Duration) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sent = self.jobs.lock().ok().and_then(|j| {
            j.as_ref()
                .map(|j| j.send((host, size, start, prepare, tx)).is_ok())
        });
        if sent != Some(true) {
            return (
                Err(VmError::Host("the VM boot threads are stopped".into())),
                Duration::ZERO,
            );
        }
        rx.await
            .unwrap_or_else(|_| (Err(VmError::Host("a VM boot thread died".into())), Duration::ZERO))
    }

    /// Lets the threads exit once their current boot is done. The VMs they booted die
    /// with them, so this comes after every VM is dropped.
    fn stop(&self) {
        if let Ok(mut j) = self.jobs.lock() {
            j.take();
        }
    }
}

/// The service's micro-VM side.
#[derive(Debug)]
pub struct VmService {
    /// Where the image cache and state directories are.
    options: HostOptions,
    /// Prepared once (image build, accelerator probe); an error is kept and reported to
    /// every request rather than retried per request.
    host: OnceCell<Result<Arc<MicroVmHost>, String>>,
    /// Booted VMs waiting for a program, oldest first.
    ready: Mutex<VecDeque<BootedVm>>,
    /// How many to keep booted.
    target: usize,
    /// The size pooled VMs are booted with.
    size: VmSize,
    /// The limits pooled VMs' guest sandboxes are built with (the disk size must match a
    /// request's; memory, CPU and pids are applied per run).
    defaults: Limits,
    /// Wakes the refiller when one is taken.
    taken: Notify,
    /// Where VMs are booted (the pool's and cold ones).
    booter: Booter,
}

impl VmService {
    /// A VM side that keeps `target` VMs sized for `defaults` booted (0: none; VMs are
    /// then booted per request, and the host is prepared on the first one).
    pub fn new(target: usize, defaults: &Limits) -> VmService {
        VmService {
            options: HostOptions::from_env(),
            host: OnceCell::new(),
            ready: Mutex::new(VecDeque::new()),
            target,
            size: VmSize::for_limits(defaults),
            defaults: defaults.clone(),
            taken: Notify::new(),
            // One for the pool and one for requests that find it empty.
            booter: Booter::new(2),
        }
    }

    /// Stops the boot threads (after every VM is gone: see [`Booter::stop`]).
    pub fn stop(&self) {
        self.booter.stop();
    }

    /// The prepared host; prepares it on first call (building the guest image can take
    /// a while the first time on a machine; it is cached on disk after that).
    pub async fn host(&self) -> Result<Arc<MicroVmHost>, ApiError> {
        let options = self.options.clone();
        let host = self
            .host
            .get_or_init(|| async move {
                let t0 = Instant::now();
                let prepared = tokio::task::spawn_blocking(move || MicroVmHost::new(&options))
                    .await
                    .map_err(|e| format!("preparing micro-VMs: {e}"))
                    .and_then(|r| r.map_err(|e| e.to_string()));
                match &prepared {
                    Ok(host) => {
                        let (accel, why) = host.accel();
                        tracing::info!(
                            accel = accel.as_str(),
                            why,
                            purged = host.purged_at_start(),
                            took_ms = t0.elapsed().as_millis() as u64,
                            "micro-VMs ready"
                        );
                    }
                    Err(e) => tracing::error!(error = %e, "micro-VMs are unavailable"),
                }
                prepared.map(Arc::new)
            })
            .await;
        // A host condition, not the client's fault: 503 with its own code.
        host.clone().map_err(|reason| {
            ApiError::from(airlock_backend::Error::Unavailable {
                tier: airlock_spec::Isolation::Microvm,
                reason,
            })
        })
    }

    /// Takes a booted VM that fits `limits`: at least as big, with the same disk size.
    fn take(&self, limits: &Limits) -> Option<BootedVm> {
        let need = VmSize::for_limits(limits);
        if self.target == 0
            || need.ram_mib > self.size.ram_mib
            || need.vcpus > self.size.vcpus
            || limits.disk_bytes != self.defaults.disk_bytes
        {
            return None;
        }
        let vm = self.ready.lock().ok()?.pop_front();
        if vm.is_some() {
            self.taken.notify_one();
        }
        vm
    }

    /// VMs booted and waiting now.
    pub fn ready(&self) -> usize {
        self.ready.lock().map_or(0, |r| r.len())
    }

    /// Removes every waiting VM (for shutdown); dropping them kills and purges them.
    pub fn drain(&self) -> Vec<BootedVm> {
        self.ready
            .lock()
            .map(|mut r| r.drain(..).collect())
            .unwrap_or_default()
    }

    /// Keeps `target` VMs booted until `stop` turns true. They are clones of a template
    /// VM of the pool's size (booted once, on the first refill), each restored in about
    /// a tenth of a boot. VMs are started one at a time: under software emulation a boot
    /// takes a core for over a second, and requests need the other.
    pub async fn refill(self: Arc<Self>, metrics: Arc<Metrics>, mut stop: watch::Receiver<bool>) {
        if self.target == 0 {
            return;
        }
        let host = tokio::select! {
            h = self.host() => h,
            () = stopped(&mut stop) => return,
        };
        let Ok(host) = host else {
            // Logged by host(); requests get the reason.
            return;
        };
        loop {
            while self.ready() < self.target {
                let (booted, took) = tokio::select! {
                    r = self.booter.boot(Arc::clone(&host), self.size, Start::Pooled(self.defaults.clone()), None) => r,
                    () = stopped(&mut stop) => return,
                };
                match booted {
                    Ok(vm) => {
                        metrics.vm_provisioned("warm", took);
                        if let Ok(mut ready) = self.ready.lock() {
                            ready.push_back(vm);
                        }
                        if *stop.borrow() {
                            // Shutdown began while it booted: the drain may have run.
                            let late = self.drain();
                            let _ = tokio::task::spawn_blocking(move || drop(late)).await;
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "micro-VM pool: booting a VM failed");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                metrics.vm_pool_ready.set(self.ready() as i64);
            }
            metrics.vm_pool_ready.set(self.ready() as i64);
            tokio::select! {
                () = self.taken.notified() => {}
                () = stopped(&mut stop) => return,
            }
            metrics.vm_pool_ready.set(self.ready() as i64);
        }
    }

    /// A VM for `spec`: a pooled one when one fits, else one started now (a clone when
    /// it is of the pool's size, whose template exists, else a boot: a template for a
    /// one-off size would cost a boot and keep its RAM). Returns it with the time the
    /// request spent starting it (zero when warm).
    pub async fn provision(&self, spec: &Spec, metrics: &Metrics) -> Result<(BootedVm, Duration), ApiError> {
        self.provision_with(&spec.limits, false, metrics).await
    }

    /// A VM for a session with `limits`, found or started like [`VmService::provision`]'s,
    /// with its guest's sandbox built (a pooled VM's is already), so files can be written
    /// before the first exec.
    pub async fn provision_session(
        &self,
        limits: &Limits,
        metrics: &Metrics,
    ) -> Result<(BootedVm, Duration), ApiError> {
        self.provision_with(limits, true, metrics).await
    }

    async fn provision_with(
        &self,
        limits: &Limits,
        prepare: bool,
        metrics: &Metrics,
    ) -> Result<(BootedVm, Duration), ApiError> {
        if let Some(vm) = self.take(limits) {
            metrics.vm_pool_ready.set(self.ready() as i64);
            return Ok((vm, Duration::ZERO));
        }
        let host = self.host().await?;
        let need = VmSize::for_limits(limits);
        let start = if self.target > 0 && need == self.size {
            // The pool's prepared template serves any limits with its disk size (the
            // rest are applied per exec).
            Start::Clone((limits.disk_bytes == self.defaults.disk_bytes).then(|| self.defaults.clone()))
        } else {
            Start::Boot
        };
        let prepare = prepare.then(|| limits.clone());
        let (booted, took) = self.booter.boot(host, need, start, prepare).await;
        let vm = booted.map_err(vm_error)?;
        metrics.vm_provisioned("cold", took);
        Ok((vm, took))
    }
}

/// Runs `spec` in `vm` on the calling (blocking) thread; the VM is returned for the
/// caller to drop off the response's path.
pub fn run_blocking(
    mut vm: BootedVm,
    spec: &Spec,
    sink: &mut dyn OutputSink,
    cancel: &[BorrowedFd<'_>],
) -> (Result<ExecResult, VmError>, BootedVm) {
    let r = vm.run(spec, sink, cancel);
    (r, vm)
}

/// Maps a micro-VM error to the API's.
pub fn vm_error(e: VmError) -> ApiError {
    ApiError::from(airlock_backend::Error::from(e))
}
