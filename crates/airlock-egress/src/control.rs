//! What can change while a sandbox runs: its policy (a session's `PATCH .../network`),
//! and the connections held for a person's approval (`"on_denied": "ask"`).
//!
//! The proxy reads the current [`Policy`] at each decision, so a change applies to the
//! next connection (open ones keep the decision they got). A held connection waits for
//! [`Control::decide`] at most the policy's `approval_timeout_ms`; no answer is a no.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use airlock_spec::{NetworkPatch, OnDenied, ProxyPolicy};
use tokio::sync::{oneshot, watch};

use crate::policy::{Policy, PolicyError};

/// An answer to a held connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Let this connection through.
    AllowOnce,
    /// Let it through, and add `host:port` to the session's allowlist.
    AllowSession,
    /// Refuse it.
    Deny,
}

impl std::str::FromStr for Decision {
    type Err = String;
    fn from_str(s: &str) -> Result<Decision, String> {
        match s {
            "allow_once" => Ok(Decision::AllowOnce),
            "allow_session" => Ok(Decision::AllowSession),
            "deny" => Ok(Decision::Deny),
            _ => Err(format!(
                "{s:?} is not a decision; use allow_once, allow_session or deny"
            )),
        }
    }
}

/// A connection held for approval, as shown to whoever may answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// Its id in this sandbox (for [`Control::decide`]).
    pub id: u64,
    /// The host the program asked for (a name, or an address when it gave no name).
    pub host: String,
    /// The port.
    pub port: u16,
    /// Why the policy denied it.
    pub reason: String,
    /// Milliseconds left before it is refused.
    pub expires_in_ms: u64,
}

struct Held {
    host: String,
    port: u16,
    reason: String,
    deadline: Instant,
    answer: oneshot::Sender<Decision>,
}

/// The policy in force and the approvals pending, shared by the proxy and whoever
/// changes or answers them (the service).
pub struct Control {
    /// The policy as given (secret values included: never shown, see [`Control::shown`]).
    source: Mutex<ProxyPolicy>,
    policy: RwLock<Arc<Policy>>,
    held: Mutex<BTreeMap<u64, Held>>,
    next_id: AtomicU64,
    /// Bumped whenever a connection is held or answered: wakes whoever lists them.
    version: watch::Sender<u64>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("policy", &self.shown())
            .field("pending", &self.pending().len())
            .finish()
    }
}

/// How a held connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Let through, with the reason for the log.
    Allowed(String),
    /// Refused, with the reason for the log and the program.
    Refused(String),
}

impl Control {
    /// The control of a sandbox whose policy is `source`.
    pub fn new(source: &ProxyPolicy) -> Result<Arc<Control>, PolicyError> {
        let policy = Policy::from_proxy(source)?;
        Ok(Arc::new(Control {
            source: Mutex::new(source.clone()),
            policy: RwLock::new(Arc::new(policy)),
            held: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            version: watch::channel(0).0,
        }))
    }

