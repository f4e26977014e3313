//! [`GvisorBackend`]: the gVisor tier behind `airlock_backend::Backend`.

use airlock_backend::{Backend, Error, Purpose, Sandbox, Shape};
use airlock_sandbox::cgroup::CgroupHost;
use airlock_spec::Isolation;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::platform::{self, Platform};
use crate::sandbox::GvisorSandbox;

/// Where the gVisor tier finds and keeps things.
#[derive(Debug, Clone)]
pub struct GvisorOptions {
    /// `runsc`; `None`: looked up on `PATH`.
    pub runsc: Option<PathBuf>,
    /// The agent binary (`airlock-gvisor-agent`), bound into every sandbox as its init.
    pub agent: PathBuf,
    /// The compatibility library preloaded into every program (`airlock-gvisor-compat`:
    /// see that crate); `None`, or a path that does not exist: programs run without it.
    pub compat: Option<PathBuf>,
    /// Bundles and runsc state: one directory per airlock process below it.
    pub state: PathBuf,
    /// Where the platform verdict is cached.
    pub cache: PathBuf,
    /// A platform to use without probing (`None`: probe).
    pub platform: Option<Platform>,
}

impl GvisorOptions {
    /// Defaults, overridden by `AIRLOCK_RUNSC`, `AIRLOCK_GVISOR_AGENT`,
    /// `AIRLOCK_GVISOR_STATE`, `AIRLOCK_GVISOR_CACHE` and `AIRLOCK_GVISOR_PLATFORM`
    /// (`systrap`, `kvm`, `ptrace`).
    pub fn from_env() -> GvisorOptions {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        GvisorOptions {
            runsc: var("AIRLOCK_RUNSC"),
            agent: var("AIRLOCK_GVISOR_AGENT").unwrap_or_else(default_agent_path),
            compat: var("AIRLOCK_GVISOR_COMPAT").or_else(default_compat_path),
            state: var("AIRLOCK_GVISOR_STATE").unwrap_or_else(|| "/run/airlock/gvisor".into()),
            cache: var("AIRLOCK_GVISOR_CACHE").unwrap_or_else(|| "/var/cache/airlock/gvisor".into()),
            platform: std::env::var("AIRLOCK_GVISOR_PLATFORM")
                .ok()
                .and_then(|p| Platform::from_name(&p)),
        }
    }
}

/// The directories the gVisor agent and compat library are looked in: the running
/// executable's directory and its parent (cargo puts test binaries in
/// `target/<profile>/deps`), the install prefix's `libexec/airlock` (`make install
/// PREFIX=/usr/local` puts `airlock` in `<prefix>/bin`), then `/usr/libexec/airlock`.
fn helper_dirs() -> Vec<PathBuf> {
    let exe = std::env::current_exe().ok();
    let mut dirs = exe
        .iter()
        .flat_map(|e| e.ancestors().skip(1).take(2))
        .map(Path::to_path_buf)
        .collect::<Vec<_>>();
    if let Some(prefix) = dirs.get(1) {
        dirs.push(prefix.join("libexec/airlock"));
    }
    dirs.push(PathBuf::from("/usr/libexec/airlock"));
    dirs
}

/// `airlock-gvisor-agent` in the first of [`helper_dirs`] that has it, else
/// `/usr/libexec/airlock/airlock-gvisor-agent`.
pub fn default_agent_path() -> PathBuf {
    helper_dirs()
        .iter()
        .map(|d| d.join("airlock-gvisor-agent"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("/usr/libexec/airlock/airlock-gvisor-agent"))
}

/// `libairlock_gvisor_compat.so` in the first of [`helper_dirs`] that has it.
pub fn default_compat_path() -> Option<PathBuf> {
    helper_dirs()
        .iter()
        .map(|d| d.join("libairlock_gvisor_compat.so"))
        .find(|p| p.is_file())
}

/// What `prepare` found, for every sandbox.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub runsc: PathBuf,
    pub platform: Platform,
    pub agent: PathBuf,
    /// The compatibility library, when installed.
    pub compat: Option<PathBuf>,
    pub cgroups: CgroupHost,
    /// This process's directory under the state directory (bundles and runsc state).
    pub owner_dir: PathBuf,
    /// The host libraries the agent needs in an image's root: found at the first
    /// sandbox with an image (`Err`: why images cannot run here).
    pub host_libs: OnceLock<Result<crate::bundle::HostLibs, String>>,
}

