//! Serving the host over the port: one sandbox per VM, built on `Create`, fed files and
//! stdin, run with `Exec` (output streamed back as it comes) as many times as the host
//! asks, read with `ReadFile` and `ListFiles`.
//!
//! Every exec has session semantics ([`Sandbox::exec`]): at its end (or deadline, or a
//! `Cancel`) its processes are killed and the sandbox with its /workspace and /tmp
//! stays for the next one. A one-shot VM is simply destroyed after its one exec.

use airlock_backend::ErrorKind;
use airlock_sandbox::{Engine, OutputSink, Sandbox, SandboxConfig, SandboxError};
use airlock_spec::{Limits, Spec};
use airlock_vmwire::frame::{self as proto, AgentRequest, CHUNK, GuestInfo, ToGuest, ToHost, ToVmGuest};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;

use crate::{egress, files, spawn, sys};

/// Stdin is held in guest RAM before the run; more than this is refused (the VM's RAM
/// is sized for the program's memory limit, not for a large input besides it).
const MAX_STDIN: usize = 64 << 20;

/// The port, readable and writable through `&File`.
struct Port(File);

impl Port {
    fn send(&self, msg: &ToHost, payload: &[u8]) -> io::Result<()> {
        proto::write(&mut &self.0, msg, payload).map_err(io::Error::other)
    }

    /// Answers with a host failure: the agent's own trouble, or a request out of order.
    fn error(&self, message: impl Into<String>) -> io::Result<()> {
        self.send(&failure(ErrorKind::Host, message), &[])
    }

    /// Answers with `e`, its kind (and field) kept for the host to act on.
    fn fail(&self, e: impl Into<airlock_backend::Error>) -> io::Result<()> {
        let (kind, field, message) = e.into().to_wire();
        self.send(&ToHost::Error { kind, field, message }, &[])
    }
}

/// An error answer of `kind`.
fn failure(kind: ErrorKind, message: impl Into<String>) -> ToHost {
    ToHost::Error {
        kind,
        field: None,
        message: message.into(),
    }
}

/// Streams output to the host as frames.
struct PortSink<'a> {
    port: &'a Port,
    /// The first write error; the run goes on (its result reports what it can).
    failed: Option<io::Error>,
}

impl PortSink<'_> {
    fn forward(&mut self, msg: ToHost, data: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        for chunk in data.chunks(CHUNK) {
            if let Err(e) = self.port.send(&msg, chunk) {
                self.failed = Some(e);
                return;
            }
        }
    }
}

impl OutputSink for PortSink<'_> {
    fn stdout(&mut self, data: &[u8]) {
        self.forward(ToHost::Stdout, data);
    }
    fn stderr(&mut self, data: &[u8]) {
        self.forward(ToHost::Stderr, data);
    }
}

/// A tar stream to the host as `FileChunk`s of [`CHUNK`] bytes, the last one marked.
struct ChunkWriter<'a> {
    port: &'a Port,
    buf: Vec<u8>,
    /// The port failed: the agent ends.
    failed: Option<io::Error>,
}

impl ChunkWriter<'_> {
    fn flush_full(&mut self) -> io::Result<()> {
        while self.buf.len() >= CHUNK {
            let rest = self.buf.split_off(CHUNK);
            let chunk = std::mem::replace(&mut self.buf, rest);
            if let Err(e) = self.port.send(&ToHost::FileChunk { last: false }, &chunk) {
                let err = io::Error::new(e.kind(), e.to_string());
                self.failed = Some(e);
                return Err(err);
            }
        }
        Ok(())
    }

    /// Sends what is left, marked last.
    fn finish(self) -> io::Result<()> {
        self.port.send(&ToHost::FileChunk { last: true }, &self.buf)
    }
}

