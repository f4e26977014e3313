//! Requests only the gVisor agent serves, beside the frames every agent speaks
//! (`airlock_vmwire::frame::ToGuest`): an exec's changeset roots, and the writable
//! filesystem as a tar stream out and in (airlock-fstree's format), both streamed in
//! frames of at most [`CHUNK`](airlock_vmwire::frame::CHUNK) bytes.

use airlock_vmwire::frame::ToGuest;
use serde::{Deserialize, Serialize};

/// Host -> gVisor agent, tagged by `op` like [`ToGuest`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToGvAgent {
    /// Where the next `Exec`'s `files_changed` looks (`Spec::files_changed_in`: some of
    /// "/workspace", "/tmp"; empty: no changeset). Sent before it, as `Stdin` is; an
    /// `Exec` with none before it has no changeset. Never answered.
    ChangesIn {
        /// The directories.
        roots: Vec<String>,
    },
    /// Write /workspace, /tmp and /dev/shm as a tar stream: answered by `FileChunk`s
    /// (the stream, the last one marked), or by `Error` (also after some chunks: the
    /// stream is then worthless).
    ExportFiles,
    /// Part of a tar stream (the payload) that replaces /workspace, /tmp and /dev/shm
    /// (files not in it are gone). Answered once, after the last part (also when an
    /// earlier one failed: the rest is read and dropped): `Ok`, `NoRoom` or `Error`.
    ImportFiles {
        /// True for the last part.
        last: bool,
    },
    /// The sandbox was just restored from a checkpoint (its stdio are new pipes): the
    /// process keeper, detached before the checkpoint, connects to the host's socket
    /// again. Answered by `Ok`.
    Reattach {
        /// The host is a new one (a sandbox restored from a snapshot), which never
        /// started the programs running here: their ends are not reported to it.
        orphan: bool,
    },
}

/// Any request the gVisor agent reads.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum GvRequest {
    /// A request every agent serves.
    Common(ToGuest),
    /// A request of the gVisor agent only.
    Gv(ToGvAgent),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_kinds_of_request_come_through_one_decoder() {
        for req in [
            GvRequest::Common(ToGuest::ListFiles),
            GvRequest::Gv(ToGvAgent::ChangesIn {
                roots: vec!["/workspace".into()],
            }),
            GvRequest::Gv(ToGvAgent::ExportFiles),
            GvRequest::Gv(ToGvAgent::ImportFiles { last: true }),
            GvRequest::Gv(ToGvAgent::Reattach { orphan: true }),
        ] {
            let json = serde_json::to_string(&req).unwrap();
            assert_eq!(serde_json::from_str::<GvRequest>(&json).unwrap(), req, "{json}");
        }
        // A gVisor request is one `op` field, like the common ones.
        assert_eq!(
            serde_json::to_string(&ToGvAgent::ExportFiles).unwrap(),
            r#"{"op":"export_files"}"#
        );
    }
}
