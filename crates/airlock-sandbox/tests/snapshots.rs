//! Snapshots on the namespace tier, driving real sandboxes: an exec's `files_changed`, the
//! export of one sandbox's files imported into another, pause and resume, and a hostile
//! program racing the host's walks. The sandbox's init is this test binary re-executed
//! (`harness = false`). `cargo test -p airlock-sandbox --test snapshots -- NAME` runs the
//! cases whose name contains NAME.

use airlock_backend::Stdio;
use airlock_sandbox::{Capture, Engine, Sandbox, SandboxConfig, SandboxError};
use airlock_spec::{Change, ExecResult, FileChange, FileKind, Spec};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn sh(script: &str) -> Spec {
    Spec::new(vec!["/bin/sh".into(), "-c".into(), script.into()])
}

fn session(engine: &Engine) -> Sandbox {
    engine.create(&SandboxConfig::of(&sh("true"))).expect("a sandbox")
}

fn run(sb: &mut Sandbox, spec: &Spec) -> ExecResult {
    let r = sb.exec(spec, &mut Capture, &[]).expect("exec");
    assert_eq!(r.exit_code, Some(0), "{r:#?}");
    r
}

/// `(path, change, kind)` of each entry, sizes aside.
fn changes(r: &ExecResult) -> Vec<(String, Change, FileKind)> {
    r.files_changed
        .iter()
        .map(|c| (c.path.clone(), c.change, c.kind))
        .collect()
}

fn c(path: &str, change: Change, kind: FileKind) -> (String, Change, FileKind) {
    (path.to_string(), change, kind)
}

fn changeset_names_what_an_exec_changed(engine: &Engine) {
    use Change::*;
    use FileKind::*;
    let mut sb = session(engine);
    let r = run(
        &mut sb,
        &sh(
            "echo a > a; echo bb > b; echo c > c; mkdir -p d/e; echo f > d/e/f; ln -s /etc/passwd l; echo t > /tmp/t",
        ),
    );
    assert_eq!(
        changes(&r),
        vec![
            c("/workspace/a", Created, File),
            c("/workspace/b", Created, File),
            c("/workspace/c", Created, File),
            c("/workspace/d", Created, Dir),
            c("/workspace/d/e", Created, Dir),
            c("/workspace/d/e/f", Created, File),
            c("/workspace/l", Created, Symlink),
        ],
        "/tmp only when asked"
    );
    assert!(!r.files_changed_truncated);
    assert_eq!(
        r.files_changed[1],
        FileChange {
            path: "/workspace/b".into(),
            change: Created,
            kind: File,
            bytes: 3
        }
    );

    // Nothing changed: nothing listed (the last exec's scan serves as this one's before).
    let r = run(&mut sb, &sh("cat a b > /dev/null"));
    assert_eq!(changes(&r), vec![]);
    assert_eq!(sb.watches_changes(), engine.watches_changes());
    eprintln!("watched for changes: {}", sb.watches_changes());

    // Writes through a shared mapping report no write event: still seen.
    let r = run(
        &mut sb,
        &sh(
            "sleep 0.02; python3 -c 'import mmap,os\nf=os.open(\"b\",os.O_RDWR)\nm=mmap.mmap(f,3)\nos.close(f)\nm[0:1]=b\"X\"\nm.flush()'",
        ),
    );
    assert_eq!(changes(&r), vec![c("/workspace/b", Modified, File)]);
    let r = run(&mut sb, &sh("cat b"));
    assert_eq!(r.stdout, "Xb\n");
    assert_eq!(changes(&r), vec![]);

    // Modified (same size too), deleted, renamed, a mode change, a kind change.
    let r = run(
        &mut sb,
        &sh("sleep 0.02; echo BB > b; rm c; mv a a2; chmod 600 d/e/f; rm l; mkdir l"),
    );
    assert_eq!(
        changes(&r),
        vec![
            c("/workspace/a", Deleted, File),
            c("/workspace/a2", Created, File),
            c("/workspace/b", Modified, File),
            c("/workspace/c", Deleted, File),
            c("/workspace/d/e/f", Modified, File),
            c("/workspace/l", Modified, Dir),
        ]
    );

    // /tmp when asked; nothing when asked for nothing.
    let mut spec = sh("echo u > /tmp/u; echo w > w");
    spec.files_changed_in = vec!["/workspace".into(), "/tmp".into()];
    let r = run(&mut sb, &spec);
    assert_eq!(
        changes(&r),
        vec![c("/tmp/u", Created, File), c("/workspace/w", Created, File)]
    );
    let mut spec = sh("echo x > x");
    spec.files_changed_in = vec![];
    assert_eq!(changes(&run(&mut sb, &spec)), vec![]);
    // The next exec scans afresh (what the last one did is not in its before).
    assert_eq!(
        changes(&run(&mut sb, &sh("rm x"))),
        vec![c("/workspace/x", Deleted, File)]
    );

    // A file written through the API between execs is not the next exec's change.
    sb.write_file("api.txt", 0o644, b"api").unwrap();
    assert_eq!(changes(&run(&mut sb, &sh("true"))), vec![]);

    // The spec's own files are there before the program: not its changes either.
    let mut spec = sh("echo more >> given.txt");
    spec.files = vec![airlock_spec::FileSpec {
        path: "given.txt".into(),
        mode: 0o644,
        content: b"given\n".to_vec(),
    }];
    assert_eq!(
        changes(&run(&mut sb, &spec)),
        vec![c("/workspace/given.txt", Modified, File)]
    );

    // A one-shot run (its init is gone when the tree is scanned after the program).
    let r = engine
        .run(&sh("mkdir out; echo r > out/report.csv"), &mut Capture, &[])
        .unwrap();
    assert_eq!(
        changes(&r),
        vec![
            c("/workspace/out", Created, Dir),
            c("/workspace/out/report.csv", Created, File)
        ]
    );
    // A pooled sandbox (built ahead) used once.
    let mut pooled = engine.create_ahead(&SandboxConfig::of(&sh("true"))).unwrap();
    let r = pooled.exec_once(&sh("echo p > p"), &mut Capture, &[]).unwrap();
    assert_eq!(changes(&r), vec![c("/workspace/p", Created, File)]);
}

