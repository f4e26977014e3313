//! `airlock doctor`: one line per host feature; non-zero exit when a required one is missing.

use std::process::ExitCode;

pub fn run() -> anyhow::Result<ExitCode> {
    let mut missing = false;
    for c in airlock_sandbox::doctor::run() {
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