impl io::Write for ChunkWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        self.flush_full()?;
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Network interfaces of the guest.
fn net_devices() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Landlock ABI 4 brought TCP rules, which the namespace backend applies (no TCP
/// connect while the network policy is `none`). A guest kernel without them runs the
/// sandbox without those rules only because the VM has no network device at all; if
/// one is present, refuse to serve rather than run weaker than the host would.
fn check_network(abi: i32, devices: &[String]) -> Result<(), String> {
    if abi >= 4 || devices.iter().all(|d| d == "lo") {
        Ok(())
    } else {
        Err(format!(
            "the guest kernel's landlock ABI {abi} has no TCP rules and the VM has network devices {devices:?}: refusing to run programs"
        ))
    }
}

/// Serves until the host closes the port.
pub fn serve(booted: crate::boot::Booted, init_ms: u64) -> Result<(), String> {
    let crate::boot::Booted {
        port,
        modules_ms,
        image,
    } = booted;
    let port = Port(port);
    let engine = Engine::new().map_err(|e| format!("engine: {e}"))?;
    let abi = airlock_sandbox::landlock::kernel_abi();
    let devices = net_devices();
    check_network(abi, &devices)?;
    let info = GuestInfo {
        kernel: nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        landlock_abi: abi,
        net_devices: devices,
        init_ms,
        modules_ms,
        boot_ms: sys::boot_ms(),
        mux_version: airlock_vmwire::mux::MUX_VERSION,
    };
    port.send(&ToHost::Ready(info), &[])
        .map_err(|e| format!("port: {e}"))?;

    // The egress port is served from now on, whatever the network mode: the host opens
    // streams on it (ports, spawned programs' stdio). Without it, those are refused.
    let mux = match egress::serve_port() {
        Ok(shared) => Some(shared),
        Err(e) => {
            eprintln!("airlock-guest: the egress port: {e}");
            None
        }
    };
    let mut state = State {
        image,
        mux,
        ..State::default()
    };
    let mut reader = io::BufReader::with_capacity(CHUNK + 4096, &port.0);
    loop {
        let frame = match proto::read::<AgentRequest>(&mut reader) {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("port: {e}")),
        };
        match frame.msg {
            AgentRequest::Common(msg) => state.handle(&engine, &port, msg, frame.payload),
            AgentRequest::Vm(msg) => state.handle_vm(&port, msg, &frame.payload),
        }
        .map_err(|e| format!("port: {e}"))?;
    }
}

/// A file whose parts are arriving.
struct Incoming {
    /// Path relative to /workspace.
    path: String,
    /// Permission bits.
    mode: u32,
    /// The bytes so far.
    data: Vec<u8>,
    /// The answer, once a part failed: the rest is dropped as it comes.
    failed: Option<ToHost>,
}

impl Incoming {
    /// Adds a part; past `disk` bytes in all the file is refused (`NoRoom`), and this
    /// part and the rest are dropped.
    fn push(&mut self, part: &[u8], disk: u64) {
        if self.failed.is_some() {
            return;
        }
        if (self.data.len() + part.len()) as u64 > disk {
            self.data = Vec::new();
            self.failed = Some(ToHost::NoRoom {
                free_bytes: None,
                memory_bytes: None,
            });
        } else {
            self.data.extend_from_slice(part);
        }
    }
}

/// What one VM's agent holds between requests.
#[derive(Default)]
struct State {
    /// The sandbox, once created.
    sandbox: Option<Sandbox>,
    /// The limits it was created with (bound the files written to it).
    limits: Limits,
    /// A file being received.
    file: Option<Incoming>,
    /// Stdin received so far.
    stdin: Vec<u8>,
    /// More stdin came than [`MAX_STDIN`].
    stdin_overflow: bool,
    /// Saved as a template (`Freeze`) and not yet `Resume`d as a clone: only `Resume` is
    /// served.
    frozen: bool,
    /// Proxy mode is on (`Egress`): the sandbox's 127.0.0.1:3128, :3129 and :53 (UDP) are
    /// relayed to the host's proxy, and programs get the proxy's environment.
    egress: bool,
    /// What every program gets in proxy mode (from the host's egress setup).
    egress_env: Vec<(String, String)>,
    /// The image's root mounted from its drive, when the VM carries one: the sandbox's
    /// whole root (the engine's image mode), fixed for the VM's life.
    image: Option<std::path::PathBuf>,
    /// The egress port's relay, served from boot.
    mux: Option<std::sync::Arc<egress::Shared>>,
    /// The sandbox's init and cgroup, once it exists: where spawned programs go.
    sandbox_ref: Option<spawn::SandboxRef>,
    /// Its programs run with a fixed address-space layout.
    fixed_layout: bool,
    /// Where the next exec's changeset looks (`ChangesIn`), if it has one.
    changes_in: Option<Vec<String>>,
    /// A tar stream being imported (`ImportFiles`), or why it cannot be: the rest of its
    /// parts are dropped until the last.
    import: Option<Result<files::Import, String>>,
}

