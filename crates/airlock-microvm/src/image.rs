//! The guest's boot files, built from the host and cached:
//!
//! - **kernel**: the distribution's cloud kernel package, downloaded with `apt-get download`
//!   and unpacked with `dpkg-deb -x` into the cache (never installed on the host);
//! - **initramfs**: a newc cpio with the guest agent as `/init` (a static executable, as
//!   `make` and the packages build it: no loader or library; a dynamically linked one, as
//!   a plain `cargo build` makes it, still works and brings its ELF interpreter and
//!   libraries, a few MB more in every template), and the kernel modules it loads
//!   (virtio-mmio, virtio-blk, virtio-console, squashfs, and proxy mode's TUN and
//!   nf_tables), numbered in load order;
//! - **rootfs**: a read-only squashfs image of the system directories the sandbox binds
//!   (`/usr` and the `/bin`, `/lib`… links or directories, and the few `/etc` files the
//!   sandbox's synthesized /etc takes from the host), without what programs never read.
//!
//! Each is keyed by what it is built from (package name; agent and kernel; the mtimes of
//! every directory imaged), so a stale one is rebuilt and a fresh one is reused. Builds
//! hold an exclusive lock on the cache, so concurrent airlock processes build once; stale
//! files are removed only when no other airlock process is using the cache.

use goblin::elf::Elf;
use nix::fcntl::{Flock, FlockArg};
use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::{cpio, kmod};

/// The metapackage that tracks the distribution's current cloud kernel: small, with the
/// virtio drivers, and a cgroup v2 / landlock configuration.
const KERNEL_METAPACKAGE: &str = "linux-image-cloud-amd64";

/// Modules the guest loads, in this order of need: the virtio MMIO transport (QEMU's
/// microvm machine describes its devices in ACPI), the block device the rootfs is on,
/// the console driver that provides the agent's port, and the rootfs's file system.
pub const GUEST_MODULES: &[&str] = &["virtio_mmio", "virtio_blk", "virtio_console", "squashfs"];

/// Modules proxy mode needs in the guest, loaded at boot after [`GUEST_MODULES`] (the
/// guest has no modprobe for the kernel to ask): the sandbox's network namespace gets a
/// TUN device with the default route, and nf_tables rules that redirect every TCP
/// connection to a non-loopback address, and every DNS datagram, to the guest agent's
/// listeners on its loopback, and reject the rest (the NAT chain type and `redirect`,
/// `reject` in the inet, ip and ip6 families). Their dependencies (nfnetlink,
/// conntrack, NAT, defragmentation, the reject helpers, libcrc32c) follow from each
/// module's `depends=`; those a kernel builds in are skipped.
pub const EGRESS_MODULES: &[&str] = &[
    "tun",
    "nf_tables",
    "nft_chain_nat",
    "nft_redir",
    "nft_reject",
    "nft_reject_inet",
    "nft_reject_ipv4",
    "nft_reject_ipv6",
];

/// Directory of the initramfs that holds the modules, as `NN-name.ko`.
pub const INITRAMFS_MODULES_DIR: &str = "modules";

/// The system directories the namespace sandbox binds from the host (see
/// airlock-sandbox's mounts.rs): `/usr` is imaged whole; the others are links to it on a
/// merged-/usr host, or directories imaged as they are.
const SYSTEM_LINKS: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// What the sandbox's synthesized /etc takes from the host, when present: the same
/// entries airlock-sandbox binds.
fn etc_entries() -> impl Iterator<Item = &'static &'static str> {
    airlock_sandbox::HOST_ETC_FILES
        .iter()
        .chain(airlock_sandbox::HOST_ETC_DIRS)
}

/// Never copied from /etc, even inside the entries above: private keys have no place in
/// a cache image.
const ETC_SKIPPED: &[&str] = &["ssl/private"];

/// Left out of the image (paths under the image root). Programs do not read
/// documentation, manual pages, info pages, translations, lintian overrides or apt's
/// package lists; the Google Cloud SDK (1.9 GB on these hosts) is an administrator's tool
/// for the host's cloud account, not something sandboxed code should run. Everything
/// else under /usr stays, so a program that runs in the namespace sandbox runs here.
pub const ROOTFS_EXCLUDES: &[&str] = &[
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "usr/share/package-lists",
    "usr/lib/google-cloud-sdk",
];

/// Mount points the guest needs in its (read-only) root.
const ROOTFS_MOUNT_POINTS: &[&str] = &["dev", "proc", "sys", "tmp", "run"];

