//! Pulling images from registries: the real distribution registry (`docker-registry`)
//! on a local port with images the tests build and push, and fake registries that lie,
//! cut downloads short or never answer. Nothing comes from the internet.

mod common;
#[path = "common/registry.rs"]
mod reg;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use airlock_image::{Credentials, Digest, Error, PullOptions, Store, StoreOptions, pull};
use common::{Layer, leftovers, store, store_with};
use reg::*;

/// Options for a local registry: plain HTTP allowed for `host`, no credentials, short
/// timeouts so failures show quickly.
fn options(host: &str) -> PullOptions {
    PullOptions {
        insecure: vec![host.to_owned()],
        credentials: Credentials::Anonymous,
        timeout: Duration::from_secs(20),
        stall_timeout: Duration::from_secs(5),
        concurrency: 3,
    }
}

fn two_layer_image() -> TestImage {
    let base = Layer::new()
        .dir("etc", 0o755)
        .file("etc/old.conf", b"old", 0o644)
        .file("bin/hello", b"#!/bin/sh\necho hello\n", 0o755)
        .gzip();
    let top = Layer::new()
        .file("etc/.wh.old.conf", b"", 0o644)
        .file("etc/new.conf", b"new", 0o644)
        .gzip();
    TestImage::oci(vec![(base, TAR_GZIP), (top, TAR_GZIP)], "amd64")
}

/// Every blob of `image` is in the store, and its layers are unpacked.
fn assert_stored(store: &Store, image: &TestImage) {
    assert!(store.has_blob(&image.manifest_digest()), "manifest missing");
    assert!(store.has_blob(&image.config_digest()), "config missing");
    for d in image.layer_digests() {
        assert!(store.has_blob(&d), "layer blob {d} missing");
        assert!(store.has_layer(&d), "layer {d} not unpacked");
    }
}

#[test]
fn pulls_a_multi_layer_oci_image_with_a_whiteout() {
    if !registry_available() {
        return;
    }
    let registry = Registry::start();
    let image = two_layer_image();
    registry.push_image("tools/hello", "v1", &image);
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir.path().join("store"));

    let reference = format!("{}/tools/hello:v1", registry.host);
    let pulled = pull(&store, &reference, &options(&registry.host)).unwrap();
    assert_eq!(pulled.reference, reference);
    assert_eq!(pulled.manifest_digest, image.manifest_digest());
    assert_eq!(pulled.config_digest, image.config_digest());
    let layers: Vec<Digest> = pulled.layers.iter().map(|(d, _)| d.clone()).collect();
    assert_eq!(layers, image.layer_digests());
    assert!(pulled.layers.iter().all(|(_, mt)| mt == TAR_GZIP));
    assert_eq!(pulled.blobs_fetched, 4);
    let total: usize = image.layers.iter().map(|(b, _)| b.len()).sum::<usize>()
        + image.config.len()
        + image.manifest().len();
    assert_eq!(pulled.bytes_fetched, total as u64);
    assert_stored(&store, &image);
    // The store holds the manifest bytes as pushed, for the catalog to read.
    assert_eq!(
        std::fs::read(store.blob_path(&image.manifest_digest())).unwrap(),
        image.manifest()
    );
    let base = store.layer_path(&layers[0]);
    assert_eq!(
        std::fs::read(base.join("bin/hello")).unwrap(),
        b"#!/bin/sh\necho hello\n"
    );
    assert!(store.layer_path(&layers[1]).join("etc/.wh.old.conf").exists());
    let root = dir.path().join("root");
    store.flatten(&layers, &root).unwrap();
    assert_eq!(std::fs::read(root.join("etc/new.conf")).unwrap(), b"new");
    assert!(!root.join("etc/old.conf").exists(), "whiteout not applied");
    assert!(leftovers(&store).is_empty());

    // Again: everything is there, nothing is fetched.
    let again = pull(&store, &reference, &options(&registry.host)).unwrap();
    assert_eq!((again.blobs_fetched, again.bytes_fetched), (0, 0));
    assert_eq!(again.manifest_digest, pulled.manifest_digest);

    // By digest too.
    let by_digest = format!("{}/tools/hello@{}", registry.host, image.manifest_digest());
    let pulled = pull(&store, &by_digest, &options(&registry.host)).unwrap();
    assert_eq!(pulled.reference, by_digest);
    assert_eq!(pulled.manifest_digest, image.manifest_digest());
}

