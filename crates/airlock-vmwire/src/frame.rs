//! The frames the host and the guest agent exchange over the VM's virtio-serial port.
//!
//! A frame is `u32 body length (LE) | u32 header length (LE) | header JSON | payload`.
//! The header is a [`ToGuest`] or [`ToHost`] message; the payload carries bytes (file
//! content, stdin, output) so they are never JSON-escaped. Both directions are bounded
//! by [`MAX_FRAME`] so neither side can be made to allocate without limit.

use airlock_spec::{ExecResult, FileEntry, Limits};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

/// Name of the agent's virtio-serial port (the guest finds it in /sys/class/virtio-ports).
pub const AGENT_PORT: &str = "airlock.agent";

/// The kernel command-line word that tells the guest its VM carries an image: a second
/// read-only virtio-blk drive (serial [`IMAGE_DRIVE_SERIAL`]) holding an OCI image's
/// prepared root as a squashfs, which the guest mounts at [`IMAGE_MOUNT`] and builds its
/// sandbox's root from (the sandbox's whole root: nothing of the guest's own system
/// directories). Absent: the sandbox binds the guest's system directories as today.
pub const IMAGE_BOOT_PARAM: &str = "airlock.image";

/// The serial number of the image's drive, which the guest finds it by (the order of
/// virtio-blk devices is not a contract).
pub const IMAGE_DRIVE_SERIAL: &str = "airlock-image";

/// Where the guest mounts the image's drive (read-only, nosuid, nodev), on its own
/// /run tmpfs.
pub const IMAGE_MOUNT: &str = "/run/airlock-image";

/// Payload bytes per data frame (stdin, files, output).
pub const CHUNK: usize = 64 * 1024;
/// Largest frame accepted: a chunk plus a header. The biggest header is the final
/// `ExecResult` (without its output, which travels in chunks) or a start message with a
/// 1 MiB argv+env block (the spec's own bound), so 2 MiB leaves room.
pub const MAX_FRAME: usize = 2 << 20;

/// Host -> guest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToGuest {
    /// Build the sandbox the next exec runs in. Answered by `Ok` or `Error`.
    Create {
        /// Limits of the guest's sandbox cgroup (memory, CPU, pids).
        limits: Limits,
        /// Its programs run with a fixed address-space layout: under emulation (TCG),
        /// so that code translated for one exec serves the next (see
        /// `airlock_sandbox::SandboxConfig::fixed_layout`).
        fixed_layout: bool,
    },
    /// Part of a file under /workspace; the payload is the bytes. The file is answered
    /// once, after its last part (also when an earlier part failed: the rest is read and
    /// dropped): `Ok`, `NoRoom` or `Error`.
    WriteFile {
        /// Path relative to /workspace.
        path: String,
        /// Permission bits.
        mode: u32,
        /// True for the first part (the file is created or truncated).
        first: bool,
        /// True for the last part.
        last: bool,
    },
    /// Part of the program's stdin (the payload), sent before `Exec`.
    Stdin,
    /// Proxy mode: bind the proxy's port (127.0.0.1:3128), the transparent port
    /// (127.0.0.1:3129) and the resolver's (127.0.0.1:53, UDP) in the sandbox's network
    /// namespace and relay their connections and datagrams over the egress port
    /// ([`crate::mux`]) to the host's proxy; later execs get the proxy's environment
    /// variables. Answered by `Ok` (also when the relay runs already) or `Error`. Needs
    /// the sandbox.
    Egress,
    /// Run the program. Answered by `Stdout`/`Stderr` chunks, then `Exited` or `Error`.
    Exec {
        /// argv.
        command: Vec<String>,
        /// Extra environment.
        env: Vec<(String, String)>,
        /// Limits (memory, CPU and pids may differ from `Create`'s).
        limits: Limits,
        /// Where the program starts (absolute); `None`: /workspace. The gVisor and
        /// micro-VM agents honour it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workdir: Option<String>,
    },
    /// Read a file under /workspace: answered by `FileChunk`s or `Error`.
    ReadFile {
        /// Path relative to /workspace.
        path: String,
        /// At most this many bytes.
        max_bytes: u64,
    },
    /// List /workspace recursively: answered by `Listing` or `Error`.
    ListFiles,
    /// Stop the running exec: its processes are killed, the sandbox stays, and the exec
    /// is answered by `Error` (or by `Exited`, when it ended first). Sent only while an
    /// exec runs; the agent notices it without reading it (its port becomes readable)
    /// and reads it after the exec's answer. Never answered itself.
    Cancel,
    /// The host is about to save this VM as the template of clones: from now on the
    /// agent refuses everything but `Resume`, so no clone can run a program before it
    /// has its own random state and clock. Answered by `Ok`.
    Freeze,
    /// This VM is a clone, just restored from its template: mix the payload (at least
    /// [`RESUME_SEED`] fresh random bytes from the host) into the guest kernel's random
    /// generator and reseed it, set the clock, and serve again. Answered by `Ok` or
    /// `Error`.
    Resume {
        /// The host's CLOCK_REALTIME, in nanoseconds since the epoch.
        unix_time_ns: u64,
    },
}

