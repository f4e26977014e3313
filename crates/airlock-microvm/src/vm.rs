//! The host side of a micro-VM run: [`MicroVmHost`] prepares the guest image and the
//! host (once), [`MicroVmHost::boot`] starts a VM and waits for its agent, and
//! [`BootedVm::run`] hands the booted VM one program. Boot and run are separate so a pool
//! can hold booted VMs and give each one run; the CLI does both at once
//! ([`MicroVmHost::run`]). A session's VM serves any number of programs instead
//! ([`BootedVm::exec`]), with [`BootedVm::write_file`], [`BootedVm::read_file`] and
//! [`BootedVm::list_files`] between them.
//!
//! A VM owns three things on the host, all removed when its [`BootedVm`] is dropped: the
//! VMM process (SIGKILL, reaped), its cgroup (killed and removed: nothing it started
//! survives) and its private state directory `<state>/<owner>/<vm id>` (console log and
//! the VMM's pid). When airlock itself is killed, the VMM dies with it (PR_SET_PDEATHSIG)
//! and the next airlock start purges the cgroup and the state directory
//! ([`MicroVmHost::new`]).

use airlock_sandbox::OutputSink;
use airlock_sandbox::cgroup::{Cgroup, CgroupHost, CgroupLimits};
use airlock_spec::{ExecResult, FileEntry, Isolation, Limits, NetworkPolicy, Outcome, Spec, SpecError};
use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::image::{GuestImage, ImageBuilder, ImageDrive, PrepareTimes};
use crate::qemu::Qemu;
use crate::vmm::{Accel, Launch, RamFile, VmControl, Vmm};
use crate::{VmError, sys};
use airlock_backend::ImageRoot;
use airlock_vmwire::frame::{self as proto, CHUNK, Decoder, GuestInfo, ToGuest, ToHost};

mod egress;
mod snapshot;
mod template;

/// Guest RAM beyond the program's memory limit: the guest kernel, the agent, the sandbox's
/// init and the page cache of the programs read from the rootfs.
const GUEST_OVERHEAD_MIB: u64 = 192;
/// The VMM process's own memory beyond guest RAM (device emulation, QMP, buffers),
/// plus the translated-code cache under TCG.
const VMM_OVERHEAD_MIB: u64 = 128;
/// The VMM's threads: main loop, one per vCPU, RCU, and the block layer's worker pool
/// (up to 64 threads in QEMU).
const VMM_PIDS: u32 = 128;
/// From launch to the agent's `Ready`: a cold boot takes about 1.5 s under TCG on an idle
/// host; this allows for a loaded one.
const BOOT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a request other than exec (create, files) may take in the guest.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The guest enforces the deadline itself and reports; past the deadline plus this, the
/// host stops waiting and kills the VM, and the result is the host's own (the guest's
/// usage counters die with it). Short: a one-shot result comes back within 250 ms of its
/// deadline, and under emulation the guest's kernel can take longer than that to tear
/// down a large process tree (a clone storm took it ≈ 0.7 s).
const DEADLINE_GRACE: Duration = Duration::from_millis(100);
/// The same for an exec of a session, whose VM is worth waiting for longer: killing it
/// loses the session's files. The guest's own engine kills the exec's processes at the
/// deadline, then gives its init a grace of its own to report, all under emulation.
const SESSION_DEADLINE_GRACE: Duration = Duration::from_secs(10);
/// After a cancelled exec of a session, how long the guest has to kill its processes
/// and answer before the VM is killed.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// What an exec's VM is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One program, then the VM is destroyed: at the deadline or a cancel it is killed.
    OneShot,
    /// A session's exec: the VM outlives it, so a deadline or a cancel ends only the
    /// exec's processes (in the guest).
    Session,
}
/// Lines of the guest console shown when a boot fails.
const CONSOLE_TAIL_LINES: usize = 15;
/// First host uid of VMM processes: right after the uid ranges of namespace sandboxes
/// (airlock-sandbox's HOST_UID_BASE + HOST_UID_SLOTS * 65536), so no VMM shares a uid with
/// a sandbox or with another VMM (each VM gets its own).
pub const VMM_UID_BASE: u32 = airlock_sandbox::HOST_UID_BASE + airlock_sandbox::HOST_UID_SLOTS * 65536;
/// Distinct VMM uids handed out round-robin.
pub const VMM_UID_SLOTS: u32 = 65536;
const _: () = assert!(VMM_UID_BASE as u64 + VMM_UID_SLOTS as u64 <= u32::MAX as u64);

/// Where things live and which accelerator to use.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// The image cache (`/var/cache/airlock/microvm`).
    pub cache: PathBuf,
    /// Root of the VMs' private state directories (`/run/airlock/vm`).
    pub state: PathBuf,
    /// The guest agent binary.
    pub agent: PathBuf,
    /// `None`: KVM when it boots a guest here, else TCG.
    pub accel: Option<Accel>,
}

impl HostOptions {
    /// Defaults, overridden by `AIRLOCK_VM_CACHE`, `AIRLOCK_VM_STATE`, `AIRLOCK_GUEST`
    /// and `AIRLOCK_VM_ACCEL` (`kvm`, `tcg`, `auto`).
    pub fn from_env() -> HostOptions {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let agent = default_agent_path();
        let accel = match std::env::var("AIRLOCK_VM_ACCEL").as_deref() {
            Ok("kvm") => Some(Accel::Kvm),
            Ok("tcg") => Some(Accel::Tcg),
            _ => None,
        };
        HostOptions {
            cache: var("AIRLOCK_VM_CACHE").unwrap_or_else(|| "/var/cache/airlock/microvm".into()),
            state: var("AIRLOCK_VM_STATE").unwrap_or_else(|| "/run/airlock/vm".into()),
            agent,
            accel,
        }
    }
}

/// Where the guest agent is looked for when `AIRLOCK_GUEST` is not set, in order:
/// `airlock-guest` next to the running executable (how cargo lays them out), in
/// `<exe dir>/../libexec/airlock/` (an install under a prefix: `make install
/// PREFIX=/usr/local`), then `/usr/libexec/airlock/airlock-guest` (the Debian package).
pub fn agent_search_path() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        paths.push(dir.join("airlock-guest"));
        // The prefix's libexec, named without `..` when the executable is in a `bin`
        // directory (so messages show `/usr/local/libexec/...`).
        let prefix = match dir.file_name() {
            Some(name) if name == "bin" => dir.parent().map_or_else(|| dir.join(".."), Path::to_path_buf),
            _ => dir.join(".."),
        };
        paths.push(prefix.join("libexec/airlock/airlock-guest"));
    }
    let system = PathBuf::from("/usr/libexec/airlock/airlock-guest");
    if !paths.contains(&system) {
        paths.push(system);
    }
    paths
}

/// The guest agent: `AIRLOCK_GUEST` when set, else the first file of
/// [`agent_search_path`]. `Err`: every place looked at, none of which is a file.
pub fn locate_agent() -> Result<PathBuf, Vec<PathBuf>> {
    let candidates = match std::env::var_os("AIRLOCK_GUEST").filter(|v| !v.is_empty()) {
        Some(p) => vec![PathBuf::from(p)],
        None => agent_search_path(),
    };
    match candidates.iter().find(|p| p.is_file()) {
        Some(p) => Ok(p.clone()),
        None => Err(candidates),
    }
}

