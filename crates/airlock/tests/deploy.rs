//! DEPLOY: what installs and runs airlock elsewhere agrees with the binary it ships.
//!
//! - `make install` into a scratch DESTDIR lays out `bin/airlock` and the helpers in
//!   `libexec/airlock`, the installed airlock finds its guest agent there (and says where
//!   it looked when it is gone), `make uninstall` takes it all back.
//! - The Debian package (deploy/debian/build-deb.sh) holds the right files and control
//!   fields; its maintainer scripts, run in a private mount namespace over a scratch /etc,
//!   make the API key file, enable the unit, keep the key on upgrade and purge it.
//! - The systemd unit passes only flags `airlock serve` has, stops within its timeout and
//!   passes `systemd-analyze verify`.
//! - deploy/kubernetes: every flag the containers pass exists, ports agree between the
//!   args, the probes, the Services, the NetworkPolicy and the scrape annotations, the
//!   probe paths answer on a real daemon without a key, the grace period covers --grace,
//!   and `kubernetes-validate` accepts the manifests (and rejects a broken one).
//!
//! The helpers (airlock-guest, airlock-gvisor-agent, libairlock_gvisor_compat.so) must be
//! built beside airlock: `cargo build --workspace` (as .ci/run does) before these tests.

mod common;

use common::docs::{doc_block, doc_shell_block};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The Kubernetes version the manifests are validated against (kubernetes-validate
/// carries its schemas; .ci/run pins the package).
const KUBERNETES_VERSION: &str = "1.34.0";

const HELPERS: &[&str] = &[
    "airlock-guest",
    "airlock-gvisor-agent",
    "libairlock_gvisor_compat.so",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Where cargo built airlock and (with `cargo build --workspace`) its helpers.
fn built() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_airlock"))
        .parent()
        .unwrap()
        .to_path_buf();
    for h in HELPERS {
        assert!(
            dir.join(h).is_file(),
            "{} is not built: run `cargo build --workspace` (as .ci/run does) before this test",
            dir.join(h).display()
        );
    }
    dir
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `make install` of the already built binaries into `destdir` under `prefix`.
fn make_install(destdir: &Path, prefix: &str) {
    ok(Command::new("make")
        .arg("-C")
        .arg(root())
        .arg("install")
        .arg("NO_BUILD=1")
        .arg(format!("BUILT={}", built().display()))
        .arg(format!("PREFIX={prefix}"))
        .arg(format!("DESTDIR={}", destdir.display())));
}

/// Runs `airlock doctor --no-boot` from `exe` as the unprivileged user nobody (the guest
/// agent's line needs no root, and as nobody doctor builds no guest image) and returns
/// its `microvm: guest agent` line.
fn doctor_agent_line(exe: &Path) -> String {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(exe)
        .args(["doctor", "--no-boot"])
        .env_remove("AIRLOCK_GUEST")
        .env("HOME", "/");
    let out = run(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find(|l| l.contains("microvm: guest agent"))
        .unwrap_or_else(|| panic!("no guest agent line in doctor's output:\n{stdout}"))
        .to_owned()
}

/// A scratch directory that nobody (uid 65534) can search, for installs it runs.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn make_install_lays_out_a_prefix_whose_airlock_finds_its_helpers() {
    // Without NO_BUILD, install builds the release binaries of airlock and every helper
    // first (shown, not run: a release build takes minutes).
    let plan = ok(Command::new("make")
        .arg("-C")
        .arg(root())
        .args(["--no-print-directory", "-n", "install"]));
    // (`cargo`, or the CARGO that runs this test.)
    let first = plan.lines().next().unwrap_or_default();
    assert!(
        first.ends_with(
            "cargo build --locked --profile release -p airlock -p airlock-guest -p airlock-gvisor -p airlock-gvisor-compat"
        ),
        "{plan}"
    );
    assert!(
        plan.contains("\"target/release/airlock-guest\" \"/usr/local/libexec/airlock/airlock-guest\""),
        "{plan}"
    );
    // docs/install.md's from-source block is that build and install, then the installed
    // airlock's --version and doctor, which this test runs (doctor as nobody, below).
    let block = doc_shell_block("docs/install.md", "## From source");
    let commands: Vec<&str> = block
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .collect();
    assert_eq!(
        commands,
        [
            "make",
            "sudo make install",
            "airlock --version",
            "sudo airlock doctor --no-boot"
        ],
        "docs/install.md's from-source block changed: update this test"
    );
    let dest = scratch();
    let prefix = "/usr/local";
    make_install(dest.path(), prefix);
    let bin = dest.path().join("usr/local/bin/airlock");
    let libexec = dest.path().join("usr/local/libexec/airlock");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&bin), 0o755);
    assert_eq!(mode(&libexec.join("airlock-guest")), 0o755);
    assert_eq!(mode(&libexec.join("airlock-gvisor-agent")), 0o755);
    assert_eq!(mode(&libexec.join("libairlock_gvisor_compat.so")), 0o644);

    let version = ok(Command::new(&bin).arg("--version"));
    assert_eq!(version.trim(), format!("airlock {}", env!("CARGO_PKG_VERSION")));

    // Copied elsewhere, airlock finds the guest agent under its prefix's libexec.
    let line = doctor_agent_line(&bin);
    assert!(line.starts_with("ok"), "{line}");
    assert!(
        line.ends_with(&format!("{}", libexec.join("airlock-guest").display())),
        "{line}"
    );

    // Gone: doctor says where it looked, each place once.
    std::fs::remove_file(libexec.join("airlock-guest")).unwrap();
    let line = doctor_agent_line(&bin);
    let beside = dest.path().join("usr/local/bin/airlock-guest");
    let under = libexec.join("airlock-guest");
    for p in [
        beside.display().to_string(),
        under.display().to_string(),
        "/usr/libexec/airlock/airlock-guest".into(),
    ] {
        assert_eq!(line.matches(&p).count(), 1, "{p} not named once in: {line}");
    }
    assert!(!line.starts_with("ok"), "{line}");

    ok(Command::new("make")
        .arg("-C")
        .arg(root())
        .arg("uninstall")
        .arg(format!("PREFIX={prefix}"))
        .arg(format!("DESTDIR={}", dest.path().display())));
    assert!(!bin.exists());
    assert!(!libexec.exists(), "make uninstall left {}", libexec.display());
}

