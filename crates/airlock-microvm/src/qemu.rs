//! QEMU's `microvm` machine as the VMM: no PCI, no firmware tables beyond ACPI, no
//! legacy devices but a serial port; virtio devices on MMIO. The VM gets:
//!
//! - the kernel and initramfs by `-kernel`/`-initrd` (no bootloader, no disk firmware);
//! - the rootfs image as a read-only virtio-blk device;
//! - one virtio-serial port, `airlock.agent`, backed by a socket whose other end stays
//!   with airlock (passed as an inherited fd: no socket file exists anywhere);
//! - a second one, `airlock.egress`, backed the same way, which carries a proxy-mode
//!   program's connections to the host's egress proxy ([`airlock_vmwire::mux`]). Every VM has it
//!   (unused, nothing in the guest opens it, unless an exec asks for the proxy): a clone
//!   must have its template's devices, so proxy-mode VMs come from the pool too;
//! - QMP on a second inherited socket;
//! - no network device (`-nodefaults -nic none`), no display, no USB, no default devices,
//!   no legacy PIT or PIC;
//! - QEMU's own seccomp sandbox (`-sandbox on,...`), and it never runs as root: the
//!   process joins its cgroup and drops to an unprivileged uid before `execve`.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::qmp::Qmp;
use crate::vmm::{Accel, Launch, Launched, Vmm};
use crate::{VmError, sys};

/// The fds the agent's, QMP's and the egress port's sockets have in QEMU.
const AGENT_FD: i32 = 3;
const QMP_FD: i32 = 4;
const EGRESS_FD: i32 = 6;
/// The fd of a VM's RAM file ([`crate::vmm::RamFile`]) in QEMU, opened by QEMU again as
/// `/proc/self/fd/5` (QEMU 7.2's `memory-backend-file` takes a path, not an fd).
pub const RAM_FD: i32 = 5;
/// Our copies are moved above this first, so the dup2s into 3 and 4 never clobber.
const HIGH_FD: i32 = 10;
/// Translated-code cache under TCG, in MiB. QEMU's default (1 GiB) is mapped lazily but
/// can grow that far; 256 MiB holds what a guest and its programs run and bounds the
/// host memory one VM can take beyond its RAM.
pub const TCG_TB_MIB: u64 = 256;

/// QEMU's system emulator for x86_64.
#[derive(Debug, Clone)]
pub struct Qemu {
    /// The `qemu-system-x86_64` binary.
    pub binary: PathBuf,
}

impl Default for Qemu {
    fn default() -> Self {
        Qemu {
            binary: PathBuf::from("qemu-system-x86_64"),
        }
    }
}

impl Qemu {
    /// The command line for `launch` (without the program name).
    pub fn args(&self, launch: &Launch<'_>) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |s: &str| a.push(s.into());
        // No legacy PIT or PIC: the guest uses the local APIC (TSC deadline) and the
        // IOAPIC; fewer emulated devices reachable from the guest, and a slightly faster
        // boot. The RTC stays: without it the guest boots slower.
        push("-M");
        if launch.ram_file.is_some() {
            push("microvm,acpi=on,x-option-roms=off,pit=off,pic=off,memory-backend=ram");
        } else {
            push("microvm,acpi=on,x-option-roms=off,pit=off,pic=off");
        }
        match launch.accel {
            Accel::Kvm => {
                push("-accel");
                push("kvm");
                push("-cpu");
                push("host");
            }
            Accel::Tcg => {
                push("-accel");
                push(&format!("tcg,tb-size={TCG_TB_MIB}"));
                push("-cpu");
                push("max");
            }
        }
        push("-m");
        push(&format!("{}M", launch.ram_mib));
        if let Some(ram) = &launch.ram_file {
            // share=off maps the file private: the guest's writes are copied into the
            // VMM's own memory and never reach the file.
            push("-object");
            push(&format!(
                "memory-backend-file,id=ram,size={}M,mem-path=/proc/self/fd/{RAM_FD},share={}",
                launch.ram_mib,
                if ram.shared { "on" } else { "off" }
            ));
        }
        if launch.incoming {
            push("-incoming");
            push("defer");
        }
        if launch.devices_only {
            // A device-state file (QMP's xen-save-devices-state) has no configuration
            // section, which a migration's has and its loader checks for.
            push("-global");
            push("migration.send-configuration=off");
        }
        push("-smp");
        push(&launch.vcpus.to_string());
        for s in [
            "-nodefaults",
            "-no-user-config",
            "-nic",
            "none",
            "-display",
            "none",
            "-no-reboot",
            "-sandbox",
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            "-chardev",
            "stdio,id=console,signal=off",
            "-serial",
            "chardev:console",
            // Port 0 is reserved for a console; 1 is the agent's, 2 the egress port.
            "-device",
            "virtio-serial-device,max_ports=3",
        ] {
            push(s);
        }
        push("-chardev");
        push(&format!("socket,id=agent,fd={AGENT_FD}"));
        push("-device");
        push(&format!(
            "virtserialport,chardev=agent,name={}",
            airlock_vmwire::frame::AGENT_PORT
        ));
        push("-chardev");
        push(&format!("socket,id=egress,fd={EGRESS_FD}"));
        push("-device");
        push(&format!(
            "virtserialport,chardev=egress,name={}",
            airlock_vmwire::mux::EGRESS_PORT
        ));
        push("-chardev");
        push(&format!("socket,id=qmp,fd={QMP_FD}"));
        push("-mon");
        push("chardev=qmp,mode=control");
        push("-device");
        push("virtio-blk-device,drive=rootfs");
        a.push("-drive".into());
        let mut drive = OsString::from("id=rootfs,if=none,format=raw,readonly=on,file=");
        drive.push(&launch.image.rootfs);
        a.push(drive);
        if let Some(image) = launch.image_drive {
            // After the rootfs's; the guest finds it by its serial all the same.
            a.push("-device".into());
            a.push(
                format!(
                    "virtio-blk-device,drive=image,serial={}",
                    airlock_vmwire::frame::IMAGE_DRIVE_SERIAL
                )
                .into(),
            );
            a.push("-drive".into());
            let mut drive = OsString::from("id=image,if=none,format=raw,readonly=on,file=");
            drive.push(image);
            a.push(drive);
        }
        a.push("-kernel".into());
        a.push(launch.image.kernel.clone().into());
        a.push("-initrd".into());
        a.push(launch.image.initramfs.clone().into());
        a.push("-append".into());
        a.push(launch.cmdline.clone().into());
        a
    }
}

