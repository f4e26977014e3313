//! Importing `docker save` archives and OCI image layouts, and refusing bad ones without
//! leaving anything behind.

mod common;
mod imagekit;

use std::fs;
use std::path::Path;
use std::process::Command;

use airlock_image::manifest::Manifest;
use airlock_image::{Error, StoreOptions};
use common::{Layer, store, store_with};
use imagekit::{INDEX, MANIFEST, Oci, SaveImage, config, docker_save, member, raw_member, snapshot};

fn base_layer() -> Layer {
    Layer::new()
        .file("bin/tool", b"#!/bin/sh\necho tool\n", 0o755)
        .file("etc/os-release", b"ID=test\n", 0o644)
}

#[test]
fn docker_save_archive_is_imported_with_its_tags_and_config() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let shared = base_layer().tar();
    let archive = docker_save(
        &[
            SaveImage {
                config: config(&["PATH=/bin", "GREETING=hi"], &["/bin/tool"], 2),
                layers: vec![
                    shared.clone(),
                    Layer::new().file("app/main", b"main", 0o755).tar(),
                ],
                tags: vec!["example.com/app:1".into(), "example.com/app:latest".into()],
            },
            // A second image sharing the first layer: old `docker save` links it.
            SaveImage {
                config: config(&[], &["sh"], 1),
                layers: vec![shared],
                tags: vec!["example.com/base:1".into()],
            },
        ],
        false,
    );
    let path = dir.path().join("save.tar");
    fs::write(&path, archive).unwrap();
    let imported = s.import(&path, None).unwrap();
    let names: Vec<&str> = imported.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "example.com/app:1",
            "example.com/app:latest",
            "example.com/base:1"
        ]
    );
    let app = s.image("example.com/app:1").unwrap();
    assert_eq!(app.config.env[1], ("GREETING".to_string(), "hi".to_string()));
    assert_eq!(app.config.cmd, ["/bin/tool"]);
    assert_eq!(app.config.working_dir.as_deref(), Some("/app"));
    assert_eq!(app.created.as_deref(), Some("2024-05-06T07:08:09Z"));
    assert_eq!(app.layers.len(), 2);
    // The synthesized manifest is a stored blob naming what was stored.
    let m = Manifest::parse("m", &fs::read(s.blob_path(&app.manifest_digest)).unwrap()).unwrap();
    assert_eq!(m.config.digest, app.config_digest);
    assert_eq!(m.layers[0].media_type, "application/vnd.oci.image.layer.v1.tar");
    assert_eq!(app.size, m.layers_size());
    for l in &app.layers {
        assert!(s.has_layer(l), "{l} not unpacked");
    }
    assert_eq!(s.images().unwrap().len(), 3);
    // Importing again changes nothing: same manifest digest, no new blobs.
    let before = snapshot(s.root());
    let again = s.import(&path, None).unwrap();
    assert_eq!(again[0].manifest_digest, app.manifest_digest);
    assert_eq!(snapshot(s.root()), before);
}

#[test]
fn docker_25_archive_with_blobs_and_gzip_layers_is_imported() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("store"));
    let archive = docker_save(
        &[SaveImage {
            config: config(&["A=1"], &["sh"], 1),
            layers: vec![base_layer().gzip()],
            tags: vec![],
        }],
        true,
    );
    let path = dir.path().join("save.tar");
    fs::write(&path, archive).unwrap();
    let images = s.import(&path, Some("localhost:5000/mine:v2")).unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].name, "localhost:5000/mine:v2");
    let m = Manifest::parse("m", &fs::read(s.blob_path(&images[0].manifest_digest)).unwrap()).unwrap();
    assert_eq!(
        m.layers[0].media_type,
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    // Without a name nor tags, the record is the manifest digest.
    let s2 = store(&dir.path().join("store2"));
    let images = s2.import(&path, None).unwrap();
    assert_eq!(images[0].name, images[0].manifest_digest.to_string());
    assert_eq!(
        s2.image(&images[0].name).unwrap().manifest_digest,
        images[0].manifest_digest
    );
}

