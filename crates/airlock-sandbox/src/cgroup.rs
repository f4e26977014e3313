//! Per-sandbox cgroups, on cgroup v2 and on v1/hybrid hosts.
//!
//! Every sandbox gets one directory in every cgroup hierarchy it uses:
//!
//! ```text
//! <parent>/airlock/<owner>/<sandbox_id>
//! ```
//!
//! where `<owner>` is `<supervisor pid>-<start time>` (field 22 of `/proc/<pid>/stat`), so a
//! daemon that starts after a crash can tell its predecessor's leftovers from the live
//! sandboxes of another daemon, even when the dead daemon's pid has been recycled
//! ([`CgroupHost::purge_stale`]).
//!
//! `<parent>` is chosen per hierarchy by [`CgroupParent`] (`--cgroup-parent`):
//!
//! - **auto** (the default): this process's own cgroup when it is *delegated* to it, so the
//!   limits of the systemd unit or container airlock runs in also bound its sandboxes; the
//!   hierarchy's root otherwise (root only: an ordinary user without a delegated cgroup
//!   gets [`CgroupError::NotDelegated`]). Delegated means, on v2: the own cgroup carries
//!   the `trusted.delegate` or `user.delegate` xattr (systemd's `Delegate=yes`), or it is
//!   the root of a cgroup namespace other than the host's (a container) and writable, or
//!   this process is not root and owns it. On v1/hybrid: the root of a cgroup namespace
//!   other than the host's; for a non-root process, the own cgroup of each of `memory`,
//!   `pids` and `cpu` is not the hierarchy's root and is owned by and writable for this
//!   euid (what `chown` by root delegates; `cpuacct`, `freezer` and the unified cgroup2 are
//!   used only where they are delegated too); for root, the xattr above on the own cgroup
//!   of the unified cgroup2 hierarchy (systemd puts it there on hybrid hosts) with the own
//!   `memory`, `pids` and `cpu` cgroups below their roots.
//! - **root**: `<hierarchy root>/airlock/...`, as before parents existed.
//! - **PATH**: the cgroup PATH (e.g. `/airlock.slice`) in every hierarchy, created when
//!   missing (and never removed: it is the operator's). For a non-root process it must be
//!   its own in `memory`, `pids` and `cpu`; the optional hierarchies are used where it is.
//!
//! On v2, a process in the `supervisor` leaf of a cgroup (see below) counts as in that
//! cgroup, so a later airlock started from a moved process finds the same parent.
//!
//! [`CgroupHost::describe_parent`] says which, for `airlock doctor`.
//!
//! Two layouts are supported, detected from `/proc/self/mountinfo`:
//!
//! - **v2**: `memory`, `pids` and `cpu` live on the cgroup2 hierarchy. They are enabled in
//!   `cgroup.subtree_control` of the parent (and, for the root or a PATH, of every level
//!   from the hierarchy's root down to it), of `airlock` and of the owner directory; the
//!   sandbox directory gets `memory.max`, `memory.swap.max = 0`, `pids.max` and `cpu.max`.
//!   A delegated own cgroup holds this process, and v2 lets no cgroup with processes
//!   enable controllers for its children: before the first sandbox, every process in it
//!   moves to the leaf `<own>/supervisor`.
//! - **v1 / hybrid**: one v1 hierarchy per controller (or co-mounted ones, such as
//!   `cpu,cpuacct`). `memory`, `pids` and `cpu` are required; `cpuacct` (CPU time),
//!   `freezer` (race-free kill) and a controller-less cgroup2 (`cgroup.kill`,
//!   `CLONE_INTO_CGROUP`) are used when present.
//!
//! A [`Cgroup`] owns its directories: [`Cgroup::destroy`] (or `Drop`, best effort) kills
//! every process in it, waits until they are gone and removes the directories.
//!
//! ```no_run
//! use airlock_sandbox::cgroup::{CgroupHost, CgroupLimits};
//!
//! # fn main() -> Result<(), airlock_sandbox::cgroup::CgroupError> {
//! let host = CgroupHost::detect()?;
//! println!("cgroups: {}", host.describe());
//! println!("cgroup parent: {}", host.describe_parent());
//! host.purge_stale();
//! let limits = CgroupLimits { memory_bytes: 256 << 20, cpus: 0.5, pids: 65 };
//! let cgroup = host.create("sb-1", &limits)?;
//! let child = std::process::Command::new("true").spawn().expect("spawn");
//! cgroup.attach(child.id() as i32, false)?;
//! println!("{:?}", cgroup.usage());
//! cgroup.destroy()?;
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// Name of the directory that holds every airlock cgroup in a hierarchy.
const AIRLOCK_DIR: &str = "airlock";
/// CFS period for the CPU quota: 100 ms, the kernel default, so `cpus` maps to
/// `quota = cpus * period` with a resolution of 1 % of a core.
const CPU_PERIOD_US: u64 = 100_000;
/// The kernel rejects CFS quotas below 1 ms.
const MIN_CPU_QUOTA_US: u64 = 1_000;
/// Controllers a v2 sandbox needs, in the order they are enabled.
const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
/// Controllers a v1 sandbox cannot run without: we never isolate less than asked.
const V1_REQUIRED: [&str; 3] = ["memory", "pids", "cpu"];
/// v1 controllers used, in attach order (memory first, so charges start early).
const V1_USED: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];
/// Every v1 controller name the kernel knows; other super options (`rw`, `name=systemd`,
/// `noprefix`, `clone_children`, ...) are not controllers.
const V1_KNOWN: [&str; 15] = [
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "blkio",
    "perf_event",
    "net_prio",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
    "debug",
];
/// How long `destroy` waits for killed processes to leave the cgroup: SIGKILL'd tasks exit
/// in microseconds unless stuck in uninterruptible sleep; past this we report instead of
/// hanging the supervisor.
const DESTROY_WAIT: Duration = Duration::from_secs(2);
/// How long the v1 freezer may stay in FREEZING before we signal anyway (tasks in
/// uninterruptible sleep delay freezing; SIGKILL reaches them when they wake up).
const FREEZE_WAIT: Duration = Duration::from_millis(500);
/// Bound on the SIGKILL loop in `kill`: a fork bomb cannot outrun repeated sweeps with
/// pids.max in place, and `destroy` keeps sweeping while it waits.
const KILL_LOOP_WAIT: Duration = Duration::from_secs(1);
/// Sandbox ids are path components in cgroupfs; bounded so paths stay far below PATH_MAX.
const MAX_ID_LEN: usize = 128;
/// The leaf of a delegated v2 cgroup that its own processes move to, so that controllers
/// can be enabled for its children (v2 lets no cgroup with processes do that).
const SUPERVISOR_DIR: &str = "supervisor";
/// A process forked while the others move out lands in the old cgroup; this many rounds
/// of moving catch it (the daemon forks nothing else while its first sandbox is set up).
const EVACUATE_ROUNDS: usize = 4;
/// Inode number of the host's (initial) cgroup namespace, fixed by the kernel
/// (`PROC_CGROUP_INIT_INO`, include/linux/proc_ns.h).
const HOST_CGROUP_NS_INO: u64 = 0xEFFF_FFFB;
/// The xattrs systemd sets on a cgroup it delegates (`Delegate=yes`): `trusted.` from the
/// system manager, `user.` from a user's manager.
const DELEGATE_XATTRS: [&str; 2] = ["trusted.delegate", "user.delegate"];
/// How an ordinary user gets a delegated cgroup on v2.
const HOW_V2: &str = "run airlock in a cgroup delegated to you, e.g. `systemd-run --user --scope -p Delegate=yes airlock ...` \
     or a systemd unit with Delegate=yes (see docs/cgroups.md)";
/// How an ordinary user gets a delegated cgroup on v1 (root makes it).
const HOW_V1: &str = "as root, make a directory in each of the memory, pids and cpu hierarchies (and cpuacct, \
     freezer, unified where mounted) and `chown -R` it to this user; then move the user's shell into it \
     (`echo $$ > DIR/cgroup.procs` in each), or pass `--cgroup-parent /DIR`; see docs/cgroups.md";

/// Where sandbox cgroups go in each hierarchy (`--cgroup-parent`; see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CgroupParent {
    /// Under this process's own cgroup when it is delegated to it, else at the hierarchy's
    /// root (for root; an ordinary user gets [`CgroupError::NotDelegated`]).
    #[default]
    Auto,
    /// At the hierarchy's root, whatever this process's own cgroup is.
    Root,
    /// This cgroup path (absolute, as `/proc/self/cgroup` writes them: `/airlock.slice`)
    /// in every hierarchy; created when missing.
    Path(PathBuf),
}

impl FromStr for CgroupParent {
    type Err = String;

    /// `auto`, `root`, or an absolute cgroup path without `.` or `..` components.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(CgroupParent::Auto),
            "root" => Ok(CgroupParent::Root),
            _ if s.starts_with('/') && s.split('/').all(|part| part != "." && part != "..") => {
                Ok(CgroupParent::Path(PathBuf::from(s)))
            }
            _ => Err(format!(
                "expected auto, root or an absolute cgroup path such as /airlock.slice (no . or ..), not {s:?}"
            )),
        }
    }
}

impl fmt::Display for CgroupParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CgroupParent::Auto => f.write_str("auto"),
            CgroupParent::Root => f.write_str("root"),
            CgroupParent::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// The parent [`CgroupHost::detect`] uses ([`set_parent`]).
static PARENT: Mutex<CgroupParent> = Mutex::new(CgroupParent::Auto);

/// Sets the parent every later [`CgroupHost::detect`] of this process uses (the command
/// line's `--cgroup-parent`, before any engine starts). The default is
/// [`CgroupParent::Auto`].
pub fn set_parent(parent: CgroupParent) {
    *PARENT.lock().unwrap_or_else(PoisonError::into_inner) = parent;
}

/// The parent [`CgroupHost::detect`] uses.
pub fn parent() -> CgroupParent {
    PARENT.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// Why sandbox cgroups go where they go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParentKind {
    /// At each hierarchy's root (`<mount>/airlock/...`): outside this process's own
    /// cgroup, so the limits of the unit or container it runs in do not cover sandboxes.
    HostRoot,
    /// Under this process's own cgroup, delegated to it; says how that was told.
    Delegated(String),
    /// Under the cgroup path given with `--cgroup-parent`.
    Explicit,
}

/// Resource caps applied to one sandbox's cgroup.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CgroupLimits {
    /// Memory cap in bytes (swap is disabled: memory+swap gets the same cap).
    pub memory_bytes: u64,
    /// CPU quota in cores (0.5 = half of one core).
    pub cpus: f64,
    /// Maximum number of processes plus threads; already includes airlock's init.
    pub pids: u32,
}

/// Resource usage of one sandbox, read from its cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Highest memory charge seen, in bytes (current charge where the kernel keeps no peak).
    pub memory_peak_bytes: u64,
    /// CPU time consumed by every process of the sandbox, in nanoseconds.
    pub cpu_ns: u64,
    /// Processes killed by the OOM killer inside the sandbox.
    pub oom_kills: u64,
}

/// What went wrong while detecting, creating, using or removing cgroups.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// `/proc/self/mountinfo` could not be read.
    #[error("cannot read mount table {path}")]
    ReadMountinfo {
        /// The mount table read.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Neither a `cgroup` nor a `cgroup2` file system is mounted.
    #[error("no cgroup file system is mounted (no cgroup or cgroup2 entry in the mount table)")]
    NoCgroupFs,
    /// This process's cgroups could not be read from `/proc/self/cgroup`.
    #[error("cannot read the cgroups of this process from {path}")]
    ReadOwnCgroup {
        /// The file read.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// This process is not root and its own cgroup is not delegated to it: it may not
    /// create cgroups anywhere, and it never runs a sandbox without them.
    #[error(
        "no cgroup is delegated to uid {uid}: {dir} ({hierarchy}) is not owned by and writable for it; {how}"
    )]
    NotDelegated {
        /// The directory that would have to be delegated.
        dir: PathBuf,
        /// Its hierarchy (`cgroup2`, or the v1 controllers, e.g. `memory`).
        hierarchy: String,
        /// This process's effective uid.
        uid: u32,
        /// How to delegate one.
        how: &'static str,
    },
    /// Our own start time could not be read from `/proc/self/stat`.
    #[error("cannot read the start time of this process from {path}")]
    ReadOwnStat {
        /// The stat file read.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A controller needed to enforce the limits is not available on this host.
    #[error("cgroup controller `{controller}` is not available: {detail}")]
    MissingController {
        /// The controller (`memory`, `pids` or `cpu`).
        controller: &'static str,
        /// Where we looked.
        detail: String,
    },
    /// The sandbox id cannot be used as a cgroup directory name.
    #[error(
        "invalid sandbox id {id:?}: use 1 to {MAX_ID_LEN} characters from [A-Za-z0-9._-], not starting with '.'"
    )]
    InvalidId {
        /// The rejected id.
        id: String,
    },
    /// A limit is out of range.
    #[error("invalid cgroup limit: {reason}")]
    InvalidLimits {
        /// What is wrong.
        reason: String,
    },
    /// A cgroup directory could not be created.
    #[error("cannot create cgroup directory {path}")]
    Mkdir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A cgroup interface file could not be written.
    #[error("cannot write {value:?} to {path}")]
    Write {
        /// The interface file.
        path: PathBuf,
        /// The value written.
        value: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A cgroup interface file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The interface file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The cgroup2 directory could not be opened for `CLONE_INTO_CGROUP`.
    #[error("cannot open cgroup directory {path}")]
    OpenDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A process could not be moved into the cgroup.
    #[error("cannot attach pid {pid} to {path}")]
    Attach {
        /// The process.
        pid: i32,
        /// The `cgroup.procs` file written.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A process of the cgroup could not be sent SIGKILL.
    #[error("cannot kill pid {pid} of {path}")]
    Signal {
        /// The process.
        pid: i32,
        /// The cgroup it was listed in.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Processes were still in the cgroup when the wait in `destroy` ran out.
    #[error("processes {pids:?} still in {path} after {waited:?}")]
    StillPopulated {
        /// The cgroup directory.
        path: PathBuf,
        /// The pids left.
        pids: Vec<i32>,
        /// How long we waited.
        waited: Duration,
    },
    /// A cgroup directory could not be removed.
    #[error("cannot remove cgroup directory {path}")]
    Rmdir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl CgroupError {
    /// True when the failure was a missing path: a concurrent `destroy` may have removed
    /// the owner directory between our `mkdir` steps.
    fn is_not_found(&self) -> bool {
        match self {
            CgroupError::Mkdir { source, .. }
            | CgroupError::Write { source, .. }
            | CgroupError::Read { source, .. } => source.kind() == io::ErrorKind::NotFound,
            _ => false,
        }
    }
}

/// How directories and signals behave: on a real cgroupfs, or on a fake one made of plain
/// directories and files (unit tests).
///
/// A fake cgroupfs differs from the kernel's in four ways, each handled here and nowhere
/// else: a new directory does not get interface files by itself (we give it an empty copy
/// of every file the test put in the hierarchy's root, as the kernel populates a new cgroup
/// with the files its hierarchy offers); `rmdir` does not ignore those files (we remove
/// the tree); a pid written to a `cgroup.procs` stays listed in the one it left (we empty
/// that one); and the pids in its `cgroup.procs` are made up, so no signal is ever sent
/// and no wait is done. Everything else (every read and every write, with no-create
/// semantics) runs the same code on both. The mode is chosen by `statfs` of the mount
/// point, so a real cgroupfs can never be treated as a fake one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fs {
    /// A kernel cgroup or cgroup2 file system.
    Real,
    /// Plain directories standing in for one.
    Fake,
}

impl Fs {
    /// Picks the mode for a mount point (see [`Fs`]); an unreadable mount point counts as
    /// real, so that its errors surface instead of being simulated away.
    fn of(mount: &Path) -> Fs {
        use nix::sys::statfs::{CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, statfs};
        match statfs(mount) {
            Ok(st) => {
                let t = st.filesystem_type();
                if t == CGROUP_SUPER_MAGIC || t == CGROUP2_SUPER_MAGIC {
                    Fs::Real
                } else {
                    Fs::Fake
                }
            }
            Err(_) => Fs::Real,
        }
    }

    /// Creates one cgroup directory below `mount` (EEXIST is returned to the caller).
    fn mkdir(self, path: &Path, mount: &Path) -> io::Result<()> {
        fs::create_dir(path)?;
        if self == Fs::Fake {
            for entry in fs::read_dir(mount)?.flatten() {
                if entry.file_type()?.is_file() {
                    fs::File::create(path.join(entry.file_name()))?;
                }
            }
        }
        Ok(())
    }

    /// Every process listed in the `cgroup.procs` file `procs` was moved elsewhere.
    fn moved_out(self, procs: &Path) {
        if self == Fs::Fake {
            let _ = fs::write(procs, "");
        }
    }

    /// Removes a sandbox cgroup and any child cgroups below it (deepest first).
    fn rmdir_tree(self, path: &Path) -> io::Result<()> {
        let result = match self {
            Fs::Fake => fs::remove_dir_all(path),
            Fs::Real => {
                // Most have no child: one rmdir, no listing.
                match fs::remove_dir(path) {
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::ENOTEMPTY)) => {}
                    other => {
                        return other.or_else(|e| {
                            if e.kind() == io::ErrorKind::NotFound {
                                Ok(())
                            } else {
                                Err(e)
                            }
                        });
                    }
                }
                // Interface files cannot (and need not) be removed; child cgroups must go
                // first, or rmdir fails with EBUSY.
                for entry in fs::read_dir(path)?.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        self.rmdir_tree(&entry.path())?;
                    }
                }
                fs::remove_dir(path)
            }
        };
        match result {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// Removes a parent directory (`airlock/<owner>`) if no cgroup is left below it; busy
    /// or already removed is fine: another sandbox of the same owner still lives there.
    fn rmdir_if_childless(self, path: &Path) {
        match self {
            Fs::Real => {
                let _ = fs::remove_dir(path);
            }
            Fs::Fake => {
                let has_child = fs::read_dir(path)
                    .is_ok_and(|entries| entries.flatten().any(|e| e.file_type().is_ok_and(|t| t.is_dir())));
                if !has_child {
                    let _ = fs::remove_dir_all(path);
                }
            }
        }
    }
}

/// One v1 hierarchy: where it is mounted and which controllers it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
struct V1Hierarchy {
    mount: PathBuf,
    /// The cgroup shown at `mount` (`/` unless only a sub-tree is mounted).
    root: PathBuf,
    controllers: Vec<String>,
}

/// Where this host's sandbox cgroups go, and why (see [`CgroupParent`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placement {
    /// `(mount point, parent directory)` of each hierarchy used: sandboxes go in
    /// `<parent>/airlock/<owner>/<id>`.
    bases: Vec<(PathBuf, PathBuf)>,
    /// Why there.
    kind: ParentKind,
    /// v2: the highest level whose `cgroup.subtree_control` we write, down to the parent
    /// (the hierarchy's root for `root` and a PATH; the parent itself when delegated, as
    /// the levels above belong to whoever delegated it). Its `cgroup.controllers` says
    /// what sandboxes can get.
    enable_from: Option<PathBuf>,
    /// v2: the parent is this process's own cgroup; its processes move to its
    /// `supervisor` leaf before controllers are enabled in it.
    evacuate: bool,
    /// Optional hierarchies left out because they are not delegated to this (non-root)
    /// process.
    left_out: Vec<Hier>,
}

