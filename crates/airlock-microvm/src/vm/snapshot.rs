//! Pausing a VM, and full snapshots of a running one: its RAM and device state in files
//! that any number of new VMs are restored from (a fork), each running on from the
//! moment of the snapshot with the same processes and memory.
//!
//! - Pause is QMP's `stop` (the guest's CPUs and its clock stand still); resume is
//!   `cont`, then the agent sets the guest's CLOCK_REALTIME to the host's (and reseeds
//!   its random generator): a long pause leaves no stale wall clock behind. A paused
//!   VM refuses every request but resume, checkpoint and the purge (a request would wait
//!   for a guest that cannot answer, and then kill it).
//! - A checkpoint pauses the VM, has QEMU write its device state (CPU, devices: tens of
//!   kilobytes; QMP's `xen-save-devices-state`, which leaves RAM out), reads the guest's
//!   RAM itself from the VMM's address space (`/proc/<vmm>/mem` at the address QEMU's
//!   `gpa2hva` gives) into a sparse file (pages of zeros are holes), and lets the VM run
//!   on. Its files: `ram`, `devices`, `vm.json` (what the VM was: size, accelerator,
//!   kernel command line, guest image, sandbox, its egress relay's ids).
//! - A restore starts a VMM like a template's clone: the same machine, the snapshot's RAM
//!   mapped private (copy-on-write), `-incoming defer`, the device state loaded. The RAM
//!   is first copied into a sealed memfd (QEMU 7.2 opens a RAM file read-write, and a file
//!   on disk cannot be sealed against writes: a VMM taken over by its guest could
//!   otherwise change the snapshot under every later restore). The memfd is kept while
//!   any VM restored from it lives: the restores of one snapshot share it, and with it
//!   every page none of them changed.
//! - The restored agent is told `Restored`: it reseeds its random generator, sets its
//!   clock, and its egress port starts over behind fresh random markers (mux version
//!   4), with the host's stream ids continuing where the snapshot's host left them.
//!
//! What a restored VM's programs keep: everything in the guest (processes, their
//! memory, files, listening sockets; a spawned program runs on and can be seen and
//! reached by execs, through its files and ports). What they lose: their ties to the
//! snapshot's host. A program spawned before the snapshot has no handle in the restored
//! VM (it cannot be waited for, signalled or streamed from the host; what it writes to
//! its stdout and stderr is read and dropped, its stdin stays open and empty);
//! connections through the egress port (to the sandbox's ports) are reset. A VM in proxy
//! mode is not snapshotted at all (its proxy's per-sandbox secrets and certificate
//! authority live on the host): its checkpoint answers `false`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::{BOOT_TIMEOUT, BootParams, BootedVm, MicroVmHost, REQUEST_TIMEOUT, Recv, Restore, VmSize, boot};
use crate::image::{GuestImage, ImageDrive};
use crate::vmm::RamFile;
use crate::{VmError, sys};
use airlock_backend::ImageRoot;
use airlock_spec::SpecError;
use airlock_vmwire::frame::{GuestInfo, RESUME_SEED, RESYNC_MARKER, ToGuest, ToHost, ToVmGuest};

/// The snapshot's description (JSON), written last: a directory without it is no
/// snapshot.
const META: &str = "vm.json";
/// The guest's RAM, byte for byte (sparse: pages of zeros are holes).
const RAM: &str = "ram";
/// QEMU's device state.
const DEVICES: &str = "devices";
/// The layout of a snapshot's files; another is refused.
const FORMAT: u32 = 1;
/// `vm.json` is a few kilobytes; this bounds a corrupt one.
const MAX_META: u64 = 1 << 20;
/// The unit of holes in the RAM file.
const PAGE: usize = 4096;
/// Bytes of RAM copied per read.
const COPY_CHUNK: usize = 2 << 20;
/// A VM's device state is tens of kilobytes; a VMM that wrote more than this (one taken
/// over by its guest) made no snapshot.
const MAX_DEVICES: u64 = 64 << 20;