#[test]
fn an_index_fetches_only_the_linux_amd64_image() {
    if !registry_available() {
        return;
    }
    let registry = Registry::start();
    let arm = TestImage::oci(
        vec![(Layer::new().file("arch", b"arm64", 0o644).gzip(), TAR_GZIP)],
        "arm64",
    );
    let amd = TestImage::oci(
        vec![(Layer::new().file("arch", b"amd64", 0o644).gzip(), TAR_GZIP)],
        "amd64",
    );
    for (img, tag) in [(&arm, "arm"), (&amd, "amd")] {
        registry.push_image("multi", tag, img);
    }
    let idx = index(&[(&arm.manifest(), "linux/arm64"), (&amd.manifest(), "linux/amd64")]);
    let index_digest = registry.push_manifest("multi", "latest", OCI_INDEX, &idx);
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());

    let pulled = pull(
        &store,
        &format!("{}/multi", registry.host),
        &options(&registry.host),
    )
    .unwrap();
    assert_eq!(pulled.reference, format!("{}/multi:latest", registry.host));
    assert_eq!(pulled.manifest_digest, amd.manifest_digest());
    assert_stored(&store, &amd);
    let layer = &amd.layer_digests()[0];
    assert_eq!(
        std::fs::read(store.layer_path(layer).join("arch")).unwrap(),
        b"amd64"
    );
    for d in [
        arm.manifest_digest(),
        arm.config_digest(),
        arm.layer_digests()[0].clone(),
    ] {
        assert!(!store.has_blob(&d), "arm64 blob {d} fetched");
    }
    assert!(
        !store.has_blob(&index_digest),
        "the index is not stored, only the image"
    );
    assert_eq!(pulled.blobs_fetched, 3);
}

#[test]
fn an_index_without_linux_amd64_names_the_platforms_it_has() {
    if !registry_available() {
        return;
    }
    let registry = Registry::start();
    let arm = TestImage::oci(
        vec![(Layer::new().file("a", b"a", 0o644).gzip(), TAR_GZIP)],
        "arm64",
    );
    registry.push_image("armonly", "arm", &arm);
    let idx = index(&[(&arm.manifest(), "linux/arm64")]);
    registry.push_manifest("armonly", "latest", OCI_INDEX, &idx);
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let err = pull(
        &store,
        &format!("{}/armonly", registry.host),
        &options(&registry.host),
    )
    .unwrap_err();
    assert!(matches!(err, Error::PlatformMissing { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "image {}/armonly:latest has no linux/amd64 manifest; its index lists: linux/arm64",
            registry.host
        )
    );
    assert!(store.blobs().unwrap().is_empty());
}

#[test]
fn docker_schema2_zstd_and_plain_tar_layers_are_pulled() {
    if !registry_available() {
        return;
    }
    let registry = Registry::start();
    let docker = TestImage::docker(vec![(
        Layer::new().file("docker.txt", b"docker gzip", 0o644).gzip(),
        DOCKER_GZIP,
    )]);
    registry.push_image("docker", "1", &docker);
    let oci = TestImage::oci(
        vec![
            (Layer::new().file("z.txt", b"zstd layer", 0o644).zstd(), TAR_ZSTD),
            (Layer::new().file("t.txt", b"plain layer", 0o644).tar(), TAR),
        ],
        "amd64",
    );
    registry.push_image("mixed", "1", &oci);
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());

    let pulled = pull(
        &store,
        &format!("{}/docker:1", registry.host),
        &options(&registry.host),
    )
    .unwrap();
    assert_eq!(pulled.layers[0].1, DOCKER_GZIP);
    assert_stored(&store, &docker);
    let d = &docker.layer_digests()[0];
    assert_eq!(
        std::fs::read(store.layer_path(d).join("docker.txt")).unwrap(),
        b"docker gzip"
    );

    let pulled = pull(
        &store,
        &format!("{}/mixed:1", registry.host),
        &options(&registry.host),
    )
    .unwrap();
    assert_eq!(pulled.layers[0].1, TAR_ZSTD);
    assert_stored(&store, &oci);
    let [z, t] = &oci.layer_digests()[..] else {
        panic!()
    };
    assert_eq!(
        std::fs::read(store.layer_path(z).join("z.txt")).unwrap(),
        b"zstd layer"
    );
    assert_eq!(
        std::fs::read(store.layer_path(t).join("t.txt")).unwrap(),
        b"plain layer"
    );
}

