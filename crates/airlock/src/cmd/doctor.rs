//! `airlock doctor`: one line per host feature; non-zero exit when a required one is missing.
//! The gVisor lines say whether runsc runs here, on which platform, and which walls apply.
//! The micro-VM lines come last: they boot a VM (a few seconds under emulation; skipped
//! with `--no-boot`), and use the cached KVM verdict unless `--probe-kvm`.

use clap::Args;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Probe KVM again by booting a guest under it, instead of using the cached verdict
    /// (a /dev/kvm that cannot boot guests makes the probe wait for its timeout).
    #[arg(long)]
    probe_kvm: bool,
    /// Do not boot a micro-VM to run /bin/true (the slowest check under emulation).
    #[arg(long)]
    no_boot: bool,
    /// Try every gVisor platform again instead of using the cached verdict (a platform
    /// that hangs here, like kvm under a nested /dev/kvm, is tried until its deadline).
    #[arg(long)]
    probe_gvisor: bool,
    /// The image store to report on.
    #[command(flatten)]
    store: super::image::StoreArgs,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let mut missing = false;
    let mut checks = airlock_sandbox::doctor::run();
    // gVisor and micro-VM readiness: not required (the namespace tier runs without them).
    checks.extend(airlock_gvisor::doctor::run(
        &crate::tiers::gvisor_options(),
        args.probe_gvisor,
    ));
    checks.push(image_store(&args.store));
    checks.push(airlock_microvm::doctor::agent());
    checks.extend(airlock_microvm::doctor::run(
        airlock_microvm::doctor::DoctorOptions {
            probe_kvm: args.probe_kvm,
            no_boot: args.no_boot,
        },
    ));
    for c in checks {
        let fix = if (c.ok && !c.slow) || c.fix.is_empty() {
            String::new()
        } else {
            format!(" ({}: {})", if c.ok { "note" } else { "fix" }, c.fix)
        };
        println!("{:<4} {:<28} {}{fix}", c.mark(), c.name, c.detail);
        missing |= c.required && !c.ok;
    }
    Ok(if missing {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The image store: where it is, what it holds, whether sandboxes can reach it. Not
/// required (without images, sandboxes run on the host's system directories).
fn image_store(args: &super::image::StoreArgs) -> airlock_sandbox::doctor::Check {
    let dir = &args.image_store;
    let mut check = airlock_sandbox::doctor::Check {
        name: "image store",
        ok: false,
        slow: false,
        required: false,
        detail: String::new(),
        fix: "give --image-store (or AIRLOCK_IMAGE_STORE) a directory whose parents others may search",
    };
    if !dir.exists() {
        check.ok = true;
        check.detail = format!(
            "{} (not created yet: the first pull or import makes it)",
            dir.display()
        );
        return check;
    }
    let summary = args.open().and_then(|store| {
        let images = store.images()?;
        let usage = store.usage()?;
        Ok((store, images.len(), usage))
    });
    match summary {
        Ok((store, images, usage)) => match airlock_server::images::reachable(store.root()) {
            Ok(()) => {
                check.ok = true;
                check.detail = format!(
                    "{}: {images} image(s), {} used{}",
                    dir.display(),
                    airlock_spec::human_size(usage),
                    args.image_store_max
                        .map(|m| format!(" of {}", airlock_spec::human_size(m)))
                        .unwrap_or_default()
                );
            }
            Err(e) => check.detail = e,
        },
        Err(e) => check.detail = format!("{}: {e:#}", dir.display()),
    }
    check
}
