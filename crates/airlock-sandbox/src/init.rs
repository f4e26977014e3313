//! airlock's init: PID 1 of the sandbox's pid namespace. The supervisor re-executes its
//! own binary with [`INIT_ARG`] in the child it cloned into fresh namespaces; a fresh
//! exec means init may allocate and use any library freely, whatever threads the
//! supervisor had.
//!
//! Init builds the filesystem, prepares landlock and installs seccomp on itself once, then
//! serves the
//! supervisor's requests on the control socket (see `protocol`): file operations, and
//! execs, one at a time. Whenever it is idle and another exec may come, it keeps a ready
//! child: a fork already dropped to the sandbox user, waiting for a command (see
//! `payload`). An exec hands the request to it, reaps every zombie, and when the program
//! ends kills whatever else it left behind before reporting, so each exec's processes end
//! with it. If the supervisor goes away, init exits, and the kernel
//! kills everything in the namespace.
//!
//! A spawn request forks a keeper (see `keeper`) that runs one program alongside execs
//! and answers for it on a channel of its own; init answers at once and goes on serving.
//! While keepers run, the kill after an exec is a sweep over /proc that spares their
//! subtrees (without any, it stays one kill(-1)), and init reaps keepers that end while
//! it is idle. While an exec runs, init refuses every request but `Kill`, a spawn too
//! (the server serializes a session's requests).

use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::payload;
use crate::protocol::{self, CHUNK, CONTROL_FD, Frame, Reply, Request};
use crate::{mounts, netns, sys, workspace};

/// The argument (argv[1]) that turns the airlock binary into the sandbox's init.
pub const INIT_ARG: &str = "__airlock_init__";

/// If this process was started as a sandbox init, runs it and never returns.
/// Binaries that use the engine call this first thing in `main`.
pub fn maybe_run_init() {
    match std::env::args_os().nth(1) {
        Some(a) if a == INIT_ARG => {
            if nix::unistd::geteuid().as_raw() == crate::mounts::SANDBOX_ID {
                // Rootless, init and the programs share a uid: made non-dumpable, init's
                // /proc entries (even the list of its fds) belong to the namespace's
                // unmapped root, out of the programs' reach as a root init's are. The
                // supervisor still reaches them: this exec made the namespace the owner
                // of init's memory, and the supervisor owns the namespace. (A zygote's
                // clone keeps the zygote's memory owner, so there init stays dumpable;
                // its fds are still closed to the programs, who lack its capabilities.)
                let _ = crate::sys::prctl(libc::PR_SET_DUMPABLE, 0);
            }
            run()
        }
        Some(a) if a == crate::zygote::ZYGOTE_ARG => crate::zygote::serve(),
        _ => {}
    }
}

/// A forked child waiting for its exec request (see `payload`).
pub(crate) struct ReadyChild {
    pub pid: Pid,
    /// Where the request goes.
    pub requests: OwnedFd,
    /// Read end of its close-on-exec error pipe: EOF once it has exec'd.
    pub errors: File,
}

/// What init keeps between requests.
struct Init {
    /// The ready child for the next exec, if one may come.
    ready: Option<ReadyChild>,
    /// The supervisor said the last exec was the last: no ready child after it.
    done: bool,
    /// The control socket.
    control: OwnedFd,
    /// The landlock ruleset, opened once; each exec applies a clone of it.
    landlock: landlock::RulesetCreated,
    /// Highest capability number of this kernel.
    cap_last_cap: u32,
    /// SIGCHLD, readable without a handler.
    sigchld: SignalFd,
    /// The answer to the file write under way, once one of its chunks failed: its other
    /// chunks are read and dropped, and this is sent once, after the last.
    failed_write: Option<Reply>,
    /// The keepers of spawned programs (see `keeper`) still running: their subtrees
    /// survive every exec's end.
    keepers: Vec<Pid>,
}

/// Runs init on the control socket at fd 3; never returns. Called in a fresh exec of
/// airlock, or in a child of the single-threaded zygote.
pub(crate) fn run() -> ! {
    // SAFETY: fd 3 is the control socket the supervisor (or the zygote) placed there;
    // nothing else in this process owns it.
    let control = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    match setup(control) {
        Ok(mut init) => init.serve(),
        Err((control, message)) => {
            let _ = protocol::send(control.as_fd(), &Reply::Failed { message }, &[], &[]);
            std::process::exit(1)
        }
    }
}

