//! Warm pools of images: `airlock serve --pool IMAGE=N` (namespaces) and `--gvisor-pool
//! IMAGE=N` keep sandboxes of an image from the store ready; a request for the image
//! gets one, a request for another image or for the host's root never does.

mod common;
mod serverutil;

use serde_json::{Value, json};
use serverutil::{Daemon, metric, poll, serve_refuses};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The repository (bench/oci_layout.py writes the test images).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Imports into `store` a busybox image named `name` whose file /id.txt holds `name`.
fn import(store: &Path, work: &Path, name: &str) {
    let layout = work.join(format!("layout-{}", name.replace([':', '/'], "_")));
    let id = work.join(format!("{}.txt", name.replace([':', '/'], "_")));
    std::fs::write(&id, name).unwrap();
    let made = Command::new("python3")
        .arg(repo().join("bench/oci_layout.py"))
        .arg(&layout)
        .args(["--busybox", "--env", "PATH=/bin"])
        .arg("--layer")
        .arg(format!("{}=id.txt", id.display()))
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(["image", "import", "--name", name, "--image-store"])
        .arg(store)
        .arg(&layout)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn exec(d: &Daemon, body: Value) -> Value {
    d.client().post_json("/v1/exec", &body).expect(200).json()
}

#[test]
fn an_image_pool_serves_its_image_and_nothing_else() {
    let work = tempfile::tempdir().unwrap();
    let store = work.path().join("store");
    import(&store, work.path(), "pooled:1");
    import(&store, work.path(), "other:1");
    let store_arg = store.to_str().unwrap();
    let d = Daemon::start(&["--image-store", store_arg, "--pool", "1", "--pool", "pooled:1=2"]);
    let ready = || {
        metric(
            &d.client().get("/metrics").text(),
            "airlock_image_pool_ready{isolation=\"namespaces\",image=\"pooled:1\"}",
        )
    };
    poll(Duration::from_secs(30), || (ready() == Some(2.0)).then_some(())).expect("the image pool fills");

    // The image's request takes a pooled sandbox of it (and runs in the image).
    let r = exec(&d, json!({"image": "pooled:1", "cmd": ["cat", "/id.txt"]}));
    assert_eq!(r["stdout"], "pooled:1", "{r}");
    assert!(ready() < Some(2.0), "the pooled sandbox was taken");
    poll(Duration::from_secs(30), || (ready() == Some(2.0)).then_some(())).expect("the image pool refills");

    // Another image, and the host's root, never get one of its sandboxes.
    let r = exec(&d, json!({"image": "other:1", "cmd": ["cat", "/id.txt"]}));
    assert_eq!(r["stdout"], "other:1", "{r}");
    let r = exec(
        &d,
        json!({"cmd": ["sh", "-c", "test -e /id.txt && echo image || echo host"]}),
    );
    assert_eq!(r["stdout"], "host\n", "{r}");
    assert_eq!(ready(), Some(2.0));

    // A session of the image takes one too, and keeps the image.
    let s = d
        .client()
        .post_json("/v1/sandboxes", &json!({"image": "pooled:1"}))
        .expect(201)
        .json();
    let id = s["id"].as_str().unwrap();
    let info = d.client().get(&format!("/v1/sandboxes/{id}")).expect(200).json();
    assert_eq!(info["image"]["name"], "docker.io/library/pooled:1", "{info}");
    let r = d
        .client()
        .post_json(
            &format!("/v1/sandboxes/{id}/exec"),
            &json!({"cmd": ["cat", "/id.txt"]}),
        )
        .expect(200)
        .json();
    assert_eq!(r["stdout"], "pooled:1", "{r}");
    d.client().delete(&format!("/v1/sandboxes/{id}")).expect(204);
}

#[test]
fn a_gvisor_image_pool_serves_its_image() {
    let work = tempfile::tempdir().unwrap();
    let store = work.path().join("store");
    import(&store, work.path(), "gpooled:1");
    let d = Daemon::start(&[
        "--image-store",
        store.to_str().unwrap(),
        "--gvisor-pool",
        "gpooled:1=1",
    ]);
    let ready = || {
        metric(
            &d.client().get("/metrics").text(),
            "airlock_image_pool_ready{isolation=\"gvisor\",image=\"gpooled:1\"}",
        )
    };
    poll(Duration::from_secs(60), || (ready() == Some(1.0)).then_some(()))
        .expect("the gVisor image pool fills");
    let r = exec(
        &d,
        json!({"image": "gpooled:1", "isolation": "gvisor", "cmd": ["cat", "/id.txt"]}),
    );
    assert_eq!(r["stdout"], "gpooled:1", "{r}");
    assert_eq!(r["isolation"], "gvisor");
}

#[test]
fn a_pool_of_an_image_the_store_lacks_or_a_bad_value_stops_the_start() {
    let work = tempfile::tempdir().unwrap();
    let store = work.path().join("store");
    let store_arg = store.to_str().unwrap();
    let f = serve_refuses(&["--image-store", store_arg, "--pool", "missing:1=2"]);
    assert_eq!(f.status.code(), Some(2));
    assert!(f.stderr.contains("--pool missing:1=2"), "{}", f.stderr);
    assert!(f.stderr.contains("pull or import it first"), "{}", f.stderr);
    assert!(!f.stdout.contains("listening"), "{}", f.stdout);

    let f = serve_refuses(&["--image-store", store_arg, "--pool", "x=many"]);
    assert_eq!(f.status.code(), Some(2));
    assert!(f.stderr.contains("not a count of sandboxes"), "{}", f.stderr);

    import(&store, work.path(), "vm:1");
    let f = serve_refuses(&["--image-store", store_arg, "--pool", "vm:1=1", "--pool", "vm:1=2"]);
    assert!(f.stderr.contains("has a pool already"), "{}", f.stderr);
}
