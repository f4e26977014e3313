#!/usr/bin/env python3
"""Where each millisecond of an exec goes: host CPU per `POST /v1/exec`, phase by phase.

Starts the servers of bench/serve.py one beside the other on 127.0.0.1 (the same code:
this script imports it): (a) `airlock serve` with its default pool, (c) the Python
reference server spawning bubblewrap per request, (d) the same server spawning the
program bare (the floor: a fork, an exec and a wait, plus the Python server's HTTP), and
(e) a bare Python loop spawning the program and waiting for it, 4 threads, no HTTP. For
each in turn (rows interleaved over --rounds), it waits until the server is settled (the
warm pool full, nothing running), enables `perf record -e cpu-clock -a -g` (every CPU,
kernel stacks), drives --requests of `{"cmd":["/bin/true"]}` at concurrency 4 over
keep-alive connections, waits until the server is settled again (the pool refilled, the
sandboxes purged) and a little more (network namespaces and cgroups are released
asynchronously, by kworkers and RCU), then stops recording. Every sample of that window
is attributed below, and the table prints, in µs per exec, each phase side by side; the
phases sum to the measured host CPU per exec (every CPU's busy samples less the load
generator's and other processes').

    sudo python3 bench/breakdown.py [--airlock PATH] [--requests 600] [--rounds 2]
                                    [--only acde] [--detail 3] [--stacks PHASE,...]
                                    [--json FILE]

Whose samples count. perf's FORK and COMM records give every sample's process tree:
  counted   the server process (every thread), its descendants (zygotes, sandbox
            helpers, bwrap, the program), kernel threads (children of kthreadd: kworkers,
            ksoftirqd, RCU), and interrupts taken while a CPU was idle;
  excluded  the load generator (this script), perf itself, every other process on the
            host (builds...) and DAMON's kdamond: each printed on its own line, as is idle.

Phases (the first rule that matches a sample wins, in this order; "frames" are the
sample's kernel stack, leaf to root; a sample taken in an interrupt is judged by the
frames above the interrupt entry only, and belongs to the kernel rows when no rule
below names its work):
  netns: create            copy_net_ns (clone or unshare of a network namespace: its
                           sysctl tables, loopback, per-protocol state), and the sandbox
                           helpers bringing its loopback up (ioctl or netlink)
  netns: teardown          cleanup_net (the netns kworker), wherever it runs
  cgroup: create           cgroup_mkdir
  cgroup: destroy, release cgroup_rmdir; css_*/cgroup/kernfs frames in kernel threads or
                           interrupts (css_killed/css_release/css_free work, kernfs RCU)
  cgroup: files, hooks     other cgroup_*/css_*/kernfs_* frames: opening, reading and
                           writing cgroup files (limits, cgroup.procs, memory.peak,
                           cpu.stat...), the fork/exit hooks (cgroup_can_fork, cgroup_exit)
  mount tree: copy         copy_mnt_ns (the mount tree copied into a new mount namespace)
  mount tree: build        the mount syscalls (mount, umount, pivot_root, fsopen, fsmount,
                           move_mount, open_tree, mount_setattr) anywhere; mkdir, symlink,
                           stat*, statfs, chmod, mknod, chdir, chroot, link in the sandbox's
                           helper processes (mount points and the tmpfs root's files)
  mount tree: teardown     cleanup_mnt, put_mnt_ns, namespace_unlock, umount_tree,
                           delayed_free_vfsmnt, destroy_super_work, deactivate_super
                           (a mount namespace's end, and its RCU-deferred frees)
  namespaces: others       the other namespaces' creation and end: create_new_namespaces,
                           copy_namespaces, unshare, setns, create_user_ns, free_ipc,
                           free_nsproxy, pid namespace teardown
  seccomp, landlock        the seccomp and landlock syscalls, and seccomp's filter running
                           at every later syscall (__secure_computing), landlock's hooks
  exec: the program        execve of the program (the process that becomes `true`), then
                           everything it does until it exits except its own code: ld.so,
                           its page faults and system calls
  exec: helpers            execve of anything else (bwrap; a Python server's spawn)
  the program              user time of the program's own code (not ld.so)
  process create           clone, clone3, fork, vfork (copy_process and its parts not
                           claimed above), the child's first return; page faults in the
                           sandbox's helpers (copy-on-write after a fork)
  process exit, reap       do_exit, exit_mmap, release_task, exit_group, wait4/waitid
  server: path syscalls    the server's open, close, stat, mkdir, rmdir, getdents... whose
                           stack shows no cgroup or kernfs frame: mostly walking the path to
                           a cgroup file or directory (a file system's own frames only
                           appear past the lookup), with airlock
  server: HTTP, IPC        the rest of the server process: its user time (HTTP, JSON,
                           bookkeeping; the Python interpreter for c/d) and system calls
                           (sockets, pipes, futexes, epoll, reading results)
  helpers: other           the rest of the sandbox's helper processes (zygote, init,
                           bwrap): user time, IPC with the server, credentials, setsid...
  kernel: RCU GP           RCU grace-period kthreads (expedited grace periods are asked
                           for by mount namespace teardown and by synchronize_rcu callers)
  kernel: other            the rest of kernel threads and interrupts: kworkers' other
                           work, softirqs (RCU callbacks, network), the scheduler's
                           bookkeeping on idle CPUs

Caveats. cpu-clock is a timer: code that runs with interrupts off is sampled when it
turns them back on (spin_unlock_irqrestore shows up). User stacks of the release binary
are not reliable (no frame pointers), so user time is attributed by process and library
only. Sampling has an error of about 1/sqrt(samples) per phase: a phase of 40 µs per exec
over 1,000 execs at 4 kHz is about 160 samples, ±8%.

Python 3 standard library, perf (linux-perf) and root. The daemons log at
AIRLOCK_LOG=warn unless it is set.
"""
import argparse
import collections
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve  # noqa: E402  (the servers, the load, the host's CPU counters)

