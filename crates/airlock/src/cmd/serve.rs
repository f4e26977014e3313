//! `airlock serve`: the execution service (HTTP API, warm pool, sessions).

use airlock_server::ServerConfig;
use airlock_server::config::parse_api_keys;
use airlock_spec::{parse_duration, parse_size};
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Where requests' `image` is looked up (the service never pulls on a request: add
    /// images with `airlock image pull|import` against the same store).
    #[command(flatten)]
    store: super::image::StoreArgs,
    #[command(flatten)]
    snapshots: super::image::SnapshotArgs,
    /// A secret MCP's create_sandbox may name (`"secrets": ["NAME"]` in its proxy
    /// network): its value is this process's variable NAME, and it goes only to HOSTs;
    /// repeatable.
    #[arg(long = "secret", value_name = "NAME@HOST[,HOST]")]
    secrets: Vec<String>,
    /// Address to listen on (a non-loopback address requires API keys).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8710")]
    listen: SocketAddr,
    /// Warm sandboxes kept ready (0 disables the pool) [default: 2 per core, 2..16];
    /// `IMAGE=N` keeps N of an image from the store warm too (repeatable).
    #[arg(long, value_name = "N|IMAGE=N", value_parser = pool_size)]
    pool: Vec<PoolSize>,
    /// Micro-VMs kept booted for `"isolation": "microvm"` requests (0: each such request
    /// boots its own VM, and the guest image is prepared on the first one).
    #[arg(long, value_name = "N", default_value_t = 0)]
    vm_pool: usize,
    /// gVisor sandboxes kept started, their agent holding a ready child, for
    /// `"isolation": "gvisor"` requests (0: each such request starts its own);
    /// `IMAGE=N` keeps N of an image warm too (repeatable).
    #[arg(long, value_name = "N|IMAGE=N", value_parser = pool_size)]
    gvisor_pool: Vec<PoolSize>,
    /// Live sandboxes at most [default: memory budget / --session-idle-memory, at most
    /// 4096 and one per 8 open files RLIMIT_NOFILE allows beyond 1024].
    #[arg(long, value_name = "N")]
    max_sandboxes: Option<usize>,
    /// Sum of admitted memory at most: one-shot execs' caps, idle namespace sessions'
    /// --session-idle-memory, a session's cap while an exec runs in it [default: 80% of
    /// host RAM].
    #[arg(long, value_name = "SIZE", value_parser = size, allow_hyphen_values = true)]
    memory_budget: Option<u64>,
    /// What an idle namespace session holds of the memory budget (at most its memory
    /// cap); each exec in it holds the rest of its cap while it runs.
    #[arg(long, value_name = "SIZE", default_value = "4M", value_parser = size, allow_hyphen_values = true)]
    session_idle_memory: u64,
    /// How long a request waits for admission before a 429.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration, allow_hyphen_values = true)]
    queue_timeout: std::time::Duration,
    /// Requests waiting for admission at most; beyond, 429 at once.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_queue: usize,
    /// Largest per-request memory cap.
    #[arg(long, value_name = "SIZE", default_value = "4G", value_parser = size, allow_hyphen_values = true)]
    max_memory: u64,
    /// Largest per-request CPU quota [default: host cores].
    #[arg(long, value_name = "N")]
    max_cpus: Option<f64>,
    /// Largest per-request pids limit.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_pids: u32,
    /// Longest per-request timeout.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration, allow_hyphen_values = true)]
    max_timeout: std::time::Duration,
    /// Largest per-request disk.
    #[arg(long, value_name = "SIZE", default_value = "4G", value_parser = size, allow_hyphen_values = true)]
    max_disk: u64,
    /// Largest per-request output limit.
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = size, allow_hyphen_values = true)]
    max_output: u64,
    /// Largest request body (413 beyond).
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = size, allow_hyphen_values = true)]
    max_body: u64,
    /// API keys, one `name:key` per line (or AIRLOCK_API_KEYS).
    #[arg(long, value_name = "FILE")]
    api_keys: Option<PathBuf>,
    /// Concurrent requests per API key.
    #[arg(long, value_name = "N", default_value_t = 64)]
    per_key_concurrency: usize,
    /// At shutdown, how long running execs get to finish before they are killed (with
    /// --node, also how long the draining node's sessions keep working at most).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration, allow_hyphen_values = true)]
    grace: std::time::Duration,
    /// Session TTL when a request gives none [default: 10m, or --max-session-ttl if that
    /// is shorter].
    #[arg(long, value_name = "DURATION", value_parser = duration, allow_hyphen_values = true)]
    default_ttl: Option<std::time::Duration>,
    /// Longest session TTL a request may ask for (more gets a 400 naming `ttl_s`).
    #[arg(long, visible_alias = "max-ttl", value_name = "DURATION", default_value = "24h", value_parser = duration, allow_hyphen_values = true)]
    max_session_ttl: std::time::Duration,
    /// Sessions one API key (or, without keys, the anonymous caller) may hold at once;
    /// one more gets a 429 `session_quota` [default: half of --max-sandboxes, 1 to 16].
    #[arg(long, value_name = "N")]
    max_sessions_per_key: Option<usize>,
    /// Where sandbox cgroups go: `auto` (under this process's own cgroup when it is
    /// delegated to it, e.g. a systemd unit with Delegate=yes; else each hierarchy's
    /// root), `root`, or a cgroup PATH such as /airlock.slice (docs/cgroups.md).
    #[arg(long, value_name = "auto|root|PATH", default_value = "auto")]
    cgroup_parent: airlock_sandbox::cgroup::CgroupParent,
    /// This daemon's name in a fleet: every session and snapshot id it hands out becomes
    /// `NAME--<id>`, so a router (`--route`) finds the node from the id; lowercase
    /// letters, digits and single hyphens, 1 to 20 characters. With it, SIGTERM drains:
    /// no new sessions or one-shot execs (503), its sessions keep working until none is
    /// left or --grace ends.
    #[arg(long, value_name = "NAME", value_parser = node_name)]
    node: Option<String>,
    /// Run as the fleet's router instead of a daemon: forward every request to the
    /// `--node` daemon that owns it (by the node in its id), new work to the one with
    /// the most free capacity. PEERS: comma list of HOST:PORT and dns:NAME:PORT (every
    /// A/AAAA record, re-resolved every 5 s). Uses --listen and --grace; the daemons
    /// check API keys. See docs/fleet.md.
    #[arg(long, value_name = "PEERS", value_parser = peers)]
    route: Option<Peers>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