/// Where the guest agent was looked for, in words, for the error when it is missing
/// (`None` when `agent` is not the path [`locate_agent`] settles on after finding nothing).
pub(crate) fn agent_not_found(agent: &Path) -> Option<String> {
    let looked = locate_agent().err()?;
    if looked.last().map(PathBuf::as_path) != Some(agent) {
        return None;
    }
    let list = looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>();
    Some(format!(
        "not found (looked at {}); install it with `make install` or the Debian package, build it with `cargo build -p airlock-guest`, or set AIRLOCK_GUEST",
        list.join(", ")
    ))
}

/// The agent [`locate_agent`] finds, else the last place it looked (whose absence the
/// image builder then reports with [`agent_not_found`]).
fn default_agent_path() -> PathBuf {
    locate_agent().unwrap_or_else(|looked| looked.last().cloned().unwrap_or_default())
}

/// What a VM is sized for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VmSize {
    /// Guest RAM in MiB.
    pub ram_mib: u64,
    /// Virtual CPUs (and whole host cores the VMM may use).
    pub vcpus: u32,
}

impl VmSize {
    /// A VM large enough for a program with `limits` (the limits themselves are enforced
    /// inside the guest, by its sandbox's cgroup).
    pub fn for_limits(limits: &Limits) -> VmSize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        VmSize {
            ram_mib: limits.memory_bytes.div_ceil(1 << 20) + GUEST_OVERHEAD_MIB,
            vcpus: (limits.cpus.ceil() as u32).clamp(1, cores),
        }
    }
}

/// Prepared once per airlock process: image, VMM, cgroups, accelerator.
#[derive(Debug)]
pub struct MicroVmHost {
    /// The VMM behind every VM.
    vmm: Box<dyn Vmm>,
    /// Boot files.
    image: GuestImage,
    /// Builds (or finds) an OCI image's squashfs in the cache ([`MicroVmHost::image_drive`]).
    builder: ImageBuilder,
    /// Image squashfs builds this host made (not found cached), for the logs and tests.
    image_builds: AtomicU32,
    /// How long preparing them took.
    prepared: PrepareTimes,
    /// cgroups of the VMM processes.
    cgroups: CgroupHost,
    /// `<state>/<owner>`: this process's VMs' state directories.
    state_dir: PathBuf,
    /// The accelerator and why it was chosen.
    accel: Accel,
    accel_reason: String,
    /// The host's TSC frequency, for the guest's command line.
    tsc_khz: u64,
    /// Counter for VMM uids.
    next_uid: AtomicU32,
    /// VMs of dead airlock processes purged at start.
    purged: usize,
    /// Keeps the image files from being removed as stale while this host may boot VMs.
    _cache_use: crate::image::CacheUse,
    /// Owned: the template VMs clones are made from, one per VM size, built on first use
    /// ([`MicroVmHost::clone_vm`]); their memory goes with the host.
    templates: template::Templates,
    /// The sealed RAM files of full snapshots that live VMs were restored from: further
    /// restores of the same snapshot share them.
    snapshots: snapshot::RamCache,
}

impl MicroVmHost {
    /// Checks the host, prepares (or reuses) the guest image and purges what crashed
    /// airlock processes left (VMM processes, cgroups, state directories).
    pub fn new(options: &HostOptions) -> Result<MicroVmHost, VmError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(VmError::Host(
                "micro-VMs need root: the VMM is put in a cgroup and run as an unprivileged uid (try sudo)"
                    .into(),
            ));
        }
        let cgroups = CgroupHost::detect().map_err(|e| VmError::Host(format!("cgroups: {e}")))?;
        let mut purged = cgroups.purge_stale();
        purged += purge_state(&options.state);
        let state_dir = options.state.join(cgroups.owner());
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&state_dir)
            .map_err(|e| VmError::Host(format!("creating {}: {e}", state_dir.display())))?;
        let builder = ImageBuilder {
            cache: options.cache.clone(),
            agent: options.agent.clone(),
            host_root: PathBuf::from("/"),
        };
        let (image, prepared, cache_use) = builder.prepare()?;
        let image_builds = AtomicU32::new(0);
        let vmm: Box<dyn Vmm> = Box::new(Qemu::default());
        let mut host = MicroVmHost {
            vmm,
            image,
            builder,
            image_builds,
            prepared,
            cgroups,
            state_dir,
            accel: Accel::Tcg,
            accel_reason: String::new(),
            tsc_khz: sys::tsc_khz(Duration::from_millis(20)),
            next_uid: AtomicU32::new(sys::getpid() as u32),
            purged,
            _cache_use: cache_use,
            templates: template::Templates::default(),
            snapshots: snapshot::RamCache::default(),
        };
        (host.accel, host.accel_reason) = match options.accel {
            Some(a) => (a, "chosen with AIRLOCK_VM_ACCEL".to_owned()),
            None => {
                let vmm = host.vmm.fingerprint();
                crate::accel::choose(&crate::accel::verdict(&host, &options.cache, &vmm, false))
            }
        };
        Ok(host)
    }

    /// Probes KVM again (ignoring the cached verdict) and returns the verdict, for
    /// `doctor`.
    pub fn probe_kvm(&self, cache: &Path) -> crate::accel::Verdict {
        crate::accel::verdict(self, cache, &self.vmm.fingerprint(), true)
    }

    /// The VMM's name and version.
    pub fn vmm(&self) -> (&'static str, String) {
        (
            self.vmm.name(),
            self.vmm.version().unwrap_or_else(|e| e.to_string()),
        )
    }

    /// The guest's boot files.
    pub fn image(&self) -> &GuestImage {
        &self.image
    }

    /// How long preparing the image took in this process (zeros when it was cached).
    pub fn prepare_times(&self) -> PrepareTimes {
        self.prepared
    }

    /// The accelerator VMs use, and why.
    pub fn accel(&self) -> (Accel, &str) {
        (self.accel, &self.accel_reason)
    }

    /// Host memory this host holds outside any VM: its templates' RAM and device state,
    /// and the RAM files of the snapshots live VMs were restored from (what their VMMs
    /// map shared; the VMs' own copies are theirs).
    pub fn held_bytes(&self) -> u64 {
        self.templates.held_bytes() + self.snapshots.held_bytes()
    }

    /// VMs of dead airlock processes purged when this host started.
    pub fn purged_at_start(&self) -> usize {
        self.purged
    }

    /// The read-only drive of an OCI image's prepared root: its squashfs in the cache,
    /// built on the first use of its digest (by any airlock process), then reused.
    pub fn image_drive(&self, image: &ImageRoot) -> Result<ImageDrive, VmError> {
        let drive = self.builder.image_drive(&image.digest, &image.root)?;
        if let Some(ms) = drive.built_ms {
            self.image_builds.fetch_add(1, Ordering::Relaxed);
            tracing::info!(digest = %image.digest, took_ms = ms, "micro-VMs: image drive built");
        }
        Ok(drive)
    }

    /// How many image drives this host built (rather than found in the cache).
    pub fn image_builds(&self) -> u32 {
        self.image_builds.load(Ordering::Relaxed)
    }

    /// The guest kernel's command line; with `image`, the word that tells the guest its
    /// VM carries an image's drive.
    fn cmdline(&self, accel: Accel, image: bool) -> String {
        // tsc_early_khz: the early TSC calibration is unreliable when emulated (about one
        // boot in eight hangs without it). cryptomgr.notests: the boot-time self-tests of
        // the kernel's crypto algorithms check the implementations, not a security
        // property, and take 0.5 s of an emulated boot. initcall_blacklist: kprobe event
        // tracing (which walks every kernel symbol) and the SP800-108 KDF's self-test,
        // neither of use in the guest, take another 0.2-0.3 s. panic=-1 with the VMM's
        // -no-reboot: a guest that panics ends the VM at once. loglevel=1: only
        // emergencies (a panic) reach the console, whose log lives in the host's /run: a
        // program that makes the guest kernel log (OOM kills, say) cannot grow it.
        let mut c = format!(
            "console=ttyS0 quiet loglevel=1 panic=-1 tsc_early_khz={} tsc=reliable cryptomgr.notests initcall_blacklist=init_kprobe_trace,crypto_kdf108_init",
            self.tsc_khz
        );
        if accel == Accel::Tcg {
            // An emulated CPU does not speculate, so there is nothing for the guest's
            // Spectre/Meltdown mitigations to defend, and page-table isolation is
            // expensive to emulate.
            c.push_str(" mitigations=off");
        }
        if image {
            c.push(' ');
            c.push_str(airlock_vmwire::frame::IMAGE_BOOT_PARAM);
        }
        c
    }

    /// Boots a VM sized `size` and waits until its agent is ready.
    ///
    /// The VMM gets SIGKILL when the *thread* that booted it exits (PR_SET_PDEATHSIG is
    /// per thread), which is what makes a SIGKILLed airlock leave no VM running. A pool
    /// must therefore boot from threads that live as long as the VMs they boot (not, for
    /// example, from tokio's `spawn_blocking` threads, which exit when idle).
    pub fn boot(&self, size: VmSize) -> Result<BootedVm, VmError> {
        self.boot_with(size, self.accel, BOOT_TIMEOUT, None)
    }

    /// Like [`MicroVmHost::boot`], with an OCI image's prepared root as its sandbox's
    /// root (the image's squashfs is built first unless the cache has it): the VM runs
    /// programs of that image only.
    pub fn boot_image(&self, size: VmSize, image: &ImageRoot) -> Result<BootedVm, VmError> {
        let drive = self.image_drive(image)?;
        self.boot_with(size, self.accel, BOOT_TIMEOUT, Some(&drive))
    }

    /// Boots as root with a given accelerator and a short timeout: the KVM probe only.
    pub(crate) fn boot_probe(
        &self,
        size: VmSize,
        accel: Accel,
        timeout: Duration,
    ) -> Result<BootedVm, VmError> {
        boot(BootParams {
            vmm: &*self.vmm,
            image: &self.image,
            image_drive: None,
            cgroups: &self.cgroups,
            state_dir: &self.state_dir,
            cmdline: self.cmdline(accel, false),
            accel,
            size,
            uid: 0,
            timeout,
            ram_file: None,
            restore: None,
        })
    }

    fn boot_with(
        &self,
        size: VmSize,
        accel: Accel,
        timeout: Duration,
        drive: Option<&ImageDrive>,
    ) -> Result<BootedVm, VmError> {
        boot(BootParams {
            vmm: &*self.vmm,
            image: &self.image,
            image_drive: drive,
            cgroups: &self.cgroups,
            state_dir: &self.state_dir,
            cmdline: self.cmdline(accel, drive.is_some()),
            accel,
            size,
            uid: self.vmm_uid(),
            timeout,
            ram_file: None,
            restore: None,
        })
    }

    /// The next VMM uid.
    fn vmm_uid(&self) -> u32 {
        VMM_UID_BASE + self.next_uid.fetch_add(1, Ordering::Relaxed) % VMM_UID_SLOTS
    }

    /// Boots a VM for `spec`, runs it, and destroys the VM. The result's `setup_ms`
    /// includes the boot.
    pub fn run(
        &self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, VmError> {
        validate(spec, false)?;
        let mut vm = self.boot(VmSize::for_limits(&spec.limits))?;
        let mut result = vm.run(spec, sink, cancel)?;
        result.setup_ms = round3(result.setup_ms + vm.boot_time().as_secs_f64() * 1e3);
        Ok(result)
    }
}