PROGRAM = os.path.basename(json.loads(serve.BODY)["cmd"][0])  # "true": its comm after exec

# Rows in display order: (key, label). Counted rows first, then the excluded ones.
PHASES = [
    ("netns_create", "netns: create"),
    ("netns_teardown", "netns: teardown"),
    ("cg_create", "cgroup: create"),
    ("cg_destroy", "cgroup: destroy, release"),
    ("cg_files", "cgroup: files, hooks"),
    ("mnt_copy", "mount tree: copy"),
    ("mnt_build", "mount tree: build"),
    ("mnt_teardown", "mount tree: teardown"),
    ("ns_other", "namespaces: others"),
    ("seccomp", "seccomp, landlock"),
    ("exec_program", "exec: the program"),
    ("exec_helpers", "exec: helpers"),
    ("program", "the program"),
    ("proc_create", "process create"),
    ("proc_exit", "process exit, reap"),
    ("server_files", "server: path syscalls"),
    ("server", "server: HTTP, IPC"),
    ("helpers", "helpers: other"),
    ("kernel_rcu", "kernel: RCU GP"),
    ("kernel_other", "kernel: other"),
]
EXCLUDED = [
    ("client", "load generator (excluded)"),
    ("perf", "perf (excluded)"),
    ("other", "other processes (excluded)"),
    ("idle", "idle (excluded)"),
]
LABEL = dict(PHASES + EXCLUDED)
# Seconds recorded after a server is settled again: network namespaces and cgroups are
# released by kworkers after RCU grace periods (--tail).
TAIL = [0.5]
COUNTED = [k for k, _ in PHASES]

# --- the rules (see the docstring) ------------------------------------------------------

IRQ_ENTRY = ("asm_sysvec_", "asm_common_interrupt")
MOUNT_SYSCALLS = {"mount", "umount", "pivot_root", "fsopen", "fsconfig", "fsmount", "move_mount",
                  "open_tree", "mount_setattr", "fspick"}
BUILD_SYSCALLS = {"mkdir", "mkdirat", "symlink", "symlinkat", "statx", "newfstatat", "newstat", "newlstat",
                  "statfs", "fstatfs", "chmod", "fchmod", "fchmodat", "fchmodat2", "mknod", "mknodat",
                  "chdir", "fchdir", "chroot", "link", "linkat"}
MOUNT_TEARDOWN = {"cleanup_mnt", "put_mnt_ns", "namespace_unlock", "umount_tree", "delayed_free_vfsmnt",
                  "destroy_super_work", "deactivate_super", "deactivate_locked_super", "free_mnt_ns"}
