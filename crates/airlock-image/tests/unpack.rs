//! Unpacking well-formed layers: compressions, modes, owners, links, dropped nodes.

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

use airlock_image::{LayerStatus, Owner, StoreOptions, UnpackReport};
use common::{Layer, put, store, store_with};
use tar::EntryType;

fn sample() -> Layer {
    Layer::new()
        .dir("usr", 0o755)
        .dir("usr/bin", 0o755)
        .file("usr/bin/tool", b"#!/bin/sh\necho hi\n", 0o755)
        .file("etc/os-release", b"ID=test\n", 0o644)
}

fn check_sample(root: &std::path::Path) {
    assert_eq!(
        fs::read(root.join("usr/bin/tool")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
    assert_eq!(fs::read(root.join("etc/os-release")).unwrap(), b"ID=test\n");
    let md = fs::metadata(root.join("usr/bin/tool")).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o755);
    // The archive says uid 1234; the store says root.
    assert_eq!((md.uid(), md.gid()), (0, 0));
    // A parent the archive did not list (etc) is created too.
    assert!(root.join("etc").is_dir());
}

#[test]
fn gzip_zstd_and_plain_layers_unpack_by_media_type_or_magic() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let cases = [
        (
            sample().gzip(),
            Some("application/vnd.oci.image.layer.v1.tar+gzip"),
        ),
        (
            sample().zstd(),
            Some("application/vnd.oci.image.layer.v1.tar+zstd"),
        ),
        (sample().tar(), Some("application/vnd.oci.image.layer.v1.tar")),
        // No media type: the magic bytes decide.
        (sample().file("gz", b"1", 0o644).gzip(), None),
        (sample().file("zst", b"2", 0o644).zstd(), None),
        (sample().file("plain", b"3", 0o644).tar(), None),
    ];
    for (blob, media) in cases {
        let d = put(&s, &blob);
        let st = s.unpack_layer(&d, media).unwrap();
        assert!(matches!(st, LayerStatus::Unpacked(_)), "{media:?}");
        check_sample(&s.layer_path(&d));
        assert_eq!(s.unpack_layer(&d, media).unwrap(), LayerStatus::Present);
    }
}

#[test]
fn wrong_media_type_is_an_archive_error_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let d = put(&s, &sample().tar());
    let err = s
        .unpack_layer(&d, Some("application/vnd.oci.image.layer.v1.tar+gzip"))
        .unwrap_err();
    assert!(matches!(err, airlock_image::Error::Archive { .. }), "{err}");
    assert!(!s.has_layer(&d));
    assert!(common::leftovers(&s).is_empty());
}

#[test]
fn setuid_setgid_and_sticky_bits_are_stripped() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let d = put(
        &s,
        &Layer::new()
            .file("bin/su", b"elf", 0o4755)
            .file("bin/wall", b"elf", 0o2755)
            .dir("tmp", 0o1777)
            .tar(),
    );
    s.unpack_layer(&d, None).unwrap();
    let root = s.layer_path(&d);
    let mode = |p: &str| fs::metadata(root.join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("bin/su"), 0o755);
    assert_eq!(mode("bin/wall"), 0o755);
    assert_eq!(mode("tmp"), 0o777);
}

#[test]
fn configured_owner_replaces_archive_owner() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner { uid: 4321, gid: 8765 };
    let s = store_with(
        dir.path(),
        StoreOptions {
            owner,
            ..Default::default()
        },
    );
    let d = put(
        &s,
        &Layer::new().file("a/b", b"x", 0o600).symlink("a/l", "b").tar(),
    );
    s.unpack_layer(&d, None).unwrap();
    let root = s.layer_path(&d);
    for p in ["", "a", "a/b", "a/l"] {
        let md = fs::symlink_metadata(root.join(p)).unwrap();
        assert_eq!((md.uid(), md.gid()), (4321, 8765), "{p:?}");
    }
}

#[test]
fn device_nodes_and_fifos_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let d = put(
        &s,
        &Layer::new()
            .dir("dev", 0o755)
            .node("dev/null", EntryType::Char)
            .node("dev/sda", EntryType::Block)
            .node("run/fifo", EntryType::Fifo)
            .file("dev/keep", b"k", 0o644)
            // A hard link to a dropped node is dropped with it...
            .hardlink("dev/null2", "dev/null")
            // ...but not to a file that later took a dropped node's place.
            .node("dev/zero", EntryType::Char)
            .file("dev/zero", b"z", 0o644)
            .hardlink("dev/zero2", "dev/zero")
            .tar(),
    );
    let LayerStatus::Unpacked(UnpackReport { dropped, .. }) = s.unpack_layer(&d, None).unwrap() else {
        panic!("not unpacked")
    };
    assert_eq!(
        dropped,
        ["dev/null", "dev/sda", "run/fifo", "dev/null2", "dev/zero"]
    );
    assert_eq!(fs::read(s.layer_path(&d).join("dev/zero2")).unwrap(), b"z");
    let root = s.layer_path(&d);
    for p in ["dev/null", "dev/sda", "run/fifo", "dev/null2"] {
        assert!(fs::symlink_metadata(root.join(p)).is_err(), "{p} created");
    }
    assert!(root.join("dev/keep").is_file());
    for e in walk(&root) {
        let ft = fs::symlink_metadata(&e).unwrap().file_type();
        assert!(!ft.is_char_device() && !ft.is_block_device() && !ft.is_fifo() && !ft.is_socket());
    }
}

