//! Approvals over MCP: while an exec runs in a sandbox created with `"on_denied": "ask"`,
//! every connection its proxy holds is put to the user through the client's elicitation
//! request (allow once, allow for this sandbox, deny). A decline, a cancel or no answer
//! in time is a denial; a client without elicitation leaves the connection to the
//! approvals route (`/v1/sandboxes/{id}/approvals`) or its timeout.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use airlock_egress::{Decision, Proxy};
use rmcp::service::{ElicitationError, Peer};
use rmcp::RoleServer;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The user's answer.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ApprovalAnswer {
    /// `allow_once`: this connection only; `allow_session`: this host and port from now
    /// on in this sandbox; `deny`: refuse it.
    pub decision: Choice,
}

/// The choices offered.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Choice {
    /// This connection only.
    AllowOnce,
    /// This host and port, for the rest of the sandbox's life.
    AllowSession,
    /// Refuse it.
    Deny,
}

rmcp::elicit_safe!(ApprovalAnswer);

impl From<Choice> for Decision {
    fn from(c: Choice) -> Decision {
        match c {
            Choice::AllowOnce => Decision::AllowOnce,
            Choice::AllowSession => Decision::AllowSession,
            Choice::Deny => Decision::Deny,
        }
    }
}

/// Asks `peer` about every connection `proxy` holds, until dropped (the exec's end).
pub(crate) async fn ask_while_running(peer: Peer<RoleServer>, proxy: Arc<Proxy>, sandbox_id: String) {
    let control = Arc::clone(proxy.control());
    let mut changes = control.watch();
    let mut asked = HashSet::new();
    let mut asking = tokio::task::JoinSet::new();
    loop {
        for p in control.pending() {
            if !asked.insert(p.id) {
                continue;
            }
            let peer = peer.clone();
            let control = Arc::clone(&control);
            let message = format!(
                "The program in sandbox {sandbox_id} wants to connect to {}:{}, which its network policy does not allow ({}). Allow it?",
                p.host, p.port, p.reason
            );
            let wait = Duration::from_millis(p.expires_in_ms);
            asking.spawn(async move {
                let decision = match peer.elicit_with_timeout::<ApprovalAnswer>(message, Some(wait)).await {
                    Ok(Some(answer)) => answer.decision.into(),
                    Ok(None)
                    | Err(ElicitationError::UserDeclined)
                    | Err(ElicitationError::UserCancelled)
                    | Err(ElicitationError::NoContent)
                    | Err(ElicitationError::ParseError { .. }) => Decision::Deny,
                    Err(e) => {
                        // No elicitation here (or the client went away): the connection
                        // waits for the approvals route or its timeout.
                        tracing::debug!(error = %e, "cannot ask over MCP");
                        return;
                    }
                };
                control.decide(p.id, decision);
            });
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { break },
            Some(_) = asking.join_next(), if !asking.is_empty() => {}
        }
    }
    std::future::pending::<()>().await;
}
