//! `close_sandbox`: delete a sandbox and everything in it now (the REST API's
//! `DELETE /v1/sandboxes/{id}`).

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::result::{no_sandbox, structured};
use super::{AirlockMcp, caller};
use crate::service::sessions::delete_session;

/// `close_sandbox`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CloseSandboxInput {
    /// The sandbox, from create_sandbox.
    pub sandbox_id: String,
}

/// What `close_sandbox` answers.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct CloseSandboxOutput {
    /// The sandbox deleted.
    pub sandbox_id: String,
    /// Always true: it and its files are gone.
    pub closed: bool,
}

#[tool_router(router = close_sandbox_router, vis = "pub(super)")]
impl AirlockMcp {
    #[tool(
        name = "close_sandbox",
        description = "Delete a sandbox from create_sandbox now, with its files and anything running \
in it. Its sandbox_id stops working.",
        output_schema = schema_for_output::<CloseSandboxOutput>(),
        annotations(
            title = "Close a sandbox",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn close_sandbox(
        &self,
        Parameters(input): Parameters<CloseSandboxInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let key = caller(&ctx)?;
        // Not cancellable: a purge half done would leave the sandbox unlisted but alive.
        match delete_session(&self.state, &key, &input.sandbox_id).await {
            Ok(()) => structured(
                &CloseSandboxOutput {
                    sandbox_id: input.sandbox_id,
                    closed: true,
                },
                None,
            ),
            Err(e) => Ok(no_sandbox(&e)),
        }
    }
}
