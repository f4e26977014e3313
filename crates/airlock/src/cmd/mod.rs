//! One file per subcommand.
pub mod doctor;
pub mod mcp;
pub mod run;
pub mod serve;
