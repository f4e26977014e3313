//! `airlock mcp`: the service's tools over MCP on stdio, for an agent that launches airlock
//! itself (a desktop client's `mcpServers` entry, `MCPServerStdio`). The engine runs in
//! this process with a small warm pool and no HTTP listener; stdout carries only MCP, logs
//! go to stderr. When stdin closes or on SIGTERM/SIGINT, every sandbox is purged and the
//! process exits 0.

use airlock_server::{ServerConfig, Service};
use airlock_spec::parse_duration;
use anyhow::{Context, bail};
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

/// How long the runtime may wait for blocking tasks at exit (a stdin read that the
/// client never ends is abandoned after this).
const RUNTIME_EXIT: Duration = Duration::from_secs(2);

#[derive(Debug, Args)]
pub struct McpArgs {
    /// Warm sandboxes kept ready (0 disables the pool).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pool: usize,
    /// Live sandboxes at most [default: memory budget / default memory cap].
    #[arg(long, value_name = "N")]
    max_sandboxes: Option<usize>,
    /// Sandbox lifetime when create_sandbox gives none.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration, allow_hyphen_values = true)]
    default_ttl: Duration,
    /// Longest sandbox lifetime.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = duration, allow_hyphen_values = true)]
    max_ttl: Duration,
    /// Where the tools' `image` is looked up.
    #[command(flatten)]
    store: super::image::StoreArgs,
    #[command(flatten)]
    snapshots: super::image::SnapshotArgs,
    /// A secret create_sandbox may name (`"network": {"mode": "proxy", "secrets":
    /// ["NAME"]}`): its value is this process's variable NAME, and it goes only to HOSTs
    /// (the model names it, never sees it); repeatable.
    #[arg(long = "secret", value_name = "NAME@HOST[,HOST]")]
    secrets: Vec<String>,
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.reason.to_string())
}

impl McpArgs {
    fn config(&self) -> anyhow::Result<ServerConfig> {
        let mut c = ServerConfig {
            pool: self.pool,
            ..ServerConfig::default()
        };
        if let Some(n) = self.max_sandboxes {
            if n == 0 {
                bail!("--max-sandboxes must be at least 1");
            }
            c.max_sandboxes = n;
        }
        if self.default_ttl > self.max_ttl {
            bail!("--default-ttl is longer than --max-ttl");
        }
        c.default_ttl = self.default_ttl;
        c.max_ttl = self.max_ttl;
        c.image_store = Some(self.store.image_store.clone());
        c.image_store_max = self.store.image_store_max;
        self.snapshots.apply(&mut c)?;
        c.secrets = self
            .secrets
            .iter()
            .map(|s| super::run::secret_arg("--secret", s, false))
            .collect::<anyhow::Result<_>>()?;
        c.validate().map_err(|e| anyhow::anyhow!(e))?;
        Ok(c)
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

pub fn run(args: McpArgs) -> anyhow::Result<ExitCode> {
    let config = args.config()?;
    // stdout is the MCP channel: logs only ever go to stderr.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG")
                // One line per exec and session; rmcp's per-message lines only when asked.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn")),
        )
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting tokio")?;
    let served = runtime.block_on(async move {
        let tiers = crate::tiers::all(&config.defaults, config.vm_pool)?;
        let service = Service::start(tiers, config)?;
        tracing::info!("serving MCP on stdio");
        let served = airlock_server::mcp::serve_stdio(&service, shutdown_signal()).await;
        service.shutdown().await;
        served.context("MCP on stdio")
    });
    runtime.shutdown_timeout(RUNTIME_EXIT);
    served?;
    Ok(ExitCode::SUCCESS)
}