fn walk(p: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(p).unwrap() {
        let path = e.unwrap().path();
        if fs::symlink_metadata(&path).unwrap().is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

#[test]
fn hard_links_share_an_inode() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let d = put(
        &s,
        &Layer::new()
            .file("usr/bin/python3.12", b"interp", 0o755)
            .hardlink("usr/bin/python3", "usr/bin/python3.12")
            .hardlink("./usr/local/python", "./usr/bin/python3.12")
            .tar(),
    );
    s.unpack_layer(&d, None).unwrap();
    let root = s.layer_path(&d);
    let a = fs::metadata(root.join("usr/bin/python3.12")).unwrap();
    let b = fs::metadata(root.join("usr/bin/python3")).unwrap();
    let c = fs::metadata(root.join("usr/local/python")).unwrap();
    assert_eq!(a.ino(), b.ino());
    assert_eq!(a.ino(), c.ino());
    assert_eq!(a.nlink(), 3);
}

#[test]
fn symlinks_are_kept_with_any_target_and_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let d = put(
        &s,
        &Layer::new()
            .file("usr/bin/python3.12", b"interp", 0o755)
            .symlink("usr/bin/python3", "python3.12")
            .symlink("etc/mtab", "/proc/self/mounts")
            .symlink("up", "../../../../..")
            .tar(),
    );
    s.unpack_layer(&d, None).unwrap();
    let root = s.layer_path(&d);
    for (link, target) in [
        ("usr/bin/python3", "python3.12"),
        ("etc/mtab", "/proc/self/mounts"),
        ("up", "../../../../.."),
    ] {
        assert!(
            fs::symlink_metadata(root.join(link))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_link(root.join(link)).unwrap().to_str().unwrap(), target);
    }
}

#[test]
fn later_entries_replace_earlier_ones_of_the_same_path() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let d = put(
        &s,
        &Layer::new()
            .file("f", b"first", 0o644)
            .file("f", b"second", 0o600)
            .symlink("l", "x")
            .file("l", b"now a file", 0o644)
            .dir("d", 0o700)
            .dir("d", 0o755)
            .tar(),
    );
    s.unpack_layer(&d, None).unwrap();
    let root = s.layer_path(&d);
    assert_eq!(fs::read(root.join("f")).unwrap(), b"second");
    assert!(fs::symlink_metadata(root.join("l")).unwrap().is_file());
    assert_eq!(
        fs::metadata(root.join("d")).unwrap().permissions().mode() & 0o777,
        0o755
    );
}

#[test]
fn whiteouts_are_kept_in_the_layer_for_flatten() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let d = put(
        &s,
        &Layer::new()
            .file("etc/.wh.passwd", b"", 0o644)
            .file("var/.wh..wh..opq", b"", 0o644)
            .tar(),
    );
    s.unpack_layer(&d, None).unwrap();
    assert!(s.layer_path(&d).join("etc/.wh.passwd").is_file());
    assert!(s.layer_path(&d).join("var/.wh..wh..opq").is_file());
}

#[test]
fn long_names_and_deep_paths_unpack() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    // Past ustar's 100-byte name field: the Builder writes a GNU long-name entry.
    let long = format!("{}/{}", "d".repeat(120), "f".repeat(150));
    let deep: String = (0..60).map(|i| format!("l{i}/")).collect::<String>() + "leaf";
    let d = put(
        &s,
        &Layer::new()
            .file(&long, b"long", 0o644)
            .file(&deep, b"deep", 0o644)
            .hardlink("short", &long)
            .tar(),
    );
    s.unpack_layer(&d, None).unwrap();
    let root = s.layer_path(&d);
    assert_eq!(fs::read(root.join(&long)).unwrap(), b"long");
    assert_eq!(fs::read(root.join(&deep)).unwrap(), b"deep");
    assert_eq!(fs::read(root.join("short")).unwrap(), b"long");
}

#[test]
fn usage_counts_a_hard_linked_file_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let blob = Layer::new()
        .file("a", &[1u8; 10_000], 0o644)
        .hardlink("b", "a")
        .hardlink("c", "a")
        .file("d", &[2u8; 500], 0o644)
        .tar();
    let d = put(&s, &blob);
    s.unpack_layer(&d, None).unwrap();
    assert_eq!(s.usage().unwrap(), blob.len() as u64 + 10_500);
}

#[test]
fn corrupt_compressed_stream_is_an_archive_error_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let mut blob = sample().file("big", &[7u8; 100_000], 0o644).gzip();
    let n = blob.len();
    blob.truncate(n / 2);
    let d = put(&s, &blob);
    let err = s.unpack_layer(&d, None).unwrap_err();
    assert!(matches!(err, airlock_image::Error::Archive { .. }), "{err}");
    assert!(err.to_string().contains(&d.to_string()), "{err}");
    assert!(!s.has_layer(&d));
    assert!(common::leftovers(&s).is_empty());
}

#[test]
fn implicit_parents_are_0755_and_a_missing_blob_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let d = put(&s, &Layer::new().file("a/b/c", b"x", 0o644).tar());
    s.unpack_layer(&d, None).unwrap();
    for p in ["a", "a/b"] {
        let md = fs::metadata(s.layer_path(&d).join(p)).unwrap();
        assert_eq!(md.permissions().mode() & 0o7777, 0o755, "{p}");
    }
    let absent = airlock_image::Digest::of(b"never stored");
    let err = s.unpack_layer(&absent, None).unwrap_err();
    assert!(
        matches!(&err, airlock_image::Error::BlobMissing(x) if *x == absent),
        "{err}"
    );
    assert!(!s.has_layer(&absent));
}