impl Placement {
    /// Each hierarchy's root: the layout of `--cgroup-parent root`.
    fn at_roots(hiers: &[Hier], kind: ParentKind, v2: bool) -> Placement {
        Placement {
            bases: hiers.iter().map(|h| (h.mount.clone(), h.mount.clone())).collect(),
            kind,
            enable_from: hiers.iter().find(|h| v2 && h.cgroup2).map(|h| h.mount.clone()),
            evacuate: false,
            left_out: Vec::new(),
        }
    }
}

/// One hierarchy sandboxes may use, as seen by [`CgroupHost::layout`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hier {
    /// Its mount point.
    mount: PathBuf,
    /// `cgroup2`, or the v1 controllers (`cpu,cpuacct`): for messages.
    name: String,
    /// This process's own cgroup directory in it (`None`: not below the mount).
    own: Option<PathBuf>,
    /// The own cgroup is `/`: the hierarchy's root, or a cgroup namespace's.
    own_is_ns_root: bool,
    /// Carries memory, pids or cpu where sandboxes take them from.
    required: bool,
    /// The cgroup2 hierarchy.
    cgroup2: bool,
}

/// What, beside the tables, decides where sandboxes may go.
#[derive(Debug, Clone, Copy)]
struct Identity {
    /// This process's effective uid.
    euid: u32,
    /// In the host's (initial) cgroup namespace.
    host_cgroupns: bool,
}

impl Identity {
    fn current() -> Identity {
        Identity {
            euid: nix::unistd::geteuid().as_raw(),
            // Unreadable: a kernel without cgroup namespaces, so the host's.
            host_cgroupns: fs::metadata("/proc/self/ns/cgroup")
                .ok()
                .is_none_or(|m| m.ino() == HOST_CGROUP_NS_INO),
        }
    }

    fn root(self) -> bool {
        self.euid == 0
    }
}

/// One hierarchy a sandbox gets a directory in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    /// Mount point of the hierarchy.
    mount: PathBuf,
    /// The parent directory of `airlock/` in it (see [`CgroupParent`]).
    base: PathBuf,
    /// Controllers of ours it serves (memory, pids, cpu, cpuacct, freezer).
    controllers: Vec<&'static str>,
    /// True for the cgroup2 hierarchy (v2, or the unified one on hybrid hosts).
    cgroup2: bool,
}

/// The cgroup layout of this host, as detected from the mount table.
#[derive(Debug, Clone)]
pub struct CgroupHost {
    /// Real cgroupfs, or a fake one in a temp dir (unit tests).
    fs: Fs,
    /// `<pid>-<start time>` of this process: names the directories we create.
    owner: String,
    /// v1 hierarchies carrying at least one controller, in mount order.
    v1: Vec<V1Hierarchy>,
    /// The cgroup2 mount point, if any.
    cgroup2: Option<PathBuf>,
    /// Controllers the cgroup2 root offers (its `cgroup.controllers`).
    cgroup2_controllers: Vec<String>,
    /// True when memory, pids and cpu are on cgroup2 (no v1 hierarchy carries them).
    v2: bool,
    /// A hybrid host whose cgroup2 has `cgroup.kill` (Linux >= 5.14, so `cgroup.freeze`
    /// and `cpu.stat` too): the sandbox's cgroup2 directory then kills, freezes and counts
    /// CPU time, and the v1 `freezer` and `cpuacct` hierarchies are not used. Each v1
    /// directory costs a mkdir, an attach and an rmdir per sandbox.
    cgroup2_suffices: bool,
    /// Where sandboxes go in each hierarchy.
    placement: Placement,
    /// The v1 directories of purged sandboxes, kept for the next ones (see [`Spares`]).
    spares: std::sync::Arc<Mutex<Spares>>,
}

/// The v1 directories of sandboxes that ended cleanly, kept (renamed `.spare-N`) for the
/// next sandboxes of this process instead of being removed and made again: a memory
/// cgroup's creation and, above all, its removal (offlining walks every shrinker of the
/// host, one per mounted file system) are the largest part of a sandbox's cgroup cost.
/// Only v1 directories can be renamed (cgroup2 has no rename), so only they are kept, and
/// only for a service ([`CgroupHost::keep_spares`]); [`CgroupHost::release_spares`]
/// removes them, and a crashed owner's are purged like its sandboxes.
///
/// What a sandbox leaves in its directory never reaches the next one's results: every
/// process is gone before a directory is kept (else it is removed), the limits and the
/// CPU share are written afresh, the peak is reset, and the counters the results read
/// (CPU time, OOM kills) are read as differences. Programs cannot reach cgroup files
/// (no cgroupfs is mounted in a sandbox). Page cache a sandbox's programs read stays
/// charged to the directory until reclaimed, as it would stay charged to the parent.
#[derive(Debug, Default)]
struct Spares {
    /// At most this many sets are kept (0: none).
    max: usize,
    /// One set per purged sandbox: its v1 directories, in plan order.
    sets: Vec<Vec<SandboxDir>>,
    /// Names the next spare.
    next: u64,
}

/// A cgroup mount found in the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CgMount {
    /// Mount point, unescaped.
    point: PathBuf,
    /// The cgroup shown at the mount point (mountinfo's root field, unescaped).
    root: PathBuf,
    /// True when the mount shows the whole hierarchy (its root field is `/`).
    full: bool,
    /// `None` for cgroup2, the controllers for a v1 hierarchy.
    v1_controllers: Option<Vec<String>>,
}

/// Undoes the octal escapes (`\040` for a space, ...) of a mountinfo path.
fn unescape_mountinfo(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal.map(|d| d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'))) {
            Some(v) if v <= 0xff => {
                out.push(v as u8);
                i += 4;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// Extracts the cgroup and cgroup2 mounts from a `/proc/<pid>/mountinfo` text.
///
/// A line is `id parent maj:min root mount_point options [optional...] - fstype source
/// super_options`; v1 super options name the controllers (`rw,cpu,cpuacct`).
fn parse_mountinfo(text: &str) -> Vec<CgMount> {
    let mut mounts = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().skip(6).position(|f| *f == "-").map(|p| p + 6) else {
            continue;
        };
        let (Some(root), Some(point), Some(fstype), Some(super_opts)) = (
            fields.get(3),
            fields.get(4),
            fields.get(sep + 1),
            fields.get(sep + 3),
        ) else {
            continue;
        };
        let v1_controllers = match *fstype {
            "cgroup2" => None,
            "cgroup" => Some(
                super_opts
                    .split(',')
                    .filter(|o| V1_KNOWN.contains(o))
                    .map(str::to_owned)
                    .collect(),
            ),
            _ => continue,
        };
        mounts.push(CgMount {
            point: unescape_mountinfo(point),
            root: unescape_mountinfo(root),
            full: *root == "/",
            v1_controllers,
        });
    }
    mounts
}

/// The lines of a `/proc/<pid>/cgroup` text, `id:controllers:path`, as (controllers,
/// path); cgroup2's line has no controllers.
fn parse_proc_cgroup(text: &str) -> Vec<(Vec<&str>, &str)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            let controllers = controllers.split(',').filter(|c| !c.is_empty()).collect();
            Some((controllers, path))
        })
        .collect()
}

/// The directory of cgroup `path` in a hierarchy mounted at `mount` showing cgroup
/// `root`; `None` when the mount does not show it (a sub-tree mount elsewhere).
fn cgroup_dir(mount: &Path, root: &Path, path: &str) -> Option<PathBuf> {
    let rel = Path::new(path).strip_prefix(root).ok()?;
    if rel.as_os_str().is_empty() {
        return Some(mount.to_owned());
    }
    rel.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then(|| mount.join(rel))
}

/// The delegate xattr on `dir`, if any (set and not `0`).
fn delegate_xattr(dir: &Path) -> Option<&'static str> {
    DELEGATE_XATTRS.into_iter().find(|name| {
        let mut value = [0u8; 16];
        rustix::fs::getxattr(dir, *name, &mut value[..]).is_ok_and(|n| value[..n] != *b"0")
    })
}

/// Whether this euid may create cgroups in `dir`: it owns it and may write there.
fn owned_and_writable(dir: &Path, euid: u32) -> bool {
    fs::metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == euid) && writable(dir)
}

/// Whether this process may write in `dir` (a read-only mount says no).
fn writable(dir: &Path) -> bool {
    may_create_in(dir).is_ok()
}

/// `faccessat(dir, W_OK|X_OK, AT_EACCESS)`: whether this euid may create entries in `dir`.
fn may_create_in(dir: &Path) -> io::Result<()> {
    use nix::unistd::{AccessFlags, faccessat};
    faccessat(
        nix::fcntl::AT_FDCWD,
        dir,
        AccessFlags::W_OK | AccessFlags::X_OK,
        nix::fcntl::AtFlags::AT_EACCESS,
    )
    .map_err(io::Error::from)
}

/// Decides where sandboxes go in each of `hiers` (see [`CgroupParent`] and the module
/// docs): the parent asked for, or for `auto`, this process's own cgroup when it is
/// delegated to it.
fn place(parent: &CgroupParent, hiers: &[Hier], v2: bool, who: Identity) -> Result<Placement, CgroupError> {
    let own_dirs = |hiers: &[Hier]| -> Vec<(PathBuf, PathBuf)> {
        hiers
            .iter()
            .map(|h| (h.mount.clone(), h.own.clone().unwrap_or_else(|| h.mount.clone())))
            .collect()
    };
    // A non-root process can create cgroups only in directories it owns, and (cgroup2)
    // move its processes only below a cgroup whose `cgroup.procs` it may write.
    let not_delegated = |h: &Hier| CgroupError::NotDelegated {
        dir: h.own.clone().unwrap_or_else(|| h.mount.clone()),
        hierarchy: h.name.clone(),
        uid: who.euid,
        how: if v2 { HOW_V2 } else { HOW_V1 },
    };
    let path = match parent {
        CgroupParent::Root => return Ok(Placement::at_roots(hiers, ParentKind::HostRoot, v2)),
        CgroupParent::Path(path) => path,
        CgroupParent::Auto => return place_auto(hiers, v2, who, own_dirs, not_delegated),
    };
    let rel = path.strip_prefix("/").unwrap_or(path);
    let bases: Vec<(PathBuf, PathBuf)> = hiers
        .iter()
        .map(|h| (h.mount.clone(), h.mount.join(rel)))
        .collect();
    let base_of = |h: &Hier| h.mount.join(rel);
    // On v2 this process's own cgroup may be the parent given: it must leave it first.
    let evacuate = v2
        && hiers.iter().any(|h| {
            h.cgroup2 && h.own.as_ref() == Some(&base_of(h)) && !(who.host_cgroupns && h.own_is_ns_root)
        });
    // An ordinary user creates cgroups only in directories it owns: the parent must be
    // one in every hierarchy it needs, and optional hierarchies are used only where it is.
    // It also moves processes in cgroup2 only below a cgroup it may write: the unified
    // hierarchy of a hybrid host is used only when its own cgroup is inside the parent.
    let mut left_out = Vec::new();
    if !who.root() {
        for h in hiers {
            let base = base_of(h);
            let usable = owned_and_writable(&base, who.euid)
                && !(h.cgroup2 && !v2 && !h.own.as_ref().is_some_and(|o| o.starts_with(&base)));
            if usable {
                continue;
            }
            if h.required {
                return Err(CgroupError::NotDelegated {
                    dir: base,
                    hierarchy: h.name.clone(),
                    uid: who.euid,
                    how: if v2 { HOW_V2 } else { HOW_V1 },
                });
            }
            // Shown as the directory that was not the user's.
            left_out.push(Hier {
                own: Some(base),
                ..h.clone()
            });
        }
    }
    Ok(Placement {
        bases,
        kind: ParentKind::Explicit,
        enable_from: hiers.iter().find(|h| v2 && h.cgroup2).map(|h| h.mount.clone()),
        evacuate,
        left_out,
    })
}

/// [`place`] for [`CgroupParent::Auto`].
fn place_auto(
    hiers: &[Hier],
    v2: bool,
    who: Identity,
    own_dirs: impl Fn(&[Hier]) -> Vec<(PathBuf, PathBuf)>,
    not_delegated: impl Fn(&Hier) -> CgroupError,
) -> Result<Placement, CgroupError> {
    let delegated = |why: String, left_out: Vec<Hier>| Placement {
        bases: own_dirs(hiers),
        kind: ParentKind::Delegated(why),
        enable_from: hiers
            .iter()
            .find(|h| v2 && h.cgroup2)
            .map(|h| h.own.clone().unwrap_or_else(|| h.mount.clone())),
        evacuate: v2,
        left_out,
    };
    let below_root = |h: &Hier| h.own.as_ref().is_some_and(|o| *o != h.mount);
    let usable = |h: &Hier| {
        h.own.as_deref().is_some_and(|o| {
            if who.root() {
                writable(o)
            } else {
                owned_and_writable(o, who.euid)
            }
        })
    };
    let ns_why = "this process is at the root of a cgroup namespace (a container's)";
    let required: Vec<&Hier> = hiers.iter().filter(|h| h.required).collect();
    // Optional hierarchies (cpuacct, freezer, a hybrid host's cgroup2) are used where they
    // are delegated too, and left out otherwise.
    let optional_left_out = |ns: bool| -> Vec<Hier> {
        hiers
            .iter()
            .filter(|h| !h.required && !(usable(h) && (ns || who.root() || below_root(h))))
            .cloned()
            .collect()
    };

    if v2 {
        let Some(h) = hiers.iter().find(|h| h.cgroup2) else {
            return Ok(Placement::at_roots(hiers, ParentKind::HostRoot, v2));
        };
        let own = h.own.as_deref();
        let marker = own.and_then(|o| delegate_xattr(o).map(|x| (o, x)));
        let why = if let Some((dir, name)) = marker.filter(|_| who.root() || usable(h)) {
            Some(format!(
                "{name} xattr on {} (systemd Delegate=yes)",
                dir.display()
            ))
        } else if !who.host_cgroupns && h.own_is_ns_root && usable(h) {
            Some(ns_why.to_owned())
        } else if !who.root() && below_root(h) && usable(h) {
            Some(format!(
                "{} is owned by uid {}",
                own.unwrap_or(&h.mount).display(),
                who.euid
            ))
        } else {
            None
        };
        return match why {
            Some(why) => Ok(delegated(why, Vec::new())),
            None if who.root() => Ok(Placement::at_roots(hiers, ParentKind::HostRoot, v2)),
            None => Err(not_delegated(h)),
        };
    }

    // v1 / hybrid.
    if !who.host_cgroupns && required.iter().all(|h| h.own_is_ns_root && usable(h)) {
        return Ok(delegated(ns_why.to_owned(), optional_left_out(true)));
    }
    if who.root() {
        let marker = hiers
            .iter()
            .find(|h| h.cgroup2)
            .and_then(|h| h.own.as_deref())
            .and_then(|o| delegate_xattr(o).map(|x| (o, x)));
        return Ok(match marker {
            Some((dir, name)) if required.iter().all(|h| below_root(h)) => delegated(
                format!("{name} xattr on {} (systemd Delegate=yes)", dir.display()),
                Vec::new(),
            ),
            _ => Placement::at_roots(hiers, ParentKind::HostRoot, v2),
        });
    }
    if let Some(h) = required.iter().find(|h| !(below_root(h) && usable(h))) {
        return Err(not_delegated(h));
    }
    let names: Vec<&str> = required.iter().map(|h| h.name.as_str()).collect();
    Ok(delegated(
        format!(
            "this process's {} cgroups are owned by uid {}",
            names.join(", "),
            who.euid
        ),
        optional_left_out(false),
    ))
}

/// Field 22 (start time, in clock ticks since boot) of a `/proc/<pid>/stat` text.
fn parse_start_time(stat: &str) -> Option<u64> {
    // comm (field 2) may contain spaces and parentheses: fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3 (state), so field 22 is its 20th word.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// `<pid>-<start time>` of this process.
fn own_owner() -> Result<String, CgroupError> {
    let path = PathBuf::from("/proc/self/stat");
    let stat = fs::read_to_string(&path).map_err(|source| CgroupError::ReadOwnStat {
        path: path.clone(),
        source,
    })?;
    let start = parse_start_time(&stat).ok_or_else(|| CgroupError::ReadOwnStat {
        path,
        source: io::Error::new(io::ErrorKind::InvalidData, "no start time (field 22)"),
    })?;
    Ok(format!("{}-{start}", std::process::id()))
}

/// Parses an owner directory name, `<pid>-<start time>`.
fn parse_owner(name: &str) -> Option<(u32, u64)> {
    let (pid, start) = name.split_once('-')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// True unless the owner is certainly gone: `/proc/<pid>` missing, or its start time
/// differs (the pid was recycled). Unreadable for another reason counts as alive, so a
/// live daemon's sandboxes are never purged by mistake.
fn owner_alive(pid: u32, start: u64) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(e) => !matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)),
        Ok(stat) => parse_start_time(&stat).is_none_or(|s| s == start),
    }
}

fn validate_id(id: &str) -> Result<(), CgroupError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(CgroupError::InvalidId { id: id.to_owned() })
    }
}

fn validate_limits(limits: &CgroupLimits) -> Result<(), CgroupError> {
    let reason = if limits.memory_bytes == 0 {
        "memory must be at least 1 byte".to_owned()
    } else if limits.pids == 0 {
        "pids must be at least 1 (airlock's init counts)".to_owned()
    } else if !(limits.cpus.is_finite() && limits.cpus > 0.0) {
        format!("cpus must be a positive number, not {}", limits.cpus)
    } else {
        return Ok(());
    };
    Err(CgroupError::InvalidLimits { reason })
}

/// The CFS quota for `cpus` cores, in microseconds per [`CPU_PERIOD_US`].
fn cpu_quota_us(cpus: f64) -> u64 {
    // `as` saturates on overflow; the kernel then rejects an absurd quota with a clear
    // write error naming the value.
    ((cpus * CPU_PERIOD_US as f64).round() as u64).max(MIN_CPU_QUOTA_US)
}

/// Writes one value to a cgroup interface file. No create: a missing file is an error,
/// never a silently created regular file. Truncating is a no-op on cgroupfs and keeps
/// a fake file equal to the last value written.
fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|source| CgroupError::Write {
            path: path.to_owned(),
            value: value.to_owned(),
            source,
        })
}

fn read_file(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The pids in a `cgroup.procs` file; a removed cgroup has none.
fn read_pids(procs: &Path) -> Result<Vec<i32>, CgroupError> {
    match fs::read_to_string(procs) {
        Ok(text) => Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(CgroupError::Read {
            path: procs.to_owned(),
            source,
        }),
    }
}

/// A number from a one-value file, or from the `key value` line of a flat-keyed file.
fn read_u64(path: &Path, key: Option<&str>) -> Option<u64> {
    parse_u64(&fs::read_to_string(path).ok()?, key)
}

/// The `total=` of the `full` line of a pressure-stall file (`memory.pressure`).
fn parse_stall_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("full "))?;
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("total="))?
        .parse()
        .ok()
}

/// [`read_u64`] of a file's text.
fn parse_u64(text: &str, key: Option<&str>) -> Option<u64> {
    match key {
        None => text.trim().parse().ok(),
        Some(key) => text.lines().find_map(|line| {
            let (k, v) = line.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok())?
        }),
    }
}

