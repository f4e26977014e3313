//! Approvals over MCP: while an exec runs in a sandbox created with `"on_denied": "ask"`,
//! every connection its proxy holds is put to the user through the client's elicitation
//! request (allow once, allow for this sandbox, deny). A decline, a cancel or no answer
//! in time is a denial; a client without elicitation leaves the connection to the
//! approvals route (`/v1/sandboxes/{id}/approvals`) or its timeout.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use airlock_egress::{Decision, Proxy};
use futures_util::StreamExt;
use rmcp::RoleServer;
use rmcp::service::{ElicitationError, Peer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The user's answer (a flat object of one string: what elicitation forms can show).
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ApprovalAnswer {
    /// `allow_once`: this connection only; `allow_session`: this host and port from now
    /// on in this sandbox; `deny`: refuse it.
    #[schemars(extend("enum" = ["allow_once", "allow_session", "deny"]))]
    pub decision: String,
}

rmcp::elicit_safe!(ApprovalAnswer);

/// Asks `peer` about every connection `proxy` holds, until dropped (the exec's end).
pub(crate) async fn ask_while_running(peer: Peer<RoleServer>, proxy: Arc<Proxy>, sandbox_id: String) {
    let control = Arc::clone(proxy.control());
    let mut changes = control.watch();
    let mut asked = HashSet::new();
    // Polled here, in the exec's own task: each question is a future of this one.
    let mut asking = futures_util::stream::FuturesUnordered::new();
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
            asking.push(async move {
                let decision = match peer
                    .elicit_with_timeout::<ApprovalAnswer>(message, Some(wait))
                    .await
                {
                    Ok(Some(answer)) => answer.decision.parse().unwrap_or(Decision::Deny),
                    Ok(None)
                    | Err(ElicitationError::UserDeclined)
                    | Err(ElicitationError::UserCancelled)
                    | Err(ElicitationError::NoContent)
                    | Err(ElicitationError::ParseError { .. }) => Decision::Deny,
                    Err(e) => {
                        // No elicitation here (or the client went away): the connection
                        // waits for the approvals route or its timeout.
                        tracing::warn!(error = %e, "cannot ask over MCP");
                        return;
                    }
                };
                control.decide(p.id, decision);
            });
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { break },
            Some(()) = asking.next(), if !asking.is_empty() => {}
        }
    }
    std::future::pending::<()>().await;
}
