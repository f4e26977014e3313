//! Programs spawned alongside a session's execs (`ToGuest::Spawn`): background
//! processes, terminals, a code interpreter's kernel.
//!
//! An exec's leftovers are killed by the sandbox's init with `kill(-1)` in the sandbox's
//! pid namespace, and on a deadline or a cancel by a sweep of the sandbox's cgroup's own
//! members (airlock-sandbox). A spawned program must survive both, so it lives beside
//! them, not among them:
//!
//! - in a pid namespace of its own, a sibling of the sandbox's (made in the sandbox's
//!   user namespace), whose pid 1 is a small init forked here: when the program (pid 2)
//!   ends, that init reports how and exits, and the kernel kills whatever the program
//!   left in the namespace;
//! - in a child cgroup of the sandbox's (`spawn-<id>`, no controllers of its own): its
//!   processes count against the sandbox's memory, CPU and pids limits, are not members
//!   the exec's sweep signals, and `cgroup.kill` ends all of them at once (`SIGKILL`);
//! - in every other namespace of the sandbox (user, mount, network, ipc, uts, cgroup),
//!   with the privileges of an exec's program: the sandbox user, no capabilities,
//!   no_new_privs, the same landlock rules and the same seccomp filter.
//!
//! Its /proc is the sandbox's (a proc of its own pid namespace cannot be mounted in the
//! sandbox's user namespace over the masked one): `ps` there shows the execs' processes,
//! not its own, and /proc/self does not resolve.
//!
//! The work is done by a helper: this binary re-executed with [`HELPER_ARG`] (the agent
//! is multi-threaded; joining a user namespace needs a single-threaded process). The
//! helper's stdio are the program's; fd 3 is a socket to the agent: the request (JSON)
//! comes on it, and the helper and the init send back lines of [`Report`].

use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, signal, sigprocmask};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Gid, Pid, Uid, fork, setgroups, setresgid, setresuid};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::egress::{self, Shared, Sock};
use airlock_vmwire::mux::{ExitStatus, MuxFrame};

/// The argument (argv[1]) that turns this binary into the spawn helper.
pub const HELPER_ARG: &str = "__airlock_spawn__";
/// The sandbox user (uid and gid), as airlock-sandbox's programs run.
const SANDBOX_ID: u32 = 1000;
/// Open files per process, as an exec's program.
const MAX_OPEN_FILES: u64 = 4096;
/// The helper's socket to the agent.
const CONTROL_FD: i32 = 3;
/// How long the helper may take to start the program (under emulation, joining the
/// namespaces and building the filters take a while).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes of a request: an argv and environment within the spec's 1 MiB bound, in JSON.
const MAX_REQUEST: u64 = 4 << 20;

/// What the helper is asked to start.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    /// The sandbox's init, whose namespaces it joins.
    init_pid: u32,
    /// The cgroup it joins (made by the agent).
    cgroup: PathBuf,
    command: Vec<String>,
    /// The whole environment.
    env: Vec<(String, String)>,
    workdir: Option<String>,
    /// Stdio is a terminal's slave: the program makes it its controlling terminal.
    terminal: bool,
    /// The sandbox's disk size: the program's file-size cap.
    max_file_bytes: u64,
    /// Proxy mode: TCP connections are left to the network namespace's rules.
    connect_tcp: bool,
    /// The sandbox's root is an image's tree.
    image: bool,
    /// Programs run with a fixed address-space layout (emulated VMs).
    fixed_layout: bool,
}

/// What the helper and its init say, one JSON line each.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Report {
    /// The helper forked the init: its pid in the VM.
    Init(u32),
    /// The init forked the program.
    Started,
    /// A step failed; nothing runs.
    Failed(String),
    /// The program ended.
    Exited { code: Option<i32>, signal: Option<i32> },
}

/// What the agent knows of the sandbox a program is spawned in.
#[derive(Debug, Clone)]
pub struct SandboxRef {
    /// Its init's pid in the VM.
    pub init_pid: u32,
    /// Its cgroup's directory.
    pub cgroup: PathBuf,
}

