//! What the supervisor and the sandbox's init say to each other. One `SOCK_SEQPACKET`
//! socketpair (init's end is fd 3) carries one frame per message: a `u32` little-endian
//! JSON length, the JSON, then raw payload bytes (a seccomp program, a file chunk). An
//! exec's stdin/stdout/stderr pipes travel with its request as `SCM_RIGHTS`.
//!
//! The conversation: a one-byte "go" (consumed by the cloned child before it execs init),
//! `Setup` -> `Attached` -> `Ready`, then any number of file
//! operations and execs, one at a time. Init answers every request once; a file write
//! (one `WriteFile` per chunk) is one request, answered after its last chunk, also when
//! an earlier chunk failed (init then reads and drops the rest), so the two sides never
//! wait on each other. While an exec runs init accepts only `Kill`.

use airlock_spec::FileEntry;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// The fd on which init holds its end of the control socket.
pub const CONTROL_FD: i32 = 3;

/// File content travels in chunks of at most this many bytes: a seqpacket message must
/// fit the socket's buffer whole.
pub const CHUNK: usize = 48 * 1024;

/// Largest frame accepted: one chunk, or a seccomp program (at most 4096 instructions of
/// 8 bytes), plus its JSON header.
const MAX_FRAME: usize = 96 * 1024;

/// Most fds one message carries (a spawn's control channel and three stdio pipes).
const MAX_FDS: usize = 4;

/// The byte of the "go" message that also asks the cloned child to open the TUN device
/// (see `sandbox::become_namespace_root`); any other byte is a plain "go".
pub const GO_WITH_TUN: u8 = b'T';

/// Where the cloned child leaves the TUN device it opened, for init.
pub const TUN_FD: i32 = 4;

/// Largest CA bundle accepted: the host's whole trust store is a few hundred KiB.
pub const MAX_CA_BUNDLE: u64 = 8 << 20;

/// Proxy mode's part of the set-up request: init binds the three sockets on the
/// sandbox's loopback (TCP `proxy_port`, TCP `transparent_port`, UDP `dns_port`), routes
/// every other address to the namespace's TUN device, installs the redirecting
/// nf_tables rules (see `nftables`), writes `nameserver 127.0.0.1` into /etc/resolv.conf,
/// and, with a CA bundle, installs it read-only at [`crate::etc::CA_BUNDLE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressSetup {
    /// The explicit HTTP proxy's port.
    pub proxy_port: u16,
    /// The transparent port: where TCP connections to non-loopback addresses land.
    pub transparent_port: u16,
    /// The resolver's port (UDP).
    pub dns_port: u16,
    /// Size of the CA bundle (PEM) to install, which travels as the request's fd (a
    /// memfd, read from its start); `None`: the root's own trust store stays.
    #[serde(default)]
    pub ca_bundle_bytes: Option<u64>,
}