impl Drop for MicroVmHost {
    /// Removes this process's state directory once its VMs are gone (each removes its own
    /// on drop; a live VM keeps the directory non-empty and it stays).
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.state_dir);
    }
}

/// Everything `boot` needs.
pub(crate) struct BootParams<'a> {
    pub vmm: &'a dyn Vmm,
    pub image: &'a GuestImage,
    /// An OCI image's drive: the guest's sandbox's root.
    pub image_drive: Option<&'a ImageDrive>,
    pub cgroups: &'a CgroupHost,
    pub state_dir: &'a Path,
    pub cmdline: String,
    pub accel: Accel,
    pub size: VmSize,
    pub uid: u32,
    pub timeout: Duration,
    /// Guest RAM in a file: a template's (shared) or a clone's (private).
    pub ram_file: Option<RamFile<'a>>,
    /// A clone or a full snapshot's restore instead of a boot.
    pub restore: Option<Restore<'a>>,
}

/// What a VM is restored from instead of booted.
#[derive(Clone, Copy)]
pub(crate) enum Restore<'a> {
    /// A template of this host's: its clone.
    Template(&'a template::Template),
    /// A full snapshot ([`BootedVm::checkpoint`]).
    Snapshot(&'a snapshot::Saved),
}

/// A fresh VM id: `vm-` and 16 hex digits from the kernel's random source.
fn new_id() -> Result<String, VmError> {
    let mut bytes = [0u8; 8];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| VmError::Host(format!("/dev/urandom: {e}")))?;
    Ok(format!(
        "vm-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

pub(crate) fn boot(p: BootParams<'_>) -> Result<BootedVm, VmError> {
    let t0 = Instant::now();
    let id = new_id()?;
    let state = p.state_dir.join(&id);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&state)
        .map_err(|e| VmError::Host(format!("creating {}: {e}", state.display())))?;
    // From here on the guard owns the state directory (and later the cgroup and process).
    let mut vm = BootedVm {
        id: id.clone(),
        child: None,
        agent: None,
        control: None,
        cgroup: None,
        state: state.clone(),
        boot: Duration::ZERO,
        info: GuestInfo::default(),
        used: false,
        emulated: p.accel == Accel::Tcg,
        sandbox_disk: None,
        sandbox_setup: Duration::ZERO,
        egress_port: None,
        egress: None,
        mux: None,
        image: p.image_drive.map(|d| d.digest.clone()),
        size: p.size,
        cmdline: p.cmdline.clone(),
        guest_image: snapshot::fingerprint(p.image, p.image_drive),
        paused: false,
        restored_ram: None,
        resync: None,
    };
    let limits = CgroupLimits {
        memory_bytes: (p.size.ram_mib
            + VMM_OVERHEAD_MIB
            + if p.accel == Accel::Tcg {
                crate::qemu::TCG_TB_MIB
            } else {
                0
            })
            << 20,
        cpus: f64::from(p.size.vcpus),
        pids: VMM_PIDS,
    };
    let cgroup = p
        .cgroups
        .create(&id, &limits)
        .map_err(|e| VmError::Host(format!("cgroup for the VM: {e}")))?;
    let procs = cgroup
        .paths()
        .map(|d| CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| VmError::Host(format!("cgroup path: {e}")))?;
    vm.cgroup = Some(cgroup);
    let console_path = state.join("console.log");
    let console = fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .mode(0o600)
        .open(&console_path)
        .map_err(|e| VmError::Host(format!("creating {}: {e}", console_path.display())))?;
    let groups = if p.accel == Accel::Kvm && p.uid != 0 {
        crate::accel::kvm_group().into_iter().collect()
    } else {
        Vec::new()
    };
    let launched = p.vmm.launch(Launch {
        image: p.image,
        image_drive: p.image_drive.map(|d| d.path.as_path()),
        cmdline: p.cmdline,
        ram_mib: p.size.ram_mib,
        vcpus: p.size.vcpus,
        accel: p.accel,
        console,
        uid: p.uid,
        gid: p.uid,
        groups,
        cgroup_procs: procs,
        state_dir: state.clone(),
        ram_file: p.ram_file,
        incoming: p.restore.is_some(),
        devices_only: matches!(p.restore, Some(Restore::Snapshot(_))),
    })?;
    let pid = launched.child.id();
    vm.child = Some(launched.child);
    vm.control = Some(launched.control);
    vm.egress_port = Some(launched.egress);
    let _ = fs::write(
        state.join("pid"),
        format!("{pid} {}\n", start_time(pid).unwrap_or(0)),
    );
    let agent = launched.agent;
    agent
        .set_nonblocking(true)
        .map_err(|e| VmError::Host(format!("agent socket: {e}")))?;
    vm.agent = Some(Channel {
        stream: agent,
        decoder: Decoder::default(),
    });

    let deadline = t0 + p.timeout;
    match p.restore {
        Some(Restore::Template(template)) => {
            template.resume(&mut vm, deadline)?;
            vm.boot = t0.elapsed();
            return Ok(vm);
        }
        Some(Restore::Snapshot(saved)) => {
            saved.resume(&mut vm, deadline)?;
            vm.boot = t0.elapsed();
            return Ok(vm);
        }
        None => {}
    }
    match vm.channel()?.recv(deadline, &[]) {
        Ok(frame) => match frame.msg {
            ToHost::Ready(info) => vm.info = info,
            other => return Err(vm.boot_failed(&format!("unexpected first message {other:?}"))),
        },
        Err(Recv::Timeout) => return Err(vm.boot_failed(&format!("no agent after {:?}", p.timeout))),
        Err(Recv::Closed) => return Err(vm.boot_failed("the VM stopped while booting")),
        Err(Recv::Cancelled) => unreachable!("no cancel fds"),
        Err(Recv::Failed(e)) => return Err(vm.boot_failed(&e.to_string())),
    }
    vm.boot = t0.elapsed();
    Ok(vm)
}

/// The host's end of the agent's port, with its frame reassembly.
#[derive(Debug)]
struct Channel {
    stream: UnixStream,
    decoder: Decoder,
}

/// Why no frame was received.
#[derive(Debug)]
enum Recv {
    Timeout,
    Closed,
    Cancelled,
    Failed(VmError),
}

impl Channel {
    /// Sends one frame. The guest drains its port continuously; one that stops reading
    /// for [`REQUEST_TIMEOUT`] is given up on.
    fn send(&mut self, msg: &impl serde::Serialize, payload: &[u8]) -> Result<(), VmError> {
        let mut buf = Vec::new();
        proto::write(&mut buf, msg, payload).map_err(|e| VmError::Guest(e.to_string()))?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let mut off = 0;
        while off < buf.len() {
            match self.stream.write(&buf[off..]) {
                Ok(0) => return Err(VmError::Guest("the VM closed its port".into())),
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(VmError::Guest("the guest stopped reading its port".into()));
                    }
                    let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLOUT)];
                    let ms = left.as_millis().clamp(1, 1000) as u16;
                    let _ = poll(&mut fds, PollTimeout::from(ms));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(VmError::Guest(format!("writing to the VM: {e}"))),
            }
        }
        Ok(())
    }

    /// The next frame, waiting until `deadline`; returns early when a `cancel` fd is
    /// readable.
    fn recv(&mut self, deadline: Instant, cancel: &[BorrowedFd<'_>]) -> Result<proto::Frame<ToHost>, Recv> {
        let mut buf = vec![0u8; CHUNK + 4096];
        loop {
            match self.decoder.next_frame::<ToHost>() {
                Ok(Some(frame)) => return Ok(frame),
                Ok(None) => {}
                Err(e) => return Err(Recv::Failed(VmError::Guest(e.to_string()))),
            }
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(Recv::Closed),
                Ok(n) => {
                    self.decoder.push(&buf[..n]);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Recv::Failed(VmError::Guest(format!("reading from the VM: {e}")))),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Recv::Timeout);
            }
            let mut fds = vec![PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
            fds.extend(cancel.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)));
            let ms = left.as_millis().min(60_000) as u16;
            match poll(&mut fds, PollTimeout::from(ms.max(1))) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(Recv::Failed(VmError::Guest(format!("poll: {e}")))),
            }
            if fds[1..].iter().any(|f| f.any().unwrap_or(false)) {
                return Err(Recv::Cancelled);
            }
        }
    }
}