impl Prepared {
    /// The host libraries the agent needs (see [`crate::bundle::HostLibs`]).
    pub(crate) fn host_libs(&self) -> Result<&crate::bundle::HostLibs, Error> {
        self.host_libs
            .get_or_init(|| crate::bundle::HostLibs::of(&self.agent))
            .as_ref()
            .map_err(|reason| Error::Unavailable {
                tier: Isolation::Gvisor,
                reason: format!("images cannot run here: {reason}"),
            })
    }
}

/// The gVisor tier. Build it once; [`Backend::prepare`] probes the host the first time
/// and keeps its verdict.
#[derive(Debug)]
pub struct GvisorBackend {
    options: GvisorOptions,
    prepared: OnceLock<Result<Prepared, String>>,
}

impl GvisorBackend {
    /// A backend with `options`; nothing is probed until [`Backend::prepare`].
    pub fn new(options: GvisorOptions) -> GvisorBackend {
        GvisorBackend {
            options,
            prepared: OnceLock::new(),
        }
    }

    /// The platform sandboxes run on, once prepared.
    pub fn platform(&self) -> Option<Platform> {
        self.prepared
            .get()
            .and_then(|p| p.as_ref().ok())
            .map(|p| p.platform)
    }

    /// The options it was built with.
    pub fn options(&self) -> &GvisorOptions {
        &self.options
    }

    fn prepared(&self) -> Result<&Prepared, Error> {
        self.prepared
            .get_or_init(|| prepare(&self.options))
            .as_ref()
            .map_err(|reason| Error::Unavailable {
                tier: Isolation::Gvisor,
                reason: reason.clone(),
            })
    }
}

/// Finds runsc and the agent, picks the platform, purges what dead airlock processes
/// left. `Err` is the reason the tier is unavailable, in words a person can act on.
fn prepare(options: &GvisorOptions) -> Result<Prepared, String> {
    if !airlock_sandbox::doctor::is_root() {
        return Err(
            "airlock must run as root to drive runsc and put its Sentry in a cgroup (try sudo)".into(),
        );
    }
    let runsc = options
        .runsc
        .clone()
        .or_else(platform::find_runsc)
        .filter(|p| p.is_file())
        .ok_or("runsc (gVisor) is not installed: apt-get install runsc, or set AIRLOCK_RUNSC")?;
    if !options.agent.is_file() {
        return Err(format!(
            "the gVisor agent {} is missing (build it with `cargo build -p airlock-gvisor`, or set AIRLOCK_GVISOR_AGENT)",
            options.agent.display()
        ));
    }
    let cgroups = CgroupHost::detect().map_err(|e| format!("cgroups: {e}"))?;
    std::fs::create_dir_all(&options.state)
        .map_err(|e| format!("creating {}: {e}", options.state.display()))?;
    purge_stale(&cgroups, &options.state);
    // Everything of this process goes in a directory named like its cgroups' owner, so
    // that the next airlock process purges it should this one be killed (probes too).
    let owner_dir = options.state.join(cgroups.owner());
    std::fs::create_dir_all(&owner_dir).map_err(|e| format!("creating {}: {e}", owner_dir.display()))?;
    let platform = match options.platform {
        Some(p) => p,
        None => choose_platform(&runsc, options, &owner_dir)?,
    };
    Ok(Prepared {
        runsc,
        platform,
        agent: options.agent.clone(),
        compat: options.compat.clone().filter(|p| p.is_file()),
        cgroups,
        owner_dir,
        host_libs: OnceLock::new(),
    })
}