/// What `vm.json` says.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Meta {
    /// [`FORMAT`].
    format: u32,
    /// The VM's RAM in MiB (the RAM file's size).
    ram_mib: u64,
    /// Its virtual CPUs.
    vcpus: u32,
    /// `tcg` or `kvm`: a restore runs on the same.
    accel: String,
    /// Its kernel's command line (the restored VM's fw_cfg matches the saved one).
    cmdline: String,
    /// The boot files and image drive it ran on ([`fingerprint`]): its guest's page cache
    /// holds their blocks, so a restore runs on exactly these.
    guest_image: String,
    /// The OCI image its sandbox has as its root, if any.
    image: Option<String>,
    /// The disk size of its guest's sandbox, once built.
    sandbox_disk: Option<u64>,
    /// What its agent reported at boot.
    info: GuestInfo,
    /// Its egress relay's id counters ([`super::egress::MuxRelay::ids`]).
    mux_ids: [u32; 2],
    /// Bytes of RAM that are not zeros (what the RAM file holds on disk).
    ram_stored_bytes: u64,
}

/// A snapshot being restored: its description and its device state.
#[derive(Debug)]
pub(crate) struct Saved {
    meta: Meta,
    devices: File,
}

/// The sealed RAM files of snapshots that live VMs were restored from, by the identity
/// of the snapshot's RAM file; each goes with the last VM that maps it.
#[derive(Debug, Default)]
pub(crate) struct RamCache {
    files: Mutex<Vec<(RamKey, Weak<File>)>>,
}

/// A RAM file's device, inode, size, modification and change times: another file (a
/// snapshot deleted, another written under the same name) never matches.
type RamKey = (u64, u64, u64, i64, i64, i64, i64);

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `n` bytes from the host's random source.
fn random(n: usize) -> Result<Vec<u8>, VmError> {
    let mut bytes = vec![0u8; n];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| VmError::Host(format!("/dev/urandom: {e}")))?;
    Ok(bytes)
}

/// The identity of the files a VM runs on: kernel, initramfs, rootfs and image drive
/// (path, device, inode, size, modification time).
pub(crate) fn fingerprint(image: &GuestImage, drive: Option<&ImageDrive>) -> String {
    let mut parts = Vec::new();
    for path in [&image.kernel, &image.initramfs, &image.rootfs] {
        let id = fs::metadata(path).map_or((0, 0, 0, 0, 0), |m| {
            (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec())
        });
        parts.push(format!(
            "{}:{}:{}:{}:{}.{}",
            path.display(),
            id.0,
            id.1,
            id.2,
            id.3,
            id.4
        ));
    }
    if let Some(d) = drive {
        parts.push(format!(
            "{}:{}:{}:{}:{}",
            d.digest,
            d.path.display(),
            d.identity.0,
            d.identity.1,
            d.identity.2
        ));
    }
    parts.join(" ")
}

/// The error of a request to a paused VM.
fn paused() -> VmError {
    VmError::Spec(SpecError::new("sandbox", "is paused: resume it first"))
}

/// A snapshot that cannot be restored here, and why.
fn unusable(field: &str, why: impl Into<String>) -> VmError {
    VmError::Spec(SpecError::new(field, why))
}

impl BootedVm {
    /// Refuses a request while the VM is paused ([`BootedVm::pause`]).
    pub(crate) fn check_running(&self) -> Result<(), VmError> {
        if self.paused { Err(paused()) } else { Ok(()) }
    }

    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    fn control(&mut self) -> Result<&mut Box<dyn crate::vmm::VmControl>, VmError> {
        self.control.as_mut().ok_or(VmError::Gone)
    }

    /// Stops the guest's CPUs: its programs (execs, spawned ones) and its clock stand
    /// still until [`BootedVm::resume`]. Every request but resume, checkpoint and the
    /// purge is refused meanwhile (on `sandbox`), connections to its ports too; a
    /// spawned program's signals wait for the resume. Pausing a paused VM does nothing.
    pub fn pause(&mut self) -> Result<(), VmError> {
        if self.paused {
            return Ok(());
        }
        if !self.agent_alive() {
            return Err(VmError::Gone);
        }
        self.control()?.stop()?;
        self.paused = true;
        if let Some(mux) = &self.mux {
            mux.set_paused(true);
        }
        Ok(())
    }

    /// Runs a paused VM again, and sets its clock to the host's (it stood still while
    /// paused). Resuming a running VM does nothing.
    pub fn resume(&mut self) -> Result<(), VmError> {
        if !self.paused {
            return Ok(());
        }
        if !self.agent_alive() {
            return Err(VmError::Gone);
        }
        self.control()?.cont()?;
        self.paused = false;
        if let Some(mux) = &self.mux {
            mux.set_paused(false);
        }
        self.set_clock()
    }