/// Why the guest's files could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// A helper program failed.
    #[error("{program} failed: {detail}")]
    Tool {
        /// The program (`apt-get`, `dpkg-deb`, `mksquashfs`).
        program: &'static str,
        /// Its exit status and the end of its stderr.
        detail: String,
    },
    /// The kernel package or its files are not where expected.
    #[error("guest kernel: {0}")]
    Kernel(String),
    /// The guest agent binary is missing or unusable.
    #[error("guest agent {path}: {reason}")]
    Agent {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// An image digest that cannot name a cache file.
    #[error("image digest {0:?} is not `algorithm:hex`")]
    Digest(String),
    /// A kernel module could not be resolved.
    #[error("{0}")]
    Module(#[from] kmod::ModuleError),
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ImageError + 'a {
    move |source| ImageError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// The boot files of one guest, all inside the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestImage {
    /// The kernel image (bzImage).
    pub kernel: PathBuf,
    /// The kernel's release (`6.1.0-57-cloud-amd64`).
    pub kernel_release: String,
    /// The initramfs (uncompressed newc cpio).
    pub initramfs: PathBuf,
    /// The read-only root file system (squashfs).
    pub rootfs: PathBuf,
}

/// How long each part took to prepare (zero when it was cached).
#[derive(Debug, Clone, Copy, Default)]
pub struct PrepareTimes {
    /// Kernel download and unpacking, in milliseconds.
    pub kernel_ms: u64,
    /// Initramfs build.
    pub initramfs_ms: u64,
    /// Checking the rootfs's freshness (the directory walk).
    pub rootfs_check_ms: u64,
    /// Rootfs build.
    pub rootfs_build_ms: u64,
}

/// Where the cache is and what goes into the guest.
#[derive(Debug, Clone)]
pub struct ImageBuilder {
    /// The cache directory (created 0755: QEMU, running unprivileged, reads the files).
    pub cache: PathBuf,
    /// The guest agent binary to put in the initramfs as /init.
    pub agent: PathBuf,
    /// The host root the rootfs is imaged from (`/`).
    pub host_root: PathBuf,
}

impl ImageBuilder {
    /// The guest agent's metadata; missing, an error naming every place it was looked for.
    fn agent_metadata(&self) -> Result<fs::Metadata, ImageError> {
        fs::metadata(&self.agent).map_err(|e| match crate::vm::agent_not_found(&self.agent) {
            // Nowhere it was looked for: the message names every place, each once.
            Some(looked) if e.kind() == io::ErrorKind::NotFound => ImageError::Agent {
                path: PathBuf::from("airlock-guest"),
                reason: looked,
            },
            _ => ImageError::Agent {
                path: self.agent.clone(),
                reason: format!("{e} (build it with `cargo build -p airlock-guest`, or set AIRLOCK_GUEST)"),
            },
        })
    }

    /// Prepares (or reuses) every boot file. The returned [`CacheUse`] keeps them from
    /// being removed as stale by another airlock process while this one uses them: hold
    /// it as long as VMs may be started from them.
    pub fn prepare(&self) -> Result<(GuestImage, PrepareTimes, CacheUse), ImageError> {
        // The agent first: without it nothing below is worth fetching or building.
        self.agent_metadata()?;
        mkdir_world_readable(&self.cache)?;
        // One builder at a time.
        let _build = lock(&self.cache.join("lock"), FlockArg::LockExclusive)?;
        let mut times = PrepareTimes::default();

        let t = Instant::now();
        let (kernel, release, modules) = self.kernel()?;
        times.kernel_ms = ms(t);

        let t = Instant::now();
        let initramfs = self.initramfs(&release, &modules)?;
        times.initramfs_ms = ms(t);

        let t = Instant::now();
        let key = self.rootfs_key()?;
        times.rootfs_check_ms = ms(t);
        let rootfs = self.cache.join(format!("rootfs-{key:016x}.sqfs"));
        if !rootfs.exists() {
            let t = Instant::now();
            self.build_rootfs(&rootfs)?;
            times.rootfs_build_ms = ms(t);
        }

        // Every airlock process that may still start VMs holds the use lock shared. Stale
        // files (another agent's initramfs, the rootfs of an older /usr) are removed only
        // when nobody does; otherwise they wait for a later start.
        remove_stale_if_unused(&self.cache, &initramfs, &rootfs);
        // Taken while still holding the build lock: no builder can remove these files
        // between the clean-up above and this line.
        let using = CacheUse {
            _lock: lock(&self.cache.join(USE_LOCK), FlockArg::LockShared)?,
        };
        Ok((
            GuestImage {
                kernel,
                kernel_release: release,
                initramfs,
                rootfs,
            },
            times,
            using,
        ))
    }

    /// The unpacked kernel: (bzImage, release, modules directory). Downloads it once.
    fn kernel(&self) -> Result<(PathBuf, String, PathBuf), ImageError> {
        let dir = self.cache.join("kernel");
        let current = dir.join("current");
        let package = match fs::read_to_string(&current) {
            Ok(name) if dir.join(name.trim()).is_dir() => name.trim().to_owned(),
            _ => {
                mkdir_world_readable(&dir)?;
                let package = resolve_kernel_package()?;
                let root = dir.join(&package);
                if !root.is_dir() {
                    download_kernel(&dir, &package, &root)?;
                }
                write_atomic(&current, package.as_bytes())?;
                package
            }
        };
        let root = dir.join(&package);
        let release = package
            .strip_prefix("linux-image-")
            .unwrap_or(&package)
            .to_owned();
        let bzimage = root.join("boot").join(format!("vmlinuz-{release}"));
        let modules = root.join("lib/modules").join(&release);
        if !bzimage.is_file() || !modules.is_dir() {
            return Err(ImageError::Kernel(format!(
                "{} has no boot/vmlinuz-{release} or lib/modules/{release}",
                root.display()
            )));
        }
        // The uncompressed ELF kernel boots directly at its PVH entry point: no
        // decompression by an emulated CPU (about 0.8 s of a 2.5 s TCG boot here). When it
        // cannot be extracted, the bzImage boots too.
        let vmlinux = root.join("boot").join(format!("vmlinux-{release}"));
        let failed = root.join("boot").join(format!("vmlinux-{release}.failed"));
        if !vmlinux.exists() && !failed.exists() && extract_vmlinux(&bzimage, &vmlinux).is_err() {
            let _ = fs::write(&failed, b"");
        }
        let kernel = if vmlinux.is_file() { vmlinux } else { bzimage };
        Ok((kernel, release, modules))
    }

    /// The initramfs for this agent and kernel.
    fn initramfs(&self, release: &str, modules: &Path) -> Result<PathBuf, ImageError> {
        let meta = self.agent_metadata()?;
        let mut key = Fnv::new();
        key.add(self.agent.as_os_str().as_encoded_bytes());
        key.add(&meta.len().to_le_bytes());
        key.add(&meta.mtime().to_le_bytes());
        key.add(&meta.mtime_nsec().to_le_bytes());
        key.add(release.as_bytes());
        key.add(&[FORMAT_VERSION, INITRAMFS_VERSION]);
        for module in GUEST_MODULES.iter().chain(EGRESS_MODULES) {
            key.add(module.as_bytes());
        }
        let path = self.cache.join(format!("initramfs-{:016x}.cpio", key.0));
        if path.exists() {
            return Ok(path);
        }
        let agent = stripped(&self.agent, &self.cache)?;
        let mut w = cpio::Writer::new(io::BufWriter::new(Vec::new()));
        let cpio_err = io_err("write initramfs", &path);
        let mut dirs = std::collections::BTreeSet::new();
        let mut add_dirs = |w: &mut cpio::Writer<_>, file: &str| -> io::Result<()> {
            let mut at = String::new();
            for part in Path::new(file).parent().into_iter().flat_map(Path::iter) {
                if part == "/" {
                    continue;
                }
                at = format!("{at}/{}", part.to_string_lossy());
                if dirs.insert(at.clone()) {
                    w.dir(&at, 0o755)?;
                }
            }
            Ok(())
        };
        (|| -> io::Result<()> {
            w.dir("dev", 0o755)?;
            // The kernel opens /dev/console for init's stdio before any devtmpfs exists.
            w.chardev("dev/console", 0o600, 5, 1)?;
            w.file("init", 0o755, &agent)?;
            Ok(())
        })()
        .map_err(cpio_err)?;
        let libraries = elf_closure(&self.agent)?;
        if !libraries.is_empty() {
            tracing::warn!(
                agent = %self.agent.display(),
                libraries = libraries.len(),
                "the guest agent is dynamically linked: its loader and libraries go into the initramfs too (build it static: `make`, or `cargo rustc -p airlock-guest --bin airlock-guest -- -C target-feature=+crt-static`)"
            );
        }
        for lib in libraries {
            let data = fs::read(&lib).map_err(io_err("read", &lib))?;
            let name = lib.to_string_lossy().into_owned();
            add_dirs(&mut w, &name).map_err(io_err("write initramfs", &path))?;
            w.file(&name, 0o755, &data)
                .map_err(io_err("write initramfs", &path))?;
        }
        w.dir(INITRAMFS_MODULES_DIR, 0o755)
            .map_err(io_err("write initramfs", &path))?;
        for (i, module) in kmod::resolve(modules, &[GUEST_MODULES, EGRESS_MODULES].concat())?
            .iter()
            .enumerate()
        {
            let name = format!("{INITRAMFS_MODULES_DIR}/{i:02}-{}.ko", module.name);
            w.file(&name, 0o644, &module.data)
                .map_err(io_err("write initramfs", &path))?;
        }
        let bytes = w
            .finish()
            .and_then(|b| b.into_inner().map_err(|e| e.into_error()))
            .map_err(io_err("write initramfs", &path))?;
        write_atomic(&path, &bytes)?;
        Ok(path)
    }

    /// A fingerprint of everything imaged: the mtime of every directory (a package
    /// install, removal or upgrade renames files into place, which changes their
    /// directory's mtime) and of the /etc entries, plus the image's layout.
    fn rootfs_key(&self) -> Result<u64, ImageError> {
        let mut key = Fnv::new();
        key.add(&[FORMAT_VERSION]);
        for e in ROOTFS_EXCLUDES {
            key.add(e.as_bytes());
        }
        let root = &self.host_root;
        walk_dir_mtimes(&root.join("usr"), root, &mut key);
        for name in SYSTEM_LINKS {
            let path = root.join(name);
            match fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => {
                    key.add(
                        fs::read_link(&path)
                            .unwrap_or_default()
                            .as_os_str()
                            .as_encoded_bytes(),
                    );
                }
                Ok(m) if m.is_dir() => walk_dir_mtimes(&path, root, &mut key),
                _ => {}
            }
        }
        for name in etc_entries() {
            let path = root.join("etc").join(name);
            if let Ok(m) = fs::symlink_metadata(&path) {
                key.add(name.as_bytes());
                key.add(&m.mtime().to_le_bytes());
                key.add(&m.mtime_nsec().to_le_bytes());
                if m.is_dir() {
                    walk_dir_mtimes(&path, root, &mut key);
                }
            }
        }
        Ok(key.0)
    }

    /// Builds the squashfs image at `dest` (through a temporary file, renamed at the end).
    fn build_rootfs(&self, dest: &Path) -> Result<(), ImageError> {
        let stage = tempdir_in(&self.cache, "stage-")?;
        let result = self.build_rootfs_in(&stage, dest);
        let _ = fs::remove_dir_all(&stage);
        result
    }

    fn build_rootfs_in(&self, stage: &Path, dest: &Path) -> Result<(), ImageError> {
        let root = &self.host_root;
        let etc = stage.join("etc");
        fs::create_dir(&etc).map_err(io_err("mkdir", &etc))?;
        for name in etc_entries() {
            let src = root.join("etc").join(name);
            if fs::symlink_metadata(&src).is_ok() {
                copy_tree(&src, &etc.join(name), Path::new(name))?;
            }
        }
        let tmp = dest.with_extension("sqfs.tmp");
        let mut cmd = Command::new("mksquashfs");
        cmd.arg(root.join("usr")).arg(&etc);
        let mut pseudo = Vec::new();
        for name in SYSTEM_LINKS {
            let path = root.join(name);
            match fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => {
                    let target = fs::read_link(&path).map_err(io_err("readlink", &path))?;
                    pseudo.push(format!("{name} s 777 0 0 {}", target.display()));
                }
                Ok(m) if m.is_dir() => {
                    cmd.arg(&path);
                }
                _ => {}
            }
        }
        for dir in ROOTFS_MOUNT_POINTS {
            pseudo.push(format!("{dir} d 755 0 0"));
        }
        cmd.arg(&tmp);
        // lz4: the fastest to decompress, which matters to a guest whose CPU is emulated;
        // no xattrs (the sandbox binds nosuid and drops every capability anyway).
        cmd.args([
            "-noappend",
            "-no-xattrs",
            "-comp",
            "lz4",
            "-quiet",
            "-no-progress",
        ]);
        for p in &pseudo {
            cmd.arg("-p").arg(p);
        }
        // -e takes every remaining argument, so it comes last.
        cmd.args(["-wildcards", "-e"]).args(ROOTFS_EXCLUDES);
        run_tool("mksquashfs", &mut cmd)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644)).map_err(io_err("chmod", &tmp))?;
        fs::rename(&tmp, dest).map_err(io_err("rename", dest))
    }
}

