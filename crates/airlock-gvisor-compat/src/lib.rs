//! A small library the gVisor tier's agent preloads (`LD_PRELOAD`) into every program it
//! starts, when airlock found it installed beside itself. It changes no wall: each
//! function makes the same system call the program asked for, with arguments the
//! Sentry accepts and that mean the same thing there.
//!
//! - `statx`: the runsc release Debian ships (2022-12-19) answers `EINVAL` to the
//!   `AT_NO_AUTOMOUNT` flag, which coreutils passes to it in `ls` and `stat`.
//!   The flag only matters where automount points exist, and gVisor has none, so it is
//!   dropped, and the call goes to the Sentry as a raw syscall.
#![deny(missing_docs)]

use libc::{c_char, c_int, c_uint};

/// `statx(2)`, without `AT_NO_AUTOMOUNT` (see the crate docs).
///
/// # Safety
///
/// The caller's contract is `statx(2)`'s: `path` a NUL-terminated string, `buf` room for
/// a `struct statx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    // SAFETY: the pointers are the caller's, passed through unchanged to the kernel (the
    // Sentry), which checks them; the return value and errno are the syscall's own.
    unsafe {
        libc::syscall(
            libc::SYS_statx,
            dirfd,
            path,
            flags & !libc::AT_NO_AUTOMOUNT,
            mask,
            buf,
        ) as c_int
    }
}