    /// A control holding `policy`, parsed already, that nothing changes and that asks
    /// nobody (a one-shot run's; tests').
    pub fn fixed(policy: Policy) -> Arc<Control> {
        Arc::new(Control {
            source: Mutex::new(ProxyPolicy::default()),
            policy: RwLock::new(Arc::new(policy)),
            held: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            version: watch::channel(0).0,
        })
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<Policy> {
        Arc::clone(&self.policy.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The policy as given, secret values blanked: what may be shown.
    pub fn shown(&self) -> ProxyPolicy {
        self.source.lock().unwrap_or_else(|e| e.into_inner()).redacted()
    }

    /// Applies `patch` for the next connections. Returns the policy now in force
    /// (shown form) and a one-line description of the change for the log; an error
    /// names the entry, and leaves the policy as it was.
    pub fn update(&self, patch: &NetworkPatch) -> Result<(ProxyPolicy, String), PolicyError> {
        let mut source = self.source.lock().unwrap_or_else(|e| e.into_inner());
        let next = patch.apply(&source);
        next.validate().map_err(|e| PolicyError {
            field: e.field,
            message: e.message,
        })?;
        let policy = Policy::from_proxy(&next)?;
        let what = describe(&source, &next);
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(policy);
        *source = next;
        let shown = source.redacted();
        drop(source);
        if shown.on_denied == OnDenied::Deny {
            // Nobody is asked any more: what is held is refused now.
            self.refuse_all();
        }
        Ok((shown, what))
    }

    /// Whether denials are put to a person, and how long one may take.
    pub(crate) fn asks(&self) -> Option<Duration> {
        let source = self.source.lock().unwrap_or_else(|e| e.into_inner());
        (source.on_denied == OnDenied::Ask).then(|| Duration::from_millis(source.approval_timeout_ms))
    }

    /// The connections held now, oldest first.
    pub fn pending(&self) -> Vec<Pending> {
        let now = Instant::now();
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(&id, h)| Pending {
                id,
                host: h.host.clone(),
                port: h.port,
                reason: h.reason.clone(),
                expires_in_ms: h.deadline.saturating_duration_since(now).as_millis() as u64,
            })
            .collect()
    }

    /// A receiver that changes whenever a connection is held or answered.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Answers held connection `id`; `false` when no such connection is held (answered,
    /// expired or never held).
    pub fn decide(&self, id: u64, decision: Decision) -> bool {
        let Some(held) = self.held.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) else {
            return false;
        };
        let _ = held.answer.send(decision);
        self.version.send_modify(|v| *v += 1);
        true
    }

    /// Holds a connection to `host:port` that the policy denied with `reason` until it
    /// is answered or `wait` passes.
    pub(crate) async fn ask(&self, host: &str, port: u16, reason: &str, wait: Duration) -> Answer {
        let id = self.next_id.fetch_add(1, Relaxed);
        let (tx, rx) = oneshot::channel();
        self.held.lock().unwrap_or_else(|e| e.into_inner()).insert(
            id,
            Held {
                host: host.to_owned(),
                port,
                reason: reason.to_owned(),
                deadline: Instant::now() + wait,
                answer: tx,
            },
        );
        self.version.send_modify(|v| *v += 1);
        // However this ends (an answer, the timeout, or the connection dropped with the
        // sandbox), the entry goes.
        let _unlist = Unlist { control: self, id };
        let answer = tokio::time::timeout(wait, rx).await;
        match answer {
            Ok(Ok(Decision::AllowOnce)) => Answer::Allowed("allowed once by approval".into()),
            Ok(Ok(Decision::AllowSession)) => {
                let entry = session_entry(host, port);
                let patch = {
                    let source = self.source.lock().unwrap_or_else(|e| e.into_inner());
                    let mut allow = source.allow.clone();
                    if !allow.contains(&entry) {
                        allow.push(entry.clone());
                    }
                    NetworkPatch {
                        allow: Some(allow),
                        ..NetworkPatch::default()
                    }
                };
                match self.update(&patch) {
                    Ok(_) => Answer::Allowed(format!("allowed by approval for this session (allow {entry})")),
                    Err(e) => Answer::Refused(format!("approved, but {entry} cannot be allowed: {e}")),
                }
            }
            Ok(Ok(Decision::Deny)) => Answer::Refused(format!("{reason}; denied by approval")),
            Ok(Err(_)) => Answer::Refused(format!("{reason}; approval withdrawn")),
            Err(_) => Answer::Refused(format!("{reason}; no approval within {} ms", wait.as_millis())),
        }
    }

    /// Refuses every held connection (the sandbox's end, or asking turned off).
    pub fn refuse_all(&self) {
        let held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()));
        if held.is_empty() {
            return;
        }
        for (_, h) in held {
            let _ = h.answer.send(Decision::Deny);
        }
        self.version.send_modify(|v| *v += 1);
    }
}

/// Removes a held entry when its wait ends, whichever way.
struct Unlist<'a> {
    control: &'a Control,
    id: u64,
}

impl Drop for Unlist<'_> {
    fn drop(&mut self) {
        let removed = self
            .control
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id)
            .is_some();
        if removed {
            self.control.version.send_modify(|v| *v += 1);
        }
    }
}

