//! One file per subcommand.
pub mod build;
pub mod doctor;
pub mod image;
pub mod mcp;
pub mod run;
pub mod serve;
pub mod shell;