/// Host -> guest requests only the micro-VM's agent serves (the gVisor agent, which
/// also speaks [`ToGuest`], has no egress port to carry them).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToVmGuest {
    /// Start a program alongside the session's execs (see
    /// `airlock_backend::Sandbox::spawn`): its stdio are the egress port's streams
    /// `streams` (stdin, stdout, stderr; one, both ways, for a terminal), which the host
    /// has registered already; its signals, terminal size and end travel on that port
    /// under `process` ([`crate::mux`] version 3). Answered by `Spawned` or `Error`. Needs
    /// the sandbox.
    Spawn {
        /// argv.
        command: Vec<String>,
        /// Extra environment (the proxy's variables come first, as for an exec).
        env: Vec<(String, String)>,
        /// Where it starts (absolute); `None`: /workspace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workdir: Option<String>,
        /// A terminal of `(rows, cols)`, or pipes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        terminal: Option<(u16, u16)>,
        /// The id its signals, resizes and end are sent under on the egress port.
        process: u32,
        /// The egress port's stream ids of its stdio: three for pipes, one for a terminal.
        streams: Vec<u32>,
    },
    /// This VM was just restored from a full snapshot of a running one (a checkpoint
    /// saved while its agent waited for a request): as `ToGuest::Resume` (the payload's first
    /// [`RESUME_SEED`] bytes reseed the random generator, the clock is set), and the
    /// egress port starts over with the new host ([`crate::mux`] version 4): the agent
    /// sends the payload's next [`RESYNC_MARKER`] bytes on it and skips what arrives
    /// until it reads them back from the host; the streams the snapshot's host had open
    /// are cut from it (its spawned programs run on, their output dropped, their stdin
    /// left open; connections are reset). Answered by `Ok` or `Error`.
    Restored {
        /// The host's CLOCK_REALTIME, in nanoseconds since the epoch.
        unix_time_ns: u64,
    },
    /// Where the next `Exec`'s `files_changed` looks (`Spec::files_changed_in`: some of
    /// "/workspace", "/tmp"): scanned before the program starts and after it ends, the
    /// difference in its result. Sent before the `Exec`, as `Stdin` is; an `Exec` with
    /// none before it has no changeset. Never answered. (Mux version 4 and later.)
    ChangesIn {
        /// The directories.
        roots: Vec<String>,
    },
    /// Write the sandbox's writable filesystem (/workspace, /tmp, /dev/shm) as a tar
    /// stream (airlock-fstree's format): answered by `FileChunk`s as the stream is made
    /// (the last one marked), or by `Error` (also after some chunks: the stream is then
    /// worthless). Needs the sandbox. (Mux version 4 and later.)
    ExportFiles,
    /// Part of a tar stream (the payload) that replaces /workspace, /tmp and /dev/shm
    /// (what is not in it is gone; everything made is owned by the sandbox's user).
    /// Unpacked as the parts arrive; answered once, after the last part (also when an
    /// earlier one failed: the rest is read and dropped): `Ok`, `NoRoom` or `Error`.
    /// (Mux version 4 and later.)
    ImportFiles {
        /// True for the last part.
        last: bool,
        /// The host could not read the whole stream: what was unpacked stays, the
        /// answer is `Error`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        abort: bool,
    },
}

