//! A session's network while it runs: its policy (shown, changed for the next
//! connections) and the connections its proxy holds for approval (listed, answered).

use std::time::Duration;

use airlock_egress::{Decision, Pending, Proxy};
use airlock_spec::{NetworkPatch, NetworkPolicy};
use serde::Serialize;

use crate::error::ApiError;
use crate::state::Session;

/// The longest a listing of approvals may wait for one to appear.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// A held connection, as the API shows it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Approval {
    /// Its id, for the answer.
    pub id: u64,
    /// The host the program asked for.
    pub host: String,
    /// The port.
    pub port: u16,
    /// Why the policy denied it.
    pub reason: String,
    /// Milliseconds before it is refused unanswered.
    pub expires_in_ms: u64,
}

impl From<Pending> for Approval {
    fn from(p: Pending) -> Approval {
        Approval {
            id: p.id,
            host: p.host,
            port: p.port,
            reason: p.reason,
            expires_in_ms: p.expires_in_ms,
        }
    }
}

/// The session's policy now, secret values left out.
pub fn show(session: &Session) -> NetworkPolicy {
    match &session.egress {
        Some(proxy) => NetworkPolicy::Proxy(proxy.control().shown()),
        None => NetworkPolicy::None,
    }
}

/// The session's proxy, or why there is none.
fn proxy(session: &Session) -> Result<&Proxy, ApiError> {
    session.egress.as_deref().ok_or_else(|| {
        ApiError::invalid(
            "network",
            "this sandbox has no network (mode none); a session's network mode is set when it is created",
        )
    })
}

/// Changes the session's policy for its next connections (recorded in its egress log).
pub fn update(session: &Session, patch: &NetworkPatch) -> Result<NetworkPolicy, ApiError> {
    let proxy = proxy(session)?;
    let next = patch.apply(&proxy.control().shown());
    crate::api::check_proxy_policy(&next)?;
    let shown = proxy
        .update_policy(patch)
        .map_err(|e| ApiError::invalid(e.field, e.message))?;
    Ok(NetworkPolicy::Proxy(shown))
}

/// The connections held for approval now; with `wait`, waits (at most that long) for one
/// to be held when none is.
pub async fn pending(session: &Session, wait: Option<Duration>) -> Result<Vec<Approval>, ApiError> {
    let proxy = proxy(session)?;
    let control = proxy.control();
    let mut changes = control.watch();
    let list = control.pending();
    if let Some(wait) = wait.filter(|_| list.is_empty()) {
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        while control.pending().is_empty() {
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                break;
            }
        }
        return Ok(control.pending().into_iter().map(Approval::from).collect());
    }
    Ok(list.into_iter().map(Approval::from).collect())
}

/// Answers held connection `id`.
pub fn decide(session: &Session, id: u64, decision: &str) -> Result<(), ApiError> {
    let decision: Decision = decision
        .parse()
        .map_err(|why: String| ApiError::invalid("decision", why))?;
    if proxy(session)?.control().decide(id, decision) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!(
            "no connection {id} waits for approval in sandbox {} (answered, expired, or never held)",
            session.id
        )))
    }
}