/// A booted VM whose agent waits for requests. Dropping it kills the VMM, removes its
/// cgroup and its state directory.
#[derive(Debug)]
pub struct BootedVm {
    /// `vm-<hex>`: names the cgroup and the state directory.
    id: String,
    /// Owned: the VMM process; killed and reaped on drop.
    child: Option<Child>,
    /// Owned: the agent's channel.
    agent: Option<Channel>,
    /// Owned: the VMM's control channel (QMP).
    control: Option<Box<dyn VmControl>>,
    /// Owned: the VMM's cgroup; destroyed on drop, after the process is reaped.
    cgroup: Option<Cgroup>,
    /// Owned: the private state directory; removed on drop.
    state: PathBuf,
    /// From launch to the agent's `Ready`.
    boot: Duration,
    /// What the guest reported at start.
    info: GuestInfo,
    /// Whether a program has run (`run` refuses a VM that ran one; `exec` does not).
    used: bool,
    /// Emulated in software (TCG): the guest's sandbox runs programs with a fixed
    /// address-space layout, so that the translation of the loader and libc made for one
    /// exec ([`BootedVm::warm_up`]) serves the next.
    emulated: bool,
    /// The disk size the guest's sandbox was built with, once it exists.
    sandbox_disk: Option<u64>,
    /// How long building the guest's sandbox took.
    sandbox_setup: Duration,
    /// Owned: the host's end of the egress port, until the relay (`mux`) takes it.
    egress_port: Option<UnixStream>,
    /// Owned: in proxy mode, the proxy serving the program's connections (on `mux`).
    egress: Option<egress::EgressRelay>,
    /// Owned: the relay of the egress port, once a session or proxy mode started it;
    /// stopped on drop.
    mux: Option<egress::MuxRelay>,
    /// The digest of the OCI image whose root the guest's sandbox has, when the VM
    /// carries one (fixed at boot: its drive and the guest's mount).
    image: Option<String>,
    /// Its RAM and CPUs.
    size: VmSize,
    /// Its kernel's command line (a snapshot's restore is launched with the same).
    cmdline: String,
    /// The identity of its boot files and image drive (a snapshot records it).
    guest_image: String,
    /// Paused ([`BootedVm::pause`]): its CPUs stand still, and every request but
    /// `resume`, `checkpoint` and the purge is refused.
    paused: bool,
    /// Owned (shared with the host's cache and other restores of the same snapshot): the
    /// sealed RAM file it was restored from, if it was.
    restored_ram: Option<std::sync::Arc<fs::File>>,
    /// Restored from a snapshot: how its egress port's relay starts over, until started.
    resync: Option<egress::Resync>,
}

impl BootedVm {
    /// The VM's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// How long the boot took, from launch to the agent's `Ready`.
    pub fn boot_time(&self) -> Duration {
        self.boot
    }

    /// The digest of the OCI image this VM's sandbox has as its root, if any.
    pub fn image_digest(&self) -> Option<&str> {
        self.image.as_deref()
    }

