//! `airlock-gvisor-agent`: airlock's init inside a gVisor sandbox. airlock starts it with
//! runsc as the container's process; it serves frames on its stdin and stdout (see
//! `airlock_gvisor::agent`). It does not run on a host.

use std::process::ExitCode;

fn main() -> ExitCode {
    match airlock_gvisor::agent::serve() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock-gvisor-agent: {e}");
            ExitCode::from(2)
        }
    }
}
