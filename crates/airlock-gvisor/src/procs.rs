//! Programs alongside execs, the wire between the host ([`crate::process`]) and the
//! agent's process keeper (`agent::procs`).
//!
//! The host listens on a Unix socket in the bundle, bound root-only into the sandbox at
//! [`SANDBOX_DIR`] (runsc `--host-uds=open` lets the sandbox connect to it; the host
//! cannot connect in). The keeper connects once for its control connection and once more
//! for each stream it hands the host: a spawned program's stdin, stdout and stderr (its
//! terminal: one stream both ways) and each relayed port connection. Every connection
//! starts with one JSON line, its [`Hello`]; on the control connection, JSON lines follow
//! both ways: [`Request`]s from the host, [`Event`]s from the keeper.
//!
//! A spawned program's stdio are pipes inside the sandbox whose other ends the keeper
//! relays to and from the host's streams (a terminal's master side is relayed by the
//! program's parent), so that no program holds a connection to the host: `runsc
//! checkpoint` cannot save one. End of file and closing go through as on pipes.
//!
//! Before a checkpoint the host asks the keeper to [`Request::Detach`]: it drops every
//! connection to the host (the programs' output is read and dropped from then on),
//! answers [`Event::Detached`] and closes its control connection; it connects again
//! when the agent tells it to (`wire::ToGvAgent::Reattach`).

use airlock_backend::ErrorKind;
use serde::{Deserialize, Serialize};

/// Where the host's socket directory is bound inside the sandbox.
pub const SANDBOX_DIR: &str = "/.airlock/procs";
/// The socket's name in that directory.
pub const SOCKET: &str = "procs.sock";

/// The longest line either side accepts (a spawn carries argv and env, which the spec
/// bounds to 1 MiB; JSON escaping may double it).
pub const MAX_LINE: usize = 4 << 20;

/// The first line of each connection to the host.
#[derive(Debug, Serialize, Deserialize)]
pub enum Hello {
    /// The keeper's control connection.
    Control,
    /// Stream `stream` of request `id` (a program's 0 stdin, 1 stdout, 2 stderr; a
    /// terminal's or a port connection's only stream is 0).
    Stream {
        /// The request.
        id: u64,
        /// Which stream.
        stream: u8,
    },
}

/// What the host asks the keeper.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Start a program.
    Spawn {
        /// The host's name for it.
        id: u64,
        /// argv.
        command: Vec<String>,
        /// Its spec's environment.
        env: Vec<(String, String)>,
        /// The sandbox's own variables (proxy mode's), under the spec's.
        extra_env: Vec<(String, String)>,
        /// Where it starts (`None`: /workspace).
        workdir: Option<String>,
        /// RLIMIT_NPROC for it.
        nproc: u64,
        /// Rows and columns of its terminal; `None`: pipes.
        terminal: Option<(u16, u16)>,
    },
    /// Send a signal to a program's top process.
    Signal {
        /// The program.
        id: u64,
        /// The signal.
        signal: i32,
    },
    /// Resize a program's terminal.
    Resize {
        /// The program.
        id: u64,
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
    /// Drop every connection to the host (programs' streams, port connections, then
    /// the control connection itself, after the answer `Detached`) and wait for the
    /// agent's word to connect again. Refused (`Failed`) while a program with a
    /// terminal runs: its parent holds the host's stream.
    Detach {
        /// The request.
        id: u64,
    },
    /// Connect to a TCP port on the sandbox's loopback and relay it as stream 0 of `id`.
    Connect {
        /// The host's name for the connection.
        id: u64,
        /// The port.
        port: u16,
    },
}

/// What the keeper tells the host.
#[derive(Debug, Serialize, Deserialize)]
pub enum Event {
    /// A program started (its streams were connected before).
    Started {
        /// The program.
        id: u64,
        /// Its pid in the sandbox (as `ps` in an exec shows it), when found.
        pid: Option<u32>,
    },
    /// A program ended.
    Exited {
        /// The program.
        id: u64,
        /// Its exit status, when it exited.
        code: Option<i32>,
        /// The signal that ended it, when one did.
        signal: Option<i32>,
    },
    /// A port connection is relayed (its stream was connected before).
    Connected {
        /// The connection.
        id: u64,
    },
    /// The keeper holds no connection to the host but the control one, which it
    /// closes next.
    Detached {
        /// The request.
        id: u64,
    },
    /// A request failed.
    Failed {
        /// The request.
        id: u64,
        /// What kind of failure.
        kind: ErrorKind,
        /// The request's field at fault.
        field: Option<String>,
        /// What happened.
        message: String,
    },
}
