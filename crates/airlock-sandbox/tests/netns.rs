//! Proxy mode's kernel plumbing on the namespace tier, on the real kernel (run as root):
//! the nf_tables rules and the TUN route in the sandbox's own network namespace, and the
//! CA bundle installed read-only at /etc/ssl/certs/ca-certificates.crt with the host's
//! root and with an image's, nothing written into either tree. (What a program sees of the
//! redirect, end to end through the binary: tests/egress.rs of the airlock crate.) The
//! sandbox's init is this test binary re-executed, so the binary has its own `main`
//! (`harness = false`) that serves as init first; each case runs in turn.

#[path = "common/image.rs"]
mod image;

use airlock_sandbox::{Capture, Engine, SandboxConfig, SandboxError};
use airlock_spec::{ExecResult, NetworkPolicy, Spec};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A bundle as the egress object would hand it over (its content is never parsed here).
const BUNDLE: &str = "-----BEGIN CERTIFICATE-----\nTUlJQmFpcmxvY2stdGVzdC1jYQ==\n-----END CERTIFICATE-----\n";

/// Where the bundle goes in the sandbox.
const CA_PATH: &str = "/etc/ssl/certs/ca-certificates.crt";

fn sh(script: &str) -> Spec {
    let mut spec = Spec::new(vec!["/bin/sh".into(), "-c".into(), script.into()]);
    spec.network = NetworkPolicy::Proxy(Default::default());
    spec
}

fn config(spec: &Spec, image: Option<&Path>, bundle: Option<&[u8]>) -> SandboxConfig {
    let mut config = SandboxConfig::of(spec);
    config.image = image.map(Path::to_owned);
    config.ca_bundle = bundle.map(<[u8]>::to_vec);
    config
}

fn run(engine: &Engine, config: &SandboxConfig, spec: &Spec) -> ExecResult {
    let mut sb = engine
        .create(config)
        .unwrap_or_else(|e| panic!("{config:?}: {e}"));
    let r = sb
        .exec(spec, &mut Capture, &[])
        .unwrap_or_else(|e| panic!("{spec:?}: {e}"));
    assert_eq!(r.exit_code, Some(0), "{r:#?}");
    r
}

/// A process of the sandbox `id` (any: they share its network namespace): one whose
/// cgroup path ends with the id.
fn sandbox_pid(id: &str) -> u32 {
    let suffix = format!("/{id}");
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cgroup = fs::read_to_string(e.path().join("cgroup")).ok()?;
            cgroup.lines().any(|l| l.ends_with(&suffix)).then_some(pid)
        })
        .unwrap_or_else(|| panic!("no process of sandbox {id}"))
}

/// `CMD...` run in the network namespace of process `pid`.
fn in_netns_of(pid: u32, cmd: &[&str]) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(cmd)
        .output()
        .expect("nsenter");
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn the_sandboxs_netns_has_the_documented_ruleset_and_route(engine: &Engine, _: &Path) {
    let spec = sh("true");
    let sb = engine.create(&config(&spec, None, None)).unwrap();
    let pid = sandbox_pid(sb.id());
    let listing = in_netns_of(pid, &["/usr/sbin/nft", "list", "ruleset"]);
    let lines: Vec<&str> = listing.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    assert_eq!(
        lines,
        [
            "table ip airlock {",
            "chain nat {",
            "type nat hook output priority -100; policy accept;",
            "meta l4proto tcp ip daddr != 127.0.0.0/8 redirect to :3129",
            "udp dport 53 ip daddr != 127.0.0.0/8 redirect to :53",
            "}",
            "chain filter {",
            "type filter hook output priority filter; policy accept;",
            "oif \"lo\" accept",
            "ip daddr 127.0.0.0/8 accept",
            "reject",
            "}",
            "}",
            "table ip6 airlock {",
            "chain filter {",
            "type filter hook output priority filter; policy accept;",
            "oif \"lo\" accept",
            "reject",
            "}",
            "}",
        ],
        "{listing}"
    );
    let route = in_netns_of(pid, &["ip", "-4", "route", "show", "default"]);
    // "linkdown": nothing reads the device (no carrier); IPv4 routes through it anyway.
    assert!(route.starts_with("default dev airlock0 scope link"), "{route}");
    let addr = in_netns_of(pid, &["ip", "-4", "-o", "addr", "show", "dev", "airlock0"]);
    assert!(addr.contains("inet 192.0.0.8/32"), "{addr}");
    let v6 = in_netns_of(pid, &["ip", "-6", "route", "show"]);
    assert!(!v6.contains("default"), "IPv6 has a default route: {v6}");
    // The host's own ruleset knows nothing of the sandbox's table.
    let host = Command::new("/usr/sbin/nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&host.stdout).contains("airlock"),
        "{host:?}"
    );
}

