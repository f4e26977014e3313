//! The daemon's container image (deploy/container/) under podman: built here without
//! Docker by `build-image.sh` (mmdebstrap + buildah; the root is cached), started with the
//! least privileges docs/container.md gives (its run command, as typed but for the
//! container's name, port and image tag), and driven through the HTTP API: a one-shot
//! exec, a session with two execs and a file, memory and pids limits, a timeout, the
//! egress proxy to a "remote" host in a network namespace of the test's own, and cleanup
//! (nothing of the container's left on the host once it stopped). Then the refusals: the
//! same command with one privilege taken away at a time.
//!
//! Skips (saying why) only where podman, runc, mmdebstrap or buildah is absent; CI installs
//! them. The Dockerfile/script agreement test needs none of them.

mod common;
mod egressutil;
mod serverutil;

use egressutil::{ALLOWED, METADATA, Net, PRELUDE, egress, in_netns};
use serde_json::{Value, json};
use serverutil::{Client, poll};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The tag the tests build (rebuilt by every run: a few seconds with the root cached).
const TAG: &str = "localhost/airlock:test";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Why the podman tests cannot run here, if they cannot.
fn missing_tools() -> Option<String> {
    let missing: Vec<&str> = ["podman", "runc", "mmdebstrap", "buildah"]
        .into_iter()
        .filter(|p| !on_path(p))
        .collect();
    (!missing.is_empty()).then(|| format!("{} not installed", missing.join(", ")))
}

macro_rules! require_tools {
    () => {
        if let Some(why) = missing_tools() {
            eprintln!("skipped: {why} (.ci/run installs them)");
            return;
        }
    };
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

#[track_caller]
fn must(cmd: &mut Command) -> String {
    let o = output(cmd);
    assert!(
        o.status.success(),
        "{cmd:?}: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Builds the image once per test binary with docs/container.md's build-image.sh line
/// (`--bin-dir target/debug`: this build's binaries, which CI has built already; a
/// release build would not fit its time), tagged [`TAG`].
fn image() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_airlock")).parent().unwrap();
        assert!(
            bin_dir.join("airlock-guest").is_file(),
            "no {}/airlock-guest: `cargo build -p airlock-guest` first (CI builds the workspace)",
            bin_dir.display()
        );
        let block = common::docs::doc_shell_block("docs/container.md", "## Build");
        assert!(
            block.contains("--bin-dir target/debug") && block.contains("--tag localhost/airlock:dev"),
            "docs/container.md's build block changed: {block}"
        );
        let command = block
            .replace("target/debug", &bin_dir.display().to_string())
            .replace("localhost/airlock:dev", TAG);
        let t0 = Instant::now();
        must(Command::new("bash").args(["-euc", &command]).current_dir(repo()));
        eprintln!("image built in {:.1}s", t0.elapsed().as_secs_f64());
    });
    TAG
}

// ---------------------------------------------------------------------------------------
// The Dockerfile and build-image.sh agree.

/// The JSON array after `keyword` on the Dockerfile's line that starts with it.
fn dockerfile_json(dockerfile: &str, keyword: &str) -> Vec<String> {
    let line = dockerfile
        .lines()
        .find(|l| l.starts_with(keyword))
        .unwrap_or_else(|| panic!("the Dockerfile has no {keyword}"));
    let json = &line[line
        .find('[')
        .unwrap_or_else(|| panic!("{keyword} is not in exec form: {line}"))..];
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{keyword}'s array: {e}: {line}"))
}

/// A `name=...` assignment of build-image.sh, as the shell reads it.
fn script_var(name: &str) -> String {
    let out = must(
        Command::new("bash")
            .arg("-c")
            .arg(format!(
                "eval \"$(grep -E '^{name}=' deploy/container/build-image.sh)\" && printf %s \"${name}\""
            ))
            .current_dir(repo()),
    );
    assert!(!out.is_empty(), "build-image.sh sets no {name}");
    out
}