/// A micro-VM run whose guest agent is missing fails with one message naming every place
/// looked at, once (it used to be printed twice, naming only /usr/libexec). Needs root
/// (micro-VMs do) and the guest kernel (cached by the micro-VM tests and doctor).
#[test]
fn a_missing_guest_agent_is_reported_once_with_where_it_was_looked_for() {
    if !is_root() {
        println!("skipped: micro-VMs need root");
        return;
    }
    let dest = scratch();
    make_install(dest.path(), "/opt/airlock");
    let libexec = dest.path().join("opt/airlock/libexec/airlock");
    std::fs::remove_file(libexec.join("airlock-guest")).unwrap();
    let out = run(Command::new(dest.path().join("opt/airlock/bin/airlock"))
        .args(["run", "--isolation", "microvm", "--", "/bin/true"])
        .env_remove("AIRLOCK_GUEST"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ran without a guest agent: {stderr}");
    let under = libexec.join("airlock-guest").display().to_string();
    assert_eq!(
        stderr.matches(&under).count(),
        1,
        "{under} not named once: {stderr}"
    );
    assert_eq!(
        stderr.matches("/usr/libexec/airlock/airlock-guest").count(),
        1,
        "/usr/libexec not named once: {stderr}"
    );
    assert!(stderr.contains("not found"), "{stderr}");
}

/// The .deb of the built binaries, built once for the tests of this file (gzip: xz takes
/// a minute over a debug build), in cargo's scratch directory for tests (target/tmp),
/// replaced on every run.
fn built_deb() -> &'static Path {
    static DEB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DEB.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("deploy-deb");
        let _ = std::fs::remove_dir_all(&out);
        let deb = ok(Command::new(root().join("deploy/debian/build-deb.sh"))
            .arg(built())
            .arg(&out)
            .env("DEB_COMPRESSION", "gzip"));
        PathBuf::from(deb.trim())
    })
}

#[test]
fn the_debian_package_holds_the_binaries_unit_and_conffile() {
    let deb = built_deb();
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        deb.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(&format!("airlock_{version}_")),
        "{}",
        deb.display()
    );

    // docs/install.md installs the file this builds.
    let apt = doc_shell_block("docs/install.md", "### Installing the package");
    assert_eq!(
        apt.trim(),
        format!(
            "sudo apt install ./{}",
            deb.file_name().unwrap().to_string_lossy()
        ),
        "docs/install.md installs another file than build-deb.sh makes"
    );

    let listing = ok(Command::new("dpkg-deb").arg("-c").arg(deb));
    let entries: Vec<(&str, &str)> = listing
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0], f[5].trim_start_matches('.'))
        })
        .collect();
    let entry = |path: &str| {
        entries
            .iter()
            .find(|(_, p)| *p == path)
            .unwrap_or_else(|| panic!("{path} not in the package:\n{listing}"))
            .0
    };
    assert_eq!(entry("/usr/bin/airlock"), "-rwxr-xr-x");
    assert_eq!(entry("/usr/libexec/airlock/airlock-guest"), "-rwxr-xr-x");
    assert_eq!(entry("/usr/libexec/airlock/airlock-gvisor-agent"), "-rwxr-xr-x");
    assert_eq!(
        entry("/usr/libexec/airlock/libairlock_gvisor_compat.so"),
        "-rw-r--r--"
    );
    assert_eq!(entry("/lib/systemd/system/airlock.service"), "-rw-r--r--");
    assert_eq!(entry("/etc/default/airlock"), "-rw-r--r--");
    entry("/usr/share/doc/airlock/copyright");
    entry("/usr/share/doc/airlock/changelog.gz");
    assert!(listing.lines().all(|l| l.contains("root/root")), "{listing}");
    // The API key file is made at install, never shipped.
    assert!(!listing.contains("api-keys"), "{listing}");

    let field = |name: &str| {
        ok(Command::new("dpkg-deb").args(["-f"]).arg(deb).arg(name))
            .trim()
            .to_owned()
    };
    assert_eq!(field("Package"), "airlock");
    assert_eq!(field("Version"), version);
    let depends = field("Depends");
    for dep in ["libc6", "python3"] {
        assert!(depends.contains(dep), "Depends: {depends}");
    }
    let recommends = field("Recommends");
    for rec in ["runsc", "qemu-system-x86", "squashfs-tools", "lz4"] {
        assert!(recommends.contains(rec), "Recommends: {recommends}");
    }
    let info = ok(Command::new("dpkg-deb").arg("-I").arg(deb));
    for script in ["postinst", "prerm", "postrm", "conffiles"] {
        assert!(info.contains(script), "no {script} in:\n{info}");
    }
    let control = scratch();
    ok(Command::new("dpkg-deb").arg("-e").arg(deb).arg(control.path()));
    assert_eq!(
        std::fs::read_to_string(control.path().join("conffiles")).unwrap(),
        "/etc/default/airlock\n"
    );
    for script in ["postinst", "prerm", "postrm"] {
        ok(Command::new("sh").arg("-n").arg(control.path().join(script)));
    }

    // lintian, Debian's package checker: no errors (its warnings are printed).
    match Command::new("lintian").arg("--version").output() {
        Err(_) => println!("skipped lintian: not installed (apt-get install lintian; .ci/run does)"),
        Ok(_) => {
            let out = run(Command::new("lintian").arg(deb));
            let report = String::from_utf8_lossy(&out.stdout);
            println!("lintian {}:\n{report}", deb.display());
            let errors: Vec<&str> = report.lines().filter(|l| l.starts_with("E:")).collect();
            assert!(errors.is_empty(), "lintian errors:\n{report}");
        }
    }

    // Unpacked as it installs, the package's airlock finds the guest agent in
    // /usr/libexec/airlock relative to itself (<exe dir>/../libexec/airlock).
    let tree = scratch();
    ok(Command::new("dpkg-deb").arg("-x").arg(deb).arg(tree.path()));
    std::fs::set_permissions(tree.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let line = doctor_agent_line(&tree.path().join("usr/bin/airlock"));
    let agent = tree.path().join("usr/libexec/airlock/airlock-guest");
    assert!(
        line.starts_with("ok") && line.ends_with(&agent.display().to_string()),
        "{line}"
    );
}

