//! The one interface a virtual machine monitor implements: start a VM from the guest
//! image with the agent's channel attached, and hand back the process. QEMU's `microvm`
//! machine is the implementation today ([`crate::qemu::Qemu`]); Firecracker or Cloud
//! Hypervisor fit the same shape (a kernel, an initramfs, a read-only block device, one
//! byte stream to the agent, one process to kill).

use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use crate::VmError;
use crate::image::GuestImage;

/// How the guest's CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization through /dev/kvm.
    Kvm,
    /// QEMU's software emulation (TCG): slower, works everywhere.
    Tcg,
}

impl Accel {
    /// `kvm` or `tcg`.
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// Everything a VMM needs to start one VM. Prepared by the caller before the fork: the
/// strings and paths here are what the child uses after it.
#[derive(Debug)]
pub struct Launch<'a> {
    /// Kernel, initramfs and rootfs image.
    pub image: &'a GuestImage,
    /// An OCI image's squashfs, attached as a second read-only drive whose serial is
    /// `airlock_vmwire::frame::IMAGE_DRIVE_SERIAL` (the command line then says so).
    pub image_drive: Option<&'a std::path::Path>,
    /// The kernel command line.
    pub cmdline: String,
    /// Guest RAM in MiB.
    pub ram_mib: u64,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Hardware or emulated CPU.
    pub accel: Accel,
    /// The VMM process's stdout and stderr (the guest's serial console goes there too).
    pub console: File,
    /// The unprivileged uid and gid the VMM process runs as from its first instruction.
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// Supplementary groups (the group of /dev/kvm under KVM), else none.
    pub groups: Vec<u32>,
    /// `cgroup.procs` files the process joins before it executes the VMM.
    pub cgroup_procs: Vec<CString>,
    /// The VM's private state directory (owned by root; the VMM does not write it).
    pub state_dir: PathBuf,
    /// Guest RAM in a file of the host's instead of anonymous memory: a template's, or
    /// a clone's copy-on-write view of it. `None`: anonymous RAM (a cold boot).
    pub ram_file: Option<RamFile<'a>>,
    /// The VM starts paused and waits for its device state
    /// ([`VmControl::restore_state`]) instead of booting the kernel.
    pub incoming: bool,
    /// The device state it waits for is [`VmControl::save_devices`]'s (a full snapshot's:
    /// no RAM, no configuration section), not a migration's.
    pub devices_only: bool,
}

/// Guest RAM backed by a file (a memfd) the host passes to the VMM.
#[derive(Debug, Clone, Copy)]
pub struct RamFile<'a> {
    /// The file, exactly `ram_mib` long.
    pub fd: BorrowedFd<'a>,
    /// `true`: the guest writes the file itself (a template being built). `false`: a
    /// private copy-on-write mapping, whose writes stay in the VMM's own memory (a clone).
    pub shared: bool,
}

/// A started VM.
#[derive(Debug)]
pub struct Launched {
    /// The VMM process.
    pub child: Child,
    /// The host's end of the agent's byte stream.
    pub agent: UnixStream,
    /// The host's end of the egress port's byte stream ([`airlock_vmwire::mux`]).
    pub egress: UnixStream,
    /// The VMM's control channel, connected and ready for commands.
    pub control: Box<dyn VmControl>,
}

/// Control of a running VM beyond killing its process.
pub trait VmControl: fmt::Debug + Send {
    /// Asks the VMM which accelerator the guest runs on (`kvm`, `tcg`).
    fn accelerator(&mut self) -> Result<String, VmError>;
    /// Pauses the VM and writes its device state (CPU, devices; not the RAM in a shared
    /// [`RamFile`]) to `to`, within `timeout`. The VM stays paused.
    fn save_state(&mut self, to: BorrowedFd<'_>, timeout: Duration) -> Result<(), VmError>;
    /// Loads the device state a VM started with [`Launch::incoming`] waits for from
    /// `from`, and starts the VM, within `timeout`.
    fn restore_state(&mut self, from: BorrowedFd<'_>, timeout: Duration) -> Result<(), VmError>;
    /// Pauses the guest's CPUs (its clock stops with them); pausing a paused VM does
    /// nothing.
    fn stop(&mut self) -> Result<(), VmError>;
    /// Runs a paused VM again.
    fn cont(&mut self) -> Result<(), VmError>;
    /// Writes the device state of a paused VM (CPU, devices; never RAM) to `to`, which a
    /// VM launched with [`Launch::devices_only`] loads ([`VmControl::restore_state`]).
    /// The VM stays paused.
    fn save_devices(&mut self, to: BorrowedFd<'_>) -> Result<(), VmError>;
    /// Where the guest's RAM (guest physical address 0, the start of its one RAM block)
    /// is mapped in the VMM's address space.
    fn ram_address(&mut self) -> Result<u64, VmError>;
}

/// A virtual machine monitor.
pub trait Vmm: fmt::Debug + Send + Sync {
    /// Its name, for `doctor` and errors (`qemu`).
    fn name(&self) -> &'static str;
    /// Its version string.
    fn version(&self) -> Result<String, VmError>;
    /// A cheap string that changes when the VMM is replaced or upgraded (for caches
    /// keyed by it; running the VMM to ask its version costs tens of milliseconds).
    fn fingerprint(&self) -> String;
    /// Starts a VM. The process is in its cgroup and unprivileged before it executes the
    /// VMM, and dies with the calling thread (PR_SET_PDEATHSIG).
    fn launch(&self, launch: Launch<'_>) -> Result<Launched, VmError>;
}
