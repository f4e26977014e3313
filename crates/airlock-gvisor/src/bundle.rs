//! The OCI bundle of one gVisor sandbox, written by airlock: `config.json` and a root
//! filesystem that is an empty, read-only skeleton of mount points. Into it go the
//! system directories of the host (or of `Shape.rootfs`) bound read-only, nosuid, nodev
//! (the same list the namespace tier binds), a synthesized /etc with a few host files
//! bound read-only, and the agent binary at [`AGENT_PATH`]. The agent itself mounts the
//! writable disk (/tmp, /workspace, /dev/shm on one size-capped tmpfs) at `Create`.
//! /proc, /sys and /dev are gVisor's own (synthesized by the Sentry, no host view).
//!
//! With an image (`BundleSpec::image`, a prepared tree: see `airlock_backend::ImageRoot`)
//! the bundle's root is the image's tree itself, read-only, and nothing is created in
//! it: the identity files of `GENERATED_ETC` are written into the bundle directory and
//! bound read-only over the image's empty ones (the rest of /etc is the image's).
//! Every mount's destination must already exist: runsc creates a missing one in the
//! root on the host, which would write into the shared tree. So the bundle's own
//! `dir/airlock` directory is bound over the image's `/.airlock` (a directory every
//! prepared tree has), holding the mount points of the agent, the host libraries, the
//! egress directory, and the directory the agent mounts the disk on
//! ([`IMAGE_SCRATCH_PATH`]). The agent is a host binary linked against the host's C library, which
//! an image does not have: the loader and libraries it needs ([`HostLibs`]) are bound
//! at [`HOSTLIB_DIR`] and the agent is started through that loader. The compatibility
//! library is not preloaded into an image's programs: it is built against the host's C
//! library, not the image's.

use serde_json::{Value, json};
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

// System directories taken from the host or the rootfs, and the /etc files written
// fresh: the namespace tier's own lists.
use airlock_sandbox::{GENERATED_ETC, SYSTEM_DIRS};

/// Where the agent is inside the sandbox.
pub const AGENT_PATH: &str = "/.airlock/agent";

/// Where the compatibility library is inside the sandbox, when airlock has one: the
/// agent preloads it into every program it starts.
pub const COMPAT_PATH: &str = "/.airlock/compat.so";

/// Where the host's loader and the libraries the agent needs are bound, with an image.
pub const HOSTLIB_DIR: &str = "/.airlock/hostlib";

/// Where the agent mounts the sandbox's disk before binding its parts, with an image
/// (without one, `/.scratch` of the skeleton root): the agent takes it when it exists.
pub const IMAGE_SCRATCH_PATH: &str = "/.airlock/scratch";

/// The host's dynamic loader and the shared libraries the agent binary needs (what `ldd`
/// lists), to run the agent in a root that is not the host's. Empty for a static agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostLibs {
    /// The dynamic loader (`/lib64/ld-linux-x86-64.so.2`); `None`: the agent is static.
    pub loader: Option<PathBuf>,
    /// The libraries, resolved on the host.
    pub libs: Vec<PathBuf>,
}

impl HostLibs {
    /// What `agent` needs, from `ldd`'s answer (run once, at prepare).
    pub fn of(agent: &Path) -> Result<HostLibs, String> {
        let out = std::process::Command::new("ldd")
            .arg(agent)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .map_err(|e| format!("running ldd on {}: {e}", agent.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            // ldd fails on a static binary ("not a dynamic executable").
            let err = String::from_utf8_lossy(&out.stderr);
            if text.contains("not a dynamic executable") || err.contains("not a dynamic executable") {
                return Ok(HostLibs::default());
            }
            return Err(format!("ldd {}: {}", agent.display(), err.trim()));
        }
        Ok(HostLibs::parse(&text))
    }

    /// `ldd` output: `name => /path (0x…)` lines are libraries, a bare `/path (0x…)` is
    /// the loader; the vDSO has no file.
    pub fn parse(ldd: &str) -> HostLibs {
        let mut libs = HostLibs::default();
        for line in ldd.lines() {
            let line = line.trim();
            if line.contains("statically linked") {
                return HostLibs::default();
            }
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.trim(),
                None => line,
            };
            let Some(path) = path.split_whitespace().next().filter(|p| p.starts_with('/')) else {
                continue;
            };
            if line.contains("=>") {
                libs.libs.push(PathBuf::from(path));
            } else {
                libs.loader = Some(PathBuf::from(path));
            }
        }
        libs
    }
}

