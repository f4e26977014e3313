//! LIFECYCLE: how a run ends. The deadline kills everything, the end of the main program
//! ends the run, exit statuses follow the contract, Ctrl-C and SIGKILL of `airlock run`
//! leave nothing behind, stdin is fed as asked, init reaps zombies and is PID 1.
//! (Exit statuses, the deadline, OOM, stdin and SIGKILL of airlock as every tier handles
//! them are in tests/contract.rs.)
//!
//! Every test drives the real binary. The tests of this file run one at a time (see
//! [`common::host::serial`]) because they check host-wide state: no process with a sandbox
//! uid and no airlock cgroup of the invoking airlock process may remain after a run.

mod common;

use common::host::{airlock_run, assert_nothing_left, owner_cgroups, proc_infos, serial, wait_until};
use common::{airlock_bin, ok_stdout};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use std::collections::HashMap;
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Helpers (local to this file; the shared ones live in common/mod.rs and common/host.rs).
// ---------------------------------------------------------------------------------------

/// Waits at most `limit` for `child` to exit.
fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Live (non-zombie) descendants of `root`, with their command names.
fn descendants(root: u32) -> Vec<(u32, String)> {
    let infos = proc_infos();
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (pid, info) in &infos {
        children.entry(info.ppid).or_default().push(*pid);
    }
    let mut found = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for pid in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            let info = &infos[pid];
            todo.push(*pid);
            if info.state != 'Z' {
                found.push((*pid, info.name.clone()));
            }
        }
    }
    found
}

/// Whether `pid` is a live (non-zombie) process.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 1..].trim_start().starts_with('Z')))
        .is_some_and(|zombie| !zombie)
}