fn none_mode_has_no_device_and_no_ruleset(engine: &Engine, _: &Path) {
    let mut spec = sh("true");
    spec.network = NetworkPolicy::None;
    let sb = engine
        .create(&config(&spec, None, Some(BUNDLE.as_bytes())))
        .unwrap();
    let pid = sandbox_pid(sb.id());
    assert_eq!(in_netns_of(pid, &["/usr/sbin/nft", "list", "ruleset"]).trim(), "");
    let links = in_netns_of(pid, &["ip", "-o", "link"]);
    assert!(!links.contains("airlock0"), "{links}");
    assert_eq!(in_netns_of(pid, &["ip", "-4", "route"]).trim(), "");
}

fn ca_bundle_is_bound_over_the_hosts_and_the_host_file_is_untouched(engine: &Engine, _: &Path) {
    let host_file = fs::read(CA_PATH).ok();
    let host_entries = fs::read_dir("/etc/ssl/certs").map(|d| d.count()).unwrap_or(0);
    let spec = sh(&format!(
        "cat {CA_PATH}; echo @@@; ls /etc/ssl/certs | wc -l; \
         (echo x > {CA_PATH}) 2>/dev/null && echo WROTE; test -e /.ca-stage && echo STAGE; echo end"
    ));
    let r = run(engine, &config(&spec, None, Some(BUNDLE.as_bytes())), &spec);
    let (bundle, rest) = r.stdout.split_once("@@@\n").expect("the separator");
    assert_eq!(bundle, BUNDLE);
    let entries: usize = rest.lines().next().unwrap().trim().parse().unwrap();
    // The host's other certificates are still there (its own directory, or a mirror).
    assert_eq!(entries, host_entries.max(1), "{}", r.stdout);
    assert!(
        rest.ends_with("end\n") && !rest.contains("WROTE") && !rest.contains("STAGE"),
        "{rest}"
    );
    assert_eq!(fs::read(CA_PATH).ok(), host_file, "the host's bundle changed");
}

fn without_a_bundle_the_roots_own_trust_store_stays(engine: &Engine, _: &Path) {
    let Ok(host) = fs::read_to_string(CA_PATH) else {
        eprintln!("NOTE: the host has no {CA_PATH}: skipped");
        return;
    };
    let spec = sh(&format!("cat {CA_PATH}"));
    let r = run(engine, &config(&spec, None, None), &spec);
    assert_eq!(r.stdout, host);
}

fn ca_bundle_in_an_image_without_etc_ssl_comes_through_a_mirror_of_etc(engine: &Engine, root: &Path) {
    let before = image::snapshot(root);
    let spec = sh(&format!(
        "cat {CA_PATH}; echo @@@; cat /etc/private.conf /etc/resolv.conf; ls /etc; \
         touch /etc/new 2>/dev/null && echo WROTE; echo end"
    ));
    let r = run(engine, &config(&spec, Some(root), Some(BUNDLE.as_bytes())), &spec);
    let (bundle, rest) = r.stdout.split_once("@@@\n").expect("the separator");
    assert_eq!(bundle, BUNDLE);
    // The image's own /etc and the generated files are all still there.
    assert!(rest.starts_with("private=1\nnameserver 127.0.0.1\n"), "{rest}");
    for name in ["passwd", "hosts", "private.conf", "ssl"] {
        assert!(rest.lines().any(|l| l == name), "{name} missing: {rest}");
    }
    assert!(rest.ends_with("end\n") && !rest.contains("WROTE"), "{rest}");
    assert_eq!(image::snapshot(root), before, "the image's tree changed");
}

fn ca_bundle_in_an_image_with_the_file_is_bound_over_it(engine: &Engine, _: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let root: PathBuf = image::make(dir.path());
    let certs = root.join("etc/ssl/certs");
    fs::create_dir_all(&certs).unwrap();
    fs::write(certs.join("ca-certificates.crt"), "the image's roots\n").unwrap();
    fs::write(certs.join("other.pem"), "another\n").unwrap();
    let before = image::snapshot(&root);
    let spec = sh(&format!(
        "cat {CA_PATH}; cat /etc/ssl/certs/other.pem; cat /etc/resolv.conf"
    ));
    let r = run(
        engine,
        &config(&spec, Some(&root), Some(BUNDLE.as_bytes())),
        &spec,
    );
    assert_eq!(r.stdout, format!("{BUNDLE}another\nnameserver 127.0.0.1\n"));
    assert_eq!(image::snapshot(&root), before, "the image's tree changed");
    assert_eq!(
        fs::read_to_string(certs.join("ca-certificates.crt")).unwrap(),
        "the image's roots\n"
    );
}