type SetupError = (OwnedFd, String);

fn setup(control: OwnedFd) -> Result<Init, SetupError> {
    macro_rules! try_or {
        ($e:expr, $what:expr) => {
            match $e {
                Ok(v) => v,
                Err(e) => return Err((control, format!("{}: {e}", $what))),
            }
        };
    }
    // Nothing but /dev/null stdio, the control socket and (proxy mode) the TUN device
    // may cross into the sandbox.
    try_or!(
        sys::close_from(protocol::TUN_FD as libc::c_uint + 1),
        "close_range"
    );
    let tun = take_tun();
    // The supervisor blocks the signals it handles; the sandbox starts with none blocked
    // but SIGCHLD, which init reads from a signalfd.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    try_or!(
        sigprocmask(SigmaskHow::SIG_SETMASK, Some(&mask), None),
        "sigprocmask"
    );
    let sigchld = try_or!(SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC), "signalfd");

    let Frame {
        msg,
        payload: seccomp,
        fds: setup_fds,
    } = match protocol::recv::<Request>(control.as_fd()) {
        Ok(Some(frame)) => frame,
        Ok(None) => std::process::exit(1),
        Err(e) => return Err((control, format!("reading the setup request: {e}"))),
    };
    let Request::Setup {
        disk_bytes,
        rootfs,
        image,
        image_writable,
        egress,
        fixed_layout,
    } = msg
    else {
        return Err((control, "the first request was not setup".into()));
    };
    // Proxy mode needs the TUN device the cloned child opened; without it (the child's
    // open failed), one last try here, while the host's /dev is still this root's, says
    // why.
    let tun = match (&egress, tun) {
        (None, _) => None,
        (Some(_), Some(tun)) => Some(tun),
        (Some(_), None) => Some(try_or!(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/net/tun")
                .map(OwnedFd::from),
            "proxy mode needs a TUN device: opening /dev/net/tun"
        )),
    };
    let ca_bundle = match egress.as_ref().and_then(|e| e.ca_bundle_bytes) {
        Some(len) => Some(try_or!(read_ca_bundle(setup_fds, len), "the CA bundle")),
        None => None,
    };
    let layout = mounts::Layout {
        rootfs: rootfs.as_deref(),
        image: image.as_deref(),
        image_writable,
        disk_bytes,
        proxy: egress.is_some(),
        ca_bundle: ca_bundle.as_deref(),
    };
    try_or!(mounts::build(&layout), "building the filesystem");

    // The supervisor joins init to every cgroup meanwhile (that can wait for an RCU grace
    // period); nothing worth charging to the sandbox happens before it says so. The
    // cgroup namespace made then is rooted at the sandbox's own cgroup everywhere.
    match protocol::recv::<Request>(control.as_fd()) {
        Ok(Some(Frame {
            msg: Request::Attached,
            ..
        })) => {}
        Ok(None) => std::process::exit(1),
        Ok(Some(_)) => return Err((control, "expected the attached request".into())),
        Err(e) => return Err((control, format!("waiting for the cgroup attach: {e}"))),
    }
    try_or!(
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP),
        "unshare cgroup namespace"
    );
    if !image_writable {
        try_or!(mounts::seal_root(), "sealing the root");
    }
    try_or!(nix::unistd::sethostname("airlock"), "sethostname");
    try_or!(sys::loopback_up(), "bringing up loopback");
    // Proxy mode: every address but loopback's is routed to the TUN device, where the
    // nf_tables rules redirect TCP and DNS to the proxy's sockets and reject the rest
    // (see `netns`). The sockets live in the sandbox's network namespace (so the
    // program reaches them on loopback) and are served from outside.
    let sockets = match (&egress, tun) {
        (Some(egress), Some(tun)) => {
            try_or!(netns::route_to_proxy(tun, egress), "proxy mode's network");
            Some(try_or!(netns::bind(egress), "binding the proxy's sockets"))
        }
        _ => None,
    };
    let landlock = try_or!(
        crate::landlock::prepare(egress.is_some(), image.is_some(), image_writable),
        "landlock"
    );
    if fixed_layout {
        // Inherited by every program's process, across fork and exec (seccomp allows
        // only querying the persona, so it is set before the filter).
        try_or!(sys::fix_layout(), "personality");
    }
    // The seccomp filter goes on init itself, once: every program inherits it across fork
    // and exec, so an exec does not pay for loading it (about a millisecond: the kernel
    // checks and compiles the program and precomputes its per-syscall cache), and init,
    // from here on, is held to it too. Init's own work from now (the control socket,
    // fork, wait, kill, file operations beneath /workspace) uses only allowed syscalls.
    // Init may install it without no_new_privs: it holds CAP_SYS_ADMIN in its namespace.
    let seccomp = try_or!(airlock_seccomp::from_bytes(&seccomp), "seccomp program");
    try_or!(airlock_seccomp::apply(&seccomp), "seccomp");
    let cap_last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    let fds = match &sockets {
        Some(s) => vec![s.proxy.as_raw_fd(), s.transparent.as_raw_fd(), s.dns.as_raw_fd()],
        None => Vec::new(),
    };
    try_or!(
        protocol::send(control.as_fd(), &Reply::Ready, &[], &fds),
        "reporting ready"
    );
    // Init keeps no copy: only the supervisor serves the sockets.
    drop(sockets);
    Ok(Init {
        ready: None,
        done: false,
        control,
        landlock,
        cap_last_cap,
        sigchld,
        failed_write: None,
        keepers: Vec::new(),
    })
}

