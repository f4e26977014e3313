/*
 * The syscall escapes of tests/contract_attacks.rs, all in one run: `escapes MARKER` makes
 * each call the way an attacker would, each in a child process of its own (a call the
 * sandbox answers by killing the caller ends only that child), and prints one JSON object:
 *
 *     {"marker_visible": 0, "getpid": {"ret": 7, "errno": 0}, "mount": {"ret": -1,
 *      "errno": 1}, "iopl": {"signal": 31}, ...}
 *
 * MARKER is a path on the host, in a directory the test made: the program must not see it,
 * before or after its chroot escape attempt.
 *
 * Each call has arguments with which a caller holding the privilege would SUCCEED, or
 * would get past the permission check to an error of its own (EINVAL, EBADF, ENOENT,
 * ESTALE): a refusal (EPERM, EACCES, ENOSYS, or the caller killed) shows the sandbox at
 * work, whatever its mechanism. And each is harmless should it ever get through: the mount
 * is a tmpfs on an empty directory this program made (and takes down again), reboot and
 * kexec carry invalid magic and flags, swapon names a nonexistent path, the hostname, the
 * kernel time zone and the clock tick are written back with the values just read, keys,
 * maps, rings and sockets live as long as the child, the traced process is this program's
 * own child, and nothing is connected to.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <linux/reboot.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/timex.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_clone3
#define SYS_clone3 435
#endif
#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

static const char *marker;

/* A fresh empty directory under /tmp, made for each call before its child starts: the
 * only place a mount is ever aimed at. The parent unmounts whatever got mounted there and
 * removes it once the child has ended (tidy_up), from outside any chroot the child made. */
static char made[sizeof "/tmp/airlock-escape-XXXXXX"];

static const char *empty_dir(void) {
    return made;
}

static void make_dir(void) {
    strcpy(made, "/tmp/airlock-escape-XXXXXX");
    if (!mkdtemp(made)) {
        perror("mkdtemp");
        exit(2);
    }
}

static void tidy_up(void) {
    umount2(made, MNT_DETACH);
    rmdir(made);
}

/* A child made by a clone that should have been refused leaves at once. */
static long reap_clone(long ret) {
    if (ret == 0)
        _exit(0);
    if (ret > 0)
        waitpid((pid_t)ret, NULL, __WALL);
    return ret > 0 ? 0 : ret;
}

struct clone_args_v0 {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

/* The classic chroot escape: chroot into a subdirectory while holding the old root as the
 * working directory, climb, and chroot to where the climb ended. 0 only when the host's
 * MARKER is visible afterwards; otherwise the first refusal, or ENOENT. */
static long chroot_escape(void) {
    const char *dir = empty_dir();
    if (chdir("/") != 0)
        return -1;
    if (syscall(SYS_chroot, dir) != 0)
        return -1;
    for (int i = 0; i < 64; i++)
        if (chdir("..") != 0)
            return -1;
    if (syscall(SYS_chroot, ".") != 0)
        return -1;
    if (access(marker, F_OK) == 0)
        return 0;
    errno = ENOENT;
    return -1;
}

static long ptrace_child(void) {
    pid_t pid = fork();
    if (pid == 0) {
        pause();
        _exit(0);
    }
    long ret = syscall(SYS_ptrace, PTRACE_ATTACH, pid, 0, 0);
    int err = errno;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, __WALL);
    errno = err;
    return ret;
}

static long bpf_map(void) {
    union bpf_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.map_type = BPF_MAP_TYPE_ARRAY;
    attr.key_size = 4;
    attr.value_size = 4;
    attr.max_entries = 1;
    return syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof attr);
}

static long perf_self(void) {
    /* Counting this process's own user-mode CPU clock: allowed to anyone under
     * perf_event_paranoid <= 2 unless the call itself is refused. */
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.type = PERF_TYPE_SOFTWARE;
    attr.size = sizeof attr;
    attr.config = PERF_COUNT_SW_CPU_CLOCK;
    attr.disabled = 1;
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    return syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0UL);
}