/// Capabilities of the agent inside the sandbox (root of gVisor's user namespace, not
/// of the host): mount the disk, chown files to the sandbox user, drop to it, kill every
/// process of an exec. The program has none.
const AGENT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_SYS_ADMIN",
];

/// In proxy mode the agent also sets up the redirections of its netstack
/// (`agent::transparent`): addresses on lo, the iptables nat table over a raw socket.
const AGENT_EGRESS_CAPS: &[&str] = &["CAP_NET_ADMIN", "CAP_NET_RAW"];

/// The generated /etc files, with proxy mode's resolver: airlock's, on the sandbox's
/// loopback (the agent relays it to the host), which the C library then asks.
fn generated_etc(egress: bool) -> impl Iterator<Item = (&'static str, &'static str)> {
    GENERATED_ETC.iter().map(move |&(name, content)| match name {
        "resolv.conf" if egress => (name, "nameserver 127.0.0.1\n"),
        "nsswitch.conf" if egress => (
            name,
            "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
        ),
        _ => (name, content),
    })
}

/// What a bundle is built from.
#[derive(Debug, Clone)]
pub struct BundleSpec<'a> {
    /// Where system directories come from (`None`: the host's `/`).
    pub rootfs: Option<&'a Path>,
    /// The agent binary on the host.
    pub agent: &'a Path,
    /// The compatibility library on the host, bound at [`COMPAT_PATH`] when given.
    pub compat: Option<&'a Path>,
    /// Proxy mode: the host directory holding the egress proxy's socket, bound at
    /// `/.airlock/egress` (root-only inside: the agent's relay connects to it).
    pub egress_dir: Option<&'a Path>,
    /// The host directory holding the process keeper's socket, bound at
    /// [`crate::procs::SANDBOX_DIR`] (root-only inside: the agent's keeper connects to it).
    pub procs_dir: Option<&'a Path>,
    /// Proxy mode with secrets: the trust bundle (PEM) bound read-only at
    /// [`airlock_egress::CA_BUNDLE_PATH`].
    pub ca_bundle: Option<&'a [u8]>,
    /// An image's prepared tree: the whole root (then `rootfs` is `None`), with the
    /// host libraries the agent needs.
    pub image: Option<(&'a Path, &'a HostLibs)>,
}

/// A host directory of Unix sockets bound at `dst` (not read-only: connecting to a
/// socket is a write to it).
fn bind_socket_dir(src: &Path, dst: &str) -> Value {
    json!({
        "destination": dst,
        "type": "bind",
        "source": src,
        "options": ["rbind", "nosuid", "nodev", "noexec"],
    })
}

/// Writes the trust bundle into the bundle's directory and binds it over the root's.
fn bind_ca_bundle(dir: &Path, spec: &BundleSpec<'_>, mounts: &mut Vec<Value>) -> io::Result<()> {
    if let Some(pem) = spec.ca_bundle {
        let path = dir.join("ca-bundle.pem");
        fs::write(&path, pem).map_err(|e| io_at("writing", &path, e))?;
        mounts.push(bind(&path, airlock_egress::CA_BUNDLE_PATH));
    }
    Ok(())
}