    /// What the guest reported at start.
    pub fn guest_info(&self) -> &GuestInfo {
        &self.info
    }

    /// The VMM process's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the VM still answers: its agent's channel is open and the VMM has not
    /// exited (a VM killed for not answering, or that stopped, runs nothing more).
    pub fn agent_alive(&mut self) -> bool {
        self.agent.is_some()
            && self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// How long building the guest's sandbox took (zero until it exists).
    pub fn sandbox_setup_time(&self) -> Duration {
        self.sandbox_setup
    }

    /// Asks the VMM which accelerator the guest runs on.
    pub fn accelerator(&mut self) -> Result<String, VmError> {
        match self.control.as_mut() {
            Some(c) => c.accelerator(),
            None => Err(VmError::Control("no control channel".into())),
        }
    }

    fn channel(&mut self) -> Result<&mut Channel, VmError> {
        self.agent.as_mut().ok_or(VmError::Gone)
    }

    /// Sends one frame; a VM that does not take it is killed (a frame half sent leaves
    /// the channel unusable).
    fn send(&mut self, msg: &impl serde::Serialize, payload: &[u8]) -> Result<(), VmError> {
        self.check_running()?;
        let sent = self.channel()?.send(msg, payload);
        if sent.is_err() {
            self.kill();
        }
        sent
    }

    /// Waits for `Ok` (or the guest's error) to a request.
    fn expect_ok(&mut self, what: &str) -> Result<(), VmError> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        match self.channel()?.recv(deadline, &[]) {
            Ok(f) => match f.msg {
                ToHost::Ok => Ok(()),
                ToHost::Error { kind, field, message } => {
                    Err(crate::agent_error(Some(what), kind, field, message))
                }
                other => Err(self.desync(what, &other)),
            },
            Err(e) => Err(self.lost(what, e)),
        }
    }

    /// The error for a channel that failed during `what`. Unless the caller cancelled,
    /// the VM is killed: one that stopped answering, or whose answer may still come,
    /// cannot serve another request.
    fn lost(&mut self, what: &str, e: Recv) -> VmError {
        let err = match e {
            Recv::Failed(e) => e,
            Recv::Timeout => VmError::Guest(format!("{what}: the guest did not answer")),
            Recv::Cancelled => return VmError::Cancelled,
            Recv::Closed => VmError::Guest(format!(
                "{what}: the VM stopped{}",
                console_tail(&self.state.join("console.log"))
            )),
        };
        self.kill();
        err
    }

    /// The error for an answer that does not fit the request: the two sides disagree
    /// on where they are, so the VM is killed.
    fn desync(&mut self, what: &str, got: &ToHost) -> VmError {
        self.kill();
        VmError::Guest(format!("{what}: unexpected reply {got:?}"))
    }

    /// Builds the guest's sandbox now, ahead of the run: what a pool does while the VM
    /// waits, so a request pays only for its files and its program. The run's memory,
    /// CPU and pids limits are applied when it starts; its disk size must be
    /// `limits.disk_bytes` (the sandbox's tmpfs is sized once).
    pub fn prepare(&mut self, limits: &Limits) -> Result<(), VmError> {
        if self.sandbox_disk.is_some() || self.used {
            return Err(VmError::Guest("this VM's sandbox already exists".into()));
        }
        self.create_sandbox(limits)
    }

    /// Makes sure the guest's sandbox exists with `limits.disk_bytes` of disk: builds
    /// it unless [`BootedVm::prepare`] did. A session starts with this, so files can be
    /// written before its first exec.
    pub fn ensure_sandbox(&mut self, limits: &Limits) -> Result<(), VmError> {
        match self.sandbox_disk {
            Some(disk) if disk != limits.disk_bytes => Err(VmError::Guest(format!(
                "this VM's sandbox was built with a {disk}-byte disk, the run asks for {}",
                limits.disk_bytes
            ))),
            Some(_) => Ok(()),
            None => self.create_sandbox(limits),
        }
    }

    fn create_sandbox(&mut self, limits: &Limits) -> Result<(), VmError> {
        let t = Instant::now();
        self.send(
            &ToGuest::Create {
                limits: limits.clone(),
                fixed_layout: self.emulated,
            },
            &[],
        )?;
        self.expect_ok("creating the sandbox")?;
        self.sandbox_disk = Some(limits.disk_bytes);
        self.sandbox_setup = t.elapsed();
        Ok(())
    }

