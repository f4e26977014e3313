//! JSON-RPC 2.0 checks that come before rmcp sees a message, on both transports: rmcp
//! answers a line that does not parse on stdio with nothing at all, and a body that does
//! not parse over HTTP with a 415 and a text body. What the README promises instead:
//! -32700 (parse error) for what is not JSON, -32600 (invalid request) for a batch or
//! anything that is not a JSON-RPC 2.0 message, -32602 (invalid params) for a request
//! whose params do not fit its method. A message that passes is one rmcp decodes.

use rmcp::model::ClientJsonRpcMessage;
use serde_json::{Value, json};

/// Not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON, but not a valid JSON-RPC request (or notification, or response).
pub const INVALID_REQUEST: i64 = -32600;
/// A known method with params that do not fit it.
pub const INVALID_PARAMS: i64 = -32602;
/// The server failed.
pub const INTERNAL_ERROR: i64 = -32603;

/// Why a message was refused, and the id to answer with (when it had a usable one).
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// The JSON-RPC error code.
    pub code: i64,
    /// What is wrong, for a person.
    pub message: String,
    /// The request's id, echoed when it was a string or an integer.
    pub id: Option<Value>,
}

fn refused(code: i64, message: impl Into<String>, id: Option<Value>) -> Refused {
    Refused {
        code,
        message: message.into(),
        id,
    }
}

/// A JSON-RPC error response (`id` null when the request's could not be read).
pub fn error(id: Option<Value>, code: i64, message: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id.unwrap_or(Value::Null),
        "error": {"code": code, "message": message},
    })
}

/// Checks one message (an HTTP body, a stdio line).
pub fn check(bytes: &[u8]) -> Result<(), Refused> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| refused(PARSE_ERROR, format!("Parse error: not JSON ({e})"), None))?;
    let obj = match &value {
        Value::Object(o) => o,
        Value::Array(_) => {
            return Err(refused(
                INVALID_REQUEST,
                "Invalid Request: batches are not supported (MCP 2025-06-18 and later); send one message at a time",
                None,
            ));
        }
        _ => {
            return Err(refused(
                INVALID_REQUEST,
                "Invalid Request: a JSON-RPC message is a JSON object",
                None,
            ));
        }
    };
    let id = match obj.get("id") {
        None => None,
        Some(v @ Value::String(_)) => Some(v.clone()),
        Some(v @ Value::Number(n)) if n.is_i64() || n.is_u64() => Some(v.clone()),
        Some(_) => {
            return Err(refused(
                INVALID_REQUEST,
                "Invalid Request: `id` must be a string or an integer",
                None,
            ));
        }
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(refused(
            INVALID_REQUEST,
            "Invalid Request: `jsonrpc` must be \"2.0\"",
            id,
        ));
    }
    let is_response = obj.contains_key("result") || obj.contains_key("error");
    match obj.get("method") {
        Some(Value::String(_)) => {}
        Some(_) => {
            return Err(refused(
                INVALID_REQUEST,
                "Invalid Request: `method` must be a string",
                id,
            ));
        }
        None if is_response && id.is_some() => {}
        None => {
            return Err(refused(
                INVALID_REQUEST,
                "Invalid Request: `method` is missing",
                id,
            ));
        }
    }
    if let Err(e) = serde_json::from_value::<ClientJsonRpcMessage>(value.clone()) {
        let code = if obj.contains_key("method") && id.is_some() {
            INVALID_PARAMS
        } else {
            INVALID_REQUEST
        };
        let what = if code == INVALID_PARAMS {
            "Invalid params"
        } else {
            "Invalid Request"
        };
        return Err(refused(code, format!("{what}: {e}"), id));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(body: &str) -> Option<i64> {
        check(body.as_bytes()).err().map(|e| e.code)
    }

    #[test]
    fn classifies_malformed_messages() {
        assert_eq!(code("{not json"), Some(PARSE_ERROR));
        assert_eq!(code(""), Some(PARSE_ERROR));
        assert_eq!(
            code(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
            Some(INVALID_REQUEST)
        );
        assert_eq!(code("[]"), Some(INVALID_REQUEST));
        assert_eq!(code("42"), Some(INVALID_REQUEST));
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#),
            Some(INVALID_REQUEST)
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1}"#), Some(INVALID_REQUEST));
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":7}"#),
            Some(INVALID_REQUEST)
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#),
            Some(INVALID_REQUEST)
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}"#),
            Some(INVALID_PARAMS)
        );
        let e = check(br#"{"jsonrpc":"1.0","id":"a","method":"ping"}"#).unwrap_err();
        assert_eq!(e.id, Some(json!("a")));
    }

    #[test]
    fn valid_messages_pass() {
        for ok in [
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/list","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"some/unknown"}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
        ] {
            assert_eq!(check(ok.as_bytes()), Ok(()), "{ok}");
        }
    }
}