impl SandboxRef {
    /// The sandbox whose init is `pid`.
    pub fn of(pid: u32) -> Result<SandboxRef, String> {
        let text =
            fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|e| format!("its cgroup: {e}"))?;
        let path = text
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .ok_or("no cgroup v2 path")?;
        Ok(SandboxRef {
            init_pid: pid,
            cgroup: Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')),
        })
    }
}

/// What the agent asks for: the `Spawn` request's fields and the sandbox's settings.
pub struct Spawn {
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub terminal: Option<(u16, u16)>,
    pub process: u32,
    pub streams: Vec<u32>,
    pub max_file_bytes: u64,
    pub connect_tcp: bool,
    pub image: bool,
    pub fixed_layout: bool,
}

/// A spawned program that runs: what `Signal` and `Resize` reach.
#[derive(Debug)]
pub struct Running {
    /// A pidfd of its init (pid 1 of its namespace): signals never reach a process that
    /// reused its pid.
    init: Option<OwnedFd>,
    /// A pidfd of the program (`None` when it ended before it was opened).
    program: Option<OwnedFd>,
    /// Its cgroup.
    cgroup: PathBuf,
    /// The terminal's master side, if it has one.
    master: Option<File>,
    /// It has ended (nothing is signalled any more: its pids may be reused).
    ended: Mutex<bool>,
}

impl Running {
    /// Sends `signal` to the program; `SIGKILL` kills everything it started.
    pub fn signal(&self, signal: u32) {
        let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        if *ended {
            return;
        }
        let send = |fd: &Option<OwnedFd>, sig: i32| {
            if let Some(fd) = fd {
                let _ = airlock_sandbox::sys::pidfd_send_signal(fd.as_raw_fd(), sig);
            }
        };
        if signal == libc::SIGKILL as u32 {
            let _ = fs::write(self.cgroup.join("cgroup.kill"), "1");
            send(&self.init, libc::SIGKILL);
        } else {
            send(&self.program, signal as i32);
        }
    }

    /// Resizes its terminal: the kernel sends `SIGWINCH` to its foreground group.
    pub fn resize(&self, rows: u16, cols: u16) {
        if let Some(master) = &self.master {
            let ws = libc::winsize {
                ws_row: rows,
                ws_col: cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            };
            // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which outlives the call.
            unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        }
    }
}

/// Starts a program; returns its pid as its processes see it (2: its init is 1).
pub fn start(shared: &Arc<Shared>, sandbox: &SandboxRef, spawn: Spawn) -> Result<u32, String> {
    let cgroup = sandbox.cgroup.join(format!("spawn-{:x}", spawn.process));
    fs::create_dir(&cgroup).map_err(|e| format!("creating {}: {e}", cgroup.display()))?;
    let started = start_in(shared, sandbox, &cgroup, &spawn);
    if started.is_err() {
        let _ = fs::write(cgroup.join("cgroup.kill"), "1");
        remove_cgroup(&cgroup);
        for id in &spawn.streams {
            let _ = shared.send(&MuxFrame::Reset(*id));
        }
    }
    started
}

