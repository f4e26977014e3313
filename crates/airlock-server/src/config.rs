//! The service's settings and their defaults, derived from the host where that makes sense.

use airlock_spec::Limits;
use std::net::SocketAddr;
use std::time::Duration;

/// Everything `airlock serve` can be told.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Warm sandboxes kept ready (0 disables the pool).
    pub pool: usize,
    /// Micro-VMs kept booted for `"isolation": "microvm"` (0: booted per request).
    pub vm_pool: usize,
    /// gVisor sandboxes kept started for `"isolation": "gvisor"` (0: started per
    /// request).
    pub gvisor_pool: usize,
    /// Live sandboxes at most (one-shot execs and sessions).
    pub max_sandboxes: usize,
    /// The sum of admitted memory never exceeds this: each one-shot exec's cap, each
    /// namespace session's idle charge, and a session's cap while an exec runs in it
    /// (see [`ServerConfig::session_charge`]).
    pub memory_budget: u64,
    /// What an idle namespace session is counted at in the memory budget
    /// (`--session-idle-memory`, at most its cap): what such a session holds on the host
    /// between execs (its init and ready child, their kernel objects) with room for a
    /// few files. An exec in it is counted at its cap for the exec's life.
    pub session_idle_bytes: u64,
    /// How long a request may wait for admission before a 429.
    pub queue_timeout: Duration,
    /// Requests waiting for admission at most; more get a 429 at once.
    pub max_queue: usize,
    /// Per-request maxima.
    pub max: Limits,
    /// Request defaults.
    pub defaults: Limits,
    /// Largest request body.
    pub max_body: usize,
    /// API keys (name, key); empty means no auth (loopback only).
    pub api_keys: Vec<(String, String)>,
    /// Concurrent requests per API key.
    pub per_key_concurrency: usize,
    /// Sessions one API key (or the anonymous caller) may hold at once.
    pub max_sessions_per_key: usize,
    /// How long running execs get to finish at shutdown.
    pub grace: Duration,
    /// Session TTL when the request gives none.
    pub default_ttl: Duration,
    /// Longest session TTL (`--max-session-ttl`); a request asking for more gets a 400.
    pub max_ttl: Duration,
    /// The image store requests' `image` is resolved against (`--image-store`); `None`:
    /// requests with an image are refused.
    pub image_store: Option<std::path::PathBuf>,
    /// The store's disk budget (`--image-store-max`).
    pub image_store_max: Option<u64>,
    /// Warm pools of images (`--pool IMAGE=N`, `--gvisor-pool IMAGE=N`): each keeps `size`
    /// sandboxes of the image ready on its tier, of the default limits.
    pub image_pools: Vec<ImagePool>,
    /// Secrets the service holds (`--secret NAME@HOST`, values from its own environment):
    /// MCP's `create_sandbox` names them, so a model never sees a value.
    pub secrets: Vec<airlock_spec::Secret>,
    /// Where snapshots are stored (`--snapshot-dir`); `None`: snapshots are unavailable.
    pub snapshot_dir: Option<std::path::PathBuf>,
    /// The snapshot store's disk budget (`--snapshot-budget`).
    pub snapshot_budget: u64,
    /// Most sandboxes one fork request may make (`--max-fork`).
    pub max_fork: usize,
    /// This daemon's node name in a fleet (`--node`): every session and snapshot id it
    /// hands out is `NAME--<id>` (see [`crate::node`]); `None`: ids as they are.
    pub node: Option<String>,
}

/// Where snapshots are stored by default.
pub const DEFAULT_SNAPSHOT_DIR: &str = "/var/lib/airlock/snapshots";

/// One image's warm pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePool {
    /// The tier.
    pub isolation: airlock_spec::Isolation,
    /// The image, as named on the command line (resolved against the store at start).
    pub image: String,
    /// How many to keep ready.
    pub size: usize,
}

/// Host memory in bytes (`/proc/meminfo` MemTotal).
pub fn host_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(4 << 30, |kb| kb * 1024)
}

