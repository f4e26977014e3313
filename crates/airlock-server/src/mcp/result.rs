//! From what the service answers to MCP tool results: the structured output every exec
//! tool declares, the words a model is told when its program failed, and refusals.

use airlock_spec::{ExecResult, Limits, Outcome};
use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;

use crate::api::ExecResponse;
use crate::error::ApiError;

/// Longest stderr line quoted in a failure message; the whole stderr is in the result.
const QUOTED_STDERR_CHARS: usize = 200;

/// The result of `run_code` and `exec`: the REST API's `ExecResult` and `queue_ms`, plus
/// `error`, the sentence the call's `isError` stands for.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub(crate) struct ExecOutput {
    /// Why the call is an error, e.g. "exited with code 1", "timed out after 10 s",
    /// "killed: exceeded 256 MiB memory limit"; null when the program exited with 0.
    pub error: Option<String>,
    /// Everything `airlock run --json` reports.
    #[serde(flatten)]
    pub result: ExecResult,
    /// Waiting for capacity before the program, in milliseconds.
    pub queue_ms: f64,
}

impl ExecOutput {
    fn new(resp: ExecResponse, error: Option<String>) -> ExecOutput {
        ExecOutput {
            error,
            result: resp.result,
            queue_ms: resp.queue_ms,
        }
    }
}

/// What a model is told when its program did not succeed under `limits`; `None` when it
/// exited with 0.
pub(crate) fn failure(r: &ExecResult, limits: &Limits) -> Option<String> {
    match r.outcome {
        Outcome::Exited if r.exit_code == Some(0) => None,
        Outcome::Exited => {
            let code = r.exit_code.map_or_else(|| "?".to_owned(), |c| c.to_string());
            let last = r.stderr.lines().rev().map(str::trim).find(|l| !l.is_empty());
            Some(match last {
                Some(line) => format!("exited with code {code}: {}", clip(line, QUOTED_STDERR_CHARS)),
                None => format!("exited with code {code}"),
            })
        }
        Outcome::Timeout => Some(format!(
            "timed out after {} and was killed (the timeout_s limit){}",
            seconds(limits.timeout_ms),
            if r.oom_killed {
                format!(
                    "; before that, a process was killed for exceeding the {} memory limit",
                    bytes(limits.memory_bytes)
                )
            } else {
                String::new()
            }
        )),
        // The top process itself was the one killed, or it carried on after a child was.
        Outcome::Oom => Some(match r.exit_code {
            None => format!("killed: exceeded {} memory limit", bytes(limits.memory_bytes)),
            Some(code) => format!(
                "a process was killed for exceeding the {} memory limit; the program then exited with code {code}",
                bytes(limits.memory_bytes)
            ),
        }),
        Outcome::Signaled => Some(match r.signal {
            Some(n) => match nix::sys::signal::Signal::try_from(n) {
                Ok(sig) => format!("killed by signal {n} ({})", sig.as_str()),
                Err(_) => format!("killed by signal {n}"),
            },
            None => "killed by a signal".to_owned(),
        }),
    }
}

/// The tool result of an exec that ran under `limits`: its output, structured and as
/// JSON text, with `isError` and the reason first when the program did not succeed.
pub(crate) fn exec_result(resp: ExecResponse, limits: &Limits) -> Result<CallToolResult, ErrorData> {
    let error = failure(&resp.result, limits);
    let output = ExecOutput::new(resp, error.clone());
    structured(&output, error)
}

/// `run_code`'s result: a one-shot exec's (`ExecOutput`'s fields), or, in a sandbox's code
/// interpreter, `execution`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct RunCodeOutput {
    /// Why the call is an error ("exited with code 1", "NameError: name 'x' is not
    /// defined"); null when it succeeded.
    pub error: Option<String>,
    /// A one-shot exec: everything `airlock run --json` reports.
    #[serde(flatten)]
    pub result: Option<ExecResult>,
    /// A one-shot exec: waiting for capacity before the program, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_ms: Option<f64>,
    /// In a sandbox's code interpreter: logs, rich results (MIME bundles; figures are
    /// also returned as image content), the exception, and timing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution: Option<crate::service::kernel::Execution>,
}