fn changeset_is_capped(engine: &Engine) {
    let mut sb = session(engine);
    let r = run(
        &mut sb,
        &sh("i=0; while [ $i -lt 1200 ]; do : > f$i; i=$((i+1)); done"),
    );
    assert!(r.files_changed_truncated);
    assert_eq!(r.files_changed.len(), airlock_spec::MAX_FILES_CHANGED);
    assert!(r.files_changed.windows(2).all(|w| w[0].path < w[1].path));
}

/// The tree as a program in the sandbox sees it: every path with its kind, mode, size,
/// owner, link target, and each file's md5.
const LISTING: &str = "cd / && find workspace tmp dev/shm -mindepth 1 -printf '%p %y %m %s %U:%G %l\\n' | sort; find workspace tmp dev/shm -type f -exec md5sum {} + | sort";

fn listing(sb: &mut Sandbox) -> String {
    run(sb, &sh(LISTING)).stdout
}

fn export(sb: &mut Sandbox) -> Vec<u8> {
    let mut tar = Vec::new();
    sb.export_files(&mut tar, &[]).expect("export");
    tar
}

fn export_of_one_session_imports_into_another(engine: &Engine) {
    let mut a = session(engine);
    run(
        &mut a,
        &sh(
            "echo hello > plain.txt; printf '#!/bin/sh\\necho hi\\n' > run.sh; chmod 750 run.sh; \
             mkdir -p deep/er empty-dir ro; echo leaf > deep/er/leaf; echo in > ro/in; chmod 555 ro; \
             ln -s plain.txt rel; ln -s /nonexistent dangling; ln -s /etc/passwd host; \
             head -c 100000 /dev/urandom > big.bin; echo t > /tmp/t; mkdir /tmp/td; echo s > /dev/shm/s; \
             touch -d '2001-02-03 04:05:06' plain.txt deep/er",
        ),
    );
    let before = listing(&mut a);
    assert!(before.contains("workspace/host l 777"), "{before}");
    let tar = export(&mut a);
    run(&mut a, &sh("echo late > late.txt; rm plain.txt"));

    let mut b = session(engine);
    run(
        &mut b,
        &sh("echo old > old.txt; mkdir olddir; echo o > /tmp/old; echo o > /dev/shm/old"),
    );
    b.import_files(&mut &tar[..], &[]).expect("import");
    let after = listing(&mut b);
    assert_eq!(after, before, "the imported tree is the exported one");
    let r = run(
        &mut b,
        &sh("stat -c '%Y' plain.txt deep/er; ./run.sh; readlink host; cat rel"),
    );
    assert_eq!(r.stdout, "981173106\n981173106\nhi\n/etc/passwd\nhello\n");
    // The sandbox user owns it all and can change it.
    run(&mut b, &sh("chmod 755 ro && rm -r ro deep && echo x > /tmp/t"));

    // An import cut short for want of room says so, and the sandbox goes on.
    let mut small_spec = sh("true");
    small_spec.limits.disk_bytes = 64 * 1024;
    let mut small = engine.create(&SandboxConfig::of(&small_spec)).unwrap();
    match small.import_files(&mut &tar[..], &[]) {
        Err(SandboxError::DiskFull(d)) => assert_eq!(d.disk_bytes, 64 * 1024),
        other => panic!("expected DiskFull, got {other:?}"),
    }
    run(&mut small, &sh("true"));
}

