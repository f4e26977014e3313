//! Landlock, the second wall behind the mount namespace: even if a path of the host were
//! reachable, the program could only read and execute system directories (with an image's
//! root: the whole image, which is all there is) and write its scratch space. Newer ABIs
//! add TCP rules (no TCP connect at all while the network policy is "none") and scoping (no signals to, and no abstract sockets of, processes outside the
//! sandbox's domain). In proxy mode a program may connect to any TCP port: every
//! connection to an address but loopback's is redirected to the proxy (see `nftables`),
//! which polices it, and loopback holds nothing but the proxy's sockets and the
//! program's own.
//!
//! TCP bind is allowed in every mode: a server in a session (`python3 -m http.server
//! 8000`) must listen. That opens nothing to the outside: the listener lives in the
//! sandbox's own network namespace, whose only interfaces are its loopback and (proxy
//! mode) a TUN device that carries nothing inbound; the one way in is airlock's port
//! connector (see `ports`), which the service reaches only for the session's owner.
//! Binding cannot take a port away from the proxy either: its sockets are bound before
//! any program runs.
//!
//! ABI 1 is required (fail closed); later ABIs are applied when the kernel has them.

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, RestrictionStatus, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};

/// The newest ABI whose rights this policy was written and tested against.
const POLICY_ABI: ABI = ABI::V6;

/// Why the ruleset could not be built or applied.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// Building the ruleset failed.
    #[error("landlock ruleset: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    /// The kernel enforced nothing.
    #[error(
        "landlock is not available on this kernel (it needs Linux >= 5.13 with landlock in the lsm= boot list)"
    )]
    NotEnforced,
}

/// Asks the kernel which landlock ABI it has (0 when landlock is off).
pub fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: with a null attribute, size 0 and the VERSION flag the call only returns
    // the ABI number (or -1 with errno); it touches no memory.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 { 0 } else { v as i32 }
}

/// The system directories a program may read and execute when its root is built from
/// the host's (or a rootfs's): the bound [`crate::mounts::SYSTEM_DIRS`] and /etc.
const SYSTEM_PATHS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// Builds the ruleset, opening the paths it names. Called in init after the filesystem
/// is built, before the program is forked; the fork applies it with [`restrict`].
/// With `image_root` the whole root is an image's read-only tree: all of it may be read
/// and executed (an image puts programs anywhere: /opt, /app, /usr/local...); with
/// `image_writable` too (an image build's step), all of it may be written as well (the
/// tree is that step's own copy). With `connect_tcp` (proxy mode), TCP connections are
/// left to the network namespace's rules; without, none is allowed. TCP bind is always
/// allowed (see the module docs).
pub fn prepare(
    connect_tcp: bool,
    image_root: bool,
    image_writable: bool,
) -> Result<RulesetCreated, LandlockError> {
    let read_exec = AccessFs::from_read(POLICY_ABI);
    let read_only = read_exec & !AccessFs::Execute;
    // Writable scratch space: everything but creating device nodes.
    let read_write = AccessFs::from_all(POLICY_ABI) & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let devices: BitFlags<AccessFs> =
        AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev | AccessFs::Truncate;

    // Network rights the ruleset restricts (and grants none of): TCP connect, unless
    // proxy mode leaves it to the namespace's rules. Never TCP bind (see the module docs).
    let net: BitFlags<AccessNet> = if connect_tcp {
        BitFlags::empty()
    } else {
        AccessNet::from_all(POLICY_ABI) & AccessNet::ConnectTcp
    };
    let ruleset = Ruleset::default()
        // The filesystem rules are the baseline: without them, refuse.
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI::V1))?
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(POLICY_ABI))?;
    let ruleset = if net.is_empty() {
        ruleset
    } else {
        ruleset.handle_access(net)?
    };
    let ruleset = ruleset.scope(Scope::from_all(POLICY_ABI))?.create()?;
    let ruleset = ruleset
        .add_rules(path_beneath_rules(["/"], AccessFs::ReadDir))?
        .add_rules(path_beneath_rules(
            if image_root { &["/"][..] } else { SYSTEM_PATHS },
            read_exec,
        ))?
        // /proc is the sandbox's own (its pid namespace); writes there are guarded by
        // ownership and ptrace checks, /proc/sys is mounted read-only and the dangerous
        // files are masked. Programs write /proc/self/... (thread names via
        // /proc/self/task/*/comm, for one), so writing files is allowed.
        .add_rules(path_beneath_rules(["/proc"], read_only | AccessFs::WriteFile))?
        .add_rules(path_beneath_rules(["/dev"], devices | AccessFs::ReadDir))?
        .add_rules(path_beneath_rules(["/tmp", "/workspace", "/dev/shm"], read_write))?;
    let ruleset = if image_root && image_writable {
        ruleset.add_rules(path_beneath_rules(["/"], read_write))?
    } else {
        ruleset
    };
    Ok(ruleset)
}

/// Restricts the calling process (the program, after fork). Requires no_new_privs.
pub fn restrict(ruleset: RulesetCreated) -> Result<RestrictionStatus, LandlockError> {
    let status = ruleset.restrict_self()?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(LandlockError::NotEnforced);
    }
    Ok(status)
}