/// The tool result of a `run_code` in a sandbox's kernel: the execution structured, its
/// JSON as text with images left out, and each PNG or JPEG as image content.
pub(crate) fn code_result(exec: crate::service::kernel::Execution) -> Result<CallToolResult, ErrorData> {
    let error = match (&exec.error, exec.timed_out) {
        (Some(e), true) => Some(format!(
            "timed out and was interrupted ({}: {}); the kernel's state is kept",
            e.name, e.value
        )),
        (Some(e), false) => Some(format!("{}: {}", e.name, e.value)),
        (None, true) => Some("timed out and was interrupted; the kernel's state is kept".into()),
        (None, false) => None,
    };
    let images: Vec<(String, String)> = exec
        .results
        .iter()
        .flat_map(|r| {
            ["image/png", "image/jpeg"].into_iter().filter_map(|mime| {
                r.data
                    .get(mime)
                    .and_then(serde_json::Value::as_str)
                    .map(|b64| (b64.to_owned(), mime.to_owned()))
            })
        })
        .collect();
    let output = RunCodeOutput {
        error: error.clone(),
        result: None,
        queue_ms: None,
        execution: Some(exec),
    };
    let json = serde_json::to_value(&output)
        .map_err(|e| ErrorData::internal_error(format!("serializing the result: {e}"), None))?;
    // The text copy leaves images out: they follow as image content.
    let mut text = json.clone();
    if let Some(results) = text
        .pointer_mut("/execution/results")
        .and_then(serde_json::Value::as_array_mut)
    {
        for r in results {
            for mime in ["image/png", "image/jpeg"] {
                if let Some(v) = r.pointer_mut(&format!("/data/{}", mime.replace('/', "~1"))) {
                    let len = v.as_str().map_or(0, str::len);
                    *v = serde_json::Value::String(format!(
                        "<{mime}, {len} base64 characters: sent as image content>"
                    ));
                }
            }
        }
    }
    let mut r = CallToolResult::structured(json);
    r.content.clear();
    if let Some(message) = &error {
        r.content.push(ContentBlock::text(message.clone()));
    }
    r.content.push(ContentBlock::text(text.to_string()));
    for (data, mime) in images {
        r.content.push(ContentBlock::image(data, mime));
    }
    r.is_error = Some(error.is_some());
    Ok(r)
}

/// A tool result carrying `value` as `structuredContent` and the same JSON as text; with
/// `error`, `isError` is set and the reason comes first.
pub(crate) fn structured<T: Serialize>(
    value: &T,
    error: Option<String>,
) -> Result<CallToolResult, ErrorData> {
    let json = serde_json::to_value(value)
        .map_err(|e| ErrorData::internal_error(format!("serializing the result: {e}"), None))?;
    let mut r = CallToolResult::structured(json.clone());
    r.content.clear();
    if let Some(message) = &error {
        r.content.push(ContentBlock::text(message.clone()));
    }
    r.content.push(ContentBlock::text(json.to_string()));
    r.is_error = Some(error.is_some());
    Ok(r)
}

/// A request the service refused (bad sandbox id, a limit above the maximum, overload,
/// shutdown): `isError` with the reason, naming the field at fault.
pub(crate) fn refused(e: &ApiError) -> CallToolResult {
    let mut message = match &e.field {
        Some(field) => format!("{field}: {}", e.message),
        None => e.message.clone(),
    };
    if let Some(secs) = e.retry_after {
        message.push_str(&format!(" (retry in {secs} s)"));
    }
    CallToolResult::error(vec![ContentBlock::text(message)])
}

/// A refusal about the sandbox itself (unknown, expired, closed): says what to do next.
pub(crate) fn no_sandbox(e: &ApiError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!(
        "{}: create a new sandbox with create_sandbox",
        e.message
    ))])
}

/// `ms` milliseconds as seconds, e.g. `10 s`, `1.5 s`.
fn seconds(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        let s = format!("{:.3}", ms as f64 / 1e3);
        format!("{} s", s.trim_end_matches('0'))
    }
}

/// A byte count in the largest binary unit that divides it, e.g. `256 MiB`.
fn bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if n >= size && n.is_multiple_of(size) {
            return format!("{} {unit}", n / size);
        }
    }
    format!("{n} bytes")
}

/// `s` cut to at most `max` characters, with an ellipsis when cut.
fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