/// Shell words, as the shell splits them.
fn shell_words(s: &str) -> Vec<String> {
    let out = must(Command::new("bash").arg("-c").arg(format!("printf '%s\\0' {s}")));
    out.split('\0')
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

fn packages() -> Vec<String> {
    read("deploy/container/packages.txt")
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn dockerfile_and_build_script_agree() {
    let dockerfile = read("deploy/container/Dockerfile");
    let script = read("deploy/container/build-image.sh");

    // One package list, read by both.
    assert!(
        dockerfile.contains("COPY deploy/container/packages.txt /tmp/packages.txt")
            && dockerfile.contains("/tmp/packages.txt | xargs apt-get install -y --no-install-recommends"),
        "the Dockerfile must install deploy/container/packages.txt"
    );
    assert!(
        script.contains(r#""$here/packages.txt""#),
        "build-image.sh must read packages.txt"
    );
    let pkgs = packages();
    for needed in [
        "python3",
        "ca-certificates",
        "runsc",
        "qemu-system-x86",
        "squashfs-tools",
        "lz4",
    ] {
        assert!(pkgs.iter().any(|p| p == needed), "packages.txt lacks {needed}");
    }
    // The micro-VM tier's packages are those .ci/run installs for its tests.
    let ci = read(".ci/run");
    for p in ["qemu-system-x86", "squashfs-tools", "lz4", "runsc"] {
        assert!(
            ci.contains(p),
            ".ci/run no longer installs {p}: update packages.txt too"
        );
    }

    // The same Debian release: the runtime's base, the build stage (glibc), mmdebstrap's.
    let suite = script_var("suite");
    assert!(
        dockerfile.contains(&format!("\nFROM debian:{suite}-slim\n")),
        "runtime is not debian:{suite}-slim"
    );
    assert!(
        dockerfile.contains(&format!("FROM rust:1-{suite} AS build")),
        "build stage is not {suite}"
    );

    // Entrypoint, port, health check.
    let entrypoint: Vec<String> = serde_json::from_str(&script_var("entrypoint")).expect("entrypoint JSON");
    assert_eq!(dockerfile_json(&dockerfile, "ENTRYPOINT"), entrypoint);
    assert_eq!(
        &entrypoint[1..],
        ["/usr/bin/airlock", "serve", "--listen", "0.0.0.0:8080"],
        "the entrypoint must exec `airlock serve` on 0.0.0.0:8080"
    );
    let port = script_var("port");
    assert_eq!(port, "8080");
    assert!(
        dockerfile.contains(&format!("\nEXPOSE {port}\n")),
        "the Dockerfile exposes no {port}"
    );
    assert_eq!(
        dockerfile_json(&dockerfile, "HEALTHCHECK"),
        shell_words(&script_var("healthcheck")),
        "health checks differ"
    );
    for flag in [
        "--interval=10s",
        "--timeout=5s",
        "--start-period=30s",
        "--retries=3",
    ] {
        let (name, value) = flag.trim_start_matches("--").split_once('=').unwrap();
        assert!(
            dockerfile.contains(flag),
            "the Dockerfile's HEALTHCHECK lacks {flag}"
        );
        assert!(
            script.contains(&format!("--healthcheck-{name} {value}")),
            "build-image.sh lacks --healthcheck-{name} {value}"
        );
    }

    // The files at the same paths.
    for (var, source) in [
        ("airlock_path", "/src/target/release/airlock "),
        ("guest_path", "/src/target/release/airlock-guest "),
        ("gvisor_agent_path", "/src/target/release/airlock-gvisor-agent "),
        (
            "gvisor_compat_path",
            "/src/target/release/libairlock_gvisor_compat.so ",
        ),
        ("entrypoint_path", "deploy/container/entrypoint.sh "),
    ] {
        let path = script_var(var);
        let copy = dockerfile
            .lines()
            .find(|l| l.starts_with("COPY") && l.contains(source))
            .unwrap_or_else(|| panic!("the Dockerfile copies no {source}"));
        assert!(copy.ends_with(&format!(" {path}")), "{copy:?} is not to {path}");
    }
    assert_eq!(script_var("airlock_path"), "/usr/bin/airlock");
    assert_eq!(script_var("guest_path"), "/usr/libexec/airlock/airlock-guest");
    // Where the gVisor tier looks beside /usr/bin/airlock (airlock-gvisor's helper_dirs).
    assert_eq!(
        script_var("gvisor_agent_path"),
        "/usr/libexec/airlock/airlock-gvisor-agent"
    );
    assert_eq!(
        script_var("gvisor_compat_path"),
        "/usr/libexec/airlock/libairlock_gvisor_compat.so"
    );
    assert_eq!(script_var("entrypoint_path"), entrypoint[0]);
}

/// The image the script built says what the Dockerfile says, and holds every package.
#[test]
fn built_image_matches_the_dockerfile() {
    require_tools!();
    let tag = image();
    let dockerfile = read("deploy/container/Dockerfile");
    let config: Value = serde_json::from_str(&must(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{json .Config}}",
        tag,
    ])))
    .expect("image config");
    assert_eq!(
        config["Entrypoint"],
        json!(dockerfile_json(&dockerfile, "ENTRYPOINT"))
    );
    assert!(
        config["ExposedPorts"].get("8080").is_some() || config["ExposedPorts"].get("8080/tcp").is_some(),
        "{config:#}"
    );
    let health: Value = serde_json::from_str(&must(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{json .HealthCheck}}",
        tag,
    ])))
    .expect("image health check");
    let mut test = vec!["CMD".to_owned()];
    test.extend(dockerfile_json(&dockerfile, "HEALTHCHECK"));
    assert_eq!(health["Test"], json!(test), "{health:#}");
    assert_eq!(health["Interval"], 10_000_000_000u64, "{health:#}");
    assert_eq!(health["Retries"], 3, "{health:#}");

    let listing = must(Command::new("podman").args([
        "run",
        "--rm",
        "--runtime",
        "runc",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--network",
        "none",
        "--entrypoint",
        "sh",
        tag,
        "-c",
        "dpkg-query -W -f '${Package} ${db:Status-Status}\\n'; \
         for f in /usr/bin/airlock /usr/libexec/airlock/airlock-guest /usr/libexec/airlock/container-entrypoint; do \
           test -x $f && echo file $f; done; /usr/bin/airlock --version",
    ]));
    let installed: BTreeSet<&str> = listing
        .lines()
        .filter_map(|l| l.strip_suffix(" installed"))
        .collect();
    for p in packages() {
        assert!(
            installed.contains(p.as_str()),
            "{p} is not installed in the image:\n{listing}"
        );
    }
    for f in [
        "/usr/bin/airlock",
        "/usr/libexec/airlock/airlock-guest",
        "/usr/libexec/airlock/container-entrypoint",
    ] {
        assert!(
            listing.contains(&format!("file {f}\n")),
            "{f} missing:\n{listing}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Containers.

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The run command of docs/container.md (its first shell block under `## Run`).
fn doc_run_block() -> String {
    common::docs::doc_shell_block("docs/container.md", "## Run")
}

/// Where a container's network comes from.
enum Network<'a> {
    /// The doc's `-p 127.0.0.1:8080:8080`, on a free port.
    Published,
    /// The test's network namespace (its fake remote hosts) and its hosts file.
    Netns(&'a Net),
}

/// One container started by the doc's command; `Drop` removes it (and what it left).
struct Container {
    name: String,
    port: u16,
    /// The API key the doc's block made.
    key: String,
    /// The doc's working directory (its keys file).
    dir: tempfile::TempDir,
}

impl Container {
    /// Runs the doc's block with this container's name, port and the test image, after
    /// `edit` (which takes away a privilege in the refusal tests; each edit must apply).
    fn start(network: Network, edits: &[(&str, &str)]) -> (Container, Output) {
        let name = format!(
            "airlock-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let port = free_port();
        let mut block = doc_run_block();
        let mut replace = |from: &str, to: &str| {
            assert!(
                block.contains(from),
                "docs/container.md's run command lost {from:?}"
            );
            block = block.replacen(from, to, 1);
        };
        replace("--name airlock ", &format!("--name {name} "));
        replace("localhost/airlock:latest", image());
        match network {
            Network::Published => replace("127.0.0.1:8080:8080", &format!("127.0.0.1:{port}:8080")),
            Network::Netns(net) => replace(
                "-p 127.0.0.1:8080:8080",
                &format!(
                    "--network ns:{} -v {}:/etc/hosts:ro",
                    net.path(),
                    net.hosts_file().display()
                ),
            ),
        }
        for (from, to) in edits {
            replace(from, to);
        }
        let dir = tempfile::Builder::new()
            .prefix("airlock-container-")
            .tempdir()
            .unwrap();
        let out = output(
            Command::new("bash")
                .args(["-euc", &block])
                .current_dir(dir.path()),
        );
        // The key the block wrote (`me:<key>`).
        let keys = std::fs::read_to_string(dir.path().join("keys")).unwrap_or_default();
        let key = keys.trim().strip_prefix("me:").unwrap_or_default().to_owned();
        (Container { name, port, key, dir }, out)
    }

    /// [`Container::start`], asserting podman started it and the daemon listens.
    fn serving(network: Network) -> Container {
        let (c, out) = Container::start(network, &[]);
        assert!(
            out.status.success(),
            "podman run: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let listening = poll(Duration::from_secs(60), || {
            c.logs().contains("airlock: listening on").then_some(())
        });
        assert!(listening.is_some(), "the daemon did not start:\n{}", c.logs());
        c
    }

    fn logs(&self) -> String {
        let o = output(Command::new("podman").args(["logs", &self.name]));
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    }

    fn inspect(&self, format: &str) -> String {
        must(Command::new("podman").args(["inspect", "--format", format, &self.name]))
            .trim()
            .to_owned()
    }

    /// The container's cgroup on the host (the memory hierarchy's path, e.g.
    /// `/libpod_parent/libpod-<id>`).
    fn host_cgroup(&self) -> String {
        let pid = self.inspect("{{.State.Pid}}");
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("its /proc/PID/cgroup");
        cgroups
            .lines()
            .find_map(|l| {
                l.strip_prefix("0::")
                    .or_else(|| l.split_once(":memory:").map(|(_, p)| p))
            })
            .expect("a cgroup path")
            .to_owned()
    }

    /// Waits until it exited (it refused): its exit status; `None` once the daemon listens
    /// instead (it started serving: no refusal).
    fn exit_status(&self) -> Option<i64> {
        poll(Duration::from_secs(60), || {
            if self.inspect("{{.State.Status}}") == "exited" {
                return Some(self.inspect("{{.State.ExitCode}}").parse().ok());
            }
            self.logs().contains("airlock: listening on").then_some(None)
        })
        .flatten()
    }

    /// `podman exec`: the command's stdout (its status is not checked: doctor exits 1
    /// when a tier is unavailable).
    fn exec(&self, argv: &[&str]) -> String {
        let o = output(Command::new("podman").arg("exec").arg(&self.name).args(argv));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn client(&self) -> Client {
        Client::new(&format!("http://127.0.0.1:{}", self.port), Some(&self.key))
    }

    /// `podman stop` (SIGTERM, the daemon's grace, then SIGKILL after 30 s).
    fn stop(&self) {
        must(Command::new("podman").args(["stop", "--time", "30", &self.name]));
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- {} logs ---\n{}", self.name, self.logs());
        }
        let _ = output(Command::new("podman").args(["rm", "--force", "--time", "5", &self.name]));
        let _ = &self.dir;
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Sandbox cgroup directories (`airlock/<owner>/<sandbox>`, or wherever the daemon put its
/// `airlock` directory) below the container's host cgroup, in every hierarchy.
fn sandbox_dirs(host_cgroup: &str) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return found;
    };
    for h in hierarchies.flatten() {
        let base = h.path().join(host_cgroup.trim_start_matches('/'));
        let mut stack = vec![(base, 0)];
        while let Some((dir, depth)) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let p = e.path();
                if p.to_string_lossy().contains("/airlock/") && depth >= 1 {
                    found.insert(p.clone());
                }
                if depth < 4 {
                    stack.push((p, depth + 1));
                }
            }
        }
    }
    found
}

/// Host processes in (or below) the cgroup `host_cgroup` of any hierarchy.
fn processes_in(host_cgroup: &str) -> Vec<String> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter_map(|e| {
            let cg = std::fs::read_to_string(e.path().join("cgroup")).ok()?;
            cg.contains(host_cgroup).then(|| {
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                format!("{} {}", e.file_name().to_string_lossy(), comm.trim())
            })
        })
        .collect()
}

