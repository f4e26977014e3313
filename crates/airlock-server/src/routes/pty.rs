//! `GET /v1/sandboxes/{id}/pty`: a terminal in a session, over a WebSocket. Binary frames
//! carry the terminal's bytes both ways; text frames carry JSON: `resize` from the client,
//! `started` and `exit` (then a close frame) from the server. The terminal's program is one
//! of the session's processes (`tty: true`); closing the WebSocket hangs it up.

use airlock_backend::Stdio;
use axum::Extension;
use axum::extract::ws::{
    CloseFrame, Message, WebSocket, WebSocketUpgrade, rejection::WebSocketUpgradeRejection,
};
use axum::extract::{Path, State};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::api::ExecRequest;
use crate::body::ApiQuery;
use crate::error::ApiError;
use crate::fdio::FdStream;
use crate::service::processes::{self, Proc};
use crate::service::sessions::session_spec;
use crate::state::{AppState, KeyName};

/// Largest terminal side accepted.
const MAX_SIDE: u16 = 1000;

/// How long a hung-up terminal's program has to end before it is killed.
const HANGUP_GRACE: Duration = Duration::from_secs(2);

/// The shell when no `cmd` is given: bash where the sandbox has it.
const DEFAULT_SHELL: &str = "command -v bash >/dev/null 2>&1 && exec bash || exec sh";

/// `?rows=&cols=&cmd=&access_token=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtyQuery {
    rows: Option<String>,
    cols: Option<String>,
    cmd: Option<String>,
    /// Read by the auth layer.
    #[allow(dead_code)]
    access_token: Option<String>,
}

/// A side of the terminal, checked.
fn side(field: &str, value: Option<u16>, default: u16) -> Result<u16, ApiError> {
    match value.unwrap_or(default) {
        n @ 1..=MAX_SIDE => Ok(n),
        n => Err(ApiError::invalid(
            field,
            format!("must be between 1 and {MAX_SIDE}, got {n}"),
        )),
    }
}

/// A side given in the query.
fn side_param(field: &str, value: Option<&str>, default: u16) -> Result<u16, ApiError> {
    let parsed = value
        .map(|v| {
            v.parse::<u16>().map_err(|_| {
                ApiError::invalid(
                    field,
                    format!("must be an integer between 1 and {MAX_SIDE}, got {v:?}"),
                )
            })
        })
        .transpose()?;
    side(field, parsed, default)
}

pub async fn handle(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyName>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<PtyQuery>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let session = state.session(&id, &key)?;
    session.wake().await?;
    let rows = side_param("rows", query.rows.as_deref(), 24)?;
    let cols = side_param("cols", query.cols.as_deref(), 80)?;
    let upgrade = upgrade.map_err(|e| {
        ApiError::invalid(
            "upgrade",
            format!("this route is a WebSocket (GET with Upgrade: websocket): {e}"),
        )
    })?;
    let script = match query.cmd.as_deref().map(str::trim) {
        None => DEFAULT_SHELL.to_owned(),
        Some("") => return Err(ApiError::invalid("cmd", "is empty")),
        Some(cmd) => format!("exec {cmd}"),
    };
    let req = ExecRequest {
        cmd: Some(vec!["/bin/sh".into(), "-c".into(), script]),
        env: BTreeMap::from([("TERM".to_owned(), "xterm-256color".to_owned())]),
        ..ExecRequest::default()
    };
    let spec = session_spec(&state, &session, &req)?;
    let command = vec![query.cmd.unwrap_or_else(|| "shell".into())];
    let spawned = processes::spawn(&state, &session, spec, Stdio::Terminal { rows, cols }).await?;
    let proc = processes::register_terminal(&session, command, spawned.handle);
    let (input, output) = (spawned.stdin, spawned.stdout);
    let input = FdStream::new(input).map_err(|e| ApiError::internal(format!("terminal: {e}")))?;
    let output = FdStream::new(output).map_err(|e| ApiError::internal(format!("terminal: {e}")))?;
    tracing::info!(id = %session.id, process = %proc.id, "terminal opened");
    Ok(upgrade.on_upgrade(move |socket| serve(socket, proc, input, output)))
}

/// Carries the terminal both ways until its program ends or the client leaves.
async fn serve(socket: WebSocket, proc: Arc<Proc>, mut input: FdStream, mut output: FdStream) {
    let (mut tx, mut rx) = socket.split();
    let started = json!({"type": "started", "process_id": proc.id, "pid": proc.info().pid});
    if tx.send(Message::Text(started.to_string().into())).await.is_err() {
        hang_up(proc);
        return;
    }
    let mut buf = vec![0u8; 32 << 10];
    loop {
        tokio::select! {
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(data))) => {
                    if input.write_all(&data).await.is_err() {
                        // The terminal is gone: its end comes from the output side.
                        continue;
                    }
                }
                Some(Ok(Message::Text(text))) => {
                    if let Err(message) = control(&proc, &text).await {
                        let error = json!({"type": "error", "message": message});
                        let _ = tx.send(Message::Text(error.to_string().into())).await;
                    }
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_)) | Err(_)) | None => {
                    hang_up(proc);
                    return;
                }
            },
            read = output.read(&mut buf) => match read {
                Ok(n) if n > 0 => {
                    if tx.send(Message::Binary(buf[..n].to_vec().into())).await.is_err() {
                        hang_up(proc);
                        return;
                    }
                }
                _ => break,
            },
        }
    }
    // The terminal closed: its program ended (or closed it); say how it ended.
    proc.wait(Duration::from_secs(5)).await;
    let info = proc.info();
    let exit = json!({"type": "exit", "exit_code": info.exit_code, "signal": info.signal});
    let _ = tx.send(Message::Text(exit.to_string().into())).await;
    let _ = tx
        .send(Message::Close(Some(CloseFrame {
            code: 1000,
            reason: "the terminal's program ended".into(),
        })))
        .await;
    if !proc.ended() {
        hang_up(proc);
    }
}

/// A client's text frame: `{"type": "resize", "rows": R, "cols": C}`.
async fn control(proc: &Proc, text: &str) -> Result<(), String> {
    #[derive(Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
    enum Control {
        Resize { rows: u16, cols: u16 },
    }
    let Control::Resize { rows, cols } = serde_json::from_str(text).map_err(|e| {
        format!("a text frame must be {{\"type\": \"resize\", \"rows\": R, \"cols\": C}}: {e}")
    })?;
    let rows = side("rows", Some(rows), 24).map_err(|e| e.message)?;
    let cols = side("cols", Some(cols), 80).map_err(|e| e.message)?;
    proc.resize(rows, cols).await.map_err(|e| e.message)
}

/// Hangs the terminal up: SIGHUP, and SIGKILL if it has not ended after a grace.
fn hang_up(proc: Arc<Proc>) {
    tokio::spawn(async move {
        if proc.ended() {
            return;
        }
        let _ = proc.signal(libc::SIGHUP).await;
        proc.wait(HANGUP_GRACE).await;
        if !proc.ended() {
            let _ = proc.signal(libc::SIGKILL).await;
        }
    });
}
