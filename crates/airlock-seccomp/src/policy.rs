//! The policy itself, as data: which syscalls the payload may make, on which arguments, and
//! which refusals carry an errno other than the default `EPERM`.
//!
//! Nothing here touches the kernel; [`crate::build`] compiles these tables with seccompiler.
//! The policy is an allowlist: a syscall that is not named in [`allowed`] is refused with
//! `EPERM`. [`DENIED`] is not consulted by the filter at all; it lists the dangerous syscalls we
//! have decided never to allow, and the tests check that the allowlist stays clear of them.

use std::collections::BTreeMap;

use seccompiler::{BackendError, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};

/// Syscall numbers: `libc`'s tables plus the newer calls that `libc` 0.2.191 does not name yet.
///
/// Since Linux 5.1 (number 424) new syscalls get the same number on every architecture, so the
/// numbers at or above 424 defined here hold for x86_64 and aarch64 alike.
// Named like libc's constants so the tables read alike; some are named only for the test-only
// deny list.
#[allow(non_upper_case_globals, dead_code)]
pub(crate) mod nr {
    pub(crate) use libc::*;

    /// Linux 6.5: page-cache residency of a file range (a read-only query).
    pub(crate) const SYS_cachestat: c_long = 451;
    /// Linux 6.6: CET shadow stacks, which newer glibc sets up for the program itself.
    pub(crate) const SYS_map_shadow_stack: c_long = 453;
    /// Linux 6.7: the futex2 calls.
    pub(crate) const SYS_futex_wake: c_long = 454;
    /// Linux 6.7.
    pub(crate) const SYS_futex_wait: c_long = 455;
    /// Linux 6.7.
    pub(crate) const SYS_futex_requeue: c_long = 456;
    /// Linux 6.8: mount information by id. Not allowed; named for the deny list.
    pub(crate) const SYS_statmount: c_long = 457;
    /// Linux 6.8: lists mounts. Not allowed; named for the deny list.
    pub(crate) const SYS_listmount: c_long = 458;
    /// Linux 6.13: the `*xattrat` family.
    pub(crate) const SYS_setxattrat: c_long = 463;
    /// Linux 6.13.
    pub(crate) const SYS_getxattrat: c_long = 464;
    /// Linux 6.13.
    pub(crate) const SYS_listxattrat: c_long = 465;
    /// Linux 6.13.
    pub(crate) const SYS_removexattrat: c_long = 466;
    /// Linux 6.15: `open_tree` with mount attributes. Not allowed; named for the deny list.
    pub(crate) const SYS_open_tree_attr: c_long = 467;
    /// Linux 6.17: inode flags (the syscall form of `FS_IOC_FSGETXATTR`).
    pub(crate) const SYS_file_getattr: c_long = 468;
    /// Linux 6.17: inode flags (the syscall form of `FS_IOC_FSSETXATTR`).
    pub(crate) const SYS_file_setattr: c_long = 469;

    // Removed from the kernel long ago, and from `libc`; still in x86_64's table.
    /// `create_module` (Linux 2.4).
    #[cfg(target_arch = "x86_64")]
    pub(crate) const SYS_create_module: c_long = 174;
    /// `get_kernel_syms` (Linux 2.4).
    #[cfg(target_arch = "x86_64")]
    pub(crate) const SYS_get_kernel_syms: c_long = 177;
    /// `query_module` (Linux 2.4).
    #[cfg(target_arch = "x86_64")]
    pub(crate) const SYS_query_module: c_long = 178;

    /// `io_pgetevents` (Linux 4.18; the old AIO's `io_getevents` with a signal mask).
    #[cfg(target_arch = "x86_64")]
    pub(crate) const SYS_io_pgetevents: c_long = 333;
    /// `io_pgetevents`.
    #[cfg(target_arch = "aarch64")]
    pub(crate) const SYS_io_pgetevents: c_long = 292;