/// The maintainer scripts, run as dpkg would, in a private mount namespace whose /etc,
/// /lib/systemd/system and /var/lib/systemd are scratch tmpfs (nothing of the host's is
/// read or changed; systemd is not PID 1 here, so nothing is started).
#[test]
fn the_maintainer_scripts_make_a_key_enable_the_unit_and_purge() {
    if !is_root() {
        println!("skipped: the maintainer scripts run in a mount namespace (needs root)");
        return;
    }
    if Path::new("/run/systemd/system").exists() {
        println!("skipped: systemd is running here, and the scripts would start the unit");
        return;
    }
    let deb = built_deb();
    let control = scratch();
    ok(Command::new("dpkg-deb").arg("-e").arg(deb).arg(control.path()));
    let unit = root().join("deploy/systemd/airlock.service");
    let c = control.path().display();
    let script = format!(
        r#"set -eu
mount --make-rprivate /
for d in /etc /lib/systemd/system /var/lib/systemd; do mount -t tmpfs tmpfs "$d"; done
cp {unit} /lib/systemd/system/airlock.service
export DPKG_MAINTSCRIPT_PACKAGE=airlock
DPKG_MAINTSCRIPT_NAME=postinst {c}/postinst configure
echo "first: $(stat -c %a /etc/airlock/api-keys) $(grep -v '^#' /etc/airlock/api-keys)"
echo "enabled: $(readlink /etc/systemd/system/multi-user.target.wants/airlock.service)"
DPKG_MAINTSCRIPT_NAME=postinst {c}/postinst configure 0.0.1
echo "upgraded: $(grep -v '^#' /etc/airlock/api-keys)"
DPKG_MAINTSCRIPT_NAME=prerm {c}/prerm remove
DPKG_MAINTSCRIPT_NAME=postrm {c}/postrm remove
echo "masked: $(readlink /etc/systemd/system/airlock.service)"
DPKG_MAINTSCRIPT_NAME=postrm {c}/postrm purge
echo "purged: $(ls -A /etc/airlock 2>&1 | head -1)"
echo "links: $(find /etc/systemd -name 'airlock.service*' | wc -l)"
"#,
        unit = unit.display()
    );
    let stdout = ok(Command::new("unshare").args(["--mount", "sh", "-c", &script]));
    let get = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in:\n{stdout}"))
            .trim()
            .to_owned()
    };
    let first = get("first:");
    let (mode, key) = first.split_once(' ').unwrap();
    assert_eq!(mode, "600", "{stdout}");
    let secret = key.strip_prefix("local:").unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        secret.len() == 48 && secret.bytes().all(|b| b.is_ascii_hexdigit()),
        "{stdout}"
    );
    assert_eq!(get("enabled:"), "/lib/systemd/system/airlock.service", "{stdout}");
    assert_eq!(get("upgraded:"), key, "an upgrade changed the key: {stdout}");
    assert_eq!(get("masked:"), "/dev/null", "{stdout}");
    assert!(get("purged:").contains("No such file"), "{stdout}");
    assert_eq!(get("links:"), "0", "{stdout}");
}

/// `airlock serve --help`'s long flags.
fn serve_flags() -> BTreeSet<String> {
    let help = ok(Command::new(env!("CARGO_BIN_EXE_airlock")).args(["serve", "--help"]));
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[' || c == ']')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(str::to_owned)
        .collect()
}

