//! Prints the gVisor section of `airlock doctor`: `doctor [--probe]` (`--probe` tries
//! every platform again instead of the cached verdict).

fn main() {
    let probe = std::env::args().any(|a| a == "--probe");
    for c in airlock_gvisor::doctor::run(&airlock_gvisor::GvisorOptions::from_env(), probe) {
        println!("{:<5} {:<16} {}", c.mark(), c.name, c.detail);
        if !c.ok && !c.fix.is_empty() {
            println!("      fix: {}", c.fix);
        }
    }
}