    // Generic-table calls that `libc` does not name for aarch64.
    /// `getrlimit` (arm64 defines `__ARCH_WANT_SET_GET_RLIMIT`).
    #[cfg(target_arch = "aarch64")]
    pub(crate) const SYS_getrlimit: c_long = 163;
    /// `setrlimit`.
    #[cfg(target_arch = "aarch64")]
    pub(crate) const SYS_setrlimit: c_long = 164;
    /// Linux 6.6: `fchmodat` with a flags argument (glibc 2.39 uses it for `lchmod`).
    #[cfg(target_arch = "aarch64")]
    pub(crate) const SYS_fchmodat2: c_long = 452;
    /// `sync_file_range` (arm64 does not want the `sync_file_range2` variant).
    #[cfg(target_arch = "aarch64")]
    pub(crate) const SYS_sync_file_range: c_long = 84;
}

/// `[(number, "SYS_name"), ...]` from syscall constant names in [`nr`].
macro_rules! syscalls {
    ($($name:ident),* $(,)?) => {
        &[$((nr::$name as i64, stringify!($name))),*]
    };
}

/// Syscall number -> rules, any one of which must match; an empty list matches the syscall
/// whatever its arguments.
pub(crate) type RuleMap = BTreeMap<i64, Vec<SeccompRule>>;

