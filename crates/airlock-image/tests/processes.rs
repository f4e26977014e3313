//! Two airlock processes sharing one store: separate processes (this test binary run again)
//! asking for the same blob and layer at once fetch and unpack them once.

mod common;

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::process::{Command, Stdio};

use airlock_image::{Digest, LayerStatus};
use common::{Layer, store};

const CHILDREN: usize = 6;

fn layer_blob() -> Vec<u8> {
    let mut l = Layer::new();
    for i in 0..100 {
        l = l.file(&format!("f{i}"), &vec![i as u8; 20_000], 0o644);
    }
    l.gzip()
}

/// Run only by `processes_share_one_store`, with the store and the log in its environment.
#[test]
#[ignore = "a child process of processes_share_one_store"]
fn child_fetch_and_unpack() {
    let root = std::env::var("AIRLOCK_IMAGE_TEST_STORE").unwrap();
    let log = std::env::var("AIRLOCK_IMAGE_TEST_LOG").unwrap();
    // Start together: the parent closes every child's stdin at once.
    std::io::stdin().read_to_end(&mut Vec::new()).unwrap();
    let s = store(root.as_ref());
    let blob = layer_blob();
    let d = Digest::of(&blob);
    let append = |line: &str| {
        let mut f = OpenOptions::new().append(true).create(true).open(&log).unwrap();
        f.write_all(line.as_bytes()).unwrap();
    };
    s.ensure_blob(&d, None, || {
        append("fetched\n");
        Ok(&blob[..])
    })
    .unwrap();
    if let LayerStatus::Unpacked(_) = s.unpack_layer(&d, None).unwrap() {
        append("unpacked\n");
    }
}

#[test]
fn processes_share_one_store() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let log = dir.path().join("log");
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "child_fetch_and_unpack",
                    "--ignored",
                    "--test-threads=1",
                ])
                .env("AIRLOCK_IMAGE_TEST_STORE", &root)
                .env("AIRLOCK_IMAGE_TEST_LOG", &log)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in &mut children {
        drop(c.stdin.take());
    }
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
    }
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(log, "fetched\nunpacked\n");
    let s = store(&root);
    let d = Digest::of(&layer_blob());
    assert!(s.has_blob(&d) && s.has_layer(&d));
    assert_eq!(
        std::fs::read(s.layer_path(&d).join("f42")).unwrap(),
        vec![42u8; 20_000]
    );
}
