//! The micro-VM tier behind airlock's one backend interface: [`VmBackend`] prepares the
//! host once and starts VMs (cloned from templates where that pays), [`BootedVm`] is
//! its sandbox.

use airlock_backend::{Backend, Error, ImageRoot, OutputSink, Purpose, Shape};
use airlock_spec::{ExecResult, FileEntry, Isolation, Limits, Spec};
use std::os::fd::BorrowedFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{BootedVm, HostOptions, MicroVmHost, VmError, VmSize};

/// Host memory a VM costs beyond its program's memory cap, for admission: the guest
/// kernel and agent, and the VMM itself.
pub const VM_OVERHEAD_BYTES: u64 = 128 << 20;

/// The micro-VM tier.
#[derive(Debug)]
pub struct VmBackend {
    /// Where the image cache and state directories are.
    options: HostOptions,
    /// Prepared once (image build, accelerator probe); an error is kept and reported to
    /// every request rather than retried per request.
    host: OnceLock<Result<MicroVmHost, String>>,
    /// The limits a service's VM pool builds with, if it has one: VMs of their size are
    /// cloned from a template (about a tenth of a boot, RAM shared with the template);
    /// others boot (a template for a one-off size would cost a boot and keep its RAM).
    templates: Option<Limits>,
}

impl VmBackend {
    /// A tier that prepares the host from `options` on first use; with `templates`, VMs
    /// of that size are cloned from templates (see [`VmBackend::templates`]).
    pub fn new(options: HostOptions, templates: Option<Limits>) -> VmBackend {
        VmBackend {
            options,
            host: OnceLock::new(),
            templates,
        }
    }

    /// The prepared host (prepares it on the first call: building the guest image can
    /// take a while the first time on a machine; it is cached on disk after that).
    pub fn host(&self) -> Result<&MicroVmHost, Error> {
        let prepared = self.host.get_or_init(|| {
            let t0 = Instant::now();
            let host = MicroVmHost::new(&self.options).map_err(|e| e.to_string());
            match &host {
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
            host
        });
        prepared.as_ref().map_err(|reason| Error::Unavailable {
            tier: Isolation::Microvm,
            reason: reason.clone(),
        })
    }

    /// A clone of the template of `size` (the one saved with its guest's sandbox built
    /// for `prepared`, else the plain one; of `image`'s, for a VM of an image), or a boot
    /// when no template can be made.
    fn clone_or_boot(
        host: &MicroVmHost,
        size: VmSize,
        prepared: Option<&Limits>,
        image: Option<&ImageRoot>,
    ) -> Result<BootedVm, VmError> {
        match (image, prepared) {
            (Some(image), _) => host.clone_image(size, prepared, image),
            (None, Some(limits)) => host.clone_prepared(size, limits),
            (None, None) => host.clone_vm(size),
        }
        .or_else(|e| {
            tracing::warn!(error = %e, "micro-VMs: cloning failed; booting instead");
            Self::boot(host, size, image)
        })
    }

    /// A cold boot, of `image` when there is one.
    fn boot(host: &MicroVmHost, size: VmSize, image: Option<&ImageRoot>) -> Result<BootedVm, VmError> {
        match image {
            Some(image) => host.boot_image(size, image),
            None => host.boot(size),
        }
    }
}

impl Backend for VmBackend {
    fn isolation(&self) -> Isolation {
        Isolation::Microvm
    }

    fn overhead_bytes(&self) -> u64 {
        VM_OVERHEAD_BYTES
    }

    /// The templates' memory (and restored snapshots' shared RAM), once the host is
    /// prepared; nothing before.
    fn held_bytes(&self) -> u64 {
        match self.host.get() {
            Some(Ok(host)) => host.held_bytes(),
            _ => 0,
        }
    }

    fn prepare(&self) -> Result<(), Error> {
        self.host().map(|_| ())
    }