impl State {
    /// Handles one request; only a failure to answer on the port is an error.
    fn handle(&mut self, engine: &Engine, port: &Port, msg: ToGuest, payload: Vec<u8>) -> io::Result<()> {
        if self.frozen && !matches!(msg, ToGuest::Resume { .. }) {
            return port.error("this VM is a template: it serves nothing before `resume`");
        }
        match msg {
            ToGuest::Freeze => {
                self.frozen = true;
                port.send(&ToHost::Ok, &[])
            }
            ToGuest::Resume { unix_time_ns } => {
                if payload.len() < proto::RESUME_SEED {
                    return port.error(format!(
                        "resume needs {} random bytes, got {}",
                        proto::RESUME_SEED,
                        payload.len()
                    ));
                }
                // Every clone starts with its template's random state and clock: both
                // are replaced before anything else runs.
                if let Err(e) = sys::reseed_random(&payload) {
                    return port.error(format!("reseeding the random generator: {e}"));
                }
                if let Err(e) = sys::set_realtime(unix_time_ns) {
                    return port.error(format!("setting the clock: {e}"));
                }
                self.frozen = false;
                port.send(&ToHost::Ok, &[])
            }
            ToGuest::Create { limits, fixed_layout } => {
                if self.sandbox.is_some() {
                    return port.error("a sandbox already exists in this VM");
                }
                let mut spec = Spec::new(vec!["true".into()]);
                spec.limits = limits.clone();
                if let Err(e) = spec.validate() {
                    return port.fail(e);
                }
                let config = SandboxConfig {
                    fixed_layout,
                    ca_bundle: None,
                    image: self.image.clone(),
                    ..SandboxConfig::of(&spec)
                };
                match engine.create(&config) {
                    Ok(sb) => {
                        // Its init is its only process now.
                        self.sandbox_ref = egress::sandbox_pid(sb.id())
                            .ok_or_else(|| "no process".to_owned())
                            .and_then(spawn::SandboxRef::of)
                            .inspect_err(|e| eprintln!("airlock-guest: the sandbox's init: {e}"))
                            .ok();
                        if let (Some(mux), Some(r)) = (&self.mux, &self.sandbox_ref)
                            && let Err(e) = egress::set_sandbox(mux, r.init_pid)
                        {
                            eprintln!("airlock-guest: the sandbox's network: {e}");
                        }
                        self.sandbox = Some(sb);
                        self.limits = limits;
                        self.fixed_layout = fixed_layout;
                        port.send(&ToHost::Ok, &[])
                    }
                    Err(e) => port.error(format!("creating the sandbox: {e}")),
                }
            }
            ToGuest::WriteFile {
                path,
                mode,
                first,
                last,
            } => {
                // Answered once, after the last part, whatever failed before it: the host
                // sends every part before it reads the answer.
                if first || self.file.is_none() {
                    let failed = if self.sandbox.is_none() {
                        Some("no sandbox: send create first")
                    } else if !first {
                        Some("file data without a first part")
                    } else {
                        None
                    };
                    self.file = Some(Incoming {
                        path,
                        mode,
                        data: Vec::new(),
                        failed: failed.map(|m| failure(ErrorKind::Host, m)),
                    });
                }
                let disk = self.limits.disk_bytes;
                if let Some(file) = self.file.as_mut() {
                    file.push(&payload, disk);
                }
                if !last {
                    return Ok(());
                }
                let Some(file) = self.file.take() else {
                    return port.error("file data without a first part");
                };
                if let Some(answer) = file.failed {
                    return port.send(&answer, &[]);
                }
                let Some(sb) = self.sandbox.as_mut() else {
                    return port.error("no sandbox: send create first");
                };
                match sb.write_file(&file.path, file.mode, &file.data) {
                    Ok(()) => port.send(&ToHost::Ok, &[]),
                    Err(SandboxError::DiskFull(e)) => port.send(
                        &ToHost::NoRoom {
                            free_bytes: e.free_bytes,
                            memory_bytes: e.memory_bytes,
                        },
                        &[],
                    ),
                    Err(e) => port.fail(e),
                }
            }
            ToGuest::Egress => {
                if self.egress {
                    return port.send(&ToHost::Ok, &[]);
                }
                let Some(sb) = self.sandbox.as_ref() else {
                    return port.error("no sandbox: send create first");
                };
                // The same check as at start: the relay is the only way out only while
                // the VM has no network device besides lo.
                if let Err(e) = check_network(airlock_sandbox::landlock::kernel_abi(), &net_devices()) {
                    return port.error(e);
                }
                let setup: airlock_vmwire::EgressSetup = if payload.is_empty() {
                    airlock_vmwire::EgressSetup {
                        env: airlock_sandbox::proxy_env(egress::PROXY_PORT),
                        ca_bundle: None,
                    }
                } else {
                    match serde_json::from_slice(&payload) {
                        Ok(s) => s,
                        Err(e) => return port.error(format!("the egress setup: {e}")),
                    }
                };
                let Some(mux) = self.mux.as_ref() else {
                    return port.error("the egress port is not served in this VM");
                };
                let started = egress::bind_in_sandbox(sb.id())
                    .and_then(|listeners| egress::start(listeners, mux))
                    .and_then(|()| match &setup.ca_bundle {
                        Some(pem) => egress::install_ca_bundle(sb.id(), pem),
                        None => Ok(()),
                    });
                match started {
                    Ok(()) => {
                        self.egress = true;
                        self.egress_env = setup.env;
                        port.send(&ToHost::Ok, &[])
                    }
                    Err(e) => port.error(format!("starting the egress proxy: {e}")),
                }
            }
            ToGuest::Stdin => {
                // Too much is answered at Exec: nothing is sent back for a stdin chunk.
                if self.stdin_overflow || self.stdin.len() + payload.len() > MAX_STDIN {
                    self.stdin_overflow = true;
                    self.stdin = Vec::new();
                } else {
                    self.stdin.extend_from_slice(&payload);
                }
                Ok(())
            }
            ToGuest::Exec {
                command,
                env,
                limits,
                workdir,
            } => {
                let stdin = std::mem::take(&mut self.stdin);
                if std::mem::take(&mut self.stdin_overflow) {
                    return port.error(format!(
                        "stdin over {MAX_STDIN} bytes is not supported in a micro-VM"
                    ));
                }
                let Some(sb) = self.sandbox.as_mut() else {
                    return port.error("no sandbox: send create first");
                };
                let mut spec = Spec::new(command);
                // The proxy's variables first: the request's own win (as on the host).
                spec.env = if self.egress {
                    self.egress_env.iter().cloned().chain(env).collect()
                } else {
                    env
                };
                spec.limits = limits;
                spec.stdin = stdin;
                spec.workdir = workdir;
                // The agent scans itself, from outside the sandbox: the engine does not.
                spec.files_changed_in = Vec::new();
                let changes = match (self.changes_in.take(), &self.sandbox_ref) {
                    (Some(roots), Some(r)) if !roots.is_empty() => {
                        Some(files::Changes::start(r.init_pid, &roots))
                    }
                    _ => None,
                };
                let mut sink = PortSink { port, failed: None };
                // The port is the exec's cancel fd: the host writes to it during an exec
                // only to cancel it (`Cancel`, read once the exec has answered).
                let result = sb.exec(&spec, &mut sink, &[port.0.as_fd()]);
                if let Some(e) = sink.failed {
                    return Err(e);
                }
                match result {
                    Ok(mut r) => {
                        r.stdout.clear();
                        r.stderr.clear();
                        match changes.map(|c| c.and_then(files::Changes::finish)) {
                            Some(Ok((changed, truncated))) => {
                                r.files_changed = changed;
                                r.files_changed_truncated = truncated;
                            }
                            // The list would be incomplete: said so.
                            Some(Err(e)) => {
                                eprintln!("airlock-guest: the exec's changeset: {e}");
                                r.files_changed_truncated = true;
                            }
                            None => {}
                        }
                        port.send(&ToHost::Exited { result: Box::new(r) }, &[])
                    }
                    Err(e) => port.fail(e),
                }
            }
            ToGuest::ReadFile { path, max_bytes } => {
                let Some(sb) = self.sandbox.as_mut() else {
                    return port.error("no sandbox");
                };
                match sb.read_file(&path, max_bytes) {
                    Ok(data) => {
                        let mut chunks = data.chunks(CHUNK).peekable();
                        loop {
                            let chunk = chunks.next().unwrap_or(&[]);
                            let last = chunks.peek().is_none();
                            port.send(&ToHost::FileChunk { last }, chunk)?;
                            if last {
                                return Ok(());
                            }
                        }
                    }
                    Err(e) => port.fail(e),
                }
            }
            ToGuest::ListFiles => {
                let Some(sb) = self.sandbox.as_mut() else {
                    return port.error("no sandbox");
                };
                match sb.list_files() {
                    Ok(entries) => match proto::write(&mut &port.0, &ToHost::Listing { entries }, &[]) {
                        Ok(()) => Ok(()),
                        // Refused before anything was written: the listing's paths do not
                        // fit one frame.
                        Err(proto::FrameError::Malformed(m)) => port.error(format!("listing: {m}")),
                        Err(proto::FrameError::Io(e)) => Err(e),
                    },
                    Err(e) => port.fail(e),
                }
            }
            // The exec it was meant for has answered already.
            ToGuest::Cancel => Ok(()),
        }
    }

