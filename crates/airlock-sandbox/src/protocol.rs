//! What the supervisor and the sandbox's init say to each other over their two pipes.
//!
//! Supervisor -> init (fd 3): one "go" byte once the uid maps and cgroups are in place,
//! then a [`InitConfig`] frame: `u32` little-endian JSON length, the JSON, then the raw
//! blobs it announces (the seccomp program, then each file's content, in order); then,
//! once init has joined every cgroup, one "attached" byte.
//!
//! Init -> supervisor (fd 4): one JSON [`InitReport`] per line.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::path::PathBuf;

/// The fd on which init reads its configuration.
pub const CONFIG_FD: i32 = 3;
/// The fd on which init writes its reports.
pub const REPORT_FD: i32 = 4;

/// A config frame larger than this is refused: files are bounded by the spec, and the
/// header is small; this guards init against a corrupt length.
const MAX_JSON: usize = 16 << 20;

/// Everything init needs to build the sandbox and start the program.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InitConfig {
    /// argv of the program.
    pub command: Vec<String>,
    /// The program's complete environment.
    pub env: Vec<(String, String)>,
    /// Files to place in /workspace: (relative path, mode, length of the blob).
    pub files: Vec<(String, u32, u64)>,
    /// Size of the writable tmpfs.
    pub disk_bytes: u64,
    /// Where system directories come from (host root when `None`).
    pub rootfs: Option<PathBuf>,
    /// Length of the seccomp program blob.
    pub seccomp_len: u64,
}

/// A decoded config frame.
#[derive(Debug)]
pub struct ConfigFrame {
    /// The header.
    pub config: InitConfig,
    /// The compiled seccomp filter, as bytes.
    pub seccomp: Vec<u8>,
    /// The content of each file, in `config.files` order.
    pub file_data: Vec<Vec<u8>>,
}

/// Writes a config frame.
pub fn write_config(
    out: &mut impl Write,
    config: &InitConfig,
    seccomp: &[u8],
    files: &[&[u8]],
) -> io::Result<()> {
    let json = serde_json::to_vec(config).map_err(io::Error::other)?;
    let mut head = Vec::with_capacity(4 + json.len());
    head.extend_from_slice(&(json.len() as u32).to_le_bytes());
    head.extend_from_slice(&json);
    out.write_all(&head)?;
    out.write_all(seccomp)?;
    for data in files {
        out.write_all(data)?;
    }
    out.flush()
}

/// Reads a config frame.
pub fn read_config(input: &mut impl Read) -> io::Result<ConfigFrame> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_JSON {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "config header too large",
        ));
    }
    let mut json = vec![0u8; len];
    input.read_exact(&mut json)?;
    let config: InitConfig = serde_json::from_slice(&json).map_err(io::Error::other)?;
    let seccomp = read_blob(input, config.seccomp_len)?;
    let file_data = config
        .files
        .iter()
        .map(|(_, _, len)| read_blob(input, *len))
        .collect::<io::Result<_>>()?;
    Ok(ConfigFrame {
        config,
        seccomp,
        file_data,
    })
}

fn read_blob(input: &mut impl Read, len: u64) -> io::Result<Vec<u8>> {
    let mut data = Vec::new();
    input.take(len).read_to_end(&mut data)?;
    if data.len() as u64 != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "config frame cut short",
        ));
    }
    Ok(data)
}

/// One message from init.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InitReport {
    /// The sandbox is built and the program's execve succeeded.
    Started,
    /// Building the sandbox or starting the program failed; nothing ran.
    Failed {
        /// One line a person can act on.
        message: String,
    },
    /// The program exited with `code`.
    Exited {
        /// Its exit status.
        code: i32,
    },
    /// A signal ended the program.
    Signaled {
        /// The signal number.
        signal: i32,
    },
}

impl InitReport {
    /// Serializes the report as one line.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec());
        line.push(b'\n');
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trip() {
        let config = InitConfig {
            command: vec!["true".into()],
            env: vec![("A".into(), "b".into())],
            files: vec![("a.txt".into(), 0o644, 3), ("b".into(), 0o755, 0)],
            disk_bytes: 1 << 20,
            rootfs: None,
            seccomp_len: 2,
        };
        let mut buf = Vec::new();
        write_config(&mut buf, &config, b"\x01\x02", &[b"abc", b""]).unwrap();
        let frame = read_config(&mut buf.as_slice()).unwrap();
        assert_eq!(frame.seccomp, b"\x01\x02");
        assert_eq!(frame.file_data, vec![b"abc".to_vec(), vec![]]);
        assert_eq!(frame.config.command, config.command);
        assert!(read_config(&mut &buf[..buf.len() - 1]).is_err());
    }

    #[test]
    fn report_lines() {
        let line = InitReport::Exited { code: 3 }.to_line();
        assert_eq!(line.last(), Some(&b'\n'));
        let back: InitReport = serde_json::from_slice(&line).unwrap();
        assert_eq!(back, InitReport::Exited { code: 3 });
    }
}
