//! The sandbox's synthesized /etc: the few files programs need, never the host's whole
//! /etc. Identity files are written fresh; loader, certificate and alternatives data are
//! bound read-only from the host (or the rootfs). With an image's root, only the identity
//! files are generated, bound over the image's own (empty) ones; the rest of its /etc is
//! the image's.
//!
//! In proxy mode, /etc/resolv.conf names airlock's resolver on the sandbox's loopback
//! (nsswitch.conf lets `hosts` use DNS in every mode); and a CA bundle, when the egress proxy has one, is
//! bound read-only at [`CA_BUNDLE`] (see [`install_ca_bundle`]).

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use crate::mounts::{MountError, bind_dir_readonly, mkdir_p, remount_readonly};

/// Where the trust store's bundle is, inside the sandbox: the file the usual tools read
/// (OpenSSL's default on Debian-family roots, curl, Python, Go, Node) and that
/// `SSL_CERT_FILE` and friends name in proxy mode.
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// /etc/resolv.conf in proxy mode: airlock's resolver only. No `search` list, so
/// `ndots` never matters and a name is looked up as written; the resolver answers at
/// once (an answer or NXDOMAIN), so the default timeout and attempts fit.
pub const PROXY_RESOLV_CONF: &str = "nameserver 127.0.0.1\n";

/// The files of [`GENERATED`] with their content for this network mode.
fn generated(proxy: bool) -> impl Iterator<Item = (&'static str, &'static str)> {
    GENERATED.iter().map(move |&(name, content)| match (proxy, name) {
        (true, "resolv.conf") => (name, PROXY_RESOLV_CONF),
        _ => (name, content),
    })
}

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
        // Names: the hosts file, then DNS, in every mode. Only proxy mode has a resolver
        // (airlock's, on the sandbox's loopback: resolv.conf names it; a micro-VM's guest
        // serves it after its sandbox was built, at glibc's default, 127.0.0.1); without
        // one a lookup fails at once (nothing answers on loopback, there is no route).
        "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
    ),
    ("resolv.conf", ""),
];