/// Where an OCI image's squashfs lives in the cache, by its manifest digest.
pub const IMAGES_DIR: &str = "images";

/// An OCI image's root as a read-only block image: a squashfs of the image store's
/// prepared tree, built once per manifest digest into `<cache>/images/` and reused by
/// every VM of the image (and every airlock process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageDrive {
    /// The image's manifest digest.
    pub digest: String,
    /// The squashfs, world-readable (the VMM opens it unprivileged).
    pub path: PathBuf,
    /// The file's identity (device, inode, mtime in ns): a template keyed by it is never
    /// restored over another file under the same name (a cache removed by hand and
    /// rebuilt), whose blocks its guest's page cache would not match.
    pub identity: (u64, u64, i128),
    /// How long building it took in this call; `None`: it was cached.
    pub built_ms: Option<u64>,
}

/// The cache file name for `digest` (`sha256:<hex>` → `sha256-<hex>.sqfs`): an
/// algorithm and a hex string, nothing that could name another path.
fn image_file_name(digest: &str) -> Result<String, ImageError> {
    let bad = || ImageError::Digest(digest.to_owned());
    let (algo, hex) = digest.split_once(':').ok_or_else(bad)?;
    let algo_ok = !algo.is_empty()
        && algo.len() <= 32
        && algo.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let hex_ok = (1..=128).contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit());
    if !algo_ok || !hex_ok {
        return Err(bad());
    }
    Ok(format!("{algo}-{}.sqfs", hex.to_ascii_lowercase()))
}

