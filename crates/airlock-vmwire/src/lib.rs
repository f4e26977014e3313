//! The wire protocol between airlock (the host) and the guest agent inside each of its
//! micro-VMs, in a crate of its own so that both sides share one definition and the guest
//! agent does not link the host's VMM driver:
//!
//! - [`frame`]: the request and report frames on the agent's virtio-serial port
//!   ([`frame::AGENT_PORT`]);
//! - [`mux`]: the program's proxy connections (explicit, or redirected with their
//!   original destination) and DNS queries, multiplexed over the egress port
//!   ([`mux::EGRESS_PORT`]).
//!
//! Pure data and framing: no syscalls, no VMM, no sandbox.

#![deny(missing_docs)]

pub mod frame;
pub mod mux;