fn io_at(what: &str, path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

fn mkdir(path: &Path) -> io::Result<()> {
    fs::create_dir_all(path).map_err(|e| io_at("creating", path, e))
}

fn touch(path: &Path) -> io::Result<()> {
    fs::File::create(path)
        .map(drop)
        .map_err(|e| io_at("creating", path, e))
}

fn bind(src: &Path, dst: &str) -> Value {
    json!({
        "destination": dst,
        "type": "bind",
        "source": src,
        "options": ["rbind", "ro", "nosuid", "nodev"],
    })
}

/// Writes the bundle into the empty directory `dir`: `dir/config.json` and
/// `dir/rootfs` (with an image: `dir/etc`, the generated identity files).
pub fn write(dir: &Path, spec: &BundleSpec<'_>) -> io::Result<()> {
    if let Some((image, libs)) = spec.image {
        return write_for_image(dir, image, libs, spec);
    }
    let source = spec.rootfs.unwrap_or(Path::new("/"));
    let root = dir.join("rootfs");
    let mut mounts = Vec::new();
    mkdir(&root)?;
    for name in SYSTEM_DIRS {
        let src = source.join(name);
        let dst = root.join(name);
        match fs::symlink_metadata(&src) {
            // Merged-/usr hosts: /bin -> usr/bin is recreated as the same link.
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = fs::read_link(&src).map_err(|e| io_at("reading link", &src, e))?;
                symlink(&target, &dst).map_err(|e| io_at("creating link", &dst, e))?;
            }
            Ok(meta) if meta.is_dir() => {
                mkdir(&dst)?;
                mounts.push(bind(&src, &format!("/{name}")));
            }
            _ => {}
        }
    }
    let etc = root.join("etc");
    mkdir(&etc)?;
    for (name, content) in generated_etc(spec.egress_dir.is_some()) {
        let path = etc.join(name);
        fs::write(&path, content).map_err(|e| io_at("writing", &path, e))?;
    }
    let src_etc = source.join("etc");
    for name in airlock_sandbox::HOST_ETC_FILES {
        let src = src_etc.join(name);
        let dst = etc.join(name);
        match fs::symlink_metadata(&src) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = fs::read_link(&src) {
                    let _ = symlink(target, &dst);
                }
            }
            Ok(meta) if meta.is_file() => {
                touch(&dst)?;
                mounts.push(bind(&src, &format!("/etc/{name}")));
            }
            _ => {}
        }
    }
    for name in airlock_sandbox::HOST_ETC_DIRS {
        let src = src_etc.join(name);
        if src.is_dir() {
            mkdir(&etc.join(name))?;
            mounts.push(bind(&src, &format!("/etc/{name}")));
        }
    }
    // Mount points: the agent's disk and where the agent binary is bound.
    for d in ["tmp", "workspace", ".scratch", "proc", "dev", "sys", ".airlock"] {
        mkdir(&root.join(d))?;
    }
    touch(&root.join(AGENT_PATH.trim_start_matches('/')))?;
    mounts.push(bind(spec.agent, AGENT_PATH));
    if let Some(compat) = spec.compat {
        touch(&root.join(COMPAT_PATH.trim_start_matches('/')))?;
        mounts.push(bind(compat, COMPAT_PATH));
    }
    if let Some(procs) = spec.procs_dir {
        mkdir(&root.join(".airlock/procs"))?;
        mounts.push(bind_socket_dir(procs, crate::procs::SANDBOX_DIR));
    }
    if let Some(egress) = spec.egress_dir {
        mkdir(&root.join(".airlock/egress"))?;
        // Not read-only: connecting to a socket is a write to it.
        mounts.push(json!({
            "destination": crate::egress::SANDBOX_DIR,
            "type": "bind",
            "source": egress,
            "options": ["rbind", "nosuid", "nodev", "noexec"],
        }));
    }
    bind_ca_bundle(dir, spec, &mut mounts)?;
    mounts.push(json!({"destination": "/proc", "type": "proc", "source": "proc"}));
    let args = vec![AGENT_PATH.to_owned(), crate::agent::AGENT_ARG.to_owned()];
    write_config(dir, json!("rootfs"), mounts, args, spec.egress_dir.is_some())
}