impl CgroupHost {
    /// Detects the layout of this host from `/proc/self/mountinfo` and this process's
    /// cgroups, with sandboxes under the parent set by [`set_parent`] (auto by default).
    pub fn detect() -> Result<Self, CgroupError> {
        Self::detect_with(&parent())
    }

    /// Detects the layout of this host, with sandboxes under `parent`.
    pub fn detect_with(parent: &CgroupParent) -> Result<Self, CgroupError> {
        let path = PathBuf::from("/proc/self/mountinfo");
        let mountinfo =
            fs::read_to_string(&path).map_err(|source| CgroupError::ReadMountinfo { path, source })?;
        let path = PathBuf::from("/proc/self/cgroup");
        let own = fs::read_to_string(&path).map_err(|source| CgroupError::ReadOwnCgroup { path, source })?;
        Self::layout(&mountinfo, &own, Path::new("/"), parent, Identity::current())
    }

    /// Builds the layout from a mount table, with every mount point re-rooted under
    /// `prefix` (`/` on a real host; a temp dir holding a fake cgroupfs in tests), and
    /// sandboxes at each hierarchy's root ([`CgroupParent::Root`]).
    pub fn from_mountinfo(mountinfo: &str, prefix: &Path) -> Result<Self, CgroupError> {
        Self::layout(mountinfo, "", prefix, &CgroupParent::Root, Identity::current())
    }

    /// The layout from a mount table and a `/proc/self/cgroup` text (see
    /// [`CgroupHost::from_mountinfo`]), with sandboxes under `parent` as `who` may place
    /// them.
    fn layout(
        mountinfo: &str,
        own_cgroups: &str,
        prefix: &Path,
        parent: &CgroupParent,
        who: Identity,
    ) -> Result<Self, CgroupError> {
        let mounts = parse_mountinfo(mountinfo);
        if mounts.is_empty() {
            return Err(CgroupError::NoCgroupFs);
        }
        let reroot = |p: &Path| prefix.join(p.strip_prefix("/").unwrap_or(p));
        let mut v1 = Vec::new();
        let mut cgroup2: Option<&CgMount> = None;
        for m in &mounts {
            match &m.v1_controllers {
                Some(c) if !c.is_empty() => v1.push(V1Hierarchy {
                    mount: reroot(&m.point),
                    root: m.root.clone(),
                    controllers: c.clone(),
                }),
                Some(_) => {}
                // A later mount shadows an earlier one at the same place; a mount of a
                // sub-tree (root other than `/`) only wins when nothing better exists.
                None => {
                    if cgroup2.is_none_or(|c| m.full || !c.full) {
                        cgroup2 = Some(m);
                    }
                }
            }
        }
        let v1_carries = |c: &str| v1.iter().any(|h| h.controllers.iter().any(|x| x == c));
        let v2 = cgroup2.is_some() && !V1_REQUIRED.iter().any(|c| v1_carries(c));

        // The hierarchies sandboxes may use, with this process's own cgroup in each.
        let own = parse_proc_cgroup(own_cgroups);
        let own_path = |controller: Option<&str>| {
            own.iter()
                .find(|(c, _)| match controller {
                    Some(name) => c.contains(&name),
                    None => c.is_empty(),
                })
                .map(|(_, p)| *p)
        };
        let mut hiers = Vec::new();
        if !v2 {
            for h in &v1 {
                if !h.controllers.iter().any(|c| V1_USED.contains(&c.as_str())) {
                    continue;
                }
                let path = own_path(h.controllers.first().map(String::as_str));
                hiers.push(Hier {
                    mount: h.mount.clone(),
                    name: h.controllers.join(","),
                    own: path.and_then(|p| cgroup_dir(&h.mount, &h.root, p)),
                    own_is_ns_root: path == Some("/"),
                    required: h.controllers.iter().any(|c| V1_REQUIRED.contains(&c.as_str())),
                    cgroup2: false,
                });
            }
        }
        if let Some(m) = cgroup2 {
            let mount = reroot(&m.point);
            // On v2, a process in a delegated cgroup's `supervisor` leaf was moved there
            // by airlock (or started from a shell that was moved along): the cgroup it
            // belongs to is the one above, whose `airlock/` is beside the leaf.
            let path = own_path(None).map(|p| match p.strip_suffix(SUPERVISOR_DIR) {
                Some("/") if v2 => "/",
                Some(above) if v2 && above.ends_with('/') => &above[..above.len() - 1],
                _ => p,
            });
            hiers.push(Hier {
                own: path.and_then(|p| cgroup_dir(&mount, &m.root, p)),
                mount,
                name: "cgroup2".to_owned(),
                own_is_ns_root: path == Some("/"),
                required: v2,
                cgroup2: true,
            });
        }
        let placement = place(parent, &hiers, v2, who)?;
        let left_out = |mount: &Path| placement.left_out.iter().any(|h| h.mount == mount);
        v1.retain(|h| !left_out(&h.mount));
        let cgroup2 = cgroup2.map(|m| reroot(&m.point)).filter(|m| !left_out(m));

        // What sandboxes can get: on v2, what the highest level we enable from offers.
        let controllers_of = placement.enable_from.clone().or_else(|| cgroup2.clone());
        let cgroup2_controllers = controllers_of
            .and_then(|dir| fs::read_to_string(dir.join("cgroup.controllers")).ok())
            .map(|t| t.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        let probe = cgroup2
            .clone()
            .or_else(|| v1.first().map(|h| h.mount.clone()))
            .unwrap_or_else(|| prefix.to_owned());
        let mut host = CgroupHost {
            fs: Fs::of(&probe),
            owner: own_owner()?,
            v1,
            cgroup2,
            cgroup2_controllers,
            v2,
            cgroup2_suffices: false,
            placement,
            spares: Default::default(),
        };
        host.cgroup2_suffices = !host.v2 && host.has_kill();
        Ok(host)
    }

    /// Where sandboxes go, and why ([`CgroupParent`]).
    pub fn parent_kind(&self) -> &ParentKind {
        &self.placement.kind
    }

    /// The parent directory of `airlock/` in each hierarchy used, in attach order.
    pub fn parent_dirs(&self) -> Vec<PathBuf> {
        self.plan().into_iter().map(|s| s.base).collect()
    }

    /// One line for `airlock doctor`: the parent directory in each hierarchy, and why.
    pub fn describe_parent(&self) -> String {
        let dirs: Vec<String> = self
            .parent_dirs()
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        let why = match &self.placement.kind {
            ParentKind::HostRoot => "host root".to_owned(),
            ParentKind::Delegated(why) => format!("delegated: {why}"),
            ParentKind::Explicit => "--cgroup-parent".to_owned(),
        };
        let mut line = format!("{} ({why})", dirs.join(", "));
        if !self.placement.left_out.is_empty() {
            let names: Vec<String> = self
                .placement
                .left_out
                .iter()
                .map(|h| format!("{} ({})", h.name, h.own.as_deref().unwrap_or(&h.mount).display()))
                .collect();
            line.push_str(&format!("; not delegated, so not used: {}", names.join(", ")));
        }
        line
    }

    /// The parent directory in the hierarchy mounted at `mount`.
    fn base_of(&self, mount: &Path) -> PathBuf {
        self.placement
            .bases
            .iter()
            .find(|(m, _)| m == mount)
            .map_or_else(|| mount.to_owned(), |(_, base)| base.clone())
    }

    /// True for a pure v2 host (memory, pids and cpu on cgroup2).
    pub fn is_v2(&self) -> bool {
        self.v2
    }

    /// The `<pid>-<start time>` directory name of this process's sandboxes.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Mount point of the last v1 hierarchy carrying `controller`.
    fn v1_mount(&self, controller: &str) -> Option<&Path> {
        self.v1
            .iter()
            .rev()
            .find(|h| h.controllers.iter().any(|c| c == controller))
            .map(|h| h.mount.as_path())
    }

    /// One line for `airlock doctor`.
    pub fn describe(&self) -> String {
        if self.v2 {
            let root = self.cgroup2.as_deref().unwrap_or(Path::new("?"));
            let (have, missing): (Vec<&str>, Vec<&str>) = V2_CONTROLLERS
                .iter()
                .partition(|c| self.cgroup2_controllers.iter().any(|x| x == *c));
            let mut line = format!("v2 at {} ({})", root.display(), have.join(", "));
            if !missing.is_empty() {
                line.push_str(&format!("; missing: {}", missing.join(", ")));
            }
            return line;
        }
        let (have, missing): (Vec<&str>, Vec<&str>) =
            V1_USED.iter().partition(|c| self.v1_mount(c).is_some());
        let missing: Vec<&str> = missing.into_iter().filter(|c| V1_REQUIRED.contains(c)).collect();
        let mut line = match &self.cgroup2 {
            Some(root) => {
                // Only controllers we could use matter here (a hybrid host may leave e.g.
                // hugetlb on cgroup2).
                let ours: Vec<&str> = self
                    .cgroup2_controllers
                    .iter()
                    .map(String::as_str)
                    .filter(|c| V1_USED.contains(c))
                    .collect();
                let ctl = if ours.is_empty() {
                    "no controllers".to_owned()
                } else {
                    format!("controllers: {}", ours.join(", "))
                };
                format!(
                    "hybrid: v1 {}; cgroup2 ({ctl}) at {}",
                    have.join(", "),
                    root.display()
                )
            }
            None if self.placement.left_out.iter().any(|h| h.cgroup2) => {
                format!("v1: {}; cgroup2 not used (not delegated)", have.join(", "))
            }
            None => format!("v1: {}; no cgroup2", have.join(", ")),
        };
        if !missing.is_empty() {
            line.push_str(&format!("; missing: {}", missing.join(", ")));
        }
        line
    }

    /// True when `cgroup.kill` (Linux >= 5.14) is usable. The cgroup2 root never has the
    /// file, so we look in a child cgroup: `airlock` in the parent (created if missing,
    /// as `create` would), else the parent itself, else the first few others.
    pub fn has_kill(&self) -> bool {
        let Some(root) = &self.cgroup2 else {
            return false;
        };
        let base = self.base_of(root);
        let airlock = base.join(AIRLOCK_DIR);
        let _ = self.fs.mkdir(&airlock, root);
        if airlock.join("cgroup.kill").exists() || (base != *root && base.join("cgroup.kill").exists()) {
            return true;
        }
        fs::read_dir(root).is_ok_and(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .take(16)
                .any(|e| e.path().join("cgroup.kill").exists())
        })
    }