fn ok_stdout(v: &Value) -> &str {
    assert_eq!(v["outcome"], "exited", "{v:#}");
    assert_eq!(v["exit_code"], 0, "{v:#}");
    v["stdout"].as_str().unwrap()
}

// ---------------------------------------------------------------------------------------
// The smoke suite.

/// Exec, a session with two execs and a file, limits, timeout, then cleanup: nothing of
/// the container (sandbox cgroups, processes) is left on the host after it stopped.
#[test]
fn daemon_in_container_runs_sandboxes_and_leaves_nothing() {
    require_tools!();
    let c = Container::serving(Network::Published);
    let client = c.client();
    let cgroup = c.host_cgroup();
    assert!(
        cgroup.contains("libpod-"),
        "not the container's own cgroup: {cgroup}"
    );
    assert_eq!(client.get("/healthz").status, 200);
    let ready = poll(Duration::from_secs(60), || {
        (client.get("/readyz").status == 200).then_some(())
    });
    assert!(ready.is_some(), "/readyz never answered 200");
    // The image's HEALTHCHECK passes.
    must(Command::new("podman").args(["healthcheck", "run", &c.name]));
    // `airlock doctor` in the container: its cgroup namespace is the delegated parent
    // (the entrypoint made it writable), and on a hybrid host the entrypoint mounted the
    // unified hierarchy, whose cgroup.kill ends sandboxes.
    let doctor = c.exec(&["airlock", "doctor"]);
    let parent = doctor
        .lines()
        .find(|l| l.contains("cgroup parent"))
        .unwrap_or_else(|| panic!("no cgroup parent line:\n{doctor}"));
    assert!(
        parent.starts_with("ok") && parent.contains("cgroup namespace"),
        "{parent}"
    );
    if Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists() {
        assert!(
            doctor
                .lines()
                .any(|l| l.starts_with("ok") && l.contains("cgroup.kill") && l.contains("present")),
            "no cgroup.kill in the container:\n{doctor}"
        );
    }

    // A one-shot exec, on the image's python3.
    let v = client.exec_ok(&json!({"cmd": ["python3", "-c", "import sys; print(6*7, sys.version_info[0])"]}));
    assert_eq!(ok_stdout(&v), "42 3\n");
    assert_eq!(v["isolation"], "namespaces", "{v:#}");

    // A session: a file put through the API, two execs that share the workspace.
    let id = client.create_session(&json!({"ttl_s": 120}));
    client
        .put(
            &format!("/v1/sandboxes/{id}/files?path=notes/in.txt"),
            b"from the API\n",
        )
        .expect(204);
    let first = client
        .session_exec(
            &id,
            &json!({"cmd": ["sh", "-c", "cat notes/in.txt; echo made > out.txt"]}),
        )
        .expect(200)
        .json();
    assert_eq!(ok_stdout(&first), "from the API\n");
    let second = client
        .session_exec(&id, &json!({"cmd": ["sh", "-c", "cat out.txt notes/in.txt"]}))
        .expect(200)
        .json();
    assert_eq!(ok_stdout(&second), "made\nfrom the API\n");
    let got = client
        .get(&format!("/v1/sandboxes/{id}/files?path=out.txt"))
        .expect(200);
    assert_eq!(got.body, b"made\n");
    // Files only the sandbox's user may read, in a directory only it may enter: the daemon
    // reaches them without CAP_DAC_OVERRIDE.
    let v = client
        .session_exec(
            &id,
            &json!({"cmd": ["sh", "-c", "umask 077; mkdir private; echo mine > private/secret"]}),
        )
        .expect(200)
        .json();
    ok_stdout(&v);
    let got = client
        .get(&format!("/v1/sandboxes/{id}/files?path=private/secret"))
        .expect(200);
    assert_eq!(got.body, b"mine\n");
    client
        .put(
            &format!("/v1/sandboxes/{id}/files?path=private/new.txt"),
            b"put\n",
        )
        .expect(204);
    let v = client
        .session_exec(
            &id,
            &json!({"cmd": ["sh", "-c", "cat private/new.txt; stat -c %a private private/secret"]}),
        )
        .expect(200)
        .json();
    assert_eq!(ok_stdout(&v), "put\n700\n600\n");
    // Its cgroup (named by its id) is below the container's own cgroup on the host.
    let during = sandbox_dirs(&cgroup);
    let named = |dirs: &BTreeSet<PathBuf>| dirs.iter().filter(|d| d.ends_with(&id)).count();
    assert!(
        named(&during) > 0,
        "no cgroup of session {id} below {cgroup}: {during:?}"
    );

    // Limits: the memory cap ends in oom, the pids cap stops a fork loop.
    let v = client.exec_ok(&json!({
        "cmd": ["python3", "-c", "x = bytearray(512 << 20); print(len(x))"],
        "limits": {"memory_bytes": 64 << 20},
    }));
    assert_eq!(v["outcome"], "oom", "{v:#}");
    assert_eq!(v["oom_killed"], true, "{v:#}");
    assert!(v["memory_peak_bytes"].as_u64().unwrap() <= 64 << 20, "{v:#}");
    let v = client.exec_ok(&json!({
        "cmd": ["sh", "-c", "n=0; for i in $(seq 40); do sleep 30 & n=$((n+1)); done; echo started $n"],
        "limits": {"pids": 8, "timeout_ms": 20000},
    }));
    assert_eq!(v["outcome"], "exited", "{v:#}");
    assert!(v["stderr"].as_str().unwrap().contains("fork"), "{v:#}");
    assert!(!v["stdout"].as_str().unwrap().contains("started 40"), "{v:#}");

    // A timeout.
    let t0 = Instant::now();
    let v = client.exec_ok(&json!({"cmd": ["sleep", "60"], "limits": {"timeout_ms": 1000}}));
    assert_eq!(v["outcome"], "timeout", "{v:#}");
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());

    // Deleting the session removes its cgroup.
    client.delete(&format!("/v1/sandboxes/{id}")).expect(204);
    client.get(&format!("/v1/sandboxes/{id}")).api_error(404);
    let removed = poll(Duration::from_secs(10), || {
        (named(&sandbox_dirs(&cgroup)) == 0).then_some(())
    });
    assert!(
        removed.is_some(),
        "session {id}'s cgroups are left: {:?}",
        sandbox_dirs(&cgroup)
    );

    // Stop: the daemon purges, runc removes the container's cgroup; nothing is left.
    c.stop();
    assert_eq!(c.inspect("{{.State.ExitCode}}"), "0", "{}", c.logs());
    let gone = poll(Duration::from_secs(20), || {
        (sandbox_dirs(&cgroup).is_empty() && processes_in(&cgroup).is_empty()).then_some(())
    });
    assert!(
        gone.is_some(),
        "left on the host: cgroups {:?}, processes {:?}",
        sandbox_dirs(&cgroup),
        processes_in(&cgroup)
    );
    for d in &during {
        assert!(!d.exists(), "{} is left", d.display());
    }
}