/// Checks every `--flag` in `args` is one of `flags`.
fn assert_flags_exist(what: &str, args: &[String], flags: &BTreeSet<String>) {
    for a in args.iter().filter(|a| a.starts_with("--")) {
        let flag = a.split('=').next().unwrap();
        assert!(
            flags.contains(flag),
            "{what} passes {flag}, which `airlock serve --help` does not list"
        );
    }
}

/// The value after `flag` in `args`.
fn arg_of<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// Seconds of an airlock duration like `30s`, `2m`.
fn seconds(d: &str) -> u64 {
    let (n, unit) = d.split_at(d.find(|c: char| !c.is_ascii_digit()).unwrap_or(d.len()));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("duration {d}"));
    match unit {
        "s" | "" => n,
        "m" => n * 60,
        _ => panic!("duration {d}"),
    }
}

/// The unit's `Key=value` lines.
fn unit_value(unit: &str, key: &str) -> String {
    unit.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in the unit"))
        .to_owned()
}

#[test]
fn the_systemd_unit_passes_real_flags_and_verifies() {
    let unit = std::fs::read_to_string(root().join("deploy/systemd/airlock.service")).unwrap();
    let exec: Vec<String> = unit_value(&unit, "ExecStart")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(exec[0], "/usr/bin/airlock");
    assert_eq!(exec[1], "serve");
    let flags = serve_flags();
    assert_flags_exist("airlock.service", &exec, &flags);
    assert_eq!(arg_of(&exec, "--api-keys"), Some("%d/api-keys"));
    assert!(unit.contains("LoadCredential=api-keys:/etc/airlock/api-keys"));
    assert_eq!(unit_value(&unit, "StateDirectory"), "airlock");
    assert_eq!(unit_value(&unit, "Delegate"), "yes");
    assert_eq!(unit_value(&unit, "KillMode"), "mixed");
    assert_eq!(unit_value(&unit, "Restart"), "on-failure");
    let grace = seconds(arg_of(&exec, "--grace").unwrap());
    let stop = seconds(&unit_value(&unit, "TimeoutStopSec"));
    assert!(
        stop > grace,
        "TimeoutStopSec {stop}s does not cover --grace {grace}s"
    );

    // AIRLOCK_SERVE_ARGS cannot repeat a flag the unit passes (clap refuses repeats):
    // /etc/default/airlock says so, and must not suggest one.
    let out =
        run(Command::new(env!("CARGO_BIN_EXE_airlock")).args(["serve", "--grace", "30s", "--grace", "5s"]));
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let default = std::fs::read_to_string(root().join("deploy/debian/default")).unwrap();
    for line in default.lines().filter(|l| l.contains("AIRLOCK_SERVE_ARGS=")) {
        let value = line
            .trim_start_matches(['#', ' '])
            .trim_start_matches("AIRLOCK_SERVE_ARGS=");
        let args: Vec<String> = value
            .trim_matches('"')
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        assert_flags_exist("/etc/default/airlock", &args, &flags);
        for a in &args {
            assert!(
                !exec.contains(a) || !a.starts_with("--"),
                "/etc/default/airlock repeats {a}"
            );
        }
    }
    assert!(unit.contains("Environment=AIRLOCK_SNAPSHOT_DIR=/var/lib/airlock/snapshots"));
    assert!(
        String::from_utf8_lossy(
            &run(Command::new(env!("CARGO_BIN_EXE_airlock")).args(["serve", "--help"])).stdout
        )
        .contains("AIRLOCK_SNAPSHOT_DIR")
    );

    // docs/install.md starts this unit and asks it on serve's default address.
    let start = doc_shell_block("docs/install.md", "### Starting it");
    let help = ok(Command::new(env!("CARGO_BIN_EXE_airlock")).args(["serve", "--help"]));
    let listen = help
        .lines()
        .find(|l| l.trim_start().starts_with("--listen"))
        .and_then(|l| l.split("[default: ").nth(1))
        .and_then(|d| d.split(']').next())
        .expect("serve --help's --listen default");
    assert_eq!(
        start.lines().collect::<Vec<_>>(),
        [
            "sudo systemctl daemon-reload",
            "sudo systemctl enable --now airlock",
            &format!("curl -s http://{listen}/readyz"),
        ],
        "docs/install.md's start block"
    );

    // systemd-analyze verify checks the unit's syntax and that ExecStart exists: the
    // unit `make install-systemd` writes for an install in a scratch prefix.
    let Ok(_) = Command::new("systemd-analyze").arg("--version").output() else {
        println!("skipped systemd-analyze verify: systemd-analyze is not installed");
        return;
    };
    let dest = scratch();
    let prefix = dest.path().join("prefix");
    ok(Command::new("make")
        .arg("-C")
        .arg(root())
        .args(["install", "install-systemd", "NO_BUILD=1"])
        .arg(format!("BUILT={}", built().display()))
        .arg(format!("PREFIX={}", prefix.display()))
        .arg(format!("SYSTEMDDIR={}", dest.path().join("units").display())));
    let installed = dest.path().join("units/airlock.service");
    let text = std::fs::read_to_string(&installed).unwrap();
    assert!(
        text.contains(&format!("ExecStart={}/bin/airlock serve", prefix.display())),
        "{text}"
    );
    let out = run(Command::new("systemd-analyze").arg("verify").arg(&installed));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // verify also reports the host's other units it loads; only this unit's lines count.
    let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("airlock.service")).collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