static long open_by_handle(void) {
    /* A made-up handle: ESTALE or EINVAL for a caller allowed to make the call. */
    struct {
        unsigned int handle_bytes;
        int handle_type;
        unsigned char f_handle[64];
    } h;
    memset(&h, 0, sizeof h);
    h.handle_bytes = 8;
    h.handle_type = 1;
    int root = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return syscall(SYS_open_by_handle_at, root, &h, O_RDONLY);
}

static long settimeofday_tz(void) {
    /* The kernel's time zone, written back as read. A zone west or east of UTC is left
     * alone: the first such write since boot would warp the clock. */
    struct timeval tv;
    struct timezone tz;
    if (syscall(SYS_gettimeofday, &tv, &tz) != 0)
        return -1;
    if (tz.tz_minuteswest != 0) {
        errno = EDOM; /* reported, and the test fails: it cannot judge this host */
        return -1;
    }
    return syscall(SYS_settimeofday, NULL, &tz);
}

static long adjtime_tick(void) {
    /* The clock's tick, written back as read: a change only to a caller allowed to set
     * the clock, and not even a change then. */
    struct timex tx;
    memset(&tx, 0, sizeof tx);
    if (syscall(SYS_clock_adjtime, CLOCK_REALTIME, &tx) < 0)
        return -1;
    long tick = tx.tick;
    memset(&tx, 0, sizeof tx);
    tx.modes = ADJ_TICK;
    tx.tick = tick;
    return syscall(SYS_clock_adjtime, CLOCK_REALTIME, &tx);
}

static long sethostname_same(void) {
    char name[256];
    if (gethostname(name, sizeof name) != 0)
        return -1;
    return syscall(SYS_sethostname, name, strlen(name));
}

static long attack(const char *name) {
    if (!strcmp(name, "getpid"))
        return syscall(SYS_getpid);
    if (!strcmp(name, "mount"))
        return syscall(SYS_mount, "none", empty_dir(), "tmpfs", 0UL, "size=4k");
    if (!strcmp(name, "umount2"))
        /* Not a mount point: EINVAL for a caller allowed to unmount. */
        return syscall(SYS_umount2, empty_dir(), MNT_DETACH);
    if (!strcmp(name, "pivot_root")) {
        const char *dir = empty_dir();
        return syscall(SYS_pivot_root, dir, dir);
    }
    if (!strcmp(name, "chroot"))
        return syscall(SYS_chroot, empty_dir());
    if (!strcmp(name, "chroot_escape"))
        return chroot_escape();
    if (!strcmp(name, "unshare_user"))
        return syscall(SYS_unshare, CLONE_NEWUSER);
    if (!strcmp(name, "unshare_user_mount"))
        return syscall(SYS_unshare, CLONE_NEWUSER | CLONE_NEWNS);
    if (!strcmp(name, "unshare_mount"))
        return syscall(SYS_unshare, CLONE_NEWNS);
    if (!strcmp(name, "clone_user"))
        return reap_clone(syscall(SYS_clone, (unsigned long)(CLONE_NEWUSER | SIGCHLD), 0UL, 0UL, 0UL, 0UL));
    if (!strcmp(name, "clone_mount"))
        return reap_clone(syscall(SYS_clone, (unsigned long)(CLONE_NEWNS | SIGCHLD), 0UL, 0UL, 0UL, 0UL));
    if (!strcmp(name, "clone3_user")) {
        struct clone_args_v0 args;
        memset(&args, 0, sizeof args);
        args.flags = CLONE_NEWUSER;
        args.exit_signal = SIGCHLD;
        return reap_clone(syscall(SYS_clone3, &args, sizeof args));
    }
    if (!strcmp(name, "setns")) {
        int fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            _exit(3);
        return syscall(SYS_setns, fd, CLONE_NEWNET);
    }
    if (!strcmp(name, "ptrace"))
        return ptrace_child();
    if (!strcmp(name, "kexec_load"))
        /* No segments and an architecture that does not exist: EINVAL past the check. */
        return syscall(SYS_kexec_load, 0UL, 0UL, NULL, 0x00770000UL);
    if (!strcmp(name, "kexec_file_load"))
        return syscall(SYS_kexec_file_load, -1, -1, 0UL, "", 0UL);
    if (!strcmp(name, "reboot"))
        /* Invalid magic: EINVAL even for a caller allowed to reboot. */
        return syscall(SYS_reboot, 0xdeadbeef, 0xdeadbeef, LINUX_REBOOT_CMD_CAD_OFF, NULL);
    if (!strcmp(name, "init_module"))
        return syscall(SYS_init_module, NULL, 0UL, "");
    if (!strcmp(name, "finit_module"))
        return syscall(SYS_finit_module, -1, "", 0);
    if (!strcmp(name, "bpf"))
        return bpf_map();
    if (!strcmp(name, "perf_event_open"))
        return perf_self();
    if (!strcmp(name, "keyctl"))
        return syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0);
    if (!strcmp(name, "add_key"))
        return syscall(SYS_add_key, "user", "airlock-escape", "x", 1UL, KEY_SPEC_PROCESS_KEYRING);
    if (!strcmp(name, "userfaultfd"))
        /* User-mode faults only: what an unprivileged caller may ask for. */
        return syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
    if (!strcmp(name, "io_uring_setup")) {
        char params[120]; /* struct io_uring_params, zeroed: one entry, default flags */
        memset(params, 0, sizeof params);
        return syscall(SYS_io_uring_setup, 1U, params);
    }
    if (!strcmp(name, "socket_vsock"))
        /* The channel between a VM and its host. */
        return syscall(SYS_socket, AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (!strcmp(name, "open_by_handle_at"))
        return open_by_handle();
    if (!strcmp(name, "iopl"))
        return syscall(SYS_iopl, 3);
    if (!strcmp(name, "ioperm"))
        return syscall(SYS_ioperm, 0x80UL, 1UL, 1);
    if (!strcmp(name, "swapon"))
        return syscall(SYS_swapon, "/nonexistent/airlock-swap", 0);
    if (!strcmp(name, "settimeofday"))
        return settimeofday_tz();
    if (!strcmp(name, "clock_adjtime"))
        return adjtime_tick();
    if (!strcmp(name, "sethostname"))
        return sethostname_same();
    _exit(4);
}

