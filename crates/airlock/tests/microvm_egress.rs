//! Proxy mode in a micro-VM (`airlock run --isolation microvm --net proxy`), for real:
//! the VM has no network device; the program's connections to 127.0.0.1:3128 in its
//! sandbox cross the VM's egress port to airlock's proxy on the host. As in `egress.rs`,
//! airlock runs inside a network namespace of the test's own whose loopback carries the
//! fake "remote" hosts (10.9.9.9 allowed, 203.0.113.7 not, a fake metadata server on
//! 169.254.169.254): nothing leaves it. Under TCG each run takes seconds, so there are
//! few tests, one at a time, with generous limits.

mod common;
mod egressutil;

use common::host::{owner_cgroups, proc_infos, serial, wait_until};
use egressutil::{ALLOWED, API, METADATA, Net, PRELUDE, Serve, egress, in_netns};
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Runs `code` (after [`PRELUDE`]) with python3 in a micro-VM in proxy mode with
/// 10.9.9.9 allowed; returns airlock's pid, the ExecResult and the program's `out`.
fn vm_python(net: &Net, code: &str) -> (u32, Value, Value) {
    let program = format!("{PRELUDE}\n{code}\nprint(json.dumps(out))\n");
    let t0 = Instant::now();
    let mut cmd = net.airlock();
    // `unshare` and `nsenter` exec in place: the child's pid is airlock's.
    cmd.args(["run", "--isolation", "microvm", "--net", "proxy", "--allow-cidr"])
        .arg(format!("{ALLOWED}/32"))
        .args(["--timeout", "120s", "--json", "--", "python3", "-c", &program])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn airlock");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for airlock");
    eprintln!("airlock run took {:?}", t0.elapsed());
    assert!(
        out.status.success(),
        "airlock failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(v["exit_code"], 0, "the program failed: {v:#}");
    let stdout = v["stdout"].as_str().unwrap_or_default();
    let printed: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("the program printed no JSON ({e}): {v:#}"));
    (pid, v, printed)
}

/// Nothing of airlock process `pid` (exited) remains: VMM processes, cgroups, state
/// directories.
#[track_caller]
fn assert_vm_gone(pid: u32) {
    let owner = format!("/airlock/{pid}-");
    let vmms = || {
        proc_infos()
            .into_iter()
            .filter(|(vmm, p)| {
                p.uid >= airlock_microvm::VMM_UID_BASE
                    && p.state != 'Z'
                    && std::fs::read_to_string(format!("/proc/{vmm}/cgroup"))
                        .is_ok_and(|c| c.contains(&owner))
            })
            .map(|(vmm, p)| format!("{vmm}: {p}"))
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(Duration::from_secs(5), || vmms().is_empty()),
        "VMM processes remain: {:?}",
        vmms()
    );
    assert!(
        owner_cgroups(pid).is_empty(),
        "cgroups left: {:?}",
        owner_cgroups(pid)
    );
    let prefix = format!("{pid}-");
    let states: Vec<_> = std::fs::read_dir("/run/airlock/vm")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    assert!(states.is_empty(), "state left: {states:?}");
}

#[test]
fn an_allowed_host_is_reached_and_denied_ones_get_the_proxys_answer() {
    let _g = serial();
    let net = Net::start();
    let (pid, v, out) = vm_python(
        &net,
        r#"
out["env"] = os.environ.get("HTTPS_PROXY")
out["interfaces"] = interfaces()
out["hello"] = urlopen("http://10.9.9.9/hello")
# More than a window (256 KiB) each way: the port's flow control, both directions.
status, body = urlopen("http://10.9.9.9/bytes/1000000")
out["big"] = [status, len(body), body == "x" * 1000000]
req = urllib.request.Request("http://10.9.9.9/upload", data=b"u" * 600000, method="POST")
with urllib.request.urlopen(req, timeout=60) as r:
    out["post"] = [r.status, r.read().decode()]
out["api"] = urlopen("http://203.0.113.7/")
out["metadata"] = urlopen("http://169.254.169.254/latest/meta-data/")
status, tunnel, body = proxy_connect("169.254.169.254:443")
out["connect_metadata"] = [status, body]
out["direct"] = direct("169.254.169.254", 80)
"#,
    );
    assert_eq!(out["env"], "http://127.0.0.1:3128", "{v:#}");
    assert_eq!(out["interfaces"], json!(["lo"]), "{v:#}");
    assert_eq!(out["hello"], json!([200, "hello from allowed\n"]), "{v:#}");
    assert_eq!(out["big"], json!([200, 1000000, true]), "{v:#}");
    assert_eq!(out["post"], json!([200, "allowed got 600000 bytes\n"]), "{v:#}");
    assert_eq!(out["api"][0], 403, "{v:#}");
    assert_eq!(
        out["metadata"],
        json!([403, "link-local address 169.254.169.254\n"]),
        "{v:#}"
    );
    assert_eq!(
        out["connect_metadata"],
        json!(["HTTP/1.1 403 Forbidden", "link-local address 169.254.169.254\n"]),
        "{v:#}"
    );
    // No route but the proxy: the sandbox's loopback is all there is.
    assert_eq!(out["direct"], "ENETUNREACH", "{v:#}");

    let log = egress(&v);
    let entry = |host: &str| {
        log.iter()
            .filter(|e| e["host"] == host)
            .cloned()
            .collect::<Vec<_>>()
    };
    let allowed = entry(ALLOWED);
    assert_eq!(allowed.len(), 3, "{log:#?}");
    for e in &allowed {
        assert_eq!(e["allowed"], true, "{e:#}");
        assert_eq!(e["reason"], "allowed by allow_cidrs 10.9.9.9/32", "{e:#}");
    }
    assert!(
        allowed[1]["bytes_down"].as_u64().unwrap() >= 1_000_000,
        "{log:#?}"
    );
    assert!(allowed[2]["bytes_up"].as_u64().unwrap() >= 600_000, "{log:#?}");
    let api = entry(API);
    assert_eq!(api.len(), 1, "{log:#?}");
    assert_eq!(api[0]["allowed"], false, "{log:#?}");
    // The program was told why, in the proxy's words.
    let reason = api[0]["reason"].as_str().unwrap_or_default();
    assert_eq!(out["api"][1], format!("{reason}\n"), "{log:#?}");
    let metadata = entry(METADATA);
    assert_eq!(metadata.len(), 2, "{log:#?}");
    for e in &metadata {
        assert_eq!(e["allowed"], false, "{e:#}");
        assert_eq!(e["reason"], "link-local address 169.254.169.254", "{e:#}");
    }
    assert_eq!(net.connections_to("allowed"), 3, "{:?}", net.connections());
    assert_eq!(net.connections_to("api"), 0, "{:?}", net.connections());
    net.assert_no_forbidden_connections();
    assert_vm_gone(pid);
}