/// The default `--session-idle-memory`: an idle namespace session holds about 1 MiB
/// on the host (bench/density.py); the rest is room for the files it keeps.
pub const DEFAULT_SESSION_IDLE_BYTES: u64 = 4 << 20;

/// Live sandboxes at most, whatever the budget: each holds processes, fds and kernel
/// objects of the daemon's (2,000 idle sessions is the density target on a 24 GiB host).
pub const MAX_SANDBOXES_CAP: usize = 4096;

/// The default `--max-sandboxes` for a budget: as many idle sessions as it admits (one-shot
/// execs, counted at their caps, are fewer anyway), at most [`MAX_SANDBOXES_CAP`].
pub fn default_max_sandboxes(memory_budget: u64, session_idle_bytes: u64) -> usize {
    usize::try_from(memory_budget / session_idle_bytes.max(1))
        .unwrap_or(usize::MAX)
        .clamp(1, MAX_SANDBOXES_CAP)
}

impl Default for ServerConfig {
    fn default() -> Self {
        let defaults = Limits::default();
        let memory_budget = host_memory() / 10 * 8;
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let max_sandboxes = default_max_sandboxes(memory_budget, DEFAULT_SESSION_IDLE_BYTES);
        ServerConfig {
            // A few per core: enough to absorb a burst while the pool refills.
            pool: (cpus * 2).clamp(2, 16),
            // Off unless asked for: a booted VM holds memory and, emulated, some CPU.
            vm_pool: 0,
            gvisor_pool: 0,
            max_sandboxes,
            memory_budget,
            session_idle_bytes: DEFAULT_SESSION_IDLE_BYTES,
            queue_timeout: Duration::from_secs(10),
            max_queue: 1024,
            max: Limits {
                memory_bytes: 4 << 30,
                cpus: cpus as f64,
                pids: 1024,
                timeout_ms: 10 * 60 * 1000,
                disk_bytes: 4 << 30,
                output_bytes: 16 << 20,
            },
            defaults,
            max_body: 16 << 20,
            api_keys: Vec::new(),
            per_key_concurrency: 64,
            max_sessions_per_key: default_sessions_per_key(max_sandboxes),
            grace: Duration::from_secs(10),
            default_ttl: Duration::from_secs(600),
            max_ttl: Duration::from_secs(24 * 3600),
            image_store: None,
            image_store_max: None,
            image_pools: Vec::new(),
            secrets: Vec::new(),
            snapshot_dir: None,
            snapshot_budget: 10 << 30,
            max_fork: 16,
            node: None,
        }
    }
}

/// The default `--max-sessions-per-key`: half of the live sandboxes, at least 1 and at
/// most 16, so that one caller never holds every slot (when there are two or more).
pub fn default_sessions_per_key(max_sandboxes: usize) -> usize {
    (max_sandboxes / 2).clamp(1, 16)
}

impl ServerConfig {
    /// What a session of `tier` with memory cap `cap` holds of the budget while idle: the
    /// idle charge on the namespace tier, whose memory goes back to the host when a
    /// program exits; its cap on the others (a micro-VM's guest keeps the RAM its
    /// programs touched; gVisor's Sentry keeps some of it), where idle is not cheap.
    pub fn session_charge(&self, tier: airlock_spec::Isolation, cap: u64) -> u64 {
        match tier {
            airlock_spec::Isolation::Namespaces => cap.min(self.session_idle_bytes),
            _ => cap,
        }
    }

    /// How many sandboxes the pool of `tier` keeps ready.
    pub fn pool_target(&self, tier: airlock_spec::Isolation) -> usize {
        match tier {
            airlock_spec::Isolation::Namespaces => self.pool,
            airlock_spec::Isolation::Gvisor => self.gvisor_pool,
            airlock_spec::Isolation::Microvm => self.vm_pool,
        }
    }

