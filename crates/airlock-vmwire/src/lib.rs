//! The wire protocol between airlock (the host) and the guest agent inside each of its
//! micro-VMs, in a crate of its own so that both sides share one definition and the guest
//! agent does not link the host's VMM driver:
//!
//! - [`frame`]: the request and report frames on the agent's virtio-serial port
//!   ([`frame::AGENT_PORT`]);
//! - [`mux`]: the program's proxy connections (explicit, or redirected with their
//!   original destination) and DNS queries, and what the host opens (connections to the
//!   sandbox's ports, spawned programs' stdio, their signals and ends), multiplexed over
//!   the egress port ([`mux::EGRESS_PORT`]).
//!
//! Pure data and framing: no syscalls, no VMM, no sandbox.

#![deny(missing_docs)]

pub mod frame;
pub mod mux;

/// Where the guest installs the trust bundle of a sandbox whose proxy intercepts TLS for
/// secrets: root-owned and read-only in the sandbox's /tmp (the guest's sandbox is built
/// before its policy is known, so its /etc cannot get it).
pub const GUEST_CA_BUNDLE: &str = "/tmp/.airlock-ca-bundle.pem";

/// The payload of `ToGuest::Egress` (JSON): what the guest's programs get in proxy mode.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EgressSetup {
    /// Variables every program of the sandbox gets: the proxy's, the secrets'
    /// placeholders (never their values), where the trust bundle is.
    pub env: Vec<(String, String)>,
    /// The trust bundle (PEM) to install at [`GUEST_CA_BUNDLE`], when the proxy
    /// intercepts TLS for secrets.
    pub ca_bundle: Option<String>,
}
