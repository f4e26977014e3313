//! The service's tools over the Model Context Protocol, with the official SDK (`rmcp`):
//! `airlock mcp` serves them on stdio ([`serve_stdio`]), the daemon on streamable HTTP at
//! `/mcp` (see `routes/mcp.rs`).
//!
//! One file per tool, each an `impl AirlockMcp` block with its own `#[tool_router]`; the
//! routers are added up in `AirlockMcp::router` and `AirlockMcp::call_tool` dispatches
//! through the result. Every tool runs on the service's own state and runner — admission,
//! the warm pool, sessions and their purge are the REST API's, not copies.
//!
//! What the caller gets back:
//! - a program that ran, whatever it did: the `ExecResult` as `structuredContent` and as
//!   JSON text; one that failed, timed out or was OOM-killed also gets `isError: true`
//!   and a first text block saying so in words a model can act on (see `result.rs`);
//! - a request the service refuses (unknown or expired `sandbox_id`, a limit above the
//!   maximum, overload): `isError: true` with the reason;
//! - a call that does not fit the tool's input schema, or an unknown tool: a JSON-RPC
//!   error (-32602), never a tool result.

mod approvals;
mod close_sandbox;
mod create_sandbox;
mod exec;
pub mod jsonrpc;
mod read_file;
mod result;
mod run_code;
mod snapshots;
mod update_network;
mod write_file;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, JsonObject, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt, tool_handler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use std::future::Future;
use std::num::NonZeroU64;
use std::sync::Arc;
use tokio::sync::watch;

use crate::Service;
use crate::error::ApiError;
use crate::state::{AppState, KeyName};

/// What the server tells the model about itself at initialization.
const INSTRUCTIONS: &str = "airlock runs code in isolated, ephemeral Linux sandboxes (no network unless a \
sandbox is created with one). Use run_code for a one-off program: nothing is kept afterwards. For work in \
steps (files that persist, installs, several runs), create_sandbox, then write_file / exec / read_file, and \
close_sandbox when done. A program that fails, times out or exceeds its memory comes back with isError and \
a message saying which, beside its stdout, stderr and exit code.";

/// The `format`s schemars gives Rust number types; JSON Schema defines none of them (a
/// validator in strict mode warns about each), and the type and bounds say it all.
const RUST_FORMATS: &[&str] = &[
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "uint", "int", "float",
    "double",
];

/// A file placed in /workspace (UTF-8 text).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileInput {
    /// Path relative to /workspace (the working directory), e.g. `data.csv` or `src/main.py`.
    pub path: String,
    /// The file's content, as UTF-8 text.
    pub content: String,
}

/// The isolation a tool's sandbox runs with.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum IsolationInput {
    /// Linux namespaces, seccomp and landlock on the host's kernel (the default; starts in
    /// milliseconds).
    Namespaces,
    /// A user-space kernel (gVisor's Sentry) between the program and the host's.
    Gvisor,
    /// The same sandbox inside a micro-VM of its own, with its own kernel (starts in a
    /// fraction of a second from the server's VM pool, seconds without one).
    Microvm,
}

impl From<IsolationInput> for airlock_spec::Isolation {
    fn from(i: IsolationInput) -> Self {
        match i {
            IsolationInput::Namespaces => airlock_spec::Isolation::Namespaces,
            IsolationInput::Gvisor => airlock_spec::Isolation::Gvisor,
            IsolationInput::Microvm => airlock_spec::Isolation::Microvm,
        }
    }
}

/// The MCP server: the service's state and the tools' router.
#[derive(Debug, Clone)]
pub(crate) struct AirlockMcp {
    /// The service every tool runs on (shared with the HTTP routes).
    state: Arc<AppState>,
    /// Every tool, built once and shared by every MCP session.
    router: Arc<ToolRouter<AirlockMcp>>,
    /// Tool calls running now, across sessions: the HTTP transport waits for them at
    /// shutdown before it closes the sessions.
    calls: Arc<watch::Sender<usize>>,
}

