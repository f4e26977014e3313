//! `run_code`: one program in a fresh sandbox without network, purged afterwards (the
//! REST API's `POST /v1/exec`); or, with `sandbox_id`, Python in that session's Jupyter
//! kernel, whose state persists between calls (`POST /v1/sandboxes/{id}/code`), its
//! figures returned as image content.

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use std::num::NonZeroU64;
use std::sync::Arc;

use super::result::{RunCodeOutput, awake_session, code_result, exec_result, refused};
use super::{AirlockMcp, FileInput, IsolationInput, caller, timeout_ms, unless_cancelled};
use crate::api::{ExecRequest, FileRequest, Language, LimitsRequest};
use crate::service::runner;

/// `run_code`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunCodeInput {
    /// The language of `code`: `python` (python3), `javascript` (node) or `bash`.
    pub language: Language,
    /// The program's source code.
    pub code: String,
    /// Text the program reads on stdin (default: empty).
    pub stdin: Option<String>,
    /// Files written under /workspace, the program's working directory, before it starts.
    #[serde(default)]
    pub files: Vec<FileInput>,
    /// Wall-clock limit in seconds (default 10); the program is killed when it passes.
    pub timeout_s: Option<NonZeroU64>,
    /// `namespaces` (default) or `microvm`: the same sandbox inside a VM of its own.
    pub isolation: Option<IsolationInput>,
    /// An image from the service's image store to run in (`python:3.12-slim`); default:
    /// the host's system directories.
    pub image: Option<String>,
    /// A sandbox from create_sandbox: run the Python code in its code interpreter (a
    /// Jupyter kernel): variables, imports and open files persist between calls, and
    /// figures come back as images. Only with language python; not with stdin, files,
    /// isolation or image (the sandbox's own apply).
    pub sandbox_id: Option<String>,
}

#[tool_router(router = run_code_router, vis = "pub(super)")]
impl AirlockMcp {
    #[tool(
        name = "run_code",
        description = "Run a Python, JavaScript or Bash program in a fresh, isolated sandbox without \
network, and get its stdout, stderr, exit code and resource use. Nothing is kept afterwards: use \
create_sandbox and exec for work in several steps. A program that exits non-zero, times out or \
exceeds its memory limit returns isError with the reason. With sandbox_id (from create_sandbox), \
Python runs in that sandbox's code interpreter instead: state persists between calls like a \
notebook, the last expression's value and displayed tables come back as results, and figures \
(matplotlib) come back as images.",
        output_schema = schema_for_output::<RunCodeOutput>(),
        annotations(
            title = "Run code in a throwaway sandbox, or in a sandbox's code interpreter",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn run_code(
        &self,
        Parameters(input): Parameters<RunCodeInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let key = caller(&ctx)?;
        let state = Arc::clone(&self.state);
        let timeout_ms = match timeout_ms(&state, input.timeout_s) {
            Ok(t) => t,
            Err(e) => return Ok(refused(&e)),
        };
        if let Some(id) = input.sandbox_id.as_deref() {
            let session = match awake_session(&state, id, &key).await {
                Ok(s) => s,
                Err(answer) => return Ok(answer),
            };
            let misplaced = [
                ("stdin", input.stdin.is_some()),
                ("files", !input.files.is_empty()),
                ("isolation", input.isolation.is_some()),
                ("image", input.image.is_some()),
            ];
            if let Some((field, _)) = misplaced.iter().find(|(_, given)| *given) {
                return Ok(refused(&crate::error::ApiError::invalid(
                    *field,
                    "is not taken with sandbox_id: the sandbox's own applies (write files with write_file)",
                )));
            }
            if input.language != Language::Python {
                return Ok(refused(&crate::error::ApiError::invalid(
                    "language",
                    "with sandbox_id, the code interpreter runs python; run other languages with exec",
                )));
            }
            let timeout = std::time::Duration::from_millis(timeout_ms.unwrap_or(session.limits.timeout_ms));
            let ran = unless_cancelled(
                &ctx,
                crate::service::kernel::run(&state, &session, &input.code, timeout, None),
            )
            .await?;
            return match ran {
                Ok(exec) => code_result(exec),
                Err(e) => Ok(refused(&e)),
            };
        }
        let req = ExecRequest {
            language: Some(input.language),
            code: Some(input.code),
            stdin: input.stdin,
            files: input
                .files
                .into_iter()
                .map(|f| FileRequest {
                    path: f.path,
                    content: f.content,
                    encoding: Default::default(),
                    mode: None,
                })
                .collect(),
            limits: LimitsRequest {
                timeout_ms,
                ..LimitsRequest::default()
            },
            // No network, whatever the server's default becomes.
            network: Some(airlock_spec::NetworkPolicy::None),
            isolation: input.isolation.map(Into::into),
            image: input.image,
            ..ExecRequest::default()
        };
        let spec = match req.to_spec(&state.config, &state.config.defaults) {
            Ok(spec) => spec,
            Err(e) => return Ok(refused(&e)),
        };
        let limits = spec.limits.clone();
        let ran = unless_cancelled(&ctx, async {
            let admitted = runner::admit(&state, &key, runner::admitted_bytes(&state, &spec)?).await?;
            // The tool's answer is small: the purge may start as it is built.
            let (response, _purge) =
                runner::one_shot(Arc::clone(&state), key.clone(), spec, admitted, None).await?;
            Ok(response)
        })
        .await?;
        match ran {
            Ok(resp) => exec_result(resp, &limits),
            Err(e) => Ok(refused(&e)),
        }
    }
}
