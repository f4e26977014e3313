//! A fork server for sandboxes: a small, single-threaded airlock process that clones
//! every sandbox's init for a long-running supervisor (the service), so that init needs no
//! `execve` of its own.
//!
//! Without it, the supervisor clones the sandbox from its own (large, multi-threaded)
//! process, and the child must exec airlock again to become init: the kernel copies the
//! supervisor's page tables for the clone and throws them away at the exec, then loads
//! and relocates a 12 MB binary and starts a fresh runtime, for every sandbox. The zygote
//! is exec'd once, with an empty environment and no fds but its socket (nothing of the
//! supervisor's memory, such as API keys, is in it); its clones are cheap copies of a small
//! process, and, single-threaded, they may run init's code directly.
//!
//! Each clone carries `CLONE_PARENT`: the sandbox's init is the supervisor's child, not the
//! zygote's, exactly as when the supervisor clones it itself. The supervisor reaps it,
//! writes its uid map and signals it through the pidfd the zygote passes back, and init's
//! `PR_SET_PDEATHSIG` fires when the supervisor thread that started the zygote ends. That
//! thread therefore lives as long as the process.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use serde::{Deserialize, Serialize};

use crate::protocol::{self, CONTROL_FD};
use crate::sys::{self, Cloned};

/// The argument (argv[1]) that turns the airlock binary into the zygote.
pub const ZYGOTE_ARG: &str = "__airlock_zygote__";

/// The zygote's end of its socket, where the supervisor places it before exec.
const SOCKET_FD: RawFd = 3;

/// A request to the zygote. Fds: init's control socket, then the cgroup2 directory to
/// clone into (when `cgroup`).
#[derive(Debug, Serialize, Deserialize)]
struct Spawn {
    /// Namespace flags for clone3.
    flags: u64,
    /// Whether a cgroup fd follows the control socket.
    cgroup: bool,
    /// Built ahead of need: the clone (creating the namespaces is most of a sandbox's
    /// cost) runs at [`sys::BACKGROUND_NICE`], and so does the child until the supervisor
    /// resets it.
    background: bool,
}

/// The zygote's answer. Fds: the child's pidfd (on success).
#[derive(Debug, Serialize, Deserialize)]
enum Spawned {
    /// The child runs; its pid in the supervisor's pid namespace.
    Ok { pid: libc::pid_t, in_cgroup: bool },
    /// The clone failed with this errno.
    Failed { errno: i32 },
}

/// The supervisor's handle on its zygote.
#[derive(Debug)]
pub(crate) struct Zygote {
    /// The socket; one request at a time.
    sock: Mutex<OwnedFd>,
}

impl Zygote {
    /// Starts the zygote from a thread that lives as long as this process (see the
    /// module docs), and waits until it runs.
    pub(crate) fn start() -> io::Result<Zygote> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        // Above the fds the exec'd process starts with, so the dup2 in the child never
        // clobbers it and always makes a copy (which clears close-on-exec).
        let theirs = crate::sandbox::high(&theirs)?;
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("airlock-zygote".into())
            .spawn(move || {
                let child = match spawn_process(&theirs) {
                    Ok(child) => child,
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return; // nothing was cloned: this thread may end
                    }
                };
                drop(theirs);
                let _ = started_tx.send(Ok(()));
                let mut child = child;
                let _ = child.wait();
                // Sandboxes cloned by the zygote may outlive it, and their parent-death
                // signal is tied to this thread: it must never end.
                loop {
                    std::thread::park();
                }
            })?;
        started_rx
            .recv()
            .map_err(|_| io::Error::other("the zygote thread ended"))??;
        Ok(Zygote {
            sock: Mutex::new(ours),
        })
    }

    /// Clones a sandbox's init into namespaces `flags` (and into `cgroup`, a cgroup2
    /// directory fd, when given); `control` becomes its fd 3. The child waits for the
    /// one-byte "go" message on `control`, like the one [`crate::sandbox`] clones itself.
    /// The outer error means the zygote is gone; the inner one is the clone's.
    pub(crate) fn spawn(
        &self,
        flags: u64,
        cgroup: Option<RawFd>,
        control: &OwnedFd,
        background: bool,
    ) -> io::Result<io::Result<Cloned>> {
        let sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        let mut fds = vec![control.as_raw_fd()];
        fds.extend(cgroup);
        let request = Spawn {
            flags,
            cgroup: cgroup.is_some(),
            background,
        };
        protocol::send(sock.as_fd(), &request, &[], &fds)?;
        let frame = protocol::recv::<Spawned>(sock.as_fd())?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "the zygote exited"))?;
        match frame.msg {
            Spawned::Ok { pid, in_cgroup } => {
                let pidfd = frame
                    .fds
                    .into_iter()
                    .next()
                    .ok_or_else(|| io::Error::other("the zygote sent no pidfd"))?;
                Ok(Ok(Cloned {
                    pid,
                    pidfd,
                    in_cgroup,
                }))
            }
            Spawned::Failed { errno } => Ok(Err(io::Error::from_raw_os_error(errno))),
        }
    }
}

