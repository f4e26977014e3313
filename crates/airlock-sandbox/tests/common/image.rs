//! A prepared image root made by hand, as the image store would leave one: busybox (the
//! static build of Debian's busybox-static, at /bin/busybox on the test host) and its
//! applets in /bin, a file /opt/hello.txt, a once-private file made readable by all, and
//! the mount points every prepared tree holds. Shared by the namespace and gVisor suites.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Where the test host has the static busybox.
pub const BUSYBOX: &str = "/bin/busybox";

/// Applets linked to busybox in the image's /bin.
pub const APPLETS: &[&str] = &[
    "sh", "ls", "cat", "id", "env", "echo", "sleep", "touch", "pwd", "test", "grep",
];

/// Directories every prepared tree holds (mount points).
pub const MOUNT_DIRS: &[&str] = &["tmp", "workspace", "dev", "proc", "etc", ".airlock"];

/// Empty files every prepared tree holds in /etc (mount points).
pub const MOUNT_FILES: &[&str] = &[
    "passwd",
    "group",
    "hosts",
    "hostname",
    "resolv.conf",
    "nsswitch.conf",
];

/// Builds the image's tree at `dir/root` and returns it.
pub fn make(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::create_dir_all(root.join("opt")).unwrap();
    for d in MOUNT_DIRS {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    for f in MOUNT_FILES {
        fs::write(root.join("etc").join(f), "").unwrap();
    }
    fs::copy(BUSYBOX, root.join("bin/busybox")).expect("busybox-static at /bin/busybox");
    for applet in APPLETS {
        symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    fs::write(root.join("opt/hello.txt"), "hello from the image\n").unwrap();
    // A file private in the image's layer: the prepared-tree rule gives others read.
    let secret = root.join("etc/private.conf");
    fs::write(&secret, "private=1\n").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o604)).unwrap();
    // Root-owned, readable (and directories searchable) by all.
    make_readable(&root);
    root
}

fn make_readable(path: &Path) {
    let meta = fs::symlink_metadata(path).unwrap();
    if meta.file_type().is_symlink() {
        return;
    }
    let mode = meta.permissions().mode() & 0o7777;
    let extra = if meta.is_dir() {
        0o755
    } else {
        0o444 | (mode & 0o111)
    };
    fs::set_permissions(path, fs::Permissions::from_mode((mode | extra) & !0o6000)).unwrap();
    if meta.is_dir() {
        for entry in fs::read_dir(path).unwrap() {
            make_readable(&entry.unwrap().path());
        }
    }
}

/// Every path of the tree with its kind, size, mode and mtime: compared before and after
/// a sandbox ran in it.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, (u32, u64, i64, i64, Option<SystemTime>)> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

type Entry = (u32, u64, i64, i64, Option<SystemTime>);

fn walk(root: &Path, path: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
    let meta = fs::symlink_metadata(path).unwrap();
    out.insert(
        path.strip_prefix(root).unwrap().to_owned(),
        (
            meta.mode(),
            meta.size(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.modified().ok(),
        ),
    );
    if meta.is_dir() {
        for entry in fs::read_dir(path).unwrap() {
            walk(root, &entry.unwrap().path(), out);
        }
    }
}
