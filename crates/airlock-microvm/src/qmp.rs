//! A minimal client of QEMU's machine protocol (QMP): one JSON object per line, a
//! greeting, `qmp_capabilities` to leave negotiation mode, then `execute` commands whose
//! replies are `return` or `error` objects. Asynchronous `event` objects are skipped.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, IoSlice, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};

use crate::VmError;
use crate::vmm::VmControl;

/// A QMP reply line is short; this bounds one from a confused peer.
const MAX_LINE: usize = 1 << 20;
/// QMP answers in milliseconds; under TCG a busy VM may take a little longer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A connected QMP session, out of negotiation mode.
#[derive(Debug)]
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Reads the greeting and negotiates capabilities.
    pub fn connect(stream: UnixStream) -> Result<Qmp, VmError> {
        stream
            .set_read_timeout(Some(TIMEOUT))
            .map_err(|e| VmError::Control(format!("qmp: {e}")))?;
        let writer = stream
            .try_clone()
            .map_err(|e| VmError::Control(format!("qmp: {e}")))?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream),
            writer,
        };
        let greeting = qmp.read_line()?;
        if greeting.get("QMP").is_none() {
            return Err(VmError::Control(format!("qmp: unexpected greeting {greeting}")));
        }
        qmp.execute("qmp_capabilities", Value::Null)?;
        Ok(qmp)
    }

    /// Runs one command and returns its `return` value.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, VmError> {
        self.execute_passing(command, arguments, None)
    }

    /// Runs one command, passing `fd` along with it (SCM_RIGHTS), as `getfd` wants.
    fn execute_passing(
        &mut self,
        command: &str,
        arguments: Value,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Value, VmError> {
        let mut msg = json!({ "execute": command });
        if !arguments.is_null() {
            msg["arguments"] = arguments;
        }
        let mut line = msg.to_string();
        line.push('\n');
        let sent = match fd {
            None => self.writer.write_all(line.as_bytes()),
            Some(fd) => {
                let fds = [fd.as_raw_fd()];
                let cmsg = [ControlMessage::ScmRights(&fds)];
                // A QMP command line is far below the socket buffer: one sendmsg sends it
                // whole (a short send is reported rather than retried without the fd).
                match sendmsg::<()>(
                    self.writer.as_raw_fd(),
                    &[IoSlice::new(line.as_bytes())],
                    &cmsg,
                    MsgFlags::empty(),
                    None,
                ) {
                    Ok(n) if n == line.len() => Ok(()),
                    Ok(n) => Err(std::io::Error::other(format!("short send: {n} bytes"))),
                    Err(e) => Err(e.into()),
                }
            }
        };
        sent.map_err(|e| VmError::Control(format!("qmp {command}: {e}")))?;
        loop {
            let reply = self.read_line()?;
            if let Some(ret) = reply.get("return") {
                return Ok(ret.clone());
            }
            if let Some(err) = reply.get("error") {
                return Err(VmError::Control(format!("qmp {command}: {err}")));
            }
            // An event: not the reply.
        }
    }

    fn read_line(&mut self) -> Result<Value, VmError> {
        let mut line = String::new();
        let n = (&mut self.reader)
            .take(MAX_LINE as u64)
            .read_line(&mut line)
            .map_err(|e| VmError::Control(format!("qmp: {e}")))?;
        if n == 0 {
            return Err(VmError::Control("qmp: the VMM closed the connection".into()));
        }
        serde_json::from_str(&line).map_err(|e| VmError::Control(format!("qmp: {e}: {line:?}")))
    }
}

/// Between polls of a migration's progress: saving or loading the device state takes a
/// few milliseconds.
const MIGRATION_POLL: Duration = Duration::from_millis(2);

impl Qmp {
    /// Migrates without the RAM of `share=on` memory backends (the template's RAM file is
    /// the clones' RAM already), and hands QEMU `fd` as the migration's file.
    fn prepare_migration(&mut self, fd: BorrowedFd<'_>) -> Result<(), VmError> {
        self.execute(
            "migrate-set-capabilities",
            json!({ "capabilities": [{ "capability": "x-ignore-shared", "state": true }] }),
        )?;
        self.execute_passing("getfd", json!({ "fdname": "state" }), Some(fd))?;
        Ok(())
    }
}

impl VmControl for Qmp {
    fn stop(&mut self) -> Result<(), VmError> {
        self.execute("stop", Value::Null).map(drop)
    }

    fn cont(&mut self) -> Result<(), VmError> {
        self.execute("cont", Value::Null).map(drop)
    }