    /// Has the agent set the guest's clock to the host's (and reseed its generator).
    fn set_clock(&mut self) -> Result<(), VmError> {
        let seed = random(RESUME_SEED)?;
        self.send(
            &ToGuest::Resume {
                unix_time_ns: now_ns(),
            },
            &seed,
        )?;
        self.expect_ok("setting the clock")
    }

    /// Saves the VM's RAM and device state into the empty directory `dir` (a full
    /// snapshot, which [`MicroVmHost::restore`] starts new VMs from), pausing it
    /// meanwhile; it runs on after (a paused VM stays paused). `Ok(false)`, nothing
    /// written, for a VM that cannot be snapshotted: in proxy mode (its proxy's secrets
    /// and certificate authority live on this host), or with a guest agent older than
    /// mux version 4.
    pub fn checkpoint(&mut self, dir: &Path) -> Result<bool, VmError> {
        if self.egress.is_some() || self.info.mux_version < 4 {
            return Ok(false);
        }
        if !self.agent_alive() {
            return Err(VmError::Gone);
        }
        let pid = self.pid().ok_or(VmError::Gone)?;
        let running = !self.paused;
        if running {
            self.control()?.stop()?;
        }
        let saved = self.save(dir, pid);
        if running {
            if let Err(e) = self.control().and_then(|c| c.cont()) {
                self.kill();
                return Err(e);
            }
            self.set_clock()?;
        }
        if saved.is_err() {
            for name in [META, RAM, DEVICES] {
                let _ = fs::remove_file(dir.join(name));
            }
        }
        saved.map(|()| true)
    }

    /// Writes the snapshot's files of the paused VM whose VMM is `pid`.
    fn save(&mut self, dir: &Path, pid: u32) -> Result<(), VmError> {
        let host_err = |what: &str, e: io::Error| VmError::Host(format!("snapshot: {what}: {e}"));
        let create = |name: &str| {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dir.join(name))
                .map_err(|e| host_err(&dir.join(name).display().to_string(), e))
        };
        let devices = create(DEVICES)?;
        self.control()?.save_devices(devices.as_fd())?;
        let written = devices.metadata().map_err(|e| host_err(DEVICES, e))?.len();
        if written > MAX_DEVICES {
            return Err(VmError::Vmm(format!("the device state has {written} bytes")));
        }
        drop(devices);
        let hva = self.control()?.ram_address()?;
        let ram = create(RAM)?;
        let stored = copy_ram_out(pid, hva, self.size.ram_mib << 20, &ram)
            .map_err(|e| host_err("reading the guest's RAM", e))?;
        drop(ram);
        let meta = Meta {
            format: FORMAT,
            ram_mib: self.size.ram_mib,
            vcpus: self.size.vcpus,
            accel: self.accel_name().to_owned(),
            cmdline: self.cmdline.clone(),
            guest_image: self.guest_image.clone(),
            image: self.image.clone(),
            sandbox_disk: self.sandbox_disk,
            info: self.info.clone(),
            mux_ids: self.mux.as_ref().map_or_else(
                || self.resync.as_ref().map_or([0, 0], |r| r.ids),
                super::egress::MuxRelay::ids,
            ),
            ram_stored_bytes: stored,
        };
        let json = serde_json::to_vec_pretty(&meta).map_err(|e| VmError::Host(format!("snapshot: {e}")))?;
        create(META)?.write_all(&json).map_err(|e| host_err(META, e))
    }
}

/// Copies `len` bytes of guest RAM, mapped at `hva` in process `pid` (paused), into
/// `out`, leaving holes for pages of zeros; returns the bytes written.
fn copy_ram_out(pid: u32, hva: u64, len: u64, out: &File) -> io::Result<u64> {
    static ZERO: [u8; PAGE] = [0; PAGE];
    let mem = File::open(format!("/proc/{pid}/mem"))?;
    out.set_len(len)?;
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut stored = 0u64;
    let mut off = 0u64;
    while off < len {
        let n = COPY_CHUNK.min((len - off) as usize);
        mem.read_exact_at(&mut buf[..n], hva + off)?;
        let mut i = 0;
        while i < n {
            if buf[i..i + PAGE] == ZERO {
                i += PAGE;
                continue;
            }
            let start = i;
            while i < n && buf[i..i + PAGE] != ZERO {
                i += PAGE;
            }
            out.write_all_at(&buf[start..i], off + start as u64)?;
            stored += (i - start) as u64;
        }
        off += n as u64;
    }
    Ok(stored)
}