#[test]
fn oci_layout_directory_and_tar_are_imported_by_ref_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut oci = Oci::default();
    let m = oci.image(&config(&["X=y"], &["run"], 1), &[base_layer().gzip()]);
    oci.entry(MANIFEST, &m, Some("registry.test/ns/img:3.1"));
    let layout = dir.path().join("layout");
    oci.write_dir(&layout);
    let s = store(&dir.path().join("store"));
    let images = s.import(&layout, None).unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].name, "registry.test/ns/img:3.1");
    assert_eq!(images[0].manifest_digest, airlock_image::Digest::of(&m));
    assert_eq!(images[0].config.cmd, ["run"]);

    let tar = dir.path().join("layout.tar");
    fs::write(&tar, oci.tar()).unwrap();
    let s2 = store(&dir.path().join("store2"));
    let images = s2.import(&tar, None).unwrap();
    assert_eq!(images[0].name, "registry.test/ns/img:3.1");
    assert!(s2.has_layer(&images[0].layers[0]));
}

#[test]
fn an_index_of_two_platforms_imports_this_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let mut oci = Oci::default();
    let amd = oci.image(
        &config(&["ARCH=amd64"], &["x"], 1),
        &[Layer::new().file("amd", b"1", 0o644).gzip()],
    );
    let arm = oci.image(
        &config(&["ARCH=arm64"], &["x"], 1),
        &[Layer::new().file("arm", b"1", 0o644).gzip()],
    );
    let index = oci.index_blob(&[(&arm, "linux", "arm64"), (&amd, "linux", "amd64")]);
    oci.entry(INDEX, &index, Some("multi:1"));
    let layout = dir.path().join("layout");
    oci.write_dir(&layout);
    let s = store(&dir.path().join("store"));
    let images = s.import(&layout, None).unwrap();
    assert_eq!(images[0].config.env[0].1, "amd64");
    assert_eq!(images[0].manifest_digest, airlock_image::Digest::of(&amd));
    // The arm64 image's layer was never stored.
    assert_eq!(s.layers().unwrap().len(), 1);
}