impl ImageBuilder {
    /// The squashfs of an image's prepared tree `root` (see `airlock_backend::ImageRoot`),
    /// built once per `digest`: a digest names the content, so a file that exists is the
    /// image. Builders of one digest take turns on its own lock (the second finds the
    /// first's file); a build goes to a temporary name, renamed into place when complete,
    /// so a file under the final name is always whole.
    pub fn image_drive(&self, digest: &str, root: &Path) -> Result<ImageDrive, ImageError> {
        let name = image_file_name(digest)?;
        let dir = self.cache.join(IMAGES_DIR);
        mkdir_world_readable(&self.cache)?;
        mkdir_world_readable(&dir)?;
        let path = dir.join(&name);
        let found = |built_ms| -> Result<ImageDrive, ImageError> {
            let m = fs::metadata(&path).map_err(io_err("stat", &path))?;
            Ok(ImageDrive {
                digest: digest.to_owned(),
                path: path.clone(),
                identity: (
                    m.dev(),
                    m.ino(),
                    i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
                ),
                built_ms,
            })
        };
        if path.is_file() {
            return found(None);
        }
        let _build = lock(&dir.join(format!("{name}.lock")), FlockArg::LockExclusive)?;
        if path.is_file() {
            return found(None);
        }
        // What a builder that died mid-way left (only builders write these, under this
        // lock).
        remove_others(&dir, &format!("{name}.tmp"), Path::new(""));
        let t = Instant::now();
        build_image_squashfs(root, &path)?;
        found(Some(ms(t)))
    }
}

