//! airlock's micro-VM backend: the same sandbox as the namespace backend, inside a
//! virtual machine of its own, so a kernel bug reachable from the sandbox compromises a
//! throwaway guest kernel instead of the host's.
//!
//! - [`image`] builds the guest's boot files from the host and caches them: the
//!   distribution's kernel, an initramfs with the guest agent (`airlock-guest`) as
//!   `/init`, and a read-only squashfs of the host's system directories; and, per OCI
//!   image digest, a read-only squashfs of the image store's prepared tree
//!   ([`image::ImageBuilder::image_drive`]), built once and cached.
//! - [`vmm::Vmm`] is the one interface a monitor implements; [`qemu::Qemu`] drives QEMU's
//!   `microvm` machine (QMP for control, no network device, its own seccomp sandbox,
//!   unprivileged, in its own cgroup).
//! - [`MicroVmHost`] prepares all that once; [`MicroVmHost::boot`] starts a VM and
//!   waits for its agent; [`MicroVmHost::clone_vm`] restores one from a template VM of
//!   that size instead (booted once and saved; its RAM mapped copy-on-write: a tenth of
//!   a boot), with its own random state and clock; [`BootedVm::run`] hands it one
//!   program and returns the same `ExecResult` as the namespace backend, or
//!   [`BootedVm::exec`] runs any number of a session's programs in it, one after the
//!   other, keeping /workspace and /tmp between them. Inside, the agent runs the program with
//!   airlock-sandbox's engine: namespaces, seccomp, landlock and a cgroup v2 of the
//!   guest's, which is where `memory_peak_bytes`, `cpu_ms` and `oom` come from.
//! - A VM of an image ([`MicroVmHost::boot_image`], [`MicroVmHost::clone_image`]) carries
//!   the image's squashfs as a second read-only drive; the guest mounts it and its
//!   sandbox has it as its whole root (the engine's image mode: nothing of the guest's
//!   system directories), with the same identity files, uid 1000 and scratch
//!   /workspace and /tmp as on the host. Its templates are the image's own: a clone of
//!   one image never serves another.
//! - A session's VM also runs programs beside its execs ([`BootedVm::spawn`]: background
//!   processes, terminals), which the guest keeps in a pid namespace and a cgroup of their
//!   own so that no exec's end kills them, and opens connections to TCP ports its
//!   programs listen on ([`BootedVm::ports`]); their bytes cross the VM's second port as
//!   host socketpairs' other ends.
//! - A VM can be paused and resumed ([`BootedVm::pause`]: its CPUs and clock stand still,
//!   requests are refused until it resumes, then its clock is set), and saved whole
//!   while it runs ([`BootedVm::checkpoint`]: RAM and device state in a directory);
//!   [`MicroVmHost::restore`] starts any number of VMs from such a snapshot (a fork),
//!   each running on with the snapshot's processes and memory, their unchanged RAM
//!   shared. Every exec's result lists the files it created, changed and deleted, and
//!   the sandbox's writable filesystem goes out and comes back as a tar stream
//!   ([`BootedVm::export_files`], [`BootedVm::import_files`]).
//! - The frame protocol both sides speak over the VM's virtio-serial port, and the
//!   framing of its second port, which carries a proxy-mode program's connections to the
//!   egress proxy served on the host (the VM has no network device) and the streams the
//!   host opens, live in the `airlock-vmwire` crate, which the guest agent shares.
//!
//! ```no_run
//! use airlock_microvm::{HostOptions, MicroVmHost, VmSize};
//! use airlock_spec::Spec;
//!
//! let host = MicroVmHost::new(&HostOptions::from_env())?;
//! let spec = Spec::new(vec!["python3".into(), "-c".into(), "print(6*7)".into()]);
//! // Boot and run are separate: a pool keeps booted VMs and gives each one run.
//! let mut vm = host.boot(VmSize::for_limits(&spec.limits))?;
//! vm.prepare(&spec.limits)?; // optional: build the guest's sandbox ahead as well
//! let result = vm.run(&spec, &mut airlock_sandbox::Capture, &[])?;
//! assert_eq!(result.stdout, "42\n");
//! drop(vm); // kills the VMM, removes its cgroup and state directory
//! # Ok::<(), airlock_microvm::VmError>(())
//! ```
#![deny(missing_docs)]