/// Host files bound read-only when present: the dynamic loader's cache, protocol and
/// service names, MIME types, time zone, and Debian's matplotlib configuration (its
/// matplotlib reads /etc/matplotlibrc and refuses to import without it).
pub const BOUND_FILES: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "protocols",
    "services",
    "mime.types",
    "localtime",
    "matplotlibrc",
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
/// With `proxy`, the name-resolution files are proxy mode's.
pub fn bind_generated(image: &Path, proxy: bool) -> Result<(), MountError> {
    let staged = Path::new(STAGED);
    mkdir_p(staged, 0o755)?;
    for (name, content) in generated(proxy) {
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
/// root is detached). With `proxy`, the name-resolution files are proxy mode's.
pub fn build(source_root: &Path, proxy: bool) -> Result<(), MountError> {
    let etc = Path::new("/etc");
    mkdir_p(etc, 0o755)?;
    for (name, content) in generated(proxy) {
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

fn io_err(op: &'static str, target: &Path) -> impl FnOnce(io::Error) -> MountError {
    let target = target.display().to_string();
    move |source| MountError::Syscall { op, target, source }
}

fn nix_err(op: &'static str, target: &Path) -> impl FnOnce(nix::Error) -> MountError {
    let target = target.display().to_string();
    move |e| MountError::Syscall {
        op,
        target,
        source: e.into(),
    }
}

/// Where the bundle (and, when needed, a directory mirrored around it) is staged: a
/// small tmpfs of its own, mounted here on the staging root and detached once its
/// content is bound into place.
const CA_STAGE: &str = "/.ca-stage";

/// Installs `bundle` read-only at [`CA_BUNDLE`] under `root` (`/`, or the image's tree
/// on the staging root), writing nothing into the host's or the image's tree:
///
/// - when the root has that file (a regular file, reached through real directories),
///   a staged copy of the bundle is bound over it;
/// - otherwise the deepest real directory on the way (`A`) is mirrored on the staging
///   tmpfs: each of its entries is bound from the original onto a mount point of the
///   same kind (links are copied as links), the missing part of the path is created
///   with the bundle at its end, and the mirror is bound over `A`, read-only. When `A`
///   is on the sandbox's own root tmpfs (the host's root has no /etc/ssl at all), the
///   missing part is simply created there.
///
/// Links on the way are never followed (during the build the host's root is still
/// reachable, and an image's absolute link would resolve against the staging root): a
/// link where a directory or the file should be is replaced in the mirror.
pub fn install_ca_bundle(root: &Path, bundle: &[u8]) -> Result<(), MountError> {
    let parts: Vec<&str> = CA_BUNDLE.trim_start_matches('/').split('/').collect();
    // The deepest real directory on the way, and how many parts of the path it covers.
    let mut dir = root.to_path_buf();
    let mut depth = 0;
    while depth < parts.len() - 1 {
        let next = dir.join(parts[depth]);
        match fs::symlink_metadata(&next) {
            Ok(m) if m.is_dir() => {
                dir = next;
                depth += 1;
            }
            _ => break,
        }
    }
    let target = dir.join(parts[depth..].join("/"));
    let file_exists =
        depth == parts.len() - 1 && fs::symlink_metadata(&target).is_ok_and(|m| m.file_type().is_file());
    let stage = Path::new(CA_STAGE);
    mkdir_p(stage, 0o755)?;
    let size = bundle.len() as u64 + (64 << 10);
    mount(
        Some("tmpfs"),
        stage,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(format!("mode=0755,size={size},nr_inodes=4096").as_str()),
    )
    .map_err(nix_err("mount staging tmpfs", stage))?;
    let placed = if file_exists {
        let staged = stage.join("bundle");
        write_bundle(&staged, bundle)?;
        bind_readonly(&staged, &target, false)
    } else if root == Path::new("/") && on_same_fs(&dir, root) {
        // The sandbox's own root tmpfs (sealed read-only later): created in place.
        let file = dir.join(parts[depth..].join("/"));
        mkdir_p(file.parent().unwrap_or(&dir), 0o755)?;
        write_bundle(&file, bundle)
    } else {
        let mirror = stage.join("mirror");
        mirror_dir(&dir, &mirror, parts[depth])?;
        let file = mirror.join(parts[depth..].join("/"));
        mkdir_p(file.parent().unwrap_or(&mirror), 0o755)?;
        write_bundle(&file, bundle)?;
        bind_readonly(&mirror, &dir, true)
    };
    // The staging mount point goes; what was bound from it stays where it was bound.
    umount2(stage, MntFlags::MNT_DETACH).map_err(nix_err("detach staging tmpfs", stage))?;
    fs::remove_dir(stage).map_err(io_err("rmdir", stage))?;
    placed
}

fn write_bundle(path: &Path, bundle: &[u8]) -> Result<(), MountError> {
    fs::write(path, bundle).map_err(io_err("write", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644)).map_err(io_err("chmod", path))
}

fn on_same_fs(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => false,
    }
}

/// Binds `src` over `dst` (with `recursive`, the mounts beneath it too), then makes the
/// bind read-only, nosuid and nodev.
fn bind_readonly(src: &Path, dst: &Path, recursive: bool) -> Result<(), MountError> {
    let flags = if recursive {
        MsFlags::MS_BIND | MsFlags::MS_REC
    } else {
        MsFlags::MS_BIND
    };
    mount(Some(src), dst, None::<&str>, flags, None::<&str>).map_err(nix_err("bind", dst))?;
    remount_readonly(src, dst)
}

/// Mirrors directory `src` at `dst` (a new directory): each entry but `except` is bound
/// from `src` onto a mount point of its kind, read-only; links are copied.
fn mirror_dir(src: &Path, dst: &Path, except: &str) -> Result<(), MountError> {
    let mode = fs::metadata(src)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o755);
    mkdir_p(dst, mode)?;
    for entry in fs::read_dir(src).map_err(io_err("read dir", src))? {
        let entry = entry.map_err(io_err("read dir", src))?;
        if entry.file_name() == except {
            continue;
        }
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        let kind = entry.file_type().map_err(io_err("stat", &from))?;
        if kind.is_symlink() {
            let link = fs::read_link(&from).map_err(io_err("readlink", &from))?;
            symlink(link, &to).map_err(io_err("symlink", &to))?;
            continue;
        }
        if kind.is_dir() {
            fs::create_dir(&to).map_err(io_err("mkdir", &to))?;
        } else {
            fs::File::create(&to).map_err(io_err("create", &to))?;
        }
        bind_readonly(&from, &to, kind.is_dir())?;
    }
    Ok(())
}
