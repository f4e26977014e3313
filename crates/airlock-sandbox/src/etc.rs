//! The sandbox's synthesized /etc: the few files programs need, never the host's whole
//! /etc. Identity files are written fresh; loader, certificate and alternatives data are
//! bound read-only from the host (or the rootfs). With an image's root, only the identity
//! files are generated, bound over the image's own (empty) ones; the rest of its /etc is
//! the image's.

use std::fs;
use std::path::Path;

use crate::mounts::{MountError, bind_dir_readonly, mkdir_p, remount_readonly};

/// Files written fresh into /etc (identity files: never the host's), by name and content.
pub const GENERATED: &[(&str, &str)] = &[
    (
        "passwd",
        "root:x:0:0:root:/root:/usr/sbin/nologin\n\
         sandbox:x:1000:1000:airlock sandbox:/workspace:/bin/sh\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    ),
    ("group", "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n"),
    ("hostname", "airlock\n"),
    (
        "hosts",
        "127.0.0.1\tlocalhost airlock\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    ),
    (
        "nsswitch.conf",
        "passwd: files\ngroup: files\nshadow: files\nhosts: files\n",
    ),
    ("resolv.conf", ""),
];

/// Host files bound read-only when present: the dynamic loader's cache, protocol and
/// service names, MIME types, time zone.
pub const BOUND_FILES: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "protocols",
    "services",
    "mime.types",
    "localtime",
];

/// Host directories bound read-only when present: TLS trust, `alternatives` links that
/// /usr/bin points through (awk, cc, python…), and interpreter configuration.
pub const BOUND_DIRS: &[&str] = &[
    "ssl",
    "ca-certificates",
    "alternatives",
    "ld.so.conf.d",
    "pki",
    "crypto-policies",
];

/// Where the identity files for an image's root are written, on the staging root.
const STAGED: &str = "/.etc";

/// Binds the identity files of [`GENERATED`] read-only over the empty files the image's
/// prepared tree at `image` holds for them. The files are written on the staging root
/// (see `mounts`), whose tmpfs lives on in these binds; nothing is written in the image.
pub fn bind_generated(image: &Path) -> Result<(), MountError> {
    let staged = Path::new(STAGED);
    mkdir_p(staged, 0o755)?;
    for (name, content) in GENERATED {
        let src = staged.join(name);
        fs::write(&src, content).map_err(|source| MountError::Syscall {
            op: "write",
            target: src.display().to_string(),
            source,
        })?;
        let dst = image.join("etc").join(name);
        nix::mount::mount(
            Some(&src),
            &dst,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| MountError::Syscall {
            op: "bind",
            target: dst.display().to_string(),
            source: e.into(),
        })?;
        remount_readonly(&src, &dst)?;
    }
    Ok(())
}

/// Builds /etc from `source_root` (the host's root or the rootfs, as seen before the old
/// root is detached).
pub fn build(source_root: &Path) -> Result<(), MountError> {
    let etc = Path::new("/etc");
    mkdir_p(etc, 0o755)?;
    for (name, content) in GENERATED {
        let path = etc.join(name);
        fs::write(&path, content).map_err(|source| MountError::Syscall {
            op: "write",
            target: path.display().to_string(),
            source,
        })?;
    }
    let src_etc = source_root.join("etc");
    for name in BOUND_FILES {
        let src = src_etc.join(name);
        let dst = etc.join(name);
        match fs::symlink_metadata(&src) {
            // A link (localtime -> /usr/share/zoneinfo/...) is recreated as a link.
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = fs::read_link(&src) {
                    let _ = std::os::unix::fs::symlink(target, &dst);
                }
            }
            Ok(meta) if meta.is_file() => {
                fs::File::create(&dst).map_err(|source| MountError::Syscall {
                    op: "create",
                    target: dst.display().to_string(),
                    source,
                })?;
                let r = nix::mount::mount(
                    Some(&src),
                    &dst,
                    None::<&str>,
                    nix::mount::MsFlags::MS_BIND,
                    None::<&str>,
                );
                r.map_err(|e| MountError::Syscall {
                    op: "bind",
                    target: dst.display().to_string(),
                    source: e.into(),
                })?;
                remount_readonly(&src, &dst)?;
            }
            _ => {}
        }
    }
    for name in BOUND_DIRS {
        let src = src_etc.join(name);
        if src.is_dir() {
            bind_dir_readonly(&src, &etc.join(name))?;
        }
    }
    Ok(())
}
