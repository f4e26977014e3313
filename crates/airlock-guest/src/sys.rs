//! The raw calls the agent makes that nix does not wrap.

use std::io;
use std::os::fd::AsRawFd;

/// Loads a kernel module from its file (`finit_module`); a module that is already loaded
/// (or built in) is fine.
pub fn load_module(file: &std::fs::File) -> io::Result<()> {
    // SAFETY: finit_module reads the module from the open fd; the parameter string is a
    // static empty C string.
    let r = unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), c"".as_ptr(), 0) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EEXIST) {
        Ok(())
    } else {
        Err(e)
    }
}

/// Milliseconds since the guest kernel started.
pub fn boot_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid local `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Ends the VM: the VMM exits when its guest powers off.
pub fn power_off() -> ! {
    // SAFETY: sync and reboot take no pointers; as PID 1 with CAP_SYS_BOOT, reboot does
    // not return on success.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
    // Only reached if reboot failed: PID 1 exiting panics the kernel, and the kernel is
    // booted with panic=-1 and the VMM with -no-reboot, so the VM ends either way.
    std::process::exit(1)
}

/// `RNDADDENTROPY` and `RNDRESEEDCRNG` from <linux/random.h> (libc does not define them):
/// `_IOW('R', 0x03, int[2])` and `_IO('R', 0x07)`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Mixes `seed` into the kernel's input pool, credited as full entropy, and makes the
/// kernel's generator rekey from it at once (not at its next scheduled reseed).
pub fn reseed_random(seed: &[u8]) -> io::Result<()> {
    let len = libc::c_int::try_from(seed.len()).map_err(io::Error::other)?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + seed.len());
    info.extend_from_slice(&len.saturating_mul(8).to_ne_bytes());
    info.extend_from_slice(&len.to_ne_bytes());
    info.extend_from_slice(seed);
    let urandom = std::fs::OpenOptions::new().write(true).open("/dev/urandom")?;
    // SAFETY: RNDADDENTROPY reads a rand_pool_info of 8 + buf_size bytes, which `info`
    // holds (buf_size is `seed.len()`); the kernel only reads it.
    if unsafe { libc::ioctl(urandom.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: RNDRESEEDCRNG takes no argument.
    if unsafe { libc::ioctl(urandom.as_raw_fd(), RNDRESEEDCRNG as _) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets CLOCK_REALTIME to `unix_time_ns` nanoseconds since the epoch.
pub fn set_realtime(unix_time_ns: u64) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: (unix_time_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (unix_time_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: clock_settime reads one timespec from the valid local `ts`.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
