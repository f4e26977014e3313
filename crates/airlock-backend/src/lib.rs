//! The one interface every isolation tier of airlock implements, and the one error they
//! all return.
//!
//! A tier is a [`Backend`]: it builds a [`Sandbox`] for a [`Shape`] (what is fixed when a
//! sandbox is built: its limits, disk, root filesystem and network) and for a [`Purpose`]
//! (one program, a session, or a pool's stock). A sandbox runs programs
//! ([`Sandbox::exec`], [`Sandbox::exec_once`]), streaming their output to an
//! [`OutputSink`] and cancellable by any readable fd; writes, reads and lists files under
//! /workspace; says whether it is still alive; and is purged when dropped: every process,
//! mount, cgroup, VM or state directory it owns is gone once `drop` returns.
//!
//! Every failure is an [`Error`] whose kind a caller can act on ([`ErrorKind`]): the
//! server maps kinds to HTTP statuses, the CLI to messages and exit codes, and a tier
//! whose sandbox lives behind a wire (the micro-VM's guest agent) sends the kind across
//! it. Nothing is classified by the text of a message.
//!
//! The server and the CLI pick a backend once, by [`airlock_spec::Isolation`], and never
//! branch on the tier after that. This crate knows no tier: each tier's crate implements
//! the traits, and only the binary knows them all.
#![deny(missing_docs)]

mod error;
mod process;
mod sink;

use airlock_spec::{ExecResult, FileEntry, Isolation, Limits, NetworkPolicy, Spec, SpecError};
use std::io::{Read, Write};
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use error::{DiskFull, Error, ErrorKind};
pub use process::{Exit, PortConnector, ProcessHandle, Spawned, Stdio};
pub use sink::{Capture, OutputSink};

/// What is fixed when a sandbox is built. Memory, CPU, pids and the timeout are also
/// applied per exec (a session's execs and a pooled sandbox's one exec may ask for less
/// or more than it was built with, within what the tier can serve: see
/// [`Backend::serves`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// The limits it is built with (a micro-VM's size, a cgroup's first settings, the
    /// disk's size).
    pub limits: Limits,
    /// Where system directories come from (`None`: the host's).
    pub rootfs: Option<PathBuf>,
    /// Its network.
    pub network: NetworkPolicy,
    /// The image whose prepared tree is its whole root (`None`: the host's system
    /// directories, or `rootfs`'s). [`Shape::of`] leaves it `None`: the caller resolves
    /// the spec's image reference against the image store.
    pub image: Option<ImageRoot>,
}

/// An image's prepared root: a host directory holding the image's whole flattened tree
/// (root-owned, readable by all, no setuid bits) in which the sandbox's mount points
/// exist: the directories /tmp, /workspace, /dev, /proc, /etc and /.airlock, and the
/// empty files /etc/passwd, /etc/group, /etc/hosts, /etc/hostname, /etc/resolv.conf and
/// /etc/nsswitch.conf. A sandbox never writes into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRoot {
    /// The image's manifest digest (`sha256:…`): what pools compare.
    pub digest: String,
    /// The prepared tree on the host.
    pub root: PathBuf,
}

impl Shape {
    /// The sandbox-wide part of `spec`.
    pub fn of(spec: &Spec) -> Shape {
        Shape {
            limits: spec.limits.clone(),
            rootfs: spec.rootfs.clone(),
            network: spec.network.clone(),
            image: None,
        }
    }
}

/// What a sandbox is built for: a tier may prepare each differently (a micro-VM pool's
/// stock is cloned from a template and warmed up; a session's is ready for files before
/// its first exec).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// One program, now ([`Sandbox::exec_once`]).
    OneShot,
    /// A session: files and any number of execs until it is dropped.
    Session,
    /// A pool's stock, built before anyone asked for it: served later to one program.
    /// With `behind`, nothing is waiting for it (the pool has others ready): the tier
    /// may build it on CPU time nothing else wants.
    Pool {
        /// Whether the pool has other sandboxes ready.
        behind: bool,
    },
}

