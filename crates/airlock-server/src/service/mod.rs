//! The service's logic, the one layer that the HTTP routes (`routes/`) and the MCP tools
//! (`mcp/`) both call: one-shot execs, admission and the engine's errors in the API's
//! terms ([`runner`]), sessions ([`sessions`]) and their files ([`files`]). A route or a
//! tool only turns its request into these calls and their answers into its response.

pub mod files;
pub mod kernel;
pub mod network;
pub mod ports;
pub mod processes;
pub mod runner;
pub mod sessions;
pub mod snapshots;