impl RamCache {
    /// Host memory the RAM files live VMs were restored from hold, in bytes.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|(_, f)| f.upgrade())
            .map(|f| super::template::resident_bytes(&f))
            .sum()
    }

    /// The sealed memfd holding the RAM file at `path` (`len` bytes): the one a live VM
    /// restored from the same file holds, else a new copy.
    fn get_or_load(&self, path: &Path, len: u64) -> Result<Arc<File>, VmError> {
        let host_err = |e: io::Error| VmError::Host(format!("snapshot RAM {}: {e}", path.display()));
        let file = File::open(path).map_err(host_err)?;
        let m = file.metadata().map_err(host_err)?;
        if m.len() != len {
            return Err(unusable(
                "snapshot",
                format!("its RAM file holds {} bytes, its VM had {len}", m.len()),
            ));
        }
        let key = (
            m.dev(),
            m.ino(),
            m.len(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        );
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        files.retain(|(_, f)| f.strong_count() > 0);
        if let Some(ram) = files
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, f)| f.upgrade())
        {
            return Ok(ram);
        }
        let ram = sys::memfd(c"airlock-vm-ram").map_err(host_err)?;
        ram.set_len(len).map_err(host_err)?;
        copy_data(&file, &ram, len).map_err(host_err)?;
        sys::seal(&ram).map_err(host_err)?;
        let ram = Arc::new(ram);
        files.push((key, Arc::downgrade(&ram)));
        Ok(ram)
    }
}

