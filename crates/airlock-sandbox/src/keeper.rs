//! A spawned program's keeper: the process that runs one program alongside a session's
//! execs and answers for it (see `Request::Spawn`).
//!
//! Init forks the keeper and goes back to serving requests at once. The keeper stays root
//! of the sandbox's user namespace (sandbox programs, never root and without
//! capabilities, cannot signal or trace it), holds the seccomp filter init installed on
//! itself, and:
//! 1. becomes a child subreaper: whatever its program starts stays beneath it, orphans
//!    included (they are re-parented to it, not to init), so its subtree is exactly the
//!    program's processes, and init's sweep after each exec spares that subtree;
//! 2. with a terminal, makes one in the sandbox's own devpts instance (`/dev/ptmx`),
//!    sized, its slave side owned by the sandbox user;
//! 3. forks the program through the exec's own privilege-dropping path (`payload`) and
//!    hands it the command and its stdio (the slave side, made its controlling terminal);
//! 4. reports `Started` on the program's channel (with the terminal's master side), then
//!    reaps, relays signals the host asks for, and when the program ends kills and reaps
//!    everything it left, reports how it ended and exits (init reaps the keeper).
//!
//! A channel the host closed leaves the program running (nobody hears its end). The
//! seccomp filter does not allow a new pid namespace here (`clone` with namespace flags
//! is refused to init too), hence the subreaper and the sweeps over /proc.

use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::init::{ReadyChild, fork_ready};
use crate::payload::Privileges;
use crate::procs;
use crate::protocol::{self, KeeperReply, KeeperRequest, Request};

/// What a keeper runs: the spawn request's fields.
#[derive(Debug)]
pub(crate) struct Order {
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub max_file_bytes: u64,
    pub workdir: Option<String>,
    pub terminal: Option<(u16, u16)>,
}