/// The egress proxy in the container: the container joins the test's network namespace
/// (fake remote hosts on its loopback), where an allowed host is reached through the
/// proxy and the metadata address is refused.
#[test]
fn egress_proxy_in_container_reaches_the_allowed_host_only() {
    require_tools!();
    let net = Net::start();
    let c = Container::serving(Network::Netns(&net));
    let program = format!(
        "{PRELUDE}\n{}\nprint(json.dumps(out))\n",
        r#"
out["allowed"] = urlopen("http://10.9.9.9/hello")
out["metadata"] = urlopen("http://169.254.169.254/latest/meta-data/")
"#
    );
    let network = json!({"mode": "proxy", "allow_cidrs": ["10.9.9.9/32"]});
    let v = in_netns(&net, || {
        let client = Client::new("http://127.0.0.1:8080", Some(&c.key));
        client.exec_ok(&json!({"cmd": ["python3", "-c", program], "network": network}))
    });
    let out: Value = serde_json::from_str(ok_stdout(&v).trim()).expect("the program's JSON");
    assert_eq!(out["allowed"], json!([200, "hello from allowed\n"]), "{v:#}");
    assert_eq!(
        out["metadata"],
        json!([403, "link-local address 169.254.169.254\n"]),
        "{v:#}"
    );
    let log = egress(&v);
    assert!(
        log.iter().any(|e| e["allowed"] == true && e["host"] == ALLOWED),
        "{v:#}"
    );
    assert!(
        log.iter().any(|e| e["allowed"] == false && e["host"] == METADATA),
        "{v:#}"
    );
    assert_eq!(net.connections_to("allowed"), 1, "{:?}", net.connections());
    net.assert_no_forbidden_connections();
}

