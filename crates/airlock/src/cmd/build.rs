//! `airlock image build -t NAME [-f Airlockfile] CONTEXT`: an Airlockfile built into an
//! image of the store, each RUN in a namespace-tier sandbox (see `airlock_build`).

use airlock_backend::OutputSink;
use airlock_build::{BuildOptions, StepEvent};
use airlock_image::Store;
use airlock_spec::{Limits, NetworkPolicy, parse_duration, parse_size};
use anyhow::{Context, bail};
use clap::Args;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::SignalFd;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The name to tag the image with (`mytools`, `mytools:1`).
    #[arg(short = 't', long = "tag", value_name = "NAME")]
    tag: String,
    /// The Airlockfile (default: CONTEXT/Airlockfile).
    #[arg(short = 'f', long = "file", value_name = "PATH")]
    file: Option<PathBuf>,
    /// The build context: the directory COPY sources are taken from.
    #[arg(value_name = "CONTEXT")]
    context: PathBuf,
    /// A value for an ARG of the Airlockfile; repeatable.
    #[arg(long = "build-arg", value_name = "NAME=VALUE")]
    build_args: Vec<String>,
    /// Memory cap of each RUN (tmpfs pages included).
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = size)]
    memory: u64,
    /// CPU quota of each RUN, in cores.
    #[arg(long, value_name = "N", default_value_t = 2.0)]
    cpus: f64,
    /// Processes plus threads of each RUN.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pids: u32,
    /// Wall-clock limit of each RUN.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration_ms)]
    timeout: u64,
    /// Size of each RUN's /tmp, /workspace and /dev/shm (and the largest file it may
    /// write anywhere).
    #[arg(long, value_name = "SIZE", default_value = "512M", value_parser = size)]
    disk: u64,
    /// Network of each RUN: `none`, or `proxy` (out only through the egress proxy, to the
    /// hosts given with --allow).
    #[arg(long = "net", value_name = "MODE", default_value = "none", value_parser = ["none", "proxy"])]
    net: String,
    /// With --net proxy: a host RUN steps may reach (`pkgs.example.com`); repeatable.
    #[arg(long = "allow", value_name = "HOST[:PORT]")]
    allow: Vec<String>,
    /// With --net proxy: an address range allowed even though it is private; repeatable.
    #[arg(long = "allow-cidr", value_name = "CIDR")]
    allow_cidrs: Vec<String>,
    /// Build every step again (what is built is still recorded in the cache).
    #[arg(long)]
    no_cache: bool,
    /// Print the image as JSON on stdout when done.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: super::image::RegistryArgs,
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.reason.to_string())
}

fn duration_ms(s: &str) -> Result<u64, String> {
    let d = parse_duration(s).map_err(|e| e.reason.to_string())?;
    Ok(d.as_millis().try_into().unwrap_or(u64::MAX))
}

/// RUN output goes to airlock's stderr (stdout stays for --json).
struct ToStderr;
impl OutputSink for ToStderr {
    fn stdout(&mut self, data: &[u8]) {
        let _ = std::io::stderr().lock().write_all(data);
    }
    fn stderr(&mut self, data: &[u8]) {
        let _ = std::io::stderr().lock().write_all(data);
    }
}

pub fn run(store: &Store, args: BuildArgs) -> anyhow::Result<ExitCode> {
    let mut options = BuildOptions::new(
        args.tag.clone(),
        args.file
            .clone()
            .unwrap_or_else(|| args.context.join("Airlockfile")),
        args.context.clone(),
    );
    for kv in &args.build_args {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--build-arg {kv:?}: expected NAME=VALUE");
        };
        options.build_args.push((k.to_owned(), v.to_owned()));
    }
    options.limits = Limits {
        memory_bytes: args.memory,
        cpus: args.cpus,
        pids: args.pids,
        timeout_ms: args.timeout,
        disk_bytes: args.disk,
        ..Limits::default()
    };
    options.network = match args.net.as_str() {
        "proxy" => NetworkPolicy::Proxy(airlock_spec::ProxyPolicy {
            allow: args.allow.clone(),
            allow_cidrs: args.allow_cidrs.clone(),
            ..airlock_spec::ProxyPolicy::default()
        }),
        _ if !args.allow.is_empty() || !args.allow_cidrs.is_empty() => {
            bail!("--allow and --allow-cidr need --net proxy");
        }
        _ => NetworkPolicy::None,
    };
    options.no_cache = args.no_cache;
    let engine = airlock_sandbox::Engine::new()?.with_writable_image_root();
    let start = Instant::now();
    let registry = args.registry.clone();
    let mut from =
        |r: &str| super::image::for_run(store, r, "missing", &registry).map_err(|e| format!("{e:#}"));
    // Ctrl-C, SIGTERM and SIGHUP kill the running step's sandbox (purged) and end the
    // build with nothing tagged, instead of killing airlock mid-step.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(s);
    }
    signals.thread_block().context("blocking signals")?;
    let cancel = SignalFd::new(&signals).context("signalfd")?;
    let built = match airlock_build::build(
        store,
        &engine,
        &options,
        &mut from,
        &mut ToStderr,
        &[cancel.as_fd()],
        &mut |e: &StepEvent| eprintln!("{e}"),
    ) {
        Ok(built) => built,
        Err(airlock_build::Error::Sandbox { source, .. })
            if source.kind() == airlock_backend::ErrorKind::Cancelled =>
        {
            eprintln!("airlock: interrupted; the step's sandbox was killed and purged, nothing tagged");
            return Ok(ExitCode::from(130));
        }
        Err(e) => return Err(e.into()),
    };
    let image = &built.image;
    eprintln!(
        "airlock: built {} (sha256:{}, {} layers; {} steps cached, {} run, {:.1} s)",
        image.name,
        &image.manifest_digest.hex()[..12],
        image.layers.len(),
        built.cached,
        built.ran,
        start.elapsed().as_secs_f64()
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "name": image.name,
                "digest": image.manifest_digest.to_string(),
                "layers": image.layers.len(),
                "cached": built.cached,
                "ran": built.ran,
            })
        );
    }
    Ok(ExitCode::SUCCESS)
}
