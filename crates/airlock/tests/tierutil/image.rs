//! Images for the suites that run sandboxes in an OCI image (tests/images.rs, the image
//! variant of the contract suite): OCI layouts written from host files by
//! `bench/oci_layout.py` and `bench/images.py` (Python standard library, nothing from the
//! internet), imported with the real `airlock image import`.
//!
//! The python image (static busybox with every applet, python3.11 with its libraries, the
//! standard library) is built once per test process into a store shared by every test
//! binary (`CARGO_TARGET_TMPDIR/airlock-test-images`; the store takes file locks, so
//! binaries running at once share it safely, and an import of the same layout again
//! changes nothing).

use crate::common::host::airlock;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// One image in a store.
#[derive(Debug)]
pub struct TestImage {
    /// The store (`--image-store`).
    pub store: PathBuf,
    /// The name it was imported under (`--image`).
    pub name: &'static str,
}

/// `Env` of the python image: its own PATH (airlock's default has `/usr/local/bin` first)
/// and a variable of its own.
pub const PY_ENV: &[&str] = &["PATH=/usr/bin:/bin", "IMAGE_VAR=from-image"];
/// `Cmd` of the python image, started in [`PY_WORKDIR`] when a request gives no command.
pub const PY_CMD: &[&str] = &["sh", "-c", "echo image-cmd in $(pwd) as $(id -u)"];
/// `WorkingDir` of the python image.
pub const PY_WORKDIR: &str = "/usr/lib";

/// The repository's `bench/` directory (oci_layout.py, images.py).
pub fn bench_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench")
}

/// The store shared by the test binaries.
pub fn shared_store() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("airlock-test-images")
}

/// Runs python3 with `bench/` importable: `code` may `import oci_layout, images`.
#[track_caller]
pub fn bench_python(code: &str) {
    let out = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sys; sys.path.insert(0, {:?})\n{code}",
            bench_dir().display().to_string()
        ))
        .output()
        .expect("spawn python3");
    assert!(
        out.status.success(),
        "python3 failed: {}\n{code}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Python source for a busybox layer with every applet busybox has (the contract's
/// scripts use `stat`, `find`, `tar`, `setsid`, …).
const FULL_BUSYBOX: &str = "import functools, subprocess, oci_layout\n\
     _applets = tuple(a for a in subprocess.check_output(['/bin/busybox', '--list'], text=True).split() if a != 'busybox')\n\
     oci_layout.busybox_layer = functools.partial(oci_layout.busybox_layer, applets=_applets)\n";

/// Writes an OCI layout at `out`: the python image (`bench/images.py`'s `python_layers`,
/// busybox with every applet) with `config`, named `reference`; uncompressed layers
/// (gzip of the standard library takes seconds).
pub fn write_python_layout(out: &Path, reference: &str, config: &serde_json::Value) {
    bench_python(&format!(
        "{FULL_BUSYBOX}import images, json\n\
         oci_layout.write_layout({out:?}, images.python_layers(), json.loads({config:?}), ref={reference:?}, compress=False)\n",
        out = out.display().to_string(),
        config = config.to_string(),
    ));
}

/// Writes an OCI layout at `out`: one layer of busybox (every applet) with `config`.
pub fn write_busybox_layout(out: &Path, reference: &str, config: &serde_json::Value) {
    bench_python(&format!(
        "{FULL_BUSYBOX}import json\n\
         oci_layout.write_layout({out:?}, [oci_layout.busybox_layer()], json.loads({config:?}), ref={reference:?})\n",
        out = out.display().to_string(),
        config = config.to_string(),
    ));
}

/// The python image's config ([`PY_ENV`], [`PY_CMD`], [`PY_WORKDIR`]).
pub fn python_config() -> serde_json::Value {
    serde_json::json!({"Env": PY_ENV, "Cmd": PY_CMD, "WorkingDir": PY_WORKDIR})
}

/// `airlock image import LAYOUT --name NAME --image-store STORE`, asserting success.
#[track_caller]
pub fn import(store: &Path, layout: &Path, name: &str) {
    let run = airlock(&[
        "image",
        "--image-store",
        store.to_str().unwrap(),
        "import",
        layout.to_str().unwrap(),
        "--name",
        name,
    ]);
    assert_eq!(run.code(), Some(0), "image import failed: {}", run.stderr());
}

/// The python image, `airlock-test/python:1` in [`shared_store`], built and imported on
/// first use in this process.
pub fn python_image() -> &'static TestImage {
    static IMAGE: OnceLock<TestImage> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let store = shared_store();
        std::fs::create_dir_all(&store).expect("create the shared image store");
        let work = tempfile::Builder::new()
            .prefix("airlock-test-pylayout-")
            .tempdir()
            .expect("tempdir");
        let layout = work.path().join("layout");
        let name = "airlock-test/python:1";
        write_python_layout(&layout, name, &python_config());
        import(&store, &layout, name);
        TestImage { store, name }
    })
}
