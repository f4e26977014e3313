//! The namespace tier behind airlock's one backend interface: [`Engine`] is its
//! [`Backend`], [`Sandbox`] its sandbox.

use airlock_backend::{Backend, Error, OutputSink, Purpose, Shape};
use airlock_spec::{ExecResult, FileEntry, Isolation, Spec};
use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::sandbox::cgroup_limits_of;
use crate::{Engine, Sandbox, SandboxConfig};

/// Sandboxes a pool builds at once. One build keeps a core busy for a few milliseconds;
/// back-to-back requests drain a pool faster than one builder refills it.
const POOL_BUILDERS: usize = 2;

impl SandboxConfig {
    /// The settings a sandbox of `shape` is built with.
    pub fn of_shape(shape: &Shape) -> SandboxConfig {
        SandboxConfig {
            limits: cgroup_limits_of(&shape.limits),
            disk_bytes: shape.limits.disk_bytes,
            rootfs: shape.rootfs.clone(),
            image: shape.image.as_ref().map(|i| i.root.clone()),
            network: shape.network.clone(),
            fixed_layout: false,
            ca_bundle: None,
        }
    }
}

impl Backend for Engine {
    fn isolation(&self) -> Isolation {
        Isolation::Namespaces
    }

    /// Starts the fork server that clones every later sandbox's init
    /// ([`Engine::start_zygote`]).
    fn start_service(&self) -> Result<(), Error> {
        self.keep_spare_cgroups();
        Ok(self.start_zygote()?)
    }

    /// Removes the cgroup directories kept for the next sandboxes.
    fn stop_service(&self) {
        self.release_spare_cgroups();
    }

    /// An image's prepared tree is bound read-only as the sandbox's root (see `mounts`).
    fn runs_images(&self) -> bool {
        true
    }

    fn create(&self, shape: &Shape, purpose: Purpose) -> Result<Box<dyn airlock_backend::Sandbox>, Error> {
        self.check_shape(shape)?;
        let config = SandboxConfig::of_shape(shape);
        let sandbox = match purpose {
            // Nothing waits for it: built on CPU time nothing else wants.
            Purpose::Pool { behind: true } => self.create_ahead(&config)?,
            _ => self.create(&config)?,
        };
        Ok(Box::new(sandbox))
    }

    fn pool_builders(&self) -> usize {
        POOL_BUILDERS
    }
}

impl airlock_backend::Sandbox for Sandbox {
    fn isolation(&self) -> airlock_spec::Isolation {
        airlock_spec::Isolation::Namespaces
    }

    fn id(&self) -> &str {
        Sandbox::id(self)
    }

    fn setup_time(&self) -> Duration {
        Sandbox::setup_time(self)
    }

    fn exec(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, Error> {
        Ok(Sandbox::exec(self, spec, sink, cancel)?)
    }

    fn exec_once(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, Error> {
        Ok(Sandbox::exec_once(self, spec, sink, cancel)?)
    }

    /// A pooled sandbox taken for a session may get files before any exec: this is a
    /// request's work, at an ordinary CPU share from now on.
    fn open_session(&mut self, _shape: &Shape) -> Result<(), Error> {
        Ok(self.leave_background()?)
    }

    fn write_file(
        &mut self,
        path: &str,
        mode: u32,
        content: &[u8],
        cancel: &[BorrowedFd<'_>],
    ) -> Result<(), Error> {
        Ok(self.write_file_cancellable(path, mode, content, cancel)?)
    }

    fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>, Error> {
        Ok(Sandbox::read_file(self, path, max_bytes)?)
    }

    fn list_files(&mut self) -> Result<Vec<FileEntry>, Error> {
        Ok(Sandbox::list_files(self)?)
    }

    fn is_alive(&mut self) -> bool {
        Sandbox::is_alive(self)
    }

    fn enter_background(&mut self) {
        Sandbox::enter_background(self);
    }

    fn egress(&self) -> Option<std::sync::Arc<airlock_egress::Proxy>> {
        Sandbox::egress(self)
    }

    /// A program under a keeper of its own (see `keeper`): it survives the session's
    /// execs and counts against the sandbox's limits. Refused while an exec runs.
    fn spawn(
        &mut self,
        spec: &Spec,
        stdio: airlock_backend::Stdio,
    ) -> Result<airlock_backend::Spawned, Error> {
        Ok(Sandbox::spawn(self, spec, stdio)?)
    }

    /// Read from the host through the sandbox's scratch tmpfs (see `scratch`); served
    /// while paused too.
    fn export_files(&mut self, out: &mut dyn std::io::Write, cancel: &[BorrowedFd<'_>]) -> Result<(), Error> {
        Ok(Sandbox::export_files(self, out, cancel)?)
    }

    /// Written from the host into the sandbox's scratch tmpfs, owned by the sandbox user.
    fn import_files(
        &mut self,
        input: &mut dyn std::io::Read,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<(), Error> {
        Ok(Sandbox::import_files(self, input, cancel)?)
    }

    /// The sandbox's cgroup frozen; execs, spawns and file operations are refused
    /// (`invalid`: `sandbox` is paused) until resumed.
    fn pause(&mut self) -> Result<(), Error> {
        Ok(Sandbox::pause(self)?)
    }

    fn resume(&mut self) -> Result<(), Error> {
        Ok(Sandbox::resume(self)?)
    }

    /// Connections made from the host in the sandbox's own network namespace (see
    /// `ports`); in every network mode.
    fn ports(&self) -> Option<std::sync::Arc<dyn airlock_backend::PortConnector>> {
        let ports: std::sync::Arc<dyn airlock_backend::PortConnector> = self.ports_connector().ok()?;
        Some(ports)
    }
}