/// Runs the keeper in init's fresh fork; never returns. `sigchld` is init's signalfd (it
/// reads this process's own SIGCHLD after the fork); `stdio` is the program's three
/// pipes, or empty with a terminal.
pub(crate) fn run(
    privileges: Privileges,
    sigchld: RawFd,
    channel: OwnedFd,
    order: Order,
    stdio: Vec<OwnedFd>,
) -> ! {
    let program = match start(privileges, sigchld, &channel, order, stdio) {
        Ok(pid) => pid,
        Err(reply) => {
            let _ = protocol::send(channel.as_fd(), &reply, &[], &[]);
            kill_tree();
            // SAFETY: ends this forked child without running init's destructors.
            unsafe { libc::_exit(1) }
        }
    };
    // SAFETY: the signalfd stays open in this process for its whole life.
    let sigchld = unsafe { BorrowedFd::borrow_raw(sigchld) };
    let mut listening = true;
    loop {
        let mut ended = None;
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid.as_raw() == program => {
                    ended = Some(KeeperReply::Exited { code });
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid.as_raw() == program => {
                    ended = Some(KeeperReply::Signaled { signal: sig as i32 });
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
        if let Some(reply) = ended {
            // Whatever it left running goes with it, as after an exec.
            kill_tree();
            let _ = protocol::send(channel.as_fd(), &reply, &[], &[]);
            // SAFETY: ends this forked child without running init's destructors.
            unsafe { libc::_exit(0) }
        }
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = vec![PollFd::new(sigchld, PollFlags::POLLIN)];
        if listening {
            fds.push(PollFd::new(channel.as_fd(), PollFlags::POLLIN));
        }
        let _ = poll(&mut fds, PollTimeout::NONE);
        let child = fds[0].any().unwrap_or(false);
        let asked = fds.get(1).is_some_and(|f| f.any().unwrap_or(false));
        drop(fds);
        if child {
            let mut info = [0u8; 128];
            let _ = nix::unistd::read(sigchld, &mut info);
        }
        if asked {
            match protocol::recv::<KeeperRequest>(channel.as_fd()) {
                Ok(Some(frame)) => match frame.msg {
                    KeeperRequest::Signal { signal } => {
                        // SAFETY: kill(2) with integers; `program` is this process's
                        // unreaped child, so its pid cannot have been reused.
                        unsafe { libc::kill(program, signal) };
                        if signal == libc::SIGKILL {
                            kill_once(&procs::table("/proc"));
                        }
                    }
                },
                Ok(None) | Err(_) => listening = false,
            }
        }
    }
}

/// Steps 1-4 up to `Started`; the program's pid, or the reply that says why it did not
/// start.
fn start(
    privileges: Privileges,
    sigchld: RawFd,
    channel: &OwnedFd,
    order: Order,
    stdio: Vec<OwnedFd>,
) -> Result<i32, KeeperReply> {
    let failed = |message: String| KeeperReply::Failed { message };
    // 1.
    crate::sys::prctl(libc::PR_SET_CHILD_SUBREAPER, 1).map_err(|e| failed(format!("subreaper: {e}")))?;
    // 2.
    let (master, stdio) = match order.terminal {
        Some((rows, cols)) => {
            let (master, slave) =
                open_terminal(rows, cols).map_err(|e| failed(format!("making a terminal: {e}")))?;
            (Some(master), vec![slave])
        }
        None => (None, stdio),
    };
    let raw: Vec<RawFd> = match stdio.as_slice() {
        [slave] => vec![slave.as_raw_fd(); 3],
        [i, o, e] => vec![i.as_raw_fd(), o.as_raw_fd(), e.as_raw_fd()],
        _ => return Err(failed("a spawn needs three stdio fds".into())),
    };
    // 3.
    let ReadyChild {
        pid,
        requests,
        errors,
    } = fork_ready(privileges, &[channel.as_raw_fd(), sigchld]).map_err(failed)?;
    let request = Request::Exec {
        command: order.command,
        env: order.env,
        max_file_bytes: order.max_file_bytes,
        workdir: order.workdir,
        last: true,
        terminal: master.is_some(),
    };
    let sent = protocol::send(requests.as_fd(), &request, &[], &raw);
    drop((stdio, requests));
    let mut failure = String::new();
    let _ = { errors }.read_to_string(&mut failure);
    if sent.is_err() && failure.is_empty() {
        failure = "the program's process died before it could be handed the command".into();
    }
    if !failure.is_empty() {
        return Err(match crate::init::failed(failure) {
            protocol::Reply::Refused { field, message } => KeeperReply::Refused { field, message },
            protocol::Reply::Failed { message } => KeeperReply::Failed { message },
            other => KeeperReply::Failed {
                message: format!("{other:?}"),
            },
        });
    }
    // 4.
    let fds: Vec<RawFd> = master.iter().map(AsRawFd::as_raw_fd).collect();
    let started = KeeperReply::Started { pid: pid.as_raw() };
    // The host may have gone meanwhile: the program runs on all the same.
    let _ = protocol::send(channel.as_fd(), &started, &[], &fds);
    Ok(pid.as_raw())
}

/// A terminal of the sandbox's devpts instance: its master side and its slave side
/// (owned by the sandbox user), `rows` x `cols`.
fn open_terminal(rows: u16, cols: u16) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let check = |r: libc::c_int| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r)
        }
    };
    // SAFETY: open(2) of a NUL-terminated path; the fd is owned at once.
    let master = unsafe {
        OwnedFd::from_raw_fd(check(libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ))?)
    };
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads an int through the pointer, which lives for the call.
    check(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) })?;
    resize(master.as_fd(), rows, cols)?;
    // SAFETY: TIOCGPTPEER (Linux >= 4.13) takes open flags and returns a new fd for the
    // slave side, owned at once.
    let slave = unsafe {
        OwnedFd::from_raw_fd(check(libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        ))?)
    };
    let user = crate::mounts::SANDBOX_ID;
    nix::unistd::fchown(&slave, Some(user.into()), Some(user.into()))?;
    Ok((master, slave))
}

/// Sets the size of the terminal whose side `fd` is (its foreground process group gets
/// `SIGWINCH`).
pub(crate) fn resize(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> std::io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize through the pointer, which lives for the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// SIGKILLs every process beneath this one found in `table`; true if any was found (or
/// one could not be placed: look again).
fn kill_once(table: &std::collections::HashMap<i32, procs::Entry>) -> bool {
    let me = std::process::id() as i32;
    let mut more = false;
    for (&pid, entry) in table {
        if pid == me || entry.zombie {
            continue;
        }
        match procs::under(table, pid, &[me], 1) {
            Some(true) => {
                // SAFETY: kill(2) with integers.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                more = true;
            }
            Some(false) => {}
            None => more = true,
        }
    }
    more
}

/// Kills and reaps everything beneath this process. As a subreaper, every process its
/// program started is beneath it until reaped here, so no child left means none left.
fn kill_tree() {
    loop {
        let found = kill_once(&procs::table("/proc"));
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Err(nix::errno::Errno::ECHILD) => return,
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
        if !found {
            // Children that are not dead yet (SIGKILL lands at their next return to
            // user space) or zombies being reaped: give them a moment.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
