//! The namespace tier with an image's prepared tree as the sandbox's root, on the real
//! kernel (run as root). The sandbox's init is this test binary re-executed, so the
//! binary has its own `main` (`harness = false`) that serves as init first; each case
//! runs in turn and a failure is reported by name.

#[path = "common/image.rs"]
mod image;

use airlock_backend::{Backend, Capture, ErrorKind, ImageRoot, Purpose, Shape};
use airlock_sandbox::Engine;
use airlock_spec::{ExecResult, Spec};
use std::path::{Path, PathBuf};

fn sh(script: &str) -> Spec {
    Spec::new(vec!["/bin/sh".into(), "-c".into(), script.into()])
}

fn shape(spec: &Spec, root: &Path) -> Shape {
    let mut shape = Shape::of(spec);
    shape.image = Some(ImageRoot {
        digest: "sha256:test".into(),
        root: root.to_owned(),
    });
    shape
}

fn run_in(engine: &Engine, root: &Path, spec: &Spec) -> Result<ExecResult, airlock_backend::Error> {
    Backend::run_in(engine, &shape(spec, root), spec, &mut Capture, &[])
}

fn ok(engine: &Engine, root: &Path, spec: &Spec) -> ExecResult {
    let r = run_in(engine, root, spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
    assert_eq!(r.exit_code, Some(0), "{r:#?}");
    r
}

fn image_files_are_readable(engine: &Engine, root: &Path) {
    let r = ok(engine, root, &sh("cat /opt/hello.txt; cat /etc/private.conf"));
    assert_eq!(r.stdout, "hello from the image\nprivate=1\n");
}

/// A tree whose host path passes through an absolute symbolic link (a store on a disk
/// mounted elsewhere, a build directory that is a link): the link is the host's, resolved
/// on the host, not inside the sandbox being built.
fn an_image_reached_through_a_symbolic_link_is_the_root(engine: &Engine, root: &Path) {
    let links = tempfile::tempdir().unwrap();
    let parent = root.parent().unwrap();
    let link = links.path().join("store");
    std::os::unix::fs::symlink(parent, &link).unwrap();
    let via_link = link.join(root.file_name().unwrap());
    let r = ok(engine, &via_link, &sh("cat /opt/hello.txt"));
    assert_eq!(r.stdout, "hello from the image\n");
}

fn the_root_is_the_image_not_the_host(engine: &Engine, root: &Path) {
    let r = ok(
        engine,
        root,
        &sh(
            "ls /; echo ---; ls /usr 2>&1; test -e /usr/bin/python3 && echo HOST-PYTHON; test -e /etc/ssl && echo HOST-SSL; echo end",
        ),
    );
    assert!(r.stdout.contains("opt\n"), "{}", r.stdout);
    assert!(
        r.stdout.contains("No such file"),
        "/usr is the host's: {}",
        r.stdout
    );
    assert!(!r.stdout.contains("HOST-"), "{}", r.stdout);
    assert!(r.stdout.ends_with("end\n"), "{}", r.stdout);
}

fn the_program_is_uid_1000_and_the_image_is_read_only(engine: &Engine, root: &Path) {
    let r = ok(
        engine,
        root,
        &sh(
            "id -u; id -g; for f in /opt/x /bin/x /etc/passwd /.airlock/x /x; do touch $f 2>/dev/null && echo WROTE $f; done; echo end",
        ),
    );
    assert_eq!(r.stdout, "1000\n1000\nend\n");
}

fn scratch_is_writable_and_the_tree_is_unchanged(engine: &Engine, _root: &Path) {
    // A tree of its own, that no sandbox has run in yet.
    let dir = tempfile::tempdir().unwrap();
    let root = &image::make(dir.path());
    let before = image::snapshot(root);
    let r = ok(
        engine,
        root,
        &sh(
            "echo a > /workspace/a && echo b > /tmp/b && echo c > /dev/shm/c && cat /workspace/a /tmp/b /dev/shm/c && pwd",
        ),
    );
    assert_eq!(r.stdout, "a\nb\nc\n/workspace\n");
    assert_eq!(image::snapshot(root), before, "the prepared tree changed");
}

fn etc_identity_files_are_generated(engine: &Engine, root: &Path) {
    let r = ok(engine, root, &sh("cat /etc/passwd; cat /etc/hostname; id -un"));
    let passwd = airlock_sandbox::GENERATED_ETC
        .iter()
        .find(|(n, _)| *n == "passwd")
        .unwrap()
        .1;
    assert_eq!(r.stdout, format!("{passwd}airlock\nsandbox\n"));
}

fn the_program_starts_in_its_workdir(engine: &Engine, root: &Path) {
    let mut spec = sh("pwd; echo $PWD; cat hello.txt");
    spec.workdir = Some("/opt".into());
    let r = ok(engine, root, &spec);
    assert_eq!(r.stdout, "/opt\n/opt\nhello from the image\n");
    // A program named by a relative path is found from the workdir.
    let mut spec = Spec::new(vec!["../bin/pwd".into()]);
    spec.workdir = Some("/opt".into());
    assert_eq!(ok(engine, root, &spec).stdout, "/opt\n");
}

fn a_workdir_missing_from_the_image_is_refused_on_workdir(engine: &Engine, root: &Path) {
    let mut spec = sh("pwd");
    spec.workdir = Some("/no/such/dir".into());
    let err = run_in(engine, root, &spec).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    let airlock_backend::Error::Invalid(e) = &err else {
        unreachable!()
    };
    assert_eq!(e.field, "workdir", "{err}");
    assert!(err.to_string().contains("/no/such/dir"), "{err}");
}

fn a_pooled_sandbox_of_one_image_never_serves_another(engine: &Engine, root: &Path) {
    let spec = sh("true");
    let a = shape(&spec, root);
    let mut b = a.clone();
    b.image.as_mut().unwrap().digest = "sha256:other".into();
    assert!(engine.serves(&a, &a));
    assert!(!engine.serves(&a, &b));
    assert!(!engine.serves(&a, &Shape::of(&spec)));
}

fn a_session_keeps_the_image_root(engine: &Engine, root: &Path) {
    let spec = sh("cat /opt/hello.txt");
    let mut sb = Backend::create(engine, &shape(&spec, root), Purpose::Session).unwrap();
    sb.write_file("f.txt", 0o644, b"file\n", &[]).unwrap();
    for _ in 0..2 {
        let r = sb
            .exec(&sh("cat /opt/hello.txt f.txt"), &mut Capture, &[])
            .unwrap();
        assert_eq!(r.stdout, "hello from the image\nfile\n", "{r:#?}");
    }
}

fn without_an_image_the_host_system_dirs_are_there(engine: &Engine, _root: &Path) {
    let r = Backend::run(
        engine,
        &sh("test -d /usr/bin && test -e /etc/ld.so.cache && pwd"),
        &mut Capture,
        &[],
    )
    .unwrap();
    assert_eq!(r.stdout, "/workspace\n", "{r:#?}");
}

fn a_tree_whose_mount_point_is_a_link_is_refused(engine: &Engine, _root: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let bad = image::make(dir.path());
    std::fs::remove_file(bad.join("etc/hosts")).unwrap();
    std::os::unix::fs::symlink("/oldroot/etc/hosts", bad.join("etc/hosts")).unwrap();
    let err = run_in(engine, &bad, &sh("cat /etc/hosts")).unwrap_err();
    assert!(err.to_string().contains("/etc/hosts"), "{err}");
    assert!(err.to_string().contains("not a link"), "{err}");
}

fn a_mount_beneath_the_tree_on_the_host_is_read_only_too(engine: &Engine, _root: &Path) {
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    let dir = tempfile::tempdir().unwrap();
    let tree = image::make(dir.path());
    let sub = tree.join("opt");
    mount(
        Some("tmpfs"),
        &sub,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("mode=0777,size=64k"),
    )
    .unwrap();
    // Landlock would refuse the write anyway: the mount's own flags are checked.
    let r = run_in(engine, &tree, &sh("grep ' /opt ' /proc/self/mountinfo"));
    umount2(&sub, MntFlags::MNT_DETACH).unwrap();
    let r = r.unwrap();
    let options = r.stdout.split_whitespace().nth(5).unwrap_or_default().to_owned();
    let options: Vec<&str> = options.split(',').collect();
    for flag in ["ro", "nosuid", "nodev"] {
        assert!(options.contains(&flag), "{flag} missing: {}", r.stdout);
    }
}

fn a_spec_naming_an_image_never_runs_on_the_host_root(engine: &Engine, _root: &Path) {
    let mut spec = sh("true");
    spec.image = Some("busybox".into());
    // Shape::of leaves the image unresolved: the sandbox would have the host's root.
    let err = Backend::run(engine, &spec, &mut Capture, &[]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    let airlock_backend::Error::Invalid(e) = &err else {
        unreachable!()
    };
    assert_eq!(e.field, "image", "{err}");
}

type Case = fn(&Engine, &Path);

/// An engine for image builds (`with_writable_image_root`): the tree is the sandbox
/// user's and writable everywhere but the sandbox's own mounts, and still nosuid.
fn a_writable_root_is_the_sandbox_users_and_nosuid(_engine: &Engine, _root: &Path) {
    use std::os::unix::fs::MetadataExt;
    let builder = Engine::new().unwrap().with_writable_image_root();
    let dir = tempfile::tempdir().unwrap();
    let root = &image::make(dir.path());
    let r = ok(
        &builder,
        root,
        &sh(
            "id -u; echo new > /opt/new && rm /opt/hello.txt && mkdir -p /usr/local/bin && echo t > /usr/local/bin/t && echo wrote; touch /etc/passwd 2>/dev/null && echo WROTE-PASSWD; grep ' / ' /proc/mounts | grep -c 'rw,nosuid,nodev'",
        ),
    );
    assert_eq!(r.stdout, "1000\nwrote\n1\n", "{r:#?}");
    assert_eq!(std::fs::read_to_string(root.join("opt/new")).unwrap(), "new\n");
    assert!(!root.join("opt/hello.txt").exists());
    let owner = std::fs::metadata(root.join("opt/new")).unwrap().uid();
    assert!(
        owner >= airlock_sandbox::HOST_UID_BASE,
        "owned by host uid {owner}"
    );
    // The ordinary engine still refuses writes to the same tree.
    let r = ok(
        _engine,
        root,
        &sh("touch /opt/again 2>/dev/null && echo WROTE; echo end"),
    );
    assert_eq!(r.stdout, "end\n");
}

const CASES: &[(&str, Case)] = &[
    (
        "a_writable_root_is_the_sandbox_users_and_nosuid",
        a_writable_root_is_the_sandbox_users_and_nosuid,
    ),
    ("image_files_are_readable", image_files_are_readable),
    (
        "an_image_reached_through_a_symbolic_link_is_the_root",
        an_image_reached_through_a_symbolic_link_is_the_root,
    ),
    (
        "the_root_is_the_image_not_the_host",
        the_root_is_the_image_not_the_host,
    ),
    (
        "the_program_is_uid_1000_and_the_image_is_read_only",
        the_program_is_uid_1000_and_the_image_is_read_only,
    ),
    (
        "scratch_is_writable_and_the_tree_is_unchanged",
        scratch_is_writable_and_the_tree_is_unchanged,
    ),
    (
        "etc_identity_files_are_generated",
        etc_identity_files_are_generated,
    ),
    (
        "the_program_starts_in_its_workdir",
        the_program_starts_in_its_workdir,
    ),
    (
        "a_workdir_missing_from_the_image_is_refused_on_workdir",
        a_workdir_missing_from_the_image_is_refused_on_workdir,
    ),
    (
        "a_pooled_sandbox_of_one_image_never_serves_another",
        a_pooled_sandbox_of_one_image_never_serves_another,
    ),
    ("a_session_keeps_the_image_root", a_session_keeps_the_image_root),
    (
        "a_tree_whose_mount_point_is_a_link_is_refused",
        a_tree_whose_mount_point_is_a_link_is_refused,
    ),
    (
        "a_mount_beneath_the_tree_on_the_host_is_read_only_too",
        a_mount_beneath_the_tree_on_the_host_is_read_only_too,
    ),
    (
        "a_spec_naming_an_image_never_runs_on_the_host_root",
        a_spec_naming_an_image_never_runs_on_the_host_root,
    ),
    (
        "without_an_image_the_host_system_dirs_are_there",
        without_an_image_the_host_system_dirs_are_there,
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