    /// Runs `spec`'s program in this VM and returns its result; output within the limit
    /// also goes to `sink` as it arrives. The guest runs it in the namespace sandbox under
    /// its own cgroup; past the deadline (plus a grace for the guest's report) the VM is
    /// killed from outside. When a `cancel` fd becomes readable the VM is killed and
    /// [`VmError::Cancelled`] returned. A VM runs one program: a second call fails (see
    /// [`BootedVm::exec`] for a VM that serves a session).
    pub fn run(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, VmError> {
        validate(spec, self.image.is_some())?;
        self.check_running()?;
        let t0 = Instant::now();
        self.ensure_sandbox(&spec.limits)?;
        if std::mem::replace(&mut self.used, true) {
            return Err(VmError::Guest("this VM already ran a program".into()));
        }
        self.exec_inner(spec, sink, cancel, Mode::OneShot, t0)
    }

    /// Runs `/bin/true` once in the guest's sandbox, as a session exec, and leaves the VM
    /// as fresh for [`BootedVm::run`] as before: the exec path (the agent's, init's, the
    /// guest kernel's exec, program loading and exit) is then translated already when a
    /// clone emulated in software runs its one program. A clone's translation cache
    /// starts empty: without this, that first exec translates all of it, for hundreds of
    /// milliseconds. An image may have no /bin/true: its VM accepts "not found" (127),
    /// which went through the same path up to the exec.
    pub fn warm_up(&mut self, limits: &Limits) -> Result<(), VmError> {
        if self.used {
            return Err(VmError::Guest("this VM already ran a program".into()));
        }
        let mut spec = Spec::new(vec!["/bin/true".into()]);
        spec.limits = limits.clone();
        let result = self.exec(&spec, &mut airlock_sandbox::Capture, &[])?;
        let fine = match self.image {
            None => result.exit_code == Some(0),
            Some(_) => matches!(result.exit_code, Some(0 | 127)),
        };
        if !fine {
            return Err(VmError::Guest(format!(
                "warming up: /bin/true ended {:?}",
                result.outcome
            )));
        }
        self.used = false;
        Ok(())
    }

    /// Runs `spec`'s program in this VM's sandbox as one exec of a session: any number
    /// of them, one after the other, share the sandbox's /workspace and /tmp. When the
    /// program ends, the guest kills every process it started; at its deadline the guest
    /// kills them and reports a timeout, and the VM stays usable. When a `cancel` fd
    /// becomes readable the guest is told to kill the exec's processes and
    /// [`VmError::Cancelled`] is returned; the VM stays usable. A VM that does not report
    /// within a grace past the deadline, or after a cancel, is killed whole: from then
    /// on every call fails with [`VmError::Gone`]. Builds the sandbox first unless it
    /// exists (its disk size must be `spec.limits.disk_bytes`).
    pub fn exec(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, VmError> {
        validate(spec, self.image.is_some())?;
        self.check_running()?;
        let t0 = Instant::now();
        self.ensure_sandbox(&spec.limits)?;
        self.used = true;
        self.exec_inner(spec, sink, cancel, Mode::Session, t0)
    }

    /// Files, stdin, the exec and its answer; `t0` is when the caller started (what it
    /// waited for since, until the program starts, is the result's setup).
    fn exec_inner(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
        mode: Mode,
        t0: Instant,
    ) -> Result<ExecResult, VmError> {
        self.start_egress(&spec.network)?;
        for file in &spec.files {
            self.write_file(&file.path, file.mode, &file.content)?;
        }
        for chunk in spec.stdin.chunks(CHUNK) {
            self.send(&ToGuest::Stdin, chunk)?;
        }
        if !spec.files_changed_in.is_empty() && self.info.mux_version >= 4 {
            let roots = spec.files_changed_in.clone();
            self.send(&airlock_vmwire::frame::ToVmGuest::ChangesIn { roots }, &[])?;
        }
        let exec = ToGuest::Exec {
            command: spec.command.clone(),
            env: spec.env.clone(),
            limits: spec.limits.clone(),
            workdir: spec.workdir.clone(),
        };
        self.send(&exec, &[])?;
        // What this call waited for before the program: the sandbox (unless prepared
        // ahead), files and stdin. A cold run adds the boot ([`MicroVmHost::run`]).
        let setup = t0.elapsed();
        let started = Instant::now();
        let grace = match mode {
            Mode::OneShot => DEADLINE_GRACE,
            Mode::Session => SESSION_DEADLINE_GRACE,
        };
        let deadline = started + Duration::from_millis(spec.limits.timeout_ms) + grace;
        // The guest caps output, and so does the host: a guest that misbehaves (or is
        // taken over) cannot make airlock hold more than the limit.
        let limit = usize::try_from(spec.limits.output_bytes).unwrap_or(usize::MAX);
        let (mut out, mut err) = (Capped::new(limit), Capped::new(limit));
        let mut cancelled = false;
        loop {
            // Once cancelled, only the guest's answer is awaited, for a short while.
            let (until, watch) = if cancelled {
                (deadline.min(Instant::now() + CANCEL_GRACE), &[][..])
            } else {
                (deadline, cancel)
            };
            let frame = match self.channel()?.recv(until, watch) {
                Ok(f) => f,
                Err(Recv::Timeout) if cancelled => {
                    self.kill();
                    return Err(VmError::Cancelled);
                }
                Err(Recv::Timeout) => {
                    self.kill();
                    let mut result = self.host_result(Outcome::Timeout, out, err, started, setup);
                    result.egress = self.take_egress();
                    return Ok(result);
                }
                Err(Recv::Cancelled) if mode == Mode::Session => {
                    // The guest notices the frame (its port turns readable), kills the
                    // exec's processes and answers; the frame is read after.
                    self.send(&ToGuest::Cancel, &[])?;
                    cancelled = true;
                    continue;
                }
                Err(Recv::Cancelled) => {
                    self.kill();
                    return Err(VmError::Cancelled);
                }
                Err(Recv::Closed) if self.vm_oom_killed() => {
                    self.kill();
                    return Ok(self.host_result(Outcome::Oom, out, err, started, setup));
                }
                Err(e) => return Err(self.lost("running the program", e)),
            };
            match frame.msg {
                ToHost::Stdout if !cancelled => sink.stdout(out.take(&frame.payload)),
                ToHost::Stderr if !cancelled => sink.stderr(err.take(&frame.payload)),
                ToHost::Stdout | ToHost::Stderr => {}
                ToHost::Exited { .. } | ToHost::Error { .. } if cancelled => return Err(VmError::Cancelled),
                ToHost::Exited { result } => {
                    let mut result = *result;
                    result.id = self.id.clone();
                    // The guest's sandbox is a namespace one: the tier is the VM.
                    result.isolation = Isolation::Microvm;
                    result.platform = Some(self.accel_name().to_owned());
                    result.stdout_truncated |= out.cut;
                    result.stderr_truncated |= err.cut;
                    result.stdout = String::from_utf8_lossy(&out.kept).into_owned();
                    result.stderr = String::from_utf8_lossy(&err.kept).into_owned();
                    result.setup_ms = round3(result.setup_ms + setup.as_secs_f64() * 1e3);
                    result.egress = self.take_egress();
                    return Ok(result);
                }
                ToHost::Error { kind, field, message } => {
                    return Err(crate::agent_error(None, kind, field, message));
                }
                other => return Err(self.desync("running the program", &other)),
            }
        }
    }

    /// Proxy mode: starts the relay of the egress port with the policy of `network` and
    /// has the guest serve the proxy's ports (127.0.0.1:3128 explicit, :3129 transparent,
    /// :53 the resolver's, see [`airlock_vmwire::mux`]) in its sandbox, which must
    /// exist ([`BootedVm::ensure_sandbox`]); nothing to do for mode `none`, or when the
    /// relay runs already. A run or exec in proxy mode does this itself; a session starts
    /// it at creation, and every later exec, whatever its own `network`, goes through
    /// the proxy and gets its egress log. A VM serves one policy: another is refused.
    pub fn start_egress(&mut self, network: &NetworkPolicy) -> Result<(), VmError> {
        let NetworkPolicy::Proxy(proxy_policy) = network else {
            return Ok(());
        };
        if let Some(relay) = &self.egress {
            if relay.network() != network {
                return Err(VmError::Spec(SpecError::new(
                    "network",
                    "differs from the network policy this VM's proxy serves",
                )));
            }
            return Ok(());
        }
        let proxy = airlock_egress::Proxy::for_sandbox(
            proxy_policy,
            airlock_egress::ProxyLimits::default(),
            std::sync::Arc::new(airlock_egress::SystemResolver),
        )
        .map_err(|e| match e {
            airlock_egress::SetupError::Policy(e) => VmError::Spec(SpecError::new(e.field, e.message)),
            airlock_egress::SetupError::Mitm(e) => {
                VmError::Host(format!("preparing the interception of secrets: {e}"))
            }
        })?;
        // What the guest's programs get: the proxy's variables, the secrets' placeholders
        // and the trust bundle (the guest installs it read-only in the sandbox).
        let setup = airlock_vmwire::EgressSetup {
            env: proxy.sandbox_env_at(airlock_vmwire::GUEST_CA_BUNDLE),
            ca_bundle: proxy.ca_bundle_pem(),
        };
        let setup = serde_json::to_vec(&setup)
            .map_err(|e| VmError::Host(format!("encoding the egress setup: {e}")))?;
        // An agent that cannot carry redirected connections and DNS would leave them
        // without a way out rather than police them: refused with the reason.
        let wire = airlock_vmwire::mux::MUX_VERSION;
        if self.info.mux_version < wire {
            return Err(VmError::Guest(format!(
                "the guest agent speaks version {} of the egress port, proxy mode needs {wire}: rebuild airlock-guest with this airlock",
                self.info.mux_version
            )));
        }
        let mux = self.mux()?;
        self.egress = Some(egress::EgressRelay::start(proxy, network.clone(), mux));
        self.send(&ToGuest::Egress, &setup)?;
        self.expect_ok("starting the egress proxy")
    }

    /// The relay of the egress port, started on first use.
    fn mux(&mut self) -> Result<&egress::MuxRelay, VmError> {
        if self.mux.is_none() {
            let port = self.egress_port.take().ok_or(VmError::Gone)?;
            let resync = self.resync.take();
            self.mux = Some(egress::MuxRelay::start(port, &self.id, resync)?);
        }
        self.mux.as_ref().ok_or(VmError::Gone)
    }

    /// Starts the relay of the egress port, for what a session opens on it: spawned
    /// programs' stdio, connections to its ports.
    pub fn start_mux(&mut self) -> Result<(), VmError> {
        self.mux().map(drop)
    }

    /// What opens connections to TCP ports in this VM's sandbox, once the relay runs
    /// ([`BootedVm::start_mux`]).
    pub fn ports(&self) -> Option<std::sync::Arc<dyn airlock_backend::PortConnector>> {
        if self.info.mux_version < 3 {
            return None;
        }
        let ports = self.mux.as_ref()?.ports();
        Some(std::sync::Arc::new(ports))
    }

    /// Starts `spec`'s program alongside the session's execs (see
    /// [`airlock_backend::Sandbox::spawn`]): the guest runs it in its sandbox's
    /// namespaces (a pid namespace and a cgroup of its own beside the execs'), its stdio
    /// relayed on the egress port to host socketpairs whose other ends are returned.
    pub fn spawn(
        &mut self,
        spec: &Spec,
        stdio: airlock_backend::Stdio,
    ) -> Result<airlock_backend::Spawned, VmError> {
        use std::os::fd::OwnedFd;
        self.check_running()?;
        validate(spec, self.image.is_some())?;
        if self.sandbox_disk.is_none() {
            return Err(VmError::Guest(
                "no sandbox in this VM: open the session first".into(),
            ));
        }
        if self.info.mux_version < 3 {
            return Err(VmError::Host(format!(
                "the guest agent speaks version {} of the egress port, spawning needs 3: rebuild airlock-guest with this airlock",
                self.info.mux_version
            )));
        }
        let host_err = |e: io::Error| VmError::Host(format!("a socketpair: {e}"));
        let mux = self.mux()?;
        let process = mux.next_id();
        let mut streams = Vec::new();
        let mut ends = Vec::new();
        let terminal = match stdio {
            airlock_backend::Stdio::Pipes => {
                for _ in 0..3 {
                    let (caller, relayed) = UnixStream::pair().map_err(host_err)?;
                    let id = mux.next_id();
                    mux.attach(id, relayed)?;
                    streams.push(id);
                    ends.push(OwnedFd::from(caller));
                }
                None
            }
            airlock_backend::Stdio::Terminal { rows, cols } => {
                if rows == 0 || cols == 0 {
                    return Err(VmError::Spec(SpecError::new(
                        "rows",
                        "a terminal has at least one row and column",
                    )));
                }
                let (caller, relayed) = UnixStream::pair().map_err(host_err)?;
                let id = mux.next_id();
                mux.attach(id, relayed)?;
                streams.push(id);
                let input = caller.try_clone().map_err(host_err)?;
                ends.push(OwnedFd::from(input));
                ends.push(OwnedFd::from(caller));
                Some((rows, cols))
            }
        };
        let slot = mux.process(process)?;
        let sender = mux.sender();
        let request = airlock_vmwire::frame::ToVmGuest::Spawn {
            command: spec.command.clone(),
            env: spec.env.clone(),
            workdir: spec.workdir.clone(),
            terminal,
            process,
            streams,
        };
        self.send(&request, &[])?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let pid = match self.channel()?.recv(deadline, &[]) {
            Ok(f) => match f.msg {
                ToHost::Spawned { pid } => pid,
                ToHost::Error { kind, field, message } => {
                    return Err(crate::agent_error(
                        Some("spawning a program"),
                        kind,
                        field,
                        message,
                    ));
                }
                other => return Err(self.desync("spawning a program", &other)),
            },
            Err(e) => return Err(self.lost("spawning a program", e)),
        };
        let mut ends = ends.into_iter();
        let (Some(stdin), Some(stdout)) = (ends.next(), ends.next()) else {
            return Err(VmError::Host("the program's stdio".into()));
        };
        Ok(airlock_backend::Spawned {
            stdin,
            stdout,
            stderr: ends.next(),
            handle: Box::new(egress::VmProcess::new(
                process,
                pid,
                terminal.is_some(),
                sender,
                slot,
            )),
        })
    }

    /// Proxy mode's egress proxy, once started.
    pub fn egress(&self) -> Option<std::sync::Arc<airlock_egress::Proxy>> {
        self.egress.as_ref().map(|r| std::sync::Arc::clone(r.proxy()))
    }

    /// The egress log of the exec that just ended (empty without a proxy).
    fn take_egress(&mut self) -> Vec<airlock_spec::EgressEntry> {
        self.egress
            .as_mut()
            .map(egress::EgressRelay::take_new)
            .unwrap_or_default()
    }

    /// Writes (creates or replaces) a file under the guest's /workspace, owned by the
    /// sandbox user. The sandbox must exist ([`BootedVm::ensure_sandbox`]).
    /// A file that does not fit the disk is [`VmError::DiskFull`]: refused unsent when it
    /// is larger than the whole disk, else when the disk fills up (the guest removes what
    /// it wrote); the VM stays usable either way.
    pub fn write_file(&mut self, path: &str, mode: u32, content: &[u8]) -> Result<(), VmError> {
        self.check_running()?;
        let disk_bytes = self.sandbox_disk.unwrap_or(0);
        let no_room = |free_bytes, memory_bytes| {
            VmError::DiskFull(airlock_backend::DiskFull {
                path: path.to_owned(),
                bytes: content.len() as u64,
                disk_bytes,
                free_bytes,
                memory_bytes,
            })
        };
        if self.sandbox_disk.is_some_and(|disk| content.len() as u64 > disk) {
            return Err(no_room(None, None));
        }
        let mut chunks = content.chunks(CHUNK).peekable();
        let mut first = true;
        loop {
            let chunk = chunks.next().unwrap_or(&[]);
            let last = chunks.peek().is_none();
            let msg = ToGuest::WriteFile {
                path: path.to_owned(),
                mode,
                first,
                last,
            };
            self.send(&msg, chunk)?;
            first = false;
            if last {
                break;
            }
        }
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        match self.channel()?.recv(deadline, &[]) {
            Ok(f) => match f.msg {
                ToHost::Ok => Ok(()),
                ToHost::NoRoom {
                    free_bytes,
                    memory_bytes,
                } => Err(no_room(free_bytes, memory_bytes)),
                ToHost::Error { kind, field, message } => Err(crate::agent_error(None, kind, field, message)),
                other => Err(self.desync("writing a file", &other)),
            },
            Err(e) => Err(self.lost("writing a file", e)),
        }
    }

    /// Reads a file under the guest's /workspace (at most `max_bytes`).
    pub fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>, VmError> {
        self.check_running()?;
        let msg = ToGuest::ReadFile {
            path: path.to_owned(),
            max_bytes,
        };
        self.send(&msg, &[])?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let mut data = Vec::new();
        loop {
            let frame = match self.channel()?.recv(deadline, &[]) {
                Ok(f) => f,
                Err(e) => return Err(self.lost("reading a file", e)),
            };
            match frame.msg {
                ToHost::FileChunk { last } => {
                    data.extend_from_slice(&frame.payload);
                    if data.len() as u64 > max_bytes {
                        // The rest would arrive as the answer to the next request.
                        self.kill();
                        return Err(VmError::Guest(format!("{path}: more than {max_bytes} bytes")));
                    }
                    if last {
                        return Ok(data);
                    }
                }
                ToHost::Error { kind, field, message } => {
                    return Err(crate::agent_error(None, kind, field, message));
                }
                other => return Err(self.desync("reading a file", &other)),
            }
        }
    }

    /// Lists the guest's /workspace recursively, sorted by path.
    pub fn list_files(&mut self) -> Result<Vec<FileEntry>, VmError> {
        self.check_running()?;
        self.send(&ToGuest::ListFiles, &[])?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        match self.channel()?.recv(deadline, &[]) {
            Ok(f) => match f.msg {
                ToHost::Listing { entries } => Ok(entries),
                ToHost::Error { kind, field, message } => Err(crate::agent_error(None, kind, field, message)),
                other => Err(self.desync("listing files", &other)),
            },
            Err(e) => Err(self.lost("listing files", e)),
        }
    }

    /// Whether the VMM's cgroup saw an OOM kill (the VM as a whole outgrew its wall).
    fn vm_oom_killed(&self) -> bool {
        self.cgroup.as_ref().is_some_and(|c| c.usage().oom_kills > 0)
    }

    /// The result when the guest could not report (deadline passed, VM killed): output
    /// received so far; the guest's usage counters died with it, so they are zero.
    fn host_result(
        &self,
        outcome: Outcome,
        out: Capped,
        err: Capped,
        started: Instant,
        setup: Duration,
    ) -> ExecResult {
        ExecResult {
            id: self.id.clone(),
            outcome,
            exit_code: None,
            signal: Some(libc::SIGKILL),
            timed_out: outcome == Outcome::Timeout,
            oom_killed: outcome == Outcome::Oom,
            stdout: String::from_utf8_lossy(&out.kept).into_owned(),
            stderr: String::from_utf8_lossy(&err.kept).into_owned(),
            stdout_truncated: out.cut,
            stderr_truncated: err.cut,
            stdout_bytes: out.total,
            stderr_bytes: err.total,
            wall_ms: round3(started.elapsed().as_secs_f64() * 1e3),
            setup_ms: round3(setup.as_secs_f64() * 1e3),
            cpu_ms: 0.0,
            memory_peak_bytes: 0,
            egress: Vec::new(),
            isolation: Isolation::Microvm,
            platform: Some(self.accel_name().to_owned()),
            files_changed: Vec::new(),
            files_changed_truncated: false,
        }
    }

    /// The accelerator it runs on, as results report it.
    fn accel_name(&self) -> &'static str {
        if self.emulated { "tcg" } else { "kvm" }
    }

    /// Kills the VMM and everything in its cgroup, and reaps it.
    fn kill(&mut self) {
        self.agent = None;
        self.control = None;
        self.egress_port = None;
        if let Some(child) = &mut self.child {
            let _ = child.kill();
        }
        // Before the wait: the cgroup's kill lifts its CPU quota, so a VMM the throttle
        // holds dies at once.
        if let Some(cg) = &self.cgroup {
            let _ = cg.kill();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// The error for a boot that did not reach the agent, with the console's last lines.
    fn boot_failed(&mut self, why: &str) -> VmError {
        self.kill();
        VmError::Boot(format!("{why}{}", console_tail(&self.state.join("console.log"))))
    }
}

impl Drop for BootedVm {
    fn drop(&mut self) {
        self.kill();
        // After the VMM: its port is closed, so the relay has nothing left to carry.
        self.egress = None;
        self.mux = None;
        if let Some(cg) = self.cgroup.take() {
            let _ = cg.destroy();
        }
        let _ = fs::remove_dir_all(&self.state);
    }
}

/// One output stream as received from the guest: at most `limit` bytes kept.
#[derive(Debug)]
struct Capped {
    kept: Vec<u8>,
    limit: usize,
    /// Bytes received, kept or not.
    total: u64,
    /// Whether bytes were dropped.
    cut: bool,
}

impl Capped {
    fn new(limit: usize) -> Self {
        Capped {
            kept: Vec::new(),
            limit,
            total: 0,
            cut: false,
        }
    }

    /// Keeps what fits of `data` and returns it.
    fn take<'a>(&mut self, data: &'a [u8]) -> &'a [u8] {
        self.total += data.len() as u64;
        let room = self.limit.saturating_sub(self.kept.len());
        let kept = &data[..data.len().min(room)];
        self.cut |= kept.len() < data.len();
        self.kept.extend_from_slice(kept);
        kept
    }
}

fn round3(ms: f64) -> f64 {
    (ms * 1e3).round() / 1e3
}

/// The last lines of the console log, as a suffix for an error message.
fn console_tail(path: &Path) -> String {
    let text = fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().rev().take(CONSOLE_TAIL_LINES).collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail: Vec<&str> = lines.into_iter().rev().collect();
    format!("; guest console:\n{}", tail.join("\n"))
}

/// Field 22 of /proc/<pid>/stat: the process's start time in clock ticks since boot.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Removes the state directories of airlock processes that are gone, after killing any
/// VMM they recorded that still runs. Returns how many VMs were purged.
fn purge_state(root: &Path) -> usize {
    let Ok(owners) = fs::read_dir(root) else {
        return 0;
    };
    let mut purged = 0;
    for owner in owners.flatten() {
        let name = owner.file_name().to_string_lossy().into_owned();
        let Some((pid, start)) = name.split_once('-') else {
            continue;
        };
        let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
            continue;
        };
        if start_time(pid) == Some(start) {
            continue; // a live airlock process
        }
        for vm in fs::read_dir(owner.path()).into_iter().flatten().flatten() {
            let recorded = fs::read_to_string(vm.path().join("pid")).unwrap_or_default();
            let mut it = recorded.split_whitespace().map(|v| v.parse::<u64>().ok());
            if let (Some(Some(pid)), Some(Some(start))) = (it.next(), it.next())
                && start_time(pid as u32) == Some(start)
            {
                // SAFETY: kill with a pid whose start time we just matched to the
                // recorded VMM; no memory is involved.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
            if fs::remove_dir_all(vm.path()).is_ok() {
                purged += 1;
            }
        }
        let _ = fs::remove_dir(owner.path());
    }
    purged
}

/// `spec` validated as a VM serves it, whatever tier it names: a spec that names an
/// image, in a VM without one (`has_image` false), is refused on `image`, never run on
/// the guest's system directories in its place. Which image a VM has is its shape's
/// business (the service resolves the name and pools compare digests).
pub(crate) fn validate(spec: &Spec, has_image: bool) -> Result<(), VmError> {
    spec.validate().map_err(VmError::Spec)?;
    if spec.image.is_some() && !has_image {
        return Err(VmError::Spec(SpecError::new(
            "image",
            "was not resolved to an image's prepared root: this VM has the host's system directories",
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_capped_on_the_host_too() {
        let mut c = Capped::new(5);
        assert_eq!(c.take(b"abc"), b"abc");
        assert_eq!(c.take(b"defg"), b"de");
        assert_eq!(c.take(b"h"), b"");
        assert_eq!((c.kept.as_slice(), c.total, c.cut), (&b"abcde"[..], 8, true));
    }

    #[test]
    fn vm_size_follows_the_limits() {
        let l = Limits {
            memory_bytes: 256 << 20,
            cpus: 0.5,
            ..Limits::default()
        };
        let s = VmSize::for_limits(&l);
        assert_eq!(s.ram_mib, 256 + GUEST_OVERHEAD_MIB);
        assert_eq!(s.vcpus, 1);
    }

    #[test]
    fn state_of_dead_owners_is_purged_and_live_ones_kept() {
        let root = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let live = root.path().join(format!("{me}-{}", start_time(me).unwrap()));
        let dead = root.path().join(format!("{me}-1"));
        for d in [&live, &dead] {
            fs::create_dir_all(d.join("vm-1")).unwrap();
            fs::write(d.join("vm-1/console.log"), "x").unwrap();
        }
        assert_eq!(purge_state(root.path()), 1);
        assert!(live.join("vm-1").is_dir());
        assert!(!dead.exists());
    }
}