    /// How a sandbox is paused here: cgroup2's `cgroup.freeze` (Linux >= 5.2; looked for
    /// in a child cgroup, as [`CgroupHost::has_kill`] does), else the v1 freezer; `None`
    /// when neither exists (pausing is refused).
    pub fn freezer(&self) -> Option<&'static str> {
        if let Some(root) = &self.cgroup2 {
            let base = self.base_of(root);
            let airlock = base.join(AIRLOCK_DIR);
            let _ = self.fs.mkdir(&airlock, root);
            if airlock.join("cgroup.freeze").exists()
                || (base != *root && base.join("cgroup.freeze").exists())
            {
                return Some("cgroup2 cgroup.freeze");
            }
        }
        (!self.v2 && self.v1_mount("freezer").is_some()).then_some("v1 freezer")
    }

    /// The hierarchies a sandbox gets a directory in, in attach order.
    fn plan(&self) -> Vec<Slot> {
        if self.v2 {
            return self
                .cgroup2
                .iter()
                .map(|root| Slot {
                    mount: root.clone(),
                    base: self.base_of(root),
                    controllers: V2_CONTROLLERS.to_vec(),
                    cgroup2: true,
                })
                .collect();
        }
        let mut slots: Vec<Slot> = Vec::new();
        for controller in V1_USED {
            if self.cgroup2_suffices && matches!(controller, "cpuacct" | "freezer") {
                continue;
            }
            let Some(mount) = self.v1_mount(controller) else {
                continue;
            };
            // Co-mounted controllers (`cpu,cpuacct`) share one directory.
            match slots.iter_mut().find(|s| s.mount == mount) {
                Some(slot) => slot.controllers.push(controller),
                None => slots.push(Slot {
                    mount: mount.to_owned(),
                    base: self.base_of(mount),
                    controllers: vec![controller],
                    cgroup2: false,
                }),
            }
        }
        if let Some(root) = &self.cgroup2 {
            slots.push(Slot {
                mount: root.clone(),
                base: self.base_of(root),
                controllers: Vec::new(),
                cgroup2: true,
            });
        }
        slots
    }

    /// Whether sandboxes can be created here, without creating one (for preflight checks
    /// and `doctor`): every controller that enforces the limits is offered where sandboxes
    /// go, and this process may create directories in each parent (or, for a parent still
    /// to be made, in its nearest existing ancestor). The error is the one
    /// [`CgroupHost::create`] would return.
    pub fn check_usable(&self) -> Result<(), CgroupError> {
        self.check_controllers()?;
        for slot in self.plan() {
            let existing = slot
                .base
                .ancestors()
                .find(|dir| dir.is_dir())
                .unwrap_or(&slot.mount);
            may_create_in(existing).map_err(|source| CgroupError::Mkdir {
                path: slot.base.join(AIRLOCK_DIR),
                source,
            })?;
        }
        Ok(())
    }

    /// Fails unless every controller we enforce limits with is available.
    fn check_controllers(&self) -> Result<(), CgroupError> {
        if self.v2 {
            let from = self
                .placement
                .enable_from
                .as_deref()
                .or(self.cgroup2.as_deref())
                .unwrap_or(Path::new("?"));
            let hint = match self.placement.kind {
                ParentKind::Delegated(_) => {
                    " (the cgroup delegated to airlock must offer memory, pids and cpu: \
                     e.g. Delegate=memory pids cpu in its systemd unit)"
                }
                _ => "",
            };
            for controller in V2_CONTROLLERS {
                if !self.cgroup2_controllers.iter().any(|c| c == controller) {
                    return Err(CgroupError::MissingController {
                        controller,
                        detail: format!(
                            "{} does not list it{hint}",
                            from.join("cgroup.controllers").display()
                        ),
                    });
                }
            }
        } else {
            for controller in V1_REQUIRED {
                if self.v1_mount(controller).is_none() {
                    return Err(CgroupError::MissingController {
                        controller,
                        detail: "no cgroup v1 hierarchy in the mount table carries it, and \
                                 cgroup2 cannot provide it while other controllers are on v1"
                            .to_owned(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The controllers of `wanted` not yet enabled in `dir/cgroup.subtree_control`, as
    /// `+name` words.
    fn missing_controllers(&self, dir: &Path, wanted: &[&str]) -> Result<Vec<String>, CgroupError> {
        let current = read_file(&dir.join("cgroup.subtree_control"))?;
        // The kernel lists `memory pids`; a fake file keeps what we wrote (`+memory`).
        let enabled: Vec<&str> = current
            .split_whitespace()
            .map(|w| w.trim_start_matches('+'))
            .collect();
        Ok(wanted
            .iter()
            .filter(|c| !enabled.contains(c))
            .map(|c| format!("+{c}"))
            .collect())
    }

    /// Enables `wanted` in `dir/cgroup.subtree_control`, writing only what is missing.
    fn enable_controllers(&self, dir: &Path, wanted: &[&str]) -> Result<(), CgroupError> {
        let missing = self.missing_controllers(dir, wanted)?;
        if missing.is_empty() {
            return Ok(());
        }
        write_file(&dir.join("cgroup.subtree_control"), &missing.join(" "))
    }

    /// `mkdir dir` in the hierarchy mounted at `mount`; one that exists is fine.
    fn ensure_dir(&self, dir: &Path, mount: &Path) -> Result<(), CgroupError> {
        match self.fs.mkdir(dir, mount) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(CgroupError::Mkdir {
                path: dir.to_owned(),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// `from` and every directory below it down to `to` (just `from` when `to` is not
    /// below it), top first.
    fn levels(from: &Path, to: &Path) -> Vec<PathBuf> {
        let mut levels = vec![from.to_owned()];
        if let Ok(rel) = to.strip_prefix(from) {
            for component in rel.components() {
                let next = levels[levels.len() - 1].join(component);
                levels.push(next);
            }
        }
        levels
    }

    /// Makes a slot's parent ready for sandboxes: created when missing (a
    /// `--cgroup-parent` PATH), and on v2 with memory, pids and cpu enabled in
    /// `cgroup.subtree_control` at every level from `enable_from` down to it. A parent
    /// that holds this process's own processes (a delegated own cgroup) is emptied into
    /// its `supervisor` leaf first: v2 enables no controller for the children of a
    /// cgroup with processes in it (EBUSY).
    fn prepare_parent(&self, slot: &Slot, enable: &[&str]) -> Result<(), CgroupError> {
        if enable.is_empty() {
            for level in Self::levels(&slot.mount, &slot.base).iter().skip(1) {
                self.ensure_dir(level, &slot.mount)?;
            }
            return Ok(());
        }
        let from = self.placement.enable_from.as_deref().unwrap_or(&slot.mount);
        for (i, level) in Self::levels(from, &slot.base).iter().enumerate() {
            if i > 0 {
                self.ensure_dir(level, &slot.mount)?;
            }
            let missing = self.missing_controllers(level, enable)?;
            if missing.is_empty() {
                continue;
            }
            if self.placement.evacuate && *level == slot.base {
                self.evacuate(level, &slot.mount)?;
            }
            write_file(&level.join("cgroup.subtree_control"), &missing.join(" "))?;
        }
        Ok(())
    }

    /// Moves every process of cgroup `dir` into its leaf `supervisor` (whole processes:
    /// a pid written to a v2 `cgroup.procs` moves all its threads). A process that
    /// cannot be moved makes the enabling that follows fail with EBUSY, naming the file.
    fn evacuate(&self, dir: &Path, mount: &Path) -> Result<(), CgroupError> {
        let leaf = dir.join(SUPERVISOR_DIR);
        self.ensure_dir(&leaf, mount)?;
        let from = dir.join("cgroup.procs");
        let to = leaf.join("cgroup.procs");
        for _ in 0..EVACUATE_ROUNDS {
            let pids = read_pids(&from)?;
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                match write_file(&to, &pid.to_string()) {
                    // Gone meanwhile.
                    Err(CgroupError::Write { source, .. }) if source.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(CgroupError::Write { source, .. }) => {
                        return Err(CgroupError::Attach {
                            pid,
                            path: to,
                            source,
                        });
                    }
                    other => other?,
                }
            }
            self.fs.moved_out(&from);
        }
        Ok(())
    }

    /// `mkdir -p base/airlock/<owner>` (enabling `enable` at each level), then
    /// `mkdir base/airlock/<owner>/<id>`. Returns (owner dir, sandbox dir).
    fn make_dirs(
        &self,
        mount: &Path,
        base: &Path,
        enable: &[&str],
        id: &str,
    ) -> Result<(PathBuf, PathBuf), CgroupError> {
        let mkdir_p = |path: &Path| {
            self.ensure_dir(path, mount)?;
            if enable.is_empty() {
                Ok(())
            } else {
                self.enable_controllers(path, enable)
            }
        };
        let airlock = base.join(AIRLOCK_DIR);
        let owner = airlock.join(&self.owner);
        let leaf = owner.join(id);
        mkdir_p(&airlock)?;
        mkdir_p(&owner)?;
        self.fs.mkdir(&leaf, mount).map_err(|source| CgroupError::Mkdir {
            path: leaf.clone(),
            source,
        })?;
        Ok((owner, leaf))
    }

    /// Creates the sandbox's cgroup in every hierarchy used and applies `limits`.
    ///
    /// Fails, leaving nothing behind, when a controller needed for the limits is missing:
    /// a sandbox never runs with weaker isolation than asked.
    pub fn create(&self, sandbox_id: &str, limits: &CgroupLimits) -> Result<Cgroup, CgroupError> {
        validate_id(sandbox_id)?;
        validate_limits(limits)?;
        self.check_controllers()?;
        let mut cgroup = Cgroup::new(self.fs, self.v2, sandbox_id);
        let mut spare = self.take_spare(sandbox_id).into_iter();
        let recycled = spare.len() > 0;
        for slot in self.plan() {
            if !slot.cgroup2
                && let Some(dir) = spare.next()
            {
                cgroup
                    .owner_dirs
                    .push(dir.path.parent().map(Path::to_owned).unwrap_or_default());
                cgroup.dirs.push(dir);
                continue;
            }
            let enable: &[&str] = if self.v2 && slot.cgroup2 {
                &V2_CONTROLLERS
            } else {
                &[]
            };
            // The parent's subtree_control decides what `airlock` may enable. On a cgroup
            // with processes in it that are not ours to move (a container's namespace root
            // that airlock was not told is its own), this write fails with EBUSY (no
            // internal processes): the error names the file.
            self.prepare_parent(&slot, enable)?;
            // A concurrent destroy of this owner's last sandbox may remove the owner
            // directory between our steps (it rmdirs it when empty): retry once.
            let (owner_dir, dir) = match self.make_dirs(&slot.mount, &slot.base, enable, sandbox_id) {
                Err(e) if e.is_not_found() => self.make_dirs(&slot.mount, &slot.base, enable, sandbox_id)?,
                other => other?,
            };
            cgroup.owner_dirs.push(owner_dir);
            cgroup
                .dirs
                .push(SandboxDir::new(dir, slot.controllers, slot.cgroup2));
        }
        cgroup.write_limits(limits)?;
        if recycled {
            // It may have died in the background.
            cgroup.set_background(false)?;
        }
        if let Some(dir) = cgroup.cgroup2_dir() {
            let file = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(dir)
                .map_err(|source| CgroupError::OpenDir {
                    path: dir.to_owned(),
                    source,
                })?;
            cgroup.clone_fd = Some(OwnedFd::from(file));
        }
        cgroup.spares = Some(std::sync::Arc::clone(&self.spares));
        Ok(cgroup)
    }

    /// Keeps the v1 directories of up to `max` sandboxes that ended cleanly for the next
    /// ones (see [`Spares`]); 0 stops keeping them. No effect where sandboxes have no v1
    /// directory (cgroup v2).
    pub fn keep_spares(&self, max: usize) {
        self.spares.lock().unwrap_or_else(PoisonError::into_inner).max = max;
    }

    /// Stops keeping spares and removes those kept (a service's shutdown).
    pub fn release_spares(&self) {
        let sets = {
            let mut spares = self.spares.lock().unwrap_or_else(PoisonError::into_inner);
            spares.max = 0;
            std::mem::take(&mut spares.sets)
        };
        for set in sets {
            for dir in set {
                let _ = self.fs.rmdir_tree(&dir.path);
                if let Some(owner) = dir.path.parent() {
                    self.fs.rmdir_if_childless(owner);
                }
            }
        }
    }

    /// A kept set renamed for sandbox `id`, or none (then every directory is made).
    fn take_spare(&self, id: &str) -> Vec<SandboxDir> {
        let Some(mut set) = self
            .spares
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .sets
            .pop()
        else {
            return Vec::new();
        };
        for dir in &mut set {
            let to = dir.path.with_file_name(id);
            if fs::rename(&dir.path, &to).is_err() {
                // Not reusable after all: remove what is left of it, make them all.
                for d in &set {
                    let _ = self.fs.rmdir_tree(&d.path);
                    let _ = self.fs.rmdir_tree(&d.path.with_file_name(id));
                }
                return Vec::new();
            }
            dir.path = to;
        }
        set
    }

    /// Every `(owner, sandbox id)` directory present, across the hierarchies used.
    fn sandboxes(&self) -> BTreeMap<String, BTreeSet<String>> {
        let subdirs = |path: &Path| -> Vec<String> {
            fs::read_dir(path)
                .map(|entries| {
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .filter_map(|e| e.file_name().into_string().ok())
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for slot in self.plan() {
            let base = slot.base.join(AIRLOCK_DIR);
            for owner in subdirs(&base) {
                let ids = subdirs(&base.join(&owner));
                found.entry(owner).or_default().extend(ids);
            }
        }
        found
    }

    /// Removes the cgroups left by airlock processes that are gone (no `/proc/<pid>`, or a
    /// different start time); returns how many sandboxes were purged. Live owners,
    /// including this process, are left alone, and so are names that are not ours.
    pub fn purge_stale(&self) -> usize {
        let plan = self.plan();
        let mut purged = 0;
        for (owner, ids) in self.sandboxes() {
            if owner == self.owner {
                continue;
            }
            let Some((pid, start)) = parse_owner(&owner) else {
                continue;
            };
            if owner_alive(pid, start) {
                continue;
            }
            for id in &ids {
                if self.existing(&plan, &owner, id).teardown().is_ok() && !is_spare(id) {
                    purged += 1;
                }
            }
            for slot in &plan {
                self.fs
                    .rmdir_if_childless(&slot.base.join(AIRLOCK_DIR).join(&owner));
            }
        }
        purged
    }

    /// Number of airlock sandbox cgroups present, of any owner (a sandbox counts once
    /// however many hierarchies it has a directory in).
    pub fn count_sandboxes(&self) -> usize {
        self.sandboxes()
            .values()
            .map(|ids| ids.iter().filter(|id| !is_spare(id)).count())
            .sum()
    }

    /// Number of sandbox cgroups present that belong to this process.
    pub fn count_own_sandboxes(&self) -> usize {
        self.sandboxes()
            .get(&self.owner)
            .map_or(0, |ids| ids.iter().filter(|id| !is_spare(id)).count())
    }

    /// A handle on the existing directories of another owner's sandbox, for purging.
    fn existing(&self, plan: &[Slot], owner: &str, id: &str) -> Cgroup {
        let mut cgroup = Cgroup::new(self.fs, self.v2, id);
        for slot in plan {
            let owner_dir = slot.base.join(AIRLOCK_DIR).join(owner);
            let path = owner_dir.join(id);
            if path.is_dir() {
                cgroup.owner_dirs.push(owner_dir);
                cgroup
                    .dirs
                    .push(SandboxDir::new(path, slot.controllers.clone(), slot.cgroup2));
            }
        }
        cgroup
    }
}

/// Whether a directory name below an owner's is a kept spare (see [`Spares`]), not a
/// sandbox.
fn is_spare(name: &str) -> bool {
    name.starts_with(".spare-")
}

/// One directory of a sandbox's cgroup.
#[derive(Debug)]
struct SandboxDir {
    path: PathBuf,
    /// Controllers of ours this hierarchy serves.
    controllers: Vec<&'static str>,
    /// True in the cgroup2 hierarchy.
    cgroup2: bool,
}

impl SandboxDir {
    fn new(path: PathBuf, controllers: Vec<&'static str>, cgroup2: bool) -> SandboxDir {
        SandboxDir {
            path,
            controllers,
            cgroup2,
        }
    }

    /// The directory held open (`O_PATH`) for several of its files: each is then opened
    /// relative to it, not by a walk of the whole path. Not kept between operations: an
    /// idle session must cost the daemon few fds (thousands of them live at once).
    fn at(&self) -> Dir<'_> {
        use rustix::fs::{CWD, Mode, OFlags, openat};
        let fd = openat(
            CWD,
            &self.path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok();
        Dir { path: &self.path, fd }
    }

    /// The directory by its path, for one file.
    fn walk(&self) -> Dir<'_> {
        Dir {
            path: &self.path,
            fd: None,
        }
    }

    fn has(&self, name: &str) -> bool {
        self.walk().has(name)
    }

    fn write(&self, name: &str, value: &str) -> Result<(), CgroupError> {
        self.walk().write(name, value)
    }

    fn read(&self, name: &str) -> io::Result<String> {
        self.walk().read(name)
    }

    fn read_u64(&self, name: &str, key: Option<&str>) -> Option<u64> {
        self.walk().read_u64(name, key)
    }

    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        self.walk().pids()
    }
}

/// A sandbox directory's interface files (see [`SandboxDir::at`]).
struct Dir<'a> {
    path: &'a Path,
    /// `O_PATH` fd of `path`, or `None`: walk the path.
    fd: Option<OwnedFd>,
}

impl Dir<'_> {
    /// Opens interface file `name` (no create, close-on-exec).
    fn open(&self, name: &str, write: bool) -> io::Result<fs::File> {
        use rustix::fs::{Mode, OFlags, openat};
        let Some(dir) = &self.fd else {
            let mut options = OpenOptions::new();
            options.read(!write).write(write).truncate(write);
            return options.open(self.path.join(name));
        };
        let flags = if write {
            OFlags::WRONLY | OFlags::TRUNC
        } else {
            OFlags::RDONLY
        };
        let fd = openat(dir, name, flags | OFlags::CLOEXEC, Mode::empty())?;
        Ok(fs::File::from(fd))
    }

    /// Opens interface file `name` for reading and writing.
    fn open_rw(&self, name: &str) -> io::Result<fs::File> {
        use rustix::fs::{Mode, OFlags, openat};
        match &self.fd {
            Some(dir) => Ok(fs::File::from(openat(
                dir,
                name,
                OFlags::RDWR | OFlags::CLOEXEC,
                Mode::empty(),
            )?)),
            None => OpenOptions::new()
                .read(true)
                .write(true)
                .open(self.path.join(name)),
        }
    }

    /// Whether interface file `name` exists (a kernel too old for it has none).
    fn has(&self, name: &str) -> bool {
        use rustix::fs::{Access, AtFlags, accessat};
        match &self.fd {
            Some(dir) => accessat(dir, name, Access::EXISTS, AtFlags::empty()).is_ok(),
            None => self.path.join(name).exists(),
        }
    }

    /// Writes `value` to interface file `name` (see [`write_file`]).
    fn write(&self, name: &str, value: &str) -> Result<(), CgroupError> {
        self.open(name, true)
            .and_then(|mut f| f.write_all(value.as_bytes()))
            .map_err(|source| CgroupError::Write {
                path: self.path.join(name),
                value: value.to_owned(),
                source,
            })
    }

    fn read(&self, name: &str) -> io::Result<String> {
        let mut text = String::new();
        io::Read::read_to_string(&mut self.open(name, false)?, &mut text)?;
        Ok(text)
    }

    /// A number from interface file `name` (see [`read_u64`]).
    fn read_u64(&self, name: &str, key: Option<&str>) -> Option<u64> {
        parse_u64(&self.read(name).ok()?, key)
    }

    /// The pids in its `cgroup.procs`; a removed cgroup has none.
    fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        match self.read("cgroup.procs") {
            Ok(text) => Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(CgroupError::Read {
                path: self.path.join("cgroup.procs"),
                source,
            }),
        }
    }
}

/// How `kill` empties the cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KillMethod {
    /// Write `1` to the cgroup2 directory's `cgroup.kill` (Linux >= 5.14): atomic,
    /// race-free.
    CgroupKill,
    /// v1 freezer at this directory: freeze, SIGKILL every pid, thaw.
    Freezer(PathBuf),
    /// SIGKILL every listed pid until no new pid shows up.
    Loop,
}

/// `memory.peak` of `dir`, open for reading and writing (see [`Cgroup::reset_peak`]).
fn open_peak(dir: &SandboxDir) -> io::Result<fs::File> {
    dir.walk().open_rw("memory.peak")
}

/// One sandbox's cgroup: a directory in every hierarchy used.
///
/// Owns its directories (and the cgroup2 directory fd): [`Cgroup::destroy`] kills what
/// runs in it and removes them; dropping it does the same, best effort.
#[derive(Debug)]
pub struct Cgroup {
    /// Real or fake cgroupfs.
    fs: Fs,
    /// v2 interface files (memory.max...) or v1 ones (memory.limit_in_bytes...).
    v2: bool,
    /// The sandbox id, last component of every directory.
    id: String,
    /// Owned: the sandbox directories, in attach order (memory first on v1).
    dirs: Vec<SandboxDir>,
    /// The `airlock/<owner>` parents of `dirs`: removed once they hold no sandbox.
    owner_dirs: Vec<PathBuf>,
    /// Owned: `O_DIRECTORY|O_CLOEXEC` fd of the cgroup2 directory, for clone3.
    clone_fd: Option<OwnedFd>,
    /// v2: `memory.peak`, open since the first reset that took (see [`Cgroup::reset_peak`]);
    /// `None` once a reset failed (a kernel before 6.12: not tried again).
    peak: Mutex<Option<Option<fs::File>>>,
    /// Where its v1 directories go when it ends cleanly (see [`Spares`]); `None` for a
    /// handle on another owner's directories, or one not fully made.
    spares: Option<std::sync::Arc<Mutex<Spares>>>,
}

impl Cgroup {
    fn new(fs: Fs, v2: bool, id: &str) -> Self {
        Cgroup {
            fs,
            v2,
            id: id.to_owned(),
            dirs: Vec::new(),
            owner_dirs: Vec::new(),
            clone_fd: None,
            peak: Mutex::new(Some(None)),
            spares: None,
        }
    }

    /// The sandbox id this cgroup was created for.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Every directory of this cgroup (one per hierarchy), in attach order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.dirs.iter().map(|d| d.path.as_path())
    }

    /// The directory serving `controller`, with its fd.
    fn sandbox_dir(&self, controller: &str) -> Option<&SandboxDir> {
        self.dirs.iter().find(|d| d.controllers.contains(&controller))
    }

    /// The cgroup2 directory, with its fd.
    fn cgroup2(&self) -> Option<&SandboxDir> {
        self.dirs.iter().find(|d| d.cgroup2)
    }

    fn need_dir(&self, controller: &'static str) -> Result<&SandboxDir, CgroupError> {
        self.sandbox_dir(controller)
            .ok_or_else(|| CgroupError::MissingController {
                controller,
                detail: format!("sandbox {} has no directory for it", self.id),
            })
    }

    /// The directory serving `controller`.
    fn dir_with(&self, controller: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|d| d.controllers.contains(&controller))
            .map(|d| d.path.as_path())
    }

    /// The cgroup2 directory (v2, or the unified one on a hybrid host).
    fn cgroup2_dir(&self) -> Option<&Path> {
        self.dirs.iter().find(|d| d.cgroup2).map(|d| d.path.as_path())
    }

    /// Writes the limits; order matters where the kernel checks one value against another.
    fn write_limits(&self, limits: &CgroupLimits) -> Result<(), CgroupError> {
        let memory = limits.memory_bytes.to_string();
        let pids = limits.pids.to_string();
        let quota = cpu_quota_us(limits.cpus);
        if self.v2 {
            let dir = self.need_dir("memory")?.at();
            dir.write("memory.max", &memory)?;
            // Absent without swap accounting; then there is no swap to cap.
            if dir.has("memory.swap.max") {
                dir.write("memory.swap.max", "0")?;
            }
            self.need_dir("pids")?.write("pids.max", &pids)?;
            return self.write_cpu_quota(Some(quota));
        }
        let dir = self.need_dir("memory")?.at();
        // memsw (memory+swap) must stay >= the memory limit at every step: when the limit
        // goes down, lower it first; when it goes up (a live cgroup given a larger cap),
        // raise memsw first.
        const LIMIT: &str = "memory.limit_in_bytes";
        const MEMSW: &str = "memory.memsw.limit_in_bytes";
        let raising = dir
            .read_u64(LIMIT, None)
            .is_some_and(|current| limits.memory_bytes > current);
        let memsw = dir.has(MEMSW);
        if raising && memsw {
            dir.write(MEMSW, &memory)?;
            dir.write(LIMIT, &memory)?;
        } else {
            dir.write(LIMIT, &memory)?;
            if memsw {
                dir.write(MEMSW, &memory)?;
            }
        }
        // Best effort: without memsw accounting this at least keeps pages out of swap;
        // not writable on some kernels (e.g. under a parent with use_hierarchy quirks).
        let _ = dir.write("memory.swappiness", "0");
        self.need_dir("pids")?.write("pids.max", &pids)?;
        self.write_cpu_quota(Some(quota))
    }

    /// Writes the CFS quota (microseconds per [`CPU_PERIOD_US`]), or none at all.
    fn write_cpu_quota(&self, quota_us: Option<u64>) -> Result<(), CgroupError> {
        let cpu = self.need_dir("cpu")?.at();
        if self.v2 {
            let quota = quota_us.map_or_else(|| "max".to_owned(), |q| q.to_string());
            return cpu.write("cpu.max", &format!("{quota} {CPU_PERIOD_US}"));
        }
        cpu.write("cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
        let quota = quota_us.map_or_else(|| "-1".to_owned(), |q| q.to_string());
        cpu.write("cpu.cfs_quota_us", &quota)
    }

    /// Lifts the CPU quota, for tasks that are already dying. A task the CFS throttle
    /// holds runs no code at all, not even its own exit with SIGKILL pending, and
    /// kernel-heavy work (forks, exits, page faults) can overrun the quota by seconds
    /// before the throttle catches up: the debt is paid back before the task runs again.
    /// Called only after every task of the cgroup was sent SIGKILL, so no program code
    /// runs unthrottled: a task with SIGKILL pending dies on its way back to user space.
    fn lift_cpu_quota(&self) -> Result<(), CgroupError> {
        self.write_cpu_quota(None)
    }

    /// Lifts the CPU quota once a freeze was asked for, before waiting for it: a
    /// throttled task cannot reach the freeze point either (it would take up to
    /// `FREEZE_WAIT`). From the request on, a task stops before it returns to user space,
    /// so the lifted quota serves only the kernel work it is in the middle of; the SIGKILL
    /// that follows ends it.
    fn lift_quota_while_freezing(&self) {
        let _ = self.lift_cpu_quota();
    }

    /// Puts the CPU quota for `cpus` cores back after [`Cgroup::kill_except`] lifted it,
    /// once the killed processes are gone (a session's init outlives the kill).
    pub fn restore_cpu_quota(&self, cpus: f64) -> Result<(), CgroupError> {
        self.write_cpu_quota(Some(cpu_quota_us(cpus)))
    }

    /// Puts the sandbox's CPU time behind every other runnable task's (`background`), or
    /// back to an ordinary share. A sandbox is in the background while it is built ahead
    /// of time and while it dies: that work then never preempts another sandbox's program
    /// or the service's answer. `cpu.idle` (Linux 5.15, v1 and v2) is a group-wide
    /// SCHED_IDLE; without it the smallest weight (`cpu.shares` 2, `cpu.weight` 1) comes
    /// close. Only the share changes: the CPU limit (`cpu.max`/CFS quota) stays as it is.
    pub fn set_background(&self, background: bool) -> Result<(), CgroupError> {
        let cpu = self.need_dir("cpu")?;
        match cpu.write("cpu.idle", if background { "1" } else { "0" }) {
            Err(CgroupError::Write { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                let (file, value) = match (self.v2, background) {
                    (true, true) => ("cpu.weight", "1"),
                    (true, false) => ("cpu.weight", "100"),
                    (false, true) => ("cpu.shares", "2"),
                    (false, false) => ("cpu.shares", "1024"),
                };
                cpu.write(file, value)
            }
            other => other,
        }
    }

    /// Changes the limits of a live cgroup (a session's next exec, a pooled sandbox taken
    /// for a request). Lowering memory below what is in use fails on v1 (EBUSY).
    pub fn set_limits(&self, limits: &CgroupLimits) -> Result<(), CgroupError> {
        validate_limits(limits)?;
        self.write_limits(limits)
    }

    /// Restarts the peak-memory counter, so the next exec's peak is its own. On v1 the
    /// counter is reset by writing 0. On v2 (Linux >= 6.12) a write to `memory.peak`
    /// resets it for reads through the same open file only: the file is opened once and
    /// kept, and [`Cgroup::usage`] reads the peak through it. An older v2 kernel refuses
    /// the write; there the peak stays the sandbox's lifetime peak.
    pub fn reset_peak(&self) {
        let Some(dir) = self.sandbox_dir("memory") else {
            return;
        };
        if !self.v2 {
            let _ = dir.write("memory.max_usage_in_bytes", "0");
            return;
        }
        let mut peak = self.peak.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(slot) = peak.as_mut() else {
            return; // tried, and the kernel cannot reset it
        };
        if slot.is_none() {
            *slot = open_peak(dir).ok();
        }
        if let Some(file) = slot.as_ref()
            && (&*file).write_all(b"reset\n").is_err()
        {
            *peak = None;
        }
    }

    /// v2: the peak since the last [`Cgroup::reset_peak`] that took, through its file.
    fn peak_since_reset(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt as _;
        let peak = self.peak.lock().unwrap_or_else(PoisonError::into_inner);
        let file = peak.as_ref()?.as_ref()?;
        let mut buf = [0u8; 32];
        let n = file.read_at(&mut buf, 0).ok()?;
        parse_u64(std::str::from_utf8(&buf[..n]).ok()?, None)
    }

    /// `O_DIRECTORY|O_CLOEXEC` fd of the cgroup2 directory (v2, or the unified one on a
    /// hybrid host), for `clone3` with `CLONE_INTO_CGROUP`; `None` without cgroup2.
    pub fn clone_into_fd(&self) -> Option<BorrowedFd<'_>> {
        self.clone_fd.as_ref().map(AsFd::as_fd)
    }

    /// Moves process `pid` into every directory of this cgroup it is not yet in: every
    /// v1 controller directory, plus the cgroup2 one unless `already_in_cgroup2` (the
    /// process was created there by `CLONE_INTO_CGROUP`).
    pub fn attach(&self, pid: i32, already_in_cgroup2: bool) -> Result<(), CgroupError> {
        for dir in &self.dirs {
            if dir.cgroup2 && already_in_cgroup2 {
                continue;
            }
            dir.write("cgroup.procs", &pid.to_string()).map_err(|e| match e {
                CgroupError::Write { path, source, .. } => CgroupError::Attach { pid, path, source },
                other => other,
            })?;
        }
        Ok(())
    }

    /// How many times the sandbox's programs touched a mapped page (their code, their
    /// libraries, an mmap'd file) that had to be read back from disk (`pgmajfault` in
    /// `memory.stat`). A sandbox at its cap whose count climbs fast is thrashing: its own
    /// code is evicted and read back. (Pages a program reads with `read()` are not
    /// counted: re-reading a file larger than the cap is slow, not stuck.) `None` where
    /// the kernel does not count them.
    pub fn major_faults(&self) -> Option<u64> {
        let stat = self.sandbox_dir("memory")?.read("memory.stat").ok()?;
        parse_u64(&stat, Some("pgmajfault")).or_else(|| parse_u64(&stat, Some("total_pgmajfault")))
    }

    /// Microseconds that every task of the sandbox spent stalled on memory at once
    /// (reclaim, refaults of its working set), from its cgroup's pressure-stall
    /// accounting: cgroup v2 with PSI only (`memory.pressure`, line `full`, `total=`).
    pub fn memory_full_stall_us(&self) -> Option<u64> {
        if !self.v2 {
            return None;
        }
        let text = self.sandbox_dir("memory")?.read("memory.pressure").ok()?;
        parse_stall_total(&text)
    }

    /// Whether the sandbox's memory use is at its cap, within a sixteenth of it: where a
    /// memory stall means it is out of memory rather than waiting on a slow disk.
    pub fn at_memory_cap(&self) -> bool {
        let Some(dir) = self.sandbox_dir("memory") else {
            return false;
        };
        let (current, max) = if self.v2 {
            (
                dir.read_u64("memory.current", None),
                dir.read_u64("memory.max", None),
            )
        } else {
            (
                dir.read_u64("memory.usage_in_bytes", None),
                dir.read_u64("memory.limit_in_bytes", None),
            )
        };
        matches!((current, max), (Some(current), Some(max)) if current.saturating_add(max / 16) >= max)
    }

    /// Current usage; a counter the kernel does not provide reads as 0.
    pub fn usage(&self) -> Usage {
        let mut usage = Usage::default();
        let cgroup2_cpu = |dir: &SandboxDir| dir.read_u64("cpu.stat", Some("usage_usec"));
        if self.v2 {
            if let Some(dir) = self.sandbox_dir("memory").map(SandboxDir::at) {
                usage.memory_peak_bytes = self
                    .peak_since_reset()
                    .or_else(|| dir.read_u64("memory.peak", None))
                    .or_else(|| dir.read_u64("memory.current", None))
                    .unwrap_or(0);
                usage.oom_kills = dir.read_u64("memory.events", Some("oom_kill")).unwrap_or(0);
            }
            usage.cpu_ns = self
                .sandbox_dir("cpu")
                .and_then(cgroup2_cpu)
                .map_or(0, |us| us.saturating_mul(1000));
            return usage;
        }
        if let Some(dir) = self.sandbox_dir("memory").map(SandboxDir::at) {
            usage.memory_peak_bytes = dir.read_u64("memory.max_usage_in_bytes", None).unwrap_or(0);
            usage.oom_kills = dir.read_u64("memory.oom_control", Some("oom_kill")).unwrap_or(0);
        }
        // cpuacct counts in ns; without it, cgroup2's cpu.stat works even controller-less.
        usage.cpu_ns = self
            .sandbox_dir("cpuacct")
            .and_then(|dir| dir.read_u64("cpuacct.usage", None))
            .or_else(|| {
                self.cgroup2()
                    .and_then(cgroup2_cpu)
                    .map(|us| us.saturating_mul(1000))
            })
            .unwrap_or(0);
        usage
    }

    /// Freezes (`true`) or thaws (`false`) every process of the sandbox: cgroup2's
    /// `cgroup.freeze` where it exists (v2, or the unified hierarchy of a hybrid host with
    /// Linux >= 5.2), else v1's `freezer.state`. A freeze is waited for up to
    /// [`FREEZE_WAIT`] (a task in uninterruptible sleep stops when it leaves it; none runs
    /// user code once the freeze is asked for). Idempotent.
    pub fn freeze(&self, frozen: bool) -> Result<(), CgroupError> {
        if let Some(file) = self
            .cgroup2_dir()
            .map(|d| d.join("cgroup.freeze"))
            .filter(|f| f.exists())
        {
            write_file(&file, if frozen { "1" } else { "0" })?;
            if frozen {
                let events = file.with_file_name("cgroup.events");
                let deadline = Instant::now() + FREEZE_WAIT;
                while read_u64(&events, Some("frozen")) != Some(1) && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(1));
                }
            }
            return Ok(());
        }
        match self
            .dir_with("freezer")
            .map(|d| d.join("freezer.state"))
            .filter(|f| f.exists())
        {
            Some(state) => {
                write_file(&state, if frozen { "FROZEN" } else { "THAWED" })?;
                let deadline = Instant::now() + FREEZE_WAIT;
                while frozen && read_file(&state)?.trim() != "FROZEN" && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            }
            None => Err(CgroupError::MissingController {
                controller: "freezer",
                detail: format!(
                    "sandbox {} has neither cgroup2's cgroup.freeze nor a v1 freezer",
                    self.id
                ),
            }),
        }
    }

    /// Whether the sandbox's processes are frozen (or a freeze was asked for).
    pub fn frozen(&self) -> bool {
        if let Some(file) = self
            .cgroup2_dir()
            .map(|d| d.join("cgroup.freeze"))
            .filter(|f| f.exists())
        {
            return read_u64(&file, None) == Some(1);
        }
        self.dir_with("freezer")
            .and_then(|d| read_file(&d.join("freezer.state")).ok())
            .is_some_and(|s| s.trim() != "THAWED")
    }

    /// The best kill method this cgroup offers.
    fn kill_method(&self) -> KillMethod {
        if self.cgroup2().is_some_and(|d| d.has("cgroup.kill")) {
            return KillMethod::CgroupKill;
        }
        match self.dir_with("freezer") {
            Some(dir) if dir.join("freezer.state").exists() => KillMethod::Freezer(dir.to_owned()),
            _ => KillMethod::Loop,
        }
    }

    /// Sends SIGKILL to every process of the sandbox: through `cgroup.kill` where present;
    /// else freeze (v1 freezer), SIGKILL every pid, thaw; else SIGKILL every listed pid
    /// until no new one appears. Does not wait for them to exit ([`Cgroup::destroy`] does).
    ///
    /// Once every task has SIGKILL pending, the CPU quota is lifted (see
    /// [`Cgroup::lift_cpu_quota`]): a throttled sandbox dies at once, whatever its debt.
    pub fn kill(&self) -> Result<(), CgroupError> {
        let killed = self.kill_with(self.kill_method());
        // Best effort on a cgroup that may be half torn down; the kill is what counts.
        let _ = self.lift_cpu_quota();
        killed
    }

    /// SIGKILLs every process of the sandbox except `keep` (its init, which a session
    /// keeps): from outside, so a program that starves init of CPU cannot delay it. A
    /// freeze is asked for meanwhile where a freezer exists (cgroup2's `cgroup.freeze`, or
    /// v1's), so the program cannot fork its way past the listing, which repeats until no
    /// new process appears; `keep` is expected to kill what a fork under way adds (see
    /// `signal_all_except`). The CPU quota is lifted as in [`Cgroup::kill`], for
    /// `keep` too (it only reaps and reports): put it back with
    /// [`Cgroup::restore_cpu_quota`] once `keep` reports the killed processes gone.
    ///
    /// With `keepers` (the host uid of the sandbox's root), the subtrees of `keep`'s
    /// children running as that uid are spared too: the keepers of spawned programs and
    /// everything beneath them (see `keeper`). A sandbox's programs never run as its
    /// root, so none of an exec's processes can pass for one.
    pub fn kill_except(&self, keep: i32, keepers: Option<u32>) -> Result<(), CgroupError> {
        let killed = self.signal_all_except(keep, keepers);
        let _ = self.lift_cpu_quota();
        killed
    }

    fn signal_all_except(&self, keep: i32, keepers: Option<u32>) -> Result<(), CgroupError> {
        let freeze = self
            .cgroup2_dir()
            .map(|d| (d.join("cgroup.freeze"), "1", "0"))
            .filter(|(f, _, _)| f.exists())
            .or_else(|| {
                self.dir_with("freezer")
                    .map(|d| (d.join("freezer.state"), "FROZEN", "THAWED"))
                    .filter(|(f, _, _)| f.exists())
            });
        if let Some((file, frozen, _)) = &freeze {
            write_file(file, frozen)?;
            self.lift_quota_while_freezing();
        }
        // Sweep until a sweep finds no new process. With a freeze asked for, a task stops
        // before it returns to user space, so only a fork already under way can add one;
        // without a freezer the sweeps race the program's forks (bounded by this wait and
        // pids.max). The freeze is not waited for: tasks deep in kernel work reach the
        // freeze point slowly (150-370 ms under a clone storm), and SIGKILL needs no
        // freeze. Whatever a last fork under way leaves alive, `keep` kills: it is the
        // namespace's init, whose kill(-1) reaches every process in it.
        let deadline = Instant::now() + KILL_LOOP_WAIT;
        let mut seen: HashSet<i32> = [keep].into();
        let swept = loop {
            if let Some(uid) = keepers {
                seen.extend(spared_subtrees(keep, uid, self.members().unwrap_or_default()));
            }
            match self.signal_members(&seen) {
                Ok(fresh) if fresh.is_empty() || Instant::now() >= deadline => break Ok(()),
                Ok(fresh) => seen.extend(fresh),
                Err(e) => break Err(e),
            }
        };
        let thaw = freeze.map_or(Ok(()), |(file, _, thawed)| write_file(&file, thawed));
        swept.and(thaw)
    }

    fn kill_with(&self, method: KillMethod) -> Result<(), CgroupError> {
        match method {
            KillMethod::CgroupKill => match self.cgroup2() {
                Some(dir) => dir.write("cgroup.kill", "1"),
                None => Ok(()),
            },
            KillMethod::Freezer(dir) => {
                let state = dir.join("freezer.state");
                write_file(&state, "FROZEN")?;
                self.lift_quota_while_freezing();
                // Once FROZEN, no task forks or exits, so the pid list is complete and no
                // listed pid can be recycled before our signal lands.
                let deadline = Instant::now() + FREEZE_WAIT;
                while read_file(&state)?.trim() != "FROZEN" && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(1));
                }
                let signalled = self.signal_members(&HashSet::new());
                // Frozen tasks act on SIGKILL once thawed; thaw even if signalling failed.
                let thawed = write_file(&state, "THAWED");
                signalled.and(thawed)
            }
            KillMethod::Loop => {
                let deadline = Instant::now() + KILL_LOOP_WAIT;
                let mut seen = HashSet::new();
                loop {
                    let fresh = self.signal_members(&seen)?;
                    if fresh.is_empty() || Instant::now() >= deadline {
                        return Ok(());
                    }
                    seen.extend(fresh);
                }
            }
        }
    }

    /// Every pid listed in any directory of this cgroup.
    pub(crate) fn members(&self) -> Result<BTreeSet<i32>, CgroupError> {
        let mut pids = BTreeSet::new();
        for dir in &self.dirs {
            pids.extend(dir.pids()?);
        }
        Ok(pids)
    }

    /// SIGKILLs every member not in `skip`; returns the pids signalled.
    ///
    /// A pid read from `cgroup.procs` may exit and be recycled by an unrelated process
    /// before we signal it, so each is first pinned with a pidfd, then the list is read
    /// again: a pid still listed after its pidfd was opened is the member itself. Without
    /// pidfd (Linux < 5.3) plain `kill` after the re-read leaves a tiny window.
    fn signal_members(&self, skip: &HashSet<i32>) -> Result<Vec<i32>, CgroupError> {
        if self.fs == Fs::Fake {
            return Ok(Vec::new());
        }
        let me = i32::try_from(std::process::id()).unwrap_or(0);
        let listed = self.members()?;
        let mut pinned = Vec::new();
        for &pid in listed
            .iter()
            .filter(|p| **p > 0 && **p != me && !skip.contains(p))
        {
            match crate::sys::pidfd_open(pid) {
                Ok(fd) => pinned.push((pid, Some(fd))),
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => pinned.push((pid, None)),
                // Already gone.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(source) => return Err(self.signal_error(pid, source)),
            }
        }
        if pinned.is_empty() {
            return Ok(Vec::new());
        }
        let still = self.members()?;
        let mut signalled = Vec::new();
        for (pid, fd) in pinned {
            if !still.contains(&pid) {
                continue;
            }
            let sent = match &fd {
                Some(fd) => crate::sys::pidfd_send_signal(fd.as_raw_fd(), libc::SIGKILL),
                None => {
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
                        .map_err(io::Error::from)
                }
            };
            match sent {
                Ok(()) => signalled.push(pid),
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(source) => return Err(self.signal_error(pid, source)),
            }
        }
        Ok(signalled)
    }

    fn signal_error(&self, pid: i32, source: io::Error) -> CgroupError {
        let path = self.dirs.first().map(|d| d.path.clone()).unwrap_or_default();
        CgroupError::Signal { pid, path, source }
    }

    /// Waits (bounded by [`DESTROY_WAIT`]) until no process is left, sweeping leftovers
    /// with SIGKILL now and then: a process only in v1 directories, or one forked while
    /// `kill` ran.
    fn wait_empty(&self, deadline: Instant) -> Result<(), CgroupError> {
        if self.fs == Fs::Fake {
            return Ok(());
        }
        let start = Instant::now();
        let mut nap = Duration::from_millis(1);
        let mut next_sweep = start + Duration::from_millis(100);
        loop {
            let left = self.members()?;
            if left.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let path = self
                    .dirs
                    .iter()
                    .find(|d| read_pids(&d.path.join("cgroup.procs")).is_ok_and(|p| !p.is_empty()))
                    .or(self.dirs.first())
                    .map(|d| d.path.clone())
                    .unwrap_or_default();
                return Err(CgroupError::StillPopulated {
                    path,
                    pids: left.into_iter().collect(),
                    waited: now - start,
                });
            }
            if now >= next_sweep {
                let _ = self.signal_members(&HashSet::new());
                next_sweep = now + Duration::from_millis(100);
            }
            thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(20));
        }
    }

    /// Kill, wait, rmdir every directory and the owner parents; returns the first error
    /// but always tries every step. Idempotent: a second call finds nothing to do.
    fn teardown(&mut self) -> Result<(), CgroupError> {
        if self.dirs.is_empty() && self.owner_dirs.is_empty() {
            return Ok(());
        }
        self.clone_fd = None;
        // An open interface file keeps the removed cgroup's memory around until closed.
        *self.peak.get_mut().unwrap_or_else(PoisonError::into_inner) = Some(None);
        let deadline = Instant::now() + DESTROY_WAIT;
        let mut first_err = self.kill().err();
        // A predecessor that crashed between freeze and thaw leaves tasks frozen, and a
        // frozen v1 task does not act on SIGKILL: thaw, whatever the kill method was.
        if let Some(state) = self.dir_with("freezer").map(|d| d.join("freezer.state"))
            && state.exists()
        {
            let _ = write_file(&state, "THAWED");
        }
        if let Err(e) = self.wait_empty(deadline) {
            first_err.get_or_insert(e);
        }
        if first_err.is_none() {
            self.keep_as_spare();
        }
        for dir in std::mem::take(&mut self.dirs) {
            // rmdir can report EBUSY for a moment after the last task left.
            let removed = loop {
                match self.fs.rmdir_tree(&dir.path) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                        thread::sleep(Duration::from_millis(5));
                    }
                    other => break other,
                }
            };
            if let Err(source) = removed {
                first_err.get_or_insert(CgroupError::Rmdir {
                    path: dir.path,
                    source,
                });
            }
        }
        for owner_dir in std::mem::take(&mut self.owner_dirs) {
            self.fs.rmdir_if_childless(&owner_dir);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Moves its v1 directories to the spares (renamed `.spare-N`) if spares are kept and
    /// there is room; the rest is removed by [`Cgroup::teardown`]. Called once no process
    /// is left.
    fn keep_as_spare(&mut self) {
        let Some(spares) = self.spares.take() else {
            return;
        };
        let mut spares = spares.lock().unwrap_or_else(PoisonError::into_inner);
        if self.fs == Fs::Fake || spares.sets.len() >= spares.max || !self.dirs.iter().any(|d| !d.cgroup2) {
            return;
        }
        let mut set = Vec::new();
        let mut kept = Vec::new();
        for dir in std::mem::take(&mut self.dirs) {
            if dir.cgroup2 {
                kept.push(dir);
                continue;
            }
            spares.next += 1;
            let to = dir.path.with_file_name(format!(".spare-{}", spares.next));
            match fs::rename(&dir.path, &to) {
                Ok(()) => set.push(SandboxDir { path: to, ..dir }),
                Err(_) => kept.push(dir),
            }
        }
        if kept.iter().any(|d| !d.cgroup2) {
            // A rename failed: none of this set is kept; all of it is removed.
            kept.extend(set);
        } else {
            spares.sets.push(set);
        }
        self.dirs = kept;
    }

    /// Kills every process, waits (about 2 s at most) until none is left, and removes
    /// every directory, then the per-owner parent if no other sandbox uses it.
    pub fn destroy(mut self) -> Result<(), CgroupError> {
        self.teardown()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// The host pids of every process of `members` (the sandbox's processes: all beneath its
/// `init`) beneath a child of `init` that runs as host uid `uid` (a keeper), the keepers
/// included (see [`Cgroup::kill_except`]). A process whose ancestry cannot be told (an
/// ancestor ended meanwhile) is spared: init's own sweep, after the exec's program ends,
/// is the backstop for those.
fn spared_subtrees(init: i32, uid: u32, members: BTreeSet<i32>) -> Vec<i32> {
    let table = crate::procs::table_of("/proc", members);
    let keepers: Vec<i32> = table
        .iter()
        .filter(|(_, e)| e.ppid == init)
        .map(|(pid, _)| *pid)
        .filter(|pid| real_uid(*pid) == Some(uid))
        .collect();
    if keepers.is_empty() {
        return Vec::new();
    }
    table
        .keys()
        .copied()
        .filter(|pid| *pid != init && crate::procs::under(&table, *pid, &keepers, init) != Some(false))
        .collect()
}

/// The real uid of host process `pid`.
fn real_uid(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_ascii_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::{Child, Command, Stdio};

    #[test]
    fn a_pressure_files_full_total_is_read_and_nothing_else() {
        let text = "some avg10=12.50 avg60=3.00 avg300=0.70 total=9000000\n\
                    full avg10=10.00 avg60=2.00 avg300=0.50 total=7654321\n";
        assert_eq!(parse_stall_total(text), Some(7_654_321));
        // A kernel without "full" for the resource, or an unreadable line: nothing.
        assert_eq!(
            parse_stall_total("some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n"),
            None
        );
        assert_eq!(parse_stall_total("full avg10=0.00 total=x\n"), None);
    }

    /// This build machine's mount table (hybrid: v1 controllers, controller-less cgroup2).
    const HYBRID: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// A systemd v1 host without cgroup2, `cpu,cpuacct` co-mounted.
    const COMOUNTED: &str = "\
25 18 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpu,cpuacct
31 25 0:28 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
32 25 0:29 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,pids
34 25 0:31 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime shared:18 - cgroup cgroup rw,net_cls,net_prio
";

    /// A pure v2 host (systemd default).
    const V2: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
24 18 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    const MIB64: CgroupLimits = CgroupLimits {
        memory_bytes: 64 << 20,
        cpus: 0.5,
        pids: 16,
    };

    /// Interface files of a v1 hybrid root, as the kernel offers them (and the fake copies
    /// them into every new directory).
    const HYBRID_FILES: &[(&str, &str)] = &[
        ("sys/fs/cgroup/memory/cgroup.procs", ""),
        ("sys/fs/cgroup/memory/memory.limit_in_bytes", ""),
        ("sys/fs/cgroup/memory/memory.memsw.limit_in_bytes", ""),
        ("sys/fs/cgroup/memory/memory.swappiness", ""),
        ("sys/fs/cgroup/memory/memory.max_usage_in_bytes", ""),
        ("sys/fs/cgroup/memory/memory.oom_control", ""),
        ("sys/fs/cgroup/pids/cgroup.procs", ""),
        ("sys/fs/cgroup/pids/pids.max", ""),
        ("sys/fs/cgroup/cpu/cgroup.procs", ""),
        ("sys/fs/cgroup/cpu/cpu.cfs_period_us", ""),
        ("sys/fs/cgroup/cpu/cpu.cfs_quota_us", ""),
        ("sys/fs/cgroup/cpuacct/cgroup.procs", ""),
        ("sys/fs/cgroup/cpuacct/cpuacct.usage", ""),
        ("sys/fs/cgroup/freezer/cgroup.procs", ""),
        ("sys/fs/cgroup/freezer/freezer.state", ""),
        ("sys/fs/cgroup/unified/cgroup.procs", ""),
        ("sys/fs/cgroup/unified/cgroup.controllers", ""),
        ("sys/fs/cgroup/unified/cpu.stat", ""),
    ];

    const V2_FILES: &[(&str, &str)] = &[
        (
            "sys/fs/cgroup/cgroup.controllers",
            "cpuset cpu io memory hugetlb pids rdma misc\n",
        ),
        ("sys/fs/cgroup/cgroup.subtree_control", ""),
        ("sys/fs/cgroup/cgroup.procs", ""),
        ("sys/fs/cgroup/cgroup.kill", ""),
        ("sys/fs/cgroup/memory.max", ""),
        ("sys/fs/cgroup/memory.swap.max", ""),
        ("sys/fs/cgroup/memory.current", ""),
        ("sys/fs/cgroup/memory.events", ""),
        ("sys/fs/cgroup/pids.max", ""),
        ("sys/fs/cgroup/cpu.max", ""),
        ("sys/fs/cgroup/cpu.stat", ""),
    ];

    /// A fake cgroupfs in a temp dir: every cgroup mount point of `mountinfo` as a plain
    /// directory, plus the given root files.
    fn fake(mountinfo: &str, files: &[(&str, &str)]) -> (tempfile::TempDir, CgroupHost) {
        let tmp = tempfile::tempdir().expect("tempdir");
        for m in parse_mountinfo(mountinfo) {
            fs::create_dir_all(tmp.path().join(m.point.strip_prefix("/").unwrap()))
                .expect("mkdir mount point");
        }
        for (rel, content) in files {
            fs::write(tmp.path().join(rel), content).expect("write root file");
        }
        let host = CgroupHost::from_mountinfo(mountinfo, tmp.path()).expect("layout");
        assert_eq!(host.fs, Fs::Fake);
        (tmp, host)
    }

    fn read(path: &Path) -> String {
        fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
            .trim()
            .to_owned()
    }

    fn sandbox_dir(tmp: &tempfile::TempDir, mount: &str, host: &CgroupHost, id: &str) -> PathBuf {
        tmp.path()
            .join(mount)
            .join(AIRLOCK_DIR)
            .join(host.owner())
            .join(id)
    }

    #[test]
    fn parses_hybrid_mountinfo() {
        let (tmp, host) = fake(HYBRID, HYBRID_FILES);
        assert!(!host.is_v2());
        let root = tmp.path().join("sys/fs/cgroup");
        assert_eq!(
            host.describe(),
            format!(
                "hybrid: v1 memory, pids, cpu, cpuacct, freezer; cgroup2 (no controllers) at {}",
                root.join("unified").display()
            )
        );
        let plan = host.plan();
        let shape: Vec<(PathBuf, Vec<&str>, bool)> = plan
            .into_iter()
            .map(|s| (s.mount, s.controllers, s.cgroup2))
            .collect();
        assert_eq!(
            shape,
            vec![
                (root.join("memory"), vec!["memory"], false),
                (root.join("pids"), vec!["pids"], false),
                (root.join("cpu"), vec!["cpu"], false),
                (root.join("cpuacct"), vec!["cpuacct"], false),
                (root.join("freezer"), vec!["freezer"], false),
                (root.join("unified"), vec![], true),
            ]
        );
    }

    #[test]
    fn parses_v2_mountinfo_and_writes_v2_limits() {
        let (tmp, host) = fake(V2, V2_FILES);
        assert!(host.is_v2());
        let root = tmp.path().join("sys/fs/cgroup");
        assert_eq!(
            host.describe(),
            format!("v2 at {} (memory, pids, cpu)", root.display())
        );
        assert!(host.has_kill());
        let cg = host.create("sb-v2", &MIB64).expect("create");
        let dir = sandbox_dir(&tmp, "sys/fs/cgroup", &host, "sb-v2");
        assert_eq!(cg.paths().collect::<Vec<_>>(), vec![dir.as_path()]);
        assert_eq!(read(&dir.join("memory.max")), "67108864");
        assert_eq!(read(&dir.join("memory.swap.max")), "0");
        assert_eq!(read(&dir.join("pids.max")), "16");
        assert_eq!(read(&dir.join("cpu.max")), "50000 100000");
        // Controllers enabled at every level above the sandbox.
        for level in [
            root.clone(),
            root.join(AIRLOCK_DIR),
            root.join(AIRLOCK_DIR).join(host.owner()),
        ] {
            assert_eq!(
                read(&level.join("cgroup.subtree_control")),
                "+memory +pids +cpu",
                "{}",
                level.display()
            );
        }
        assert!(cg.clone_into_fd().is_some());
        // cgroup.kill is preferred.
        assert_eq!(cg.kill_method(), KillMethod::CgroupKill);
        cg.kill().expect("kill");
        assert_eq!(read(&dir.join("cgroup.kill")), "1");
        cg.destroy().expect("destroy");
        assert!(!dir.exists());
        assert!(!root.join(AIRLOCK_DIR).join(host.owner()).exists());
        assert!(root.join(AIRLOCK_DIR).exists());
    }

    #[test]
    fn v2_only_enables_missing_controllers() {
        let mut files = V2_FILES.to_vec();
        files.retain(|(p, _)| !p.ends_with("cgroup.subtree_control"));
        files.push(("sys/fs/cgroup/cgroup.subtree_control", "cpu memory pids\n"));
        let (tmp, host) = fake(V2, &files);
        let _cg = host.create("sb", &MIB64).expect("create");
        let root = tmp.path().join("sys/fs/cgroup");
        assert_eq!(read(&root.join("cgroup.subtree_control")), "cpu memory pids");
    }

    #[test]
    fn v2_missing_controller_fails() {
        let mut files = V2_FILES.to_vec();
        files[0] = ("sys/fs/cgroup/cgroup.controllers", "cpu io memory\n");
        let (_tmp, host) = fake(V2, &files);
        assert!(host.describe().ends_with("(memory, cpu); missing: pids"));
        let err = host.create("sb", &MIB64).expect_err("no pids controller");
        assert!(matches!(
            err,
            CgroupError::MissingController {
                controller: "pids",
                ..
            }
        ));
        assert!(err.to_string().contains("`pids`"), "{err}");
        assert_eq!(host.count_sandboxes(), 0);
    }

    #[test]
    fn v2_usage_falls_back_to_memory_current() {
        let (tmp, host) = fake(V2, V2_FILES);
        let cg = host.create("sb-usage", &MIB64).expect("create");
        let dir = sandbox_dir(&tmp, "sys/fs/cgroup", &host, "sb-usage");
        fs::write(dir.join("memory.current"), "4096\n").unwrap();
        fs::write(
            dir.join("cpu.stat"),
            "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
        )
        .unwrap();
        fs::write(
            dir.join("memory.events"),
            "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n",
        )
        .unwrap();
        assert_eq!(
            cg.usage(),
            Usage {
                memory_peak_bytes: 4096,
                cpu_ns: 1_500_000,
                oom_kills: 2
            }
        );
        fs::write(dir.join("memory.peak"), "8192\n").unwrap();
        assert_eq!(cg.usage().memory_peak_bytes, 8192);
    }

    #[test]
    fn a_hybrid_host_with_cgroup_kill_uses_cgroup2_for_kill_freeze_and_cpu_time() {
        let mut files = HYBRID_FILES.to_vec();
        files.extend([
            ("sys/fs/cgroup/unified/cgroup.kill", ""),
            ("sys/fs/cgroup/unified/cgroup.freeze", ""),
        ]);
        let (tmp, host) = fake(HYBRID, &files);
        let root = tmp.path().join("sys/fs/cgroup");
        let shape: Vec<(PathBuf, Vec<&str>, bool)> = host
            .plan()
            .into_iter()
            .map(|s| (s.mount, s.controllers, s.cgroup2))
            .collect();
        assert_eq!(
            shape,
            vec![
                (root.join("memory"), vec!["memory"], false),
                (root.join("pids"), vec!["pids"], false),
                (root.join("cpu"), vec!["cpu"], false),
                (root.join("unified"), vec![], true),
            ]
        );
        let id = "sb-hybrid-kill";
        let cg = host.create(id, &MIB64).expect("create");
        let dir = |m: &str| sandbox_dir(&tmp, &format!("sys/fs/cgroup/{m}"), &host, id);
        assert!(!dir("freezer").exists() && !dir("cpuacct").exists());
        fs::write(dir("unified").join("cpu.stat"), "usage_usec 1500\n").unwrap();
        assert_eq!(cg.usage().cpu_ns, 1_500_000);
        cg.destroy().expect("destroy");
    }

    #[test]
    fn hybrid_writes_v1_limits() {
        let (tmp, host) = fake(HYBRID, HYBRID_FILES);
        let id = "sb-hybrid";
        let cg = host.create(id, &MIB64).expect("create");
        let dir = |m: &str| sandbox_dir(&tmp, &format!("sys/fs/cgroup/{m}"), &host, id);
        let mem = dir("memory");
        assert_eq!(read(&mem.join("memory.limit_in_bytes")), "67108864");
        assert_eq!(read(&mem.join("memory.memsw.limit_in_bytes")), "67108864");
        assert_eq!(read(&mem.join("memory.swappiness")), "0");
        assert_eq!(read(&dir("pids").join("pids.max")), "16");
        assert_eq!(read(&dir("cpu").join("cpu.cfs_period_us")), "100000");
        assert_eq!(read(&dir("cpu").join("cpu.cfs_quota_us")), "50000");
        for m in ["memory", "pids", "cpu", "cpuacct", "freezer", "unified"] {
            assert!(dir(m).is_dir(), "{m}");
        }
        // Unused hierarchies are left alone.
        assert!(!tmp.path().join("sys/fs/cgroup/cpuset/airlock").exists());
        assert!(
            !tmp.path()
                .join("sys/fs/cgroup/unified/airlock/cgroup.subtree_control")
                .exists()
        );
        assert!(cg.clone_into_fd().is_some());
        assert_eq!(host.count_sandboxes(), 1);
        cg.destroy().expect("destroy");
        assert_eq!(host.count_sandboxes(), 0);
        for m in ["memory", "pids", "cpu", "cpuacct", "freezer", "unified"] {
            assert!(!dir(m).exists(), "{m}");
            assert!(!dir(m).parent().unwrap().exists(), "{m} owner dir");
        }
    }

    #[test]
    fn memsw_is_skipped_without_swap_accounting_and_quota_has_a_floor() {
        let files: Vec<_> = HYBRID_FILES
            .iter()
            .copied()
            .filter(|(p, _)| !p.contains("memsw"))
            .collect();
        let (tmp, host) = fake(HYBRID, &files);
        let limits = CgroupLimits {
            memory_bytes: 1 << 30,
            cpus: 0.001,
            pids: 65,
        };
        let _cg = host.create("sb", &limits).expect("create");
        let mem = sandbox_dir(&tmp, "sys/fs/cgroup/memory", &host, "sb");
        assert_eq!(read(&mem.join("memory.limit_in_bytes")), "1073741824");
        assert!(!mem.join("memory.memsw.limit_in_bytes").exists());
        let cpu = sandbox_dir(&tmp, "sys/fs/cgroup/cpu", &host, "sb");
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "1000");
        assert_eq!(cpu_quota_us(2.0), 200_000);
        assert_eq!(cpu_quota_us(0.255), 25_500);
    }

    #[test]
    fn background_is_cpu_idle_where_the_kernel_has_it_and_the_least_weight_otherwise() {
        // (layout, files, cgroup mount holding the cpu controller, fallback file, its
        // background and ordinary values)
        let cases = [
            (
                HYBRID,
                HYBRID_FILES,
                "sys/fs/cgroup/cpu",
                "cpu.shares",
                "2",
                "1024",
            ),
            (V2, V2_FILES, "sys/fs/cgroup", "cpu.weight", "1", "100"),
        ];
        for (mountinfo, files, mount, fallback, low, normal) in cases {
            let root_file = |name: &str| format!("{mount}/{name}");
            let (idle, weight) = (root_file("cpu.idle"), root_file(fallback));
            let mut with_idle: Vec<(&str, &str)> = files.to_vec();
            with_idle.push((&idle, "0"));
            let (tmp, host) = fake(mountinfo, &with_idle);
            let cg = host.create("sb", &MIB64).expect("create");
            let dir = sandbox_dir(&tmp, mount, &host, "sb");
            cg.set_background(true).expect("background");
            assert_eq!(read(&dir.join("cpu.idle")), "1", "{mount}");
            cg.set_background(false).expect("foreground");
            assert_eq!(read(&dir.join("cpu.idle")), "0", "{mount}");
            assert!(!dir.join(fallback).exists(), "{mount}");

            // A kernel before 5.15: no cpu.idle.
            let mut without: Vec<(&str, &str)> = files.to_vec();
            without.push((&weight, normal));
            let (tmp, host) = fake(mountinfo, &without);
            let cg = host.create("sb", &MIB64).expect("create");
            let dir = sandbox_dir(&tmp, mount, &host, "sb");
            cg.set_background(true).expect("background");
            assert_eq!(read(&dir.join(fallback)), low, "{mount}");
            assert!(!dir.join("cpu.idle").exists(), "{mount}");
            cg.set_background(false).expect("foreground");
            assert_eq!(read(&dir.join(fallback)), normal, "{mount}");
            // The CPU limit is untouched either way.
            let quota = if mount.ends_with("cpu") {
                "cpu.cfs_quota_us"
            } else {
                "cpu.max"
            };
            assert!(read(&dir.join(quota)).starts_with("50000"), "{mount}");
        }
    }

    #[test]
    fn write_error_names_file_and_value() {
        let files: Vec<_> = HYBRID_FILES
            .iter()
            .copied()
            .filter(|(p, _)| !p.ends_with("pids.max"))
            .collect();
        let (tmp, host) = fake(HYBRID, &files);
        let err = host.create("sb", &MIB64).expect_err("pids.max missing");
        let msg = err.to_string();
        assert!(msg.contains("pids.max") && msg.contains("\"16\""), "{msg}");
        // A failed create leaves nothing behind.
        assert_eq!(host.count_sandboxes(), 0);
        assert!(
            !tmp.path()
                .join("sys/fs/cgroup/memory/airlock")
                .join(host.owner())
                .exists()
        );
    }

    #[test]
    fn comounted_cpu_cpuacct() {
        let files: &[(&str, &str)] = &[
            ("sys/fs/cgroup/memory/cgroup.procs", ""),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", ""),
            ("sys/fs/cgroup/memory/memory.max_usage_in_bytes", ""),
            ("sys/fs/cgroup/memory/memory.oom_control", ""),
            ("sys/fs/cgroup/pids/cgroup.procs", ""),
            ("sys/fs/cgroup/pids/pids.max", ""),
            ("sys/fs/cgroup/cpu,cpuacct/cgroup.procs", ""),
            ("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", ""),
            ("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", ""),
            ("sys/fs/cgroup/cpu,cpuacct/cpuacct.usage", ""),
        ];
        let (tmp, host) = fake(COMOUNTED, files);
        assert!(!host.is_v2());
        assert_eq!(host.describe(), "v1: memory, pids, cpu, cpuacct; no cgroup2");
        assert!(!host.has_kill());
        let cg = host.create("sb-co", &MIB64).expect("create");
        // One directory serves both cpu and cpuacct.
        assert_eq!(cg.paths().count(), 3);
        let cpu = sandbox_dir(&tmp, "sys/fs/cgroup/cpu,cpuacct", &host, "sb-co");
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "50000");
        assert!(cg.clone_into_fd().is_none());
        // v1 usage files.
        fs::write(cpu.join("cpuacct.usage"), "123456789\n").unwrap();
        let mem = sandbox_dir(&tmp, "sys/fs/cgroup/memory", &host, "sb-co");
        fs::write(mem.join("memory.max_usage_in_bytes"), "5242880\n").unwrap();
        fs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        )
        .unwrap();
        assert_eq!(
            cg.usage(),
            Usage {
                memory_peak_bytes: 5 << 20,
                cpu_ns: 123_456_789,
                oom_kills: 3
            }
        );
        // No cgroup.kill, no freezer: the SIGKILL loop (a no-op on a fake fs).
        assert_eq!(cg.kill_method(), KillMethod::Loop);
        cg.kill().expect("kill");
    }

    #[test]
    fn v1_without_pids_fails_naming_pids() {
        let mountinfo: String = HYBRID
            .lines()
            .filter(|l| !l.ends_with("rw,pids"))
            .map(|l| format!("{l}\n"))
            .collect();
        let (_tmp, host) = fake(&mountinfo, &[]);
        assert!(
            host.describe().ends_with("; missing: pids"),
            "{}",
            host.describe()
        );
        let err = host.create("sb", &MIB64).expect_err("no pids");
        assert!(
            matches!(
                err,
                CgroupError::MissingController {
                    controller: "pids",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("`pids`"), "{err}");
        assert_eq!(host.count_sandboxes(), 0);
    }

    #[test]
    fn attach_writes_every_dir_it_is_not_yet_in() {
        let (tmp, host) = fake(HYBRID, HYBRID_FILES);
        let cg = host.create("sb-attach", &MIB64).expect("create");
        let dir = |m: &str| sandbox_dir(&tmp, &format!("sys/fs/cgroup/{m}"), &host, "sb-attach");
        cg.attach(4242, true).expect("attach");
        for m in ["memory", "pids", "cpu", "cpuacct", "freezer"] {
            assert_eq!(read(&dir(m).join("cgroup.procs")), "4242", "{m}");
        }
        assert_eq!(read(&dir("unified").join("cgroup.procs")), "");
        cg.attach(4343, false).expect("attach");
        assert_eq!(read(&dir("unified").join("cgroup.procs")), "4343");
        // Freezer method without cgroup.kill: the fake ends thawed.
        assert_eq!(cg.kill_method(), KillMethod::Freezer(dir("freezer")));
        cg.kill().expect("kill");
        assert_eq!(read(&dir("freezer").join("freezer.state")), "THAWED");
        // Attaching to a removed cgroup fails naming the file.
        fs::remove_dir_all(dir("pids")).unwrap();
        let err = cg.attach(1, true).expect_err("gone");
        assert!(
            matches!(&err, CgroupError::Attach { pid: 1, path, .. } if path.ends_with("sb-attach/cgroup.procs")),
            "{err:?}"
        );
    }

    #[test]
    fn drop_removes_and_owner_dir_stays_while_shared() {
        let (tmp, host) = fake(HYBRID, HYBRID_FILES);
        let a = host.create("sb-a", &MIB64).expect("create a");
        let b = host.create("sb-b", &MIB64).expect("create b");
        assert_eq!(host.count_sandboxes(), 2);
        assert_eq!(host.count_own_sandboxes(), 2);
        drop(a);
        assert_eq!(host.count_sandboxes(), 1);
        let owner = tmp.path().join("sys/fs/cgroup/memory/airlock").join(host.owner());
        assert!(owner.join("sb-b").is_dir());
        b.destroy().expect("destroy b");
        assert!(!owner.exists());
        assert_eq!(host.count_sandboxes(), 0);
    }

    #[test]
    fn rejects_bad_ids_and_limits() {
        let (_tmp, host) = fake(V2, V2_FILES);
        for id in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            ".hidden",
            "sp ace",
            &"x".repeat(129),
        ] {
            assert!(
                matches!(host.create(id, &MIB64), Err(CgroupError::InvalidId { .. })),
                "{id:?}"
            );
        }
        for limits in [
            CgroupLimits {
                memory_bytes: 0,
                ..MIB64
            },
            CgroupLimits { pids: 0, ..MIB64 },
            CgroupLimits { cpus: 0.0, ..MIB64 },
            CgroupLimits {
                cpus: f64::NAN,
                ..MIB64
            },
            CgroupLimits {
                cpus: f64::INFINITY,
                ..MIB64
            },
        ] {
            assert!(matches!(
                host.create("sb", &limits),
                Err(CgroupError::InvalidLimits { .. })
            ));
        }
        assert_eq!(host.count_sandboxes(), 0);
    }

    #[test]
    fn create_rejects_a_duplicate_id() {
        let (_tmp, host) = fake(V2, V2_FILES);
        let _a = host.create("sb-dup", &MIB64).expect("create");
        let err = host.create("sb-dup", &MIB64).expect_err("duplicate");
        assert!(
            matches!(&err, CgroupError::Mkdir { source, .. } if source.kind() == io::ErrorKind::AlreadyExists),
            "{err:?}"
        );
        // The failed create must not have removed the first one's directory.
        assert_eq!(host.count_sandboxes(), 1);
    }

    #[test]
    fn purge_stale_removes_dead_owners_only() {
        let (tmp, host) = fake(HYBRID, HYBRID_FILES);
        let live = host.create("sb-live", &MIB64).expect("create");
        let (me, my_start) = parse_owner(host.owner()).unwrap();
        // A dead pid, and our own pid with another start time (a recycled pid).
        let dead = ["999999999-1".to_owned(), format!("{me}-{}", my_start + 1)];
        for owner in &dead {
            for m in ["memory", "pids", "cpu", "unified"] {
                let dir = tmp
                    .path()
                    .join("sys/fs/cgroup")
                    .join(m)
                    .join(AIRLOCK_DIR)
                    .join(owner);
                fs::create_dir_all(dir.join("sb-old-1")).unwrap();
                fs::create_dir_all(dir.join("sb-old-2")).unwrap();
            }
        }
        // An empty dead owner directory, and a name that is not ours.
        let memory_airlock = tmp.path().join("sys/fs/cgroup/memory").join(AIRLOCK_DIR);
        fs::create_dir_all(memory_airlock.join("999999998-5")).unwrap();
        fs::create_dir_all(memory_airlock.join("not-an-owner/keep")).unwrap();
        assert_eq!(host.count_sandboxes(), 6);
        assert_eq!(host.purge_stale(), 4);
        assert_eq!(host.count_sandboxes(), 2);
        for owner in dead.iter().map(String::as_str).chain(["999999998-5"]) {
            for m in ["memory", "pids", "cpu", "unified"] {
                let dir = tmp
                    .path()
                    .join("sys/fs/cgroup")
                    .join(m)
                    .join(AIRLOCK_DIR)
                    .join(owner);
                assert!(!dir.exists(), "{}", dir.display());
            }
        }
        assert!(memory_airlock.join(host.owner()).join("sb-live").is_dir());
        assert!(memory_airlock.join("not-an-owner/keep").is_dir());
        assert_eq!(host.purge_stale(), 0);
        live.destroy().expect("destroy");
    }

    #[test]
    fn mountinfo_parsing_details() {
        assert_eq!(
            unescape_mountinfo(r"/sys/fs/cgroup/with\040space\\x"),
            PathBuf::from(r"/sys/fs/cgroup/with space\\x")
        );
        let mounts = parse_mountinfo(
            "41 31 0:38 /docker/abc /sys/fs/cgroup/unified rw shared:5 master:1 - cgroup2 cgroup2 rw\n\
             42 31 0:39 / /sys/fs/cgroup/x rw - cgroup cgroup rw,noprefix,name=foo\n\
             garbage line\n",
        );
        assert_eq!(
            mounts,
            vec![
                CgMount {
                    point: "/sys/fs/cgroup/unified".into(),
                    root: "/docker/abc".into(),
                    full: false,
                    v1_controllers: None
                },
                CgMount {
                    point: "/sys/fs/cgroup/x".into(),
                    root: "/".into(),
                    full: true,
                    v1_controllers: Some(vec![])
                },
            ]
        );
        assert!(matches!(
            CgroupHost::from_mountinfo("22 27 0:21 / /proc rw - proc proc rw\n", Path::new("/")),
            Err(CgroupError::NoCgroupFs)
        ));
        assert_eq!(
            parse_start_time("12 (a) b (c) S 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 4242 23"),
            Some(4242)
        );
        assert_eq!(parse_owner("123-456"), Some((123, 456)));
        assert_eq!(parse_owner("123"), None);
        assert_eq!(parse_owner("x-1"), None);
    }

    // ---- parents: where sandboxes go (fake cgroupfs) ----

    /// A uid no account uses, for a pretended ordinary user (files chowned to it).
    const USER: u32 = 0x3fff_0101;

    fn who(euid: u32) -> Identity {
        Identity {
            euid,
            host_cgroupns: true,
        }
    }

    /// Makes cgroup `path` in the fake hierarchy at `mount` (relative to the temp dir),
    /// populated as the kernel would (the root's files), with `files` written over them.
    fn fake_cgroup(tmp: &tempfile::TempDir, mount: &str, path: &str, files: &[(&str, &str)]) -> PathBuf {
        let root = tmp.path().join(mount);
        let dir = root.join(path.trim_start_matches('/'));
        fs::create_dir_all(&dir).expect("mkdir cgroup");
        for entry in fs::read_dir(&root).unwrap().flatten() {
            if entry.file_type().unwrap().is_file() {
                fs::File::create(dir.join(entry.file_name())).unwrap();
            }
        }
        for (name, content) in files {
            fs::write(dir.join(name), content).unwrap();
        }
        dir
    }

    /// `chown -R uid dir`.
    fn chown_tree(dir: &Path, uid: u32) {
        std::os::unix::fs::chown(dir, Some(uid), None).expect("chown");
        for entry in fs::read_dir(dir).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                chown_tree(&entry.path(), uid);
            } else {
                std::os::unix::fs::chown(entry.path(), Some(uid), None).expect("chown");
            }
        }
    }

    fn layout(
        tmp: &tempfile::TempDir,
        mountinfo: &str,
        own: &str,
        parent: &CgroupParent,
        who: Identity,
    ) -> Result<CgroupHost, CgroupError> {
        let host = CgroupHost::layout(mountinfo, own, tmp.path(), parent, who)?;
        assert_eq!(host.fs, Fs::Fake);
        Ok(host)
    }

    /// A fake cgroupfs with the mount points of `mountinfo` and `files` at their roots.
    fn fake_fs(mountinfo: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().expect("tempdir");
        for m in parse_mountinfo(mountinfo) {
            fs::create_dir_all(tmp.path().join(m.point.strip_prefix("/").unwrap())).unwrap();
        }
        for (rel, content) in files {
            fs::write(tmp.path().join(rel), content).unwrap();
        }
        tmp
    }

    const V2_OWN: &str = "0::/system.slice/airlock.service\n";
    const HYBRID_OWN: &str = "\
10:name=systemd:/system.slice/airlock.service
9:pids:/deleg
8:blkio:/
7:freezer:/
6:devices:/
5:memory:/deleg
4:cpuset:/
3:cpuacct:/
2:cpu:/deleg
0::/deleg
";

    #[test]
    fn cgroup_parent_parses_and_prints() {
        for (text, parent) in [
            ("auto", CgroupParent::Auto),
            ("root", CgroupParent::Root),
            ("/airlock.slice", CgroupParent::Path("/airlock.slice".into())),
            ("/a/b-c/d", CgroupParent::Path("/a/b-c/d".into())),
        ] {
            assert_eq!(text.parse::<CgroupParent>(), Ok(parent.clone()));
            assert_eq!(parent.to_string(), text);
        }
        for bad in ["", "a/b", "/a/../b", "/a/./b", "Auto"] {
            assert!(bad.parse::<CgroupParent>().is_err(), "{bad:?}");
        }
        assert_eq!(CgroupParent::default(), CgroupParent::Auto);
    }

    #[test]
    fn own_cgroups_are_found_below_their_mounts() {
        let own = parse_proc_cgroup(HYBRID_OWN);
        assert_eq!(own[0], (vec!["name=systemd"], "/system.slice/airlock.service"));
        assert_eq!(own.last(), Some(&(vec![], "/deleg")));
        let mount = Path::new("/sys/fs/cgroup/memory");
        assert_eq!(
            cgroup_dir(mount, Path::new("/"), "/a/b"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/a/b"))
        );
        assert_eq!(cgroup_dir(mount, Path::new("/"), "/"), Some(mount.to_owned()));
        // A container's sub-tree mount shows its own cgroup at the mount point.
        assert_eq!(
            cgroup_dir(mount, Path::new("/docker/abc"), "/docker/abc/x"),
            Some(mount.join("x"))
        );
        assert_eq!(cgroup_dir(mount, Path::new("/docker/abc"), "/other"), None);
    }

    /// systemd's Delegate=yes on v2: the own cgroup has trusted.delegate; sandboxes go
    /// below it, after this process moved to `supervisor`, with controllers enabled from
    /// the own cgroup down (never above it).
    #[test]
    fn v2_delegated_by_xattr_puts_sandboxes_under_the_own_cgroup() {
        let tmp = fake_fs(V2, V2_FILES);
        let own = fake_cgroup(
            &tmp,
            "sys/fs/cgroup",
            "/system.slice/airlock.service",
            &[
                ("cgroup.controllers", "cpu memory pids\n"),
                ("cgroup.procs", "4242\n4343\n"),
            ],
        );
        // No delegation mark: the host root, as before parents existed.
        let host = layout(&tmp, V2, V2_OWN, &CgroupParent::Auto, who(0)).expect("layout");
        assert_eq!(host.parent_kind(), &ParentKind::HostRoot);
        assert_eq!(host.parent_dirs(), vec![tmp.path().join("sys/fs/cgroup")]);
        assert!(
            host.describe_parent().ends_with("(host root)"),
            "{}",
            host.describe_parent()
        );

        rustix::fs::setxattr(&own, "trusted.delegate", b"1", rustix::fs::XattrFlags::empty())
            .expect("setxattr (tmpfs or ext4 as root)");
        let host = layout(&tmp, V2, V2_OWN, &CgroupParent::Auto, who(0)).expect("layout");
        assert!(
            matches!(host.parent_kind(), ParentKind::Delegated(why) if why.contains("trusted.delegate")),
            "{:?}",
            host.parent_kind()
        );
        assert_eq!(host.parent_dirs(), vec![own.clone()]);
        assert_eq!(
            host.describe_parent(),
            format!(
                "{} (delegated: trusted.delegate xattr on {} (systemd Delegate=yes))",
                own.display(),
                own.display()
            )
        );
        let cg = host.create("sb-deleg", &MIB64).expect("create");
        let dir = own.join(AIRLOCK_DIR).join(host.owner()).join("sb-deleg");
        assert_eq!(cg.paths().collect::<Vec<_>>(), vec![dir.as_path()]);
        assert_eq!(read(&dir.join("memory.max")), "67108864");
        // Every process of the own cgroup moved to its leaf, then the controllers were
        // enabled in it; the levels above it are whoever delegated it's, untouched.
        assert_eq!(read(&own.join("cgroup.procs")), "");
        assert_eq!(read(&own.join(SUPERVISOR_DIR).join("cgroup.procs")), "4343");
        for level in [
            own.clone(),
            own.join(AIRLOCK_DIR),
            own.join(AIRLOCK_DIR).join(host.owner()),
        ] {
            assert_eq!(read(&level.join("cgroup.subtree_control")), "+memory +pids +cpu");
        }
        let root = tmp.path().join("sys/fs/cgroup");
        assert_eq!(read(&root.join("cgroup.subtree_control")), "");
        assert!(!root.join(AIRLOCK_DIR).join(host.owner()).exists());
        assert_eq!(host.count_sandboxes(), 1);
        cg.destroy().expect("destroy");
        assert!(!dir.exists());
        assert_eq!(host.count_sandboxes(), 0);

        // The next airlock started from a process that was moved along (a shell) is in
        // the leaf: it still belongs to the delegated cgroup, not to a deeper one.
        let leaf_line = "0::/system.slice/airlock.service/supervisor\n";
        let host = layout(&tmp, V2, leaf_line, &CgroupParent::Auto, who(0)).expect("layout");
        assert_eq!(host.parent_dirs(), vec![own.clone()]);
        let cg = host.create("sb-again", &MIB64).expect("create");
        assert!(!own.join(SUPERVISOR_DIR).join(SUPERVISOR_DIR).exists());
        cg.destroy().expect("destroy");
    }

    /// An ordinary user's own v2 cgroup, owned by it: delegated. Without memory in its
    /// cgroup.controllers: no sandbox, and the error names the file.
    #[test]
    fn v2_user_owned_cgroup_is_delegated_and_fails_closed_without_a_controller() {
        let tmp = fake_fs(V2, V2_FILES);
        let own = fake_cgroup(
            &tmp,
            "sys/fs/cgroup",
            "/user.slice/user-1000.slice/app.scope",
            &[("cgroup.controllers", "cpu pids\n")],
        );
        let own_line = "0::/user.slice/user-1000.slice/app.scope\n";
        // Not owned by the user: a clear refusal naming the directory and the fix.
        let err = layout(&tmp, V2, own_line, &CgroupParent::Auto, who(USER)).expect_err("not delegated");
        match &err {
            CgroupError::NotDelegated {
                dir,
                hierarchy,
                uid,
                how,
            } => {
                assert_eq!(dir, &own);
                assert_eq!(hierarchy, "cgroup2");
                assert_eq!(*uid, USER);
                assert!(how.contains("Delegate=yes"), "{how}");
            }
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains(&own.display().to_string()), "{err}");

        chown_tree(&own, USER);
        let host = layout(&tmp, V2, own_line, &CgroupParent::Auto, who(USER)).expect("layout");
        assert_eq!(
            host.parent_kind(),
            &ParentKind::Delegated(format!("{} is owned by uid {USER}", own.display()))
        );
        assert!(matches!(
            host.check_usable(),
            Err(CgroupError::MissingController {
                controller: "memory",
                ..
            })
        ));
        let err = host.create("sb", &MIB64).expect_err("memory is not delegated");
        assert!(
            matches!(&err, CgroupError::MissingController { controller: "memory", detail }
                if detail.contains(&own.join("cgroup.controllers").display().to_string())),
            "{err:?}"
        );
        assert_eq!(host.count_sandboxes(), 0);
        // With memory delegated too, it works.
        fs::write(own.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let host = layout(&tmp, V2, own_line, &CgroupParent::Auto, who(USER)).expect("layout");
        let cg = host.create("sb", &MIB64).expect("create");
        assert!(cg.paths().all(|p| p.starts_with(&own)));
        cg.destroy().expect("destroy");
    }

    /// A container with its own cgroup namespace: its root is the parent, and this
    /// process (with the container's others) moves to `supervisor` first.
    #[test]
    fn v2_cgroup_namespace_root_is_delegated() {
        let mut files = V2_FILES.to_vec();
        files.push(("sys/fs/cgroup/cgroup.procs", "1\n7\n"));
        let tmp = fake_fs(V2, &files);
        let ns = Identity {
            euid: 0,
            host_cgroupns: false,
        };
        let host = layout(&tmp, V2, "0::/\n", &CgroupParent::Auto, ns).expect("layout");
        let root = tmp.path().join("sys/fs/cgroup");
        assert!(
            matches!(host.parent_kind(), ParentKind::Delegated(why) if why.contains("cgroup namespace")),
            "{:?}",
            host.parent_kind()
        );
        let _cg = host.create("sb-ns", &MIB64).expect("create");
        assert_eq!(read(&root.join("cgroup.procs")), "");
        assert_eq!(read(&root.join(SUPERVISOR_DIR).join("cgroup.procs")), "7");
        assert_eq!(read(&root.join("cgroup.subtree_control")), "+memory +pids +cpu");
        // Started from the leaf later: still the namespace's root.
        let host = layout(&tmp, V2, "0::/supervisor\n", &CgroupParent::Auto, ns).expect("layout");
        assert_eq!(host.parent_dirs(), vec![root.clone()]);
        // In the host's namespace, the real root cgroup is never "delegated".
        let host = layout(&tmp, V2, "0::/\n", &CgroupParent::Auto, who(0)).expect("layout");
        assert_eq!(host.parent_kind(), &ParentKind::HostRoot);
    }

    /// `--cgroup-parent PATH` on v2: made when missing, controllers enabled at every
    /// level from the root down; the process is not moved (it is not in PATH).
    #[test]
    fn v2_explicit_parent_is_made_and_enabled_from_the_root() {
        let tmp = fake_fs(V2, V2_FILES);
        let parent = CgroupParent::Path("/airlock.slice/sandboxes".into());
        let host = layout(&tmp, V2, V2_OWN, &parent, who(0)).expect("layout");
        let root = tmp.path().join("sys/fs/cgroup");
        let base = root.join("airlock.slice/sandboxes");
        assert_eq!(host.parent_kind(), &ParentKind::Explicit);
        assert_eq!(
            host.describe_parent(),
            format!("{} (--cgroup-parent)", base.display())
        );
        let cg = host.create("sb-path", &MIB64).expect("create");
        assert!(cg.paths().all(|p| p.starts_with(&base)));
        for level in [root.clone(), root.join("airlock.slice"), base.clone()] {
            assert_eq!(read(&level.join("cgroup.subtree_control")), "+memory +pids +cpu");
        }
        assert!(!base.join(SUPERVISOR_DIR).exists());
        cg.destroy().expect("destroy");
        // The parent is the operator's: it stays.
        assert!(base.is_dir());
        // `root` forces the old layout even where the own cgroup is delegated.
        let own = fake_cgroup(&tmp, "sys/fs/cgroup", "/system.slice/airlock.service", &[]);
        rustix::fs::setxattr(&own, "trusted.delegate", b"1", rustix::fs::XattrFlags::empty()).unwrap();
        let host = layout(&tmp, V2, V2_OWN, &CgroupParent::Root, who(0)).expect("layout");
        assert_eq!(host.parent_dirs(), vec![root]);
    }

    fn hybrid_own_dirs(tmp: &tempfile::TempDir) -> Vec<PathBuf> {
        ["memory", "pids", "cpu", "unified"]
            .iter()
            .map(|m| fake_cgroup(tmp, &format!("sys/fs/cgroup/{m}"), "/deleg", &[]))
            .collect()
    }

    /// An ordinary user on v1 with memory, pids, cpu (and the unified cgroup2) chowned to
    /// it by root: sandboxes go there; cpuacct and freezer, not delegated, are not used.
    #[test]
    fn v1_user_owned_directories_are_delegated() {
        let tmp = fake_fs(HYBRID, HYBRID_FILES);
        let dirs = hybrid_own_dirs(&tmp);
        // Nothing chowned yet: refused, naming the first directory and how to delegate.
        let err = layout(&tmp, HYBRID, HYBRID_OWN, &CgroupParent::Auto, who(USER)).expect_err("refused");
        assert!(
            matches!(&err, CgroupError::NotDelegated { dir, hierarchy, how, .. }
                if *dir == dirs[2] && hierarchy == "cpu" && how.contains("chown")),
            "{err:?}"
        );
        for dir in &dirs[..2] {
            chown_tree(dir, USER);
        }
        // cpu still is not.
        assert!(matches!(
            layout(&tmp, HYBRID, HYBRID_OWN, &CgroupParent::Auto, who(USER)),
            Err(CgroupError::NotDelegated { .. })
        ));
        for dir in &dirs {
            chown_tree(dir, USER);
        }
        let host = layout(&tmp, HYBRID, HYBRID_OWN, &CgroupParent::Auto, who(USER)).expect("layout");
        assert!(
            matches!(host.parent_kind(), ParentKind::Delegated(why) if why.contains(&format!("owned by uid {USER}"))),
            "{:?}",
            host.parent_kind()
        );
        assert_eq!(host.parent_dirs(), dirs);
        let line = host.describe_parent();
        assert!(line.contains("not delegated, so not used: cpuacct"), "{line}");
        assert!(line.contains("freezer"), "{line}");
        let cg = host.create("sb-user", &MIB64).expect("create");
        let paths: Vec<&Path> = cg.paths().collect();
        assert_eq!(paths.len(), 4);
        for (path, dir) in paths.iter().zip(&dirs) {
            assert_eq!(*path, dir.join(AIRLOCK_DIR).join(host.owner()).join("sb-user"));
        }
        assert_eq!(read(&paths[0].join("memory.limit_in_bytes")), "67108864");
        assert!(
            !tmp.path()
                .join("sys/fs/cgroup/memory")
                .join(AIRLOCK_DIR)
                .join(host.owner())
                .exists()
        );
        cg.destroy().expect("destroy");
        // A dead owner's leftovers below the parent are purged there.
        let stale = dirs[0].join(AIRLOCK_DIR).join("999999999-1").join("sb-old");
        fs::create_dir_all(&stale).unwrap();
        assert_eq!(host.purge_stale(), 1);
        assert!(!stale.exists());
    }

    /// Root on v1/hybrid: delegated when systemd marked the own cgroup2 directory and the
    /// own memory, pids and cpu cgroups are below their roots; the host root otherwise.
    #[test]
    fn v1_root_is_delegated_by_the_unified_xattr() {
        let tmp = fake_fs(HYBRID, HYBRID_FILES);
        let dirs = hybrid_own_dirs(&tmp);
        let host = layout(&tmp, HYBRID, HYBRID_OWN, &CgroupParent::Auto, who(0)).expect("layout");
        assert_eq!(host.parent_kind(), &ParentKind::HostRoot);
        rustix::fs::setxattr(
            &dirs[3],
            "trusted.delegate",
            b"1",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        let host = layout(&tmp, HYBRID, HYBRID_OWN, &CgroupParent::Auto, who(0)).expect("layout");
        assert!(matches!(host.parent_kind(), ParentKind::Delegated(_)));
        let root = tmp.path().join("sys/fs/cgroup");
        // cpuacct and freezer: this process is at their roots, which root may use.
        assert_eq!(
            host.parent_dirs(),
            vec![
                dirs[0].clone(),
                dirs[1].clone(),
                dirs[2].clone(),
                root.join("cpuacct"),
                root.join("freezer"),
                dirs[3].clone()
            ]
        );
        // The mark alone is not enough: memory at its root is not delegated.
        let own = HYBRID_OWN.replace("5:memory:/deleg", "5:memory:/");
        let host = layout(&tmp, HYBRID, &own, &CgroupParent::Auto, who(0)).expect("layout");
        assert_eq!(host.parent_kind(), &ParentKind::HostRoot);
    }

    /// `--cgroup-parent PATH` on v1: made in every hierarchy used; the limits go below it.
    #[test]
    fn v1_explicit_parent_is_made_in_every_hierarchy() {
        let tmp = fake_fs(HYBRID, HYBRID_FILES);
        let parent = CgroupParent::Path("/test-parent".into());
        let host = layout(&tmp, HYBRID, HYBRID_OWN, &parent, who(0)).expect("layout");
        let cg = host.create("sb", &MIB64).expect("create");
        for m in ["memory", "pids", "cpu", "cpuacct", "freezer", "unified"] {
            let base = tmp.path().join("sys/fs/cgroup").join(m).join("test-parent");
            assert!(
                cg.paths()
                    .any(|p| p == base.join(AIRLOCK_DIR).join(host.owner()).join("sb")),
                "{m}"
            );
        }
        cg.destroy().expect("destroy");

        // An ordinary user: the parent must be its own in memory, pids and cpu; the
        // optional hierarchies are used only where it is (cgroup2 also only around its
        // own cgroup, which is elsewhere here).
        let err = layout(&tmp, HYBRID, HYBRID_OWN, &parent, who(USER)).expect_err("not the user's");
        assert!(matches!(err, CgroupError::NotDelegated { .. }), "{err:?}");
        for m in ["memory", "pids", "cpu", "unified"] {
            chown_tree(
                &tmp.path().join("sys/fs/cgroup").join(m).join("test-parent"),
                USER,
            );
        }
        let host = layout(&tmp, HYBRID, HYBRID_OWN, &parent, who(USER)).expect("layout");
        let line = host.describe_parent();
        assert!(line.contains("not delegated, so not used: cpuacct"), "{line}");
        assert!(line.contains("freezer") && line.contains("cgroup2"), "{line}");
        assert_eq!(
            host.describe(),
            "v1: memory, pids, cpu; cgroup2 not used (not delegated)"
        );
        let cg = host.create("sb", &MIB64).expect("create");
        assert_eq!(cg.paths().count(), 3);
    }

    // ---- real cgroups on this host (requires root) ----

    fn real_host() -> CgroupHost {
        let host = CgroupHost::detect().expect("detect");
        assert_eq!(host.fs, Fs::Real);
        host
    }

    /// `sh` that waits for one line on stdin, then runs `then`: lets the test attach the
    /// process before it does the interesting part.
    fn gated(then: &str, arg0: &str) -> Child {
        Command::new("sh")
            .args(["-c", &format!("read x; {then}"), arg0])
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn sh")
    }

    fn open_gate(child: &mut Child) {
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"go\n").expect("write gate");
    }

    fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn pid_of(child: &Child) -> i32 {
        i32::try_from(child.id()).expect("pid")
    }

    #[test]
    fn real_describe() {
        let host = real_host();
        let line = host.describe();
        assert!(line.starts_with("v2 at ") || line.contains("v1 "), "{line}");
        assert!(!line.contains("missing"), "{line}");
        println!("{line}; cgroup.kill: {}", host.has_kill());
    }

    /// A live cgroup's memory cap can be raised and lowered (v1 orders the memory and
    /// memory+swap writes so that memsw >= limit holds at every step).
    #[test]
    fn real_limits_can_be_raised_and_lowered() {
        let host = real_host();
        let cg = host.create("test-real-raise", &MIB64).expect("create");
        let mem = cg.dir_with("memory").expect("memory dir").to_owned();
        let file = if host.is_v2() {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        for bytes in [512u64 << 20, 32 << 20, 1 << 30] {
            let limits = CgroupLimits {
                memory_bytes: bytes,
                ..MIB64
            };
            cg.set_limits(&limits)
                .unwrap_or_else(|e| panic!("set {bytes}: {e}"));
            assert_eq!(read(&mem.join(file)), bytes.to_string());
        }
        cg.destroy().expect("destroy");
    }

    #[test]
    fn real_lifecycle() {
        let host = real_host();
        let id = "test-real-lifecycle";
        let cg = host.create(id, &MIB64).expect("create");
        let mem = cg.dir_with("memory").expect("memory dir").to_owned();
        if host.is_v2() {
            assert_eq!(read(&mem.join("memory.max")), "67108864");
            assert_eq!(read(&mem.join("pids.max")), "16");
            assert_eq!(read(&mem.join("cpu.max")), "50000 100000");
        } else {
            let expected = host
                .v1_mount("memory")
                .unwrap()
                .join(AIRLOCK_DIR)
                .join(host.owner())
                .join(id);
            assert_eq!(mem, expected);
            assert_eq!(read(&mem.join("memory.limit_in_bytes")), "67108864");
            let memsw = mem.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                assert_eq!(read(&memsw), "67108864");
            }
            assert_eq!(read(&cg.dir_with("pids").unwrap().join("pids.max")), "16");
            let cpu = cg.dir_with("cpu").unwrap();
            assert_eq!(read(&cpu.join("cpu.cfs_period_us")), "100000");
            assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "50000");
        }
        assert_eq!(cg.clone_into_fd().is_some(), host.cgroup2.is_some());

        let mut child = gated("exec sleep 30", "sh");
        let pid = pid_of(&child);
        cg.attach(pid, false).expect("attach");
        for dir in cg.paths() {
            let procs = read_pids(&dir.join("cgroup.procs")).unwrap();
            assert!(procs.contains(&pid), "{pid} not in {}", dir.display());
        }
        // Let it exec after attaching, so the cgroup is charged for its memory.
        open_gate(&mut child);
        wait_until("exec sleep", || {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
        });
        let usage = cg.usage();
        assert!(usage.memory_peak_bytes > 0, "{usage:?}");
        assert_eq!(usage.oom_kills, 0);
        println!("usage after exec: {usage:?}");

        cg.kill().expect("kill");
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");

        let paths: Vec<PathBuf> = cg.paths().map(Path::to_owned).collect();
        cg.destroy().expect("destroy");
        for p in paths {
            assert!(!p.exists(), "{} left behind", p.display());
        }
    }

    #[test]
    fn real_oom_kill_is_counted() {
        let host = real_host();
        let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("python3");
        let limits = CgroupLimits { cpus: 1.0, ..MIB64 };
        let cg = host.create("test-real-oom", &limits).expect("create");
        let mut child = gated(
            r#"exec "$0" -c 'x = bytearray(200 * 1024 * 1024); print(len(x))'"#,
            python,
        );
        cg.attach(pid_of(&child), false).expect("attach");
        open_gate(&mut child);
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        let usage = cg.usage();
        assert!(usage.oom_kills >= 1, "{usage:?}");
        assert!(usage.memory_peak_bytes <= 64 << 20, "{usage:?}");
        assert!(usage.memory_peak_bytes > 32 << 20, "{usage:?}");
        cg.destroy().expect("destroy");
    }

    /// The fallbacks for hosts without cgroup.kill, forced on this one: a shell and two
    /// grandchildren forked inside the cgroup all die, and destroy leaves nothing.
    #[test]
    fn real_kill_fallbacks() {
        let mut host = real_host();
        // As on a host whose cgroup2 has no cgroup.kill: the v1 freezer is used.
        host.cgroup2_suffices = false;
        let mut methods = vec![("loop", None)];
        if !host.is_v2() && host.v1_mount("freezer").is_some() {
            methods.push(("freezer", Some(())));
        }
        for (name, freezer) in methods {
            let cg = host
                .create(&format!("test-real-kill-{name}"), &MIB64)
                .expect("create");
            let mut child = gated("sleep 30 & sleep 30 & wait", "sh");
            cg.attach(pid_of(&child), false).expect("attach");
            open_gate(&mut child);
            wait_until("two sleeps", || cg.members().is_ok_and(|m| m.len() == 3));
            let method = match freezer {
                Some(()) => KillMethod::Freezer(cg.dir_with("freezer").unwrap().to_owned()),
                None => KillMethod::Loop,
            };
            cg.kill_with(method).expect("kill");
            let status = child.wait().expect("wait");
            assert_eq!(status.signal(), Some(libc::SIGKILL), "{name}: {status:?}");
            cg.wait_empty(Instant::now() + DESTROY_WAIT)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            if let Some(dir) = cg.dir_with("freezer") {
                assert_eq!(read(&dir.join("freezer.state")), "THAWED");
            }
            cg.destroy().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    /// A crashed supervisor's sandbox, with a process still in it, is killed and removed.
    #[test]
    fn real_purge_stale() {
        let host = real_host();
        // pid_max is at most 2^22, so this owner is never alive.
        let owner = "999999999-424242";
        let mut child = Command::new("sleep").arg("30").spawn().expect("spawn");
        let mut dirs = Vec::new();
        for slot in host.plan() {
            let dir = slot.base.join(AIRLOCK_DIR).join(owner).join("test-real-purge");
            fs::create_dir_all(&dir).expect("mkdir");
            write_file(&dir.join("cgroup.procs"), &child.id().to_string()).expect("attach");
            dirs.push(dir);
        }
        assert!(host.purge_stale() >= 1);
        assert_eq!(child.wait().expect("wait").signal(), Some(libc::SIGKILL));
        for dir in dirs {
            assert!(!dir.exists(), "{} left behind", dir.display());
            assert!(!dir.parent().unwrap().exists(), "owner dir left behind");
        }
    }

    /// The move out of a delegated v2 cgroup, on this host's cgroup2: every process of a
    /// test-made cgroup ends up in its `supervisor` leaf, and the cgroup is left empty.
    #[test]
    fn real_evacuate_moves_every_process_to_the_leaf() {
        let host = real_host();
        let Some(mount) = host.cgroup2.clone() else {
            return;
        };
        let dir = mount.join(format!("airlock-test-evacuate-{}", std::process::id()));
        fs::create_dir(&dir).expect("mkdir");
        let mut child = gated("sleep 30 & sleep 30 & wait", "sh");
        write_file(&dir.join("cgroup.procs"), &child.id().to_string()).expect("join");
        open_gate(&mut child);
        wait_until("two sleeps", || {
            read_pids(&dir.join("cgroup.procs")).is_ok_and(|p| p.len() == 3)
        });
        let mut moved = read_pids(&dir.join("cgroup.procs")).unwrap();
        moved.sort_unstable();
        host.evacuate(&dir, &mount).expect("evacuate");
        let leaf = dir.join(SUPERVISOR_DIR);
        assert_eq!(read_pids(&dir.join("cgroup.procs")).unwrap(), Vec::<i32>::new());
        let mut in_leaf = read_pids(&leaf.join("cgroup.procs")).unwrap();
        in_leaf.sort_unstable();
        assert_eq!(in_leaf, moved);
        let _ = fs::write(leaf.join("cgroup.kill"), "1");
        let _ = child.kill();
        let _ = child.wait();
        wait_until("leaf empty", || {
            read_pids(&leaf.join("cgroup.procs")).is_ok_and(|p| p.is_empty())
        });
        fs::remove_dir(&leaf).expect("rmdir leaf");
        fs::remove_dir(&dir).expect("rmdir");
    }

    /// Dropping a cgroup with a live process kills it and removes every directory.
    #[test]
    fn real_drop_kills_and_removes() {
        let host = real_host();
        let cg = host.create("test-real-drop", &MIB64).expect("create");
        let mut child = Command::new("sleep").arg("30").spawn().expect("spawn");
        cg.attach(pid_of(&child), false).expect("attach");
        let paths: Vec<PathBuf> = cg.paths().map(Path::to_owned).collect();
        drop(cg);
        assert_eq!(child.wait().expect("wait").signal(), Some(libc::SIGKILL));
        for p in paths {
            assert!(!p.exists(), "{} left behind", p.display());
        }
    }
}