/// A syscall by number, with its name for error messages and tests.
pub(crate) type Syscall = (i64, &'static str);

/// Allowed whatever their arguments, on every supported architecture.
///
/// Grouped by what they are for. Each is harmless to a sandbox that is already in its own
/// user, pid, mount, net, ipc, uts and cgroup namespaces with every capability dropped: what
/// they could do is bounded by those layers, by landlock and by the rlimits.
const ALWAYS: &[Syscall] = syscalls![
    // Files: reading, writing, positioning.
    SYS_read,
    SYS_write,
    SYS_readv,
    SYS_writev,
    SYS_pread64,
    SYS_pwrite64,
    SYS_preadv,
    SYS_pwritev,
    SYS_preadv2,
    SYS_pwritev2,
    SYS_lseek,
    SYS_sendfile,
    SYS_splice,
    SYS_tee,
    SYS_vmsplice,
    SYS_copy_file_range,
    SYS_readahead,
    SYS_fadvise64,
    // Files: opening, closing, descriptors.
    SYS_openat,
    SYS_openat2,
    SYS_close,
    SYS_close_range,
    SYS_dup,
    SYS_dup3,
    SYS_pipe2,
    SYS_fcntl,
    SYS_flock,
    SYS_memfd_create,
    // Files: metadata.
    SYS_fstat,
    SYS_newfstatat,
    SYS_statx,
    SYS_statfs,
    SYS_fstatfs,
    SYS_faccessat,
    SYS_faccessat2,
    SYS_getdents64,
    SYS_readlinkat,
    SYS_fchmod,
    SYS_fchmodat,
    SYS_fchmodat2,
    // Ownership changes need CAP_CHOWN over the file's owner in our user namespace.
    SYS_fchown,
    SYS_fchownat,
    SYS_utimensat,
    SYS_umask,
    SYS_cachestat,
    SYS_file_getattr,
    SYS_file_setattr,
    // Extended attributes: `trusted.*` and `security.*` need capabilities we do not have.
    SYS_getxattr,
    SYS_lgetxattr,
    SYS_fgetxattr,
    SYS_getxattrat,
    SYS_setxattr,
    SYS_lsetxattr,
    SYS_fsetxattr,
    SYS_setxattrat,
    SYS_listxattr,
    SYS_llistxattr,
    SYS_flistxattr,
    SYS_listxattrat,
    SYS_removexattr,
    SYS_lremovexattr,
    SYS_fremovexattr,
    SYS_removexattrat,
    // Files: the namespace of names (landlock decides where).
    SYS_mkdirat,
    // Device nodes need CAP_MKNOD in the initial namespace; FIFOs (mkfifo) do not.
    SYS_mknodat,
    SYS_unlinkat,
    SYS_renameat2,
    SYS_linkat,
    SYS_symlinkat,
    SYS_truncate,
    SYS_ftruncate,
    SYS_fallocate,
    SYS_chdir,
    SYS_fchdir,
    SYS_getcwd,
    // Files: durability. (`sync` is left out on purpose: it flushes every filesystem of the
    // host, a lever on the neighbours; glibc's `sync()` returns void, so callers cannot tell.)
    SYS_fsync,
    SYS_fdatasync,
    SYS_syncfs,
    SYS_sync_file_range,
    // File change notification (fanotify is not here: it needs CAP_SYS_ADMIN and watches
    // whole mounts).
    SYS_inotify_init1,
    SYS_inotify_add_watch,
    SYS_inotify_rm_watch,
    // Memory. NUMA placement calls (mbind, set_mempolicy, migrate_pages, move_pages) are not
    // here: they reach other processes' pages and the host's node layout.
    SYS_brk,
    SYS_mmap,
    SYS_munmap,
    SYS_mprotect,
    SYS_mremap,
    SYS_madvise,
    SYS_msync,
    SYS_mincore,
    SYS_remap_file_pages,
    // Bounded by RLIMIT_MEMLOCK.
    SYS_mlock,
    SYS_mlock2,
    SYS_munlock,
    SYS_mlockall,
    SYS_munlockall,
    SYS_membarrier,
    SYS_pkey_alloc,
    SYS_pkey_free,
    SYS_pkey_mprotect,
    SYS_mseal,
    SYS_map_shadow_stack,
    SYS_get_mempolicy,
    // Processes and threads. `clone` is conditioned below; `clone3` gets ENOSYS.
    SYS_execve,
    SYS_execveat,
    SYS_exit,
    SYS_exit_group,
    SYS_wait4,
    SYS_waitid,
    SYS_set_tid_address,
    SYS_set_robust_list,
    SYS_get_robust_list,
    SYS_rseq,
    SYS_futex,
    SYS_futex_waitv,
    SYS_futex_wake,
    SYS_futex_wait,
    SYS_futex_requeue,
    SYS_restart_syscall,
    // Signals. Every process we could signal is inside our pid namespace.
    SYS_kill,
    SYS_tkill,
    SYS_tgkill,
    SYS_rt_sigaction,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_rt_sigpending,
    SYS_rt_sigsuspend,
    SYS_rt_sigtimedwait,
    SYS_rt_sigqueueinfo,
    SYS_rt_tgsigqueueinfo,
    SYS_sigaltstack,
    SYS_pidfd_open,
    SYS_pidfd_send_signal,
    // Identity. The set* calls need capabilities we have dropped, or only shuffle the ids we
    // already hold; capset can only lower what we have.
    SYS_getpid,
    SYS_getppid,
    SYS_gettid,
    SYS_getuid,
    SYS_geteuid,
    SYS_getgid,
    SYS_getegid,
    SYS_getresuid,
    SYS_getresgid,
    SYS_getgroups,
    SYS_setuid,
    SYS_setgid,
    SYS_setreuid,
    SYS_setregid,
    SYS_setresuid,
    SYS_setresgid,
    SYS_setfsuid,
    SYS_setfsgid,
    SYS_setgroups,
    SYS_getpgid,
    SYS_setpgid,
    SYS_getsid,
    SYS_setsid,
    SYS_capget,
    SYS_capset,
    // Process attributes. prctl is needed by many runtimes (names, NO_NEW_PRIVS, THP, ...);
    // its dangerous options need capabilities we have dropped.
    SYS_prctl,
    // Raising a hard limit needs CAP_SYS_RESOURCE, so in effect these can only lower them.
    SYS_getrlimit,
    SYS_setrlimit,
    SYS_prlimit64,
    SYS_getrusage,
    SYS_times,
    SYS_getpriority,
    SYS_setpriority,
    SYS_ioprio_get,
    SYS_ioprio_set,
    // Scheduling. Real-time classes need CAP_SYS_NICE or an RLIMIT_RTPRIO we set to 0.
    SYS_sched_yield,
    SYS_sched_getaffinity,
    SYS_sched_setaffinity,
    SYS_sched_getparam,
    SYS_sched_setparam,
    SYS_sched_getscheduler,
    SYS_sched_setscheduler,
    SYS_sched_get_priority_max,
    SYS_sched_get_priority_min,
    SYS_sched_rr_get_interval,
    SYS_sched_getattr,
    SYS_sched_setattr,
    SYS_getcpu,
    // Self-restriction: both can only take rights away.
    SYS_seccomp,
    SYS_landlock_create_ruleset,
    SYS_landlock_add_rule,
    SYS_landlock_restrict_self,
    // System information (the uts namespace answers uname).
    SYS_uname,
    SYS_sysinfo,
    SYS_getrandom,
    // Time: reading it, sleeping, timers. Setting the clock is not here.
    SYS_clock_gettime,
    SYS_clock_getres,
    SYS_clock_nanosleep,
    SYS_nanosleep,
    SYS_gettimeofday,
    SYS_getitimer,
    SYS_setitimer,
    SYS_timer_create,
    SYS_timer_settime,
    SYS_timer_gettime,
    SYS_timer_getoverrun,
    SYS_timer_delete,
    SYS_timerfd_create,
    SYS_timerfd_settime,
    SYS_timerfd_gettime,
    // Waiting for events.
    SYS_ppoll,
    SYS_pselect6,
    SYS_epoll_create1,
    SYS_epoll_ctl,
    SYS_epoll_pwait,
    SYS_epoll_pwait2,
    SYS_eventfd2,
    SYS_signalfd4,
    // Sockets. `socket` and `socketpair` are conditioned below; the rest act on descriptors
    // we already hold, in our own network namespace.
    SYS_connect,
    SYS_bind,
    SYS_listen,
    SYS_accept,
    SYS_accept4,
    SYS_sendto,
    SYS_recvfrom,
    SYS_sendmsg,
    SYS_recvmsg,
    SYS_sendmmsg,
    SYS_recvmmsg,
    SYS_getsockopt,
    SYS_setsockopt,
    SYS_getsockname,
    SYS_getpeername,
    SYS_shutdown,
    // System V and POSIX IPC, private to our ipc namespace.
    SYS_shmget,
    SYS_shmat,
    SYS_shmctl,
    SYS_shmdt,
    SYS_msgget,
    SYS_msgsnd,
    SYS_msgrcv,
    SYS_msgctl,
    SYS_semget,
    SYS_semop,
    SYS_semtimedop,
    SYS_semctl,
    SYS_mq_open,
    SYS_mq_unlink,
    SYS_mq_timedsend,
    SYS_mq_timedreceive,
    SYS_mq_notify,
    SYS_mq_getsetattr,
    // The old (non-io_uring) asynchronous I/O, bounded by fs.aio-max-nr.
    SYS_io_setup,
    SYS_io_destroy,
    SYS_io_submit,
    SYS_io_cancel,
    SYS_io_getevents,
    SYS_io_pgetevents,
];

/// The legacy x86_64 calls that the generic syscall table (aarch64) replaced with `*at` or
/// `p*` forms. Old binaries and static libcs still make them.
#[cfg(target_arch = "x86_64")]
const ALWAYS_X86_64: &[Syscall] = syscalls![
    SYS_open,
    SYS_creat,
    SYS_stat,
    SYS_lstat,
    SYS_access,
    SYS_readlink,
    SYS_getdents,
    SYS_pipe,
    SYS_dup2,
    SYS_poll,
    SYS_select,
    SYS_epoll_create,
    SYS_epoll_wait,
    SYS_eventfd,
    SYS_signalfd,
    SYS_inotify_init,
    SYS_pause,
    SYS_alarm,
    SYS_time,
    SYS_getpgrp,
    SYS_fork,
    SYS_vfork,
    SYS_rename,
    SYS_renameat,
    SYS_mkdir,
    SYS_rmdir,
    SYS_link,
    SYS_unlink,
    SYS_symlink,
    SYS_mknod,
    SYS_chmod,
    SYS_chown,
    SYS_lchown,
    SYS_utime,
    SYS_utimes,
    SYS_futimesat,
    // Sets the FS/GS base for thread-local storage; glibc needs it at startup.
    SYS_arch_prctl,
];

/// Syscalls we refuse on purpose. The filter does not use this list (anything not allowed is
/// refused); the tests check that none of these is ever allowed and that each gets `EPERM`.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const DENIED: &[Syscall] = syscalls![
    // Mounts and the filesystem root.
    SYS_mount,
    SYS_umount2,
    SYS_pivot_root,
    SYS_chroot,
    SYS_move_mount,
    SYS_open_tree,
    SYS_open_tree_attr,
    SYS_fsopen,
    SYS_fsconfig,
    SYS_fsmount,
    SYS_fspick,
    SYS_mount_setattr,
    SYS_statmount,
    SYS_listmount,
    SYS_quotactl,
    SYS_quotactl_fd,
    SYS_swapon,
    SYS_swapoff,
    // New namespaces (clone with namespace flags is refused by its condition; clone3 by ENOSYS).
    SYS_unshare,
    SYS_setns,
    // Reaching into other processes.
    SYS_ptrace,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_process_madvise,
    SYS_process_mrelease,
    SYS_kcmp,
    SYS_pidfd_getfd,
    // Kernel attack surface that sandboxed code has no use for.
    SYS_keyctl,
    SYS_add_key,
    SYS_request_key,
    SYS_bpf,
    SYS_perf_event_open,
    SYS_userfaultfd,
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
    SYS_fanotify_init,
    SYS_fanotify_mark,
    SYS_open_by_handle_at,
    SYS_name_to_handle_at,
    SYS_memfd_secret,
    // Kernel modules and kexec.
    SYS_init_module,
    SYS_finit_module,
    SYS_delete_module,
    SYS_kexec_load,
    SYS_kexec_file_load,
    // The machine as a whole.
    SYS_reboot,
    SYS_acct,
    SYS_syslog,
    SYS_vhangup,
    SYS_sethostname,
    SYS_setdomainname,
    SYS_sync,
    SYS_settimeofday,
    SYS_clock_settime,
    SYS_clock_adjtime,
    SYS_adjtimex,
    // NUMA placement.
    SYS_mbind,
    SYS_set_mempolicy,
    SYS_set_mempolicy_home_node,
    SYS_migrate_pages,
    SYS_move_pages,
];