    /// Refuses settings that would run an unprotected service.
    pub fn check(&self, listen: SocketAddr) -> Result<(), String> {
        if !listen.ip().is_loopback() && self.api_keys.is_empty() {
            return Err(format!(
                "listening on {listen} (not loopback) needs API keys: pass --api-keys FILE or set AIRLOCK_API_KEYS"
            ));
        }
        self.validate()
    }

    /// Refuses settings that could never work, whatever the interface.
    pub fn validate(&self) -> Result<(), String> {
        if self.max.memory_bytes > self.memory_budget {
            return Err(
                "--max-memory is larger than --memory-budget: such a request could never be admitted".into(),
            );
        }
        self.max.validate().map_err(|e| format!("server maxima: {e}"))?;
        if self.max_sessions_per_key == 0 {
            return Err("--max-sessions-per-key must be at least 1".into());
        }
        if let Some(node) = &self.node {
            crate::node::validate(node).map_err(|e| format!("--node: {e}"))?;
        }
        if self.max_ttl.is_zero() {
            return Err("--max-session-ttl must be at least 1s".into());
        }
        if self.default_ttl > self.max_ttl {
            return Err(format!(
                "--default-ttl ({}) is longer than --max-session-ttl ({})",
                airlock_spec::format_duration(self.default_ttl),
                airlock_spec::format_duration(self.max_ttl)
            ));
        }
        Ok(())
    }
}

/// Parses API keys: one `name:key` per line (or comma-separated); blank lines and `#`
/// comments are skipped.
pub fn parse_api_keys(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut keys = Vec::new();
    for (i, line) in text.split(['\n', ',']).enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, key)) = line.split_once(':') else {
            return Err(format!("API key entry {}: expected name:key", i + 1));
        };
        let (name, key) = (name.trim(), key.trim());
        if name.is_empty() || key.len() < 16 {
            return Err(format!(
                "API key entry {}: the name must be non-empty and the key at least 16 characters",
                i + 1
            ));
        }
        keys.push((name.to_owned(), key.to_owned()));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys() {
        let keys = parse_api_keys("# team keys\nalice:0123456789abcdef\n\nbob:fedcba9876543210xx").unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].0, "alice");
        assert!(parse_api_keys("nocolon").is_err());
        assert!(parse_api_keys("a:short").is_err());
    }

    #[test]
    fn non_loopback_needs_keys() {
        let c = ServerConfig::default();
        assert!(c.check("127.0.0.1:1".parse().unwrap()).is_ok());
        assert!(c.check("0.0.0.0:1".parse().unwrap()).is_err());
    }

    #[test]
    fn sessions_per_key_default_leaves_room_for_another_caller() {
        assert_eq!(default_sessions_per_key(1), 1);
        assert_eq!(default_sessions_per_key(2), 1);
        assert_eq!(default_sessions_per_key(10), 5);
        assert_eq!(default_sessions_per_key(75), 16);
    }

    #[test]
    fn the_default_budget_of_a_24_gib_host_admits_2000_idle_sessions() {
        let budget = (24u64 << 30) / 10 * 8;
        let max = default_max_sandboxes(budget, DEFAULT_SESSION_IDLE_BYTES);
        assert!(max >= 2000, "{max}");
        let c = ServerConfig {
            memory_budget: budget,
            ..ServerConfig::default()
        };
        let charge = c.session_charge(airlock_spec::Isolation::Namespaces, 16 << 20);
        assert!(budget / charge >= 2000, "charge {charge}");
        // Only a namespace session is cheaper idle than its cap.
        assert_eq!(
            c.session_charge(airlock_spec::Isolation::Microvm, 16 << 20),
            16 << 20
        );
        assert_eq!(
            c.session_charge(airlock_spec::Isolation::Namespaces, 1 << 20),
            1 << 20
        );
        assert_eq!(default_max_sandboxes(1 << 20, 4 << 20), 1);
        assert_eq!(default_max_sandboxes(u64::MAX, 4 << 20), MAX_SANDBOXES_CAP);
    }
}
