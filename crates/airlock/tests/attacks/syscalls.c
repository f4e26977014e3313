/*
 * One denied syscall per invocation: `syscalls NAME` makes the call named NAME the way an
 * attacker would and prints `NAME ret=R errno=E` (errno 0 when the call succeeded).
 *
 * Every call is chosen to be harmless should it ever get through: mounts target an empty
 * temporary directory, reboot uses an invalid magic, swapon/acct name nonexistent paths,
 * children created by clone exit at once, nothing real is overwritten.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/keyctl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef SYS_fsopen
#define SYS_open_tree 428
#define SYS_move_mount 429
#define SYS_fsopen 430
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef SYS_clone3
#define SYS_clone3 435
#endif

/* A fresh empty directory under /tmp: the only place a mount is ever aimed at. */
static const char *empty_dir(void) {
    static char path[] = "/tmp/airlock-attack-XXXXXX";
    if (!mkdtemp(path)) {
        perror("mkdtemp");
        exit(3);
    }
    return path;
}

/* A child created by a clone that should have been refused leaves at once. */
static long reap_clone(long ret) {
    if (ret == 0)
        _exit(0);
    if (ret > 0)
        waitpid((pid_t)ret, NULL, __WALL);
    return ret;
}

struct clone_args_v0 {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

static long attack(const char *name) {
    if (!strcmp(name, "mount"))
        return syscall(SYS_mount, "none", empty_dir(), "tmpfs", 0UL, "size=4k");
    if (!strcmp(name, "umount2"))
        return syscall(SYS_umount2, empty_dir(), 0);
    if (!strcmp(name, "pivot_root")) {
        const char *dir = empty_dir();
        return syscall(SYS_pivot_root, dir, dir);
    }
    if (!strcmp(name, "chroot"))
        return syscall(SYS_chroot, empty_dir());
    if (!strcmp(name, "unshare_newuser"))
        return syscall(SYS_unshare, CLONE_NEWUSER);
    if (!strcmp(name, "unshare_newns"))
        return syscall(SYS_unshare, CLONE_NEWNS);
    if (!strcmp(name, "unshare_newnet"))
        return syscall(SYS_unshare, CLONE_NEWNET);
    if (!strcmp(name, "setns")) {
        int fd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            perror("open /proc/self/ns/net");
            exit(3);
        }
        return syscall(SYS_setns, fd, 0);
    }
    if (!strcmp(name, "clone_newuser"))
        return reap_clone(syscall(SYS_clone, (unsigned long)(CLONE_NEWUSER | SIGCHLD), 0UL, 0UL, 0UL, 0UL));
    if (!strcmp(name, "clone_newns"))
        return reap_clone(syscall(SYS_clone, (unsigned long)(CLONE_NEWNS | SIGCHLD), 0UL, 0UL, 0UL, 0UL));
    if (!strcmp(name, "clone3")) {
        struct clone_args_v0 args;
        memset(&args, 0, sizeof args);
        args.flags = CLONE_NEWUSER;
        args.exit_signal = SIGCHLD;
        return reap_clone(syscall(SYS_clone3, &args, sizeof args));
    }
    if (!strcmp(name, "ptrace_attach"))
        return syscall(SYS_ptrace, PTRACE_ATTACH, 1, 0, 0);
    if (!strcmp(name, "ptrace_traceme"))
        return syscall(SYS_ptrace, PTRACE_TRACEME, 0, 0, 0);
    if (!strcmp(name, "process_vm_readv") || !strcmp(name, "process_vm_writev")) {
        /* Reads (or writes) our own memory: succeeds unless the syscall is refused. */
        static char src[16] = "airlock", dst[16];
        struct iovec local = {dst, sizeof dst}, remote = {src, sizeof src};
        if (!strcmp(name, "process_vm_readv"))
            return syscall(SYS_process_vm_readv, getpid(), &local, 1UL, &remote, 1UL, 0UL);
        return syscall(SYS_process_vm_writev, getpid(), &remote, 1UL, &local, 1UL, 0UL);
    }
    if (!strcmp(name, "keyctl"))
        return syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0);
    if (!strcmp(name, "add_key"))
        return syscall(SYS_add_key, "user", "airlock-attack", "x", 1UL, KEY_SPEC_PROCESS_KEYRING);
    if (!strcmp(name, "request_key"))
        return syscall(SYS_request_key, "user", "airlock-attack", NULL, 0);
    if (!strcmp(name, "bpf")) {
        char attr[128];
        memset(attr, 0, sizeof attr);
        return syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, attr, sizeof attr);
    }
    if (!strcmp(name, "perf_event_open")) {
        /* struct perf_event_attr: type 1 (software), size 128, config 0 (cpu clock). */
        uint32_t attr[32];
        memset(attr, 0, sizeof attr);
        attr[0] = 1;
        attr[1] = sizeof attr;
        return syscall(SYS_perf_event_open, attr, 0, -1, -1, 0UL);
    }
    if (!strcmp(name, "userfaultfd"))
        return syscall(SYS_userfaultfd, O_CLOEXEC);
    if (!strcmp(name, "io_uring_setup")) {
        char params[120];
        memset(params, 0, sizeof params);
        return syscall(SYS_io_uring_setup, 1U, params);
    }
    if (!strcmp(name, "init_module"))
        return syscall(SYS_init_module, NULL, 0UL, "");
    if (!strcmp(name, "finit_module"))
        return syscall(SYS_finit_module, -1, "", 0);
    if (!strcmp(name, "delete_module"))
        return syscall(SYS_delete_module, "airlock_no_such_module", O_NONBLOCK);
    if (!strcmp(name, "kexec_load"))
        return syscall(SYS_kexec_load, 0UL, 0UL, NULL, 0UL);
    if (!strcmp(name, "kexec_file_load"))
        return syscall(SYS_kexec_file_load, -1, -1, 0UL, "", 0UL);
    if (!strcmp(name, "open_by_handle_at")) {
        /* struct file_handle with an empty payload: EINVAL/ESTALE if it were allowed. */
        struct {
            unsigned int handle_bytes;
            int handle_type;
            unsigned char f_handle[64];
        } h;
        memset(&h, 0, sizeof h);
        h.handle_bytes = 8;
        int root = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        return syscall(SYS_open_by_handle_at, root, &h, O_RDONLY);
    }
    if (!strcmp(name, "name_to_handle_at")) {
        /* tmpfs exports file handles: this succeeds unless the syscall is refused. */
        struct {
            unsigned int handle_bytes;
            int handle_type;
            unsigned char f_handle[128];
        } h;
        int mount_id;
        memset(&h, 0, sizeof h);
        h.handle_bytes = sizeof h.f_handle;
        return syscall(SYS_name_to_handle_at, AT_FDCWD, "/tmp", &h, &mount_id, 0);
    }
    if (!strcmp(name, "fsopen"))
        return syscall(SYS_fsopen, "tmpfs", 0U);
    if (!strcmp(name, "open_tree"))
        return syscall(SYS_open_tree, AT_FDCWD, "/tmp", (unsigned)(OPEN_TREE_CLONE | O_CLOEXEC));
    if (!strcmp(name, "move_mount"))
        return syscall(SYS_move_mount, -1, "", AT_FDCWD, empty_dir(), 0U);
    if (!strcmp(name, "mount_setattr"))
        return syscall(SYS_mount_setattr, AT_FDCWD, "/tmp", 0U, NULL, 0UL);
    if (!strcmp(name, "reboot"))
        /* Invalid magic numbers: EINVAL even for a caller allowed to reboot. */
        return syscall(SYS_reboot, 0x0badcafe, 0x0badf00d, 0 /* LINUX_REBOOT_CMD_CAD_OFF */, NULL);
    if (!strcmp(name, "swapon"))
        return syscall(SYS_swapon, "/nonexistent/airlock-swap", 0);
    if (!strcmp(name, "swapoff"))
        return syscall(SYS_swapoff, "/nonexistent/airlock-swap");
    if (!strcmp(name, "acct"))
        return syscall(SYS_acct, "/nonexistent/airlock-acct");
    if (!strcmp(name, "syslog"))
        return syscall(SYS_syslog, 10 /* SYSLOG_ACTION_SIZE_BUFFER */, NULL, 0);
    if (!strcmp(name, "personality_addr_no_randomize"))
        return syscall(SYS_personality, (unsigned long)(PER_LINUX | ADDR_NO_RANDOMIZE));
    if (!strcmp(name, "personality_read_implies_exec"))
        return syscall(SYS_personality, (unsigned long)(PER_LINUX | READ_IMPLIES_EXEC));
    if (!strcmp(name, "tiocsti")) {
        char c = '#';
        return syscall(SYS_ioctl, 0, (unsigned long)TIOCSTI, &c);
    }
    if (!strcmp(name, "tiocsti_high_bits")) {
        /* The kernel truncates the request to 32 bits: this is TIOCSTI too. */
        char c = '#';
        return syscall(SYS_ioctl, 0, 0x100005412UL, &c);
    }
    if (!strcmp(name, "tioclinux")) {
        char sub = 6; /* TIOCL_GETSHIFTSTATE: a read, harmless anywhere */
        return syscall(SYS_ioctl, 0, (unsigned long)TIOCLINUX, &sub);
    }
    if (!strcmp(name, "socket_netlink"))
        return syscall(SYS_socket, AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, 0 /* NETLINK_ROUTE */);
    if (!strcmp(name, "socket_packet"))
        return syscall(SYS_socket, AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
    if (!strcmp(name, "socket_vsock"))
        return syscall(SYS_socket, AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (!strcmp(name, "socketpair_inet")) {
        int sv[2];
        return syscall(SYS_socketpair, AF_INET, SOCK_STREAM, 0, sv);
    }
    if (!strcmp(name, "x32_getpid"))
        return syscall(SYS_getpid | 0x40000000L);
    if (!strcmp(name, "allowed_getpid"))
        return syscall(SYS_getpid);
    fprintf(stderr, "syscalls: unknown attack %s\n", name);
    exit(3);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: syscalls NAME\n");
        return 3;
    }
    errno = 0;
    long ret = attack(argv[1]);
    int err = ret == -1 ? errno : 0;
    printf("%s ret=%ld errno=%d\n", argv[1], ret, err);
    return 0;
}
