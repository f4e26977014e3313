//! Template VMs and their copy-on-write clones: a VM is booted once per size, saved, and
//! new VMs of that size are restored from it instead of booted (about 0.1 s instead of
//! 1.5 s under TCG), mapping the template's RAM copy-on-write.
//!
//! - The template boots with its RAM in a memfd of the host's (QEMU's `share=on` file
//!   backend). Once its agent is ready, the host tells the agent to refuse everything
//!   but `Resume` (`Freeze`), pauses the VM and saves its device state (CPU, devices:
//!   tens of kilobytes; the RAM is in the file already, QMP's `x-ignore-shared`) to a
//!   second memfd, kills the VMM and seals both files.
//! - A clone is a VMM started with the same machine, the template's RAM file mapped
//!   private (`share=off`: the guest's writes are copied into the clone's own memory),
//!   and `-incoming defer`; it loads the device state and runs on from where the
//!   template stopped: its agent in the middle of reading its port. The host then sends
//!   `Resume` with fresh random bytes and its clock, and only once the agent has reseeded
//!   its kernel's generator and set its clock is the clone handed out.
//! - The seals (F_SEAL_WRITE, GROW, SHRINK, SEAL) keep every clone from changing the
//!   template, although QEMU opens the file read-write: writes, hole punching,
//!   truncation and writable shared mappings all fail, whatever the descriptor. So
//!   nothing one clone does reaches the next.
//! - The files are memfds: nothing is on disk, and they go with the last descriptor
//!   (the host's, when it is dropped, or the process when it dies).
//!
//! A clone is isolated like a booted VM: its own unprivileged uid, cgroup, state
//! directory, QEMU sandbox, no network device.
//!
//! A template may also be saved with its guest's sandbox built (`clone_prepared`, what
//! the service's pool uses): its clones start with that sandbox, and share what it held
//! at the save; what must differ per VM is drawn after the restore.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{BOOT_TIMEOUT, BootParams, BootedVm, MicroVmHost, Recv, Restore, VmSize, boot};
use crate::image::ImageDrive;
use crate::vmm::{Accel, RamFile};
use crate::{VmError, sys};
use airlock_backend::ImageRoot;
use airlock_spec::Limits;
use airlock_vmwire::frame::{GuestInfo, RESUME_SEED, ToGuest, ToHost};

/// Saving a template's device state takes a few milliseconds; this allows for a loaded
/// host.
const SAVE_TIMEOUT: Duration = Duration::from_secs(30);

/// A saved VM that clones are made from.
#[derive(Debug)]
pub(crate) struct Template {
    /// Owned: the guest's RAM, sealed.
    ram: File,
    /// Owned: the VM's device state, sealed.
    state: File,
    /// The accelerator it ran on (its clones run on the same).
    accel: Accel,
    /// What its agent reported at boot (its clones' kernel and agent are the same).
    info: GuestInfo,
    /// How long booting and saving it took.
    built_in: Duration,
    /// The guest's sandbox was built before the save, with this disk size: its clones
    /// start with it.
    sandbox_disk: Option<u64>,
}

/// What a template is: a VM size, the limits its guest's sandbox was built with before
/// the save (none: clones build their own), and the OCI image whose drive it carries and
/// whose root its guest mounted (none: the host's system directories). A clone runs on
/// its template's drives, so a template of one image never serves another.
type Key = (VmSize, Option<Limits>, Option<ImageDrive>);

/// The host's templates, one per VM size, prepared limits and image.
#[derive(Debug, Default)]
pub(crate) struct Templates {
    ready: Mutex<Vec<(Key, Arc<Template>)>>,
    /// Held while a template is built: concurrent first clones wait for one build.
    building: Mutex<()>,
}

/// Bytes of memory a (memfd) file holds: its allocated blocks, not its length (a
/// template's RAM file is as long as the guest's RAM, but holds only what the guest
/// touched before the save).
pub(crate) fn resident_bytes(file: &File) -> u64 {
    use std::os::unix::fs::MetadataExt;
    file.metadata().map_or(0, |m| m.blocks() * 512)
}

