//! `airlock doctor`: one line per host feature; non-zero exit when a required one is missing.
//! The micro-VM lines come last: they boot a VM.

use std::process::ExitCode;

pub fn run() -> anyhow::Result<ExitCode> {
    let mut missing = false;
    let mut checks = airlock_sandbox::doctor::run();
    // Micro-VM readiness: not required (the namespace backend runs without it); it boots
    // a VM to find out, so it takes a few seconds.
    checks.extend(airlock_microvm::doctor::run());
    for c in checks {
        let mark = match (c.ok, c.required) {
            (true, _) => "ok  ",
            (false, true) => "FAIL",
            (false, false) => "warn",
        };
        let fix = if c.ok || c.fix.is_empty() {
            String::new()
        } else {
            format!(" (fix: {})", c.fix)
        };
        println!("{mark} {:<28} {}{fix}", c.name, c.detail);
        missing |= c.required && !c.ok;
    }
    Ok(if missing {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