/// The bundle of a sandbox whose root is the prepared tree `image` (see the module docs).
fn write_for_image(dir: &Path, image: &Path, libs: &HostLibs, spec: &BundleSpec<'_>) -> io::Result<()> {
    let mut mounts = Vec::new();
    let etc = dir.join("etc");
    mkdir(&etc)?;
    for (name, content) in generated_etc(spec.egress_dir.is_some()) {
        let path = etc.join(name);
        fs::write(&path, content).map_err(|e| io_at("writing", &path, e))?;
        mounts.push(bind(&path, &format!("/etc/{name}")));
    }
    // /.airlock: the bundle's directory of mount points, over the image's empty one.
    let airlock = dir.join("airlock");
    mkdir(&airlock)?;
    mkdir(&airlock.join("scratch"))?;
    mounts.push(bind(&airlock, "/.airlock"));
    touch(&airlock.join("agent"))?;
    mounts.push(bind(spec.agent, AGENT_PATH));
    let mut args = Vec::new();
    if let Some(loader) = &libs.loader {
        mkdir(&airlock.join("hostlib"))?;
        for lib in libs.libs.iter().chain([loader]) {
            let name = lib
                .file_name()
                .ok_or_else(|| io::Error::other(format!("library {} has no file name", lib.display())))?;
            touch(&airlock.join("hostlib").join(name))?;
            mounts.push(bind(lib, &format!("{HOSTLIB_DIR}/{}", name.to_string_lossy())));
        }
        let loader_name = loader.file_name().unwrap_or_default().to_string_lossy();
        args.extend([
            format!("{HOSTLIB_DIR}/{loader_name}"),
            "--library-path".to_owned(),
            HOSTLIB_DIR.to_owned(),
        ]);
    }
    args.extend([AGENT_PATH.to_owned(), crate::agent::AGENT_ARG.to_owned()]);
    if let Some(procs) = spec.procs_dir {
        mkdir(&airlock.join("procs"))?;
        mounts.push(bind_socket_dir(procs, crate::procs::SANDBOX_DIR));
    }
    if let Some(egress) = spec.egress_dir {
        mkdir(&airlock.join("egress"))?;
        mounts.push(json!({
            "destination": crate::egress::SANDBOX_DIR,
            "type": "bind",
            "source": egress,
            "options": ["rbind", "nosuid", "nodev", "noexec"],
        }));
    }
    bind_ca_bundle(dir, spec, &mut mounts)?;
    mounts.push(json!({"destination": "/proc", "type": "proc", "source": "proc"}));
    write_config(dir, json!(image), mounts, args, spec.egress_dir.is_some())
}

/// Writes `dir/config.json`: the agent (`args`) as the container's process, as root of
/// gVisor's user namespace with [`AGENT_CAPS`] (and [`AGENT_EGRESS_CAPS`] when
/// `egress`), on the read-only `root` with `mounts`.
fn write_config(
    dir: &Path,
    root: Value,
    mounts: Vec<Value>,
    args: Vec<String>,
    egress: bool,
) -> io::Result<()> {
    // Terminals for spawned programs: gVisor's own devpts (ptmx and the pts nodes).
    let mut mounts = mounts;
    mounts.push(json!({
        "destination": "/dev/pts",
        "type": "devpts",
        "source": "devpts",
        "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
    }));
    let caps: Vec<&str> = AGENT_CAPS
        .iter()
        .chain(if egress { AGENT_EGRESS_CAPS } else { &[] })
        .copied()
        .collect();
    let config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {
                "bounding": caps,
                "effective": caps,
                "permitted": caps,
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096u64, "soft": 4096u64}],
            "noNewPrivileges": true,
        },
        "root": {"path": root, "readonly": true},
        "hostname": "airlock",
        "mounts": mounts,
        "linux": {
            "namespaces": [
                {"type": "pid"},
                {"type": "network"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
            ],
        },
    });
    let path = dir.join("config.json");
    let text = serde_json::to_vec_pretty(&config).map_err(io::Error::other)?;
    fs::write(&path, text).map_err(|e| io_at("writing", &path, e))
}

