//! Hostile layers, one attack per test: each is refused with an error naming the entry,
//! writes nothing outside the layer, and leaves no layer (nor half of one) in the store.

mod common;

use std::path::Path;

use airlock_image::{Digest, Error, Store};
use common::{Layer, leftovers, put, store};
use tar::EntryType;

/// Stores `blob`, unpacks it, and checks the refusal: the error names `entry`, and the
/// store holds no layer and no work in progress.
fn refused(s: &Store, blob: &[u8], entry: &str) -> Error {
    let d: Digest = put(s, blob);
    let err = s.unpack_layer(&d, None).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::UnsafeEntry { .. }), "{msg}");
    assert!(msg.contains(entry), "error does not name {entry:?}: {msg}");
    assert!(!s.has_layer(&d));
    assert!(s.layers().unwrap().is_empty());
    assert!(leftovers(s).is_empty(), "{:?}", leftovers(s));
    err
}

/// A directory beside the store that an escaping entry would write into.
fn outside(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("outside");
    std::fs::create_dir(&p).unwrap();
    p
}

fn nothing_in(p: &Path) {
    let names: Vec<_> = std::fs::read_dir(p).unwrap().collect();
    assert!(names.is_empty(), "written outside the layer: {names:?}");
}

#[test]
fn dotdot_entry_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let out = outside(dir.path());
    // From layers/sha256/tmp-dir, five levels up is `dir`.
    let blob = Layer::new()
        .file("ok", b"fine", 0o644)
        .raw(EntryType::Regular, "../../../../../outside/pwned", "", b"x")
        .tar();
    refused(&s, &blob, "../../../../../outside/pwned");
    nothing_in(&out);
}

#[test]
fn dotdot_in_the_middle_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let blob = Layer::new()
        .raw(EntryType::Regular, "usr/../../etc/pwned", "", b"x")
        .tar();
    refused(&s, &blob, "usr/../../etc/pwned");
}

#[test]
fn absolute_path_entry_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let out = outside(dir.path());
    let target = format!("{}/pwned", out.display());
    let blob = Layer::new().raw(EntryType::Regular, &target, "", b"x").tar();
    let err = refused(&s, &blob, &target);
    assert!(err.to_string().contains("absolute"), "{err}");
    nothing_in(&out);
}

#[test]
fn entry_through_an_absolute_symlink_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let out = outside(dir.path());
    let blob = Layer::new()
        .symlink("escape", out.to_str().unwrap())
        .file("escape/pwned", b"x", 0o644)
        .tar();
    let err = refused(&s, &blob, "escape/pwned");
    assert!(err.to_string().contains("symlink"), "{err}");
    nothing_in(&out);
}

#[test]
fn entry_through_a_relative_symlink_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let out = outside(dir.path());
    let blob = Layer::new()
        .dir("a", 0o755)
        .symlink("a/up", "../../../../../outside")
        .dir("a/up/sub", 0o755)
        .file("a/up/sub/pwned", b"x", 0o644)
        .tar();
    refused(&s, &blob, "a/up/sub");
    nothing_in(&out);
}

#[test]
fn entry_through_a_symlink_that_stays_inside_is_refused_too() {
    // Even a symlink to a directory of the layer is not followed while unpacking.
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let blob = Layer::new()
        .dir("real", 0o755)
        .symlink("alias", "real")
        .file("alias/f", b"x", 0o644)
        .tar();
    refused(&s, &blob, "alias/f");
}

#[test]
fn hard_link_to_outside_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let out = outside(dir.path());
    std::fs::write(out.join("secret"), b"s").unwrap();
    let blob = Layer::new()
        .raw(EntryType::Link, "stolen", "../../../../../outside/secret", b"")
        .tar();
    refused(&s, &blob, "stolen");
    let abs = format!("{}/secret", out.display());
    let blob = Layer::new().raw(EntryType::Link, "stolen2", &abs, b"").tar();
    refused(&s, &blob, "stolen2");
    assert_eq!(std::fs::metadata(out.join("secret")).unwrap().len(), 1);
    assert_eq!(
        std::os::unix::fs::MetadataExt::nlink(&std::fs::metadata(out.join("secret")).unwrap()),
        1
    );
}

#[test]
fn hard_link_through_a_symlink_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let out = outside(dir.path());
    std::fs::write(out.join("secret"), b"s").unwrap();
    let blob = Layer::new()
        .symlink("door", out.to_str().unwrap())
        .hardlink("stolen", "door/secret")
        .tar();
    refused(&s, &blob, "stolen");
}

#[test]
fn hard_link_to_a_missing_target_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let blob = Layer::new().hardlink("l", "not/there").tar();
    refused(&s, &blob, "l");
}

#[test]
fn file_replacing_a_directory_of_the_same_layer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let blob = Layer::new().file("d/f", b"x", 0o644).file("d", b"y", 0o644).tar();
    refused(&s, &blob, "d");
}

#[test]
fn pax_path_escaping_the_root_is_refused() {
    // The ustar name is harmless; the PAX header that overrides it is not.
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let out = outside(dir.path());
    let blob = Layer::new()
        .pax_path("../../../../../outside/pwned")
        .file("harmless", b"x", 0o644)
        .tar();
    refused(&s, &blob, "../../../../../outside/pwned");
    nothing_in(&out);
}