    /// Handles a request only the micro-VM's agent serves.
    fn handle_vm(&mut self, port: &Port, msg: ToVmGuest, payload: &[u8]) -> io::Result<()> {
        if self.frozen {
            return port.error("this VM is a template: it serves nothing before `resume`");
        }
        match msg {
            ToVmGuest::Restored { unix_time_ns } => {
                let need = proto::RESUME_SEED + 2 * proto::RESYNC_MARKER;
                if payload.len() < need {
                    return port.error(format!(
                        "restored needs {need} random bytes, got {}",
                        payload.len()
                    ));
                }
                let (seed, markers) = payload.split_at(proto::RESUME_SEED);
                let (host_marker, own_marker) = markers.split_at(proto::RESYNC_MARKER);
                // A restored VM starts with its snapshot's random state and clock: both
                // are replaced before anything else runs, as in a template's clone.
                if let Err(e) = sys::reseed_random(seed) {
                    return port.error(format!("reseeding the random generator: {e}"));
                }
                if let Err(e) = sys::set_realtime(unix_time_ns) {
                    return port.error(format!("setting the clock: {e}"));
                }
                if let Some(mux) = &self.mux
                    && let Err(e) = egress::restored(mux, host_marker, &own_marker[..proto::RESYNC_MARKER])
                {
                    return port.error(format!("the egress port: {e}"));
                }
                port.send(&ToHost::Ok, &[])
            }
            ToVmGuest::ChangesIn { roots } => {
                self.changes_in = Some(roots);
                Ok(())
            }
            ToVmGuest::ExportFiles => {
                let Some(sandbox) = &self.sandbox_ref else {
                    return port.error("no sandbox: send create first");
                };
                let roots = match files::roots(sandbox.init_pid, &files::WRITABLE) {
                    Ok(r) => r,
                    Err(e) => return port.error(format!("exporting: {e}")),
                };
                let mut out = ChunkWriter {
                    port,
                    buf: Vec::with_capacity(CHUNK),
                    failed: None,
                };
                let exported = airlock_fstree::export(&roots, &mut out);
                if let Some(e) = out.failed.take() {
                    return Err(e);
                }
                match exported {
                    Ok(_) => out.finish(),
                    Err(e) => port.error(format!("exporting: {e}")),
                }
            }
            ToVmGuest::ImportFiles { last, abort } => {
                let import = self.import.get_or_insert_with(|| match &self.sandbox_ref {
                    Some(r) => files::Import::start(r.init_pid).map_err(|e| format!("importing: {e}")),
                    None => Err("no sandbox: send create first".into()),
                });
                if let Ok(import) = import {
                    import.push(payload.to_vec());
                }
                if !last {
                    return Ok(());
                }
                let imported = match self.import.take() {
                    Some(Ok(import)) => import.finish(),
                    Some(Err(m)) => return port.error(m),
                    None => return port.error("importing: no stream"),
                };
                if abort {
                    return port.error("importing: the host could not read the whole stream");
                }
                match imported {
                    Ok(_) => port.send(&ToHost::Ok, &[]),
                    Err(e) if files::is_no_room(&e) => port.send(
                        &ToHost::NoRoom {
                            free_bytes: None,
                            memory_bytes: None,
                        },
                        &[],
                    ),
                    Err(e)
                        if matches!(e.kind(), io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput) =>
                    {
                        port.fail(airlock_backend::Error::invalid(
                            "files",
                            format!("the tar stream: {e}"),
                        ))
                    }
                    Err(e) => port.error(format!("importing: {e}")),
                }
            }
            ToVmGuest::Spawn {
                command,
                env,
                workdir,
                terminal,
                process,
                streams,
            } => {
                let (Some(_), Some(sandbox), Some(mux)) = (&self.sandbox, &self.sandbox_ref, &self.mux)
                else {
                    return port.error("no sandbox (or no egress port) to spawn a program in");
                };
                let mut spec = Spec::new(command.clone());
                spec.env = env.clone();
                spec.workdir = workdir.clone();
                if let Err(e) = spec.validate() {
                    return port.fail(e);
                }
                // As an exec's: the defaults, the proxy's, the request's (which win).
                let mut all = airlock_sandbox::base_env();
                if let Some(dir) = &workdir {
                    all.retain(|(k, _)| k != "PWD");
                    all.push(("PWD".into(), dir.clone()));
                }
                if terminal.is_some() {
                    all.push(("TERM".into(), "xterm-256color".into()));
                }
                let extra = if self.egress {
                    self.egress_env.iter().cloned().chain(env).collect()
                } else {
                    env
                };
                for (k, v) in extra {
                    all.retain(|(key, _)| *key != k);
                    all.push((k, v));
                }
                let request = spawn::Spawn {
                    command,
                    env: all,
                    workdir,
                    terminal,
                    process,
                    streams,
                    max_file_bytes: self.limits.disk_bytes,
                    connect_tcp: self.egress,
                    image: self.image.is_some(),
                    fixed_layout: self.fixed_layout,
                };
                match spawn::start(mux, sandbox, request) {
                    Ok(pid) => port.send(&ToHost::Spawned { pid }, &[]),
                    Err(e) => port.error(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_larger_than_the_disk_is_refused_once_and_its_parts_dropped() {
        let mut file = Incoming {
            path: "big.bin".into(),
            mode: 0o644,
            data: Vec::new(),
            failed: None,
        };
        file.push(&[1; 600], 1000);
        assert_eq!(file.data.len(), 600);
        file.push(&[2; 600], 1000);
        file.push(&[3; 10], 1000);
        assert!(file.data.is_empty());
        assert_eq!(
            file.failed,
            Some(ToHost::NoRoom {
                free_bytes: None,
                memory_bytes: None,
            })
        );
    }

    #[test]
    fn the_parts_of_a_file_without_a_sandbox_get_one_answer() {
        use std::os::unix::net::UnixStream;
        // Nothing of the engine is used here (no sandbox is created) but its type.
        let engine = Engine::new().expect("the engine (tests run as root)");
        let (ours, theirs) = UnixStream::pair().unwrap();
        let port = Port(File::from(std::os::fd::OwnedFd::from(ours)));
        let mut state = State::default();
        for (first, last) in [(true, false), (false, false), (false, true)] {
            let msg = ToGuest::WriteFile {
                path: "x".into(),
                mode: 0o644,
                first,
                last,
            };
            state.handle(&engine, &port, msg, vec![0; 100]).unwrap();
        }
        state
            .handle(&engine, &port, ToGuest::ListFiles, Vec::new())
            .unwrap();
        drop(port);
        let mut r = io::BufReader::new(theirs);
        let mut answers = Vec::new();
        while let Some(f) = proto::read::<ToHost>(&mut r).unwrap() {
            answers.push(f.msg);
        }
        // One answer for the file, one for the listing.
        assert_eq!(answers.len(), 2, "{answers:?}");
        assert!(
            matches!(&answers[0], ToHost::Error { kind: ErrorKind::Host, message, .. } if message.contains("no sandbox")),
            "{answers:?}"
        );
    }

    #[test]
    fn network_devices_without_tcp_rules_are_refused() {
        assert!(check_network(2, &["lo".into()]).is_ok());
        assert!(check_network(2, &[]).is_ok());
        assert!(check_network(6, &["eth0".into(), "lo".into()]).is_ok());
        let err = check_network(2, &["eth0".into(), "lo".into()]).unwrap_err();
        assert!(err.contains("eth0"), "{err}");
    }
}
