//! `snapshot_sandbox`, `restore_sandbox` and `fork_sandbox`: checkpoints an agent can go
//! back to, and copies of a prepared sandbox to try several things at once (the REST
//! API's `POST /v1/sandboxes/{id}/snapshots`, `…/restore`, `…/fork`).

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::result::{awake_session, no_sandbox, refused, structured};
use super::{AirlockMcp, caller, unless_cancelled};
use crate::api::{ForkRequest, SnapshotKindRequest};
use crate::service::sessions::epoch;
use crate::service::snapshots;

/// `snapshot_sandbox`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SnapshotInput {
    /// The sandbox, from create_sandbox.
    pub sandbox_id: String,
}

/// What `snapshot_sandbox` answers.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct SnapshotOutput {
    /// Pass it to restore_sandbox, or to create_sandbox's from_snapshot.
    pub snapshot_id: String,
    /// `filesystem` (its files) or `full` (also its memory and running processes).
    pub kind: String,
    /// The files' total size in bytes.
    pub bytes: u64,
}

/// `restore_sandbox`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RestoreInput {
    /// The sandbox to roll back.
    pub sandbox_id: String,
    /// The snapshot to roll it back to, from snapshot_sandbox.
    pub snapshot_id: String,
}

/// What `restore_sandbox` answers.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct RestoreOutput {
    /// The sandbox rolled back.
    pub sandbox_id: String,
    /// The snapshot it now holds the files of.
    pub snapshot_id: String,
}

/// `fork_sandbox`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkInput {
    /// The sandbox to copy.
    pub sandbox_id: String,
    /// How many copies.
    pub count: u64,
}

/// One copy made by `fork_sandbox`.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ForkedSandbox {
    /// Pass it to exec and the other tools; close it with close_sandbox.
    pub sandbox_id: String,
    /// When it is deleted unless closed before, in seconds since the Unix epoch.
    pub expires_at: f64,
}

/// What `fork_sandbox` answers.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ForkOutput {
    /// The copies, each independent of the others and of the original.
    pub sandboxes: Vec<ForkedSandbox>,
}

#[tool_router(router = snapshots_router, vis = "pub(super)")]
impl AirlockMcp {
    #[tool(
        name = "snapshot_sandbox",
        description = "Save a sandbox's files (/workspace, /tmp) as they are now, to come back to them \
later with restore_sandbox (say, before trying something risky), or to start new sandboxes from with \
create_sandbox's from_snapshot. Snapshots outlive the sandbox.",
        output_schema = schema_for_output::<SnapshotOutput>(),
        annotations(
            title = "Snapshot a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn snapshot_sandbox(
        &self,
        Parameters(input): Parameters<SnapshotInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let key = caller(&ctx)?;
        let session = match self.state.session(&input.sandbox_id, &key) {
            Ok(s) => s,
            Err(e) => return Ok(no_sandbox(&e)),
        };
        let taken = snapshots::snapshot(&self.state, &key, &session, SnapshotKindRequest::Auto);
        match unless_cancelled(&ctx, taken).await? {
            Ok(view) => {
                let v = serde_json::to_value(&view).unwrap_or_default();
                structured(
                    &SnapshotOutput {
                        snapshot_id: v["snapshot_id"].as_str().unwrap_or_default().to_owned(),
                        kind: v["kind"].as_str().unwrap_or_default().to_owned(),
                        bytes: v["bytes"].as_u64().unwrap_or_default(),
                    },
                    None,
                )
            }
            Err(e) => Ok(refused(&e)),
        }
    }

    #[tool(
        name = "restore_sandbox",
        description = "Roll a sandbox's files back to a snapshot from snapshot_sandbox: files written \
since are gone, the snapshot's are back. Programs running in the background in it are stopped.",
        output_schema = schema_for_output::<RestoreOutput>(),
        annotations(
            title = "Restore a sandbox",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn restore_sandbox(
        &self,
        Parameters(input): Parameters<RestoreInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let key = caller(&ctx)?;
        let session = match awake_session(&self.state, &input.sandbox_id, &key).await {
            Ok(s) => s,
            Err(answer) => return Ok(answer),
        };
        // Not cancellable: a restore half done would leave the files half replaced.
        match snapshots::restore(&self.state, &key, &session, &input.snapshot_id).await {
            Ok(()) => structured(
                &RestoreOutput {
                    sandbox_id: input.sandbox_id,
                    snapshot_id: input.snapshot_id,
                },
                None,
            ),
            Err(e) => Ok(refused(&e)),
        }
    }

    #[tool(
        name = "fork_sandbox",
        description = "Make count new sandboxes, each a copy of this one as it is now (its files; on gVisor and \
micro-VMs also its memory and running programs), to try different approaches side by side. Each copy \
is independent; close the ones you do not keep with close_sandbox.",
        output_schema = schema_for_output::<ForkOutput>(),
        annotations(
            title = "Fork a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn fork_sandbox(
        &self,
        Parameters(input): Parameters<ForkInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let key = caller(&ctx)?;
        let session = match self.state.session(&input.sandbox_id, &key) {
            Ok(s) => s,
            Err(e) => return Ok(no_sandbox(&e)),
        };
        let req = ForkRequest {
            count: input.count,
            ttl_s: None,
        };
        // Not cancellable: the copies made are deleted only by the fork's own failure.
        match snapshots::fork(&self.state, &key, &session, &req).await {
            Ok(made) => structured(
                &ForkOutput {
                    sandboxes: made
                        .iter()
                        .map(|s| ForkedSandbox {
                            sandbox_id: s.id.clone(),
                            expires_at: epoch(s.expires),
                        })
                        .collect(),
                },
                None,
            ),
            Err(e) => Ok(refused(&e)),
        }
    }
}