fn start_in(shared: &Arc<Shared>, sandbox: &SandboxRef, cgroup: &Path, spawn: &Spawn) -> Result<u32, String> {
    let io_err = |what: &str| {
        let what = what.to_owned();
        move |e: io::Error| format!("{what}: {e}")
    };
    // The program's stdio, and the ends relayed on the port.
    let (stdio, master): ([OwnedFd; 3], Option<File>) = match (spawn.terminal, spawn.streams.as_slice()) {
        (Some((rows, cols)), [id]) => {
            let ws = nix::pty::Winsize {
                ws_row: rows,
                ws_col: cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            };
            let pty = nix::pty::openpty(Some(&ws), None).map_err(|e| format!("openpty: {e}"))?;
            let master = File::from(pty.master);
            nix::fcntl::fcntl(
                &master,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )
            .map_err(|e| format!("the terminal: {e}"))?;
            let relayed = master.try_clone().map_err(io_err("the terminal"))?;
            egress::attach(shared, *id, Sock::Pty(relayed), None)?;
            let slave = pty.slave;
            let dup = |fd: &OwnedFd| fd.try_clone().map_err(io_err("the terminal"));
            ([dup(&slave)?, dup(&slave)?, slave], Some(master))
        }
        (None, [a, b, c]) => {
            let mut theirs = Vec::new();
            for id in [a, b, c] {
                let (ours, program) = UnixStream::pair().map_err(io_err("socketpair"))?;
                egress::attach(shared, *id, Sock::Unix(ours), None)?;
                theirs.push(OwnedFd::from(program));
            }
            let [i, o, e] = <[OwnedFd; 3]>::try_from(theirs).map_err(|_| "three streams".to_owned())?;
            ([i, o, e], None)
        }
        _ => return Err(format!("{} streams for this stdio", spawn.streams.len())),
    };
    let request = Request {
        init_pid: sandbox.init_pid,
        cgroup: cgroup.to_owned(),
        command: spawn.command.clone(),
        env: spawn.env.clone(),
        workdir: spawn.workdir.clone(),
        terminal: spawn.terminal.is_some(),
        max_file_bytes: spawn.max_file_bytes,
        connect_tcp: spawn.connect_tcp,
        image: spawn.image,
        fixed_layout: spawn.fixed_layout,
    };
    let (control, theirs) = UnixStream::pair().map_err(io_err("socketpair"))?;
    let raw = theirs.as_raw_fd();
    let [stdin, stdout, stderr] = stdio;
    let mut command = std::process::Command::new("/proc/self/exe");
    command
        .arg(HELPER_ARG)
        .env_clear()
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr);
    // SAFETY: the closure runs in the forked child before execve and calls only
    // async-signal-safe functions (dup2, fcntl) on an fd that is open in the child.
    unsafe {
        command.pre_exec(move || {
            let r = if raw == CONTROL_FD {
                libc::fcntl(raw, libc::F_SETFD, 0)
            } else {
                libc::dup2(raw, CONTROL_FD)
            };
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        });
    }
    let mut helper = command.spawn().map_err(io_err("starting the spawn helper"))?;
    drop(command);
    drop(theirs);
    let fail = |helper: &mut std::process::Child, e: String| {
        let _ = helper.kill();
        let _ = helper.wait();
        e
    };
    let json = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
    if let Err(e) = (&control).write_all(&json) {
        return Err(fail(&mut helper, format!("the spawn helper: {e}")));
    }
    let _ = control.shutdown(std::net::Shutdown::Write);
    let _ = control.set_read_timeout(Some(START_TIMEOUT));
    let mut reports = BufReader::new(control);
    // The helper says its init's pid, the init that the program started: two processes
    // writing, in either order.
    // A program that ends at once may be reported ended before its init's pid comes.
    let (mut init, mut started, mut early_end) = (None, false, None);
    while init.is_none() || !started {
        match next_report(&mut reports) {
            Some(Report::Init(pid)) => init = Some(pid as i32),
            Some(Report::Started) => started = true,
            Some(Report::Failed(e)) => return Err(fail(&mut helper, e)),
            Some(end @ Report::Exited { .. }) if started => early_end = Some(end),
            Some(Report::Exited { .. }) | None => {
                return Err(fail(
                    &mut helper,
                    "the spawn helper ended before the program started".into(),
                ));
            }
        }
    }
    let Some(init) = init else {
        return Err(fail(&mut helper, "the spawn helper did not say its init".into()));
    };
    let _ = reports.get_ref().set_read_timeout(None);
    // The program is the init's only child (none when it ended already).
    let program = fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()))
        .and_then(|pid| airlock_sandbox::sys::pidfd_open(pid).ok());
    let running = Arc::new(Running {
        init: airlock_sandbox::sys::pidfd_open(init).ok(),
        program,
        cgroup: cgroup.to_owned(),
        master,
        ended: Mutex::new(false),
    });
    shared
        .procs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(spawn.process, Arc::clone(&running));
    let (s, process) = (Arc::clone(shared), spawn.process);
    std::thread::Builder::new()
        .name(format!("spawned-{process:x}"))
        .spawn(move || {
            let mut early_end = early_end;
            let status = loop {
                match early_end.take().or_else(|| next_report(&mut reports)) {
                    Some(Report::Exited { code, signal }) => {
                        break match (code, signal) {
                            (Some(c), _) => ExitStatus::Code(c as u8),
                            (None, Some(s)) => ExitStatus::Signal(s as u8),
                            (None, None) => ExitStatus::Signal(libc::SIGKILL as u8),
                        };
                    }
                    Some(_) => continue,
                    // Its init was killed (SIGKILL, or the cgroup's limits).
                    None => break ExitStatus::Signal(libc::SIGKILL as u8),
                }
            };
            *running.ended.lock().unwrap_or_else(|e| e.into_inner()) = true;
            let _ = fs::write(running.cgroup.join("cgroup.kill"), "1");
            let _ = helper.wait();
            remove_cgroup(&running.cgroup);
            s.procs.lock().unwrap_or_else(|e| e.into_inner()).remove(&process);
            let _ = s.send(&MuxFrame::Exited(process, status));
        })
        .map_err(io_err("a thread"))?;
    Ok(2)
}

