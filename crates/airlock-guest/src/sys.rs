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