fn node_name(s: &str) -> Result<String, String> {
    airlock_server::node::validate(s).map(|()| s.to_owned())
}

/// A `--route` value: the fleet's peers.
#[derive(Debug, Clone)]
struct Peers(Vec<airlock_router::Peer>);

fn peers(s: &str) -> Result<Peers, String> {
    airlock_router::parse_peers(s).map(Peers)
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.reason.to_string())
}

fn duration(s: &str) -> Result<std::time::Duration, String> {
    parse_duration(s).map_err(|e| e.reason.to_string())
}

/// A `--pool` value: the default pool's size, or an image's pool.
#[derive(Debug, Clone, PartialEq)]
enum PoolSize {
    /// `N`.
    Default(usize),
    /// `IMAGE=N`.
    Image(String, usize),
}

fn pool_size(s: &str) -> Result<PoolSize, String> {
    let count = |n: &str| {
        n.parse::<usize>()
            .map_err(|_| format!("{n:?} is not a count of sandboxes (N or IMAGE=N)"))
    };
    match s.rsplit_once('=') {
        Some(("", _)) => Err("IMAGE=N: the image is empty".into()),
        Some((image, n)) => Ok(PoolSize::Image(image.to_owned(), count(n)?)),
        None => Ok(PoolSize::Default(count(s)?)),
    }
}

/// The default pool's size among `sizes` (the last given), and the image pools.
fn split_pools(
    flag: &str,
    sizes: &[PoolSize],
    isolation: airlock_spec::Isolation,
    images: &mut Vec<airlock_server::config::ImagePool>,
) -> anyhow::Result<Option<usize>> {
    let mut default = None;
    for size in sizes {
        match size {
            PoolSize::Default(n) => default = Some(*n),
            PoolSize::Image(image, n) => {
                if images
                    .iter()
                    .any(|p| p.isolation == isolation && p.image == *image)
                {
                    bail!("{flag} {image}={n}: the image has a pool already");
                }
                images.push(airlock_server::config::ImagePool {
                    isolation,
                    image: image.clone(),
                    size: *n,
                });
            }
        }
    }
    Ok(default)
}