/// The allow entry an approval "for this session" adds.
fn session_entry(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `allow: [a] -> [a, b]; deny: [] -> [c]`: the lists that changed.
fn describe(old: &ProxyPolicy, new: &ProxyPolicy) -> String {
    let mut parts = Vec::new();
    for (name, a, b) in [
        ("allow", &old.allow, &new.allow),
        ("allow_cidrs", &old.allow_cidrs, &new.allow_cidrs),
        ("deny", &old.deny, &new.deny),
    ] {
        if a != b {
            parts.push(format!("{name}: {a:?} -> {b:?}"));
        }
    }
    if old.on_denied != new.on_denied {
        parts.push(format!("on_denied: {:?} -> {:?}", old.on_denied, new.on_denied).to_lowercase());
    }
    if parts.is_empty() {
        "policy changed: nothing".into()
    } else {
        format!("policy changed: {}", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(allow: &[&str], ask: bool) -> Arc<Control> {
        let mut p = ProxyPolicy::allowing(allow);
        if ask {
            p.on_denied = OnDenied::Ask;
        }
        Control::new(&p).unwrap()
    }

    #[test]
    fn an_update_applies_to_the_next_decision_and_says_what_changed() {
        let c = control(&["a.example"], false);
        assert!(c.policy().check_name("b.example", 443).is_err());
        let patch = NetworkPatch {
            allow: Some(vec!["b.example".into()]),
            ..NetworkPatch::default()
        };
        let (shown, what) = c.update(&patch).unwrap();
        assert_eq!(shown.allow, ["b.example"]);
        assert_eq!(what, r#"policy changed: allow: ["a.example"] -> ["b.example"]"#);
        assert!(c.policy().check_name("b.example", 443).is_ok());
        assert!(c.policy().check_name("a.example", 443).is_err());
        let bad = NetworkPatch {
            deny: Some(vec!["x.example:80".into()]),
            ..NetworkPatch::default()
        };
        assert_eq!(c.update(&bad).unwrap_err().field, "network.deny[0]");
        assert!(
            c.policy().check_name("b.example", 443).is_ok(),
            "a refused patch changes nothing"
        );
    }

    #[tokio::test]
    async fn a_held_connection_gets_the_answer_given() {
        let c = control(&[], true);
        let wait = Duration::from_secs(10);
        for (decision, allowed) in [(Decision::AllowOnce, true), (Decision::Deny, false)] {
            let asking = {
                let c = Arc::clone(&c);
                tokio::spawn(async move { c.ask("x.example", 443, "not in allowlist", wait).await })
            };
            let mut w = c.watch();
            while c.pending().is_empty() {
                w.changed().await.unwrap();
            }
            let p = c.pending().remove(0);
            assert_eq!((p.host.as_str(), p.port), ("x.example", 443));
            assert!(c.decide(p.id, decision));
            assert!(!c.decide(p.id, decision), "answered once");
            assert_eq!(matches!(asking.await.unwrap(), Answer::Allowed(_)), allowed);
            assert!(c.pending().is_empty());
        }
    }

    #[tokio::test]
    async fn allow_for_the_session_adds_the_host_and_no_answer_is_a_no() {
        let c = control(&[], true);
        let asking = {
            let c = Arc::clone(&c);
            tokio::spawn(async move {
                c.ask("x.example", 8443, "not in allowlist", Duration::from_secs(10))
                    .await
            })
        };
        let mut w = c.watch();
        while c.pending().is_empty() {
            w.changed().await.unwrap();
        }
        c.decide(c.pending()[0].id, Decision::AllowSession);
        assert_eq!(
            asking.await.unwrap(),
            Answer::Allowed("allowed by approval for this session (allow x.example:8443)".into())
        );
        assert!(c.policy().check_name("x.example", 8443).is_ok());
        assert_eq!(c.shown().allow, ["x.example:8443"]);
        let unanswered = c
            .ask("y.example", 443, "not in allowlist", Duration::from_millis(50))
            .await;
        assert_eq!(
            unanswered,
            Answer::Refused("not in allowlist; no approval within 50 ms".into())
        );
        assert!(c.pending().is_empty());
    }
}
