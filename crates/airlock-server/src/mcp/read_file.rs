//! `read_file`: a file from a sandbox's /workspace, as text (the REST API's
//! `GET /v1/sandboxes/{id}/files?path=P`).

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::result::{awake_session, no_sandbox, refused, structured};
use super::{AirlockMcp, caller, unless_cancelled};
use crate::service::files::{check_path, read_file};

/// `read_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadFileInput {
    /// The sandbox, from create_sandbox.
    pub sandbox_id: String,
    /// Path relative to /workspace, e.g. `out.txt`.
    pub path: String,
}

/// What `read_file` answers.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ReadFileOutput {
    /// The path read, relative to /workspace.
    pub path: String,
    /// The content as UTF-8 text (invalid bytes replaced by U+FFFD).
    pub content: String,
}

#[tool_router(router = read_file_router, vis = "pub(super)")]
impl AirlockMcp {
    #[tool(
        name = "read_file",
        description = "Read a file from a sandbox's /workspace (from create_sandbox) as UTF-8 text; \
bytes that are not UTF-8 are replaced by U+FFFD.",
        output_schema = schema_for_output::<ReadFileOutput>(),
        annotations(
            title = "Read a file",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn read_file(
        &self,
        Parameters(input): Parameters<ReadFileInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let key = caller(&ctx)?;
        let session = match awake_session(&self.state, &input.sandbox_id, &key).await {
            Ok(s) => s,
            Err(answer) => return Ok(answer),
        };
        let path = match check_path(&input.path) {
            Ok(p) => p,
            Err(e) => return Ok(refused(&e)),
        };
        let max = self.state.config.max_body as u64;
        match unless_cancelled(&ctx, read_file(&session, path.clone(), max)).await? {
            Ok(data) => structured(
                &ReadFileOutput {
                    path,
                    content: String::from_utf8_lossy(&data).into_owned(),
                },
                None,
            ),
            Err(e) if e.code == "expired" => Ok(no_sandbox(&e)),
            Err(e) => Ok(refused(&e)),
        }
    }
}