/// Counts one running tool call for as long as it lives.
struct CallGuard(Arc<watch::Sender<usize>>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl AirlockMcp {
    /// The server for `state`, with every tool.
    pub(crate) fn new(state: Arc<AppState>) -> AirlockMcp {
        AirlockMcp {
            router: Arc::new(Self::router(&state.config)),
            state,
            calls: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Every tool, described for `config`.
    fn router(config: &crate::config::ServerConfig) -> ToolRouter<AirlockMcp> {
        let mut router = Self::run_code_router()
            + Self::create_sandbox_router()
            + Self::exec_router()
            + Self::write_file_router()
            + Self::read_file_router()
            + Self::close_sandbox_router()
            + Self::update_network_router()
            + Self::snapshots_router();
        // The lifetime is the server's setting, so the description says it here.
        if let Some(route) = router.map.get_mut("create_sandbox") {
            route.attr.description = Some(create_sandbox::description(config).into());
        }
        for route in router.map.values_mut() {
            let tool = &mut route.attr;
            tool.input_schema = Arc::new(portable(&tool.input_schema, true));
            if let Some(out) = &tool.output_schema {
                tool.output_schema = Some(Arc::new(portable(out, false)));
            }
        }
        router
    }

    /// Resolves once no tool call is running.
    pub(crate) async fn idle(&self) {
        let mut rx = self.calls.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

/// `schema` in the common subset of JSON Schema that clients map tool schemas onto (a
/// model provider's function declarations, say). schemars writes a nullable value as
/// `"type": [T, "null"]`, Rust integer widths as formats (`uint64`) that JSON Schema does
/// not define, and doc comments with their line breaks. Here an optional argument
/// (`input`, not required) becomes plain `T` — a caller omits it rather than sending null;
/// a nullable output field becomes `anyOf: [T, null]`; the formats and breaks go.
fn portable(schema: &JsonObject, input: bool) -> JsonObject {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(o) => {
                if o.get("format")
                    .and_then(Value::as_str)
                    .is_some_and(|f| RUST_FORMATS.contains(&f))
                {
                    o.remove("format");
                }
                // Doc comments wrap; a description is one paragraph.
                if let Some(Value::String(d)) = o.get_mut("description") {
                    *d = d.replace('\n', " ");
                }
                if let Some(Value::Array(types)) = o.get("type")
                    && types.len() == 2
                    && types.contains(&json!("null"))
                {
                    let other = types
                        .iter()
                        .find(|t| **t != json!("null"))
                        .cloned()
                        .unwrap_or(Value::Null);
                    // Everything but the annotations describes the non-null branch.
                    let mut branch = serde_json::Map::new();
                    for (k, val) in std::mem::take(o) {
                        match k.as_str() {
                            "description" | "title" | "default" => {
                                o.insert(k, val);
                            }
                            "type" => {
                                branch.insert(k, other.clone());
                            }
                            _ => {
                                branch.insert(k, val);
                            }
                        }
                    }
                    o.insert("anyOf".into(), json!([branch, {"type": "null"}]));
                }
                o.values_mut().for_each(walk);
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut schema = Value::Object(schema.clone());
    if input {
        // Optional arguments: absent, not null.
        let required: Vec<Value> = schema["required"].as_array().cloned().unwrap_or_default();
        if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            for (name, prop) in props.iter_mut() {
                if !required.contains(&json!(name)) {
                    drop_null(prop);
                }
            }
        }
    }
    walk(&mut schema);
    match schema {
        Value::Object(o) => o,
        _ => JsonObject::new(),
    }
}

/// `prop` without its null alternative: `"type": [T, "null"]` becomes `T`, and
/// `anyOf: [S, {"type": "null"}]` becomes `S` (keeping `prop`'s annotations).
fn drop_null(prop: &mut Value) {
    let null = json!("null");
    if let Some(types) = prop.get("type").and_then(Value::as_array)
        && types.contains(&null)
    {
        let rest: Vec<Value> = types.iter().filter(|t| **t != null).cloned().collect();
        prop["type"] = match <[Value; 1]>::try_from(rest) {
            Ok([one]) => one,
            Err(rest) => Value::Array(rest),
        };
    }
    let Some(obj) = prop.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(branches)) = obj.get("anyOf")
        && branches.len() == 2
        && let Some(i) = branches.iter().position(|b| *b == json!({"type": "null"}))
    {
        let Some(Value::Object(other)) = branches.get(1 - i).cloned() else {
            return;
        };
        obj.remove("anyOf");
        obj.extend(other);
    }
}

/// The API key a call is made with: over HTTP, the name the auth middleware put on the
/// request; over stdio (no request), none, like the REST API without keys.
fn caller(ctx: &RequestContext<RoleServer>) -> Result<KeyName, ErrorData> {
    match ctx.extensions.get::<axum::http::request::Parts>() {
        None => Ok(KeyName(None)),
        // The auth layer runs before /mcp and always names the caller; a request without
        // a name did not pass it, so it gets nothing (fail closed).
        Some(parts) => parts
            .extensions
            .get::<KeyName>()
            .cloned()
            .ok_or_else(|| ErrorData::internal_error("the request was not authenticated", None)),
    }
}

/// `timeout_s` in milliseconds, refused (naming `timeout_s`) above the server's maximum.
fn timeout_ms(state: &AppState, timeout_s: Option<NonZeroU64>) -> Result<Option<u64>, ApiError> {
    let Some(s) = timeout_s.map(NonZeroU64::get) else {
        return Ok(None);
    };
    let max_s = state.config.max.timeout_ms / 1000;
    if s > max_s {
        return Err(ApiError::invalid(
            "timeout_s",
            format!("{s} is above this server's maximum of {max_s} s"),
        ));
    }
    Ok(Some(s * 1000))
}

/// Runs a tool's work unless the client cancels the call first (`notifications/cancelled`):
/// then the work's future is dropped, which cancels a running exec (see `service/runner.rs`).
async fn unless_cancelled<T>(
    ctx: &RequestContext<RoleServer>,
    work: impl Future<Output = T>,
) -> Result<T, ErrorData> {
    tokio::select! {
        r = work => Ok(r),
        () = ctx.ct.cancelled() => Err(ErrorData::internal_error("the call was cancelled", None)),
    }
}

// `tool_handler` adds `list_tools` and `get_tool` from the router (with the cache hints
// each protocol revision expects); `call_tool` is ours.
#[tool_handler(router = self.router)]
impl ServerHandler for AirlockMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("airlock", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    /// Dispatches through the router, but keeps argument errors JSON-RPC errors: the
    /// router alone would turn a call that does not fit the input schema into a tool
    /// result, and such a call is the client's mistake, not the program's.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(route) = self.router.map.get(request.name.as_ref()) else {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {:?}", request.name),
                None,
            ));
        };
        self.calls.send_modify(|n| *n += 1);
        let _running = CallGuard(Arc::clone(&self.calls));
        (route.call)(ToolCallContext::new(self, request, context)).await
    }
}