impl Init {
    fn reply(&self, reply: &Reply, payload: &[u8]) {
        if protocol::send(self.control.as_fd(), reply, payload, &[]).is_err() {
            // The supervisor is gone: so is the sandbox.
            std::process::exit(1);
        }
    }

    fn serve(&mut self) -> ! {
        loop {
            if self.ready.is_none() && !self.done {
                // If this fails, the exec forks again and reports why.
                self.ready = self.fork_ready().ok();
            }
            // Idle: keepers (and what an exec's sweep left as zombies) are reaped as they
            // end.
            while poll_two(self.control.as_fd(), self.sigchld.as_fd()) {
                let _ = self.sigchld.read_signal();
                self.reap_idle();
            }
            let frame = match protocol::recv::<Request>(self.control.as_fd()) {
                Ok(Some(frame)) => frame,
                Ok(None) | Err(_) => std::process::exit(0),
            };
            match frame.msg {
                Request::WriteFile {
                    path,
                    mode,
                    first,
                    last,
                } => self.write_chunk(&path, mode, first, last, &frame.payload),
                Request::ReadFile { path, max_bytes } => self.read_file(&path, max_bytes),
                Request::ListFiles => match workspace::list() {
                    Ok(entries) => self.reply(&Reply::Listing { entries }, &[]),
                    Err(e) => self.reply(
                        &Reply::Error {
                            failure: airlock_backend::ErrorKind::Host,
                            message: format!("listing /workspace: {e}"),
                        },
                        &[],
                    ),
                },
                request @ Request::Exec { last, .. } => {
                    self.done = last;
                    let reply = self.exec(&request, frame.fds);
                    self.reply(&reply, &[]);
                }
                Request::Spawn {
                    command,
                    env,
                    max_file_bytes,
                    workdir,
                    terminal,
                } => {
                    let order = crate::keeper::Order {
                        command,
                        env,
                        max_file_bytes,
                        workdir,
                        terminal,
                    };
                    let reply = self.spawn(order, frame.fds);
                    self.reply(&reply, &[]);
                }
                Request::Kill => self.reply(
                    &Reply::Error {
                        failure: airlock_backend::ErrorKind::Invalid,
                        message: "nothing is running".into(),
                    },
                    &[],
                ),
                Request::Setup { .. } | Request::Attached => self.reply(
                    &Reply::Error {
                        failure: airlock_backend::ErrorKind::Invalid,
                        message: "the sandbox is already set up".into(),
                    },
                    &[],
                ),
            }
        }
    }

    /// One chunk of a file write. The write is answered once, after its last chunk: a
    /// chunk that fails is not answered (the supervisor sends every chunk before it
    /// reads the answer), the rest of the file is read and dropped, and the failure is
    /// the answer. A write that ran out of room removes what it wrote.
    fn write_chunk(&mut self, path: &str, mode: u32, first: bool, last: bool, data: &[u8]) {
        if first {
            self.failed_write = None;
        }
        if self.failed_write.is_none()
            && let Err(e) = workspace::write_chunk(path, mode, first, data)
        {
            self.failed_write = Some(if workspace::is_no_room(&e) {
                workspace::remove_partial(path);
                Reply::NoRoom {
                    free_bytes: workspace::free_bytes().unwrap_or(0),
                }
            } else {
                Reply::Error {
                    failure: workspace::error_kind(&e),
                    message: format!("writing {path}: {e}"),
                }
            });
        }
        if last {
            let reply = self.failed_write.take().unwrap_or(Reply::Ok);
            self.reply(&reply, &[]);
        }
    }