static const char *const ATTACKS[] = {
    "getpid", "mount", "umount2", "pivot_root", "chroot", "chroot_escape",
    "unshare_user", "unshare_user_mount", "unshare_mount", "clone_user", "clone_mount",
    "clone3_user", "setns", "ptrace", "kexec_load", "kexec_file_load", "reboot",
    "init_module", "finit_module", "bpf", "perf_event_open", "keyctl", "add_key",
    "userfaultfd", "io_uring_setup", "socket_vsock", "open_by_handle_at", "iopl", "ioperm", "swapon", "settimeofday",
    "clock_adjtime", "sethostname",
};

/* Runs one attack in a child; prints `"NAME": {...}`. */
static void run(const char *name) {
    int fds[2];
    make_dir();
    if (pipe(fds) != 0) {
        perror("pipe");
        exit(2);
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(2);
    }
    if (pid == 0) {
        close(fds[0]);
        errno = 0;
        long r[2];
        r[0] = attack(name);
        r[1] = r[0] == -1 ? errno : 0;
        if (write(fds[1], r, sizeof r) != sizeof r)
            _exit(5);
        _exit(0);
    }
    close(fds[1]);
    long r[2];
    ssize_t n = read(fds[0], r, sizeof r);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    tidy_up();
    if (n == sizeof r)
        printf("\"%s\": {\"ret\": %ld, \"errno\": %ld}", name, r[0], r[1]);
    else if (WIFSIGNALED(status))
        printf("\"%s\": {\"signal\": %d}", name, WTERMSIG(status));
    else
        printf("\"%s\": {\"exit\": %d}", name, WEXITSTATUS(status));
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: escapes MARKER\n");
        return 2;
    }
    marker = argv[1];
    printf("{\"marker_visible\": %d", access(marker, F_OK) == 0);
    for (size_t i = 0; i < sizeof ATTACKS / sizeof *ATTACKS; i++) {
        printf(", ");
        run(ATTACKS[i]);
        fflush(stdout);
    }
    printf("}\n");
    return 0;
}