/// Execs this binary as the zygote, with `sock` as its fd 3, an empty environment and
/// /dev/null stdio.
fn spawn_process(sock: &OwnedFd) -> io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let raw = sock.as_raw_fd();
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg0("airlock-zygote")
        .arg(ZYGOTE_ARG)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and only calls dup2, which
    // is async-signal-safe; `raw` stays open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto another number clears close-on-exec on the copy.
            if libc::dup2(raw, SOCKET_FD) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// The zygote's main loop; never returns. Started by [`crate::maybe_run_init`].
pub(crate) fn serve() -> ! {
    // SAFETY: the supervisor placed the socket at this fd before exec; nothing else in
    // this fresh process owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(SOCKET_FD) };
    // Die with the supervisor thread that started us (our sandboxes do, too).
    // SAFETY: prctl with integer arguments touches no memory.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    if sys::close_from(SOCKET_FD as libc::c_uint + 1).is_err() {
        std::process::exit(1);
    }
    let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    else {
        std::process::exit(1)
    };
    let null = OwnedFd::from(null);
    // The supervisor's own nice value, for clones nobody waits in the background for.
    let normal = sys::nice(0).unwrap_or(0);
    loop {
        let frame = match protocol::recv::<Spawn>(sock.as_fd()) {
            Ok(Some(frame)) => frame,
            // The supervisor is gone (or spoke nonsense): so are we.
            Ok(None) | Err(_) => std::process::exit(0),
        };
        let mut fds = frame.fds.into_iter();
        let Some(control) = fds.next() else {
            std::process::exit(1)
        };
        let cgroup = if frame.msg.cgroup { fds.next() } else { None };
        let flags = frame.msg.flags | libc::CLONE_PARENT as u64;
        // Best effort: only the order in which the CPU serves work depends on it.
        let nice = if frame.msg.background {
            sys::BACKGROUND_NICE
        } else {
            normal
        };
        let _ = sys::set_nice(0, nice);
        // SAFETY: this process is single-threaded, so the child is a complete copy that
        // may run any code; it never returns from `child`.
        let cloned = unsafe { sys::clone_process(flags, cgroup.as_ref().map(AsRawFd::as_raw_fd)) };
        let reply = match cloned {
            Ok(None) => child(&null, &control),
            Ok(Some(c)) => protocol::send(
                sock.as_fd(),
                &Spawned::Ok {
                    pid: c.pid,
                    in_cgroup: c.in_cgroup,
                },
                &[],
                &[c.pidfd.as_raw_fd()],
            ),
            Err(e) => protocol::send(
                sock.as_fd(),
                &Spawned::Failed {
                    errno: e.raw_os_error().unwrap_or(libc::EIO),
                },
                &[],
                &[],
            ),
        };
        if reply.is_err() {
            std::process::exit(0);
        }
        // Our copies of the child's fds (and its pidfd) close here: only the child and
        // the supervisor hold them.
    }
}

/// The cloned child: the same steps as the supervisor's own child takes before it execs
/// init (see `sandbox::child_to_init`), then init itself.
fn child(null: &OwnedFd, control: &OwnedFd) -> ! {
    // SAFETY: a single-threaded process's child; each call gets valid fds or pointers.
    unsafe {
        for target in 0..3 {
            if libc::dup2(null.as_raw_fd(), target) < 0 {
                libc::_exit(120);
            }
        }
        if libc::dup2(control.as_raw_fd(), CONTROL_FD) < 0 {
            libc::_exit(120);
        }
    }
    // Everything else goes, including the zygote's socket.
    if sys::close_from(CONTROL_FD as libc::c_uint + 1).is_err() {
        // SAFETY: leaving without running the zygote's destructors.
        unsafe { libc::_exit(121) };
    }
    // SAFETY: this process is the single-threaded zygote's child. Its parent (CLONE_PARENT)
    // is the supervisor thread that started the zygote, so it dies with that thread.
    unsafe { crate::sandbox::become_namespace_root(CONTROL_FD) };
    crate::init::run()
}