/// Any request the micro-VM's agent reads: a [`ToGuest`] or a [`ToVmGuest`] (both
/// tagged by `op`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum AgentRequest {
    /// A request every agent serves.
    Common(ToGuest),
    /// A request of the micro-VM's agent only.
    Vm(ToVmGuest),
}

/// Random bytes a `Resume` carries: a full key for the guest kernel's generator.
pub const RESUME_SEED: usize = 32;

/// Random bytes that mark where a restored VM's egress port starts over (`Restored`):
/// fresh per restore, so nothing a program sent before the snapshot can contain them.
pub const RESYNC_MARKER: usize = 32;

/// Guest -> host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToHost {
    /// The agent is up and waits for requests.
    Ready(GuestInfo),
    /// The request succeeded.
    Ok,
    /// The request failed; the VM is still usable unless `kind` is `gone`.
    Error {
        /// What kind of failure: the host acts on this, never on the message.
        kind: airlock_backend::ErrorKind,
        /// For `invalid`: the request's field at fault.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        field: Option<String>,
        /// What went wrong.
        message: String,
    },
    /// A file did not fit the sandbox's disk (what was written of it is removed); the
    /// VM is still usable.
    NoRoom {
        /// Bytes free on the disk after the failed write; `None` when the file is larger
        /// than the whole disk and was not written at all.
        free_bytes: Option<u64>,
        /// Set when the sandbox's memory cap is what the file does not fit (see
        /// `airlock_sandbox::DiskFull::memory_bytes`).
        #[serde(default)]
        memory_bytes: Option<u64>,
    },
    /// Program output within the output limit (payload).
    Stdout,
    /// Likewise for stderr.
    Stderr,
    /// The program ended. `stdout`/`stderr` of the result are empty: they came as chunks.
    Exited {
        /// The guest's result.
        result: Box<ExecResult>,
    },
    /// Part of a file being read (payload).
    FileChunk {
        /// True for the last part.
        last: bool,
    },
    /// The entries of /workspace, sorted by path (at most airlock-sandbox's listing
    /// bound, and one frame).
    Listing {
        /// Files and directories.
        entries: Vec<FileEntry>,
    },
    /// A spawned program started.
    Spawned {
        /// Its pid as its own processes see it.
        pid: u32,
    },
}

/// What the guest found at start, for `doctor` and the logs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct GuestInfo {
    /// The guest kernel's release.
    pub kernel: String,
    /// Landlock ABI of the guest kernel.
    pub landlock_abi: i32,
    /// Network interfaces in the guest (only `lo` is expected).
    pub net_devices: Vec<String>,
    /// Milliseconds from the guest kernel's start to the agent's start (CLOCK_BOOTTIME).
    pub init_ms: u64,
    /// Milliseconds from the guest kernel's start to the agent's modules being loaded.
    pub modules_ms: u64,
    /// Milliseconds from the guest kernel's start to the agent being ready.
    pub boot_ms: u64,
    /// The egress port's frame kinds the agent speaks ([`crate::mux::MUX_VERSION`]); 1
    /// from an agent that predates the field.
    #[serde(default = "mux_version_one")]
    pub mux_version: u32,
}