impl Templates {
    /// Host memory every template holds (RAM and device state), in bytes.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(_, t)| resident_bytes(&t.ram) + resident_bytes(&t.state))
            .sum()
    }

    fn get(&self, key: &Key) -> Option<Arc<Template>> {
        self.ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, t)| Arc::clone(t))
    }
}

impl MicroVmHost {
    /// A VM sized `size`, cloned from this host's template of that size: restored in a
    /// fraction of a boot, its RAM shared copy-on-write with the template's. The template
    /// is booted and saved on the first call for a size (as long as a boot), then kept
    /// until the host is dropped. The clone's agent has its own random state and clock
    /// before this returns. [`BootedVm::boot_time`] is the restore time.
    ///
    /// Like [`MicroVmHost::boot`], the VMM dies with the calling thread.
    pub fn clone_vm(&self, size: VmSize) -> Result<BootedVm, VmError> {
        self.clone_from(&(size, None, None))
    }

    /// Like [`MicroVmHost::clone_vm`], from a template whose guest's sandbox was built
    /// with `limits` before it was saved: the clone starts with that sandbox (as after
    /// [`BootedVm::prepare`]), and costs the host only the pages it changes. Its
    /// template is built on the first call for this size and these limits.
    pub fn clone_prepared(&self, size: VmSize, limits: &Limits) -> Result<BootedVm, VmError> {
        self.clone_from(&(size, Some(limits.clone()), None))
    }

    /// Like [`MicroVmHost::clone_vm`] (or, with `prepared`,
    /// [`MicroVmHost::clone_prepared`]) for VMs whose sandbox's root is `image`: cloned
    /// from a template of this image (booted with its drive, on the first call for this
    /// size, limits and image), never from another image's or the host's.
    pub fn clone_image(
        &self,
        size: VmSize,
        prepared: Option<&Limits>,
        image: &ImageRoot,
    ) -> Result<BootedVm, VmError> {
        let drive = ImageDrive {
            built_ms: None,
            ..self.image_drive(image)?
        };
        self.clone_from(&(size, prepared.cloned(), Some(drive)))
    }

    fn clone_from(&self, key: &Key) -> Result<BootedVm, VmError> {
        let size = key.0;
        let template = self.template(key)?;
        let mut vm = boot(BootParams {
            vmm: &*self.vmm,
            image: &self.image,
            image_drive: key.2.as_ref(),
            cgroups: &self.cgroups,
            state_dir: &self.state_dir,
            cmdline: self.cmdline(template.accel, key.2.is_some()),
            accel: template.accel,
            size,
            uid: self.vmm_uid(),
            timeout: BOOT_TIMEOUT,
            ram_file: Some(RamFile {
                fd: template.ram.as_fd(),
                shared: false,
            }),
            restore: Some(Restore::Template(&template)),
        })?;
        vm.sandbox_disk = template.sandbox_disk;
        Ok(vm)
    }

    /// Builds the template for `size` unless it exists, and returns how long building it
    /// took (when it was built, by this call or an earlier one).
    pub fn prepare_template(&self, size: VmSize) -> Result<Duration, VmError> {
        Ok(self.template(&(size, None, None))?.built_in)
    }

    fn template(&self, key: &Key) -> Result<Arc<Template>, VmError> {
        if let Some(t) = self.templates.get(key) {
            return Ok(t);
        }
        let _building = self
            .templates
            .building
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(t) = self.templates.get(key) {
            return Ok(t);
        }
        let t = Arc::new(self.build_template(key.0, key.1.as_ref(), key.2.as_ref())?);
        self.templates
            .ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((key.clone(), Arc::clone(&t)));
        Ok(t)
    }

