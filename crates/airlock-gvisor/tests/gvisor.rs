//! The gVisor tier through the `airlock_backend` traits, with the real runsc (run as
//! root). Each test builds its own sandboxes and checks what it asked for.

use airlock_backend::{Backend, Capture, ErrorKind, Purpose, Sandbox, Shape};
use airlock_gvisor::{GvisorBackend, GvisorOptions};
use airlock_spec::{Outcome, Spec};
use std::sync::OnceLock;

fn backend() -> &'static GvisorBackend {
    static B: OnceLock<GvisorBackend> = OnceLock::new();
    B.get_or_init(|| {
        let mut options = GvisorOptions::from_env();
        options.agent = env!("CARGO_BIN_EXE_airlock-gvisor-agent").into();
        let b = GvisorBackend::new(options);
        b.prepare().expect("gVisor is available (tests run as root with runsc installed)");
        b
    })
}

fn spec(argv: &[&str]) -> Spec {
    Spec::new(argv.iter().map(|s| s.to_string()).collect())
}

fn sh(script: &str) -> Spec {
    spec(&["/bin/sh", "-c", script])
}

#[test]
fn output_and_exit_code() {
    let r = backend()
        .run(&sh("echo out; echo err >&2; exit 3"), &mut Capture, &[])
        .unwrap();
    assert_eq!(r.stdout, "out\n");
    assert_eq!(r.stderr, "err\n");
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(r.outcome, Outcome::Exited);
}
