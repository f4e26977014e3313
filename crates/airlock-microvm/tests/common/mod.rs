//! What the micro-VM library tests share. Not every test binary uses every helper.
#![allow(dead_code)]

use airlock_microvm::HostOptions;
use airlock_spec::{ExecResult, Spec};
use std::path::PathBuf;

/// The host's options from the environment, with this build's guest agent.
pub fn options() -> HostOptions {
    HostOptions {
        agent: agent(),
        ..HostOptions::from_env()
    }
}

/// `sh -c script`.
pub fn sh(script: &str) -> Spec {
    Spec::new(vec!["sh".into(), "-c".into(), script.into()])
}

/// `r`, asserting that the program exited 0.
pub fn ok(r: ExecResult) -> ExecResult {
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    r
}

/// `airlock-guest` from the target directory this test was built in.
pub fn agent() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> -> target/<profile>/airlock-guest
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("airlock-guest"))
        .expect("target dir");
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build -p airlock-guest`",
        path.display()
    );
    path
}