/// Legacy x86_64 calls refused on purpose (see [`DENIED`]).
#[cfg(target_arch = "x86_64")]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const DENIED_X86_64: &[Syscall] = syscalls![
    SYS_iopl,
    SYS_ioperm,
    SYS_modify_ldt,
    SYS_uselib,
    SYS_ustat,
    SYS_sysfs,
    SYS__sysctl,
    SYS_create_module,
    SYS_get_kernel_syms,
    SYS_query_module,
    SYS_nfsservctl,
    SYS_lookup_dcookie,
    SYS_vserver,
    SYS_afs_syscall,
    SYS_tuxcall,
    SYS_security,
    SYS_getpmsg,
    SYS_putpmsg,
    SYS_epoll_ctl_old,
    SYS_epoll_wait_old,
    SYS_set_thread_area,
    SYS_get_thread_area,
];

/// Every syscall allowed whatever its arguments, for the architecture we compile for.
pub(crate) fn always_allowed() -> Vec<Syscall> {
    let mut all = ALWAYS.to_vec();
    #[cfg(target_arch = "x86_64")]
    all.extend_from_slice(ALWAYS_X86_64);
    all
}

/// Every syscall in the deny list, for the architecture we compile for.
#[cfg(test)]
pub(crate) fn denied() -> Vec<Syscall> {
    let mut all = DENIED.to_vec();
    #[cfg(target_arch = "x86_64")]
    all.extend_from_slice(DENIED_X86_64);
    all
}