/// The image drives in `cache`: how many, and their bytes in all.
pub fn cached_image_drives(cache: &Path) -> (usize, u64) {
    let Ok(entries) = fs::read_dir(cache.join(IMAGES_DIR)) else {
        return (0, 0);
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".sqfs"))
        .filter_map(|e| e.metadata().ok())
        .fold((0, 0), |(n, bytes), m| (n + 1, bytes + m.len()))
}

/// Removes the image drives in `cache` of the images whose manifest digests are
/// `digests` (`sha256:<hex>`; an image removed from its store), each under its build lock
/// so a drive being built is not cut; returns how many and their bytes. Drives of other
/// images stay: several image stores may share one VM cache. A VM that has a removed
/// drive open keeps reading it.
pub fn remove_image_drives(cache: &Path, digests: &[String]) -> Result<(usize, u64), ImageError> {
    let dir = cache.join(IMAGES_DIR);
    let mut removed = (0, 0);
    for digest in digests {
        let name = image_file_name(digest)?;
        let path = dir.join(&name);
        if !path.is_file() {
            continue;
        }
        let _build = lock(&dir.join(format!("{name}.lock")), FlockArg::LockExclusive)?;
        let Ok(m) = fs::metadata(&path) else { continue };
        fs::remove_file(&path).map_err(io_err("remove", &path))?;
        removed = (removed.0 + 1, removed.1 + m.len());
    }
    Ok(removed)
}

/// `mksquashfs` of the prepared tree `root` into `dest`, through a temporary file. The
/// tree is taken as it is (owners, modes: root-owned, readable by all, no setuid bits, as
/// the store prepares it), without xattrs; lz4 for an emulated guest's CPU, like the
/// rootfs.
fn build_image_squashfs(root: &Path, dest: &Path) -> Result<(), ImageError> {
    if !root.is_dir() {
        return Err(ImageError::Io {
            what: "read the image's prepared tree",
            path: root.to_owned(),
            source: io::Error::from(io::ErrorKind::NotFound),
        });
    }
    let tmp = dest.with_extension(format!("sqfs.tmp{}", std::process::id()));
    let mut cmd = Command::new("mksquashfs");
    cmd.arg(root).arg(&tmp).args([
        "-noappend",
        "-no-xattrs",
        "-comp",
        "lz4",
        "-quiet",
        "-no-progress",
    ]);
    let built = run_tool("mksquashfs", &mut cmd).and_then(|_| {
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644)).map_err(io_err("chmod", &tmp))?;
        fs::rename(&tmp, dest).map_err(io_err("rename", dest))
    });
    if built.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    built
}

/// A shared lock on the cache's files: while held, no airlock process removes them.
#[derive(Debug)]
pub struct CacheUse {
    /// Owned: the shared flock on `use.lock`, released on drop.
    _lock: Flock<fs::File>,
}

/// The lock every process that may boot from the cache holds shared.
const USE_LOCK: &str = "use.lock";

/// Removes the initramfs and rootfs files other than `initramfs` and `rootfs`, unless
/// another process holds the cache's use lock. Returns whether it removed (or could have).
fn remove_stale_if_unused(cache: &Path, initramfs: &Path, rootfs: &Path) -> bool {
    let Ok(only_us) = lock(&cache.join(USE_LOCK), FlockArg::LockExclusiveNonblock) else {
        return false;
    };
    remove_others(cache, "initramfs-", initramfs);
    remove_others(cache, "rootfs-", rootfs);
    drop(only_us);
    true
}

/// Opens (creating) `path` and flocks it.
fn lock(path: &Path, how: FlockArg) -> Result<Flock<fs::File>, ImageError> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io_err("open", path))?;
    Flock::lock(file, how).map_err(|(_, e)| ImageError::Io {
        what: "lock",
        path: path.to_owned(),
        source: e.into(),
    })
}

