//! The OCI bundle of one gVisor sandbox, written by airlock: `config.json` and a root
//! filesystem that is an empty, read-only skeleton of mount points. Into it go the
//! system directories of the host (or of `Shape.rootfs`) bound read-only, nosuid, nodev
//! (the same list the namespace tier binds), a synthesized /etc with a few host files
//! bound read-only, and the agent binary at [`AGENT_PATH`]. The agent itself mounts the
//! writable disk (/tmp, /workspace, /dev/shm on one size-capped tmpfs) at `Create`.
//! /proc, /sys and /dev are gVisor's own (synthesized by the Sentry, no host view).

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
/// `dir/rootfs`.
pub fn write(dir: &Path, spec: &BundleSpec<'_>) -> io::Result<()> {
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
    for (name, content) in GENERATED_ETC {
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
    mounts.push(json!({"destination": "/proc", "type": "proc", "source": "proc"}));

    let config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": [AGENT_PATH, crate::agent::AGENT_ARG],
            "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {
                "bounding": AGENT_CAPS,
                "effective": AGENT_CAPS,
                "permitted": AGENT_CAPS,
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096u64, "soft": 4096u64}],
            "noNewPrivileges": true,
        },
        "root": {"path": "rootfs", "readonly": true},
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
}