    /// A shape with an image gets a VM that carries the image's squashfs (built once per
    /// digest, cached) as a second drive, which its guest's sandbox has as its root. A
    /// pool's VMs of an image are cloned from a template of that image (one per image the
    /// pool serves); other VMs of an image boot cold, so that one-off images do not each
    /// keep a template's memory.
    fn create(&self, shape: &Shape, purpose: Purpose) -> Result<Box<dyn airlock_backend::Sandbox>, Error> {
        self.check_shape(shape)?;
        let host = self.host()?;
        let limits = &shape.limits;
        let size = VmSize::for_limits(limits);
        let template = self.templates.as_ref().filter(|t| VmSize::for_limits(t) == size);
        let image = shape.image.as_ref();
        let vm = match (purpose, template, image) {
            // A pool's stock: a clone of the template saved with its sandbox built, then
            // warmed up, so its one exec finds the exec path translated.
            (Purpose::Pool { .. }, _, _) => {
                let mut vm = Self::clone_or_boot(host, size, Some(limits), image)?;
                vm.warm_up(limits)?;
                vm
            }
            // The pool's prepared template serves any limits with its disk size (the
            // rest are applied per exec).
            (_, Some(t), None) => {
                Self::clone_or_boot(host, size, (limits.disk_bytes == t.disk_bytes).then_some(t), None)?
            }
            (_, _, image) => Self::boot(host, size, image)?,
        };
        debug_assert_eq!(vm.image_digest(), image.map(|i| i.digest.as_str()));
        Ok(Box::new(vm))
    }

    /// A VM serves a program that fits it: no more RAM or CPUs than it has, the disk its
    /// sandbox was built with and the same image (digest and tree; none for none); the
    /// network is started per exec.
    fn runs_images(&self) -> bool {
        true
    }

    /// Micro-VMs take full snapshots (but in proxy mode, where a checkpoint answers
    /// `false`).
    fn checkpoints(&self) -> bool {
        true
    }

    /// A VM restored from a full snapshot ([`MicroVmHost::restore`]), of the snapshot's
    /// VM size; `shape`'s image and disk must be the snapshot's. The same for every
    /// purpose: it runs on from the snapshot, its sandbox built. As for
    /// [`Backend::create`], its VMM dies with the calling thread: restore on a thread
    /// that lives as long as the sandbox (not tokio's `spawn_blocking`, whose idle
    /// threads exit).
    fn restore(
        &self,
        shape: &Shape,
        dir: &std::path::Path,
        _purpose: Purpose,
    ) -> Result<Box<dyn airlock_backend::Sandbox>, Error> {
        self.check_shape(shape)?;
        let host = self.host()?;
        let vm = host.restore(dir, shape.image.as_ref(), shape.limits.disk_bytes)?;
        Ok(Box::new(vm))
    }

    fn serves(&self, pooled: &Shape, wanted: &Shape) -> bool {
        let (have, need) = (
            VmSize::for_limits(&pooled.limits),
            VmSize::for_limits(&wanted.limits),
        );
        need.ram_mib <= have.ram_mib
            && need.vcpus <= have.vcpus
            && wanted.limits.disk_bytes == pooled.limits.disk_bytes
            && wanted.rootfs == pooled.rootfs
            && wanted.image == pooled.image
    }
}

impl airlock_backend::Sandbox for BootedVm {
    fn isolation(&self) -> airlock_spec::Isolation {
        airlock_spec::Isolation::Microvm
    }

    fn id(&self) -> &str {
        BootedVm::id(self)
    }

    fn setup_time(&self) -> Duration {
        self.boot_time()
    }