/// Supervisor -> init.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Build the sandbox. Payload: the compiled seccomp program.
    Setup {
        /// Size of the writable tmpfs.
        disk_bytes: u64,
        /// Where system directories come from (the host's root when `None`).
        rootfs: Option<PathBuf>,
        /// An image's prepared tree: the sandbox's whole root (see `mounts`).
        #[serde(default)]
        image: Option<PathBuf>,
        /// The image's tree is mounted read-write (an image build's step: see
        /// `Engine::with_writable_image_root`).
        #[serde(default)]
        image_writable: bool,
        /// Proxy mode: what init sets up for the egress proxy (see [`EgressSetup`]).
        /// With `ca_bundle_bytes`, the request's one fd is the bundle.
        egress: Option<EgressSetup>,
        /// Programs run without address-space randomization (see
        /// `SandboxConfig::fixed_layout`).
        fixed_layout: bool,
    },
    /// Init has joined every cgroup: it may now charge memory to the sandbox.
    Attached,
    /// Write a chunk of a file under /workspace. Payload: the bytes. The write is
    /// answered once, after its last chunk: `Ok`, `NoRoom` or `Error`.
    WriteFile {
        /// Path relative to /workspace.
        path: String,
        /// Permission bits.
        mode: u32,
        /// Whether this chunk starts the file (truncate) or extends it.
        first: bool,
        /// Whether this is the last chunk (init answers after it, and only after it).
        last: bool,
    },
    /// Read a file under /workspace; answered by `FileChunk`s.
    ReadFile {
        /// Path relative to /workspace.
        path: String,
        /// Refuse files larger than this.
        max_bytes: u64,
    },
    /// List /workspace recursively; answered by `Listing`.
    ListFiles,
    /// Run a program. Fds: its stdin, stdout, stderr.
    Exec {
        /// argv.
        command: Vec<String>,
        /// The whole environment.
        env: Vec<(String, String)>,
        /// Largest file the program may write.
        max_file_bytes: u64,
        /// Where the program starts (absolute); `None`: /workspace.
        #[serde(default)]
        workdir: Option<String>,
        /// No exec follows this one (a one-shot sandbox): init keeps no ready child
        /// after it.
        #[serde(default)]
        last: bool,
        /// Its stdio is a terminal's slave side: the program (a session leader) makes it
        /// its controlling terminal (`TIOCSCTTY`). Set by a keeper only (see `keeper`).
        #[serde(default)]
        terminal: bool,
    },
    /// Kill every process of the running exec.
    Kill,
    /// Start a program alongside execs, under a keeper of its own (see `keeper`).
    /// Fds: the keeper's end of the program's control channel (a `SOCK_SEQPACKET`
    /// socket), then, without `terminal`, its stdin, stdout and stderr. Answered at once
    /// by `Ok` (the keeper runs; it reports on the channel whether the program started)
    /// or `Failed`. Refused as busy while an exec runs.
    Spawn {
        /// argv.
        command: Vec<String>,
        /// The whole environment.
        env: Vec<(String, String)>,
        /// Largest file the program may write.
        max_file_bytes: u64,
        /// Where the program starts (absolute); `None`: /workspace.
        #[serde(default)]
        workdir: Option<String>,
        /// A terminal of this size (rows, columns) is made for it inside the sandbox;
        /// its master side travels back on the channel with `Started`.
        #[serde(default)]
        terminal: Option<(u16, u16)>,
    },
}

/// Host -> a spawned program's keeper, on the program's own channel.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum KeeperRequest {
    /// Send this signal to the program (`SIGKILL`: to everything it started too).
    Signal {
        /// The signal number.
        signal: i32,
    },
}

/// A spawned program's keeper -> host, on the program's own channel: first `Started`
/// (or `Failed`/`Refused`), then, once, how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KeeperReply {
    /// The program's execve succeeded. Fds: a terminal's master side, when it has one.
    Started {
        /// Its pid in the sandbox's pid namespace.
        pid: i32,
    },
    /// Starting it failed.
    Failed {
        /// One line a person can act on.
        message: String,
    },
    /// It could not start because of a field of its request (a missing workdir).
    Refused {
        /// The request's field.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// It exited with `code`; whatever it started is gone.
    Exited {
        /// The exit status.
        code: i32,
    },
    /// A signal ended it; whatever it started is gone.
    Signaled {
        /// The signal number.
        signal: i32,
    },
}

/// Init -> supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reply {
    /// The sandbox is built and waits for requests. Fds: in proxy mode, the sockets the
    /// supervisor serves the egress proxy on, bound on the sandbox's loopback, in this
    /// order: the explicit proxy's listener, the transparent listener, the resolver's
    /// UDP socket (see [`EgressSetup`]).
    Ready,
    /// A file operation succeeded.
    Ok,
    /// A request failed; the sandbox is still usable.
    Error {
        /// What kind of failure (a missing file, a bad path, a host failure).
        failure: airlock_backend::ErrorKind,
        /// One line a person can act on.
        message: String,
    },
    /// A file write failed for want of room on the sandbox's disk; what was written of
    /// the file was removed again. The sandbox is still usable.
    NoRoom {
        /// Bytes free on the disk now.
        free_bytes: u64,
    },
    /// A chunk of a file being read. Payload: the bytes.
    FileChunk {
        /// Whether this is the last chunk.
        last: bool,
    },
    /// The files under /workspace.
    Listing {
        /// The entries, sorted by path.
        entries: Vec<FileEntry>,
    },
    /// The program's execve succeeded.
    Started,
    /// Building the sandbox or starting the program failed.
    Failed {
        /// One line a person can act on.
        message: String,
    },
    /// The program could not start because of a field of its request (a workdir that
    /// does not exist in the sandbox); nothing ran.
    Refused {
        /// The request's field.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The program exited with `code`; its other processes are gone.
    Exited {
        /// The exit status.
        code: i32,
    },
    /// A signal ended the program; its other processes are gone.
    Signaled {
        /// The signal number.
        signal: i32,
    },
}

/// Sends one frame with optional fds.
pub fn send<T: Serialize>(sock: BorrowedFd<'_>, msg: &T, payload: &[u8], fds: &[RawFd]) -> io::Result<()> {
    send_flags(sock, msg, payload, fds, MsgFlags::empty())
}