/// Removes a spawned program's cgroup once its processes are gone (they leave it as they
/// are reaped: a bounded wait).
fn remove_cgroup(dir: &Path) {
    for _ in 0..200 {
        if fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn next_report(r: &mut impl BufRead) -> Option<Report> {
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => serde_json::from_str(&line).ok(),
    }
}

fn report(control: &mut impl Write, r: &Report) {
    if let Ok(mut line) = serde_json::to_vec(r) {
        line.push(b'\n');
        let _ = control.write_all(&line);
    }
}

/// If this process is the spawn helper, runs it and never returns.
pub fn maybe_run_helper() {
    if std::env::args_os().nth(1).is_some_and(|a| a == HELPER_ARG) {
        // SAFETY: fd 3 is the socket the agent placed there (see `start_in`); nothing
        // else in this fresh process owns it.
        let mut control = unsafe { UnixStream::from_raw_fd(CONTROL_FD) };
        if let Err(e) = helper(&mut control) {
            report(&mut control, &Report::Failed(e));
            std::process::exit(1);
        }
        std::process::exit(0);
    }
}

fn step<T, E: std::fmt::Display>(what: &str, r: Result<T, E>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// The helper: joins the sandbox, makes the pid namespace, forks its init, waits for it.
/// Order, and why:
/// 1. the cgroup, while the VM's /sys is still this process's;
/// 2. the sandbox's namespaces, its user namespace first (it owns the others), and its
///    root there;
/// 3. a new pid namespace (its first child is pid 1 there);
/// 4. the landlock rules (they open the sandbox's paths, so after its mount namespace)
///    and the seccomp filter, built before the fork;
/// 5. fork the init; it drops every privilege and forks the program.
fn helper(control: &mut UnixStream) -> Result<(), String> {
    let mut json = Vec::new();
    step(
        "the request",
        (&*control).take(MAX_REQUEST).read_to_end(&mut json),
    )?;
    let req: Request = step("the request", serde_json::from_slice(&json))?;
    // 1.
    step(
        "joining the cgroup",
        fs::write(req.cgroup.join("cgroup.procs"), "0"),
    )?;
    // 2.
    use nix::sched::CloneFlags;
    let kinds = [
        ("user", CloneFlags::CLONE_NEWUSER),
        ("mnt", CloneFlags::CLONE_NEWNS),
        ("net", CloneFlags::CLONE_NEWNET),
        ("ipc", CloneFlags::CLONE_NEWIPC),
        ("uts", CloneFlags::CLONE_NEWUTS),
        ("cgroup", CloneFlags::CLONE_NEWCGROUP),
    ];
    let files = kinds
        .iter()
        .map(|(name, _)| step(name, File::open(format!("/proc/{}/ns/{name}", req.init_pid))))
        .collect::<Result<Vec<_>, _>>()?;
    for (file, (name, flag)) in files.iter().zip(kinds) {
        step(
            &format!("joining the sandbox's {name} namespace"),
            nix::sched::setns(file, flag),
        )?;
    }
    drop(files);
    step(
        "setresgid",
        setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0)),
    )?;
    step(
        "setresuid",
        setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0)),
    )?;
    // 3.
    step("a pid namespace", nix::sched::unshare(CloneFlags::CLONE_NEWPID))?;
    // 4.
    let landlock = step(
        "landlock",
        airlock_sandbox::landlock::prepare(req.connect_tcp, req.image, false),
    )?;
    let seccomp = step("seccomp", airlock_seccomp::build())?;
    let cap_last_cap: u32 = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    // 5.
    // SAFETY: the helper is single-threaded (a fresh exec that started no threads).
    match step("fork", unsafe { fork() })? {
        ForkResult::Child => {
            let e = match init(&req, landlock, &seccomp, cap_last_cap, control) {
                Ok(never) => match never {},
                Err(e) => e,
            };
            report(control, &Report::Failed(e));
            std::process::exit(1)
        }
        ForkResult::Parent { child } => {
            report(control, &Report::Init(child.as_raw() as u32));
            // The program's stdio are its init's and the program's only.
            for fd in 0..3 {
                // SAFETY: closing this process's own stdio, which it no longer uses.
                unsafe { libc::close(fd) };
            }
            while let Err(nix::errno::Errno::EINTR) = waitpid(child, None) {}
            Ok(())
        }
    }
}