    fn exec(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, Error> {
        Ok(BootedVm::exec(self, spec, sink, cancel)?)
    }

    fn exec_once(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, Error> {
        Ok(self.run(spec, sink, cancel)?)
    }

    /// Builds the guest's sandbox unless the VM came prepared, and in proxy mode starts
    /// the relay and the guest's listener, once for the session.
    fn open_session(&mut self, shape: &Shape) -> Result<(), Error> {
        self.ensure_sandbox(&shape.limits)?;
        self.start_mux()?;
        Ok(self.start_egress(&shape.network)?)
    }

    /// The guest runs it beside the execs: see [`BootedVm::spawn`].
    fn spawn(
        &mut self,
        spec: &Spec,
        stdio: airlock_backend::Stdio,
    ) -> Result<airlock_backend::Spawned, Error> {
        Ok(BootedVm::spawn(self, spec, stdio)?)
    }

    /// Connections relayed on the VM's egress port to its sandbox's loopback, once the
    /// session is open.
    fn ports(&self) -> Option<std::sync::Arc<dyn airlock_backend::PortConnector>> {
        BootedVm::ports(self)
    }

    /// A VM's write is bounded by its per-frame timeout rather than cancelled.
    fn write_file(
        &mut self,
        path: &str,
        mode: u32,
        content: &[u8],
        _cancel: &[BorrowedFd<'_>],
    ) -> Result<(), Error> {
        Ok(BootedVm::write_file(self, path, mode, content)?)
    }

    fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>, Error> {
        Ok(BootedVm::read_file(self, path, max_bytes)?)
    }

    fn list_files(&mut self) -> Result<Vec<FileEntry>, Error> {
        Ok(BootedVm::list_files(self)?)
    }

    fn is_alive(&mut self) -> bool {
        self.agent_alive()
    }

    fn egress(&self) -> Option<std::sync::Arc<airlock_egress::Proxy>> {
        BootedVm::egress(self)
    }

    /// QMP's stop: see [`BootedVm::pause`].
    fn pause(&mut self) -> Result<(), Error> {
        Ok(BootedVm::pause(self)?)
    }

    /// QMP's cont, then the guest's clock is set: see [`BootedVm::resume`].
    fn resume(&mut self) -> Result<(), Error> {
        Ok(BootedVm::resume(self)?)
    }

    /// A tar stream made by the guest as it goes (cancel fds are not watched: every
    /// frame is bounded by the request timeout).
    fn export_files(
        &mut self,
        out: &mut dyn std::io::Write,
        _cancel: &[BorrowedFd<'_>],
    ) -> Result<(), Error> {
        Ok(BootedVm::export_files(self, out)?)
    }

    /// Streamed to the guest, which unpacks it as it arrives (cancel fds are not
    /// watched, as for a file's write).
    fn import_files(
        &mut self,
        input: &mut dyn std::io::Read,
        _cancel: &[BorrowedFd<'_>],
    ) -> Result<(), Error> {
        Ok(BootedVm::import_files(self, input)?)
    }

    /// RAM and device state: see [`BootedVm::checkpoint`].
    fn checkpoint(&mut self, dir: &std::path::Path) -> Result<bool, Error> {
        Ok(BootedVm::checkpoint(self, dir)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_backend::{ErrorKind, ImageRoot};

    /// Never prepared: what these tests check is refused before any VM is built.
    fn backend() -> VmBackend {
        VmBackend::new(HostOptions::from_env(), None)
    }

    fn refused_field(err: Error) -> String {
        assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
        let Error::Invalid(e) = err else { unreachable!() };
        e.field
    }

    fn with_image(digest: &str) -> Shape {
        let mut shape = Shape::of(&Spec::new(vec!["true".into()]));
        shape.image = Some(ImageRoot {
            digest: digest.into(),
            root: format!("/nonexistent/roots/{digest}").into(),
        });
        shape
    }

    #[test]
    fn images_run_and_a_vm_of_one_image_serves_only_that_image() {
        let b = backend();
        assert!(b.runs_images());
        let (a, c) = (with_image("sha256:aa"), with_image("sha256:bb"));
        let none = Shape::of(&Spec::new(vec!["true".into()]));
        assert!(b.check_shape(&a).is_ok());
        assert!(b.serves(&a, &a));
        assert!(!b.serves(&a, &c));
        assert!(!b.serves(&a, &none));
        assert!(!b.serves(&none, &a));
    }

    #[test]
    fn an_image_in_the_spec_is_refused_in_a_vm_without_one_and_a_workdir_is_not() {
        let mut spec = Spec::new(vec!["true".into()]);
        spec.workdir = Some("/opt".into());
        assert!(crate::vm::validate(&spec, false).is_ok());
        spec.image = Some("busybox".into());
        let err = crate::vm::validate(&spec, false).unwrap_err();
        assert_eq!(refused_field(err.into()), "image");
        assert!(crate::vm::validate(&spec, true).is_ok());
    }
}