impl Vmm for Qemu {
    fn name(&self) -> &'static str {
        "qemu"
    }

    fn version(&self) -> Result<String, VmError> {
        let out = Command::new(&self.binary)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| VmError::Vmm(format!("{}: {e}", self.binary.display())))?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned())
    }

    fn fingerprint(&self) -> String {
        use std::os::unix::fs::MetadataExt;
        let found = if self.binary.components().count() > 1 {
            Some(self.binary.clone())
        } else {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(&self.binary))
                    .find(|p| p.is_file())
            })
        };
        match found.and_then(|p| std::fs::metadata(&p).ok().map(|m| (p, m))) {
            Some((p, m)) => format!("{}:{}:{}", p.display(), m.len(), m.mtime()),
            None => self.binary.display().to_string(),
        }
    }

    fn launch(&self, launch: Launch<'_>) -> Result<Launched, VmError> {
        let spawn_err = |what: &str, e: std::io::Error| VmError::Vmm(format!("{what}: {e}"));
        let (agent, agent_guest) = UnixStream::pair().map_err(|e| spawn_err("socketpair", e))?;
        let (qmp, qmp_guest) = UnixStream::pair().map_err(|e| spawn_err("socketpair", e))?;
        let (egress, egress_guest) = UnixStream::pair().map_err(|e| spawn_err("socketpair", e))?;
        let agent_guest = sys::dup_above(agent_guest.as_fd(), HIGH_FD).map_err(|e| spawn_err("dup", e))?;
        let qmp_guest = sys::dup_above(qmp_guest.as_fd(), HIGH_FD).map_err(|e| spawn_err("dup", e))?;
        let egress_guest = sys::dup_above(egress_guest.as_fd(), HIGH_FD).map_err(|e| spawn_err("dup", e))?;
        let console_err = launch.console.try_clone().map_err(|e| spawn_err("console", e))?;
        let ram_file = match &launch.ram_file {
            Some(ram) => Some(sys::dup_above(ram.fd, HIGH_FD).map_err(|e| spawn_err("dup", e))?),
            None => None,
        };

        let mut cmd = Command::new(&self.binary);
        cmd.args(self.args(&launch))
            .stdin(Stdio::null())
            .stdout(Stdio::from(
                launch.console.try_clone().map_err(|e| spawn_err("console", e))?,
            ))
            .stderr(Stdio::from(console_err))
            .env_clear()
            .current_dir("/");
        // Everything the child uses after fork is prepared here and moved in.
        let procs = launch.cgroup_procs.clone();
        let groups = launch.groups.clone();
        let (uid, gid) = (launch.uid, launch.gid);
        let parent = sys::getpid();
        let (agent_raw, qmp_raw) = (agent_guest.as_raw_fd(), qmp_guest.as_raw_fd());
        let egress_raw = egress_guest.as_raw_fd();
        let ram_raw = ram_file.as_ref().map(|f| f.as_raw_fd());
        // Under TCG, QEMU backs its translated-code cache (and a few buffers) with huge
        // pages: 2 MiB of host memory for each 2 MiB region it reaches into. Without them a
        // VMM holds what it wrote, 4 KiB each: 2-4 MB less per pooled VM here. KVM has no
        // such cache, and keeps huge pages for the guest's RAM (faster guest page walks).
        let no_huge_pages = launch.accel == Accel::Tcg;
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe syscalls (open, write, close, dup2, set*id, prctl, getppid) on
        // data prepared before the fork; it allocates nothing and takes no lock.
        unsafe {
            cmd.pre_exec(move || {
                sys::child_join_cgroups(&procs)?;
                if no_huge_pages {
                    sys::child_no_huge_pages()?;
                }
                sys::child_dup2(agent_raw, AGENT_FD)?;
                sys::child_dup2(qmp_raw, QMP_FD)?;
                sys::child_dup2(egress_raw, EGRESS_FD)?;
                if let Some(ram) = ram_raw {
                    sys::child_dup2(ram, RAM_FD)?;
                }
                sys::child_drop_privileges(uid, gid, &groups, parent)
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| VmError::Vmm(format!("starting {}: {e}", self.binary.display())))?;
        drop(agent_guest);
        drop(qmp_guest);
        drop(egress_guest);
        drop(ram_file);
        let control = match Qmp::connect(qmp) {
            Ok(q) => q,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        Ok(Launched {
            child,
            agent,
            egress,
            control: Box::new(control),
        })
    }
}
