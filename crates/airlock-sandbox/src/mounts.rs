//! Builds the sandbox's filesystem inside its new mount namespace. Runs in init, as root
//! of the sandbox's user namespace, before the program exists.
//!
//! The order matters and is fixed:
//! 1. make every mount private, so nothing propagates back to the host;
//! 2. mount a small tmpfs as the future root and `pivot_root` into it, keeping the host's
//!    root reachable at `/oldroot` (so paths under the host's /tmp stay reachable);
//! 3. bind the system directories read-only, nosuid, nodev; synthesize /etc;
//! 4. one size- and inode-capped tmpfs provides /tmp, /workspace and /dev/shm;
//! 5. a minimal /dev, then a fresh /proc with dangerous paths masked (proc must be mounted
//!    while the host's /proc is still visible: the kernel requires it in a user namespace);
//! 6. detach the host's root, make / read-only, and enter /workspace.
//!
//! With an image (`Layout::image`, a prepared tree: see `airlock_backend::ImageRoot`)
//! the root is the image's tree instead, and nothing is ever created in it (it is the
//! host's directory, shared by every sandbox of the image). The steps stay the same,
//! built on a staging root:
//! 1. as above;
//! 2. as above: the small tmpfs is the staging root, the host's at `/oldroot`, and the
//!    scratch tmpfs at `/.scratch`, both on the staging tmpfs as without an image;
//! 3. the image's tree is bound (recursively, once) at `/.image` on the staging root,
//!    read-only, nosuid, nodev; the identity files of `etc::GENERATED` are written on
//!    the staging tmpfs and bound read-only over the image's empty /etc files (nothing
//!    of the host's /etc: the image's own /etc is used);
//! 4. /tmp and /workspace of the scratch tmpfs are bound over the image's directories;
//! 5. /dev (tmpfs over the image's /dev) and /proc are built under `/.image` exactly as
//!    without an image;
//! 6. the host's root and the scratch mount point are detached; then `pivot_root` into
//!    `/.image`, with the staging root parked on the image's `/.airlock` (a directory
//!    every prepared tree has) and detached at once: the staging tmpfs lives on only
//!    in the files bound from it. / is made read-only (it already is) and the program
//!    starts in its workdir.
//!
//! A CA bundle (proxy mode) is installed after /etc, in either case, through a staging
//! tmpfs of its own (see `etc::install_ca_bundle`).

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::Mode;
use nix::sys::statvfs::{FsFlags, statvfs};
use nix::unistd::{Gid, Uid, chown, mkdir};
use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use crate::etc;

/// uid and gid of the sandbox user inside the user namespace.
pub const SANDBOX_ID: u32 = 1000;

/// Where the host's root stays until it is detached.
const OLD: &str = "/oldroot";
/// Where the scratch tmpfs is mounted before its parts are bound into place.
const SCRATCH: &str = "/.scratch";
/// Where an image's tree is bound on the staging root while the sandbox is built in it.
const IMAGE: &str = "/.image";
/// The directory every prepared image tree has for airlock's own use; the staging root
/// is parked there by the last `pivot_root`.
const AIRLOCK_DIR: &str = "/.airlock";
/// [`AIRLOCK_DIR`] as seen from the staging root, before the last `pivot_root`.
const PARK: &str = "/.image/.airlock";

/// System directories taken from the host (or the rootfs): real directories are bound
/// read-only, symlinks (merged-/usr hosts) are recreated as symlinks.
pub const SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Device nodes bound from the host's /dev. Terminals come from the sandbox's own devpts
/// instance at /dev/pts (with /dev/ptmx pointing at its multiplexer), never the host's:
/// an exec's program gets none; a spawned program may get one (see `keeper`).
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom"];

/// Device nodes bound when the host has them. `tty` opens the opener's own controlling
/// terminal (a spawned program's, in the sandbox's devpts; `ENXIO` for an exec's, which
/// has none), never a terminal of the host's: `less`, `getpass` and editors read it.
const OPTIONAL_DEVICES: &[&str] = &["tty"];