fn mux_version_one() -> u32 {
    1
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The channel failed.
    #[error("channel: {0}")]
    Io(#[from] io::Error),
    /// The peer sent something that is not a frame.
    #[error("bad frame: {0}")]
    Malformed(String),
}

/// One received frame.
#[derive(Debug)]
pub struct Frame<T> {
    /// The message.
    pub msg: T,
    /// Bytes attached to it.
    pub payload: Vec<u8>,
}

/// Writes one frame.
pub fn write<T: Serialize>(w: &mut impl Write, msg: &T, payload: &[u8]) -> Result<(), FrameError> {
    let header = serde_json::to_vec(msg).map_err(|e| FrameError::Malformed(e.to_string()))?;
    let body = 4 + header.len() + payload.len();
    if body > MAX_FRAME {
        return Err(FrameError::Malformed(format!(
            "frame of {body} bytes exceeds {MAX_FRAME}"
        )));
    }
    let mut buf = Vec::with_capacity(8 + header.len() + payload.len());
    buf.extend_from_slice(&(body as u32).to_le_bytes());
    buf.extend_from_slice(&(header.len() as u32).to_le_bytes());
    buf.extend_from_slice(&header);
    buf.extend_from_slice(payload);
    w.write_all(&buf)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame; `None` at a clean end of stream (before a frame started).
pub fn read<T: DeserializeOwned>(r: &mut impl Read) -> Result<Option<Frame<T>>, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let body = u32::from_le_bytes(len) as usize;
    if !(4..=MAX_FRAME).contains(&body) {
        return Err(FrameError::Malformed(format!("frame length {body}")));
    }
    let mut buf = vec![0u8; body];
    r.read_exact(&mut buf)?;
    let header = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if header > body - 4 {
        return Err(FrameError::Malformed(format!(
            "header length {header} in a {body}-byte frame"
        )));
    }
    let msg =
        serde_json::from_slice(&buf[4..4 + header]).map_err(|e| FrameError::Malformed(e.to_string()))?;
    let payload = buf.split_off(4 + header);
    Ok(Some(Frame { msg, payload }))
}

/// Reassembles frames from bytes read off a non-blocking stream.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, if one has arrived.
    pub fn next_frame<T: DeserializeOwned>(&mut self) -> Result<Option<Frame<T>>, FrameError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let body = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if !(4..=MAX_FRAME).contains(&body) {
            return Err(FrameError::Malformed(format!("frame length {body}")));
        }
        if self.buf.len() < 4 + body {
            return Ok(None);
        }
        let rest = self.buf.split_off(4 + body);
        let frame = std::mem::replace(&mut self.buf, rest);
        read(&mut frame.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut wire = Vec::new();
        let msg = ToGuest::WriteFile {
            path: "a/b.py".into(),
            mode: 0o644,
            first: true,
            last: false,
        };
        write(&mut wire, &msg, b"print(1)\n").unwrap();
        write(&mut wire, &ToGuest::Stdin, &[]).unwrap();
        let listing = ToHost::Listing {
            entries: vec![FileEntry {
                path: "a".into(),
                size: 0,
                mode: 0o755,
                dir: true,
            }],
        };
        write(&mut wire, &listing, &[]).unwrap();
        let mut r = wire.as_slice();
        let f = read::<ToGuest>(&mut r).unwrap().unwrap();
        assert_eq!(f.msg, msg);
        assert_eq!(f.payload, b"print(1)\n");
        let f = read::<ToGuest>(&mut r).unwrap().unwrap();
        assert_eq!(f.msg, ToGuest::Stdin);
        assert!(f.payload.is_empty());
        assert_eq!(read::<ToHost>(&mut r).unwrap().unwrap().msg, listing);
        assert!(read::<ToGuest>(&mut r).unwrap().is_none());
    }

    #[test]
    fn decoder_reassembles_split_frames() {
        let mut wire = Vec::new();
        write(&mut wire, &ToHost::Stdout, b"hello").unwrap();
        write(&mut wire, &ToHost::Ok, &[]).unwrap();
        let mut d = Decoder::default();
        let mut got = Vec::new();
        for byte in &wire {
            d.push(std::slice::from_ref(byte));
            while let Some(f) = d.next_frame::<ToHost>().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].payload, b"hello");
        assert_eq!(got[1].msg, ToHost::Ok);
    }

    #[test]
    fn oversized_and_truncated_frames_are_refused() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&((MAX_FRAME as u32) + 1).to_le_bytes());
        assert!(matches!(
            read::<ToHost>(&mut wire.as_slice()),
            Err(FrameError::Malformed(_))
        ));
        let mut wire = Vec::new();
        wire.extend_from_slice(&8u32.to_le_bytes());
        wire.extend_from_slice(&100u32.to_le_bytes());
        wire.extend_from_slice(b"{}{}");
        assert!(matches!(
            read::<ToHost>(&mut wire.as_slice()),
            Err(FrameError::Malformed(_))
        ));
        let big = vec![0u8; MAX_FRAME];
        assert!(write(&mut Vec::new(), &ToHost::Stdout, &big).is_err());
    }
}