fn ca_bundle_with_a_rootfs_without_etc_ssl_is_created_on_the_sandboxs_own_root(engine: &Engine, root: &Path) {
    // The image's tree serves as a rootfs: its /bin, and no /etc/ssl to bind.
    let before = image::snapshot(root);
    let spec = sh(&format!(
        "cat {CA_PATH}; ls -ld /etc/ssl/certs | cut -c1-10; (echo x > {CA_PATH}) 2>/dev/null && echo WROTE; echo end"
    ));
    let mut config = config(&spec, None, Some(BUNDLE.as_bytes()));
    config.rootfs = Some(root.to_owned());
    let r = run(engine, &config, &spec);
    assert_eq!(r.stdout, format!("{BUNDLE}drwxr-xr-x\nend\n"));
    assert_eq!(image::snapshot(root), before, "the rootfs changed");
}

fn a_bundle_over_the_cap_is_refused_before_anything_is_built(engine: &Engine, _: &Path) {
    let spec = sh("true");
    let big = vec![b'x'; (8 << 20) + 1];
    match engine.create(&config(&spec, None, Some(&big))) {
        Err(SandboxError::Spec(e)) => assert_eq!(e.field, "ca_bundle", "{e}"),
        other => panic!("not refused: {other:?}"),
    }
}

fn proxy_mode_sandboxes_leave_no_fd_or_thread_behind(engine: &Engine, _: &Path) {
    let count = |dir: &str| fs::read_dir(dir).unwrap().count();
    let spec = sh("true");
    let config = config(&spec, None, Some(BUNDLE.as_bytes()));
    // One first: whatever the engine keeps for good (the zygote's socket...) is made.
    drop(engine.create(&config).unwrap());
    let (fds, threads) = (count("/proc/self/fd"), count("/proc/self/task"));
    for _ in 0..5 {
        let mut sb = engine.create(&config).unwrap();
        sb.exec(&spec, &mut Capture, &[]).unwrap();
    }
    assert_eq!(count("/proc/self/fd"), fds, "fds left behind");
    assert_eq!(count("/proc/self/task"), threads, "threads left behind");
}

type Case = fn(&Engine, &Path);

const CASES: &[(&str, Case)] = &[
    (
        "the_sandboxs_netns_has_the_documented_ruleset_and_route",
        the_sandboxs_netns_has_the_documented_ruleset_and_route,
    ),
    (
        "none_mode_has_no_device_and_no_ruleset",
        none_mode_has_no_device_and_no_ruleset,
    ),
    (
        "ca_bundle_is_bound_over_the_hosts_and_the_host_file_is_untouched",
        ca_bundle_is_bound_over_the_hosts_and_the_host_file_is_untouched,
    ),
    (
        "without_a_bundle_the_roots_own_trust_store_stays",
        without_a_bundle_the_roots_own_trust_store_stays,
    ),
    (
        "ca_bundle_in_an_image_without_etc_ssl_comes_through_a_mirror_of_etc",
        ca_bundle_in_an_image_without_etc_ssl_comes_through_a_mirror_of_etc,
    ),
    (
        "ca_bundle_in_an_image_with_the_file_is_bound_over_it",
        ca_bundle_in_an_image_with_the_file_is_bound_over_it,
    ),
    (
        "ca_bundle_with_a_rootfs_without_etc_ssl_is_created_on_the_sandboxs_own_root",
        ca_bundle_with_a_rootfs_without_etc_ssl_is_created_on_the_sandboxs_own_root,
    ),
    (
        "proxy_mode_sandboxes_leave_no_fd_or_thread_behind",
        proxy_mode_sandboxes_leave_no_fd_or_thread_behind,
    ),
    (
        "a_bundle_over_the_cap_is_refused_before_anything_is_built",
        a_bundle_over_the_cap_is_refused_before_anything_is_built,
    ),
];

fn main() {
    airlock_sandbox::maybe_run_init();
    // `cargo test -- NAME` runs the cases whose name contains NAME.
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let engine = Engine::new().expect("the namespace tier (run as root)");
    let dir = tempfile::tempdir().unwrap();
    let root: PathBuf = image::make(dir.path());
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, case) in CASES {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        let outcome = std::panic::catch_unwind(|| case(&engine, &root));
        println!(
            "test {name} ... {}",
            if outcome.is_ok() { "ok" } else { "FAILED" }
        );
        if outcome.is_err() {
            failed.push(*name);
        }
    }
    println!(
        "test result: {} passed; {} failed",
        ran - failed.len(),
        failed.len()
    );
    if !failed.is_empty() {
        eprintln!("failed: {failed:?}");
        std::process::exit(1);
    }
}