fn counter(sb: &mut Sandbox) -> u64 {
    let tar = export(sb);
    let mut ar = tar::Archive::new(&tar[..]);
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path_bytes().as_ref() == b"workspace/counter" {
            let mut s = String::new();
            e.read_to_string(&mut s).unwrap();
            return s.trim().parse().unwrap_or(0);
        }
    }
    0
}

fn a_paused_sandbox_makes_no_progress(engine: &Engine) {
    let mut sb = session(engine);
    let spawned = sb
        .spawn(
            &sh("i=0; while :; do i=$((i+1)); echo $i > counter.tmp; mv counter.tmp counter; sleep 0.005; done"),
            Stdio::Pipes,
        )
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(5);
    while counter(&mut sb) < 3 {
        assert!(Instant::now() < deadline, "the counter never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    sb.pause().unwrap();
    sb.pause().unwrap(); // idempotent
    let frozen = counter(&mut sb);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(counter(&mut sb), frozen, "the counter grew while paused");
    for refused in [
        sb.exec(&sh("true"), &mut Capture, &[]).map(drop),
        sb.read_file("counter", 100).map(drop),
        sb.write_file("x", 0o644, b"x"),
        sb.list_files().map(drop),
        sb.spawn(&sh("true"), Stdio::Pipes).map(drop),
    ] {
        match refused {
            Err(SandboxError::Spec(e)) => {
                assert_eq!((e.field.as_str(), e.message.as_str()), ("sandbox", "is paused"))
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    sb.resume().unwrap();
    sb.resume().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while counter(&mut sb) <= frozen {
        assert!(
            Instant::now() < deadline,
            "the counter did not go on after resume"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    run(&mut sb, &sh("test -s counter"));
    // Dropping a paused sandbox purges it all the same.
    sb.pause().unwrap();
    drop(spawned);
    drop(sb);
}

/// A directory of the host the test made, as bait: the sandbox's program points symlinks
/// at it; the host's walks must never read, write or remove anything in it.
struct Bait(PathBuf);

impl Bait {
    fn new() -> Bait {
        let dir = PathBuf::from(format!("/var/tmp/airlock-snapshot-bait-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("secret"), "BAIT-SECRET-CONTENT").unwrap();
        std::fs::write(dir.join("sub/secret2"), "BAIT-SECRET-CONTENT").unwrap();
        Bait(dir)
    }

    fn listing(&self) -> Vec<(PathBuf, Vec<u8>)> {
        fn walk(p: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
            for e in std::fs::read_dir(p).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    out.push((p.clone(), vec![]));
                    walk(&p, out);
                } else {
                    out.push((p.clone(), std::fs::read(&p).unwrap()));
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.0, &mut out);
        out.sort();
        out
    }
}

impl Drop for Bait {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn a_hostile_program_racing_the_walks_never_reaches_the_host(engine: &Engine) {
    let bait = Bait::new();
    let seen = bait.listing();
    let b = bait.0.display().to_string();
    let mut sb = session(engine);
    // Swaps directories (with files in them) and symlinks to the bait, as fast as it can,
    // at the top of /workspace, below it, and in /tmp.
    let race = format!(
        "while :; do \
           mkdir -p r/d; echo in > r/d/f; mv -T r/d r/old; ln -sfn {b} r/d; rm -rf r/old; \
           mv -T r/d r/gone 2>/dev/null; rm -f r/gone; \
           mkdir -p top; echo x > top/secret; mv -T top top.old; ln -sfn {b} top; rm -rf top.old; rm -f top; \
           ln -sfn {b} /tmp/link; rm -f /tmp/link; mkdir -p /tmp/link; rmdir /tmp/link; \
         done"
    );
    let spawned = sb.spawn(&sh(&race), Stdio::Pipes).expect("spawn");
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    let (mut exports, mut imported, mut refused, mut links_seen) = (0, 0, 0, 0);
    // An import whose directories the program swaps for symlinks to the bait meanwhile.
    let mut evil = tar::Builder::new(Vec::new());
    for dir in ["workspace/r", "workspace/r/d", "workspace/top"] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        evil.append_data(&mut h, dir, std::io::empty()).unwrap();
    }
    for file in [
        "workspace/r/d/planted",
        "workspace/top/planted",
        "tmp/link/planted",
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(7);
        evil.append_data(&mut h, file, &b"planted"[..]).unwrap();
    }
    let evil = evil.into_inner().unwrap();
    while t0.elapsed() < Duration::from_secs(3) {
        let mut tar = Vec::new();
        sb.export_files(&mut tar, &[]).expect("export under the race");
        assert!(
            !contains(&tar, b"BAIT-SECRET-CONTENT"),
            "the export read the host's bait"
        );
        exports += 1;
        // Imports may fail on the race (a path swapped for a symlink is refused): never
        // by writing through it.
        match sb.import_files(&mut &evil[..], &[]) {
            Ok(()) => imported += 1,
            Err(_) => refused += 1,
        }
        // The race is on: the program's symlinks to the bait show up as symlinks.
        if contains(&tar, b.as_bytes()) {
            links_seen += 1;
        }
        assert_eq!(bait.listing(), seen, "the host's bait changed");
    }
    drop(spawned);
    eprintln!(
        "{exports} exports ({links_seen} with a symlink to the bait), {imported} imports done, {refused} refused"
    );
    assert!(exports > 3, "{exports} exports");
    assert!(links_seen > 0, "the race never showed in an export");
    // files_changed under the same race: the scan stays in the tmpfs.
    let r = sb.exec(&sh("true"), &mut Capture, &[]).unwrap();
    assert!(
        r.files_changed.iter().all(|c| c.path.starts_with("/workspace/")),
        "{r:#?}"
    );
    assert_eq!(bait.listing(), seen, "the host's bait changed");
}

type Case = fn(&Engine);

const CASES: &[(&str, Case)] = &[
    (
        "changeset_names_what_an_exec_changed",
        changeset_names_what_an_exec_changed,
    ),
    ("changeset_is_capped", changeset_is_capped),
    (
        "export_of_one_session_imports_into_another",
        export_of_one_session_imports_into_another,
    ),
    (
        "a_paused_sandbox_makes_no_progress",
        a_paused_sandbox_makes_no_progress,
    ),
    (
        "a_hostile_program_racing_the_walks_never_reaches_the_host",
        a_hostile_program_racing_the_walks_never_reaches_the_host,
    ),
];

fn main() {
    airlock_sandbox::maybe_run_init();
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let engine = Engine::new().expect("the namespace tier (run as root)");
    engine.start_zygote().expect("the zygote");
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, case) in CASES {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        let outcome = std::panic::catch_unwind(|| case(&engine));
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
