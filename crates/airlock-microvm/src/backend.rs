//! The micro-VM tier behind airlock's one backend interface: [`VmBackend`] prepares the
//! host once and starts VMs (cloned from templates where that pays), [`BootedVm`] is
//! its sandbox.

use airlock_backend::{Backend, Error, OutputSink, Purpose, Shape};
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
    /// for `prepared`, else the plain one), or a boot when no template can be made.
    fn clone_or_boot(
        host: &MicroVmHost,
        size: VmSize,
        prepared: Option<&Limits>,
    ) -> Result<BootedVm, VmError> {
        match prepared {
            Some(limits) => host.clone_prepared(size, limits),
            None => host.clone_vm(size),
        }
        .or_else(|e| {
            tracing::warn!(error = %e, "micro-VMs: cloning failed; booting instead");
            host.boot(size)
        })
    }
}

impl Backend for VmBackend {
    fn isolation(&self) -> Isolation {
        Isolation::Microvm
    }

    fn overhead_bytes(&self) -> u64 {
        VM_OVERHEAD_BYTES
    }

    fn prepare(&self) -> Result<(), Error> {
        self.host().map(|_| ())
    }

    /// Images are refused ([`Backend::runs_images`] is false): the guest's root is its
    /// image of the host's system directories.
    fn create(&self, shape: &Shape, purpose: Purpose) -> Result<Box<dyn airlock_backend::Sandbox>, Error> {
        self.check_shape(shape)?;
        let host = self.host()?;
        let limits = &shape.limits;
        let size = VmSize::for_limits(limits);
        let template = self.templates.as_ref().filter(|t| VmSize::for_limits(t) == size);
        let vm = match (purpose, template) {
            // A pool's stock: a clone of the template saved with its sandbox built, then
            // warmed up, so its one exec finds the exec path translated.
            (Purpose::Pool { .. }, _) => {
                let mut vm = Self::clone_or_boot(host, size, Some(limits))?;
                vm.warm_up(limits)?;
                vm
            }
            // The pool's prepared template serves any limits with its disk size (the
            // rest are applied per exec).
            (_, Some(t)) => {
                Self::clone_or_boot(host, size, (limits.disk_bytes == t.disk_bytes).then_some(t))?
            }
            (_, None) => host.boot(size)?,
        };
        Ok(Box::new(vm))
    }

    /// A VM serves a program that fits it: no more RAM or CPUs than it has, and the disk
    /// its sandbox was built with (the network is started per exec).
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
        Ok(self.start_egress(&shape.network)?)
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_backend::{Capture, ErrorKind, ImageRoot};

    /// Never prepared: what these tests check is refused before any VM is built.
    fn backend() -> VmBackend {
        VmBackend::new(HostOptions::from_env(), None)
    }

    fn refused_field(err: Error) -> String {
        assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
        let Error::Invalid(e) = err else { unreachable!() };
        e.field
    }

    #[test]
    fn a_shape_with_an_image_is_refused_on_image_never_run_on_the_host_root() {
        let spec = Spec::new(vec!["true".into()]);
        let mut shape = Shape::of(&spec);
        shape.image = Some(ImageRoot {
            digest: "sha256:test".into(),
            root: "/nonexistent/image-root".into(),
        });
        let b = backend();
        assert!(!b.runs_images());
        let err = b.create(&shape, Purpose::OneShot).unwrap_err();
        assert!(err.to_string().contains("microvm"), "{err}");
        assert_eq!(refused_field(err), "image");
        let err = b.run_in(&shape, &spec, &mut Capture, &[]).unwrap_err();
        assert_eq!(refused_field(err), "image");
    }

    #[test]
    fn a_workdir_or_an_image_in_the_spec_is_refused_whatever_tier_it_names() {
        let mut spec = Spec::new(vec!["true".into()]);
        spec.workdir = Some("/opt".into());
        let field = |spec: &Spec| match crate::vm::validate(spec) {
            Err(VmError::Spec(e)) => e.field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(&spec), "workdir");
        spec.workdir = None;
        spec.image = Some("busybox".into());
        assert_eq!(field(&spec), "image");
    }
}
