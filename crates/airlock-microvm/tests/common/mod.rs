//! What the micro-VM library tests share.

use std::path::PathBuf;

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