NETDEV_CONFIG = {"devinet_ioctl", "dev_ioctl", "dev_change_flags", "rtnetlink_rcv_msg", "rtnl_newlink"}
MOUNTINFO = {"show_mountinfo", "mounts_open_common", "show_vfsmnt", "show_mountstats"}
NS_OTHER = {"create_new_namespaces", "copy_namespaces", "unshare_nsproxy_namespaces", "ksys_unshare",
            "create_user_ns", "free_ipc", "free_ipcs", "put_ipc_ns", "free_nsproxy", "switch_task_namespaces",
            "zap_pid_ns_processes", "copy_ipcs", "copy_utsname", "copy_time_ns", "copy_cgroup_ns",
            "copy_pid_ns", "free_pid_ns", "delayed_free_pidns", "free_uts_ns", "free_time_ns"}
NS_SYSCALLS = {"unshare", "setns"}
SECCOMP_SYSCALLS = {"seccomp", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self"}
SECCOMP_FRAMES = {"__secure_computing", "__seccomp_filter", "seccomp_run_filters", "do_seccomp"}
EXEC_SYSCALLS = {"execve", "execveat"}
EXEC_FRAMES = {"do_execveat_common", "bprm_execve", "load_elf_binary", "begin_new_exec"}
CLONE_SYSCALLS = {"clone", "clone3", "fork", "vfork"}
CLONE_FRAMES = {"copy_process", "kernel_clone", "wake_up_new_task", "schedule_tail"}
EXIT_SYSCALLS = {"exit", "exit_group", "wait4", "waitid"}
EXIT_FRAMES = {"do_exit", "do_group_exit", "exit_mmap", "__mmput", "release_task", "exit_files",
               "exit_notify", "kernel_wait4", "do_wait", "kernel_waitid"}
PATH_SYSCALLS = {"open", "openat", "openat2", "close", "close_range", "rmdir", "mkdir", "mkdirat", "unlink",
                 "unlinkat", "statx", "newfstatat", "newstat", "newlstat", "getdents64", "statfs", "fstatfs",
                 "readlinkat", "access", "faccessat", "faccessat2"}
RCU_GP = {"rcu_gp_kthread", "rcu_exp_wait_wake", "wait_rcu_exp_gp", "sync_rcu_exp_select_cpus",
          "rcu_exp_sel_wait_wake", "rcu_tasks_kthread"}
SYSCALL_PREFIXES = ("__x64_sys_", "__do_sys_", "__se_sys_", "__ia32_sys_", "ksys_", "__sys_", "do_sys_",
                    "kernel_", "__x64_", "do_")


def is_cgroup_frame(f):
    f = f.lstrip("_")
    return f.startswith(("cgroup", "css_", "kernfs_"))


def syscall_of(ks):
    """The system call a kernel stack (leaf first) is in: the frame below do_syscall_64
    (or below x64_sys_call, its dispatcher), without its prefix; None outside one."""
    try:
        i = ks.index("do_syscall_64")
    except ValueError:
        return None
    j = i - 1
    if j >= 0 and ks[j] == "x64_sys_call":
        j -= 1
    if j < 0:
        return "?"
    name = ks[j]
    if "exit_to_user_mode" in name:
        return "(return to user)"  # work on the way out of a syscall: a signal, task work
    for p in SYSCALL_PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name


def after(ks, anchor, depth=1):
    """The frame(s) `depth` calls below `anchor` in a leaf-first stack, or None."""
    try:
        i = ks.index(anchor)
    except ValueError:
        return None
    return " > ".join(ks[max(0, i - depth):i][::-1]) or None


def classify(role, comm, ks, user_dso, execs_program, fresh_image):
    """(phase, detail) of one sample. role: server, helper, program, kthread, swapper;
    ks: kernel frames, leaf first; user_dso: the library or binary of a user-mode sample;
    execs_program: whether this process becomes the program; fresh_image: whether this
    process exec'd the image it runs (`comm`) during the recording (bwrap, not a zygote's
    forked child)."""
    irq = False
    for i, f in enumerate(ks):
        if f.startswith(IRQ_ENTRY):
            ks, irq = ks[:i], True
            break
    if role == "swapper" and not irq:
        return ("idle", None) if "do_idle" in ks else ("kernel_other", ks[-1] if ks else "swapper")
    fs = set(ks)
    sc = None if irq else syscall_of(ks)
    kernel_side = irq or role in ("kthread", "swapper")
    detail = sc or (after(ks, "process_one_work") if "process_one_work" in fs else None)

    if "copy_net_ns" in fs:
        return "netns_create", after(ks, "setup_net", 2) or sc
    if role == "helper" and fs & NETDEV_CONFIG:
        return "netns_create", "loopback up: " + (sc or "?")
    if "cleanup_net" in fs:
        return "netns_teardown", after(ks, "ops_undo_list") or after(ks, "cleanup_net")
    if any(is_cgroup_frame(f) for f in ks):
        if "cgroup_mkdir" in fs:
            return "cg_create", sc
        if "cgroup_rmdir" in fs or kernel_side:
            return "cg_destroy", "rmdir" if "cgroup_rmdir" in fs else (after(ks, "process_one_work")
                                                                     or after(ks, "rcu_do_batch") or detail)
        return "cg_files", sc or next((f for f in ks if is_cgroup_frame(f)), None)
    if "copy_mnt_ns" in fs:
        return "mnt_copy", sc
    if sc in MOUNT_SYSCALLS:
        return "mnt_build", sc
    if fs & MOUNT_TEARDOWN:
        return "mnt_teardown", sc or after(ks, "rcu_do_batch") or detail
    if role == "helper" and (sc in BUILD_SYSCALLS or fs & MOUNTINFO):
        return "mnt_build", sc
    if fs & NS_OTHER or sc in NS_SYSCALLS:
        return "ns_other", sc or detail
    if sc in SECCOMP_SYSCALLS or fs & SECCOMP_FRAMES or any(f.startswith(("landlock", "hook_")) for f in ks):
        return "seccomp", sc or "filter"
    if kernel_side:
        if fs & RCU_GP:
            return "kernel_rcu", None
        return "kernel_other", (after(ks, "rcu_do_batch") or after(ks, "handle_softirqs")
                                or after(ks, "process_one_work") or re.sub(r"[/:\d].*", "", comm))
    if sc in EXEC_SYSCALLS or fs & EXEC_FRAMES:
        return ("exec_program" if execs_program else "exec_helpers"), sc
    if fs & EXIT_FRAMES or sc in EXIT_SYSCALLS:
        return "proc_exit", sc or "signal"
    page_fault = "asm_exc_page_fault" in fs
    if role == "program":
        if not ks and user_dso and not user_dso.startswith("ld-"):
            return "program", user_dso
        return "exec_program", sc or ("page fault" if page_fault else user_dso)
    if role == "helper" and fresh_image and (page_fault or (not ks and (user_dso or "").startswith("ld-"))):
        return "exec_helpers", "page fault" if page_fault else user_dso
    if sc in CLONE_SYSCALLS or fs & CLONE_FRAMES or (role == "helper" and page_fault):
        return "proc_create", sc or ("page fault" if page_fault else None)
    where = sc or ("page fault" if page_fault else ("user " + (user_dso or "?") if not ks else ks[-1]))
    if role == "server" and sc in PATH_SYSCALLS:
        return "server_files", sc
    return ("server" if role == "server" else "helpers"), where


# --- perf ---------------------------------------------------------------------------------

class Recorder:
    """`perf record -e cpu-clock -a -g`, started disabled and switched on and off through
    its control FIFOs, so the window is exactly the load's."""

    def __init__(self, path, freq):
        self.dir = tempfile.mkdtemp(prefix="airlock-breakdown-")
        ctl, ack = os.path.join(self.dir, "ctl"), os.path.join(self.dir, "ack")
        os.mkfifo(ctl)
        os.mkfifo(ack)
        # O_RDWR: a FIFO opened so never blocks on the other side's open.
        self.ctl, self.ack = os.open(ctl, os.O_RDWR), os.open(ack, os.O_RDWR)
        self.path = path
        self.err = open(os.path.join(self.dir, "perf.log"), "w+")
        self.proc = subprocess.Popen(
            ["perf", "record", "-e", "cpu-clock", "-F", str(freq), "-a", "-g", "-D", "-1",
             "--control", f"fifo:{ctl},{ack}", "-o", path],
            stdin=subprocess.DEVNULL, stdout=self.err, stderr=self.err)
        self.command("disable")  # answered once perf is up (it started disabled)

    def command(self, what, timeout=30.0):
        os.write(self.ctl, what.encode() + b"\n")
        deadline = time.monotonic() + timeout
        got = b""
        while b"ack" not in got:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                self.err.seek(0)
                raise RuntimeError(f"perf did not acknowledge {what!r}: {self.err.read()[-500:]}")
            if select.select([self.ack], [], [], min(left, 0.5))[0]:
                got += os.read(self.ack, 64)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.close(self.ctl)
        os.close(self.ack)
        self.err.close()
        shutil.rmtree(self.dir, ignore_errors=True)


SAMPLE = re.compile(r"^(.*?)\s+(-?\d+)/(-?\d+)\s+(\d+)\s+cpu-clock:")
FORK = re.compile(r"PERF_RECORD_FORK\((-?\d+):(-?\d+)\):\((-?\d+):(-?\d+)\)")
COMM = re.compile(r"PERF_RECORD_COMM( exec)?: (.*):(-?\d+)/(-?\d+)\s*$")


def read_samples(path):
    """(samples, parent, execs): samples as (comm, pid, period ns, kernel frames leaf first,
    user dso of a user-mode sample); parent[pid] from FORK records; execs[pid] = the comms
    it exec'd."""
    parent, execs, samples = {}, collections.defaultdict(set), []
    p = subprocess.Popen(["perf", "script", "-i", path, "--show-task-events", "--max-stack", "80",
                          "-F", "comm,pid,tid,period,event,ip,sym,dso"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, errors="replace")
    cur = None
    for line in p.stdout:
        if line[:1] in ("\t", " ") and cur is not None:
            parts = line.split(None, 1)
            if len(parts) < 2:
                continue
            sym, _, dso = parts[1].rstrip().rpartition(" (")
            dso = dso[:-1]
            if dso.startswith("[") and dso not in ("[unknown]", "[vdso]", "[vsyscall]"):
                if cur[4] is None:  # kernel frames come first, then the user ones
                    cur[3].append(sym.split("+0x")[0])
            elif cur[4] is None:
                cur[4] = os.path.basename(dso) if not cur[3] else ""
            continue
        cur = None
        m = SAMPLE.match(line)
        if m:
            cur = [m.group(1), int(m.group(2)), int(m.group(4)), [], None]
            samples.append(cur)
            continue
        m = FORK.search(line)
        if m:
            pid, _, ppid, _ = (int(x) for x in m.groups())
            if pid != ppid:
                parent[pid] = ppid
            continue
        m = COMM.search(line)
        if m and m.group(1):
            execs[int(m.group(3))].add(m.group(2))
    p.wait()
    return samples, parent, execs


def attribute(samples, parent, execs, server_pid, client_pid, perf_pid, stacks=None):
    """ns per phase, and per (phase, detail), over one recording; with `stacks` (a dict
    phase -> Counter), each sample's comm and innermost frames too."""
    role_of = {}

    def role(pid, comm):
        if pid == 0:
            return "swapper"
        r = role_of.get(pid)
        if r is None and pid == client_pid:
            r = role_of[pid] = "client"
        if r is None:
            r, p, hops = "other", pid, 0
            while p and hops < 64:
                if p == perf_pid:  # first: perf is the client's child
                    r = "perf"
                    break
                if p == server_pid:
                    r = "server" if pid == server_pid else "helper"
                    break
                if p == client_pid:
                    r = "client"
                    break
                if p == 2:
                    # DAMON's monitor samples the host's memory whatever runs: not ours.
                    r = "other" if comm.startswith("kdamond") else "kthread"
                    break
                p, hops = parent.get(p), hops + 1
            role_of[pid] = r
        if r == "helper" and comm == PROGRAM and PROGRAM in execs.get(pid, ()):
            return "program"
        return r

    phases, details = collections.Counter(), collections.Counter()
    for comm, pid, period, ks, user_dso in samples:
        r = role(pid, comm)
        if r in ("client", "perf", "other"):
            phases[r] += period
            continue
        phase, detail = classify(r, comm, ks, user_dso, PROGRAM in execs.get(pid, ()),
                                 comm in execs.get(pid, ()))
        phases[phase] += period
        details[(phase, detail or "-")] += period
        if stacks is not None and phase in stacks:
            frames = ks[::-1][-12:] if ks else [f"user {user_dso}"]
            stacks[phase][f"{re.sub(r'[0-9]+', 'N', comm)}: " + " > ".join(frames)] += period
    return phases, details


# --- main ---------------------------------------------------------------------------------

class Tally:
    """What the recordings of one system under test added up to."""

    def __init__(self, key, label):
        self.key, self.label = key, label
        self.phases, self.details = collections.Counter(), collections.Counter()
        self.n, self.seconds, self.window, self.errors = 0, 0.0, 0.0, []
        self.stat_busy, self.tree_cpu, self.samples = 0.0, None, 0
        self.stacks = None  # phase -> Counter of stacks, for --stacks

    def record(self, freq, workdir, work, server_pid):
        """Runs `work()` under perf (enabled just before, disabled just after) and adds its
        samples; `server_pid`'s process tree is counted (itself as the server when it is
        not this process)."""
        path = os.path.join(workdir, f"{self.key}.data")
        rec = Recorder(path, freq)
        try:
            host0 = serve.host_cpu_seconds()
            w0 = time.perf_counter()
            rec.command("enable")
            work()
            rec.command("disable")
            self.window += time.perf_counter() - w0
            self.stat_busy += serve.host_cpu_seconds() - host0
        finally:
            rec.stop()
        samples, parent, execs = read_samples(path)
        os.unlink(path)
        self.samples += len(samples)
        phases, details = attribute(samples, parent, execs, server_pid, os.getpid(), rec.proc.pid, self.stacks)
        self.phases.update(phases)
        self.details.update(details)

    def per_exec_us(self, phase):
        return self.phases[phase] / 1000 / max(1, self.n)

    def counted_us(self):
        return sum(self.per_exec_us(k) for k in COUNTED)


class Target(Tally):
    """One server under test (a row of bench/serve.py)."""

    def __init__(self, key, label, daemon, is_airlock, concurrency):
        self.row = serve.Row(key, label, daemon, is_airlock, concurrency)
        super().__init__(key, self.row.label)
        self.tree_cpu = 0.0

    def record_load(self, n, freq, workdir):
        r = self.row
        for c in r.c4:  # keep the connections open and warm; not recorded
            c.exec()
        r.settle()
        out = {}

        def work():
            out["secs"], _, out["err"] = serve.throughput_chunk(r.c4, n)
            r.settle()
            time.sleep(TAIL[0])  # netns and cgroup release by kworkers, RCU callbacks

        cpu0 = r.daemon.cpu_seconds()
        self.record(freq, workdir, work, r.daemon.proc.pid)
        cpu1 = r.daemon.cpu_seconds()
        if cpu0 is not None and cpu1 is not None:
            self.tree_cpu += cpu1 - cpu0
        self.n += n
        self.seconds += out["secs"]
        self.errors += out["err"]


# The floor without HTTP: `concurrency` threads, each spawning the program and waiting for
# it, `n` times in all, once a line arrives on stdin (so perf is recording by then).
BARE_LOOP = r"""
import os, sys, threading
n, c, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
sys.stdin.readline()
left, lock = [n], threading.Lock()
def worker():
    while True:
        with lock:
            if left[0] == 0:
                return
            left[0] -= 1
        os.waitpid(os.posix_spawn(argv[0], argv, {}), 0)
threads = [threading.Thread(target=worker) for _ in range(c)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


class LoopTarget(Tally):
    """(e) the program spawned and waited for by a bare Python loop: no server, no HTTP."""

    def __init__(self, concurrency):
        super().__init__("e", "bare loop (no HTTP)")
        self.concurrency = concurrency
        self.tree_cpu = None

    def record_load(self, n, freq, workdir):
        argv = json.loads(serve.BODY)["cmd"]
        p = subprocess.Popen([sys.executable, "-c", BARE_LOOP, str(n), str(self.concurrency), *argv],
                             stdin=subprocess.PIPE, text=True)
        time.sleep(0.2)  # the interpreter's start, before the recording

        def work():
            t0 = time.perf_counter()
            p.stdin.write("go\n")
            p.stdin.close()
            code = p.wait()
            self.seconds += time.perf_counter() - t0
            if code != 0:
                self.errors.append(f"bare loop exited with {code}")
            time.sleep(TAIL[0])

        try:
            self.record(freq, workdir, work, p.pid)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.n += n


def print_table(targets, detail, floor="d", ref="c", what="exec"):
    """The breakdown, one column per tally, in µs per exec (or per `what`)."""
    w = 14
    head = "".join(f"{'(' + t.key + ')':>{w}}" for t in targets)
    print(f"\nµs of host CPU per {what}, by phase (perf cpu-clock samples, every CPU)")
    print(f"{'':28}{head}")
    print(f"{'':28}" + "".join(f"{t.label[:w - 1]:>{w}}" for t in targets))
    for key, label in PHASES:
        print(f"{label:28}" + "".join(f"{t.per_exec_us(key):{w}.0f}" for t in targets))
        if detail:
            for t in targets:
                subs = sorted(((v, d) for (p, d), v in t.details.items() if p == key), reverse=True)[:detail]
                for v, d in subs:
                    us = v / 1000 / max(1, t.n)
                    if us >= 5:
                        pad = "".join(f"{(f'{us:.0f}' if u is t else ''):>{w}}" for u in targets)
                        print(f"{'    ' + d[:24]:28}{pad}")
    print("-" * (28 + w * len(targets)))
    print(f"{'host CPU per ' + what:28}" + "".join(f"{t.counted_us():{w}.0f}" for t in targets))
    for key, name in ((floor, "the bare floor"), (ref, "bwrap")):
        base = next((t for t in targets if t.key == key), None)
        if base is not None:
            print(f"{f'  x {name} ({key})':28}" + "".join(
                f"{t.counted_us() / max(1e-9, base.counted_us()):{w}.2f}" for t in targets))
    for key, label in EXCLUDED:
        print(f"{label:28}" + "".join(f"{t.per_exec_us(key):{w}.0f}" for t in targets))
    print()
    print(f"{'checks':28}")
    print(f"{'  /proc/stat busy - ours':28}" + "".join(
        f"{t.stat_busy * 1e6 / max(1, t.n):{w}.0f}" for t in targets)
        + f"   (µs/{what}: should be counted + perf + other)")
    if any(t.tree_cpu is not None for t in targets):
        print(f"{'  server tree, /proc':28}" + "".join(
            f"{t.tree_cpu * 1e6 / max(1, t.n):{w}.0f}" if t.tree_cpu is not None else f"{'–':>{w}}"
            for t in targets) + f"   (µs/{what}: bench/serve.py's cpu ms/exec; no kernel threads)")
    print(f"{'  ' + what + 's/s while recorded':28}" + "".join(f"{t.n / max(1e-9, t.seconds):{w}.0f}" for t in targets))
    print(f"{'  samples, window s':28}" + "".join(
        f"{f'{t.samples}, {t.window:.1f}':>{w}}" for t in targets))


def host_tasks():
    """Threads on the host, from /proc."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                n += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                pass
    return n


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--airlock", default=os.path.join(here, "..", "target", "release", "airlock"),
                    help="the airlock binary (default: ../target/release/airlock beside this script)")
    ap.add_argument("--pool", type=int, default=None, help="--pool for (a) (default: the daemon's default)")
    ap.add_argument("--bwrap", default=shutil.which("bwrap") or "/usr/bin/bwrap")
    ap.add_argument("--only", default="acde",
                    help="which servers (bench/serve.py's letters a, c, d; e: a bare spawn loop without HTTP; "
                         "default acde)")
    ap.add_argument("--requests", type=int, default=600, help="recorded requests per server and round")
    ap.add_argument("--rounds", type=int, default=2, help="servers are interleaved in this many rounds")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=50, help="unrecorded requests per server first")
    ap.add_argument("--freq", type=int, default=4000, help="samples per second per CPU")
    ap.add_argument("--tail", type=float, default=TAIL[0],
                    help="seconds recorded after the server has settled, for the kernel's asynchronous release "
                         "of namespaces and cgroups (default %(default)s)")
    ap.add_argument("--detail", type=int, default=0, metavar="N",
                    help="under each phase, its N largest parts (system call, kernel work) per server")
    ap.add_argument("--stacks", metavar="PHASE,...", default="",
                    help="print the 10 commonest kernel stacks (root to leaf, 12 frames) of these phases "
                         "(keys: " + ", ".join(COUNTED) + ")")
    ap.add_argument("--json", metavar="FILE", help="also write the figures to FILE as JSON")
    args = ap.parse_args()
    TAIL[0] = args.tail
    stack_phases = [p for p in args.stacks.split(",") if p]
    if set(stack_phases) - set(COUNTED):
        sys.exit(f"--stacks: unknown phase(s) {sorted(set(stack_phases) - set(COUNTED))}")

    if os.geteuid() != 0:
        sys.exit("run as root (airlock needs it for cgroups; perf -a too)")
    if not shutil.which("perf"):
        sys.exit("perf not found (apt-get install linux-perf)")
    airlock = os.path.abspath(args.airlock)
    if "a" in args.only and not os.access(airlock, os.X_OK):
        sys.exit(f"{airlock}: not found; build it with `cargo build --release` or pass --airlock")
    if "c" in args.only and not os.access(args.bwrap, os.X_OK):
        sys.exit(f"{args.bwrap}: bwrap not found (apt-get install bubblewrap) or pass --bwrap")
    only = "".join(k for k in "acde" if k in args.only)
    if set(args.only) - set("acde") or not only:
        sys.exit("--only takes a, c, d and e (for airlock without a pool, --pool 0)")

    env = serve.daemon_env()
    workdir = tempfile.mkdtemp(prefix="airlock-breakdown-")
    print(f"POST /v1/exec {serve.BODY.decode()} at c={args.concurrency}, {args.requests} requests per server "
          f"and round, {args.rounds} rounds, perf cpu-clock at {args.freq} Hz on {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.2f}, {host_tasks()} tasks on the host (pivot_root walks them all)",
          flush=True)
    targets, daemons = [], []
    try:
        for key, label, argv, is_airlock in serve.server_setups(airlock, args.bwrap, only, args.pool):
            d = serve.Daemon(label, argv, env)
            daemons.append(d)
            targets.append(Target(key, label, d, is_airlock, args.concurrency))
        if "e" in only:
            targets.append(LoopTarget(args.concurrency))
        for t in targets:
            if stack_phases:
                t.stacks = {p: collections.Counter() for p in stack_phases}
            if isinstance(t, Target):
                serve.throughput_chunk(t.row.c4, args.warmup)
        for i in range(max(1, args.rounds)):
            for t in (targets if i % 2 == 0 else targets[::-1]):
                t.record_load(args.requests, args.freq, workdir)
            print(f"  round {i + 1}/{args.rounds} done", flush=True)
    finally:
        for t in targets:
            if isinstance(t, Target):
                t.row.close()
        codes = [d.stop() for d in daemons]
        shutil.rmtree(workdir, ignore_errors=True)
    for t, code in zip([t for t in targets if isinstance(t, Target)], codes):
        print(f"  ({t.key}) {t.label}: exit {code}, log {t.row.daemon.log.name}")

    print_table(targets, args.detail)
    for phase in stack_phases:
        for t in targets:
            print(f"\n({t.key}) {LABEL[phase]}: commonest stacks, µs per exec")
            for st, v in t.stacks[phase].most_common(10):
                print(f"  {v / 1000 / max(1, t.n):6.0f}  {st}")
    busy = [b for t in targets if isinstance(t, Target) for b in t.row.busy] or [0.0]
    other = statistics.fmean(t.per_exec_us("other") / max(1e-9, t.counted_us()) for t in targets)
    print(f"\nhost CPU busy between recordings: median {statistics.median(busy):.0%}; other processes took "
          f"{other:.0%} of the counted CPU while recording")
    if statistics.median(busy) > 0.05 or other > 0.1:
        print("WARNING: the host was not quiet: kernel threads of other work are counted as ours, and "
              "contention inflates every phase (rerun on a quiet host)")
    failed = sum(len(t.errors) for t in targets)
    if failed:
        print(f"{failed} failed requests, e.g. {sorted({e for t in targets for e in t.errors})[:3]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "breakdown", "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "cpus": os.cpu_count(), "requests": args.requests, "rounds": args.rounds,
                       "busy_median": statistics.median(busy),
                       "rows": {t.key: {"label": t.label, "execs": t.n,
                                        "us_per_exec": {k: t.per_exec_us(k) for k in COUNTED + [e for e, _ in EXCLUDED]},
                                        "host_us_per_exec": t.counted_us()} for t in targets}}, f, indent=1)
        print(f"figures written to {args.json}")
    if failed or any(c not in (0, None) for c in codes):
        sys.exit(1)


if __name__ == "__main__":
    main()