/// Bumped when the layout of an initramfs or rootfs changes, so old cached ones are
/// rebuilt.
const FORMAT_VERSION: u8 = 1;

/// Bumped when what goes into an initramfs changes (not the rootfs: that rebuild is
/// long): 2, the agent fully stripped.
const INITRAMFS_VERSION: u8 = 2;

fn ms(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}

/// FNV-1a, 64 bits: a stable fingerprint (std's hasher may change between releases).
#[derive(Debug)]
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn add(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        // A separator, so ("ab","c") and ("a","bc") differ.
        self.0 ^= 0xff;
        self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
    }
}

/// Adds the path and mtime of every directory under `dir` (not following links, skipping
/// the excluded subtrees) to `key`, in a stable order.
fn walk_dir_mtimes(dir: &Path, root: &Path, key: &mut Fnv) {
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    if ROOTFS_EXCLUDES.iter().any(|e| rel == Path::new(e)) {
        return;
    }
    let Ok(meta) = fs::symlink_metadata(dir) else {
        return;
    };
    key.add(rel.as_os_str().as_encoded_bytes());
    key.add(&meta.mtime().to_le_bytes());
    key.add(&meta.mtime_nsec().to_le_bytes());
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut subdirs: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    subdirs.sort();
    for sub in subdirs {
        walk_dir_mtimes(&sub, root, key);
    }
}

/// Copies a file, link or directory tree, keeping links as links.
fn copy_tree(src: &Path, dst: &Path, rel: &Path) -> Result<(), ImageError> {
    if ETC_SKIPPED.iter().any(|s| rel == Path::new(s)) {
        return Ok(());
    }
    let meta = fs::symlink_metadata(src).map_err(io_err("stat", src))?;
    let kind = meta.file_type();
    if kind.is_symlink() {
        let target = fs::read_link(src).map_err(io_err("readlink", src))?;
        symlink(target, dst).map_err(io_err("symlink", dst))?;
    } else if kind.is_dir() {
        fs::create_dir(dst).map_err(io_err("mkdir", dst))?;
        fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o755))
            .map_err(io_err("chmod", dst))?;
        for entry in fs::read_dir(src).map_err(io_err("read", src))?.flatten() {
            let name = entry.file_name();
            copy_tree(&entry.path(), &dst.join(&name), &rel.join(&name))?;
        }
    } else if kind.is_file() {
        fs::copy(src, dst).map_err(io_err("copy", src))?;
    }
    Ok(())
}

/// The ELF interpreter and every shared library `binary` needs, transitively, as host
/// paths (the initramfs holds them at the same paths): none for a static executable.
fn elf_closure(binary: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let agent_err = |reason: String| ImageError::Agent {
        path: binary.to_owned(),
        reason,
    };
    let mut out: Vec<PathBuf> = Vec::new();
    let mut queue = vec![binary.to_owned()];
    let mut dirs: Vec<PathBuf> = [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64",
        "/usr/lib64",
        "/lib",
        "/usr/lib",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    while let Some(file) = queue.pop() {
        let data = fs::read(&file).map_err(|e| agent_err(format!("reading {}: {e}", file.display())))?;
        let elf = Elf::parse(&data).map_err(|e| agent_err(format!("{}: {e}", file.display())))?;
        if let Some(interp) = elf.interpreter {
            let interp = PathBuf::from(interp);
            if let Some(dir) = interp.parent() {
                dirs.push(dir.to_owned());
            }
            if !out.contains(&interp) {
                out.push(interp.clone());
            }
        }
        for lib in &elf.libraries {
            let found = dirs
                .iter()
                .map(|d| d.join(lib))
                .find(|p| p.is_file())
                .ok_or_else(|| agent_err(format!("library {lib} not found")))?;
            if !out.contains(&found) {
                out.push(found.clone());
                queue.push(found);
            }
        }
    }
    Ok(out)
}

/// The agent's bytes without debug sections or symbols when `strip` is installed (a debug
/// build is tens of megabytes, and a release build's symbols a megabyte, that the guest
/// kernel would copy at every boot and each template keeps in its RAM), else as they
/// are. Nothing reads them in the guest: a panic's message names its place without them.
fn stripped(agent: &Path, cache: &Path) -> Result<Vec<u8>, ImageError> {
    let tmp = cache.join(format!("agent-{}.tmp", std::process::id()));
    let ok = Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&tmp)
        .arg(agent)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let data = if ok { fs::read(&tmp) } else { fs::read(agent) };
    let _ = fs::remove_file(&tmp);
    data.map_err(|e| ImageError::Agent {
        path: agent.to_owned(),
        reason: e.to_string(),
    })
}