/// Like [`send`], but fails with `WouldBlock` instead of waiting when the socket has no
/// room for the frame (the caller polls for `POLLOUT`, with a deadline).
pub fn send_nowait<T: Serialize>(sock: BorrowedFd<'_>, msg: &T, payload: &[u8]) -> io::Result<()> {
    send_flags(sock, msg, payload, &[], MsgFlags::MSG_DONTWAIT)
}

fn send_flags<T: Serialize>(
    sock: BorrowedFd<'_>,
    msg: &T,
    payload: &[u8],
    fds: &[RawFd],
    flags: MsgFlags,
) -> io::Result<()> {
    let json = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let len = (json.len() as u32).to_le_bytes();
    let iov = [IoSlice::new(&len), IoSlice::new(&json), IoSlice::new(payload)];
    let cmsgs = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsgs };
    loop {
        match sendmsg::<()>(
            sock.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL | flags,
            None,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => return Ok(()),
        }
    }
}

/// The one-byte message that lets the cloned child exec init (see `sandbox`); with
/// `tun`, the child opens the TUN device first ([`GO_WITH_TUN`]).
pub fn send_go(sock: BorrowedFd<'_>, tun: bool) -> io::Result<()> {
    let go = if tun { [GO_WITH_TUN] } else { *b"G" };
    loop {
        match nix::sys::socket::send(sock.as_raw_fd(), &go, MsgFlags::MSG_NOSIGNAL) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => return Ok(()),
        }
    }
}

/// A received frame.
#[derive(Debug)]
pub struct Frame<T> {
    /// The message.
    pub msg: T,
    /// Raw bytes after the JSON.
    pub payload: Vec<u8>,
    /// Fds that came with it.
    pub fds: Vec<OwnedFd>,
}

/// Receives one frame; `Ok(None)` when the peer has closed the socket.
pub fn recv<T: DeserializeOwned>(sock: BorrowedFd<'_>) -> io::Result<Option<Frame<T>>> {
    thread_local! {
        // One receive buffer per thread, reused: a fresh zeroed 96 KiB per frame cost page
        // faults and a memset on every message of every exec.
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < MAX_FRAME {
            buf.resize(MAX_FRAME, 0);
        }
        recv_into(sock, &mut buf)
    })
}

fn recv_into<T: DeserializeOwned>(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<Frame<T>>> {
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (n, fds) = loop {
        let mut iov = [IoSliceMut::new(buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(m) => {
                let mut fds = Vec::new();
                for c in m.cmsgs().map_err(io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: the kernel installed these fds in this process for
                        // this message; nothing else owns them.
                        fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                    }
                }
                if m.flags.contains(MsgFlags::MSG_TRUNC) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "control frame too large",
                    ));
                }
                break (m.bytes, fds);
            }
        }
    };
    if n == 0 {
        return Ok(None);
    }
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed control frame");
    let len = u32::from_le_bytes(buf.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?) as usize;
    let json = buf.get(4..4 + len).ok_or_else(bad)?;
    let msg = serde_json::from_slice(json).map_err(io::Error::other)?;
    let payload = buf[4 + len..n].to_vec();
    Ok(Some(Frame { msg, payload, fds }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    use std::os::fd::AsFd;

    #[test]
    fn frames_round_trip_with_fds() {
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let (r, _w) = nix::unistd::pipe().unwrap();
        let req = Request::WriteFile {
            path: "x".into(),
            mode: 0o644,
            first: true,
            last: true,
        };
        send(a.as_fd(), &req, b"data", &[r.as_raw_fd()]).unwrap();
        let frame: Frame<Request> = recv(b.as_fd()).unwrap().unwrap();
        assert!(matches!(frame.msg, Request::WriteFile { last: true, .. }));
        assert_eq!(frame.payload, b"data");
        assert_eq!(frame.fds.len(), 1);
        drop(a);
        assert!(recv::<Request>(b.as_fd()).unwrap().is_none());
    }

    #[test]
    fn a_full_chunk_fits_one_frame() {
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let data = vec![7u8; CHUNK];
        let req = Request::WriteFile {
            path: "a/b/c.bin".into(),
            mode: 0o755,
            first: false,
            last: false,
        };
        send(a.as_fd(), &req, &data, &[]).unwrap();
        let frame: Frame<Request> = recv(b.as_fd()).unwrap().unwrap();
        assert_eq!(frame.payload.len(), CHUNK);
    }
}