/// Serves the tools as MCP on stdin/stdout until stdin closes or `shutdown` resolves. Logs
/// go to stderr (the caller's tracing subscriber); nothing but MCP is written to stdout.
/// The caller then shuts `service` down, which purges every sandbox.
pub async fn serve_stdio(service: &Service, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    let server = AirlockMcp::new(Arc::clone(service.state()));
    // Non-blocking pipes when the client launched us with pipes (the usual case), so
    // a pending read does not hold the runtime's shutdown.
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    // rmcp reads the lines that pass `jsonrpc::check` from one in-process pipe and writes
    // to another; what fails the check is answered here, on the same stdout, a whole
    // line at a time.
    let (to_rmcp, rmcp_in) = tokio::io::duplex(1 << 16);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(1 << 16);
    let (refusals, refused) = tokio::sync::mpsc::channel::<String>(64);
    let max_line = service.state().config.max_body;
    let reader = tokio::spawn(filter_lines(stdin, to_rmcp, refusals, max_line));
    let writer = tokio::spawn(merge_output(from_rmcp, refused, stdout));
    let served = async move {
        let running = match server.serve((rmcp_in, rmcp_out)).await {
            Ok(running) => running,
            // stdin closed before the client's first message: nothing to serve.
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
                tracing::info!("stdin closed before the MCP client spoke");
                return Ok(());
            }
            Err(e) => return Err(std::io::Error::other(e)),
        };
        let quit = running.waiting().await.map_err(std::io::Error::other)?;
        tracing::info!(reason = ?quit, "MCP client gone");
        Ok::<_, std::io::Error>(())
    };
    let result = tokio::select! {
        r = served => r,
        () = shutdown => {
            tracing::info!("shutting down");
            Ok(())
        }
    };
    // rmcp's side of its pipes is dropped by now: the writer ends once it has written
    // what rmcp and the filter left (bounded, should stdout be stuck).
    reader.abort();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), writer).await;
    result
}

