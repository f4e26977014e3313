//! A minimal client of QEMU's machine protocol (QMP): one JSON object per line, a
//! greeting, `qmp_capabilities` to leave negotiation mode, then `execute` commands whose
//! replies are `return` or `error` objects. Asynchronous `event` objects are skipped.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

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
        let mut msg = json!({ "execute": command });
        if !arguments.is_null() {
            msg["arguments"] = arguments;
        }
        let mut line = msg.to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| VmError::Control(format!("qmp {command}: {e}")))?;
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

impl VmControl for Qmp {
    fn accelerator(&mut self) -> Result<String, VmError> {
        let kvm = self.execute("query-kvm", Value::Null)?;
        Ok(if kvm["enabled"].as_bool() == Some(true) {
            "kvm".into()
        } else {
            "tcg".into()
        })
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