/// /proc files replaced by an empty, unreadable view (/dev/null bound over them):
/// kernel memory, keys, timers and triggers a sandbox has no business reading or poking.
const PROC_MASKED_FILES: &[&str] = &[
    "kcore",
    "keys",
    "key-users",
    "timer_list",
    "sched_debug",
    "sysrq-trigger",
    "kallsyms",
    "kmsg",
    "latency_stats",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "vmallocinfo",
    "iomem",
    "ioports",
    "slabinfo",
    "modules",
    "config.gz",
];

/// /proc directories made read-only: kernel tunables and hardware.
const PROC_READONLY_DIRS: &[&str] = &[
    "sys", "irq", "bus", "fs", "asound", "acpi", "scsi", "driver", "tty",
];

/// Why building the filesystem failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// A mount-related syscall failed.
    #[error("{op} {target}: {source}")]
    Syscall {
        /// What was being done.
        op: &'static str,
        /// The path it was done to.
        target: String,
        /// The errno.
        #[source]
        source: io::Error,
    },
}

fn sys<T>(op: &'static str, target: impl AsRef<Path>, r: nix::Result<T>) -> Result<T, MountError> {
    r.map_err(|e| MountError::Syscall {
        op,
        target: target.as_ref().display().to_string(),
        source: io::Error::from(e),
    })
}

fn io_op<T>(op: &'static str, target: impl AsRef<Path>, r: io::Result<T>) -> Result<T, MountError> {
    r.map_err(|source| MountError::Syscall {
        op,
        target: target.as_ref().display().to_string(),
        source,
    })
}

/// What the filesystem is built from.
#[derive(Debug)]
pub struct Layout<'a> {
    /// Host directory holding the system directories (`/` for the host's own).
    pub rootfs: Option<&'a Path>,
    /// An image's prepared tree on the host: the whole root (then `rootfs` is `None`).
    pub image: Option<&'a Path>,
    /// The image's tree stays writable (an image build's step); it is still nosuid and
    /// nodev.
    pub image_writable: bool,
    /// Size of the writable tmpfs behind /tmp, /workspace and /dev/shm.
    pub disk_bytes: u64,
    /// Proxy mode: /etc's name-resolution files name airlock's resolver.
    pub proxy: bool,
    /// A CA bundle (PEM) to install read-only at `etc::CA_BUNDLE`.
    pub ca_bundle: Option<&'a [u8]>,
}

