//! IMAGES, END TO END (issue 14): the real binary's `airlock image pull|import|ls|rm|prune`,
//! `airlock run --image` on the namespace and gVisor tiers, and `airlock serve
//! --image-store` (one-shot execs and sessions in an image), on the real kernel.
//!
//! Nothing comes from the internet: images are OCI layouts written from host files by
//! `bench/oci_layout.py` and `bench/images.py` (tests/tierutil/image.rs), pushed with
//! `skopeo` to a real registry (Debian's `docker-registry`) on loopback, or turned into a
//! `docker save` archive by `skopeo copy … docker-archive:`. Every sandbox run is checked
//! to leave nothing on the host (tests/tierutil), and so is every daemon and session.

mod common;
mod serverutil;
mod tierutil;

use common::host::{Run, airlock, airlock_run, serial};
use serde_json::{Value, json};
use serverutil::{Client, Daemon, poll};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tierutil::image::{
    PY_CMD, PY_WORKDIR, import, python_config, python_image, write_busybox_layout, write_python_layout,
};
use tierutil::{assert_run_left_nothing, daemon_leftovers, sandbox_leftovers};

// ---------------------------------------------------------------------------------------
// Helpers: a registry on loopback, layouts, stores.
// ---------------------------------------------------------------------------------------

/// A `docker-registry serve` on a free loopback port, its storage in a temp dir; killed
/// on drop.
struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    host: String,
    _dir: tempfile::TempDir,
}

impl Registry {
    fn start() -> Registry {
        let dir = tempfile::Builder::new()
            .prefix("airlock-test-registry-")
            .tempdir()
            .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let host = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    \
                 rootdirectory: {}\nhttp:\n  addr: {host}\n",
                dir.path().join("storage").display()
            ),
        )
        .unwrap();
        let child = Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn docker-registry (Debian package docker-registry)");
        let up = poll(Duration::from_secs(20), || TcpStream::connect(&host).ok());
        assert!(up.is_some(), "docker-registry did not listen on {host}");
        Registry {
            child,
            host,
            _dir: dir,
        }
    }

    /// `skopeo copy oci:LAYOUT:REF docker://HOST/NAME` over plain HTTP.
    #[track_caller]
    fn push(&self, layout: &Path, reference: &str, name: &str) {
        skopeo(&[
            "copy",
            "--dest-tls-verify=false",
            &format!("oci:{}:{reference}", layout.display()),
            &format!("docker://{}/{name}", self.host),
        ]);
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[track_caller]
fn skopeo(args: &[&str]) {
    let out = Command::new("skopeo").args(args).output().expect("spawn skopeo");
    assert!(
        out.status.success(),
        "skopeo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temp dir for one test: its store (`store/`) and its layouts.
fn workdir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("airlock-test-images-{name}-"))
        .tempdir()
        .unwrap()
}

/// The busybox image's config: its own PATH, a variable, a command that says where it
/// runs and as whom, in /bin.
fn busybox_config() -> Value {
    json!({
        "Env": ["PATH=/bin", "IMAGE_VAR=from-image"],
        "Cmd": ["sh", "-c", "echo cmd in $(pwd) as $(id -u) with $IMAGE_VAR"],
        "WorkingDir": "/bin",
    })
}

/// A busybox layout at `dir/name` named `bb:1`.
fn busybox_layout(dir: &Path, name: &str) -> PathBuf {
    let layout = dir.join(name);
    write_busybox_layout(&layout, "bb:1", &busybox_config());
    layout
}

/// `airlock image --image-store STORE ARGS...`.
fn image_cmd(store: &Path, args: &[&str]) -> Run {
    let mut full = vec!["image", "--image-store", store.to_str().unwrap()];
    full.extend_from_slice(args);
    airlock(&full)
}

/// Same, asserting exit 0; its stdout.
#[track_caller]
fn image_ok(store: &Path, args: &[&str]) -> String {
    let run = image_cmd(store, args);
    assert_eq!(run.code(), Some(0), "airlock image {args:?}: {}", run.stderr());
    run.stdout()
}

/// `airlock run --isolation TIER --image-store STORE ARGS...`, then the "nothing left"
/// check.
#[track_caller]
fn run_in(tier: &str, store: &Path, args: &[&str]) -> Run {
    let mut full = vec!["--isolation", tier, "--image-store", store.to_str().unwrap()];
    full.extend_from_slice(args);
    let run = airlock_run(&full);
    assert_run_left_nothing(run.pid);
    run
}

/// Its stdout, asserting exit 0.
#[track_caller]
fn ok(run: &Run) -> String {
    assert_eq!(run.code(), Some(0), "{run:#?}\nstderr: {}", run.stderr());
    run.stdout()
}

/// Every file under `dir` with its size (what a refused operation must not change).
fn tree(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let meta = e.path().symlink_metadata().unwrap();
            if meta.is_dir() {
                dirs.push(e.path());
            }
            out.push((
                e.path().strip_prefix(dir).unwrap().to_path_buf(),
                if meta.is_file() { meta.len() } else { 0 },
            ));
        }
    }
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------
// docs/images.md's block, as typed.
// ---------------------------------------------------------------------------------------