#[test]
fn a_foreign_layer_is_refused_before_anything_is_fetched() {
    let foreign = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip";
    let image = TestImage::docker(vec![
        (Layer::new().file("a", b"a", 0o644).gzip(), DOCKER_GZIP),
        (Layer::new().file("b", b"b", 0o644).gzip(), foreign),
    ]);
    let fake = lying_registry(
        &image,
        "foreign",
        &image.layer_digests()[1],
        Reply::ok("x", Vec::new()),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let err = pull(&store, &format!("{}/foreign:1", fake.host), &options(&fake.host)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "image {}/foreign:1: layer {} has unsupported media type {foreign}",
            fake.host,
            image.layer_digests()[1]
        )
    );
    assert!(store.blobs().unwrap().is_empty());
    let blob_requests: usize = fake
        .hits
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _)| p.contains("/blobs/"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(blob_requests, 0);
}

#[test]
fn unknown_tag_and_unknown_repository_are_not_found() {
    if !registry_available() {
        return;
    }
    let registry = Registry::start();
    registry.push_image("present", "v1", &two_layer_image());
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    for name in ["present:v2", "absent/repo:v1"] {
        let reference = format!("{}/{name}", registry.host);
        let err = pull(&store, &reference, &options(&registry.host)).unwrap_err();
        assert!(matches!(err, Error::NotInRegistry { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("image {reference} not found in registry {}", registry.host)
        );
    }
    assert!(store.blobs().unwrap().is_empty());
    assert!(leftovers(&store).is_empty());
}

#[test]
fn invalid_references_are_refused_with_the_reference_named() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let err = pull(&store, "Bad/Name:1", &PullOptions::default()).unwrap_err();
    assert!(matches!(err, Error::InvalidReference { .. }), "{err:?}");
    assert!(err.to_string().contains("\"Bad/Name:1\""), "{err}");
    assert_eq!(
        airlock_image::canonical_reference("python:3.12-slim").unwrap(),
        "docker.io/library/python:3.12-slim"
    );
}

#[test]
fn basic_auth_uses_docker_config_credentials() {
    if !registry_available() {
        return;
    }
    let registry = Registry::start_basic("alice", "wonderland");
    let image = two_layer_image();
    registry.push_image("private/app", "1", &image);
    let reference = format!("{}/private/app:1", registry.host);
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir.path().join("store"));

    // No credentials at all.
    let err = pull(&store, &reference, &options(&registry.host)).unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "registry {} refused access to {reference}",
            registry.host
        )),
        "{msg}"
    );
    assert!(
        msg.contains("no credentials") && msg.contains("docker login"),
        "{msg}"
    );

    // A docker config without an entry for this registry.
    let config = dir.path().join("config.json");
    std::fs::write(&config, r#"{"auths": {"ghcr.io": {"auth": "eDp5"}}}"#).unwrap();
    let mut opts = options(&registry.host);
    opts.credentials = Credentials::DockerConfig(Some(config.clone()));
    let msg = pull(&store, &reference, &opts).unwrap_err().to_string();
    assert!(
        msg.contains(&format!("none for {} in {}", registry.host, config.display())),
        "{msg}"
    );

    // The wrong password: the message names the user, never the password.
    let bad = basic_header("alice", "looking-glass");
    let bad = bad.trim_start_matches("Basic ");
    std::fs::write(
        &config,
        format!(
            r#"{{"auths": {{"http://{}": {{"auth": "{bad}"}}}}}}"#,
            registry.host
        ),
    )
    .unwrap();
    let msg = pull(&store, &reference, &opts).unwrap_err().to_string();
    assert!(
        msg.contains("user \"alice\" from") && !msg.contains("looking-glass"),
        "{msg}"
    );
    assert!(store.blobs().unwrap().is_empty());

    // The right one, in the `auth` form and in the username/password form.
    let good = basic_header("alice", "wonderland");
    let good = good.trim_start_matches("Basic ");
    std::fs::write(
        &config,
        format!(r#"{{"auths": {{"{}": {{"auth": "{good}"}}}}}}"#, registry.host),
    )
    .unwrap();
    pull(&store, &reference, &opts).unwrap();
    assert_stored(&store, &image);

    let other = tempfile::tempdir().unwrap();
    let store2 = store_with(other.path(), StoreOptions::default());
    std::fs::write(
        &config,
        format!(
            r#"{{"auths": {{"{}": {{"username": "alice", "password": "wonderland"}}}}}}"#,
            registry.host
        ),
    )
    .unwrap();
    pull(&store2, &reference, &opts).unwrap();
    // Explicit credentials.
    let store3 = common::store(&other.path().join("3"));
    opts.credentials = Credentials::Basic {
        username: "alice".into(),
        password: "wonderland".into(),
    };
    pull(&store3, &reference, &opts).unwrap();
    assert_stored(&store3, &image);
}

#[test]
fn plain_http_is_refused_unless_the_registry_is_marked_insecure() {
    if !registry_available() {
        return;
    }
    let registry = Registry::start();
    registry.push_image("app", "1", &two_layer_image());
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let mut opts = options(&registry.host);
    opts.insecure.clear();
    let err = pull(&store, &format!("{}/app:1", registry.host), &opts).unwrap_err();
    assert!(matches!(err, Error::InsecureRefused { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("registry {}: HTTPS connection failed", registry.host)),
        "{msg}"
    );
    assert!(
        msg.ends_with("plain HTTP is used only for registries marked insecure"),
        "{msg}"
    );
    // Another host marked insecure does not count.
    opts.insecure = vec!["127.0.0.1:1".into()];
    let err = pull(&store, &format!("{}/app:1", registry.host), &opts).unwrap_err();
    assert!(matches!(err, Error::InsecureRefused { .. }), "{err:?}");
    assert!(store.blobs().unwrap().is_empty());
}

#[test]
fn a_full_store_refuses_the_pull_and_keeps_nothing_partial() {
    if !registry_available() {
        return;
    }
    let registry = Registry::start();
    let big: Vec<u8> = (0..200_000u32)
        .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
        .collect();
    let image = TestImage::oci(vec![(Layer::new().file("big", &big, 0o644).tar(), TAR)], "amd64");
    registry.push_image("big", "1", &image);
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(
        dir.path(),
        StoreOptions {
            max_bytes: Some(100_000),
            ..StoreOptions::default()
        },
    );
    let err = pull(
        &store,
        &format!("{}/big:1", registry.host),
        &options(&registry.host),
    )
    .unwrap_err();
    assert!(matches!(err, Error::OverBudget { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("image store budget of 100000 bytes exceeded"),
        "{err}"
    );
    assert!(!store.has_blob(&image.layer_digests()[0]));
    assert!(!store.has_blob(&image.manifest_digest()));
    assert!(leftovers(&store).is_empty(), "{:?}", leftovers(&store));
}

#[test]
fn concurrent_pulls_of_one_image_fetch_each_blob_once() {
    if !registry_available() {
        return;
    }
    let registry = Registry::start();
    let image = two_layer_image();
    registry.push_image("shared", "1", &image);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    let reference = format!("{}/shared:1", registry.host);
    let pulls: Vec<_> = (0..2)
        .map(|_| {
            let (root, reference, opts) = (root.clone(), reference.clone(), options(&registry.host));
            std::thread::spawn(move || pull(&store(&root), &reference, &opts).unwrap())
        })
        .collect();
    let results: Vec<_> = pulls.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(results[0].manifest_digest, results[1].manifest_digest);
    assert_eq!(results.iter().map(|p| p.blobs_fetched).sum::<usize>(), 4);
    assert_stored(&store(&root), &image);
}

/// A fake registry serving `image` under `repo:1`, with the blob `layer` replaced by
/// `reply`.
fn lying_registry(image: &TestImage, repo: &str, layer: &Digest, reply: Reply) -> FakeRegistry {
    let mut routes = HashMap::new();
    routes.insert(
        format!("/v2/{repo}/manifests/1"),
        Reply::ok(image.manifest_type, image.manifest()),
    );
    routes.insert(
        format!("/v2/{repo}/blobs/{}", image.config_digest()),
        Reply::ok("application/octet-stream", image.config.clone()),
    );
    for (bytes, _) in &image.layers {
        routes.insert(
            format!("/v2/{repo}/blobs/{}", Digest::of(bytes)),
            Reply::ok("application/octet-stream", bytes.clone()),
        );
    }
    routes.insert(format!("/v2/{repo}/blobs/{layer}"), reply);
    FakeRegistry::start(routes)
}

fn assert_nothing_of(store: &Store, image: &TestImage, bad: &Digest) {
    assert!(!store.has_blob(bad), "bad blob stored");
    assert!(!store.has_layer(bad), "bad layer unpacked");
    assert!(!store.has_blob(&image.manifest_digest()), "manifest stored");
    assert!(leftovers(store).is_empty(), "{:?}", leftovers(store));
}

#[test]
fn a_blob_whose_bytes_do_not_match_its_digest_is_refused() {
    let image = two_layer_image();
    let bad = image.layer_digests()[1].clone();
    let mut wrong = image.layers[1].0.clone();
    let last = wrong.len() - 1;
    wrong[last] ^= 0xff;
    let fake = lying_registry(
        &image,
        "liar",
        &bad,
        Reply::ok("application/octet-stream", wrong.clone()),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let err = pull(&store, &format!("{}/liar:1", fake.host), &options(&fake.host)).unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "blob digest mismatch: expected {bad}, content is {}",
            Digest::of(&wrong)
        )
    );
    assert_nothing_of(&store, &image, &bad);
}

#[test]
fn a_manifest_that_does_not_match_the_digest_asked_for_is_refused() {
    let image = two_layer_image();
    let mut routes = HashMap::new();
    let asked = Digest::of(b"some other manifest");
    routes.insert(
        format!("/v2/liar/manifests/{asked}"),
        Reply::ok(image.manifest_type, image.manifest()),
    );
    let fake = FakeRegistry::start(routes);
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let err = pull(
        &store,
        &format!("{}/liar@{asked}", fake.host),
        &options(&fake.host),
    )
    .unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains(&asked.to_string()), "{err}");
    assert!(store.blobs().unwrap().is_empty());
}

#[test]
fn a_truncated_download_is_refused() {
    let image = two_layer_image();
    let bad = image.layer_digests()[0].clone();
    let full = image.layers[0].0.clone();
    let reply = Reply {
        declared_len: Some(full.len()),
        ..Reply::ok("application/octet-stream", full[..full.len() / 2].to_vec())
    };
    let fake = lying_registry(&image, "short", &bad, reply);
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let err = pull(&store, &format!("{}/short:1", fake.host), &options(&fake.host)).unwrap_err();
    assert!(matches!(err, Error::Truncated { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "blob {bad} truncated: expected {} bytes, got {}",
            full.len(),
            full.len() / 2
        )
    );
    assert_nothing_of(&store, &image, &bad);
}

#[test]
fn a_registry_that_is_down_is_named() {
    let host = format!("127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let err = pull(&store, &format!("{host}/app:1"), &options(&host)).unwrap_err();
    assert!(matches!(err, Error::RegistryUnreachable { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!("registry {host} unreachable: connection refused")
    );
    assert!(store.blobs().unwrap().is_empty());
}

#[test]
fn a_registry_that_never_answers_times_out() {
    let silent = SilentServer::start();
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let mut opts = options(&silent.host);
    opts.stall_timeout = Duration::from_secs(1);
    let started = Instant::now();
    let err = pull(&store, &format!("{}/app:1", silent.host), &opts).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::RegistryTimeout { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with(&format!("registry {} timed out after 1 s", silent.host)),
        "{err}"
    );

    // The whole pull's timeout, shorter than the stall timeout.
    opts.stall_timeout = Duration::from_secs(10);
    opts.timeout = Duration::from_millis(500);
    let started = Instant::now();
    let err = pull(&store, &format!("{}/app:1", silent.host), &opts).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        err.to_string(),
        format!(
            "registry {} timed out after 0.5 s (the whole pull's timeout)",
            silent.host
        )
    );
    assert!(store.blobs().unwrap().is_empty());
    assert!(leftovers(&store).is_empty());
}

#[test]
fn bearer_token_auth_gets_a_token_with_docker_config_credentials() {
    if !registry_available() {
        return;
    }
    let (registry, tokens) = Registry::start_token("bob", "builder");
    let image = two_layer_image();
    registry.push_image("team/app", "1", &image);
    let reference = format!("{}/team/app:1", registry.host);
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir.path().join("store"));

    // Anonymous: the token service hands out a token that grants nothing.
    let err = pull(&store, &reference, &options(&registry.host)).unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    assert!(err.to_string().contains("no credentials"), "{err}");

    // Wrong password: the token service refuses, and says so.
    let mut opts = options(&registry.host);
    opts.credentials = Credentials::Basic {
        username: "bob".into(),
        password: "wrong".into(),
    };
    let err = pull(&store, &reference, &opts).unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("user \"bob\" given explicitly") && !msg.contains("wrong"),
        "{msg}"
    );
    assert!(msg.contains("incorrect username or password"), "{msg}");
    assert!(store.blobs().unwrap().is_empty());
    assert_eq!(tokens.issued.load(std::sync::atomic::Ordering::SeqCst), 0);

    // Right credentials from a docker config file.
    let config = dir.path().join("config.json");
    let auth = basic_header("bob", "builder");
    std::fs::write(
        &config,
        format!(
            r#"{{"auths": {{"{}": {{"auth": "{}"}}}}}}"#,
            registry.host,
            auth.trim_start_matches("Basic ")
        ),
    )
    .unwrap();
    opts.credentials = Credentials::DockerConfig(Some(config));
    let pulled = pull(&store, &reference, &opts).unwrap();
    assert_eq!(pulled.blobs_fetched, 4);
    assert_stored(&store, &image);
    assert!(tokens.issued.load(std::sync::atomic::Ordering::SeqCst) >= 1);
}

#[test]
fn a_blob_the_registry_does_not_have_is_named() {
    let image = two_layer_image();
    let missing = image.layer_digests()[0].clone();
    let reply = Reply {
        status: 404,
        ..Reply::ok(
            "application/json",
            br#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}"#.to_vec(),
        )
    };
    let fake = lying_registry(&image, "holes", &missing, reply);
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let reference = format!("{}/holes:1", fake.host);
    let err = pull(&store, &reference, &options(&fake.host)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "registry {}: blob {missing} of image {reference} not found (the manifest names it, the registry does not have it)",
            fake.host
        )
    );
    assert_nothing_of(&store, &image, &missing);
}

#[test]
fn a_download_that_stalls_midway_times_out() {
    let image = two_layer_image();
    let slow = image.layer_digests()[1].clone();
    let full = image.layers[1].0.clone();
    let reply = Reply {
        declared_len: Some(full.len()),
        stall: Some(Duration::from_secs(30)),
        ..Reply::ok("application/octet-stream", full[..full.len() / 2].to_vec())
    };
    let fake = lying_registry(&image, "stall", &slow, reply);
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let mut opts = options(&fake.host);
    opts.stall_timeout = Duration::from_secs(1);
    let started = Instant::now();
    let err = pull(&store, &format!("{}/stall:1", fake.host), &opts).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        err.to_string(),
        format!(
            "registry {} timed out after 1 s (no answer within the per-request stall timeout)",
            fake.host
        )
    );
    assert_nothing_of(&store, &image, &slow);
}