/// Pid 1 of the program's namespace: drops every privilege as an exec's program does
/// (airlock-sandbox's `payload`), forks the program, reaps, and reports its end. When it
/// exits, the kernel kills what is left in the namespace.
fn init(
    req: &Request,
    landlock: landlock::RulesetCreated,
    seccomp: &[airlock_seccomp::sock_filter],
    cap_last_cap: u32,
    control: &mut UnixStream,
) -> Result<std::convert::Infallible, String> {
    for sig in Signal::iterator() {
        if sig != Signal::SIGKILL && sig != Signal::SIGSTOP {
            // SAFETY: installing SIG_DFL runs no handler code.
            let _ = unsafe { signal(sig, SigHandler::SigDfl) };
        }
    }
    step(
        "sigprocmask",
        sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None),
    )?;
    step("RLIMIT_CORE", setrlimit(Resource::RLIMIT_CORE, 0, 0))?;
    step(
        "RLIMIT_NOFILE",
        setrlimit(Resource::RLIMIT_NOFILE, MAX_OPEN_FILES, MAX_OPEN_FILES),
    )?;
    let gid = Gid::from_raw(SANDBOX_ID);
    step("setgroups", setgroups(&[gid]))?;
    step("setresgid", setresgid(gid, gid, gid))?;
    for cap in 0..=cap_last_cap {
        step(
            "drop bounding capability",
            airlock_sandbox::sys::prctl(libc::PR_CAPBSET_DROP, cap.into()),
        )?;
    }
    let uid = Uid::from_raw(SANDBOX_ID);
    step("setresuid", setresuid(uid, uid, uid))?;
    step("capset", airlock_sandbox::sys::clear_capabilities())?;
    step(
        "clear ambient capabilities",
        airlock_sandbox::sys::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        ),
    )?;
    step(
        "no_new_privs",
        airlock_sandbox::sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1),
    )?;
    step("landlock", airlock_sandbox::landlock::restrict(landlock))?;
    if req.fixed_layout {
        step("personality", airlock_sandbox::sys::fix_layout())?;
    }
    step("seccomp", airlock_seccomp::apply(seccomp))?;
    step("close_range", airlock_sandbox::sys::cloexec_from(3))?;
    // SAFETY: this init is single-threaded (a fork of the single-threaded helper).
    let program = match step("fork", unsafe { fork() })? {
        ForkResult::Child => program(req),
        ForkResult::Parent { child } => child,
    };
    report(control, &Report::Started);
    for fd in 0..3 {
        // SAFETY: closing this process's own stdio: the program's output ends with it.
        unsafe { libc::close(fd) };
    }
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == program => {
                report(
                    control,
                    &Report::Exited {
                        code: Some(code),
                        signal: None,
                    },
                );
                std::process::exit(0)
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == program => {
                report(
                    control,
                    &Report::Exited {
                        code: None,
                        signal: Some(sig as i32),
                    },
                );
                std::process::exit(0)
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => std::process::exit(1),
        }
    }
}