/// Builds the whole filesystem and leaves the process in /workspace.
pub fn build(layout: &Layout<'_>) -> Result<(), MountError> {
    // 1. Nothing we mount may propagate to the host, and nothing of the host's later
    //    mounts may appear here.
    sys(
        "make private",
        "/",
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        ),
    )?;

    // 2. The new root: a small tmpfs on /tmp of *this* mount namespace (the host never
    //    sees it). After pivot_root the host's root hangs at /oldroot.
    sys(
        "mount root tmpfs",
        "/tmp",
        mount(
            Some("tmpfs"),
            "/tmp",
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0755,size=4m,nr_inodes=4096"),
        ),
    )?;
    mkdir_p(Path::new("/tmp/oldroot"), 0o755)?;
    sys(
        "pivot_root",
        "/tmp",
        nix::unistd::pivot_root("/tmp", "/tmp/oldroot"),
    )?;
    sys("chdir", "/", nix::unistd::chdir("/"))?;

    // Where the sandbox's root is built: the staging root itself, or the image's tree.
    let root = match layout.image {
        Some(image) => {
            // 3. The image's tree, read-only, and generated identity files over its own.
            let src = Path::new(OLD).join(image.strip_prefix("/").unwrap_or(image));
            mkdir_p(Path::new(IMAGE), 0o755)?;
            sys(
                "bind image",
                IMAGE,
                mount(
                    Some(&src),
                    IMAGE,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None::<&str>,
                ),
            )?;
            if layout.image_writable {
                remount_nosuid(&src, Path::new(IMAGE))?;
            } else {
                remount_readonly(&src, Path::new(IMAGE))?;
                // Mounts beneath the tree on the host (a prepared tree has none) are made
                // read-only too; a kernel without mount_setattr (< 5.12) leaves them as
                // they are.
                match crate::sys::make_tree_readonly(c"/.image") {
                    Err(e) if e.raw_os_error() != Some(libc::ENOSYS) => {
                        return io_op("make the image read-only", IMAGE, Err(e));
                    }
                    _ => {}
                }
            }
            check_mount_points(Path::new(IMAGE))?;
            etc::bind_generated(Path::new(IMAGE), layout.proxy)?;
            Path::new(IMAGE)
        }
        None => {
            build_system_dirs(layout.rootfs, layout.proxy)?;
            Path::new("/")
        }
    };
    if let Some(bundle) = layout.ca_bundle {
        etc::install_ca_bundle(root, bundle)?;
    }

    // 4. One tmpfs, capped in bytes and inodes, shared by /tmp, /workspace and /dev/shm:
    //    --disk is one budget for all writable space. Its pages are charged to the
    //    sandbox's memory cgroup too.
    let inodes = (layout.disk_bytes / 4096).max(4096);
    mkdir_p(Path::new(SCRATCH), 0o755)?;
    let opts = format!("mode=0755,size={},nr_inodes={inodes}", layout.disk_bytes);
    sys(
        "mount scratch tmpfs",
        SCRATCH,
        mount(
            Some("tmpfs"),
            SCRATCH,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(opts.as_str()),
        ),
    )?;
    for (part, mode, owner) in [
        ("tmp", 0o1777, 0),
        ("workspace", 0o755, SANDBOX_ID),
        ("shm", 0o1777, 0),
    ] {
        let dir = Path::new(SCRATCH).join(part);
        mkdir_p(&dir, mode)?;
        // Rootless, the namespace maps no root: init's own uid (the sandbox user's)
        // stands in for it.
        let owner = if owner == 0 {
            nix::unistd::geteuid().as_raw()
        } else {
            owner
        };
        sys(
            "chown",
            &dir,
            chown(&dir, Some(Uid::from_raw(owner)), Some(Gid::from_raw(owner))),
        )?;
    }
    for (part, dst) in [("tmp", "tmp"), ("workspace", "workspace")] {
        let dst = root.join(dst);
        if layout.image.is_none() {
            mkdir_p(&dst, 0o755)?;
        }
        bind(&Path::new(SCRATCH).join(part), &dst)?;
    }

    // 5. /dev: a read-only tmpfs holding bound device nodes and a few links.
    build_dev(root)?;
    build_proc(root)?;

    // 6. Let go of the host: the old root and the scratch mount point disappear.
    sys("detach old root", OLD, umount2(OLD, MntFlags::MNT_DETACH))?;
    sys("detach scratch", SCRATCH, umount2(SCRATCH, MntFlags::MNT_DETACH))?;
    io_op("rmdir", OLD, fs::remove_dir(OLD))?;
    io_op("rmdir", SCRATCH, fs::remove_dir(SCRATCH))?;
    if layout.image.is_some() {
        // The staging root goes too: parked on the image's /.airlock, then detached.
        sys("pivot_root", IMAGE, nix::unistd::pivot_root(IMAGE, PARK))?;
        sys("chdir", "/", nix::unistd::chdir("/"))?;
        sys(
            "detach staging root",
            AIRLOCK_DIR,
            umount2(AIRLOCK_DIR, MntFlags::MNT_DETACH),
        )?;
    }
    sys("chdir", "/workspace", nix::unistd::chdir("/workspace"))?;
    Ok(())
}

