//! The one raw syscall this crate makes, as a thin wrapper returning `io::Result`.

use std::io;

use seccompiler::sock_filter;

use crate::BPF_MAXINSNS;

/// The kernel's `struct sock_fprog` (`linux/filter.h`), over seccompiler's `sock_filter`
/// (which has the layout of the kernel's: `u16 code; u8 jt; u8 jf; u32 k`, `repr(C)`).
#[repr(C)]
struct SockFprog {
    len: libc::c_ushort,
    filter: *const sock_filter,
}

/// `seccomp(SECCOMP_SET_MODE_FILTER, 0, &prog)`: adds `prog` to the calling thread's filters.
///
/// Neither allocates nor takes a lock, so it may run between `fork` and `execve`. Fails with
/// `EINVAL` for an empty program or one longer than [`BPF_MAXINSNS`] (the kernel would too),
/// `EACCES` without `no_new_privs` or `CAP_SYS_ADMIN`, and `EINVAL`/`EFAULT` for a program the
/// kernel's verifier rejects.
pub(crate) fn seccomp_set_mode_filter(prog: &[sock_filter]) -> io::Result<()> {
    let len = match u16::try_from(prog.len()) {
        Ok(len) if len > 0 && usize::from(len) <= BPF_MAXINSNS => len,
        _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
    };
    let fprog = SockFprog {
        len,
        filter: prog.as_ptr(),
    };
    // SAFETY: `fprog` lives on this stack frame until the call returns and points at `len`
    // initialised instructions of `prog`, which the borrow keeps alive and unmoved for the
    // duration of the call; `len` was checked to be exactly `prog.len()`. The kernel only reads
    // through the pointer (it copies the program in before returning) and writes no memory of
    // ours. The remaining arguments are plain integers passed at `c_ulong` width, the width the
    // kernel reads them at. The call's effect on the process (a new seccomp filter) is the
    // documented purpose of this function and cannot invalidate any Rust invariant.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::c_ulong::from(libc::SECCOMP_SET_MODE_FILTER),
            0 as libc::c_ulong,
            &fprog as *const SockFprog,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