impl ServeArgs {
    fn config(&self) -> anyhow::Result<ServerConfig> {
        let mut c = ServerConfig::default();
        let mut images = Vec::new();
        if let Some(n) = split_pools(
            "--pool",
            &self.pool,
            airlock_spec::Isolation::Namespaces,
            &mut images,
        )? {
            c.pool = n;
        }
        c.vm_pool = self.vm_pool;
        c.gvisor_pool = split_pools(
            "--gvisor-pool",
            &self.gvisor_pool,
            airlock_spec::Isolation::Gvisor,
            &mut images,
        )?
        .unwrap_or(0);
        c.image_pools = images;
        if self.session_idle_memory < 1 << 20 {
            bail!("--session-idle-memory must be at least 1M (an idle session holds about that much)");
        }
        c.session_idle_bytes = self.session_idle_memory;
        if let Some(b) = self.memory_budget {
            c.memory_budget = b;
        }
        c.max_sandboxes =
            airlock_server::config::default_max_sandboxes(c.memory_budget, c.session_idle_bytes);
        if let Some(n) = self.max_sandboxes {
            if n == 0 {
                bail!("--max-sandboxes must be at least 1");
            }
            c.max_sandboxes = n;
        }
        c.queue_timeout = self.queue_timeout;
        c.max_queue = self.max_queue;
        c.max.memory_bytes = self.max_memory;
        if let Some(cpus) = self.max_cpus {
            c.max.cpus = cpus;
        }
        c.max.pids = self.max_pids;
        c.max.timeout_ms = self.max_timeout.as_millis().try_into().unwrap_or(u64::MAX);
        c.max.disk_bytes = self.max_disk;
        c.max.output_bytes = self.max_output;
        c.max_body = self.max_body.try_into().unwrap_or(usize::MAX);
        c.per_key_concurrency = self.per_key_concurrency.max(1);
        c.grace = self.grace;
        // A shorter cap lowers the default with it; a default given above the cap is
        // refused (see ServerConfig::validate).
        c.default_ttl = self
            .default_ttl
            .unwrap_or(c.default_ttl.min(self.max_session_ttl));
        c.max_ttl = self.max_session_ttl;
        c.image_store = Some(self.store.image_store.clone());
        c.image_store_max = self.store.image_store_max;
        self.snapshots.apply(&mut c)?;
        c.secrets = self
            .secrets
            .iter()
            .map(|s| super::run::secret_arg("--secret", s, false))
            .collect::<anyhow::Result<_>>()?;
        c.max_sessions_per_key = match self.max_sessions_per_key {
            Some(0) => bail!("--max-sessions-per-key must be at least 1"),
            Some(n) => n,
            None => airlock_server::config::default_sessions_per_key(c.max_sandboxes),
        };
        // Defaults above a maximum are lowered to it.
        c.defaults.memory_bytes = c.defaults.memory_bytes.min(c.max.memory_bytes);
        c.defaults.cpus = c.defaults.cpus.min(c.max.cpus);
        c.defaults.pids = c.defaults.pids.min(c.max.pids);
        c.defaults.timeout_ms = c.defaults.timeout_ms.min(c.max.timeout_ms);
        c.defaults.disk_bytes = c.defaults.disk_bytes.min(c.max.disk_bytes);
        c.defaults.output_bytes = c.defaults.output_bytes.min(c.max.output_bytes);
        let keys = match (&self.api_keys, std::env::var("AIRLOCK_API_KEYS")) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("--api-keys {}: cannot read it", path.display()))?;
                parse_api_keys(&text).map_err(|e| anyhow::anyhow!("--api-keys {}: {e}", path.display()))?
            }
            (None, Ok(text)) => {
                parse_api_keys(&text).map_err(|e| anyhow::anyhow!("AIRLOCK_API_KEYS: {e}"))?
            }
            (None, Err(_)) => Vec::new(),
        };
        c.api_keys = keys;
        c.node = self.node.clone();
        c.check(self.listen).map_err(|e| anyhow::anyhow!(e))?;
        Ok(c)
    }
}