/// The cached verdict, or a fresh probe (stored when a platform works).
fn choose_platform(runsc: &Path, options: &GvisorOptions, scratch: &Path) -> Result<Platform, String> {
    let version = platform::runsc_version(runsc).map_err(|e| format!("running {}: {e}", runsc.display()))?;
    let cache = options.cache.join("platform");
    if let Some(p) = platform::cached(&cache, &version) {
        return Ok(p);
    }
    let verdict = platform::probe(runsc, scratch);
    match verdict.platform {
        Some(p) => {
            if let Err(e) = platform::store(&cache, &version, p) {
                tracing::warn!("caching the gVisor platform in {}: {e}", cache.display());
            }
            Ok(p)
        }
        None => Err(format!(
            "no gVisor platform runs /bin/true here: {}",
            verdict
                .trials
                .iter()
                .map(|t| format!(
                    "{}: {}",
                    t.platform.as_str(),
                    t.failure.as_deref().unwrap_or("ok")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        )),
    }
}

/// Removes what airlock processes that are gone left: their sandboxes' cgroups (killing
/// any runsc, Sentry or Gofer still in them) and their bundle and state directories.
/// Returns how many directories were removed.
pub fn purge_stale(cgroups: &CgroupHost, state: &Path) -> usize {
    cgroups.purge_stale();
    let mut removed = 0;
    let Ok(entries) = std::fs::read_dir(state) else {
        return 0;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == cgroups.owner() {
            continue;
        }
        let Some((pid, start)) = name.split_once('-') else {
            continue;
        };
        let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
            continue;
        };
        if owner_alive(pid, start) {
            continue;
        }
        if std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// True unless process `pid` started at `start` is certainly gone.
fn owner_alive(pid: u32, start: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(e) => !matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)),
        Ok(stat) => {
            let started = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(19))
                .and_then(|s| s.parse::<u64>().ok());
            started.is_none_or(|s| s == start)
        }
    }
}

impl Drop for GvisorBackend {
    fn drop(&mut self) {
        // Its sandboxes are gone (each purges itself on drop): its directory is empty.
        if let Some(Ok(p)) = self.prepared.get() {
            let _ = std::fs::remove_dir(&p.owner_dir);
        }
    }
}

impl Backend for GvisorBackend {
    fn isolation(&self) -> Isolation {
        Isolation::Gvisor
    }

    /// Nothing beyond the cap: the Sentry, the Gofer and runsc are inside it (see
    /// [`crate::MIN_MEMORY_BYTES`]).
    fn overhead_bytes(&self) -> u64 {
        0
    }

    fn prepare(&self) -> Result<(), Error> {
        self.prepared().map(drop)
    }

    /// An image's prepared tree is the bundle's root (see `bundle`).
    fn runs_images(&self) -> bool {
        true
    }

    fn create(&self, shape: &Shape, purpose: Purpose) -> Result<Box<dyn Sandbox>, Error> {
        self.check_shape(shape)?;
        let prepared = self.prepared()?;
        let background = matches!(purpose, Purpose::Pool { behind: true });
        let warm = matches!(purpose, Purpose::Pool { .. });
        let sandbox = GvisorSandbox::create(prepared, shape, background, warm, None)?;
        Ok(Box::new(sandbox))
    }

    /// `runsc checkpoint` saves a whole sandbox (see `GvisorSandbox::checkpoint`).
    fn checkpoints(&self) -> bool {
        true
    }

    /// `runsc restore` of the checkpoint in `dir` into a new sandbox of `shape` (which
    /// must be the checkpointed sandbox's: its disk, image and network are in the
    /// snapshot): its programs run on from where they were, with their memory; `dir`
    /// is read only while this runs.
    fn restore(&self, shape: &Shape, dir: &Path, purpose: Purpose) -> Result<Box<dyn Sandbox>, Error> {
        self.check_shape(shape)?;
        let prepared = self.prepared()?;
        crate::sandbox::SnapshotInfo::check(
            dir,
            &crate::sandbox::SnapshotInfo::of(prepared.platform, shape),
        )?;
        if !dir.join(crate::sandbox::CHECKPOINT_FILE).is_file() {
            return Err(Error::invalid(
                "snapshot",
                format!("{} holds no gVisor checkpoint", dir.display()),
            ));
        }
        let background = matches!(purpose, Purpose::Pool { behind: true });
        let sandbox = GvisorSandbox::create(prepared, shape, background, false, Some(dir))?;
        Ok(Box::new(sandbox))
    }

    fn pool_builders(&self) -> usize {
        2
    }
}