/// The namespace flags a plain `clone` may not carry. Any of them would give the payload a
/// fresh namespace in which it holds every capability: the first step of most container
/// escapes and of many kernel exploits.
pub(crate) const CLONE_NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWTIME) as u64;

/// `TIOCSTI`: push bytes into a terminal's input queue, i.e. type commands into the shell that
/// owns the terminal.
pub(crate) const TIOCSTI: u64 = 0x5412;
/// `TIOCLINUX`: virtual-console subcommands, among them a `TIOCSTI`-like paste of the selection.
pub(crate) const TIOCLINUX: u64 = 0x541C;

/// `personality(0xffffffff)`: asks for the current persona without changing it.
pub(crate) const PERSONALITY_QUERY: u64 = 0xffff_ffff;
/// `PER_LINUX`: the default persona.
pub(crate) const PER_LINUX: u64 = 0;

/// The socket families the payload may create. Everything else (netlink, packet, vsock, alg,
/// key, bluetooth, ...) is kernel attack surface or a way past the network namespace.
pub(crate) const SOCKET_FAMILIES: [u64; 3] =
    [libc::AF_UNIX as u64, libc::AF_INET as u64, libc::AF_INET6 as u64];

/// A condition on the low 32 bits of argument `index`.
///
/// Every argument conditioned here is a C `int` or `unsigned int` in the kernel (`clone` keeps
/// only `lower_32_bits(flags)`), so the kernel ignores the high half and so must we: comparing
/// all 64 bits would let `0x1_0000_5412` slip past a rule meant for `0x5412`.
fn low32(index: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, BackendError> {
    SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, value)
}