    fn read_file(&self, path: &str, max_bytes: u64) {
        let (mut file, _) = match workspace::open_read(path, max_bytes) {
            Ok(f) => f,
            Err(e) => {
                return self.reply(
                    &Reply::Error {
                        failure: workspace::error_kind(&e),
                        message: format!("reading {path}: {e}"),
                    },
                    &[],
                );
            }
        };
        let mut buf = vec![0u8; CHUNK];
        loop {
            match workspace::read_chunk(&mut file, &mut buf) {
                Ok(0) => return self.reply(&Reply::FileChunk { last: true }, &[]),
                Ok(n) => self.reply(&Reply::FileChunk { last: false }, &buf[..n]),
                Err(e) => {
                    return self.reply(
                        &Reply::Error {
                            failure: workspace::error_kind(&e),
                            message: format!("reading {path}: {e}"),
                        },
                        &[],
                    );
                }
            }
        }
    }

    /// Forks a ready child (see `payload`).
    fn fork_ready(&self) -> Result<ReadyChild, String> {
        fork_ready(self.privileges()?, &[CONTROL_FD, self.sigchld.as_raw_fd()])
    }

    fn privileges(&self) -> Result<payload::Privileges, String> {
        Ok(payload::Privileges {
            landlock: self.landlock.try_clone().map_err(|e| format!("landlock: {e}"))?,
            cap_last_cap: self.cap_last_cap,
        })
    }

    /// Forks a keeper for a spawned program (see `keeper`) and answers at once: the
    /// keeper reports on the program's own channel (the first of `fds`).
    fn spawn(&mut self, order: crate::keeper::Order, fds: Vec<OwnedFd>) -> Reply {
        let want = if order.terminal.is_some() { 1 } else { 4 };
        if fds.len() != want {
            return Reply::Failed {
                message: format!("a spawn needs {want} fds, got {}", fds.len()),
            };
        }
        let privileges = match self.privileges() {
            Ok(p) => p,
            Err(message) => return Reply::Failed { message },
        };
        let mut fds = fds.into_iter();
        let Some(channel) = fds.next() else {
            return Reply::Failed {
                message: "no channel".into(),
            };
        };
        // SAFETY: init is single-threaded (see `fork_ready`).
        match unsafe { fork() } {
            Err(e) => Reply::Failed {
                message: format!("fork: {e}"),
            },
            Ok(ForkResult::Child) => {
                // Of init's descriptors the keeper keeps none it does not use: the ready
                // child's ends and the control socket go.
                drop(self.ready.take());
                // SAFETY: closing init's control socket in this child, which never
                // returns to code that uses it; the parent's stays open.
                unsafe { libc::close(CONTROL_FD) };
                crate::keeper::run(
                    privileges,
                    self.sigchld.as_raw_fd(),
                    channel,
                    order,
                    fds.collect(),
                )
            }
            Ok(ForkResult::Parent { child }) => {
                self.keepers.push(child);
                Reply::Ok
            }
        }
    }