/// Checks that the mount points a prepared tree must hold are there, as real directories
/// and files: a symbolic link would send a mount elsewhere (it is followed on the staging
/// root, where the host's root is still reachable).
fn check_mount_points(root: &Path) -> Result<(), MountError> {
    let dirs = ["tmp", "workspace", "dev", "proc", "etc", ".airlock"];
    let files = crate::etc::GENERATED
        .iter()
        .map(|(name, _)| format!("etc/{name}"));
    let wanted = dirs
        .iter()
        .map(|d| (d.to_string(), true))
        .chain(files.map(|f| (f, false)));
    for (rel, dir) in wanted {
        let path = root.join(&rel);
        let ok = fs::symlink_metadata(&path).is_ok_and(|m| if dir { m.is_dir() } else { m.is_file() });
        if !ok {
            return Err(MountError::Syscall {
                op: "check the image's mount point",
                target: format!("/{rel}"),
                source: io::Error::other(format!(
                    "a prepared image tree holds it as a {} (not a link)",
                    if dir { "directory" } else { "regular file" }
                )),
            });
        }
    }
    Ok(())
}

/// Step 3 without an image: the system directories of the host (or `rootfs`), read-only,
/// and the synthesized /etc.
fn build_system_dirs(rootfs: Option<&Path>, proxy: bool) -> Result<(), MountError> {
    let source_root = match rootfs {
        Some(dir) => Path::new(OLD).join(dir.strip_prefix("/").unwrap_or(dir)),
        None => PathBuf::from(OLD),
    };
    for name in SYSTEM_DIRS {
        let src = source_root.join(name);
        let dst = Path::new("/").join(name);
        match fs::symlink_metadata(&src) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = io_op("readlink", &src, fs::read_link(&src))?;
                io_op("symlink", &dst, symlink(target, &dst))?;
            }
            Ok(meta) if meta.is_dir() => bind_dir_readonly(&src, &dst)?,
            _ => {}
        }
    }
    etc::build(&source_root, proxy)
}

/// Makes the root read-only, once everything is mounted on it (an image's root already
/// is; the flags its host mount locks are kept).
pub fn seal_root() -> Result<(), MountError> {
    let flags = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | locked_flags(Path::new("/"));
    sys(
        "remount read-only",
        "/",
        mount(None::<&str>, "/", None::<&str>, flags, None::<&str>),
    )
}

/// /dev under `root` (`/`, or the image's tree on the staging root, whose /dev exists).
fn build_dev(root: &Path) -> Result<(), MountError> {
    let dev = root.join("dev");
    mkdir_p(&dev, 0o755)?;
    sys(
        "mount /dev tmpfs",
        &dev,
        mount(
            Some("tmpfs"),
            &dev,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("mode=0755,size=64k,nr_inodes=64"),
        ),
    )?;
    let optional = OPTIONAL_DEVICES
        .iter()
        .filter(|name| Path::new(OLD).join("dev").join(name).exists());
    for name in DEVICES.iter().chain(optional) {
        let dst = dev.join(name);
        io_op("create", &dst, fs::File::create(&dst))?;
        let src = Path::new(OLD).join("dev").join(name);
        sys(
            "bind device",
            &dst,
            mount(Some(&src), &dst, None::<&str>, MsFlags::MS_BIND, None::<&str>),
        )?;
        let flags = MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NOEXEC
            | locked_flags(&src);
        sys(
            "remount device",
            &dst,
            mount(None::<&str>, &dst, None::<&str>, flags, None::<&str>),
        )?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let dst = dev.join(link);
        io_op("symlink", &dst, symlink(target, &dst))?;
    }
    // A devpts instance of the sandbox's own: its terminals are numbered and visible
    // only here, and /dev/ptmx makes new ones in it, for any sandbox user.
    let pts = dev.join("pts");
    mkdir_p(&pts, 0o755)?;
    sys(
        "mount devpts",
        &pts,
        mount(
            Some("devpts"),
            &pts,
            Some("devpts"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        ),
    )?;
    let ptmx = dev.join("ptmx");
    io_op("symlink", &ptmx, symlink("pts/ptmx", &ptmx))?;
    let shm = dev.join("shm");
    mkdir_p(&shm, 0o1777)?;
    bind(&Path::new(SCRATCH).join("shm"), &shm)?;
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    sys(
        "remount /dev read-only",
        &dev,
        mount(None::<&str>, &dev, None::<&str>, flags, Some("mode=0755")),
    )?;
    Ok(())
}

/// A fresh /proc under `root`, its dangerous files masked and kernel tunables read-only.
fn build_proc(root: &Path) -> Result<(), MountError> {
    let proc = root.join("proc");
    mkdir_p(&proc, 0o555)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    sys(
        "mount proc",
        &proc,
        mount(Some("proc"), &proc, Some("proc"), flags, None::<&str>),
    )?;
    let null = root.join("dev/null");
    for name in PROC_MASKED_FILES {
        let path = proc.join(name);
        if path.exists() {
            sys(
                "mask",
                &path,
                mount(Some(&null), &path, None::<&str>, MsFlags::MS_BIND, None::<&str>),
            )?;
        }
    }
    for name in PROC_READONLY_DIRS {
        let path = proc.join(name);
        if path.is_dir() {
            bind_dir_readonly(&path, &path)?;
        }
    }
    Ok(())
}

/// Bind-mounts `src` on `dst` (created if missing), read-write.
fn bind(src: &Path, dst: &Path) -> Result<(), MountError> {
    sys(
        "bind",
        dst,
        mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>),
    )
}