/// The rules of the allowlist: syscall number -> rules, any one of which must match (an empty
/// list allows the syscall whatever its arguments).
pub(crate) fn allowed() -> Result<RuleMap, BackendError> {
    let mut rules: RuleMap = always_allowed()
        .into_iter()
        .map(|(number, _)| (number, Vec::new()))
        .collect();

    // clone(flags, ...): flags is argument 0 on every architecture we build for. Allowed only
    // without namespace flags: `(flags & CLONE_NAMESPACE_FLAGS) == 0`.
    rules.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![low32(
            0,
            SeccompCmpOp::MaskedEq(CLONE_NAMESPACE_FLAGS),
            0,
        )?])?],
    );

    // ioctl(fd, request, ...): every request but the two that inject terminal input.
    rules.insert(
        libc::SYS_ioctl,
        vec![SeccompRule::new(vec![
            low32(1, SeccompCmpOp::Ne, TIOCSTI)?,
            low32(1, SeccompCmpOp::Ne, TIOCLINUX)?,
        ])?],
    );

    // personality(persona): only the query and the default persona. Others (notably
    // ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC) weaken the process's own exploit mitigations.
    rules.insert(
        libc::SYS_personality,
        vec![
            SeccompRule::new(vec![low32(0, SeccompCmpOp::Eq, PERSONALITY_QUERY)?])?,
            SeccompRule::new(vec![low32(0, SeccompCmpOp::Eq, PER_LINUX)?])?,
        ],
    );

    // socket(family, type, protocol): the families in SOCKET_FAMILIES. The refusal for other
    // families is EAFNOSUPPORT (see `errno_overrides`); this rule is the backstop.
    rules.insert(
        libc::SYS_socket,
        SOCKET_FAMILIES
            .iter()
            .map(|&family| SeccompRule::new(vec![low32(0, SeccompCmpOp::Eq, family)?]))
            .collect::<Result<_, _>>()?,
    );

    // socketpair(family, ...): only AF_UNIX exists in practice.
    rules.insert(
        libc::SYS_socketpair,
        vec![SeccompRule::new(vec![low32(
            0,
            SeccompCmpOp::Eq,
            libc::AF_UNIX as u64,
        )?])?],
    );

    Ok(rules)
}

/// Refusals that answer with a more useful errno than `EPERM`: errno -> rules that select the
/// syscalls (and arguments) that get it. These are checked before the allowlist.
pub(crate) fn errno_overrides() -> Result<Vec<(u32, RuleMap)>, BackendError> {
    // clone3 passes its flags behind a pointer that a seccomp filter cannot read, so we cannot
    // tell a thread from a new user namespace. ENOSYS makes glibc (2.34+) and the Rust and Go
    // runtimes fall back to clone, whose flags we can check.
    let enosys = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);

    // A family we do not allow looks, to the program, like one the kernel was built without:
    // the error programs already handle (Python's socket module, getaddrinfo, ...).
    let not_family = |allowed: &[u64]| -> Result<SeccompRule, BackendError> {
        SeccompRule::new(
            allowed
                .iter()
                .map(|&family| low32(0, SeccompCmpOp::Ne, family))
                .collect::<Result<_, _>>()?,
        )
    };
    let eafnosupport = BTreeMap::from([
        (libc::SYS_socket, vec![not_family(&SOCKET_FAMILIES)?]),
        (libc::SYS_socketpair, vec![not_family(&[libc::AF_UNIX as u64])?]),
    ]);

    Ok(vec![
        (libc::ENOSYS as u32, enosys),
        (libc::EAFNOSUPPORT as u32, eafnosupport),
    ])
}
