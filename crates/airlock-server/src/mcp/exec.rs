//! `exec`: a command or a program in a sandbox from `create_sandbox`, whose files stay for
//! the next exec (the REST API's `POST /v1/sandboxes/{id}/exec`).

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use std::num::NonZeroU64;
use std::sync::Arc;

use super::result::{ExecOutput, awake_session, exec_result, no_sandbox, refused};
use super::{AirlockMcp, caller, timeout_ms, unless_cancelled};
use crate::api::{ExecRequest, Language, LimitsRequest};
use crate::service::runner;
use crate::service::sessions::session_spec;

/// `exec`'s arguments: `cmd`, or `language` and `code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecInput {
    /// The sandbox, from create_sandbox.
    pub sandbox_id: String,
    /// A command and its arguments, e.g. `["ls", "-l"]` or `["pip", "install", "--user", "x"]`
    /// (no shell: use `["bash", "-c", "..."]` for pipes). Give this, or language and code.
    pub cmd: Option<Vec<String>>,
    /// The language of `code`: `python` (python3), `javascript` (node) or `bash`.
    pub language: Option<Language>,
    /// Source code to run with `language`.
    pub code: Option<String>,
    /// Text the program reads on stdin (default: empty).
    pub stdin: Option<String>,
    /// Wall-clock limit in seconds (default 10); the program is killed when it passes.
    pub timeout_s: Option<NonZeroU64>,
}

#[tool_router(router = exec_router, vis = "pub(super)")]
impl AirlockMcp {
    #[tool(
        name = "exec",
        description = "Run a command (cmd) or a program (language and code) in a sandbox from \
create_sandbox, in /workspace. Files written there persist for the next calls; processes end \
with each call. Returns stdout, stderr, exit code and resource use; a program that exits non-zero, \
times out or exceeds its memory limit returns isError with the reason.",
        output_schema = schema_for_output::<ExecOutput>(),
        annotations(
            title = "Run in a sandbox",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            // A sandbox created with a proxy network reaches the hosts it allows.
            open_world_hint = true
        )
    )]
    async fn exec(
        &self,
        Parameters(input): Parameters<ExecInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let key = caller(&ctx)?;
        let state = Arc::clone(&self.state);
        let session = match awake_session(&state, &input.sandbox_id, &key).await {
            Ok(s) => s,
            Err(answer) => return Ok(answer),
        };
        let timeout_ms = match timeout_ms(&state, input.timeout_s) {
            Ok(t) => t,
            Err(e) => return Ok(refused(&e)),
        };
        let req = ExecRequest {
            cmd: input.cmd,
            language: input.language,
            code: input.code,
            stdin: input.stdin,
            limits: LimitsRequest {
                timeout_ms,
                ..LimitsRequest::default()
            },
            ..ExecRequest::default()
        };
        let spec = match session_spec(&state, &session, &req) {
            Ok(spec) => spec,
            Err(e) => return Ok(refused(&e)),
        };
        let limits = spec.limits.clone();
        // A sandbox that asks about denied connections asks the user through this client.
        let asker = session
            .egress
            .clone()
            .filter(|p| p.control().shown().on_denied == airlock_spec::OnDenied::Ask)
            .map(|p| super::approvals::ask_while_running(ctx.peer.clone(), p, session.id.clone()));
        let run = unless_cancelled(
            &ctx,
            runner::in_session(Arc::clone(&state), key, session, spec, None),
        );
        let ran = match asker {
            Some(asker) => tokio::select! {
                ran = run => ran,
                () = asker => unreachable!("asking ends only when dropped"),
            },
            None => run.await,
        }?;
        match ran {
            Ok(resp) => exec_result(resp, &limits),
            // Deleted or expired while it waited or ran.
            Err(e) if e.code == "expired" => Ok(no_sandbox(&e)),
            Err(e) => Ok(refused(&e)),
        }
    }
}