    /// Reaps what ended while init was idle. A keeper that ended is forgotten; if one
    /// ended without its program's report (killed itself), what it left is swept.
    fn reap_idle(&mut self) {
        let mut keeper_ended = false;
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)) => {
                    keeper_ended |= self.forget_keeper(pid);
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
        if keeper_ended {
            self.sweep();
        }
    }

    /// Drops `pid` from the keepers; true if it was one.
    fn forget_keeper(&mut self, pid: Pid) -> bool {
        let before = self.keepers.len();
        self.keepers.retain(|k| *k != pid);
        self.keepers.len() != before
    }

    /// Runs one program to its end; returns the final reply (after `Started`, sent here).
    /// `request` is the exec request, forwarded to the ready child with `fds` (the
    /// program's stdin, stdout and stderr).
    fn exec(&mut self, request: &Request, fds: Vec<OwnedFd>) -> Reply {
        if fds.len() != 3 {
            return Reply::Failed {
                message: "exec needs three stdio fds".into(),
            };
        }
        let raw: Vec<_> = fds.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
        // The ready child, or (if there is none, or it died waiting) a new one.
        let mut handed = None;
        for _ in 0..2 {
            let ready = match self.ready.take() {
                Some(ready) => ready,
                None => match self.fork_ready() {
                    Ok(ready) => ready,
                    Err(message) => return Reply::Failed { message },
                },
            };
            if protocol::send(ready.requests.as_fd(), request, &[], &raw).is_ok() {
                handed = Some(ready);
                break;
            }
            // It died: of a failed step (its message says which) or killed meanwhile.
            let mut failure = String::new();
            let _ = { ready.errors }.read_to_string(&mut failure);
            if !failure.is_empty() {
                self.kill_all();
                return failed(failure);
            }
        }
        drop(fds);
        let Some(ReadyChild { pid, errors, .. }) = handed else {
            self.kill_all();
            return Reply::Failed {
                message: "the program's process died before it could be handed the command".into(),
            };
        };
        let mut failure = String::new();
        let _ = { errors }.read_to_string(&mut failure);
        if !failure.is_empty() {
            self.kill_all();
            return failed(failure);
        }
        self.reply(&Reply::Started, &[]);
        let status = self.wait_for(pid);
        // The program is gone: whatever it left running goes too.
        self.kill_all();
        status
    }

    /// Reaps children until `program` ends, answering `Kill` meanwhile.
    fn wait_for(&mut self, program: Pid) -> Reply {
        loop {
            // Reap whatever has ended (orphans are re-parented to init).
            loop {
                match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(pid, code)) if pid == program => return Reply::Exited { code },
                    Ok(WaitStatus::Signaled(pid, sig, _)) if pid == program => {
                        return Reply::Signaled { signal: sig as i32 };
                    }
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)) => {
                        self.forget_keeper(pid);
                    }
                    Ok(_) => {}
                }
            }
            let control = self.control.as_fd();
            let sigchld = self.sigchld.as_fd();
            if poll_two(control, sigchld) {
                let _ = self.sigchld.read_signal();
                continue;
            }
            match protocol::recv::<Request>(control) {
                Ok(Some(Frame {
                    msg: Request::Kill, ..
                })) => self.kill_all(),
                Ok(Some(_)) => self.reply(
                    &Reply::Error {
                        failure: airlock_backend::ErrorKind::Invalid,
                        message: "busy: an exec is running".into(),
                    },
                    &[],
                ),
                Ok(None) | Err(_) => {
                    self.kill_all();
                    std::process::exit(0);
                }
            }
        }
    }

    /// Kills every process in the namespace but init and the keepers' subtrees, and
    /// reaps them all. Without keepers, kill(-1) and reaping until no child is left.
    fn kill_all(&mut self) {
        if !self.keepers.is_empty() {
            return self.sweep();
        }
        loop {
            // No child left: nothing else lives in the namespace (every other process
            // descends from init, re-parented to it when its parent ends, and nothing
            // enters the namespace by setns), so there is nothing to kill. The kernel's
            // kill(-1) walks every task of the host, not only the namespace's: with
            // thousands of sessions alive it was most of what an exec cost
            // (bench/density.py), and a program that leaves nothing behind is the rule.
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Err(nix::errno::Errno::ECHILD) => return,
                Ok(WaitStatus::StillAlive) | Err(_) => {}
                // Reaped one that had ended: look again.
                Ok(_) => continue,
            }
            // From PID 1, kill(-1) reaches every other process of the namespace.
            let _ = nix::sys::signal::kill(Pid::from_raw(-1), Signal::SIGKILL);
            match waitpid(None, None) {
                Err(nix::errno::Errno::ECHILD) => return,
                _ => continue,
            }
        }
    }
}