/// Compressed payloads a bzImage may carry: magic, and the decompressor that reads it
/// (each ignores or stops at the bytes after the payload).
const KERNEL_PAYLOADS: &[(&[u8], &str)] = &[
    (&[0x02, 0x21, 0x4c, 0x18], "lz4"),
    (&[0x28, 0xb5, 0x2f, 0xfd], "zstd"),
    (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz"),
    (&[0x1f, 0x8b, 0x08], "gzip"),
];

/// Finds the compressed kernel inside a bzImage and decompresses it to `dest`; the result
/// must be an x86_64 ELF executable with a PVH entry note (what QEMU boots directly).
fn extract_vmlinux(bzimage: &Path, dest: &Path) -> Result<(), ImageError> {
    let data = fs::read(bzimage).map_err(io_err("read", bzimage))?;
    for (magic, tool) in KERNEL_PAYLOADS {
        let mut from = 0;
        while let Some(at) = data[from..]
            .windows(magic.len())
            .position(|w| w == *magic)
            .map(|p| p + from)
        {
            from = at + 1;
            let Ok(mut child) = Command::new(tool)
                .arg("-dc")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
            else {
                break;
            };
            let mut stdin = child.stdin.take().expect("piped");
            let payload = data[at..].to_vec();
            let feeder = std::thread::spawn(move || {
                let _ = stdin.write_all(&payload);
            });
            let out = child
                .wait_with_output()
                .map_err(io_err("run decompressor", bzimage))?;
            let _ = feeder.join();
            let elf_ok = goblin::elf::Elf::parse(&out.stdout).is_ok_and(|elf| {
                elf.header.e_machine == goblin::elf::header::EM_X86_64
                    && elf.header.e_type == goblin::elf::header::ET_EXEC
                    && elf
                        .iter_note_headers(&out.stdout)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .any(|n| n.name == "Xen" && n.n_type == XEN_ELFNOTE_PHYS32_ENTRY)
            });
            if elf_ok {
                return write_atomic(dest, &out.stdout);
            }
        }
    }
    Err(ImageError::Kernel(format!(
        "no PVH-bootable ELF kernel found inside {}",
        bzimage.display()
    )))
}

/// The ELF note that marks a kernel's PVH entry point (Xen's PHYS32_ENTRY).
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

/// The kernel package the metapackage points at (`linux-image-6.1.0-57-cloud-amd64`).
fn resolve_kernel_package() -> Result<String, ImageError> {
    let out = run_tool(
        "apt-cache",
        Command::new("apt-cache").args(["depends", KERNEL_METAPACKAGE]),
    )?;
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-") && p.chars().any(|c| c.is_ascii_digit()))
        .map(str::to_owned)
        .ok_or_else(|| {
            ImageError::Kernel(format!(
                "apt-cache depends {KERNEL_METAPACKAGE} names no linux-image package"
            ))
        })
}

/// `apt-get download` + `dpkg-deb -x` into `root` (through a temporary directory).
fn download_kernel(dir: &Path, package: &str, root: &Path) -> Result<(), ImageError> {
    let tmp = tempdir_in(dir, "download-")?;
    let result = (|| {
        // apt hands the download to its unprivileged `_apt` user, which must be able to
        // write the directory.
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o777)).map_err(io_err("chmod", &tmp))?;
        run_tool(
            "apt-get",
            Command::new("apt-get")
                .args(["download", "-q", package])
                .current_dir(&tmp),
        )?;
        let deb = fs::read_dir(&tmp)
            .map_err(io_err("read", &tmp))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .ok_or_else(|| ImageError::Kernel(format!("apt-get download {package} left no .deb")))?;
        let unpacked = tmp.join("root");
        run_tool(
            "dpkg-deb",
            Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked),
        )?;
        fs::set_permissions(&unpacked, fs::Permissions::from_mode(0o755))
            .map_err(io_err("chmod", &unpacked))?;
        fs::rename(&unpacked, root).map_err(io_err("rename", root))
    })();
    let _ = fs::remove_dir_all(&tmp);
    result
}

/// Runs a helper to completion; its stdout on success.
fn run_tool(program: &'static str, cmd: &mut Command) -> Result<String, ImageError> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| ImageError::Tool {
        program,
        detail: format!("cannot run it: {e} (is it installed?)"),
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        return Err(ImageError::Tool {
            program,
            detail: format!(
                "{}: {}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn mkdir_world_readable(dir: &Path) -> Result<(), ImageError> {
    fs::create_dir_all(dir).map_err(io_err("mkdir", dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).map_err(io_err("chmod", dir))
}

/// A fresh, empty, private directory in `parent`.
fn tempdir_in(parent: &Path, prefix: &str) -> Result<PathBuf, ImageError> {
    let path = parent.join(format!("{prefix}{}", std::process::id()));
    let _ = fs::remove_dir_all(&path);
    fs::create_dir(&path).map_err(io_err("mkdir", &path))?;
    Ok(path)
}

/// Writes `path` through a temporary file and a rename, world-readable.
fn write_atomic(path: &Path, data: &[u8]) -> Result<(), ImageError> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644))?;
        fs::rename(&tmp, path)
    })()
    .map_err(io_err("write", path))
}

