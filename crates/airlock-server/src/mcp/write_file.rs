//! `write_file`: a UTF-8 file into a sandbox's /workspace (the REST API's
//! `PUT /v1/sandboxes/{id}/files`).

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::result::{awake_session, no_sandbox, refused, structured};
use super::{AirlockMcp, caller, unless_cancelled};
use crate::service::files::{check_path, write_file};

/// `write_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteFileInput {
    /// The sandbox, from create_sandbox.
    pub sandbox_id: String,
    /// Path relative to /workspace, e.g. `data.csv` or `src/main.py` (directories are created).
    pub path: String,
    /// The file's content, as UTF-8 text; an existing file is replaced.
    pub content: String,
}

/// What `write_file` answers.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct WriteFileOutput {
    /// The path written, relative to /workspace.
    pub path: String,
    /// Bytes written.
    pub bytes: u64,
}

#[tool_router(router = write_file_router, vis = "pub(super)")]
impl AirlockMcp {
    #[tool(
        name = "write_file",
        description = "Write a UTF-8 text file into a sandbox's /workspace (from create_sandbox), \
replacing it if it exists; exec then finds it in its working directory.",
        output_schema = schema_for_output::<WriteFileOutput>(),
        annotations(
            title = "Write a file",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn write_file(
        &self,
        Parameters(input): Parameters<WriteFileInput>,
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
        let out = WriteFileOutput {
            path: path.clone(),
            bytes: input.content.len() as u64,
        };
        match unless_cancelled(
            &ctx,
            write_file(&session, path, 0o644, input.content.into_bytes()),
        )
        .await?
        {
            Ok(()) => structured(&out, None),
            Err(e) if e.code == "expired" => Ok(no_sandbox(&e)),
            Err(e) => Ok(refused(&e)),
        }
    }
}
