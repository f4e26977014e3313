//! From the kernel's hand-off to a serving agent. Order is fixed:
//!
//! 1. /dev (devtmpfs), /proc and /sys in the initramfs, so modules can be loaded and
//!    devices found; memory overcommit as on a host;
//! 2. load the modules shipped in the initramfs, in the numbered order the host resolved
//!    from their dependencies (virtio-mmio finds the devices QEMU's microvm machine lists
//!    in ACPI; then the block, console and squashfs drivers; then proxy mode's TUN and
//!    nf_tables modules, which the agent uses only when a run asks for the proxy), each
//!    file removed once loaded (the initramfs is RAM);
//! 3. mount the rootfs image read-only, nosuid, nodev at /newroot, and move /dev, /proc,
//!    /sys under it; mount cgroup v2 and a /tmp;
//! 4. make /newroot the root (move it over / and chroot: the initramfs cannot be
//!    pivot_root'ed away, but the sandbox's own pivot_root works from a real mount);
//! 5. with an image (the kernel command line has `airlock.image`): find the image's
//!    drive by its serial and mount it read-only, nosuid, nodev at /run/airlock-image,
//!    where the sandbox's engine takes it as its image root;
//! 6. find the agent's virtio-serial port by name and open it, retrying: its device node
//!    appears before the port is usable.
//!
//! With an image the VM has two drives, the guest's own rootfs (the host's system
//! directories, which the agent, its loader and libraries and the sandbox's init run
//! from) and the image's; the guest tells them apart by the image drive's serial, never by
//! the order the kernel names them in.

use nix::mount::{MsFlags, mount};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::sys;

/// Where the initramfs keeps the modules, as `NN-name.ko`.
const MODULES: &str = "/modules";
/// The rootfs's block device when it is the VM's only one.
const ROOT_DEVICE: &str = "vda";
/// The other device name, when the VM carries an image's drive too.
const SECOND_DEVICE: &str = "vdb";
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

/// What booting left ready.
pub struct Booted {
    /// The agent's open port.
    pub port: File,
    /// When (ms since the kernel started) the modules were loaded.
    pub modules_ms: u64,
    /// Where the image's root is mounted, when the VM carries one.
    pub image: Option<PathBuf>,
}

/// Whether the kernel command line asks for an image (the word `airlock.image`).
fn wants_image(cmdline: &str) -> bool {
    cmdline
        .split_whitespace()
        .any(|w| w == airlock_vmwire::frame::IMAGE_BOOT_PARAM)
}

/// The virtio-blk serial of `dev` (`vda`), as sysfs has it.
fn serial(dev: &str) -> String {
    fs::read_to_string(format!("/sys/block/{dev}/serial"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The (rootfs, image) device names: with an image, both drives must appear, and the
/// one whose serial is the image's is the image.
fn drives(image: bool) -> Result<(&'static str, Option<&'static str>), String> {
    wait_for(&Path::new("/dev").join(ROOT_DEVICE))?;
    if !image {
        return Ok((ROOT_DEVICE, None));
    }
    wait_for(&Path::new("/dev").join(SECOND_DEVICE))?;
    let wanted = airlock_vmwire::frame::IMAGE_DRIVE_SERIAL;
    match (serial(ROOT_DEVICE) == wanted, serial(SECOND_DEVICE) == wanted) {
        (false, true) => Ok((ROOT_DEVICE, Some(SECOND_DEVICE))),
        (true, false) => Ok((SECOND_DEVICE, Some(ROOT_DEVICE))),
        _ => Err(format!(
            "no single drive with serial {wanted} (vda: {:?}, vdb: {:?})",
            serial(ROOT_DEVICE),
            serial(SECOND_DEVICE)
        )),
    }
}

/// Boots the guest's userland and returns the agent's open port, when the modules were
/// loaded, and the image's mount point if the VM has one.
pub fn boot() -> Result<Booted, String> {
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
        // The kernel has its own copy now; the initramfs's (RAM, never freed while the
        // file exists, and out of reach once the rootfs is the root) goes.
        drop(file);
        let _ = fs::remove_file(path);
    }

    let modules_ms = sys::boot_ms();

    // 3.
    let cmdline = fs::read_to_string("/proc/cmdline").map_err(|e| format!("/proc/cmdline: {e}"))?;
    let (root_dev, image_dev) = drives(wants_image(&cmdline))?;
    mnt(
        &format!("/dev/{root_dev}"),
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
    // Terminals of spawned programs (`openpty` opens /dev/ptmx, which finds this
    // instance at /dev/pts).
    mkdir("/dev/pts")?;
    mnt(
        "devpts",
        "/dev/pts",
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0620,ptmxmode=0666"),
    )?;

    // 5. The image is data to the guest: read-only, no device nodes, no setuid.
    let image = match image_dev {
        Some(dev) => {
            let at = airlock_vmwire::frame::IMAGE_MOUNT;
            mkdir(at)?;
            mnt(
                &format!("/dev/{dev}"),
                at,
                Some("squashfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                None,
            )?;
            Some(PathBuf::from(at))
        }
        None => None,
    };

    // 6.
    Ok(Booted {
        port: open_port()?,
        modules_ms,
        image,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_word_is_a_whole_word_of_the_command_line() {
        assert!(wants_image("console=ttyS0 quiet airlock.image panic=-1"));
        assert!(wants_image("airlock.image"));
        assert!(!wants_image("console=ttyS0 quiet panic=-1"));
        assert!(!wants_image("airlock.images=1 xairlock.image"));
    }
}