    fn save_devices(&mut self, to: BorrowedFd<'_>) -> Result<(), VmError> {
        // QEMU opens the file by name: an fd set (`add-fd`) is a name for a descriptor
        // of ours. Its access mode must be exactly write-only.
        let added = self.execute_passing("add-fd", Value::Null, Some(to))?;
        let set = added["fdset-id"]
            .as_i64()
            .ok_or_else(|| VmError::Control(format!("qmp add-fd: unexpected reply {added}")))?;
        // live=false: the block devices stay active, so the VM can run on after.
        let saved = self.execute(
            "xen-save-devices-state",
            json!({ "filename": format!("/dev/fdset/{set}"), "live": false }),
        );
        let removed = self.execute("remove-fd", json!({ "fdset-id": set }));
        saved?;
        removed.map(drop)
    }

    fn ram_address(&mut self) -> Result<u64, VmError> {
        let out = self.execute("human-monitor-command", json!({ "command-line": "gpa2hva 0" }))?;
        // "Host virtual address for 0x0 (ram) is 0x7f4b2c000000"
        let text = out.as_str().unwrap_or_default();
        text.rsplit_once(" is 0x")
            .and_then(|(_, hex)| u64::from_str_radix(hex.trim(), 16).ok())
            .ok_or_else(|| VmError::Control(format!("gpa2hva: unexpected answer {text:?}")))
    }

    fn accelerator(&mut self) -> Result<String, VmError> {
        let kvm = self.execute("query-kvm", Value::Null)?;
        Ok(if kvm["enabled"].as_bool() == Some(true) {
            "kvm".into()
        } else {
            "tcg".into()
        })
    }

    fn save_state(&mut self, to: BorrowedFd<'_>, timeout: Duration) -> Result<(), VmError> {
        let deadline = Instant::now() + timeout;
        self.execute("stop", Value::Null)?;
        self.prepare_migration(to)?;
        self.execute("migrate", json!({ "uri": "fd:state" }))?;
        loop {
            let info = self.execute("query-migrate", Value::Null)?;
            match info["status"].as_str() {
                Some("completed") => return Ok(()),
                Some(s @ ("failed" | "cancelled")) => {
                    return Err(VmError::Control(format!(
                        "saving the VM's state: {s}: {}",
                        info["error-desc"].as_str().unwrap_or("no reason given")
                    )));
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(VmError::Control(format!(
                    "saving the VM's state took over {timeout:?}"
                )));
            }
            std::thread::sleep(MIGRATION_POLL);
        }
    }

    fn restore_state(&mut self, from: BorrowedFd<'_>, timeout: Duration) -> Result<(), VmError> {
        let deadline = Instant::now() + timeout;
        self.prepare_migration(from)?;
        self.execute("migrate-incoming", json!({ "uri": "fd:state" }))?;
        // QEMU exits when the state does not load, which ends this connection.
        loop {
            let status = self.execute("query-status", Value::Null)?;
            match status["status"].as_str() {
                Some("inmigrate") => {}
                // The template was saved paused, and so is the clone: start it.
                Some("paused") => {
                    self.execute("cont", Value::Null)?;
                    return Ok(());
                }
                Some("running") => return Ok(()),
                other => {
                    return Err(VmError::Control(format!(
                        "restoring the VM's state: the VM is {}",
                        other.unwrap_or("in an unknown state")
                    )));
                }
            }
            if Instant::now() >= deadline {
                return Err(VmError::Control(format!(
                    "restoring the VM's state took over {timeout:?}"
                )));
            }
            std::thread::sleep(MIGRATION_POLL);
        }
    }
}

use std::io::Read as _;

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted peer in a thread plays QEMU's side.
    #[test]
    fn negotiates_and_skips_events() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let peer = std::thread::spawn(move || {
            let mut r = BufReader::new(theirs.try_clone().unwrap());
            let mut w = theirs;
            w.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n")
                .unwrap();
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            assert!(line.contains("qmp_capabilities"));
            w.write_all(b"{\"return\": {}}\n").unwrap();
            line.clear();
            r.read_line(&mut line).unwrap();
            assert!(line.contains("query-kvm"));
            w.write_all(b"{\"event\": \"RESUME\", \"timestamp\": {}}\n")
                .unwrap();
            w.write_all(b"{\"return\": {\"enabled\": false, \"present\": true}}\n")
                .unwrap();
        });
        let mut qmp = Qmp::connect(ours).unwrap();
        assert_eq!(qmp.accelerator().unwrap(), "tcg");
        peer.join().unwrap();
    }
}