pub mod accel;
mod backend;
pub mod cpio;
pub mod doctor;
pub mod image;
pub mod kmod;
pub mod qemu;
pub mod qmp;
mod sys;
mod vm;
pub mod vmm;

pub use backend::{VM_OVERHEAD_BYTES, VmBackend};
pub use vm::{BootedVm, HostOptions, MicroVmHost, VMM_UID_BASE, VMM_UID_SLOTS, VmSize};
pub use vmm::Accel;

/// Why a micro-VM run could not happen. A program that fails is an `ExecResult`.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// The request is invalid.
    #[error("invalid request: {0}")]
    Spec(airlock_spec::SpecError),
    /// The host cannot run micro-VMs.
    #[error("{0}")]
    Host(String),
    /// Preparing the guest's boot files failed. (Not a `#[source]`: the message already
    /// holds it, and `{:#}` would print it twice.)
    #[error("guest image: {0}")]
    Image(image::ImageError),
    /// Starting the VMM failed.
    #[error("VMM: {0}")]
    Vmm(String),
    /// The VMM's control channel failed.
    #[error("VMM control: {0}")]
    Control(String),
    /// The VM did not boot to its agent.
    #[error("the VM did not boot: {0}")]
    Boot(String),
    /// The guest agent failed or the VM stopped.
    #[error("guest: {0}")]
    Guest(String),
    /// The caller cancelled the run (a one-shot VM was killed; a session's lost only the
    /// exec's processes).
    #[error("cancelled")]
    Cancelled,
    /// The guest agent refused a request, with the kind of failure it reported (a bad or
    /// missing path; its sandbox gone); the VM is still usable unless the kind is `gone`.
    #[error("{0}")]
    Agent(airlock_backend::Error),
    /// A file does not fit the disk of the VM's sandbox (nothing of it was left behind;
    /// the VM is still usable).
    #[error("{0}")]
    DiskFull(airlock_backend::DiskFull),
    /// The VM is gone: it stopped, or was killed because it stopped answering.
    #[error("the VM is gone (it stopped, or was killed because it stopped answering)")]
    Gone,
}

impl From<image::ImageError> for VmError {
    fn from(e: image::ImageError) -> Self {
        VmError::Image(e)
    }
}

impl From<VmError> for airlock_backend::Error {
    fn from(e: VmError) -> Self {
        use airlock_backend::Error;
        use airlock_spec::Isolation::Microvm;
        match e {
            VmError::Spec(e) => Error::Invalid(e),
            VmError::Host(reason) => Error::Unavailable {
                tier: Microvm,
                reason,
            },
            VmError::Image(e) => Error::Unavailable {
                tier: Microvm,
                reason: format!("guest image: {e}"),
            },
            VmError::Cancelled => Error::Cancelled,
            VmError::Agent(e) => e,
            VmError::DiskFull(e) => Error::DiskFull(e),
            e @ VmError::Gone => Error::Gone(e.to_string()),
            e @ (VmError::Vmm(_) | VmError::Control(_) | VmError::Boot(_) | VmError::Guest(_)) => {
                Error::host("the micro-VM", e.to_string())
            }
        }
    }
}

/// The error the guest agent answered with: its kind and field kept, `what` the host
/// asked for put before its message.
pub(crate) fn agent_error(
    what: Option<&str>,
    kind: airlock_backend::ErrorKind,
    field: Option<String>,
    message: String,
) -> VmError {
    let message = match what {
        Some(what) => format!("{what}: {message}"),
        None => message,
    };
    VmError::Agent(airlock_backend::Error::from_wire(
        kind,
        field,
        message,
        airlock_spec::Isolation::Microvm,
    ))
}
