//! From the kernel's hand-off to a serving agent. Order is fixed:
//!
//! 1. /dev (devtmpfs), /proc and /sys in the initramfs, so modules can be loaded and
//!    devices found; memory overcommit as on a host;
//! 2. load the modules shipped in the initramfs, in the numbered order the host resolved
//!    from their dependencies (virtio-mmio finds the devices QEMU's microvm machine lists
//!    in ACPI; then the block, console and squashfs drivers);
//! 3. mount the rootfs image read-only, nosuid, nodev at /newroot, and move /dev, /proc,
//!    /sys under it; mount cgroup v2 and a /tmp;
//! 4. make /newroot the root (move it over / and chroot: the initramfs cannot be
//!    pivot_root'ed away, but the sandbox's own pivot_root works from a real mount);
//! 5. find the agent's virtio-serial port by name and open it, retrying: its device node
//!    appears before the port is usable.

use nix::mount::{MsFlags, mount};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::sys;

/// Where the initramfs keeps the modules, as `NN-name.ko`.
const MODULES: &str = "/modules";
/// The rootfs's block device (the only virtio-blk device of the VM).
const ROOT_DEVICE: &str = "/dev/vda";
/// How long a device may take to appear after its driver loads.
const DEVICE_WAIT: Duration = Duration::from_secs(10);
/// Name of the agent's port.
const PORT_NAME: &str = airlock_vmwire::frame::AGENT_PORT;

fn mnt(
    src: &str,
    target: &str,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), String> {
    mount(Some(src), target, fstype, flags, data).map_err(|e| format!("mount {src} on {target}: {e}"))
}

fn mkdir(path: &str) -> Result<(), String> {
    match fs::create_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) => Err(format!("mkdir {path}: {e}")),
    }
}

/// Waits until `path` exists.
fn wait_for(path: &Path) -> Result<(), String> {
    let until = Instant::now() + DEVICE_WAIT;
    while !path.exists() {
        if Instant::now() > until {
            return Err(format!("{} did not appear in {DEVICE_WAIT:?}", path.display()));
        }
        sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Boots the guest's userland and returns the agent's open port, and when (ms since the
/// kernel started) the modules were loaded.
pub fn boot() -> Result<(File, u64), String> {
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_NODEV;
    // 1.
    for dir in ["/dev", "/proc", "/sys", "/newroot"] {
        mkdir(dir)?;
    }
    mnt(
        "devtmpfs",
        "/dev",
        Some("devtmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755"),
    )?;
    mnt("proc", "/proc", Some("proc"), nosuid, None)?;
    mnt("sysfs", "/sys", Some("sysfs"), nosuid, None)?;
    // The VM's RAM is the program's memory limit plus a little, so the kernel's heuristic
    // overcommit would refuse a large allocation that a host grants and then OOM-kills
    // at the cgroup's limit. Always grant: the sandbox's cgroup is the limit, as on a
    // host, and the result says `oom` the same way.
    fs::write("/proc/sys/vm/overcommit_memory", "1").map_err(|e| format!("vm.overcommit_memory: {e}"))?;

    // 2.
    let mut modules: Vec<PathBuf> = fs::read_dir(MODULES)
        .map_err(|e| format!("{MODULES}: {e}"))?
        .flatten()
        .map(|e| e.path())
        .collect();
    modules.sort();
    for path in &modules {
        let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        sys::load_module(&file).map_err(|e| format!("loading {}: {e}", path.display()))?;
    }

    let modules_ms = sys::boot_ms();

    // 3.
    wait_for(Path::new(ROOT_DEVICE))?;
    mnt(
        ROOT_DEVICE,
        "/newroot",
        Some("squashfs"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None,
    )?;
    for dir in ["/dev", "/proc", "/sys"] {
        let target = format!("/newroot{dir}");
        mnt(dir, &target, None, MsFlags::MS_MOVE, None)?;
    }
    mnt(
        "cgroup2",
        "/newroot/sys/fs/cgroup",
        Some("cgroup2"),
        nosuid,
        Some("nsdelegate"),
    )?;
    mnt(
        "tmpfs",
        "/newroot/tmp",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777,size=16m"),
    )?;
    mnt(
        "tmpfs",
        "/newroot/run",
        Some("tmpfs"),
        nosuid,
        Some("mode=0755,size=1m"),
    )?;

    // 4.
    std::env::set_current_dir("/newroot").map_err(|e| format!("chdir /newroot: {e}"))?;
    mnt(".", "/", None, MsFlags::MS_MOVE, None)?;
    nix::unistd::chroot(".").map_err(|e| format!("chroot: {e}"))?;
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;

    // 5.
    Ok((open_port()?, modules_ms))
}

/// The agent's port: the `/dev/vportNpM` whose sysfs name is ours.
fn open_port() -> Result<File, String> {
    let until = Instant::now() + DEVICE_WAIT;
    let mut last = String::from("no virtio port found");
    loop {
        if let Some(dev) = find_port() {
            match OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&dev)
            {
                Ok(f) => return Ok(f),
                Err(e) => last = format!("{}: {e}", dev.display()),
            }
        }
        if Instant::now() > until {
            return Err(format!("agent port {PORT_NAME}: {last}"));
        }
        sleep(Duration::from_millis(2));
    }
}

fn find_port() -> Option<PathBuf> {
    fs::read_dir("/sys/class/virtio-ports")
        .ok()?
        .flatten()
        .find(|e| fs::read_to_string(e.path().join("name")).is_ok_and(|n| n.trim() == PORT_NAME))
        .map(|e| Path::new("/dev").join(e.file_name()))
}
