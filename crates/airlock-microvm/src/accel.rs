//! KVM or TCG, decided by trying: a /dev/kvm that exists is not one that boots a guest
//! (a nested, paravirtual /dev/kvm may accept every ioctl and then hang the stock guest
//! kernel in its first instructions). The probe boots the real guest under KVM with a
//! short timeout; the verdict is cached per (host kernel, VMM binary, guest kernel), so
//! it is paid once.

use serde::{Deserialize, Serialize};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use crate::vm::{MicroVmHost, VmSize};
use crate::vmm::Accel;

/// A guest that boots under KVM reaches its agent in well under a second; TCG-speed
/// booting under a broken KVM never does.
const PROBE_TIMEOUT: Duration = Duration::from_secs(6);

/// The cached result of a probe.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Verdict {
    /// Whether a guest booted under KVM.
    pub kvm_boots: bool,
    /// What happened.
    pub detail: String,
}

/// The group that may open /dev/kvm, when the device is group read-write for a
/// non-root group (the VMM, unprivileged, gets it as a supplementary group).
pub fn kvm_group() -> Option<u32> {
    let meta = fs::metadata("/dev/kvm").ok()?;
    (meta.mode() & 0o060 == 0o060 && meta.gid() != 0).then_some(meta.gid())
}

fn cache_key(host: &MicroVmHost, vmm: &str) -> String {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let key = format!("{release}|{vmm}|{}", host.image().kernel_release);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("accel-{h:016x}.json")
}

/// Boots the guest under KVM (as root, for this probe only, so the answer is about the
/// hypervisor and not the device's permissions) and reports whether it came up.
pub fn probe(host: &MicroVmHost) -> Verdict {
    if !Path::new("/dev/kvm").exists() {
        return Verdict {
            kvm_boots: false,
            detail: "no /dev/kvm".into(),
        };
    }
    let size = VmSize {
        ram_mib: 256,
        vcpus: 1,
    };
    match host.boot_probe(size, Accel::Kvm, PROBE_TIMEOUT) {
        Ok(mut vm) => {
            let accel = vm.accelerator().unwrap_or_else(|e| e.to_string());
            Verdict {
                kvm_boots: accel == "kvm",
                detail: format!(
                    "a guest booted under KVM in {} ms (QMP reports {accel})",
                    vm.boot_time().as_millis()
                ),
            }
        }
        Err(e) => {
            let first = e.to_string();
            let first = first.lines().next().unwrap_or_default().to_owned();
            Verdict {
                kvm_boots: false,
                detail: format!(
                    "/dev/kvm is present but the guest did not boot under it ({first}): a nested or paravirtual KVM that stock kernels cannot boot under"
                ),
            }
        }
    }
}

/// The probe's verdict, from the cache or by probing (and caching). `vmm` is the VMM's
/// fingerprint.
pub fn verdict(host: &MicroVmHost, cache: &Path, vmm: &str, fresh: bool) -> Verdict {
    let path = cache.join(cache_key(host, vmm));
    if !fresh
        && let Some(v) = fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Verdict>(&b).ok())
    {
        return v;
    }
    let v = probe(host);
    if let Ok(bytes) = serde_json::to_vec(&v) {
        let _ = fs::write(&path, bytes);
    }
    v
}

/// Which accelerator runs use, and why.
pub fn choose(v: &Verdict) -> (Accel, String) {
    match (v.kvm_boots, kvm_group()) {
        (true, Some(_)) => (Accel::Kvm, v.detail.clone()),
        (true, None) => (
            Accel::Tcg,
            format!(
                "{}, but /dev/kvm is not read-write for a non-root group, and the VMM never runs as root (give it group kvm, mode 0660, to use KVM): emulating with TCG",
                v.detail
            ),
        ),
        (false, _) => (Accel::Tcg, format!("{}: emulating with TCG", v.detail)),
    }
}