/// Starts `airlock run -- sleep 100` and waits until the program runs in the sandbox;
/// returns the child and the processes (init, sleep) it has below it.
fn start_sleeper() -> (Child, Vec<(u32, String)>) {
    let mut child = Command::new(airlock_bin())
        .args(["run", "--timeout", "60s", "--", "sleep", "100"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn airlock");
    let pid = child.id();
    let started = wait_until(Duration::from_secs(15), || {
        descendants(pid).iter().any(|(_, c)| c == "sleep")
    });
    if !started {
        let _ = child.kill();
        let out = child.wait_with_output().expect("wait airlock");
        panic!("`sleep 100` never showed up below airlock pid {pid}: {out:?}");
    }
    let procs = descendants(pid);
    (child, procs)
}

fn read_pipe(pipe: Option<impl Read>) -> String {
    let mut s = String::new();
    if let Some(mut p) = pipe {
        let _ = p.read_to_string(&mut s);
    }
    s
}

// ---------------------------------------------------------------------------------------
// The deadline kills everything.
// ---------------------------------------------------------------------------------------

/// `--timeout 1s` around `argv`: a timeout result within 5 s and nothing left behind.
fn assert_deadline_kills(argv: &[&str]) {
    let _guard = serial();
    let mut args = vec!["--json", "--timeout", "1s", "--"];
    args.extend_from_slice(argv);
    let run = airlock_run(&args);
    let v = run.json();
    assert_eq!(v["outcome"], "timeout", "{v:#}");
    assert_eq!(v["timed_out"], true, "{v:#}");
    assert!(v["exit_code"].is_null(), "{v:#}");
    // Not early: the program had (nearly) its whole second.
    let wall = v["wall_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("no wall_ms: {v:#}"));
    assert!(
        wall >= 900.0,
        "killed after {wall} ms, before the 1 s deadline: {v:#}"
    );
    assert!(
        run.elapsed < Duration::from_secs(5),
        "a 1 s deadline came back after {:?}: {v:#}",
        run.elapsed
    );
    assert_nothing_left(run.pid);
}

#[test]
fn deadline_kills_a_sleeping_program() {
    assert_deadline_kills(&["sleep", "100"]);
}

#[test]
fn deadline_kills_a_program_that_ignores_sigterm() {
    assert_deadline_kills(&[
        "python3",
        "-c",
        "import os, signal, time\n\
         signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
         signal.signal(signal.SIGINT, signal.SIG_IGN)\n\
         signal.signal(signal.SIGHUP, signal.SIG_IGN)\n\
         if os.fork() == 0:\n    \
             while True: time.sleep(1)\n\
         while True: time.sleep(1)\n",
    ]);
}

#[test]
fn deadline_kills_a_stopped_program() {
    assert_deadline_kills(&["sh", "-c", "sleep 100 & kill -STOP $$; echo never"]);
}

#[test]
fn deadline_kills_double_forked_daemons() {
    assert_deadline_kills(&[
        "sh",
        "-c",
        "setsid sh -c 'sleep 100' &\n\
         (setsid sh -c 'sleep 100 & sleep 100' &)\n\
         (sh -c 'trap \"\" TERM HUP INT; sleep 100' &)\n\
         wait; sleep 100",
    ]);
}

// ---------------------------------------------------------------------------------------
// The end of the main program ends the run.
// ---------------------------------------------------------------------------------------

#[test]
fn background_child_holding_stdout_does_not_delay_the_result() {
    let _guard = serial();
    let run = airlock_run(&[
        "--json",
        "--timeout",
        "30s",
        "--",
        "sh",
        "-c",
        "sleep 100 & echo done",
    ]);
    let v = run.json();
    assert_eq!(ok_stdout(&v), "done\n");
    assert!(
        run.elapsed < Duration::from_secs(3),
        "took {:?}: {v:#}",
        run.elapsed
    );
    assert_nothing_left(run.pid);

    // The same without --json: the output streams through airlock, whose own stdout
    // must be closed when it exits, not held by the stray sleep.
    let run = airlock_run(&["--timeout", "30s", "--", "sh", "-c", "sleep 100 & echo done"]);
    assert_eq!(run.code(), Some(0), "{run:#?}");
    assert_eq!(run.stdout(), "done\n");
    assert!(run.elapsed < Duration::from_secs(3), "took {:?}", run.elapsed);
    assert_nothing_left(run.pid);
}

#[test]
fn stray_background_processes_die_with_the_main_program() {
    let _guard = serial();
    // Writers in the background keep the pipes busy, a setsid'd one sits in its own
    // session, one ignores every catchable signal.
    let script = "(while :; do echo tick; sleep 0.05; done) &\n\
                  (while :; do echo tock >&2; sleep 0.05; done) &\n\
                  setsid sh -c 'sleep 100' &\n\
                  (trap '' TERM HUP INT; sleep 100) &\n\
                  sleep 0.3; echo main done";
    let run = airlock_run(&["--json", "--timeout", "30s", "--", "sh", "-c", script]);
    let v = run.json();
    assert_eq!(v["outcome"], "exited", "{v:#}");
    assert_eq!(v["exit_code"], 0, "{v:#}");
    assert!(v["stdout"].as_str().unwrap().contains("main done"), "{v:#}");
    assert!(
        run.elapsed < Duration::from_secs(5),
        "took {:?}: {v:#}",
        run.elapsed
    );
    assert_nothing_left(run.pid);
}

// ---------------------------------------------------------------------------------------
// Exit statuses.
// ---------------------------------------------------------------------------------------

#[test]
fn exit_code_is_passed_through() {
    let _guard = serial();
    for code in [0, 1, 3, 42, 255] {
        let run = airlock_run(&["--", "sh", "-c", &format!("exit {code}")]);
        assert_eq!(run.code(), Some(code), "{run:#?}");
        assert_nothing_left(run.pid);
    }
}

// ---------------------------------------------------------------------------------------
// airlock itself interrupted or killed.
// ---------------------------------------------------------------------------------------

#[test]
fn ctrl_c_ends_the_run_and_purges_the_sandbox() {
    let _guard = serial();
    let (mut child, procs) = start_sleeper();
    let pid = child.id();
    assert!(
        !owner_cgroups(pid).is_empty(),
        "no cgroup under /sys/fs/cgroup/*/airlock/{pid}-* while running"
    );
    let start = Instant::now();
    kill(Pid::from_raw(pid as i32), Signal::SIGINT).expect("SIGINT airlock");
    let Some(status) = wait_timeout(&mut child, Duration::from_secs(5)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("airlock did not exit within 5 s of SIGINT");
    };
    let stderr = read_pipe(child.stderr.take());
    assert_eq!(status.code(), Some(130), "status {status:?}, stderr: {stderr}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    let left: Vec<_> = procs.iter().filter(|(p, _)| alive(*p)).collect();
    assert!(left.is_empty(), "sandbox processes survived Ctrl-C: {left:?}");
    assert_nothing_left(pid);
}

// ---------------------------------------------------------------------------------------
// stdin.
// ---------------------------------------------------------------------------------------

#[test]
fn stdin_from_airlocks_own_stdin() {
    let _guard = serial();
    let v = common::TestCommand::run()
        .args(["--stdin", "-"])
        .stdin("piped in\nsecond\n")
        .json(&["cat"]);
    assert_eq!(ok_stdout(&v), "piped in\nsecond\n");
}

#[test]
fn stdin_is_empty_by_default() {
    let _guard = serial();
    // airlock's own stdin is a pipe that stays open: the program must not see it.
    let start = Instant::now();
    let mut child = Command::new(airlock_bin())
        .args(["run", "--json", "--timeout", "20s", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn airlock");
    let held_open = child.stdin.take();
    let status = wait_timeout(&mut child, Duration::from_secs(5));
    if status.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("wait airlock");
    drop(held_open);
    assert!(
        status.is_some(),
        "`cat` did not get EOF at once (still running after 5 s)"
    );
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(ok_stdout(&v), "");
    assert!(start.elapsed() < Duration::from_secs(5));
}

// ---------------------------------------------------------------------------------------
// Init: PID 1, reaps zombies.
// ---------------------------------------------------------------------------------------

/// Scans /proc inside the sandbox and prints the zombies found.
const COUNT_ZOMBIES: &str = "
def zombies():
    found = []
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                stat = open(f'/proc/{p}/stat').read()
            except OSError:
                continue
            if stat.rsplit(')', 1)[1].split()[0] == 'Z':
                found.append(stat.strip())
    return found
";

#[test]
fn orphaned_zombies_are_reaped_by_init() {
    let _guard = serial();
    // Each child forks a grandchild and exits (reaped by the program); the grandchildren
    // exit shortly after, re-parented to PID 1, which must reap them.
    let code = format!(
        "import os, time\n{COUNT_ZOMBIES}\n\
         for _ in range(10):\n    \
             pid = os.fork()\n    \
             if pid == 0:\n        \
                 if os.fork() == 0:\n            \
                     time.sleep(0.1)\n            \
                     os._exit(0)\n        \
                 os._exit(0)\n    \
             os.waitpid(pid, 0)\n\
         time.sleep(1.5)\n\
         z = zombies()\n\
         print(len(z), z)\n"
    );
    let run = airlock_run(&["--json", "--", "python3", "-c", &code]);
    let v = run.json();
    assert_eq!(ok_stdout(&v), "0 []\n", "{v:#}");
    assert_nothing_left(run.pid);
}

#[test]
fn children_left_unwaited_do_not_outlive_the_program() {
    let _guard = serial();
    // The program forks children (some exit at once, some linger) and never waits.
    let code = "import os, time\n\
                for i in range(8):\n    \
                    if os.fork() == 0:\n        \
                        time.sleep(0.05 if i % 2 else 100)\n        \
                        os._exit(0)\n\
                time.sleep(0.3)\n\
                print('parent exits')\n";
    let run = airlock_run(&["--json", "--timeout", "30s", "--", "python3", "-c", code]);
    let v = run.json();
    assert_eq!(ok_stdout(&v), "parent exits\n", "{v:#}");
    assert!(run.elapsed < Duration::from_secs(5), "took {:?}", run.elapsed);
    assert_nothing_left(run.pid);
}

#[test]
fn init_is_pid_1() {
    let _guard = serial();
    let run = airlock_run(&[
        "--json",
        "--",
        "sh",
        "-c",
        "tr '\\0' ' ' < /proc/1/cmdline; echo; echo $$",
    ]);
    let v = run.json();
    let out = ok_stdout(&v);
    let mut lines = out.lines();
    let cmdline = lines.next().unwrap_or_default();
    let own_pid = lines.next().unwrap_or_default();
    assert!(
        cmdline.contains(airlock_sandbox::INIT_ARG),
        "PID 1 is not airlock's init: {cmdline:?}"
    );
    assert_ne!(own_pid.trim(), "1", "the program itself is PID 1");
    assert_nothing_left(run.pid);
}