#[test]
fn umoci_layout_and_skopeo_docker_archive_of_real_files_are_imported() {
    let (Ok(_), Ok(_)) = (
        Command::new("umoci").arg("--version").output(),
        Command::new("busybox").arg("true").output(),
    ) else {
        println!("skipped: umoci or busybox is not installed");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    let bundle = dir.path().join("bundle");
    let run = |args: &[&str]| {
        let out = Command::new("umoci").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "umoci {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let lp = layout.to_str().unwrap();
    let bp = bundle.to_str().unwrap();
    run(&["init", "--layout", lp]);
    run(&["new", "--image", &format!("{lp}:bb")]);
    run(&["unpack", "--rootless", "--image", &format!("{lp}:bb"), bp]);
    let busybox = fs::canonicalize(which("busybox")).unwrap();
    fs::create_dir_all(bundle.join("rootfs/bin")).unwrap();
    fs::copy(&busybox, bundle.join("rootfs/bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", bundle.join("rootfs/bin/sh")).unwrap();
    run(&["repack", "--image", &format!("{lp}:bb"), bp]);
    run(&[
        "config",
        "--image",
        &format!("{lp}:bb"),
        "--config.cmd",
        "/bin/sh",
        "--config.env",
        "HOME=/root",
    ]);

    let s = store(&dir.path().join("store"));
    let images = s.import(&layout, Some("local/busybox:bb")).unwrap();
    assert_eq!(images.len(), 1);
    let image = &images[0];
    assert_eq!(image.config.cmd, ["/bin/sh"]);
    assert!(
        image
            .config
            .env
            .contains(&("HOME".to_string(), "/root".to_string()))
    );
    let root = s.image_root(image).unwrap();
    let copied = fs::read(root.join("bin/busybox")).unwrap();
    assert_eq!(copied, fs::read(&busybox).unwrap());
    assert_eq!(fs::read_link(root.join("bin/sh")).unwrap(), Path::new("busybox"));
    assert!(root.join("etc/passwd").is_file());

    // The same image as a real `docker save`-format archive, written by skopeo.
    if Command::new("skopeo").arg("--version").output().is_err() {
        println!("skipped the docker-archive half: skopeo is not installed");
        return;
    }
    let archive = dir.path().join("bb.tar");
    let out = Command::new("skopeo")
        .args(["copy", &format!("oci:{lp}:bb")])
        .arg(format!("docker-archive:{}:local/bb:1", archive.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let images = s.import(&archive, None).unwrap();
    assert_eq!(images[0].name, "docker.io/local/bb:1");
    assert_eq!(images[0].config.cmd, ["/bin/sh"]);
    let root = s.image_root(&images[0]).unwrap();
    assert_eq!(
        fs::read(root.join("bin/busybox")).unwrap(),
        fs::read(&busybox).unwrap()
    );
}

fn which(tool: &str) -> std::path::PathBuf {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().into()
}

/// Imports `archive` into a store holding one unrelated image and checks the import failed
/// and the store holds exactly what it held before.
fn refused(archive: &[u8], name: Option<&str>, options: StoreOptions) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let s = store_with(&dir.path().join("store"), options);
    let other = dir.path().join("other.tar");
    let mut oci = Oci::default();
    let m = oci.image(
        &config(&[], &["x"], 1),
        &[Layer::new().file("other", b"o", 0o644).gzip()],
    );
    oci.entry(MANIFEST, &m, Some("other:1"));
    fs::write(&other, oci.tar()).unwrap();
    s.import(&other, None).unwrap();
    let before = snapshot(s.root());
    let path = dir.path().join("archive.tar");
    fs::write(&path, archive).unwrap();
    let err = s.import(&path, name).unwrap_err();
    assert_eq!(snapshot(s.root()), before, "import left something behind: {err}");
    assert_eq!(s.images().unwrap().len(), 1);
    println!("{err}");
    assert!(!err.to_string().contains('\n'), "multi-line error: {err}");
    err
}

#[test]
fn docker_manifest_naming_a_missing_layer_is_refused() {
    let mut b = tar::Builder::new(Vec::new());
    let cfg = config(&[], &["x"], 1);
    member(&mut b, "c.json", &cfg);
    member(&mut b, "aaa/layer.tar", &base_layer().tar());
    let manifest = br#"[{"Config":"c.json","RepoTags":["t:1"],"Layers":["aaa/layer.tar","bbb/layer.tar"]}]"#;
    member(&mut b, "manifest.json", manifest);
    let err = refused(&b.into_inner().unwrap(), None, StoreOptions::default());
    assert!(
        err.to_string()
            .contains("\"bbb/layer.tar\", which is not in the archive"),
        "{err}"
    );
}

#[test]
fn layer_bytes_not_matching_the_layouts_digest_are_refused() {
    let mut oci = Oci::default();
    let good = base_layer().gzip();
    let bad = Layer::new().file("b", b"b", 0o644).gzip();
    let m = oci.image(&config(&[], &["x"], 2), &[good, bad.clone()]);
    oci.entry(MANIFEST, &m, Some("bad:1"));
    // The second layer's blob is replaced by other bytes of the same size.
    let hex = airlock_image::Digest::of(&bad).hex().to_owned();
    let mut evil = bad.clone();
    let last = evil.len() - 1;
    evil[last] ^= 0xff;
    oci.blobs.insert(hex, evil);
    let err = refused(&oci.tar(), None, StoreOptions::default());
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
}

#[test]
fn a_truncated_archive_is_refused() {
    let archive = docker_save(
        &[SaveImage {
            config: config(&[], &["x"], 1),
            layers: vec![Layer::new().file("big", &vec![7u8; 100_000], 0o644).tar()],
            tags: vec!["t:1".into()],
        }],
        false,
    );
    let err = refused(&archive[..archive.len() / 2], None, StoreOptions::default());
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn a_manifest_json_path_with_dotdot_is_refused() {
    let mut b = tar::Builder::new(Vec::new());
    member(&mut b, "c.json", &config(&[], &["x"], 1));
    raw_member(&mut b, "l.tar", &base_layer().tar());
    let manifest = br#"[{"Config":"c.json","RepoTags":["t:1"],"Layers":["../../etc/layer.tar"]}]"#;
    member(&mut b, "manifest.json", manifest);
    let err = refused(&b.into_inner().unwrap(), None, StoreOptions::default());
    assert!(
        err.to_string().contains("unsafe path \"../../etc/layer.tar\""),
        "{err}"
    );
}

#[test]
fn an_index_without_this_hosts_platform_lists_the_platforms() {
    let mut oci = Oci::default();
    let arm = oci.image(&config(&[], &["x"], 1), &[base_layer().gzip()]);
    let s390 = oci.image(&config(&[], &["y"], 1), &[base_layer().gzip()]);
    let index = oci.index_blob(&[(&arm, "linux", "arm64"), (&s390, "linux", "s390x")]);
    oci.entry(INDEX, &index, Some("multi:1"));
    let err = refused(&oci.tar(), None, StoreOptions::default());
    assert!(
        err.to_string().contains("it has: linux/arm64, linux/s390x"),
        "{err}"
    );
}

#[test]
fn an_invalid_image_name_is_refused() {
    let archive = docker_save(
        &[SaveImage {
            config: config(&[], &["x"], 1),
            layers: vec![base_layer().tar()],
            tags: vec![],
        }],
        false,
    );
    let err = refused(&archive, Some("Not A/Valid//Name"), StoreOptions::default());
    assert!(matches!(err, Error::InvalidName { .. }), "{err}");
    let tagged = docker_save(
        &[SaveImage {
            config: config(&[], &["x"], 1),
            layers: vec![base_layer().tar()],
            tags: vec!["UPPER/case:1".into()],
        }],
        false,
    );
    let err = refused(&tagged, None, StoreOptions::default());
    assert!(matches!(err, Error::InvalidName { .. }), "{err}");
}

#[test]
fn an_import_over_the_stores_budget_is_refused() {
    let archive = docker_save(
        &[SaveImage {
            config: config(&[], &["x"], 1),
            layers: vec![Layer::new().file("big", &vec![1u8; 300_000], 0o644).tar()],
            tags: vec!["big:1".into()],
        }],
        false,
    );
    let options = StoreOptions {
        max_bytes: Some(200_000),
        ..Default::default()
    };
    let err = refused(&archive, None, options);
    assert!(matches!(err, Error::OverBudget { .. }), "{err}");
}

#[test]
fn an_archive_of_neither_kind_is_refused() {
    let mut b = tar::Builder::new(Vec::new());
    member(&mut b, "hello.txt", b"hi");
    let err = refused(&b.into_inner().unwrap(), None, StoreOptions::default());
    assert!(err.to_string().contains("neither a docker save archive"), "{err}");
}

#[test]
fn a_layout_whose_files_are_symlinks_or_fifos_is_refused_without_following_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut oci = Oci::default();
    let layer = base_layer().gzip();
    let m = oci.image(&config(&[], &["x"], 1), std::slice::from_ref(&layer));
    oci.entry(MANIFEST, &m, Some("t:1"));
    let s = store(&dir.path().join("store"));
    let empty = snapshot(s.root());

    // index.json a symlink (to a copy of itself outside the layout): not followed.
    let layout = dir.path().join("symlinked");
    oci.write_dir(&layout);
    let outside = dir.path().join("index-outside.json");
    fs::rename(layout.join("index.json"), &outside).unwrap();
    std::os::unix::fs::symlink(&outside, layout.join("index.json")).unwrap();
    let err = s.import(&layout, None).unwrap_err();
    assert!(err.to_string().contains("cannot read \"index.json\""), "{err}");

    // A layer blob that is a FIFO: refused at once, not waited on.
    let layout = dir.path().join("fifo");
    oci.write_dir(&layout);
    let blob = layout
        .join("blobs/sha256")
        .join(airlock_image::Digest::of(&layer).hex());
    fs::remove_file(&blob).unwrap();
    let status = Command::new("mkfifo").arg(&blob).status().unwrap();
    assert!(status.success());
    let err = s.import(&layout, None).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
    assert_eq!(snapshot(s.root()), empty);
}

#[test]
fn an_archive_cut_at_a_member_boundary_is_refused() {
    let mut b = tar::Builder::new(Vec::new());
    member(&mut b, "c.json", &config(&[], &["x"], 1));
    member(&mut b, "l/layer.tar", &base_layer().tar());
    let manifest = br#"[{"Config":"c.json","RepoTags":["t:1"],"Layers":["l/layer.tar"]}]"#;
    member(&mut b, "manifest.json", manifest);
    let full = b.into_inner().unwrap();
    // Cut just before the end-of-archive blocks: every member is whole.
    let cut = full.len() - 1024;
    let err = refused(&full[..cut], None, StoreOptions::default());
    assert!(err.to_string().contains("truncated"), "{err}");
}