/// Logs to stderr (`AIRLOCK_LOG` filters) in `format`.
fn init_logging(format: LogFormat) {
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => subscriber.json().init(),
        LogFormat::Text => subscriber.init(),
    }
}

/// `serve --route PEERS`: the fleet's router on --listen (no sandbox of its own).
fn route(args: &ServeArgs, peers: Vec<airlock_router::Peer>) -> anyhow::Result<ExitCode> {
    if args.node.is_some() {
        bail!("--route and --node: a router is no node (give --node to each daemon behind it)");
    }
    let mut config = airlock_router::RouterConfig::new(peers);
    config.grace = args.grace;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting tokio")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("--listen {}: cannot bind", args.listen))?;
        // The same line as a daemon's: scripts and tests wait for it.
        let started = |addr| println!("airlock: listening on http://{addr}");
        airlock_router::run(listener, config, started, shutdown_signal()).await?;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Open files the daemon holds per live sandbox: 6 for an idle namespace session on a
/// cgroup v1 host (bench/density.py counts them), 7 on v2 (its `memory.peak`), with room
/// for a connection or a stream.
const FILES_PER_SANDBOX: u64 = 8;

/// Open files the daemon keeps for itself (listener, connections, the image and snapshot
/// stores, the zygote, logs).
const FILES_RESERVED: u64 = 1024;

/// The open-file limit a root daemon raises its hard limit to when it is lower: room for
/// the most sandboxes (`MAX_SANDBOXES_CAP`, 4096) with margin, within `fs.nr_open`; not
/// higher, for the few programs that close every fd up to the limit one by one.
const FILES_WANTED: u64 = 65536;

/// Raises RLIMIT_NOFILE: the hard limit to [`FILES_WANTED`] when this process may (root,
/// `CAP_SYS_RESOURCE`), else the soft limit to the hard one; returns the sandboxes that
/// many open files allow. A daemon holding thousands of sessions holds several fds each,
/// far beyond the usual soft 1024. Sandboxes do not inherit it: each program's process
/// sets its own (`privileges::MAX_OPEN_FILES`).
fn raise_open_files() -> Option<usize> {
    use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(hard);
    let wanted = FILES_WANTED.min(nr_open).max(hard);
    if wanted > hard && setrlimit(Resource::RLIMIT_NOFILE, wanted, wanted).is_ok() {
        return Some(room_for(wanted));
    }
    if soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!(soft, hard, error = %e, "cannot raise RLIMIT_NOFILE to the hard limit");
        return Some(room_for(soft));
    }
    (hard != RLIM_INFINITY).then(|| room_for(hard))
}

/// Sandboxes `files` open files allow.
fn room_for(files: u64) -> usize {
    usize::try_from(files.saturating_sub(FILES_RESERVED) / FILES_PER_SANDBOX)
        .unwrap_or(usize::MAX)
        .max(1)
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

pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    init_logging(args.log_format);
    if let Some(Peers(peers)) = &args.route {
        return route(&args, peers.clone());
    }
    airlock_sandbox::cgroup::set_parent(args.cgroup_parent.clone());
    let mut config = args.config()?;
    if let Some(room) = raise_open_files() {
        if args.max_sandboxes.is_none() && config.max_sandboxes > room {
            // The default follows the budget; the fds the daemon may open bound it too.
            config.max_sandboxes = room;
        } else if config.max_sandboxes > room {
            tracing::warn!(
                max_sandboxes = config.max_sandboxes,
                room,
                "RLIMIT_NOFILE's hard limit may be short for --max-sandboxes: raise it (LimitNOFILE=, ulimit -Hn) or lower --max-sandboxes"
            );
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting tokio")?;
    runtime.block_on(async move {
        let tiers = crate::tiers::all(&config.defaults, config.vm_pool)?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("--listen {}: cannot bind", args.listen))?;
        let started = |addr| println!("airlock: listening on http://{addr}");
        airlock_server::run(listener, tiers, config, started, shutdown_signal()).await?;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
