//! Flattening an image's layers into one tree.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use airlock_image::{Digest, Error, Store};
use common::{Layer, put, store};

fn unpacked(s: &Store, layer: Layer) -> Digest {
    let d = put(s, &layer.gzip());
    s.unpack_layer(&d, None).unwrap();
    d
}

/// Every path below `root`, relative, sorted; directories end with `/`, symlinks show
/// their target.
fn tree(root: &Path) -> Vec<String> {
    fn walk(root: &Path, p: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(p).unwrap() {
            let path = e.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let md = fs::symlink_metadata(&path).unwrap();
            if md.is_dir() {
                out.push(format!("{rel}/"));
                walk(root, &path, out);
            } else if md.file_type().is_symlink() {
                out.push(format!("{rel} -> {}", fs::read_link(&path).unwrap().display()));
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

#[test]
fn layers_apply_in_order_with_whiteouts_and_opaque_directories() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let base = unpacked(
        &s,
        Layer::new()
            .file("etc/passwd", b"root:x:0:0\n", 0o644)
            .file("etc/shadow", b"root:*\n", 0o600)
            .file("etc/hostname", b"base\n", 0o644)
            .file("var/cache/a", b"a", 0o644)
            .file("var/cache/sub/b", b"b", 0o644)
            .file("opt/tool/bin", b"v1", 0o755)
            .file("srv", b"a file below", 0o644)
            .symlink("bin", "usr/bin"),
    );
    let middle = unpacked(
        &s,
        Layer::new()
            // Delete a file and a whole directory of the layer below.
            .file("etc/.wh.shadow", b"", 0o644)
            .file("opt/.wh.tool", b"", 0o644)
            // Replace a directory's contents.
            .file("var/cache/.wh..wh..opq", b"", 0o644)
            .file("var/cache/c", b"c", 0o644)
            // A directory replaces a file, a file replaces a symlink.
            .file("srv/www/index.html", b"<p>", 0o644)
            .file("bin", b"not a link any more", 0o755)
            .file("etc/hostname", b"middle\n", 0o644),
    );
    let top = unpacked(
        &s,
        Layer::new()
            // A file deleted below may come back.
            .file("etc/shadow", b"root:!\n", 0o640)
            .symlink("etc/hostname", "/proc/sys/kernel/hostname")
            .file(".wh.bin", b"", 0o644),
    );
    let dest = dir.path().join("rootfs");
    s.flatten(&[base, middle, top], &dest).unwrap();
    assert_eq!(
        tree(&dest),
        [
            "etc/",
            "etc/hostname -> /proc/sys/kernel/hostname",
            "etc/passwd",
            "etc/shadow",
            "opt/",
            "srv/",
            "srv/www/",
            "srv/www/index.html",
            "var/",
            "var/cache/",
            "var/cache/c",
        ]
    );
    assert_eq!(fs::read(dest.join("etc/shadow")).unwrap(), b"root:!\n");
    assert_eq!(
        fs::metadata(dest.join("etc/shadow"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o640
    );
    assert_eq!(fs::read(dest.join("etc/passwd")).unwrap(), b"root:x:0:0\n");
    assert_eq!(fs::metadata(&dest).unwrap().permissions().mode() & 0o777, 0o755);
    // Nothing left beside the destination.
    let siblings: Vec<PathBuf> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(siblings.len(), 2, "{siblings:?}");
}

#[test]
fn hard_links_within_a_layer_stay_linked() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let l = unpacked(
        &s,
        Layer::new()
            .file("usr/bin/python3.12", b"interp", 0o755)
            .hardlink("usr/bin/python3", "usr/bin/python3.12"),
    );
    let dest = dir.path().join("rootfs");
    s.flatten(std::slice::from_ref(&l), &dest).unwrap();
    let a = fs::metadata(dest.join("usr/bin/python3.12")).unwrap();
    let b = fs::metadata(dest.join("usr/bin/python3")).unwrap();
    assert_eq!(a.ino(), b.ino());
    // The tree is a copy: not the layer's inode.
    let layer = fs::metadata(s.layer_path(&l).join("usr/bin/python3")).unwrap();
    assert_ne!(a.ino(), layer.ino());
}

#[test]
fn missing_layer_or_existing_destination_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let l = unpacked(&s, Layer::new().file("a", b"a", 0o644));
    let not_unpacked = put(&s, &Layer::new().file("b", b"b", 0o644).gzip());
    let dest = dir.path().join("rootfs");
    let err = s.flatten(&[l.clone(), not_unpacked.clone()], &dest).unwrap_err();
    assert!(
        matches!(&err, Error::LayerMissing(d) if *d == not_unpacked),
        "{err}"
    );
    assert!(!dest.exists());
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        1,
        "temporary tree left behind"
    );
    fs::create_dir(&dest).unwrap();
    let err = s.flatten(&[l], &dest).unwrap_err();
    assert!(matches!(err, Error::DestinationExists(_)), "{err}");
}

#[test]
fn a_lower_symlink_does_not_redirect_an_upper_layer() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let out = dir.path().join("outside");
    fs::create_dir(&out).unwrap();
    let lower = unpacked(
        &s,
        Layer::new()
            .symlink("etc", out.to_str().unwrap())
            .symlink("up", "../../.."),
    );
    let upper = unpacked(
        &s,
        Layer::new()
            .file("etc/passwd", b"mine", 0o644)
            .file("up/x", b"mine", 0o644),
    );
    let dest = dir.path().join("rootfs");
    s.flatten(&[lower, upper], &dest).unwrap();
    assert_eq!(
        fs::read_dir(&out).unwrap().count(),
        0,
        "written through the symlink"
    );
    assert!(fs::symlink_metadata(dest.join("etc")).unwrap().is_dir());
    assert_eq!(fs::read(dest.join("etc/passwd")).unwrap(), b"mine");
    assert_eq!(fs::read(dest.join("up/x")).unwrap(), b"mine");
}

/// Modification times come from the archive (1_700_000_000 in every test layer) through
/// unpacking and flattening: Python trusts a .pyc only while its source's mtime matches.
#[test]
fn modification_times_are_kept_through_unpack_and_flatten() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let layer = unpacked(
        &s,
        Layer::new()
            .dir("app", 0o755)
            .file("app/main.py", b"print(1)\n", 0o644)
            .file("app/secret", b"x", 0o600)
            .symlink("app/link", "main.py"),
    );
    let dest = dir.path().join("tree");
    s.flatten(std::slice::from_ref(&layer), &dest).unwrap();
    for root in [s.layer_path(&layer), dest] {
        for p in ["app", "app/main.py", "app/secret", "app/link"] {
            let md = fs::symlink_metadata(root.join(p)).unwrap();
            assert_eq!(md.mtime(), 1_700_000_000, "{}", root.join(p).display());
        }
    }
}