/// Reads stdin line by line: a line that passes [`jsonrpc::check`] goes on to rmcp, one
/// that does not is answered with a JSON-RPC error; blank lines are skipped. A line longer
/// than `max_line` is refused (-32600) and skipped to its end. At end of input rmcp's
/// input ends too.
async fn filter_lines(
    stdin: impl tokio::io::AsyncRead + Unpin,
    mut to_rmcp: impl tokio::io::AsyncWrite + Unpin,
    refusals: tokio::sync::mpsc::Sender<String>,
    max_line: usize,
) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let mut input = tokio::io::BufReader::new(stdin);
    let mut line = Vec::new();
    loop {
        line.clear();
        let limit = (max_line + 1) as u64;
        let n = match (&mut input).take(limit).read_until(b'\n', &mut line).await {
            Ok(n) => n,
            Err(e) => {
                tracing::info!(error = %e, "reading stdin");
                return;
            }
        };
        if n == 0 {
            return;
        }
        if !line.ends_with(b"\n") && line.len() > max_line {
            // Too long: refuse it, then skip the rest of it.
            let _ = refusals
                .send(
                    jsonrpc::error(
                        None,
                        jsonrpc::INVALID_REQUEST,
                        &format!("Invalid Request: a message is at most {max_line} bytes"),
                    )
                    .to_string(),
                )
                .await;
            let mut rest = Vec::new();
            loop {
                rest.clear();
                match (&mut input).take(limit).read_until(b'\n', &mut rest).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) if rest.ends_with(b"\n") => break,
                    Ok(_) => {}
                }
            }
            continue;
        }
        let message = line.trim_ascii();
        if message.is_empty() {
            continue;
        }
        match jsonrpc::check(message) {
            Ok(()) => {
                let sent = async {
                    to_rmcp.write_all(message).await?;
                    to_rmcp.write_all(b"\n").await?;
                    to_rmcp.flush().await
                };
                if sent.await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(code = e.code, message = %e.message, "refused a malformed MCP message");
                let reply = jsonrpc::error(e.id, e.code, &e.message).to_string();
                if refusals.send(reply).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Writes rmcp's output and the filter's refusals to stdout, whole lines only, until
/// both are done.
async fn merge_output(
    from_rmcp: impl tokio::io::AsyncRead + Unpin,
    mut refused: tokio::sync::mpsc::Receiver<String>,
    mut stdout: impl tokio::io::AsyncWrite + Unpin,
) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut rmcp = tokio::io::BufReader::new(from_rmcp);
    // rmcp's line so far: read_until may be cut short by the other branch, and carries on
    // appending to the same buffer.
    let mut line = Vec::new();
    let (mut rmcp_open, mut refusals_open) = (true, true);
    while rmcp_open || refusals_open {
        let out = tokio::select! {
            r = rmcp.read_until(b'\n', &mut line), if rmcp_open => match r {
                Ok(n) if n > 0 => std::mem::take(&mut line),
                _ => {
                    rmcp_open = false;
                    continue;
                }
            },
            m = refused.recv(), if refusals_open => match m {
                Some(text) => format!("{text}\n").into_bytes(),
                None => {
                    refusals_open = false;
                    continue;
                }
            },
        };
        if stdout.write_all(&out).await.is_err() || stdout.flush().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn tools() -> Vec<Value> {
        let router = AirlockMcp::router(&crate::config::ServerConfig::default());
        router
            .list_all()
            .into_iter()
            .map(|t| serde_json::to_value(t).unwrap())
            .collect()
    }

    fn tool(name: &str) -> Value {
        tools()
            .into_iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no tool {name}"))
    }

    #[test]
    fn ten_tools_each_with_schemas_and_annotations() {
        let names: Vec<String> = tools()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            names,
            [
                "close_sandbox",
                "create_sandbox",
                "exec",
                "fork_sandbox",
                "read_file",
                "restore_sandbox",
                "run_code",
                "snapshot_sandbox",
                "update_network",
                "write_file"
            ]
        );
        for t in tools() {
            assert_eq!(t["inputSchema"]["type"], "object", "{t:#}");
            assert_eq!(t["inputSchema"]["additionalProperties"], false, "{t:#}");
            assert_eq!(t["outputSchema"]["type"], "object", "{t:#}");
            let a = &t["annotations"];
            for hint in [
                "readOnlyHint",
                "destructiveHint",
                "idempotentHint",
                "openWorldHint",
            ] {
                assert!(a[hint].is_boolean(), "{hint} missing: {t:#}");
            }
        }
    }

    /// No `"type": [T, "null"]`, no Rust integer formats, anywhere; optional arguments
    /// are plain (absent, not null).
    #[test]
    fn schemas_are_portable() {
        fn walk(v: &Value, at: &str) {
            match v {
                Value::Object(o) => {
                    assert!(!o.get("type").is_some_and(Value::is_array), "type array at {at}");
                    assert!(o.get("format").is_none(), "format at {at}");
                    for (k, v) in o {
                        walk(v, &format!("{at}.{k}"));
                    }
                }
                Value::Array(a) => a.iter().for_each(|v| walk(v, at)),
                _ => {}
            }
        }
        for t in tools() {
            walk(&t, t["name"].as_str().unwrap());
            for (name, prop) in t["inputSchema"]["properties"].as_object().unwrap() {
                assert!(
                    !prop.to_string().contains("null"),
                    "{}: {name} is nullable",
                    t["name"]
                );
            }
        }
        let out = &tool("exec")["outputSchema"]["properties"]["exit_code"];
        assert_eq!(
            out["anyOf"],
            json!([{"type": "integer"}, {"type": "null"}]),
            "{out}"
        );
    }

    #[test]
    fn run_code_schema() {
        let t = tool("run_code");
        let input = &t["inputSchema"];
        let mut required: Vec<&str> = input["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        required.sort();
        assert_eq!(required, ["code", "language"]);
        let languages = serde_json::to_string(&input).unwrap();
        for l in ["python", "javascript", "bash"] {
            assert!(languages.contains(&format!("\"{l}\"")), "{l} not in {input:#}");
        }
        let out = &t["outputSchema"]["properties"];
        for f in [
            "outcome",
            "exit_code",
            "signal",
            "stdout",
            "stderr",
            "stdout_truncated",
            "wall_ms",
            "cpu_ms",
            "memory_peak_bytes",
            "error",
            "execution",
        ] {
            assert!(out.get(f).is_some(), "{f} not in the output schema");
        }
        assert_eq!(input["properties"]["timeout_s"]["minimum"], 1, "{input:#}");
        assert!(input["properties"].get("sandbox_id").is_some(), "{input:#}");
        // With sandbox_id it changes the sandbox's kernel state.
        assert_eq!(t["annotations"]["readOnlyHint"], false);
        assert_eq!(t["annotations"]["openWorldHint"], false);
    }

    #[test]
    fn create_sandbox_states_the_lifetime() {
        let t = tool("create_sandbox");
        let d = t["description"].as_str().unwrap();
        assert!(d.contains("default 600") && d.contains("at most 86400"), "{d}");
        assert_eq!(
            t["outputSchema"]["required"],
            json!(["sandbox_id", "expires_at", "ttl_s"])
        );
    }
}