/// The manifests as JSON documents (PyYAML through python3: CI has it with
/// kubernetes-validate).
fn manifests() -> Vec<(String, Value)> {
    let dir = root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let script = "import json, sys, yaml\n\
        print(json.dumps([[f, d] for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]))";
    let out = ["python3", "/usr/bin/python3"]
        .iter()
        .map(|py| Command::new(py).arg("-c").arg(script).args(&files).output())
        .find_map(|o| o.ok().filter(|o| o.status.success()))
        .expect("python3 with PyYAML (pip install kubernetes-validate, or apt-get install python3-yaml)");
    let docs: Vec<(String, Value)> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!docs.is_empty());
    docs
}

fn find<'a>(docs: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// `selector` (a label map) selects pods labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let sel = selector.as_object().expect("a label selector");
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Quantity in bytes of a Kubernetes memory value (`16Gi`) or an airlock size (`14G`),
/// both binary here.
fn bytes(q: &str) -> u64 {
    let (n, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = n.parse().unwrap();
    n << match unit.trim_end_matches('i') {
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        "" => 0,
        u => panic!("unit {u}"),
    }
}

/// The one container of a workload's pod template, and its pod spec and labels.
fn container(workload: &Value) -> (&Value, &Value, &Value) {
    let pod = &workload["spec"]["template"];
    let containers = pod["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    (&containers[0], &pod["spec"], &pod["metadata"]["labels"])
}

/// The port number of a container port named `name`.
fn named_port(c: &Value, name: &str) -> u64 {
    c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no port {name}"))["containerPort"]
        .as_u64()
        .unwrap()
}

/// A probe's port as a number (named ports resolved against the container's).
fn probe_port(c: &Value, probe: &Value) -> u64 {
    let port = &probe["httpGet"]["port"];
    port.as_u64()
        .unwrap_or_else(|| named_port(c, port.as_str().unwrap()))
}

#[test]
fn the_kubernetes_manifests_match_the_binary() {
    let docs = manifests();
    let flags = serve_flags();
    let version = env!("CARGO_PKG_VERSION");
    let daemons = find(&docs, "DaemonSet", "airlock");
    let router = find(&docs, "Deployment", "airlock-router");
    let headless = find(&docs, "Service", "airlock-nodes");
    let front = find(&docs, "Service", "airlock");
    for (_, d) in &docs {
        assert_eq!(
            d["metadata"]["namespace"].as_str().unwrap_or("airlock"),
            "airlock"
        );
    }

    let mut ports = Vec::new();
    for (what, w) in [("DaemonSet", daemons), ("router", router)] {
        let (c, pod, labels) = container(w);
        assert_eq!(c["image"], format!("ghcr.io/airlock/airlock:{version}"), "{what}");
        let command = strings(&c["command"]);
        assert_eq!(
            command.last().map(String::as_str),
            Some("/usr/bin/airlock"),
            "{what}"
        );
        let args = strings(&c["args"]);
        assert_eq!(args[0], "serve", "{what}");
        assert_flags_exist(what, &args, &flags);
        // --listen's port is the container's http port, which every probe uses.
        let listen = arg_of(&args, "--listen").unwrap();
        let port: u64 = listen.rsplit_once(':').unwrap().1.parse().unwrap();
        assert!(listen.starts_with("0.0.0.0:"), "{what} listens on {listen}");
        assert_eq!(named_port(c, "http"), port, "{what}");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{what}");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{what}");
        for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
            if !c[probe].is_null() {
                assert_eq!(probe_port(c, &c[probe]), port, "{what} {probe}");
            }
        }
        // API keys from the Secret, mounted where --api-keys reads them (the daemons; the
        // router checks no key: the daemons check what it passes on).
        if what == "router" {
            assert!(
                arg_of(&args, "--api-keys").is_none(),
                "the router ignores --api-keys"
            );
        } else {
            let keys = Path::new(arg_of(&args, "--api-keys").unwrap());
            let mount = c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| Path::new(m["mountPath"].as_str().unwrap()) == keys.parent().unwrap())
                .unwrap_or_else(|| panic!("{what}: nothing mounted at {}", keys.display()));
            let volume = pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == mount["name"])
                .unwrap();
            assert_eq!(volume["secret"]["secretName"], "airlock-api-keys", "{what}");
        }
        // SIGTERM drain fits in the grace period.
        let grace = seconds(arg_of(&args, "--grace").unwrap());
        let period = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
        assert!(
            period > grace,
            "{what}: terminationGracePeriodSeconds {period} <= --grace {grace}s"
        );
        assert!(
            !c["resources"]["requests"].is_null() && !c["resources"]["limits"].is_null(),
            "{what}"
        );
        ports.push((what, port, labels.clone()));
    }
    let (_, daemon_port, daemon_labels) = ports[0].clone();
    let (_, router_port, router_labels) = ports[1].clone();

    // The daemon runs through the image's entrypoint (which makes its cgroups writable),
    // as the image's ENTRYPOINT does.
    let (c, _, _) = container(daemons);
    let command = strings(&c["command"]);
    let dockerfile = root().join("deploy/container/Dockerfile");
    match std::fs::read_to_string(&dockerfile) {
        Ok(text) => {
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix("ENTRYPOINT "))
                .expect("the Dockerfile's ENTRYPOINT");
            let entrypoint: Vec<String> = serde_json::from_str(line).unwrap();
            assert_eq!(
                entrypoint[..command.len()],
                command[..],
                "DaemonSet command vs the image's ENTRYPOINT"
            );
        }
        Err(_) => println!(
            "DaemonSet: {} is not here yet (another part adds it): its command {command:?} is unchecked",
            dockerfile.display()
        ),
    }

    // The daemons: on labelled nodes, named per pod, admission below the memory limit,
    // scraped on their port.
    let (c, pod, _) = container(daemons);
    let args = strings(&c["args"]);
    assert_eq!(pod["nodeSelector"]["airlock.dev/sandbox"], "true");
    assert_eq!(arg_of(&args, "--node"), Some("$(POD_NAME)"));
    let env = c["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "POD_NAME" && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name")
    );
    // A DaemonSet's pods are named NAME-xxxxx: a valid --node (1..=20 of [a-z0-9-]).
    let pod_name_len = daemons["metadata"]["name"].as_str().unwrap().len() + 6;
    assert!(
        pod_name_len <= 20,
        "pod names of {pod_name_len} characters are too long for --node"
    );
    let budget = bytes(arg_of(&args, "--memory-budget").unwrap());
    let limit = bytes(c["resources"]["limits"]["memory"].as_str().unwrap());
    assert!(
        budget < limit,
        "--memory-budget {budget} is not below the memory limit {limit}"
    );
    let annotations = &daemons["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], daemon_port.to_string());
    assert_eq!(annotations["prometheus.io/path"], "/metrics");

    // The headless Service addresses each ready daemon; the router resolves it.
    assert_eq!(headless["spec"]["clusterIP"], "None");
    // Not-ready pods stay in it: the router polls /readyz itself, and a draining pod
    // still serves the sessions it holds (docs/fleet.md).
    assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);
    assert!(selects(&headless["spec"]["selector"], &daemon_labels));
    assert!(!selects(&headless["spec"]["selector"], &router_labels));
    let service_port = |s: &Value, target: u64| {
        let p = &s["spec"]["ports"][0];
        assert_eq!(p["targetPort"], "http");
        assert_eq!(p["port"].as_u64().unwrap(), target);
        target
    };
    let (rc, _, _) = container(router);
    let route = arg_of(&strings(&rc["args"]), "--route").unwrap().to_owned();
    assert_eq!(
        route,
        format!(
            "dns:{}:{}",
            headless["metadata"]["name"].as_str().unwrap(),
            service_port(headless, daemon_port)
        )
    );
    assert!(selects(&front["spec"]["selector"], &router_labels));
    assert!(!selects(&front["spec"]["selector"], &daemon_labels));
    service_port(front, router_port);

    // Only the router (and labelled scrapers) reach the daemons, on their port.
    let policy = find(&docs, "NetworkPolicy", "airlock-daemon-ingress");
    assert!(selects(
        &policy["spec"]["podSelector"]["matchLabels"],
        &daemon_labels
    ));
    assert_eq!(strings(&policy["spec"]["policyTypes"]), ["Ingress"]);
    let rules = policy["spec"]["ingress"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r["from"][0]["podSelector"]["matchLabels"] == router_labels
                && r["from"][0]["namespaceSelector"].is_null())
    );
    for r in rules {
        assert_eq!(r["ports"][0]["port"].as_u64(), Some(daemon_port));
        for from in r["from"].as_array().unwrap() {
            assert!(
                from["ipBlock"].is_null(),
                "an ipBlock admits more than the router"
            );
            assert!(!from["podSelector"]["matchLabels"].as_object().unwrap().is_empty());
        }
    }

    // Disruption budgets cover both workloads.
    let pdb = find(&docs, "PodDisruptionBudget", "airlock");
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"], &daemon_labels));
    let pdb = find(&docs, "PodDisruptionBudget", "airlock-router");
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"], &router_labels));
}