// ---------------------------------------------------------------------------------------
// Refusals: the doc's command with one privilege taken away.

/// A seccomp profile that refuses user namespaces (what the runtimes' default profile does
/// for a container without CAP_SYS_ADMIN), and nothing else.
const NO_USERNS_SECCOMP: &str = r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
  {"names": ["unshare"], "action": "SCMP_ACT_ERRNO"},
  {"names": ["clone"], "action": "SCMP_ACT_ERRNO",
   "args": [{"index": 0, "value": 268435456, "valueTwo": 268435456, "op": "SCMP_CMP_MASKED_EQ"}]},
  {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]}"#;

/// Each privilege the doc's command gives, taken away in turn: the daemon exits 2 at
/// start with one line `airlock: cannot isolate: <what>: <how>` that names it, instead of
/// serving sandboxes it cannot isolate.
#[test]
fn daemon_refuses_to_start_without_each_privilege() {
    require_tools!();
    image();
    let seccomp = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(seccomp.path(), NO_USERNS_SECCOMP).unwrap();
    let with_seccomp = format!(
        "--cgroupns=private --security-opt seccomp={}",
        seccomp.path().display()
    );
    let cases: Vec<(&str, (&str, &str), &[&str])> = vec![
        (
            "without CAP_SYS_ADMIN",
            ("SYS_ADMIN,", ""),
            &["CAP_SYS_ADMIN", "--cap-add SYS_ADMIN"],
        ),
        (
            "without CAP_SETUID and CAP_SETGID",
            ("SETUID,SETGID,", ""),
            &["CAP_SETGID", "CAP_SETUID", "--cap-add SETGID", "--cap-add SETUID"],
        ),
        (
            "without CAP_SYS_PTRACE",
            (",SYS_PTRACE", ""),
            &["CAP_SYS_PTRACE", "--cap-add SYS_PTRACE"],
        ),
        (
            "with a seccomp profile that refuses user namespaces",
            ("--cgroupns=private", &with_seccomp),
            &["user namespaces", "seccomp"],
        ),
        (
            "with the runtime's masked /proc",
            ("--security-opt 'unmask=/proc/*' ", ""),
            &["proc in a new pid namespace", "unmask=/proc/*"],
        ),
        (
            "with the host's cgroup namespace (read-only cgroups)",
            ("--cgroupns=private", "--cgroupns=host"),
            &[
                "a cgroup for the memory, pids and CPU limits",
                "Read-only file system",
                "--cgroupns=private",
            ],
        ),
    ];
    let results: Vec<(Option<i64>, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(why, edit, _)| {
                s.spawn(move || {
                    let (c, out) = Container::start(Network::Published, &[*edit]);
                    assert!(
                        out.status.success(),
                        "podman run {why}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    (c.exit_status(), c.logs())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a refusal case panicked"))
            .collect()
    });
    let mut failures = Vec::new();
    for ((status, logs), (why, _, words)) in results.iter().zip(&cases) {
        let refusals: Vec<&str> = logs
            .lines()
            .filter(|l| l.starts_with("airlock: cannot isolate: "))
            .collect();
        let named = refusals.len() == 1 && words.iter().all(|w| refusals[0].contains(w));
        if *status != Some(2) || !named {
            failures.push(format!(
                "{why}: exit {status:?}, expected 2 and one refusal line naming {words:?}; logs:\n{logs}"
            ));
        } else {
            eprintln!("{why}: {}", refusals[0]);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Without /dev/net/tun the daemon starts (proxy mode is one network a request may ask
/// for), and a proxy-mode request is answered 503 naming the device, never run with
/// another network.
#[test]
fn without_tun_proxy_requests_are_refused_by_name() {
    require_tools!();
    let (c, out) = Container::start(Network::Published, &[("--device /dev/net/tun ", "")]);
    assert!(
        out.status.success(),
        "podman run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(c.exit_status(), None, "the daemon did not start:\n{}", c.logs());
    let client = c.client();
    let v = client.exec_ok(&json!({"cmd": ["python3", "-c", "print(1)"]}));
    assert_eq!(ok_stdout(&v), "1\n");
    let e = client
        .exec(&json!({"cmd": ["true"], "network": {"mode": "proxy", "allow": ["example.com"]}}))
        .api_error(503);
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("/dev/net/tun") && message.contains("--device /dev/net/tun"),
        "{e:#}"
    );
}

/// The gVisor tier in the container: the image's runsc with the agent and compat library
/// from /usr/libexec/airlock, given the one more capability it needs (docs/container.md:
/// `--cap-add SYS_CHROOT`).
#[test]
fn gvisor_tier_runs_in_container() {
    require_tools!();
    let caps = "--cap-add CHOWN,SETUID,SETGID,SYS_ADMIN,SYS_PTRACE ";
    let (c, out) = Container::start(
        Network::Published,
        &[(
            caps,
            "--cap-add CHOWN,SETUID,SETGID,SYS_ADMIN,SYS_PTRACE,SYS_CHROOT ",
        )],
    );
    assert!(
        out.status.success(),
        "podman run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(c.exit_status(), None, "the daemon did not start:\n{}", c.logs());
    let v = c
        .client()
        .exec_ok(&json!({"cmd": ["python3", "-c", "print(6*7)"], "isolation": "gvisor"}));
    assert_eq!(ok_stdout(&v), "42\n");
    assert_eq!(v["isolation"], "gvisor", "{v:#}");
}

/// The micro-VM tier in the container: the guest kernel fetched with `apt-get download`
/// (the image keeps its apt lists), the rootfs made from the image's /usr, one exec.
/// With `--device /dev/kvm` where the host has it (this host's KVM cannot boot stock
/// guests, so the VM is emulated either way). The VM cache is a host directory, so the
/// kernel is downloaded once, not on every run.
#[test]
fn microvm_tier_runs_in_container() {
    require_tools!();
    let cache = Path::new("/var/cache/airlock-ci/container-microvm");
    std::fs::create_dir_all(cache).unwrap();
    let mut extra = format!(
        "--device /dev/net/tun -v {}:/var/cache/airlock/microvm ",
        cache.display()
    );
    if Path::new("/dev/kvm").exists() {
        extra.push_str("--device /dev/kvm ");
    }
    let (c, out) = Container::start(Network::Published, &[("--device /dev/net/tun ", &extra)]);
    assert!(
        out.status.success(),
        "podman run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(c.exit_status(), None, "the daemon did not start:\n{}", c.logs());
    let v = c
        .client()
        .exec_ok(&json!({"cmd": ["python3", "-c", "print(6*7)"], "isolation": "microvm"}));
    assert_eq!(ok_stdout(&v), "42\n");
    assert_eq!(v["isolation"], "microvm", "{v:#}");
}