    /// Boots a VM with its RAM in a memfd (and, with `prepare`, builds its guest's
    /// sandbox), saves it, and seals both files.
    fn build_template(
        &self,
        size: VmSize,
        prepare: Option<&Limits>,
        drive: Option<&ImageDrive>,
    ) -> Result<Template, VmError> {
        let t0 = Instant::now();
        let host_err = |what: &str, e: std::io::Error| VmError::Host(format!("template {what}: {e}"));
        let ram = sys::memfd(c"airlock-vm-ram").map_err(|e| host_err("RAM file", e))?;
        ram.set_len(size.ram_mib << 20)
            .map_err(|e| host_err("RAM file", e))?;
        let state = sys::memfd(c"airlock-vm-state").map_err(|e| host_err("state file", e))?;
        let mut vm = boot(BootParams {
            vmm: &*self.vmm,
            image: &self.image,
            image_drive: drive,
            cgroups: &self.cgroups,
            state_dir: &self.state_dir,
            cmdline: self.cmdline(self.accel, drive.is_some()),
            accel: self.accel,
            size,
            uid: self.vmm_uid(),
            timeout: BOOT_TIMEOUT,
            ram_file: Some(RamFile {
                fd: ram.as_fd(),
                shared: true,
            }),
            restore: None,
        })?;
        if let Some(limits) = prepare {
            vm.prepare(limits)?;
        }
        vm.channel()?.send(&ToGuest::Freeze, &[])?;
        vm.expect_ok("freezing the template")?;
        let control = vm
            .control
            .as_mut()
            .ok_or_else(|| VmError::Control("no control channel".into()))?;
        control.save_state(state.as_fd(), SAVE_TIMEOUT)?;
        let info = vm.info.clone();
        // Kills and reaps the VMM: no mapping of the RAM file is left, so it can be sealed.
        drop(vm);
        sys::seal(&ram).map_err(|e| host_err("sealing the RAM file", e))?;
        sys::seal(&state).map_err(|e| host_err("sealing the state file", e))?;
        Ok(Template {
            ram,
            state,
            accel: self.accel,
            info,
            built_in: t0.elapsed(),
            sandbox_disk: prepare.map(|l| l.disk_bytes),
        })
    }
}

impl Template {
    /// Restores `vm` (launched with this template's RAM and `incoming`) and hands its
    /// agent its own random seed and the clock, by `deadline`.
    pub(super) fn resume(&self, vm: &mut BootedVm, deadline: Instant) -> Result<(), VmError> {
        let state = sys::reopen_read_only(&self.state)
            .map_err(|e| VmError::Host(format!("template state file: {e}")))?;
        let left = deadline.saturating_duration_since(Instant::now());
        let restored = match vm.control.as_mut() {
            Some(c) => c.restore_state(state.as_fd(), left),
            None => Err(VmError::Control("no control channel".into())),
        };
        drop(state);
        if let Err(e) = restored {
            return Err(vm.boot_failed(&format!("restoring the template: {e}")));
        }
        let mut seed = [0u8; RESUME_SEED];
        File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut seed))
            .map_err(|e| VmError::Host(format!("/dev/urandom: {e}")))?;
        let unix_time_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        vm.channel()?.send(&ToGuest::Resume { unix_time_ns }, &seed)?;
        match vm.channel()?.recv(deadline, &[]) {
            Ok(frame) => match frame.msg {
                ToHost::Ok => {}
                ToHost::Error { message, .. } => return Err(vm.boot_failed(&format!("resuming: {message}"))),
                other => return Err(vm.boot_failed(&format!("resuming: unexpected reply {other:?}"))),
            },
            Err(Recv::Timeout) => return Err(vm.boot_failed("resuming: the guest did not answer")),
            Err(Recv::Closed) => return Err(vm.boot_failed("the VM stopped while resuming")),
            Err(Recv::Cancelled) => unreachable!("no cancel fds"),
            Err(Recv::Failed(e)) => return Err(vm.boot_failed(&e.to_string())),
        }
        vm.info = self.info.clone();
        Ok(())
    }
}