/// The program's process: its session, its terminal, its limits, its directory, execve.
fn program(req: &Request) -> ! {
    let _ = nix::unistd::setsid();
    if req.terminal {
        // SAFETY: TIOCSCTTY takes an integer; fd 0 is the terminal's slave.
        unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) };
    }
    let _ = setrlimit(Resource::RLIMIT_FSIZE, req.max_file_bytes, req.max_file_bytes);
    let workdir = req.workdir.clone().unwrap_or_else(|| "/workspace".into());
    if let Err(e) = nix::unistd::chdir(workdir.as_str()) {
        fail_like_a_shell(126, &format!("{workdir}: cannot start the program there: {e}"));
    }
    let Some(first) = req.command.first() else {
        fail_like_a_shell(127, "empty command")
    };
    let path = match resolve(first, &req.env, Path::new(&workdir)) {
        Ok(p) => p,
        Err((status, message)) => fail_like_a_shell(status, &message),
    };
    let cstring = |s: &str| CString::new(s).unwrap_or_default();
    let argv: Vec<CString> = req.command.iter().map(|a| cstring(a)).collect();
    let envp: Vec<CString> = req
        .env
        .iter()
        .map(|(k, v)| cstring(&format!("{k}={v}")))
        .collect();
    let path = cstring(&path.to_string_lossy());
    let e = nix::unistd::execve(&path, &argv, &envp).unwrap_err();
    fail_like_a_shell(126, &format!("{}: {e}", path.to_string_lossy()))
}

fn fail_like_a_shell(status: i32, message: &str) -> ! {
    let _ = writeln!(io::stderr(), "airlock: {message}");
    // SAFETY: _exit ends this single-threaded child at once.
    unsafe { libc::_exit(status) }
}

/// Finds the program as a shell would (airlock-sandbox's `payload::resolve`).
fn resolve(program: &str, env: &[(String, String)], workdir: &Path) -> Result<PathBuf, (i32, String)> {
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = workdir.join(program);
        return if executable(&path) {
            Ok(path)
        } else if path.exists() {
            Err((126, format!("{program}: not an executable file")))
        } else {
            Err((127, format!("{program}: no such file in the sandbox")))
        };
    }
    let search = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/bin:/bin");
    search
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(program))
        .find(|p| executable(p))
        .ok_or_else(|| {
            (
                127,
                format!("{program}: command not found in the sandbox (searched PATH={search})"),
            )
        })
}

/// The environment every program starts with (airlock-sandbox's `base_env`).
pub fn base_env() -> Vec<(String, String)> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/workspace"),
        ("PWD", "/workspace"),
        ("TMPDIR", "/tmp"),
        ("USER", "sandbox"),
        ("LOGNAME", "sandbox"),
        ("LANG", "C.UTF-8"),
        ("HOSTNAME", "airlock"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}