/// A free loopback port (bound and released; a race with another process is possible
/// but harmless: the daemon then fails to start and the test says so).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` with an optional bearer key: the status code and body.
fn get(port: u16, path: &str, key: Option<&str>) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let code = resp.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, resp))
}

/// The probes and the scrape path answer on a real daemon with the manifests' key setup:
/// /healthz and /readyz without a key (the kubelet sends none), /metrics with one; SIGTERM
/// drains it well within the grace period.
#[test]
fn the_probe_and_metrics_paths_answer_as_the_manifests_expect() {
    let dir = scratch();
    let keys = dir.path().join("api-keys");
    std::fs::write(&keys, "prometheus:0123456789abcdef0123\n").unwrap();
    let port = free_port();
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--pool",
            "0",
            "--grace",
            "5s",
        ])
        .arg("--api-keys")
        .arg(&keys)
        .arg("--snapshot-dir")
        .arg(dir.path().join("snapshots"))
        .arg("--image-store")
        .arg(dir.path().join("images"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let health = loop {
        if let Some(r) = get(port, "/healthz", None) {
            break r;
        }
        if let Ok(Some(status)) = daemon.try_wait() {
            let mut err = String::new();
            daemon.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            panic!("airlock serve exited {status}: {err}");
        }
        assert!(Instant::now() < deadline, "airlock serve did not answer in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(health.0, 200, "{}", health.1);
    let ready = get(port, "/readyz", None).unwrap();
    assert_eq!(ready.0, 200, "{}", ready.1);
    assert_eq!(get(port, "/metrics", None).unwrap().0, 401);
    let metrics = get(port, "/metrics", Some("0123456789abcdef0123")).unwrap();
    assert_eq!(metrics.0, 200, "{}", metrics.1);
    assert!(metrics.1.contains("# TYPE"), "not Prometheus text: {}", metrics.1);

    // SIGTERM: the daemon exits by itself, well within terminationGracePeriodSeconds.
    let t = Instant::now();
    ok(Command::new("kill").args(["-TERM", &daemon.id().to_string()]));
    let status = loop {
        if let Some(s) = daemon.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no exit 30 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "airlock serve exited {status} on SIGTERM");
}

/// kubernetes-validate (the API's schemas, offline) accepts every manifest, strictly,
/// and rejects one with a field of the wrong type (so a pass means something).
#[test]
fn kubernetes_validate_accepts_the_manifests() {
    // The script pip installs, or the module where its scripts are not on PATH.
    let validator = |args: &[&str]| {
        let mut cmd = if Command::new("kubernetes-validate")
            .arg("--version")
            .output()
            .is_ok()
        {
            Command::new("kubernetes-validate")
        } else {
            let mut c = Command::new("python3");
            c.args(["-m", "kubernetes_validate"]);
            c
        };
        cmd.args(args);
        cmd
    };
    if !validator(&["--version"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        println!(
            "skipped: kubernetes-validate is not installed (pip install kubernetes-validate; .ci/run does)"
        );
        return;
    }
    let dir = root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let out = ok(validator(&["--strict", "-k", KUBERNETES_VERSION]).args(&files));
    assert!(!out.contains("ERROR") && !out.contains("WARN"), "{out}");
    assert!(out.matches("passed").count() >= files.len(), "{out}");

    let broken = scratch();
    let text = std::fs::read_to_string(dir.join("20-daemonset.yaml")).unwrap();
    let text = text.replace("containerPort: 8080", "containerPort: eighty");
    assert!(text.contains("eighty"));
    let bad = broken.path().join("daemonset.yaml");
    std::fs::write(&bad, text).unwrap();
    let out = run(validator(&["--strict", "-k", KUBERNETES_VERSION]).arg(&bad));
    assert!(
        !out.status.success(),
        "kubernetes-validate accepted a broken DaemonSet"
    );
}

/// docs/install.md's shell examples, run as written but into scratch directories: the
/// staged install (a debug build instead of the release one), the package build, the key
/// file (under a scratch /etc, without sudo); its MCP configuration names an installed
/// absolute path; its doctor line is what doctor prints.
#[test]
fn the_install_docs_examples_work() {
    let doc = std::fs::read_to_string(root().join("docs/install.md")).unwrap();
    let blocks = [
        doc_shell_block("docs/install.md", "### A staged install"),
        doc_shell_block("docs/install.md", "## The Debian package"),
        doc_shell_block("docs/install.md", "### The key file"),
    ];
    let tmp = scratch();
    let t = tmp.path().display().to_string();
    let built = built().display().to_string();
    for block in &blocks {
        let script = block
            .replace(
                "make install ",
                &format!("make install NO_BUILD=1 BUILT={built} "),
            )
            .replace(
                "deploy/debian/build-deb.sh target/release",
                &format!("deploy/debian/build-deb.sh {built}"),
            )
            .replace("/tmp/airlock-", &format!("{t}/"))
            .replace("sudo ", "")
            .replace("/etc/airlock", &format!("{t}/etc/airlock"));
        let out = ok(Command::new("bash")
            .args(["-euo", "pipefail", "-c", &script])
            .current_dir(root())
            .env("DEB_COMPRESSION", "gzip"));
        if block.contains("make install") {
            assert!(
                out.contains(&format!("airlock {}", env!("CARGO_PKG_VERSION"))),
                "{out}"
            );
            assert!(out.contains("/usr/local/libexec/airlock/airlock-guest"), "{out}");
            assert!(
                !tmp.path().join("stage/usr/local/bin/airlock").exists(),
                "make uninstall left it"
            );
        }
        if block.contains("dpkg-deb -c") {
            assert!(out.contains("./usr/bin/airlock"), "{out}");
        }
    }
    let keys = tmp.path().join("etc/airlock/api-keys");
    let text = std::fs::read_to_string(&keys).unwrap();
    let key = text.trim().strip_prefix("local:").unwrap();
    assert!(
        key.len() == 48 && key.bytes().all(|b| b.is_ascii_hexdigit()),
        "{text}"
    );
    assert_eq!(
        std::fs::metadata(&keys).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let json = doc_block("docs/install.md", "## MCP desktop configuration", "json");
    let config: Value = serde_json::from_str(&json).unwrap();
    let server = &config["mcpServers"]["airlock"];
    assert_eq!(
        server["command"], "/usr/local/bin/airlock",
        "the path make install gives"
    );
    assert_eq!(strings(&server["args"]), ["mcp"]);
    ok(Command::new(env!("CARGO_BIN_EXE_airlock")).args(["mcp", "--help"]));

    // The doctor line the doc shows, as doctor prints it for a /usr/local install.
    let shown = doc
        .lines()
        .find(|l| l.contains("microvm: guest agent"))
        .expect("docs/install.md shows doctor's guest agent line");
    let dest = scratch();
    make_install(dest.path(), "/usr/local");
    let line = doctor_agent_line(&dest.path().join("usr/local/bin/airlock"));
    assert_eq!(line.replace(&dest.path().display().to_string(), ""), shown);
}

/// docs/kubernetes.md names the objects, labels, Secret and flags the manifests have.
#[test]
fn the_kubernetes_docs_match_the_manifests() {
    let doc = std::fs::read_to_string(root().join("docs/kubernetes.md")).unwrap();
    let docs = manifests();
    let dir = root().join("deploy/kubernetes");
    // Every manifest file is described, and every file the doc names exists.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            doc.contains(&format!("`{name}`")),
            "docs/kubernetes.md does not describe {name}"
        );
    }
    for word in doc.split(|c: char| c.is_whitespace() || c == '`' || c == '(' || c == ')') {
        if let Some(file) = word.strip_prefix("deploy/kubernetes/").filter(|f| !f.is_empty()) {
            assert!(dir.join(file).is_file(), "docs/kubernetes.md names {word}");
        }
    }
    for (_, d) in &docs {
        let name = d["metadata"]["name"].as_str().unwrap();
        assert!(
            doc.contains(&format!("`{name}`")),
            "docs/kubernetes.md does not name {} {name}",
            d["kind"]
        );
    }
    let (c, pod, _) = container(find(&docs, "DaemonSet", "airlock"));
    let args = strings(&c["args"]);
    assert!(
        doc.contains(&format!("`airlock serve {}`", args[1..].join(" "))) || {
            let joined = doc.split_whitespace().collect::<Vec<_>>().join(" ");
            joined.contains(&format!("`airlock serve {}`", args[1..].join(" ")))
        },
        "docs/kubernetes.md's daemon command differs from the DaemonSet's: {args:?}"
    );
    // The three shell blocks, run with kubectl replaced by a function that records its
    // arguments (no cluster here), in a scratch directory that has the repository's
    // deploy/ (the blocks name deploy/kubernetes/...).
    let dir = scratch();
    std::os::unix::fs::symlink(root().join("deploy"), dir.path().join("deploy")).unwrap();
    let mut recorded = String::new();
    for heading in ["### Sandbox nodes", "### API keys", "### Applying"] {
        let block = doc_shell_block("docs/kubernetes.md", heading);
        let script = format!("kubectl() {{ echo \"kubectl $*\" >> kubectl.log; }}\n{block}");
        ok(Command::new("bash")
            .args(["-euo", "pipefail", "-c", &script])
            .current_dir(dir.path()));
    }
    recorded.push_str(&std::fs::read_to_string(dir.path().join("kubectl.log")).unwrap());
    let (key, value) = pod["nodeSelector"].as_object().unwrap().iter().next().unwrap();
    let label = format!("{key}={}", value.as_str().unwrap());
    assert!(
        recorded.contains(&format!("kubectl label node NODE {label}\n")),
        "{recorded}"
    );
    let toleration = &pod["tolerations"][0];
    assert_eq!(
        format!(
            "{}={}",
            toleration["key"].as_str().unwrap(),
            toleration["value"].as_str().unwrap()
        ),
        label
    );
    assert!(
        recorded.contains(&format!(
            "kubectl taint node NODE {label}:{}\n",
            toleration["effect"].as_str().unwrap()
        )),
        "{recorded}"
    );
    for line in recorded.lines().filter(|l| l.starts_with("kubectl apply -f ")) {
        let path = dir.path().join(line.trim_start_matches("kubectl apply -f "));
        assert!(path.exists(), "{line}: no such file");
    }
    assert!(
        recorded.contains("kubectl apply -f deploy/kubernetes/\n"),
        "{recorded}"
    );
    // The Secret the pods mount, with the file name --api-keys reads.
    let secret = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v["secret"]["secretName"].as_str())
        .unwrap();
    let file = Path::new(arg_of(&args, "--api-keys").unwrap())
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        recorded.contains(&format!(
            "kubectl -n airlock create secret generic {secret} --from-file={file}=api-keys\n"
        )),
        "{recorded}"
    );
    // The key file it made: name:key lines with keys of 48 hex digits.
    let keys = std::fs::read_to_string(dir.path().join("api-keys")).unwrap();
    let names: Vec<&str> = keys
        .lines()
        .map(|l| {
            let (name, key) = l.split_once(':').unwrap();
            assert!(
                key.len() == 48 && key.bytes().all(|b| b.is_ascii_hexdigit()),
                "{keys}"
            );
            name
        })
        .collect();
    assert_eq!(names, ["client", "prometheus"]);
    let period = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(doc.contains(&format!("terminationGracePeriodSeconds: {period}")));
    let (rc, _, _) = container(find(&docs, "Deployment", "airlock-router"));
    let route = arg_of(&strings(&rc["args"]), "--route").unwrap().to_owned();
    assert!(doc.contains(&format!("--route {route}")), "{route}");
}