/// The bundle directory of sandbox `id` under an owner's directory.
pub fn dir_of(owner_dir: &Path, id: &str) -> PathBuf {
    owner_dir.join(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundle_binds_system_dirs_read_only_and_runs_the_agent() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("agent-bin");
        fs::write(&agent, b"").unwrap();
        let bundle = dir.path().join("b");
        fs::create_dir(&bundle).unwrap();
        write(
            &bundle,
            &BundleSpec {
                rootfs: None,
                agent: &agent,
                compat: None,
                egress_dir: None,
                procs_dir: None,
                ca_bundle: None,
                image: None,
            },
        )
        .unwrap();
        let config: Value = serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["process"]["args"][0], AGENT_PATH);
        assert_eq!(config["process"]["args"][1], crate::agent::AGENT_ARG);
        assert_eq!(config["root"]["readonly"], true);
        let mounts = config["mounts"].as_array().unwrap();
        let usr = mounts
            .iter()
            .find(|m| m["destination"] == "/usr")
            .expect("/usr is bound");
        assert!(usr["options"].as_array().unwrap().iter().any(|o| o == "ro"));
        assert!(mounts.iter().all(|m| m["destination"] != "/etc"));
        let passwd = fs::read_to_string(bundle.join("rootfs/etc/passwd")).unwrap();
        assert!(passwd.contains("sandbox:x:1000:1000"));
    }

    #[test]
    fn with_an_image_the_root_is_its_tree_and_the_agent_runs_through_the_host_loader() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("agent-bin");
        fs::write(&agent, b"").unwrap();
        let image = dir.path().join("image");
        fs::create_dir(&image).unwrap();
        let bundle = dir.path().join("b");
        fs::create_dir(&bundle).unwrap();
        let libs = HostLibs::parse(
            "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n",
        );
        assert_eq!(
            libs.loader.as_deref(),
            Some(Path::new("/lib64/ld-linux-x86-64.so.2"))
        );
        assert_eq!(libs.libs, vec![PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6")]);
        write(
            &bundle,
            &BundleSpec {
                rootfs: None,
                agent: &agent,
                compat: Some(&agent),
                egress_dir: None,
                procs_dir: None,
                ca_bundle: None,
                image: Some((&image, &libs)),
            },
        )
        .unwrap();
        let config: Value = serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["root"]["path"], image.to_str().unwrap());
        assert_eq!(config["root"]["readonly"], true);
        let args: Vec<&str> = config["process"]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "/.airlock/hostlib/ld-linux-x86-64.so.2",
                "--library-path",
                HOSTLIB_DIR,
                AGENT_PATH,
                crate::agent::AGENT_ARG
            ]
        );
        let mounts = config["mounts"].as_array().unwrap();
        let dests: Vec<&str> = mounts
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        assert!(dests.contains(&"/etc/passwd"), "{dests:?}");
        // Every destination exists before runsc mounts it: in the image (/etc, /proc),
        // or in the bundle's /.airlock, mounted first.
        let airlock = dests.iter().position(|d| *d == "/.airlock").unwrap();
        for (i, d) in dests.iter().enumerate() {
            if let Some(rest) = d.strip_prefix("/.airlock/") {
                assert!(i > airlock, "{d} before /.airlock");
                assert!(bundle.join("airlock").join(rest).exists(), "{d}");
            }
        }
        assert!(dests.contains(&"/.airlock/hostlib/libc.so.6"), "{dests:?}");
        // Nothing of the host's system directories, nor the compat library.
        assert!(
            !dests.contains(&"/usr") && !dests.contains(&COMPAT_PATH),
            "{dests:?}"
        );
        // Nothing was written into the image.
        assert_eq!(fs::read_dir(&image).unwrap().count(), 0);
        assert!(HostLibs::parse("\tstatically linked\n").loader.is_none());
    }
}