/// One isolation tier: builds sandboxes. Shared by every request of a service, so
/// `Send + Sync`; blocking calls are made off the async threads.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Which tier it is.
    fn isolation(&self) -> Isolation;

    /// Host memory a sandbox of this tier costs beyond its program's memory cap (a
    /// micro-VM's guest kernel and VMM, gVisor's Sentry): what admission counts on top
    /// of the cap.
    fn overhead_bytes(&self) -> u64 {
        0
    }

    /// Host memory this tier holds now outside any sandbox (a micro-VM's template RAM,
    /// the shared RAM of restored snapshots): admission reserves it from the memory
    /// budget, so the budget bounds what the daemon makes the host hold. Cheap: called at
    /// every admission.
    fn held_bytes(&self) -> u64 {
        0
    }

    /// Gets ready to build sandboxes (blocking; may take long the first time on a host,
    /// e.g. building a guest image). Called once before the first [`Backend::create`];
    /// an error means the tier is unavailable here ([`ErrorKind::Unavailable`]).
    fn prepare(&self) -> Result<(), Error> {
        Ok(())
    }

    /// Says the caller is a long-running service that will build many sandboxes: the
    /// tier may start what makes each one cheaper (the namespace tier's fork server).
    /// Failing it costs speed, not isolation.
    fn start_service(&self) -> Result<(), Error> {
        Ok(())
    }

    /// Says the service stopped and every sandbox of it is purged: the tier releases
    /// what it kept for the next ones (the namespace tier's spare cgroup directories).
    fn stop_service(&self) {}

    /// Builds a sandbox of `shape` for `purpose` (blocking). A sandbox's processes may
    /// be tied to the thread that creates it (they die when it exits): long-lived
    /// sandboxes (sessions, pools) must be created on threads that live as long as the
    /// service.
    /// Implementations call [`Backend::check_shape`] first.
    fn create(&self, shape: &Shape, purpose: Purpose) -> Result<Box<dyn Sandbox>, Error>;

    /// Whether it can build a sandbox whose root is an image's tree ([`Shape::image`]).
    /// A tier that cannot refuses such a shape ([`Backend::check_shape`]): it never runs
    /// the host's root in its place.
    fn runs_images(&self) -> bool {
        false
    }

    /// Refuses a shape this tier cannot build, naming the field ([`ErrorKind::Invalid`]).
    fn check_shape(&self, shape: &Shape) -> Result<(), Error> {
        if shape.image.is_some() && !self.runs_images() {
            return Err(Error::Invalid(SpecError::new(
                "image",
                format!(
                    "is not available with isolation {} yet",
                    self.isolation().as_str()
                ),
            )));
        }
        Ok(())
    }

    /// Whether a sandbox built with `pooled` can serve a program of `wanted`: the same
    /// disk, root filesystem, image and network, and whatever else the tier fixes at
    /// build time (a micro-VM's size).
    fn serves(&self, pooled: &Shape, wanted: &Shape) -> bool {
        pooled.limits.disk_bytes == wanted.limits.disk_bytes
            && pooled.rootfs == wanted.rootfs
            && pooled.image == wanted.image
            && pooled.network == wanted.network
    }

    /// Whether its sandboxes take full snapshots ([`Sandbox::checkpoint`]): what the
    /// service asks before making room for one.
    fn checkpoints(&self) -> bool {
        false
    }

    /// A sandbox of `shape` restored from `dir`, a full snapshot this tier's
    /// [`Sandbox::checkpoint`] wrote (blocking): its memory and processes as they were.
    /// `dir` is only read: many sandboxes may be restored from one snapshot (a fork), and
    /// it may be deleted once this returns (what the sandbox still needs of it, it holds
    /// open).
    fn restore(&self, _shape: &Shape, _dir: &Path, _purpose: Purpose) -> Result<Box<dyn Sandbox>, Error> {
        Err(Error::Unavailable {
            tier: self.isolation(),
            reason: "full snapshots (memory and processes) are not available on this tier".into(),
        })
    }

    /// How many sandboxes a pool of this tier builds at once: a few for cheap sandboxes
    /// that a burst drains fast, one for those that take a core for long (an emulated
    /// VM's clone).
    fn pool_builders(&self) -> usize {
        1
    }

    /// Runs `spec` in a sandbox built for it and purged after: the CLI's one-shot.
    /// The result's `setup_ms` includes building the sandbox.
    fn run(
        &self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, Error> {
        self.run_in(&Shape::of(spec), spec, sink, cancel)
    }

    /// [`Backend::run`] in a sandbox of `shape` (`spec`'s, with its image resolved).
    fn run_in(
        &self,
        shape: &Shape,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, Error> {
        spec.validate()?;
        self.check_shape(shape)?;
        self.prepare()?;
        let mut sandbox = self.create(shape, Purpose::OneShot)?;
        let mut result = sandbox.exec_once(spec, sink, cancel)?;
        result.setup_ms = ((result.setup_ms + sandbox.setup_time().as_secs_f64() * 1e3) * 1e3).round() / 1e3;
        Ok(result)
    }
}

/// One built sandbox. Dropping it purges it (blocking: drop it off the async threads).
pub trait Sandbox: Send + std::fmt::Debug {
    /// Its id (a result's `id`, a session's id).
    fn id(&self) -> &str;

    /// How long building it took.
    fn setup_time(&self) -> Duration;

    /// Runs one program of a session (blocking); the files stay for the next, and every
    /// process of this one is gone when it returns. Output within the spec's limit also
    /// goes to `sink` as it arrives. When any `cancel` fd turns readable, the program's
    /// processes are killed and [`ErrorKind::Cancelled`] is returned (the fds are polled,
    /// never read). A program that fails is an `Ok` result; an `Err` means no result
    /// exists.
    fn exec(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, Error>;

    /// Runs the sandbox's only program (blocking): like [`Sandbox::exec`], but nothing
    /// runs after it, so a tier may skip what keeping the sandbox needs. The sandbox is
    /// dropped after.
    fn exec_once(
        &mut self,
        spec: &Spec,
        sink: &mut dyn OutputSink,
        cancel: &[BorrowedFd<'_>],
    ) -> Result<ExecResult, Error> {
        self.exec(spec, sink, cancel)
    }

    /// Makes it ready to serve a session of `shape` (blocking), whether it was built for
    /// one or taken from a pool: files may come before its first exec, and a proxy-mode
    /// network is started now, once for all its execs.
    fn open_session(&mut self, _shape: &Shape) -> Result<(), Error> {
        Ok(())
    }

    /// Writes a file at `path` under /workspace with permission bits `mode` (blocking);
    /// a readable `cancel` fd ends the write ([`ErrorKind::Cancelled`]).
    fn write_file(
        &mut self,
        path: &str,
        mode: u32,
        content: &[u8],
        cancel: &[BorrowedFd<'_>],
    ) -> Result<(), Error>;

    /// Reads the file at `path` under /workspace, at most `max_bytes` (blocking);
    /// [`ErrorKind::NotFound`] when it does not exist.
    fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<Vec<u8>, Error>;

    /// Lists /workspace recursively (blocking).
    fn list_files(&mut self) -> Result<Vec<FileEntry>, Error>;

    /// Whether it can still run programs (its init, guest or Sentry is alive).
    fn is_alive(&mut self) -> bool;

    /// Proxy mode's egress proxy, served on the host for this sandbox: what a session's
    /// policy changes and approvals go to. `None` without a proxy (mode `none`, or not
    /// started yet).
    fn egress(&self) -> Option<std::sync::Arc<airlock_egress::Proxy>> {
        None
    }

    /// Starts `spec`'s program alongside the session's execs (blocking until it has
    /// started, not until it ends): a background process, a terminal (`stdio`
    /// [`Stdio::Terminal`]), the code interpreter's kernel. Its spec's command, env and
    /// workdir are used as an exec's are; its stdin, timeout and output limit are not
    /// (the caller feeds and drains the fds, and ends it when it likes). Only for a
    /// session (after [`Sandbox::open_session`]). A tier that cannot run programs
    /// alongside execs refuses with [`Error::Unavailable`].
    fn spawn(&mut self, _spec: &Spec, _stdio: Stdio) -> Result<Spawned, Error> {
        Err(Error::Unavailable {
            tier: self.isolation(),
            reason:
                "background processes, terminals and the code interpreter are not available on this tier yet"
                    .into(),
        })
    }

    /// What opens connections to TCP ports inside it (see [`PortConnector`]); `None`
    /// when the tier cannot.
    fn ports(&self) -> Option<std::sync::Arc<dyn PortConnector>> {
        None
    }

    /// Writes its writable filesystem (/workspace, /tmp, /dev/shm: directories, regular
    /// files and symlinks, with modes and modification times) to `out` as a tar stream
    /// (blocking), in airlock-fstree's layout: paths `workspace/…`, `tmp/…`, `dev/shm/…`.
    /// What a snapshot and a fork hold on every tier.
    fn export_files(&mut self, _out: &mut dyn Write, _cancel: &[BorrowedFd<'_>]) -> Result<(), Error> {
        Err(Error::Unavailable {
            tier: self.isolation(),
            reason: "exporting its files is not available on this tier".into(),
        })
    }

    /// Replaces its writable filesystem with the content of the tar stream `input`
    /// ([`Sandbox::export_files`]'s layout; blocking): what is not in the stream is gone
    /// after. Its programs are not stopped (the caller decides). A stream that does not
    /// fit on its disk is [`Error::DiskFull`].
    fn import_files(&mut self, _input: &mut dyn Read, _cancel: &[BorrowedFd<'_>]) -> Result<(), Error> {
        Err(Error::Unavailable {
            tier: self.isolation(),
            reason: "importing files is not available on this tier".into(),
        })
    }

    /// Freezes every process in it (execs, spawned programs) until [`Sandbox::resume`]
    /// (blocking); pausing a paused sandbox does nothing.
    fn pause(&mut self) -> Result<(), Error> {
        Err(Error::Unavailable {
            tier: self.isolation(),
            reason: "pausing is not available on this tier".into(),
        })
    }

    /// Thaws what [`Sandbox::pause`] froze (blocking); resuming a running sandbox does
    /// nothing.
    fn resume(&mut self) -> Result<(), Error> {
        Err(Error::Unavailable {
            tier: self.isolation(),
            reason: "pausing is not available on this tier".into(),
        })
    }

    /// Saves its memory, processes and files into the empty directory `dir` (blocking), a
    /// full snapshot that [`Backend::restore`] brings back: `Ok(true)`. `Ok(false)` when
    /// the tier cannot (its snapshots hold files only) and nothing was written. It runs on
    /// after.
    fn checkpoint(&mut self, _dir: &Path) -> Result<bool, Error> {
        Ok(false)
    }

    /// Which tier it is.
    fn isolation(&self) -> Isolation;

    /// Says nobody waits for its purge any more (its answer is out): the tier may purge
    /// it on CPU time nothing else wants.
    fn enter_background(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tier that builds nothing: what is checked here is decided before building.
    #[derive(Debug)]
    struct Nothing(bool);

    impl Backend for Nothing {
        fn isolation(&self) -> Isolation {
            Isolation::Microvm
        }
        fn runs_images(&self) -> bool {
            self.0
        }
        fn create(&self, _: &Shape, _: Purpose) -> Result<Box<dyn Sandbox>, Error> {
            Err(Error::host("building", "not in these tests"))
        }
    }

    fn with_image(digest: &str) -> Shape {
        let mut shape = Shape::of(&Spec::new(vec!["true".into()]));
        shape.image = Some(ImageRoot {
            digest: digest.into(),
            root: format!("/var/lib/airlock/images/roots/{digest}").into(),
        });
        shape
    }

    #[test]
    fn a_pooled_sandbox_of_one_image_serves_only_that_image() {
        let (a, b) = (with_image("sha256:aa"), with_image("sha256:bb"));
        let none = Shape::of(&Spec::new(vec!["true".into()]));
        let tier = Nothing(true);
        assert!(tier.serves(&a, &a));
        assert!(!tier.serves(&a, &b));
        assert!(!tier.serves(&a, &none));
        assert!(!tier.serves(&none, &a));
    }

    #[test]
    fn a_tier_that_cannot_run_images_refuses_them_on_image() {
        let err = Nothing(false).check_shape(&with_image("sha256:aa")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid);
        assert_eq!(
            err.to_string(),
            "invalid request: image: is not available with isolation microvm yet"
        );
        Nothing(true).check_shape(&with_image("sha256:aa")).unwrap();
        Nothing(false)
            .check_shape(&Shape::of(&Spec::new(vec!["true".into()])))
            .unwrap();
    }
}