/// The first shell block of docs/images.md, its lines joined where they end in `\`.
fn readme_block() -> Vec<String> {
    let block = common::docs::doc_shell_block("docs/images.md", "# Images: run a sandbox in an OCI image");
    let mut lines = Vec::new();
    let mut cur = String::new();
    for l in block.lines() {
        if let Some(head) = l.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
        } else {
            cur.push_str(l);
            lines.push(std::mem::take(&mut cur));
        }
    }
    lines
}

/// docs/images.md's image commands run as typed, with only these substitutions (the README
/// names places this test cannot reach):
///
/// - `python:3.12-slim` → an image of that name (the python image of tests/tierutil) on a
///   docker-registry on loopback, `127.0.0.1:PORT/library/python:3.12-slim`, pulled with
///   `--insecure-registry 127.0.0.1:PORT` (Docker Hub is not reachable from CI, and a
///   registry on loopback speaks plain HTTP);
/// - `registry.lan:5000` → that registry's address (a busybox image pushed as
///   `team/tools:1`);
/// - `./tools.tar` → a `docker save` archive made by `skopeo copy oci:… docker-archive:…`
///   of a busybox layout;
/// - `localhost:8710` → the test daemon's address;
/// - `/var/lib/airlock/images` → a temp store, which every CLI command uses too
///   (`AIRLOCK_IMAGE_STORE`, the default the README's commands rely on).
///
/// The block is a catalogue, not a script: by the time of its `curl`, its `airlock image
/// rm tools:1` has removed the image the `curl` names (run in order, the `curl` is a 400
/// naming `image`, which this test also checks), so `tools:1` is imported again before
/// `airlock serve`.
#[test]
fn readme_images_block_runs_as_typed() {
    let _g = serial();
    let work = workdir("readme");
    let store = work.path().join("store");
    let reg = Registry::start();
    let py = work.path().join("py");
    write_python_layout(&py, "py:1", &python_config());
    reg.push(&py, "py:1", "library/python:3.12-slim");
    let bb = busybox_layout(work.path(), "bb");
    reg.push(&bb, "bb:1", "team/tools:1");
    let tar = work.path().join("tools.tar");
    skopeo(&[
        "copy",
        &format!("oci:{}:bb:1", bb.display()),
        &format!("docker-archive:{}:tools:1", tar.display()),
    ]);

    let bin_dir = common::airlock_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sh = |line: &str| -> std::process::Output {
        Command::new("sh")
            .arg("-c")
            .arg(line)
            .current_dir(work.path())
            .env("PATH", &path)
            .env("AIRLOCK_IMAGE_STORE", &store)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let subst = |line: &str, port: Option<u16>| -> String {
        let mut l = line
            .replace(
                "airlock image pull python:3.12-slim",
                &format!(
                    "airlock image pull --insecure-registry {h} {h}/library/python:3.12-slim",
                    h = reg.host
                ),
            )
            .replace("registry.lan:5000", &reg.host)
            .replace("./tools.tar", tar.to_str().unwrap())
            .replace("/var/lib/airlock/images", store.to_str().unwrap());
        if let Some(p) = port {
            l = l.replace("localhost:8710", &format!("127.0.0.1:{p}"));
        }
        l
    };

    let lines = readme_block();
    let commands: Vec<&str> = lines
        .iter()
        .map(|l| l.split("  #").next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(commands.len(), 9, "the README's block changed: {commands:#?}");
    let mut daemon: Option<Daemon> = None;
    for (i, cmd) in commands.iter().enumerate() {
        let typed = subst(cmd, daemon.as_ref().map(|d| d.port));
        if let Some(args) = typed.strip_prefix("airlock serve ") {
            // Served in the background: the daemon helper adds `--listen 127.0.0.1:0`.
            let args: Vec<&str> = args.split_whitespace().collect();
            let d = Daemon::start(&args);
            d.wait_ready();
            daemon = Some(d);
            continue;
        }
        let out = sh(&typed);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(
            out.status.success(),
            "README command {i} `{typed}` failed: {stdout}\n{stderr}"
        );
        match i {
            0..=2 => assert!(stderr.contains("airlock: "), "{typed}: {stderr}"),
            3 => {
                let mut rows = stdout.lines();
                let head: Vec<&str> = rows.next().unwrap().split_whitespace().collect();
                assert_eq!(head, ["NAME", "DIGEST", "LAYERS", "SIZE"], "{stdout}");
                let names: Vec<&str> = rows.map(|r| r.split_whitespace().next().unwrap()).collect();
                let mut want = vec![
                    format!("{}/library/python:3.12-slim", reg.host),
                    format!("{}/team/tools:1", reg.host),
                    "docker.io/library/tools:1".to_owned(),
                ];
                want.sort();
                let mut got: Vec<String> = names.iter().map(|s| s.to_string()).collect();
                got.sort();
                assert_eq!(got, want, "{stdout}");
            }
            4 => {
                // `echo $PATH; ls /`: the image's PATH, and its root (busybox's /bin,
                // airlock's /workspace and /etc), not the host's.
                let mut l = stdout.lines();
                assert_eq!(l.next(), Some("/bin"), "{stdout}");
                let listing: Vec<&str> = l.flat_map(str::split_whitespace).collect();
                for want in ["bin", "workspace", "tmp", "etc"] {
                    assert!(listing.contains(&want), "{want} not in / : {stdout}");
                }
                assert!(
                    !listing.contains(&"usr"),
                    "the host's /usr in an image root: {stdout}"
                );
            }
            6 => {
                let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
                assert_eq!(v["exit_code"], 0, "{v:#}");
                assert_eq!(v["stdout"], "/bin\n", "{v:#}");
            }
            7 => {
                let ls = image_ok(&store, &["ls"]);
                assert!(!ls.contains("docker.io/library/tools:1"), "{ls}");
                // The `airlock run` in the block ran in tools:1 from the archive, not in
                // the registry's team/tools:1, which stays.
                assert!(ls.contains(&format!("{}/team/tools:1", reg.host)), "{ls}");
            }
            8 => assert!(stderr.contains("airlock: pruned"), "{stderr}"),
            _ => unreachable!("command {i}: {typed}"),
        }
    }
    let d = daemon.take().expect("the block serves");
    let owner = d.owner.clone();
    drop(d);
    assert_eq!(daemon_leftovers(&owner), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------
// The CLI.
// ---------------------------------------------------------------------------------------

/// import → ls (text and --json) → run on each tier: the image's files and not the
/// host's, its Env under --env, its Cmd in its WorkingDir when no command is given, uid
/// 1000, a read-only root and a writable /workspace.
#[test]
fn cli_import_ls_and_run_on_namespaces_and_gvisor() {
    let _g = serial();
    let work = workdir("cli");
    let store = work.path().join("store");
    let layout = busybox_layout(work.path(), "bb");
    let run = image_cmd(
        &store,
        &["import", layout.to_str().unwrap(), "--name", "tools:1", "--json"],
    );
    let imported: Value = serde_json::from_str(&ok(&run)).unwrap_or_else(|e| panic!("{e}: {}", run.stdout()));
    let text = image_ok(&store, &["ls"]);
    let row: Vec<&str> = text
        .lines()
        .nth(1)
        .expect("one image")
        .split_whitespace()
        .collect();
    assert_eq!(row[0], "docker.io/library/tools:1", "{text}");
    assert!(row[1].starts_with("sha256:") && row[1].len() == 7 + 12, "{text}");
    assert_eq!(row[2], "1", "{text}");
    assert_eq!(text.lines().count(), 2, "{text}");
    let ls: Value = serde_json::from_str(&image_ok(&store, &["ls", "--json"])).unwrap();
    let ls = ls.as_array().expect("an array");
    assert_eq!(ls.len(), 1, "{ls:?}");
    let img = &ls[0];
    assert_eq!(img["name"], "docker.io/library/tools:1", "{img:#}");
    let digest = img["digest"].as_str().unwrap();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{img:#}");
    assert!(digest.starts_with(row[1]), "{img:#} vs {text}");
    assert_eq!(img["layers"], 1, "{img:#}");
    assert!(img["size_bytes"].as_u64().unwrap() > 500_000, "{img:#}");
    assert_eq!(
        img["env"],
        json!(["PATH=/bin", "IMAGE_VAR=from-image"]),
        "{img:#}"
    );
    assert_eq!(img["cmd"], busybox_config()["Cmd"], "{img:#}");
    assert_eq!(img["working_dir"], "/bin", "{img:#}");
    assert!(
        imported.to_string().contains(digest),
        "import --json does not name the digest {digest}: {imported}"
    );

    let probe = "set -e; test -x /bin/busybox && echo image-files; \
                 test -e /usr/bin/python3 && echo host-python || echo no-host-python; \
                 echo \"$PATH|$IMAGE_VAR|$(id -u)|$(pwd)\"; \
                 touch /bin/x 2>/dev/null && echo root-writable || echo root-read-only; \
                 echo w > /workspace/f && cat /workspace/f";
    for tier in ["namespaces", "gvisor"] {
        let out = ok(&run_in(
            tier,
            &store,
            &["--image", "tools:1", "--", "sh", "-c", probe],
        ));
        assert_eq!(
            out, "image-files\nno-host-python\n/bin|from-image|1000|/workspace\nroot-read-only\nw\n",
            "{tier}"
        );
        // --env wins over the image's Env.
        let out = ok(&run_in(
            tier,
            &store,
            &[
                "--image",
                "tools:1",
                "--env",
                "IMAGE_VAR=mine",
                "--",
                "sh",
                "-c",
                "echo $IMAGE_VAR",
            ],
        ));
        assert_eq!(out, "mine\n", "{tier}");
        // No command: the image's Cmd, in its WorkingDir, as uid 1000.
        let out = ok(&run_in(tier, &store, &["--image", "tools:1"]));
        assert_eq!(out, "cmd in /bin as 1000 with from-image\n", "{tier}");
        // By digest and by a 12-digit prefix too.
        let short = &digest[..7 + 12];
        for name in [digest, short] {
            let out = ok(&run_in(
                tier,
                &store,
                &["--image", name, "--pull", "never", "--", "echo", "ok"],
            ));
            assert_eq!(out, "ok\n", "{tier} {name}");
        }
    }
}

/// `--pull never` with an image not in the store: one line naming --image, exit 2, and
/// no sandbox.
#[test]
fn pull_never_of_an_unknown_image_is_one_line_naming_image_and_exits_2() {
    let _g = serial();
    let work = workdir("never");
    let store = work.path().join("store");
    let run = run_in(
        "namespaces",
        &store,
        &["--image", "nosuch/image:1", "--pull", "never", "--", "true"],
    );
    assert_eq!(run.code(), Some(2), "{}", run.stderr());
    let err = run.stderr();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("airlock: ") && err.contains("--image"), "{err}");
    assert!(err.contains("nosuch/image:1"), "{err}");
    assert_eq!(run.stdout(), "");
}

/// `--image` and `--rootfs` name two roots: refused before anything runs.
#[test]
fn image_with_rootfs_is_refused() {
    let _g = serial();
    let work = workdir("rootfs");
    let store = work.path().join("store");
    let rootfs = work.path().join("root");
    std::fs::create_dir(&rootfs).unwrap();
    let run = run_in(
        "namespaces",
        &store,
        &[
            "--image",
            "tools:1",
            "--rootfs",
            rootfs.to_str().unwrap(),
            "--",
            "true",
        ],
    );
    assert_eq!(run.code(), Some(2), "{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("--image") && err.contains("--rootfs"), "{err}");
}

/// A registry on loopback: plain HTTP is refused without --insecure-registry, with a
/// message saying so; `run --pull missing` pulls (with it) and runs; `rm` frees what the
/// image alone used and `ls` no longer lists it; `prune` leaves an empty store.
#[test]
fn pull_from_a_loopback_registry_run_rm_and_prune() {
    let _g = serial();
    let work = workdir("pull");
    let store = work.path().join("store");
    let reg = Registry::start();
    let layout = busybox_layout(work.path(), "bb");
    reg.push(&layout, "bb:1", "team/tools:1");
    let name = format!("{}/team/tools:1", reg.host);

    let run = image_cmd(&store, &["pull", &name]);
    assert_ne!(
        run.code(),
        Some(0),
        "a plain-HTTP pull without --insecure-registry"
    );
    let err = run.stderr();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("plain HTTP") && err.contains("insecure"), "{err}");
    assert!(
        !image_ok(&store, &["ls"]).contains("tools"),
        "a refused pull stored something"
    );

    for (i, tier) in ["namespaces", "gvisor"].into_iter().enumerate() {
        let mut args = vec!["--image", name.as_str(), "--insecure-registry", reg.host.as_str()];
        if i == 0 {
            args.extend(["--pull", "missing"]);
        }
        args.extend(["--", "sh", "-c", "echo $IMAGE_VAR"]);
        let out = ok(&run_in(tier, &store, &args));
        assert_eq!(out, "from-image\n", "{tier}");
    }
    assert!(image_ok(&store, &["ls"]).contains(&name));
    let before = tree(&store);
    let blobs_before = before.iter().filter(|(_, n)| *n > 0).map(|(_, n)| n).sum::<u64>();

    let _ = image_ok(&store, &["rm", &name]);
    let ls = image_ok(&store, &["ls"]);
    assert_eq!(ls.lines().count(), 1, "only the header left: {ls}");
    let after = tree(&store);
    let bytes_after = after.iter().map(|(_, n)| n).sum::<u64>();
    assert!(
        bytes_after < blobs_before / 2,
        "rm freed too little: {blobs_before} bytes before, {bytes_after} after: {after:#?}"
    );
    let _ = image_ok(&store, &["prune"]);
    let ls: Value = serde_json::from_str(&image_ok(&store, &["ls", "--json"])).unwrap();
    assert_eq!(ls, json!([]));
    // The image is gone for `run` too.
    let run = run_in(
        "namespaces",
        &store,
        &["--image", &name, "--pull", "never", "--", "true"],
    );
    assert_eq!(run.code(), Some(2), "{}", run.stderr());
}

/// The refusal of a plain-HTTP registry names the option that allows it, so that the
/// user can act on it (today it says "plain HTTP is used only for registries marked
/// insecure", leaving the user to find how to mark one).
#[test]
fn a_plain_http_refusal_names_insecure_registry() {
    let _g = serial();
    let work = workdir("insecure");
    let store = work.path().join("store");
    let reg = Registry::start();
    let layout = busybox_layout(work.path(), "bb");
    reg.push(&layout, "bb:1", "team/tools:1");
    let run = image_cmd(&store, &["pull", &format!("{}/team/tools:1", reg.host)]);
    assert_ne!(run.code(), Some(0));
    assert!(run.stderr().contains("--insecure-registry"), "{}", run.stderr());
    let run = run_in(
        "namespaces",
        &store,
        &["--image", &format!("{}/team/tools:1", reg.host), "--", "true"],
    );
    assert_ne!(run.code(), Some(0));
    assert!(run.stderr().contains("--insecure-registry"), "{}", run.stderr());
}

/// A store over its budget: the pull is refused, and the store is as it was.
#[test]
fn a_pull_over_the_store_budget_is_refused_and_leaves_the_store_as_it_was() {
    let _g = serial();
    let work = workdir("budget");
    let store = work.path().join("store");
    let reg = Registry::start();
    let py = work.path().join("py");
    write_python_layout(&py, "py:1", &python_config());
    reg.push(&py, "py:1", "library/python:3.12-slim");
    let bb = busybox_layout(work.path(), "bb");
    import(&store, &bb, "tools:1");
    let before = tree(&store);
    let used: u64 = before.iter().map(|(_, n)| n).sum();
    let max = format!("{}", used + 4 * 1024 * 1024);
    let run = image_cmd(
        &store,
        &[
            "--image-store-max",
            &max,
            "pull",
            "--insecure-registry",
            &reg.host,
            &format!("{}/library/python:3.12-slim", reg.host),
        ],
    );
    // `--image-store-max` is an option of `airlock image`: placed after `--image-store`.
    assert_ne!(run.code(), Some(0), "a pull over the budget succeeded");
    let err = run.stderr();
    assert!(
        err.to_lowercase().contains("budget") || err.contains("image-store-max"),
        "{err}"
    );
    let after = tree(&store);
    let names = |t: &[(PathBuf, u64)]| -> Vec<PathBuf> {
        t.iter()
            .filter(|(p, _)| !p.to_string_lossy().contains("lock"))
            .map(|(p, _)| p.clone())
            .collect()
    };
    assert_eq!(
        names(&after),
        names(&before),
        "the refused pull changed the store"
    );
    let ls = image_ok(&store, &["ls"]);
    assert!(ls.contains("tools:1") && !ls.contains("python"), "{ls}");
}

/// A store below a directory that only root may enter (mode 0700: `mktemp -d`, `/root`,
/// pytest's temp dirs) cannot serve sandboxes: a sandbox's own root user opens the image
/// root by its path and cannot pass that directory. It is refused up front, naming the
/// directory to fix, by `run --image` on every tier and by `serve` at start (not with a
/// bind failing inside each sandbox).
#[test]
fn a_store_below_a_private_directory_is_refused_naming_the_directory() {
    use std::os::unix::fs::PermissionsExt;
    let _g = serial();
    let work = workdir("private");
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let store = work.path().join("store");
    let layout = busybox_layout(work.path(), "bb");
    import(&store, &layout, "tools:1");
    let private = work.path().display().to_string();
    for tier in ["namespaces", "gvisor"] {
        let run = run_in(tier, &store, &["--image", "tools:1", "--", "echo", "ok"]);
        assert_eq!(run.code(), Some(2), "{tier}: {}", run.stderr());
        assert!(run.stdout().is_empty(), "{tier}: {}", run.stdout());
        let err = run.stderr();
        assert!(
            err.contains(&private) && err.contains("mode 0700") && err.contains("o+x"),
            "{tier}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{tier}: {err}");
    }
    let f = serverutil::serve_refuses(&["--pool", "0", "--image-store", store.to_str().unwrap()]);
    assert_eq!(f.status.code(), Some(2));
    assert!(
        f.stderr.contains(&private) && f.stderr.contains("o+x"),
        "{}",
        f.stderr
    );
    // The same store, once its parent is searchable, serves.
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let run = run_in("namespaces", &store, &["--image", "tools:1", "--", "echo", "ok"]);
    assert_eq!(
        (run.code(), run.stdout().as_str()),
        (Some(0), "ok\n"),
        "{}",
        run.stderr()
    );
}

/// The python image (bench/images.py's layers) runs python3 on each tier.
#[test]
fn a_python_image_runs_python3_on_namespaces_and_gvisor() {
    let _g = serial();
    let img = python_image();
    for tier in ["namespaces", "gvisor"] {
        let out = ok(&run_in(
            tier,
            &img.store,
            &[
                "--image",
                img.name,
                "--pull",
                "never",
                "--",
                "python3",
                "-c",
                "import json; print(json.dumps(1))",
            ],
        ));
        assert_eq!(out, "1\n", "{tier}");
    }
}

// ---------------------------------------------------------------------------------------
// The service.
// ---------------------------------------------------------------------------------------

/// `airlock serve --image-store` (the shared python image's store) with a pool of `tier`'s
/// sandboxes, ready.
fn image_daemon(tier: &str) -> Daemon {
    let store = python_image().store.to_str().unwrap().to_owned();
    let mut args: Vec<&str> = match tier {
        "microvm" => vec!["--pool", "0", "--vm-pool", "1"],
        "gvisor" => vec!["--pool", "0", "--gvisor-pool", "1"],
        _ => vec!["--pool", "1"],
    };
    args.extend(["--image-store", &store]);
    let d = Daemon::start(&args);
    let ready = poll(Duration::from_secs(600), || {
        (d.client().get("/readyz").status == 200).then_some(())
    });
    assert!(ready.is_some(), "/readyz never answered 200; log:\n{}", d.log());
    d
}

/// One-shot execs in an image, an unknown image (400 on `image`), a session in the image:
/// shown with its name and digest, exec with no command runs the image's, exec naming
/// another image is a 400, files persist between execs and through the files API; the
/// session's DELETE and the daemon's stop leave nothing.
fn service_runs_images(tier: &str) {
    let _g = serial();
    let img = python_image();
    let d = image_daemon(tier);
    let c: Client = d.client();

    let v = c.exec_ok(&json!({
        "image": img.name, "isolation": tier,
        "cmd": ["python3", "-c", "import json, os; print(json.dumps([os.environ['IMAGE_VAR'], os.getuid()]))"],
    }));
    assert_eq!(v["exit_code"], 0, "{v:#}");
    assert_eq!(v["stdout"], "[\"from-image\", 1000]\n", "{v:#}");
    assert_eq!(v["isolation"], tier, "{v:#}");
    let v = c.exec_ok(&json!({"image": img.name, "isolation": tier}));
    assert_eq!(
        v["stdout"],
        format!("image-cmd in {PY_WORKDIR} as 1000\n"),
        "{PY_CMD:?}: {v:#}"
    );
    let e = c
        .exec(&json!({"image": "nosuch/image:1", "isolation": tier, "cmd": ["true"]}))
        .api_error(400);
    assert_eq!(e["code"], "invalid_request", "{e}");
    assert_eq!(e["field"], "image", "{e}");

    let id = c.create_session(&json!({"image": img.name, "isolation": tier, "ttl_s": 600}));
    let shown = c.get(&format!("/v1/sandboxes/{id}")).expect(200).json();
    assert_eq!(
        shown["image"]["name"],
        format!("docker.io/{}", img.name),
        "{shown:#}"
    );
    let digest = shown["image"]["digest"].as_str().unwrap_or_default();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{shown:#}");
    let all = c.get("/v1/sandboxes").expect(200).json();
    assert!(all.to_string().contains(digest), "{all}");

    // The image's own command: the exec names the session's image (any spelling), as a
    // one-shot exec does; an exec with neither `cmd` nor `image` is refused, as anywhere.
    let v = c
        .session_exec(&id, &json!({"image": img.name}))
        .expect(200)
        .json();
    assert_eq!(
        v["stdout"],
        format!("image-cmd in {PY_WORKDIR} as 1000\n"),
        "{v:#}"
    );
    let e = c.session_exec(&id, &json!({})).api_error(400);
    assert_eq!(e["field"], "cmd", "{e}");
    let v = c
        .session_exec(
            &id,
            &json!({"cmd": ["sh", "-c", "echo kept > /workspace/note; echo $PATH"]}),
        )
        .expect(200)
        .json();
    assert_eq!(v["stdout"], "/usr/bin:/bin\n", "{v:#}");
    let v = c
        .session_exec(
            &id,
            &json!({"cmd": ["python3", "-c", "print(open('note').read().strip())"]}),
        )
        .expect(200)
        .json();
    assert_eq!(v["stdout"], "kept\n", "{v:#}");
    let note = c.get(&format!("/v1/sandboxes/{id}/files?path=note")).expect(200);
    assert_eq!(note.text(), "kept\n");
    let e = c
        .session_exec(&id, &json!({"image": "other/image:1", "cmd": ["true"]}))
        .api_error(400);
    assert_eq!(e["field"], "image", "{e}");
    // Naming its own image is fine.
    let v = c
        .session_exec(&id, &json!({"image": img.name, "cmd": ["true"]}))
        .expect(200)
        .json();
    assert_eq!(v["exit_code"], 0, "{v:#}");

    c.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    let gone = poll(Duration::from_secs(30), || {
        sandbox_leftovers(&d.owner, &id).is_empty().then_some(())
    });
    assert!(
        gone.is_some(),
        "left after DELETE: {:?}",
        sandbox_leftovers(&d.owner, &id)
    );
    let owner = d.owner.clone();
    drop(d);
    let clean = poll(Duration::from_secs(10), || {
        daemon_leftovers(&owner).is_empty().then_some(())
    });
    assert!(clean.is_some(), "daemon left: {:?}", daemon_leftovers(&owner));
}

#[test]
fn service_runs_images_on_namespaces() {
    service_runs_images("namespaces");
}

#[test]
fn service_runs_images_on_gvisor() {
    service_runs_images("gvisor");
}

#[test]
fn service_runs_images_on_microvm() {
    service_runs_images("microvm");
}

#[test]
fn cli_runs_an_image_on_microvm() {
    let _g = serial();
    let img = python_image();
    let out = ok(&run_in(
        "microvm",
        &img.store,
        &[
            "--image",
            img.name,
            "--pull",
            "never",
            "--",
            "python3",
            "-c",
            "import json; print(json.dumps(1))",
        ],
    ));
    assert_eq!(out, "1\n");
    let out = ok(&run_in(
        "microvm",
        &img.store,
        &["--image", img.name, "--pull", "never"],
    ));
    assert_eq!(out, format!("image-cmd in {PY_WORKDIR} as 1000\n"));
}

/// A micro-VM of an image boots with the image's block image (a squashfs of its prepared
/// root, cached per manifest digest); `airlock image rm` removes it with the image.
#[test]
fn image_rm_removes_the_micro_vm_block_image() {
    let _g = serial();
    let work = workdir("vmdrive");
    let store = work.path().join("store");
    let layout = busybox_layout(work.path(), "bb");
    import(&store, &layout, "vmdrive:1");
    let ls: Value = serde_json::from_str(&image_ok(&store, &["ls", "--json"])).unwrap();
    let digest = ls[0]["digest"].as_str().unwrap().to_owned();
    let cache = std::env::var("AIRLOCK_VM_CACHE").unwrap_or_else(|_| "/var/cache/airlock/microvm".into());
    let drive = Path::new(&cache)
        .join("images")
        .join(format!("{}.sqfs", digest.replace(':', "-")));
    let out = ok(&run_in(
        "microvm",
        &store,
        &["--image", "vmdrive:1", "--", "echo", "in-vm"],
    ));
    assert_eq!(out, "in-vm\n");
    assert!(drive.is_file(), "{} after a VM of the image", drive.display());
    let run = image_cmd(&store, &["rm", "vmdrive:1"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(run.stderr().contains("micro-VM image drive"), "{}", run.stderr());
    assert!(!drive.exists(), "{} after image rm", drive.display());
}

/// `airlock doctor` reports the image store: its images and use, or why sandboxes cannot
/// reach it.
#[test]
fn doctor_reports_the_image_store() {
    use std::os::unix::fs::PermissionsExt;
    let _g = serial();
    let work = workdir("doctor");
    let store = work.path().join("store");
    let layout = busybox_layout(work.path(), "bb");
    import(&store, &layout, "tools:1");
    let line = |run: Run| {
        run.stdout()
            .lines()
            .find(|l| l.contains("image store"))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no image store line: {}", run.stdout()))
    };
    let ok = line(airlock(&[
        "doctor",
        "--no-boot",
        "--image-store",
        store.to_str().unwrap(),
    ]));
    assert!(ok.starts_with("ok") && ok.contains("1 image(s)"), "{ok}");
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let warn = line(airlock(&[
        "doctor",
        "--no-boot",
        "--image-store",
        store.to_str().unwrap(),
    ]));
    assert!(warn.starts_with("warn") && warn.contains("mode 0700"), "{warn}");
}
