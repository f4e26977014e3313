//! The `airlock` command: `run` a program in a fresh sandbox, `serve` the API, serve MCP
//! on stdio with `mcp`, check the host with `doctor`, manage images with `image`. The same binary is the sandbox's init
//! (see `airlock_sandbox::maybe_run_init`).

mod cmd;
mod tiers;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Run untrusted code in an ephemeral, isolated sandbox.
#[derive(Debug, Parser)]
#[command(name = "airlock", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run COMMAND in a fresh sandbox and purge it afterwards.
    Run(cmd::run::RunArgs),
    /// Serve the HTTP API: one-shot execs, sessions, warm pool (see docs/service.md).
    Serve(cmd::serve::ServeArgs),
    /// Serve the same tools as `/mcp` over MCP on stdio (for agents that launch airlock).
    Mcp(cmd::mcp::McpArgs),
    /// Report what this host provides and what airlock will use.
    Doctor(cmd::doctor::DoctorArgs),
    /// Manage the image store: pull, import, ls, rm, prune.
    Image(cmd::image::ImageArgs),
    /// Attach this terminal to a shell in a session of `airlock serve` (a new one,
    /// deleted afterwards, when no ID is given).
    Shell(cmd::shell::ShellArgs),
}

/// Exit status for bad flags and hosts that cannot provide a required isolation.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    airlock_sandbox::maybe_run_init();
    // Inside a gVisor sandbox, airlock is its own agent (see `tiers::gvisor`).
    airlock_gvisor::agent::maybe_serve();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One clear line: clap's message up to its usage block, joined.
            let text = e.to_string();
            let line = text
                .lines()
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            let line = if line.is_empty() {
                "invalid arguments".to_owned()
            } else {
                line
            };
            eprintln!("airlock: {} (see --help)", line.trim_start_matches("error: "));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = match cli.command {
        Command::Run(args) => cmd::run::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Mcp(args) => cmd::mcp::run(args),
        Command::Doctor(args) => cmd::doctor::run(args),
        Command::Image(args) => cmd::image::run(args),
        Command::Shell(args) => cmd::shell::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("airlock: {e:#}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}