/// Copies the data of the sparse file `from` (`len` bytes) into `to` at the same
/// offsets, skipping its holes.
fn copy_data(from: &File, to: &File, len: u64) -> io::Result<()> {
    use nix::unistd::{Whence, lseek};
    let fd = from.as_fd();
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut off: u64 = 0;
    while off < len {
        let data = match lseek(fd, off as i64, Whence::SeekData) {
            Ok(d) => d as u64,
            Err(nix::errno::Errno::ENXIO) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let hole = (lseek(fd, data as i64, Whence::SeekHole).map_err(io::Error::from)? as u64).min(len);
        let mut at = data;
        while at < hole {
            let n = COPY_CHUNK.min((hole - at) as usize);
            from.read_exact_at(&mut buf[..n], at)?;
            to.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
        off = hole;
    }
    Ok(())
}

impl Saved {
    /// Loads the device state into `vm` (launched with the snapshot's RAM and
    /// `incoming`), tells its agent it was restored (fresh random state, the clock, the
    /// egress port's markers), and starts its egress relay, by `deadline`.
    pub(super) fn resume(&self, vm: &mut BootedVm, deadline: Instant) -> Result<(), VmError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let restored = match vm.control.as_mut() {
            Some(c) => c.restore_state(self.devices.as_fd(), left),
            None => Err(VmError::Control("no control channel".into())),
        };
        if let Err(e) = restored {
            return Err(vm.boot_failed(&format!("restoring the snapshot: {e}")));
        }
        let payload = random(RESUME_SEED + 2 * RESYNC_MARKER)?;
        let msg = ToVmGuest::Restored {
            unix_time_ns: now_ns(),
        };
        vm.channel()?.send(&msg, &payload)?;
        match vm
            .channel()?
            .recv(deadline.max(Instant::now() + REQUEST_TIMEOUT), &[])
        {
            Ok(frame) => match frame.msg {
                ToHost::Ok => {}
                ToHost::Error { message, .. } => {
                    return Err(vm.boot_failed(&format!("resuming the snapshot: {message}")));
                }
                other => {
                    return Err(vm.boot_failed(&format!("resuming the snapshot: unexpected reply {other:?}")));
                }
            },
            Err(Recv::Timeout) => {
                return Err(vm.boot_failed("resuming the snapshot: the guest did not answer"));
            }
            Err(Recv::Closed) => return Err(vm.boot_failed("the VM stopped while resuming the snapshot")),
            Err(Recv::Cancelled) => unreachable!("no cancel fds"),
            Err(Recv::Failed(e)) => return Err(vm.boot_failed(&e.to_string())),
        }
        let (host_marker, guest_marker) = payload[RESUME_SEED..].split_at(RESYNC_MARKER);
        vm.info = self.meta.info.clone();
        vm.sandbox_disk = self.meta.sandbox_disk;
        vm.resync = Some(super::egress::Resync {
            ids: self.meta.mux_ids,
            host_marker: host_marker.to_vec(),
            guest_marker: guest_marker.to_vec(),
        });
        // Now: the guest's marker, and whatever its programs write, wait in the port.
        vm.start_mux()
    }
}

impl MicroVmHost {
    /// A new VM restored from the full snapshot in `dir` ([`BootedVm::checkpoint`]): it
    /// runs on from the moment of the snapshot, with its processes, memory and files,
    /// its own random state and the host's clock, its own uid, cgroup and state
    /// directory. Its RAM is the snapshot's, mapped copy-on-write from a sealed copy that
    /// every VM restored from the same snapshot shares (made by the first restore; kept
    /// while one of them lives). `dir` is only read, and may be removed once this
    /// returns. Its VM size is the snapshot's; `image` must be the image the snapshot's
    /// VM ran (its drive unchanged in the cache) and `disk_bytes` its sandbox's disk.
    ///
    /// Like [`MicroVmHost::boot`], the VMM dies with the calling thread.
    pub fn restore(
        &self,
        dir: &Path,
        image: Option<&ImageRoot>,
        disk_bytes: u64,
    ) -> Result<BootedVm, VmError> {
        let meta = read_meta(dir)?;
        if meta.format != FORMAT {
            return Err(unusable(
                "snapshot",
                format!("has format {}, this airlock restores {FORMAT}", meta.format),
            ));
        }
        if meta.accel != self.accel.as_str() {
            return Err(unusable(
                "snapshot",
                format!(
                    "was taken on {}, this host runs VMs on {}",
                    meta.accel,
                    self.accel.as_str()
                ),
            ));
        }
        if meta.image.as_deref() != image.map(|i| i.digest.as_str()) {
            return Err(unusable(
                "image",
                format!(
                    "differs from the snapshot's ({})",
                    meta.image.as_deref().unwrap_or("the host's system directories")
                ),
            ));
        }
        if meta.sandbox_disk.is_some_and(|d| d != disk_bytes) {
            return Err(unusable(
                "limits.disk_bytes",
                format!(
                    "differs from the snapshot's sandbox disk ({} bytes)",
                    meta.sandbox_disk.unwrap_or(0)
                ),
            ));
        }
        let drive = match image {
            Some(i) => Some(ImageDrive {
                built_ms: None,
                ..self.image_drive(i)?
            }),
            None => None,
        };
        if meta.guest_image != fingerprint(&self.image, drive.as_ref()) {
            return Err(unusable(
                "snapshot",
                "was taken with other guest boot files or another build of the image's drive: its guest could not run on these",
            ));
        }
        let ram = self.snapshots.get_or_load(&dir.join(RAM), meta.ram_mib << 20)?;
        let devices = File::open(dir.join(DEVICES))
            .map_err(|e| VmError::Host(format!("snapshot {}: {e}", dir.join(DEVICES).display())))?;
        let saved = Saved { meta, devices };
        let mut vm = boot(BootParams {
            vmm: &*self.vmm,
            image: &self.image,
            image_drive: drive.as_ref(),
            cgroups: &self.cgroups,
            state_dir: &self.state_dir,
            cmdline: saved.meta.cmdline.clone(),
            accel: self.accel,
            size: VmSize {
                ram_mib: saved.meta.ram_mib,
                vcpus: saved.meta.vcpus,
            },
            uid: self.vmm_uid(),
            timeout: BOOT_TIMEOUT,
            ram_file: Some(RamFile {
                fd: ram.as_fd(),
                shared: false,
            }),
            restore: Some(Restore::Snapshot(&saved)),
        })?;
        vm.restored_ram = Some(ram);
        Ok(vm)
    }
}

/// Reads `dir`'s `vm.json`.
fn read_meta(dir: &Path) -> Result<Meta, VmError> {
    let path = dir.join(META);
    let mut text = Vec::new();
    File::open(&path)
        .and_then(|f| f.take(MAX_META).read_to_end(&mut text))
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => unusable(
                "snapshot",
                format!("{} holds no micro-VM snapshot", dir.display()),
            ),
            _ => VmError::Host(format!("{}: {e}", path.display())),
        })?;
    serde_json::from_slice(&text).map_err(|e| unusable("snapshot", format!("{}: {e}", path.display())))
}