/// (status, parsed body) of one request.
fn http(method: &str, url: &str, body: Option<&Value>) -> (u16, Value) {
    let req = ureq::request(method, url).timeout(Duration::from_secs(180));
    let res = match body {
        Some(b) => req
            .set("Content-Type", "application/json")
            .send_string(&b.to_string()),
        None => req.call(),
    };
    match res {
        Ok(r) | Err(ureq::Error::Status(_, r)) => {
            let status = r.status();
            let text = r.into_string().unwrap_or_default();
            (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
        }
        Err(e) => panic!("{method} {url}: {e}"),
    }
}

#[test]
fn the_service_runs_microvm_execs_and_sessions_in_proxy_mode() {
    let _g = serial();
    let net = Net::start();
    // One pooled VM: a clone of a template, so proxy mode works on the pool's VMs too.
    let mut daemon = Serve::start(&net, &["--pool", "0", "--vm-pool", "1"], Duration::from_secs(120));
    let pid = daemon.pid();
    let base = format!("http://127.0.0.1:{}", daemon.port);
    let program = format!(
        "{PRELUDE}\n{}\nprint(json.dumps(out))\n",
        r#"
out["allowed"] = urlopen("http://10.9.9.9/hello")
out["metadata"] = urlopen("http://169.254.169.254/latest/meta-data/")
"#
    );
    let network = json!({"mode": "proxy", "allow_cidrs": ["10.9.9.9/32"]});
    let exec = json!({"cmd": ["python3", "-c", program], "isolation": "microvm", "network": network});
    let session_exec = json!({"cmd": ["python3", "-c", program]});
    let (one_shot, session) = in_netns(&net, || {
        let ready = egressutil::poll(Duration::from_secs(240), || {
            (http("GET", &format!("{base}/readyz"), None).0 == 200).then_some(())
        });
        assert!(ready.is_some(), "/readyz never answered 200");
        let one_shot = http("POST", &format!("{base}/v1/exec"), Some(&exec));
        let created = http(
            "POST",
            &format!("{base}/v1/sandboxes"),
            Some(&json!({"isolation": "microvm", "network": network})),
        );
        assert_eq!(created.0, 201, "{:#}", created.1);
        let id = created.1["id"].as_str().unwrap().to_owned();
        let url = format!("{base}/v1/sandboxes/{id}/exec");
        let session = [
            http("POST", &url, Some(&session_exec)),
            http("POST", &url, Some(&session_exec)),
        ];
        assert_eq!(http("DELETE", &format!("{base}/v1/sandboxes/{id}"), None).0, 204);
        (one_shot, session)
    });
    for (status, v) in std::iter::once(&one_shot).chain(&session) {
        assert_eq!(*status, 200, "{v:#}");
        assert_eq!(v["exit_code"], 0, "{v:#}");
        let out: Value = serde_json::from_str(v["stdout"].as_str().unwrap().trim()).expect("out");
        assert_eq!(out["allowed"], json!([200, "hello from allowed\n"]), "{v:#}");
        assert_eq!(
            out["metadata"],
            json!([403, "link-local address 169.254.169.254\n"]),
            "{v:#}"
        );
        // Each exec's own log: one allowed entry, one denied.
        let log = egress(v);
        assert_eq!(log.len(), 2, "{v:#}");
        assert_eq!(
            (log[0]["host"].clone(), log[0]["allowed"].clone()),
            (json!(ALLOWED), json!(true))
        );
        assert_eq!(
            (log[1]["host"].clone(), log[1]["allowed"].clone()),
            (json!(METADATA), json!(false))
        );
    }
    assert_eq!(net.connections_to("allowed"), 3, "{:?}", net.connections());
    net.assert_no_forbidden_connections();
    daemon.stop();
    assert_vm_gone(pid);
}