/// Bind-mounts directory `src` on `dst` read-only, nosuid, nodev. A remount in a user
/// namespace must keep the flags the source mount has locked (noexec, atime modes...),
/// so those are read from the source and kept.
pub(crate) fn bind_dir_readonly(src: &Path, dst: &Path) -> Result<(), MountError> {
    if !dst.exists() {
        mkdir_p(dst, 0o755)?;
    }
    sys(
        "bind",
        dst,
        mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>),
    )?;
    remount_readonly(src, dst)
}

/// Remounts the bind at `dst` read-only, nosuid, nodev, keeping `src`'s locked flags.
pub(crate) fn remount_readonly(src: &Path, dst: &Path) -> Result<(), MountError> {
    let flags = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | locked_flags(src);
    sys(
        "remount read-only",
        dst,
        mount(None::<&str>, dst, None::<&str>, flags, None::<&str>),
    )
}

/// Remounts the bind at `dst` (of `src`) nosuid and nodev, leaving it writable.
fn remount_nosuid(src: &Path, dst: &Path) -> Result<(), MountError> {
    let flags =
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | locked_flags(src);
    sys(
        "remount nosuid",
        dst,
        mount(None::<&str>, dst, None::<&str>, flags, None::<&str>),
    )
}

/// The flags of the mount holding `path` that a user namespace may not clear.
fn locked_flags(path: &Path) -> MsFlags {
    let Ok(st) = statvfs(path) else {
        return MsFlags::empty();
    };
    let f = st.flags();
    let mut out = MsFlags::empty();
    for (have, keep) in [
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
    ] {
        if f.contains(have) {
            out |= keep;
        }
    }
    out
}

/// `mkdir -p` with `mode` on the last component (umask does not apply).
pub(crate) fn mkdir_p(path: &Path, mode: u32) -> Result<(), MountError> {
    match mkdir(path, Mode::from_bits_truncate(mode)) {
        Ok(()) => {}
        Err(nix::errno::Errno::EEXIST) => return Ok(()),
        Err(nix::errno::Errno::ENOENT) => {
            if let Some(parent) = path.parent() {
                mkdir_p(parent, 0o755)?;
            }
            sys("mkdir", path, mkdir(path, Mode::from_bits_truncate(mode)))?;
        }
        Err(e) => return sys("mkdir", path, Err(e)),
    }
    // mkdir applied the umask; a mode it took nothing from is already right.
    if mode & umask() == 0 {
        return Ok(());
    }
    io_op(
        "chmod",
        path,
        fs::set_permissions(path, fs::Permissions::from_mode(mode)),
    )
}

/// This process's umask, read once (reading it means setting it, and back).
fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        let old = nix::sys::stat::umask(Mode::from_bits_truncate(0o022));
        nix::sys::stat::umask(old);
        old.bits()
    })
}