/// The session `id` of `key`, awake for a tool that needs its sandbox (an idle-paused one
/// resumes), or the tool's answer saying why not (no such sandbox, paused by request).
pub(crate) async fn awake_session(
    state: &crate::state::AppState,
    id: &str,
    key: &crate::state::KeyName,
) -> Result<std::sync::Arc<crate::state::Session>, CallToolResult> {
    let session = state.session(id, key).map_err(|e| no_sandbox(&e))?;
    session.wake().await.map_err(|e| refused(&e))?;
    Ok(session)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(outcome: Outcome, exit_code: Option<i32>, signal: Option<i32>, stderr: &str) -> ExecResponse {
        ExecResponse {
            result: ExecResult {
                id: "sb".into(),
                outcome,
                exit_code,
                signal,
                timed_out: outcome == Outcome::Timeout,
                oom_killed: outcome == Outcome::Oom,
                stdout: "out\n".into(),
                stderr: stderr.into(),
                stdout_truncated: false,
                stderr_truncated: false,
                stdout_bytes: 4,
                stderr_bytes: stderr.len() as u64,
                wall_ms: 12.5,
                setup_ms: 1.0,
                cpu_ms: 3.0,
                memory_peak_bytes: 1 << 20,
                egress: Vec::new(),
                isolation: airlock_spec::Isolation::Namespaces,
                platform: None,
                files_changed: Vec::new(),
                files_changed_truncated: false,
            },
            queue_ms: 0.0,
        }
    }

    fn texts(r: &CallToolResult) -> Vec<String> {
        r.content
            .iter()
            .map(|c| match c {
                ContentBlock::Text(t) => t.text.clone(),
                other => panic!("not text: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn success_is_not_an_error_and_carries_the_same_json_twice() {
        let r = exec_result(result(Outcome::Exited, Some(0), None, ""), &Limits::default()).unwrap();
        assert_eq!(r.is_error, Some(false));
        let texts = texts(&r);
        assert_eq!(texts.len(), 1, "{texts:?}");
        let text: serde_json::Value = serde_json::from_str(&texts[0]).unwrap();
        let structured = r.structured_content.unwrap();
        assert_eq!(text, structured);
        assert_eq!(structured["error"], serde_json::Value::Null);
        assert_eq!(structured["outcome"], "exited");
        assert_eq!(structured["exit_code"], 0);
        assert_eq!(structured["stdout"], "out\n");
    }

    #[test]
    fn non_zero_exit_quotes_the_last_stderr_line() {
        let stderr = "Traceback (most recent call last):\n  File \"<string>\", line 1\nNameError: name 'x' is not defined\n\n";
        let r = exec_result(result(Outcome::Exited, Some(1), None, stderr), &Limits::default()).unwrap();
        assert_eq!(r.is_error, Some(true));
        let texts = texts(&r);
        assert_eq!(texts[0], "exited with code 1: NameError: name 'x' is not defined");
        let json: serde_json::Value = serde_json::from_str(&texts[1]).unwrap();
        assert_eq!(json, r.structured_content.unwrap());
        assert_eq!(json["error"], texts[0].as_str());
        let quiet = failure(
            &result(Outcome::Exited, Some(3), None, "").result,
            &Limits::default(),
        );
        assert_eq!(quiet.as_deref(), Some("exited with code 3"));
    }

    #[test]
    fn timeout_says_after_how_long() {
        let r = result(Outcome::Timeout, None, Some(9), "");
        let limits = Limits::default();
        assert_eq!(
            failure(&r.result, &limits).as_deref(),
            Some("timed out after 10 s and was killed (the timeout_s limit)")
        );
        let short = Limits {
            timeout_ms: 1500,
            ..Limits::default()
        };
        assert!(
            failure(&r.result, &short)
                .unwrap()
                .starts_with("timed out after 1.5 s")
        );
    }

    #[test]
    fn oom_names_the_memory_limit() {
        let r = exec_result(result(Outcome::Oom, None, Some(9), ""), &Limits::default()).unwrap();
        assert_eq!(r.is_error, Some(true));
        assert_eq!(texts(&r)[0], "killed: exceeded 256 MiB memory limit");
        assert_eq!(r.structured_content.unwrap()["outcome"], "oom");
        let gib = Limits {
            memory_bytes: 2 << 30,
            ..Limits::default()
        };
        assert_eq!(
            failure(&result(Outcome::Oom, None, None, "").result, &gib).as_deref(),
            Some("killed: exceeded 2 GiB memory limit")
        );
    }

    #[test]
    fn a_signal_is_named() {
        let r = result(Outcome::Signaled, None, Some(6), "");
        assert_eq!(
            failure(&r.result, &Limits::default()).as_deref(),
            Some("killed by signal 6 (SIGABRT)")
        );
    }

    #[test]
    fn refusals_are_tool_errors_naming_the_field() {
        let r = refused(&ApiError::invalid("ttl_s", "must be between 1 and 86400 seconds"));
        assert_eq!(r.is_error, Some(true));
        assert_eq!(texts(&r), ["ttl_s: must be between 1 and 86400 seconds"]);
        assert!(r.structured_content.is_none());
        let r = refused(&ApiError::rate_limited("queue_full", "too many requests", 2));
        assert_eq!(texts(&r), ["too many requests (retry in 2 s)"]);
        let r = no_sandbox(&ApiError::not_found("no sandbox abc"));
        assert_eq!(r.is_error, Some(true));
        assert_eq!(
            texts(&r),
            ["no sandbox abc: create a new sandbox with create_sandbox"]
        );
    }

    #[test]
    fn long_stderr_lines_are_clipped() {
        let line = "é".repeat(500);
        let msg = failure(
            &result(Outcome::Exited, Some(2), None, &line).result,
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(
            msg.chars().count(),
            "exited with code 2: ".len() + QUOTED_STDERR_CHARS + 1
        );
    }

    #[test]
    fn units() {
        assert_eq!(bytes(256 << 20), "256 MiB");
        assert_eq!(bytes(1 << 30), "1 GiB");
        assert_eq!(bytes(1536), "1536 bytes");
        assert_eq!(bytes(1000), "1000 bytes");
        assert_eq!(seconds(250), "0.25 s");
        assert_eq!(seconds(60_000), "60 s");
    }
}