/// Removes the other cache files of one kind (`rootfs-*`), keeping `keep`.
fn remove_others(cache: &Path, prefix: &str, keep: &Path) {
    let Ok(entries) = fs::read_dir(cache) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path != keep && entry.file_name().to_string_lossy().starts_with(prefix) {
            let _ = fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_changes_when_a_directory_changes() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("usr/bin")).unwrap();
        fs::create_dir_all(root.path().join("usr/share/doc/x")).unwrap();
        symlink("usr/bin", root.path().join("bin")).unwrap();
        let b = ImageBuilder {
            cache: root.path().join("cache"),
            agent: PathBuf::from("/nonexistent"),
            host_root: root.path().to_owned(),
        };
        let k1 = b.rootfs_key().unwrap();
        assert_eq!(k1, b.rootfs_key().unwrap());
        // Excluded trees do not count.
        fs::write(root.path().join("usr/share/doc/x/README"), "x").unwrap();
        fs::create_dir(root.path().join("usr/share/doc/y")).unwrap();
        assert_eq!(k1, b.rootfs_key().unwrap());
        // A new program does.
        std::thread::sleep(std::time::Duration::from_millis(10));
        fs::write(root.path().join("usr/bin/tool"), "x").unwrap();
        assert_ne!(k1, b.rootfs_key().unwrap());
    }

    #[test]
    fn an_image_file_is_named_by_its_digest_and_nothing_else() {
        assert_eq!(
            image_file_name("sha256:ABCdef0123").unwrap(),
            "sha256-abcdef0123.sqfs"
        );
        for bad in [
            "sha256",
            "sha256:",
            ":abc",
            "sha256:../x",
            "sha256:ab/cd",
            "../x:ab",
            "SHA:ab",
        ] {
            assert!(image_file_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_image_is_built_once_per_digest() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("opt")).unwrap();
        fs::write(root.join("opt/hello.txt"), "hello\n").unwrap();
        let b = ImageBuilder {
            cache: dir.path().join("cache"),
            agent: PathBuf::from("/nonexistent"),
            host_root: PathBuf::from("/nonexistent"),
        };
        // A dead builder's leftover goes at the next build.
        fs::create_dir_all(b.cache.join(IMAGES_DIR)).unwrap();
        fs::write(b.cache.join(IMAGES_DIR).join("sha256-0123.sqfs.tmp1"), "x").unwrap();
        let first = b.image_drive("sha256:0123", &root).unwrap();
        assert!(first.built_ms.is_some());
        let meta = fs::metadata(&first.path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o644);
        let again = b.image_drive("sha256:0123", &root).unwrap();
        assert_eq!(
            (&again.path, again.identity, again.built_ms),
            (&first.path, first.identity, None)
        );
        assert_eq!(fs::metadata(&again.path).unwrap().ino(), meta.ino());
        // Nothing else is left in the images directory but the file and its lock.
        let mut names: Vec<String> = fs::read_dir(b.cache.join(IMAGES_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["sha256-0123.sqfs", "sha256-0123.sqfs.lock"]);
        assert_eq!(cached_image_drives(&b.cache), (1, meta.len()));
        // A missing tree is an error, and leaves nothing behind.
        assert!(b.image_drive("sha256:4567", &dir.path().join("nope")).is_err());
        assert!(!b.cache.join(IMAGES_DIR).join("sha256-4567.sqfs").exists());
    }

    #[test]
    fn stale_files_stay_while_another_process_uses_the_cache() {
        let cache = tempfile::tempdir().unwrap();
        let file = |n: &str| {
            let p = cache.path().join(n);
            fs::write(&p, "x").unwrap();
            p
        };
        let (new_i, new_r) = (file("initramfs-2.cpio"), file("rootfs-2.sqfs"));
        let (old_i, old_r) = (file("initramfs-1.cpio"), file("rootfs-1.sqfs"));
        // Another user (a separate open file description, as another process would have).
        let other = lock(&cache.path().join(USE_LOCK), FlockArg::LockShared).unwrap();
        assert!(!remove_stale_if_unused(cache.path(), &new_i, &new_r));
        assert!(old_i.exists() && old_r.exists());
        drop(other);
        assert!(remove_stale_if_unused(cache.path(), &new_i, &new_r));
        assert!(!old_i.exists() && !old_r.exists());
        assert!(new_i.exists() && new_r.exists());
    }

    #[test]
    fn a_static_executable_needs_no_loader_or_library() {
        // Debian's ldconfig is a static-pie executable, as the guest agent built by `make`.
        let ldconfig = Path::new("/sbin/ldconfig");
        assert!(ldconfig.is_file(), "no /sbin/ldconfig on this host");
        assert_eq!(elf_closure(ldconfig).unwrap(), Vec::<PathBuf>::new());
    }

    #[test]
    fn closure_of_a_dynamic_binary_has_its_loader_and_libc() {
        let exe = std::env::current_exe().unwrap();
        let libs = elf_closure(&exe).unwrap();
        assert!(
            libs.iter().any(|p| p.to_string_lossy().contains("ld-linux")),
            "{libs:?}"
        );
        assert!(
            libs.iter().any(|p| p.to_string_lossy().contains("libc.so")),
            "{libs:?}"
        );
    }
}