impl Init {
    /// Kills every process of the namespace that is neither init, nor a keeper or beneath
    /// one, nor the ready child, and reaps them: sweeps over /proc until one finds none
    /// left. A process a fork under way adds is beneath one found alive, so it is found
    /// by the next sweep (or its fork fails: its parent has SIGKILL pending).
    fn sweep(&mut self) {
        loop {
            let mut spared = self.keepers.iter().map(|p| p.as_raw()).collect::<Vec<_>>();
            spared.extend(self.ready.as_ref().map(|r| r.pid.as_raw()));
            let table = crate::procs::table("/proc");
            let mut found = false;
            for (&pid, entry) in &table {
                if pid == 1 || entry.zombie {
                    continue;
                }
                match crate::procs::under(&table, pid, &spared, 1) {
                    Some(true) => {}
                    Some(false) => {
                        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
                        found = true;
                    }
                    None => found = true,
                }
            }
            let mut reaped = false;
            loop {
                match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)) => {
                        self.forget_keeper(pid);
                        reaped = true;
                    }
                    Ok(_) => reaped = true,
                }
            }
            if !found {
                return;
            }
            if !reaped {
                // Killed, not dead yet: SIGKILL lands at their next return to user space.
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
    }
}

/// Forks a ready child (see `payload`) with `privileges`; `close` are fds of the caller's
/// that the child closes at once (they are close-on-exec anyway; the child must not hold
/// them while it waits).
pub(crate) fn fork_ready(privileges: payload::Privileges, close: &[i32]) -> Result<ReadyChild, String> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let (requests, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| format!("socketpair: {e}"))?;
    let (errors, errors_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: init and keepers are single-threaded (a fresh exec, or a child of the
    // single-threaded zygote, that started no threads), so the child may do anything a
    // normal process does.
    match unsafe { fork() } {
        Err(e) => Err(format!("fork: {e}")),
        Ok(ForkResult::Child) => {
            // Of the parent's descriptors it keeps none but its own two ends.
            drop((requests, errors));
            for fd in close {
                // SAFETY: closing fds of the parent's this child will never use (it
                // never returns to code that uses them); the parent's stay open.
                unsafe { libc::close(*fd) };
            }
            payload::ready_child(privileges, theirs, File::from(errors_w))
        }
        Ok(ForkResult::Parent { child }) => Ok(ReadyChild {
            pid: child,
            requests,
            errors: File::from(errors),
        }),
    }
}

/// The reply for what the ready child wrote on its error pipe: a failure of a request's
/// field (`field` NUL `message`, see `payload::refuse`) is refused on that field.
pub(crate) fn failed(failure: String) -> Reply {
    match failure.split_once('\0') {
        Some((field, message)) => Reply::Refused {
            field: field.to_owned(),
            message: message.to_owned(),
        },
        None => Reply::Failed { message: failure },
    }
}

/// The TUN device the cloned child left at [`protocol::TUN_FD`] (see
/// `sandbox::become_namespace_root`), if that fd is open and is one.
fn take_tun() -> Option<OwnedFd> {
    use nix::sys::stat::{SFlag, fstat, major, minor};
    // SAFETY: F_GETFD only queries the fd number.
    if unsafe { libc::fcntl(protocol::TUN_FD, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: the fd is open (above) and nothing else in this fresh process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(protocol::TUN_FD) };
    let _ = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC));
    // /dev/net/tun is the character device 10:200 (misc, TUN_MINOR).
    let st = fstat(&fd).ok()?;
    let chr = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFCHR;
    (chr && major(st.st_rdev) == 10 && minor(st.st_rdev) == 200).then_some(fd)
}

/// Reads the CA bundle of `len` bytes from the memfd that came with the set-up request.
fn read_ca_bundle(fds: Vec<OwnedFd>, len: u64) -> Result<Vec<u8>, String> {
    if len > protocol::MAX_CA_BUNDLE {
        return Err(format!(
            "{len} bytes is more than the {} allowed",
            protocol::MAX_CA_BUNDLE
        ));
    }
    let fd = fds
        .into_iter()
        .next()
        .ok_or("the set-up request carried no bundle")?;
    // From its start, whatever the shared file offset (the writer's is at its end).
    let mut bundle = vec![0u8; len as usize];
    std::os::unix::fs::FileExt::read_exact_at(&File::from(fd), &mut bundle, 0)
        .map_err(|e| format!("reading its {len} bytes: {e}"))?;
    Ok(bundle)
}

/// Waits until the control socket or the signalfd is readable; true for the signalfd.
fn poll_two(control: BorrowedFd<'_>, sigchld: BorrowedFd<'_>) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [
        PollFd::new(control, PollFlags::POLLIN),
        PollFd::new(sigchld, PollFlags::POLLIN),
    ];
    let _ = poll(&mut fds, PollTimeout::NONE);
    fds[1].revents().is_some_and(|r| r.contains(PollFlags::POLLIN))
}