impl BootedVm {
    /// Writes the guest sandbox's /workspace, /tmp and /dev/shm to `out` as a tar stream
    /// (airlock-fstree's format), as the guest makes it. A failure to write `out` is
    /// returned after the guest's stream has been read to its end (the VM stays usable).
    pub fn export_files(&mut self, out: &mut dyn Write) -> Result<(), VmError> {
        self.check_running()?;
        self.needs_files_wire()?;
        self.send(&ToVmGuest::ExportFiles, &[])?;
        let mut failed: Option<io::Error> = None;
        loop {
            let deadline = Instant::now() + REQUEST_TIMEOUT;
            let frame = match self.channel()?.recv(deadline, &[]) {
                Ok(f) => f,
                Err(e) => return Err(self.lost("exporting files", e)),
            };
            match frame.msg {
                ToHost::FileChunk { last } => {
                    if failed.is_none()
                        && let Err(e) = out.write_all(&frame.payload)
                    {
                        failed = Some(e);
                    }
                    if last {
                        break;
                    }
                }
                ToHost::Error { kind, field, message } => {
                    return Err(crate::agent_error(Some("exporting files"), kind, field, message));
                }
                other => return Err(self.desync("exporting files", &other)),
            }
        }
        match failed {
            Some(e) => Err(VmError::Host(format!("writing the exported files: {e}"))),
            None => Ok(()),
        }
    }

    /// Replaces the guest sandbox's /workspace, /tmp and /dev/shm with the tar stream
    /// `input` (what is not in it is gone; everything is owned by the sandbox's user),
    /// sent in chunks as it is read and unpacked by the guest as they arrive. A stream
    /// that does not fit the sandbox's disk is [`VmError::DiskFull`].
    pub fn import_files(&mut self, input: &mut dyn Read) -> Result<(), VmError> {
        self.check_running()?;
        self.needs_files_wire()?;
        let mut buf = vec![0u8; airlock_vmwire::frame::CHUNK];
        let mut sent = 0u64;
        let mut read_error = None;
        loop {
            let mut n = 0;
            // Whole chunks where the input gives them: fewer frames.
            while n < buf.len() {
                match input.read(&mut buf[n..]) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        read_error = Some(e);
                        break;
                    }
                }
            }
            let last = n < buf.len();
            let msg = ToVmGuest::ImportFiles {
                last,
                abort: read_error.is_some(),
            };
            self.send(&msg, &buf[..n])?;
            sent += n as u64;
            if last {
                break;
            }
        }
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let answer = match self.channel()?.recv(deadline, &[]) {
            Ok(f) => f.msg,
            Err(e) => return Err(self.lost("importing files", e)),
        };
        if let Some(e) = read_error {
            return Err(VmError::Host(format!("reading the files to import: {e}")));
        }
        match answer {
            ToHost::Ok => Ok(()),
            ToHost::NoRoom {
                free_bytes,
                memory_bytes,
            } => Err(VmError::DiskFull(airlock_backend::DiskFull {
                path: "/workspace".into(),
                bytes: sent,
                disk_bytes: self.sandbox_disk.unwrap_or(0),
                free_bytes,
                memory_bytes,
            })),
            ToHost::Error { kind, field, message } => Err(crate::agent_error(None, kind, field, message)),
            other => Err(self.desync("importing files", &other)),
        }
    }

    /// Refuses export and import to an agent that predates them.
    fn needs_files_wire(&self) -> Result<(), VmError> {
        if self.info.mux_version < 4 {
            return Err(VmError::Host(format!(
                "the guest agent speaks version {} of the wire, exporting and importing files needs 4: rebuild airlock-guest with this airlock",
                self.info.mux_version
            )));
        }
        Ok(())
    }
}
