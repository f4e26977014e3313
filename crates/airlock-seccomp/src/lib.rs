//! airlock's seccomp policy, compiled to a classic BPF program.
//!
//! Pure: building the program needs no privileges and makes no syscalls, so it can be unit
//! tested and fuzzed anywhere. Only [`apply`] talks to the kernel.
//!
//! # Quickstart
//!
//! The supervisor builds the program once, before any fork, and hands its bytes to the
//! sandbox's init process over a pipe; init turns them back into a program and applies it as
//! the last step before `execve`, after `PR_SET_NO_NEW_PRIVS`.
//!
//! ```
//! // Outside the sandbox: compile the policy and serialize it.
//! let program = airlock_seccomp::build()?;
//! let bytes = airlock_seccomp::to_bytes(&program);
//!
//! // In init: read the bytes back (buffer prepared before the fork of the payload) ...
//! let program = airlock_seccomp::from_bytes(&bytes)?;
//! assert!(!program.is_empty());
//!
//! // ... and in the payload child, between fork and execve (not run here: it would filter
//! // this test process):
//! fn in_child(program: &[airlock_seccomp::sock_filter]) -> std::io::Result<()> {
//!     // SAFETY: prctl with PR_SET_NO_NEW_PRIVS and constant arguments touches no memory.
//!     if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
//!         return Err(std::io::Error::last_os_error());
//!     }
//!     airlock_seccomp::apply(program)
//! }
//! # let _ = in_child;
//! # Ok::<(), airlock_seccomp::SeccompError>(())
//! ```
//!
//! # The policy
//!
//! An allowlist (see `policy.rs`): the syscalls that python3 (threads, multiprocessing,
//! ctypes), node, bash, coreutils, gcc/as/ld, make and pip make. Anything else is refused with
//! `EPERM`; nothing the payload does on this architecture kills it. The exceptions to plain
//! allow/`EPERM`:
//!
//! - `clone` is allowed only without namespace flags (`CLONE_NEWNS`, `CLONE_NEWUTS`,
//!   `CLONE_NEWIPC`, `CLONE_NEWUSER`, `CLONE_NEWPID`, `CLONE_NEWNET`, `CLONE_NEWCGROUP`,
//!   `CLONE_NEWTIME`).
//! - `clone3` fails with `ENOSYS`: its flags are behind a pointer the filter cannot read, and
//!   `ENOSYS` makes glibc fall back to `clone`.
//! - `ioctl` is allowed except `TIOCSTI` and `TIOCLINUX` (compared on the request's low 32
//!   bits, as the kernel does, so `0x1_0000_5412` is refused too).
//! - `socket` is allowed for `AF_UNIX`, `AF_INET` and `AF_INET6`, and `socketpair` for
//!   `AF_UNIX`; other families fail with `EAFNOSUPPORT`.
//! - `personality` is allowed only to query (`0xffffffff`) or to set `PER_LINUX` (0).
//!
//! # Architectures
//!
//! The program is built for the architecture this crate is compiled for (x86_64 or aarch64)
//! and begins with an architecture check: a syscall whose `seccomp_data.arch` is
//! not that architecture's `AUDIT_ARCH_*` gets `SECCOMP_RET_KILL_PROCESS`. On x86_64 that is
//! the i386 ABI (`int 0x80`, or 32-bit code after a far jump): those calls have other numbers,
//! so the only safe answers are to filter them separately or to kill, and nothing we run needs
//! them, so killing the process is the accepted answer. It is the only way this filter kills.
//!
//! x32 syscalls arrive with `AUDIT_ARCH_X86_64` and the number or-ed with `0x4000_0000`. Every
//! rule matches an exact syscall number below that bit, so an x32 call matches no rule and is
//! refused with `EPERM` (the tests check this for every number in the policy).

#![deny(missing_docs)]

mod dispatch;
mod policy;
mod sys;

use std::collections::BTreeMap;
use std::io;

use dispatch::Class;
use policy::RuleMap;

/// The BPF program type ([`Vec`] of [`sock_filter`]) and its instruction, re-exported so callers
/// need not depend on seccompiler themselves.
pub use seccompiler::{BpfProgram, sock_filter};
use seccompiler::{SeccompAction, SeccompFilter, TargetArch};

/// The kernel's limit on the length of a classic BPF program (`BPF_MAXINSNS`), and so the bound
/// on what [`from_bytes`] accepts.
pub const BPF_MAXINSNS: usize = 4096;

/// Bytes per serialized instruction: `u16 code, u8 jt, u8 jf, u32 k`, as in the kernel's
/// `struct sock_filter`.
pub const INSTRUCTION_BYTES: usize = 8;

#[cfg(target_arch = "x86_64")]
const TARGET_ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const TARGET_ARCH: TargetArch = TargetArch::aarch64;
/// `AUDIT_ARCH_*` of [`TARGET_ARCH`]: what `seccomp_data.arch` says for native syscalls.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("airlock-seccomp has a policy for x86_64 and aarch64 only");

/// The action of the segments that only pick out special errnos, for "no opinion, go on to the
/// next segment". Never returned to the kernel: [`build`] rewrites every return of it into a
/// jump. `SECCOMP_RET_TRACE` with a marker value, an action the policy otherwise never uses.
const FALL_THROUGH: SeccompAction = SeccompAction::Trace(0x0a1c);

/// Errors from building or deserializing a program.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeccompError {
    /// seccompiler rejected the policy (a bug in this crate's tables).
    #[error("compiling the seccomp policy: {0}")]
    Compile(#[from] seccompiler::BackendError),
    /// The bytes are not a whole, non-zero number of instructions.
    #[error("a serialized BPF program must be a non-zero multiple of {INSTRUCTION_BYTES} bytes, got {0}")]
    BadLength(usize),
    /// A syscall number of the policy is negative or too large (a bug in this crate's tables).
    #[error("a syscall number of the policy does not fit in 32 bits")]
    Number,
    /// The program is longer than the kernel accepts.
    #[error("the BPF program has {0} instructions; the kernel accepts at most {BPF_MAXINSNS}")]
    TooLong(usize),
}

/// Compiles airlock's policy for the architecture this crate is built for.
///
/// The program starts with the architecture check and a binary search over the syscall
/// number (see `dispatch.rs`) that allows the always-allowed syscalls and refuses the rest
/// with their errno, reading no argument. Only syscalls with argument rules go on to a chain
/// of seccompiler filters: first the segments that refuse with a specific errno (foreign
/// socket families -> `EAFNOSUPPORT`), which fall through to the next segment when they do
/// not match, then the allowlist of argument rules, which returns `EPERM` for what it does
/// not allow.
pub fn build() -> Result<BpfProgram, SeccompError> {
    let allowed = policy::allowed()?;
    let overrides = policy::errno_overrides()?;
    let mut classes = BTreeMap::new();
    for (&nr, rules) in &allowed {
        classes.insert(
            nr,
            if rules.is_empty() {
                Class::Allow
            } else {
                Class::Rules
            },
        );
    }
    // The overrides come first in the chain, so their class wins.
    for (errno, rules_of) in &overrides {
        for (&nr, rules) in rules_of {
            classes.insert(
                nr,
                if rules.is_empty() {
                    Class::Errno(*errno)
                } else {
                    Class::Rules
                },
            );
        }
    }
    let classes: Vec<(u32, Class)> = classes
        .into_iter()
        .map(|(nr, class)| u32::try_from(nr).map(|nr| (nr, class)))
        .collect::<Result<_, _>>()
        .map_err(|_| SeccompError::Number)?;
    let conditioned: RuleMap = allowed
        .into_iter()
        .filter(|(_, rules)| !rules.is_empty())
        .collect();
    let rules = chain(overrides, conditioned)?;
    let program = dispatch::program(AUDIT_ARCH, &classes, Class::Errno(libc::EPERM as u32), rules);
    if program.len() > BPF_MAXINSNS {
        return Err(SeccompError::TooLong(program.len()));
    }
    Ok(program)
}

/// seccompiler's filters, one after the other: a segment per errno override (falling
/// through when it does not match), then `allowed` (`EPERM` for what it does not allow).
fn chain(overrides: Vec<(u32, RuleMap)>, allowed: RuleMap) -> Result<BpfProgram, SeccompError> {
    let mut program = BpfProgram::new();
    for (errno, rules) in overrides {
        let filter = SeccompFilter::new(rules, FALL_THROUGH, SeccompAction::Errno(errno), TARGET_ARCH)?;
        let mut segment = BpfProgram::try_from(filter)?;
        fall_through(&mut segment);
        program.append(&mut segment);
    }
    let allowlist = SeccompFilter::new(
        allowed,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        TARGET_ARCH,
    )?;
    program.append(&mut BpfProgram::try_from(allowlist)?);
    Ok(program)
}

/// Turns every `return FALL_THROUGH` of `segment` into a jump to the instruction just past the
/// segment, i.e. to the start of whatever is appended after it.
///
/// Classic BPF jumps only forward and `BPF_JA` takes a 32-bit offset, so this is always
/// expressible; the kernel's verifier checks the result again when the program is applied.
fn fall_through(segment: &mut [sock_filter]) {
    const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    const BPF_JMP_JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
    let marker = u32::from(FALL_THROUGH);
    let len = segment.len();
    for (index, insn) in segment.iter_mut().enumerate() {
        if insn.code == BPF_RET_K && insn.k == marker {
            // After a jump the kernel runs instruction `index + 1 + k`; we want `len`.
            // Programs are at most BPF_MAXINSNS long, so this fits in u32.
            let offset = u32::try_from(len - index - 1).unwrap_or(u32::MAX);
            *insn = sock_filter {
                code: BPF_JMP_JA,
                jt: 0,
                jf: 0,
                k: offset,
            };
        }
    }
}

/// Serializes a program, to pass it over a pipe to the sandbox's init process.
///
/// [`INSTRUCTION_BYTES`] per instruction, in native byte order: both ends are on the same
/// machine, and the kernel reads the program in native order.
pub fn to_bytes(prog: &[sock_filter]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(prog.len() * INSTRUCTION_BYTES);
    for insn in prog {
        bytes.extend_from_slice(&insn.code.to_ne_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend_from_slice(&insn.k.to_ne_bytes());
    }
    bytes
}

/// Deserializes what [`to_bytes`] wrote.
///
/// Checks only the framing (a whole number of instructions, between 1 and [`BPF_MAXINSNS`]);
/// the kernel verifies the program itself when it is applied.
pub fn from_bytes(bytes: &[u8]) -> Result<BpfProgram, SeccompError> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(INSTRUCTION_BYTES) {
        return Err(SeccompError::BadLength(bytes.len()));
    }
    let len = bytes.len() / INSTRUCTION_BYTES;
    if len > BPF_MAXINSNS {
        return Err(SeccompError::TooLong(len));
    }
    Ok(bytes
        .chunks_exact(INSTRUCTION_BYTES)
        .map(|chunk| sock_filter {
            code: u16::from_ne_bytes([chunk[0], chunk[1]]),
            jt: chunk[2],
            jf: chunk[3],
            k: u32::from_ne_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]),
        })
        .collect())
}

/// Installs `prog` on the calling thread (and so on every process it later forks or execs).
///
/// The caller must have set `PR_SET_NO_NEW_PRIVS` already (the kernel refuses with `EACCES`
/// otherwise, unless the caller has `CAP_SYS_ADMIN`); this function does not set it, so that
/// the order of the isolation steps stays visible at the call site. Threads that already exist
/// are not filtered. Neither allocates nor takes locks: safe to call between `fork` and
/// `execve`.
pub fn apply(prog: &[sock_filter]) -> io::Result<()> {
    sys::seccomp_set_mode_filter(prog)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::policy::{
        CLONE_NAMESPACE_FLAGS, PER_LINUX, PERSONALITY_QUERY, TIOCLINUX, TIOCSTI, always_allowed, denied,
    };

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const KILL_PROCESS: u32 = libc::SECCOMP_RET_KILL_PROCESS;

    fn errno(e: i32) -> u32 {
        libc::SECCOMP_RET_ERRNO | e as u32
    }

    const AUDIT_ARCH_I386: u32 = 0x4000_0003;
    const X32_SYSCALL_BIT: i64 = 0x4000_0000;

    /// Runs `prog` the way the kernel does, on the `struct seccomp_data` for one syscall.
    /// Knows the instructions seccompiler and `fall_through` emit; panics on anything else, and
    /// on every way the kernel's verifier would reject the program (jumps out of range, falling
    /// off the end, misaligned or out-of-bounds loads).
    fn run(prog: &[sock_filter], arch: u32, nr: i64, args: [u64; 6]) -> u32 {
        run_traced(prog, arch, nr, args).0
    }

    /// [`run`], also saying whether the program read an argument (anything past `nr`, `arch`
    /// and the instruction pointer) on its way.
    fn run_traced(prog: &[sock_filter], arch: u32, nr: i64, args: [u64; 6]) -> (u32, bool) {
        let mut read_args = false;
        let mut data = Vec::with_capacity(64);
        data.extend_from_slice(&(nr as i32).to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes()); // instruction_pointer
        for arg in args {
            data.extend_from_slice(&arg.to_ne_bytes());
        }
        let (ld, alu_and, ja, jeq, jgt, jge, ret) = (
            (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16,
            (libc::BPF_JMP | libc::BPF_JA) as u16,
            (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16,
            (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16,
            (libc::BPF_RET | libc::BPF_K) as u16,
        );
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        loop {
            let insn = prog.get(pc).expect("program runs off its end");
            pc += 1;
            let jump = |taken: bool| usize::from(if taken { insn.jt } else { insn.jf });
            match insn.code {
                c if c == ld => {
                    let k = insn.k as usize;
                    assert!(k.is_multiple_of(4) && k + 4 <= data.len(), "bad load offset {k}");
                    read_args |= k >= 16;
                    acc = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap());
                }
                c if c == alu_and => acc &= insn.k,
                c if c == ja => pc += insn.k as usize,
                c if c == jeq => pc += jump(acc == insn.k),
                c if c == jgt => pc += jump(acc > insn.k),
                c if c == jge => pc += jump(acc >= insn.k),
                c if c == ret => return (insn.k, read_args),
                c => panic!("unexpected BPF opcode {c:#x} at {}", pc - 1),
            }
        }
    }

    fn program() -> BpfProgram {
        build().expect("the policy compiles")
    }

    fn check(prog: &[sock_filter], nr: i64, args: [u64; 6]) -> u32 {
        run(prog, AUDIT_ARCH, nr, args)
    }

    /// Argument patterns for "whatever the arguments".
    const ARG_SAMPLES: [[u64; 6]; 4] = [
        [0; 6],
        [u64::MAX; 6],
        [1, 2, 3, 4, 5, 6],
        [0x1_0000_0000, 0x5412, 0xffff_ffff, 0, 1, 0],
    ];

    #[test]
    fn builds_within_the_kernel_limit() {
        let prog = program();
        assert!(!prog.is_empty());
        assert!(prog.len() <= BPF_MAXINSNS, "{} instructions", prog.len());
    }

    /// The policy laid out as seccompiler alone lays it out: every rule in one chain.
    fn linear() -> BpfProgram {
        chain(policy::errno_overrides().unwrap(), policy::allowed().unwrap()).unwrap()
    }

    #[test]
    fn the_dispatcher_decides_as_the_plain_chain_does() {
        let (fast, slow) = (program(), linear());
        assert!(
            fast.len() * 3 < slow.len(),
            "{} vs {} instructions",
            fast.len(),
            slow.len()
        );
        let numbers = (0..1024).chain((0..1024).map(|nr| nr | X32_SYSCALL_BIT)).chain([
            -1,
            -2,
            0x3fff_ffff,
            i64::from(i32::MAX),
            i64::from(i32::MIN),
        ]);
        for nr in numbers {
            for args in ARG_SAMPLES.into_iter().chain([
                [libc::AF_INET as u64, 1, 0, 0, 0, 0],
                [libc::AF_UNIX as u64, 0x5412, 0, 0, 0, 0],
                [libc::CLONE_NEWUSER as u64, 0x541C, 0, 0, 0, 0],
            ]) {
                for arch in [AUDIT_ARCH, AUDIT_ARCH_I386] {
                    assert_eq!(
                        run(&fast, arch, nr, args),
                        run(&slow, arch, nr, args),
                        "syscall {nr:#x} arch {arch:#x} {args:x?}"
                    );
                }
            }
        }
    }

    #[test]
    fn always_allowed_and_unknown_syscalls_are_decided_from_the_number_alone() {
        // What lets the kernel cache "always allowed" per number and skip the filter.
        let prog = program();
        let conditioned = [
            libc::SYS_clone,
            libc::SYS_ioctl,
            libc::SYS_personality,
            libc::SYS_socket,
            libc::SYS_socketpair,
        ];
        for nr in (0..1024).filter(|nr| !conditioned.contains(nr)) {
            let (_, read_args) = run_traced(&prog, AUDIT_ARCH, nr, [0; 6]);
            assert!(!read_args, "syscall {nr} reads its arguments");
        }
        for nr in conditioned {
            assert!(run_traced(&prog, AUDIT_ARCH, nr, [0; 6]).1, "syscall {nr}");
        }
    }

    #[test]
    fn bytes_round_trip() {
        let prog = program();
        let bytes = to_bytes(&prog);
        assert_eq!(bytes.len(), prog.len() * INSTRUCTION_BYTES);
        assert_eq!(from_bytes(&bytes).unwrap(), prog);
    }

    #[test]
    fn from_bytes_checks_the_framing() {
        assert!(matches!(from_bytes(&[]), Err(SeccompError::BadLength(0))));
        assert!(matches!(from_bytes(&[0; 12]), Err(SeccompError::BadLength(12))));
        let too_long = vec![0; (BPF_MAXINSNS + 1) * INSTRUCTION_BYTES];
        assert!(matches!(
            from_bytes(&too_long),
            Err(SeccompError::TooLong(n)) if n == BPF_MAXINSNS + 1
        ));
        let longest = vec![0; BPF_MAXINSNS * INSTRUCTION_BYTES];
        assert_eq!(from_bytes(&longest).unwrap().len(), BPF_MAXINSNS);
    }

    #[test]
    fn apply_refuses_bad_lengths_without_calling_the_kernel_with_them() {
        let empty: &[sock_filter] = &[];
        assert_eq!(apply(empty).unwrap_err().raw_os_error(), Some(libc::EINVAL));
        let allow = sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: ALLOW,
        };
        let too_long = vec![allow; BPF_MAXINSNS + 1];
        assert_eq!(apply(&too_long).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn lists_have_no_duplicates_and_do_not_overlap() {
        let mut seen = BTreeSet::new();
        for (nr, name) in always_allowed() {
            assert!(seen.insert(nr), "{name} ({nr}) is allowed twice");
            assert!((0..X32_SYSCALL_BIT).contains(&nr), "{name}: odd number {nr}");
        }
        let conditioned = [
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_ioctl,
            libc::SYS_personality,
            libc::SYS_socket,
            libc::SYS_socketpair,
        ];
        for nr in conditioned {
            assert!(!seen.contains(&nr), "{nr} must only be allowed by its rule");
        }
        let mut seen_denied = BTreeSet::new();
        for (nr, name) in denied() {
            assert!(seen_denied.insert(nr), "{name} is denied twice");
            assert!(!seen.contains(&nr), "{name} is both allowed and denied");
            assert!(!conditioned.contains(&nr), "{name} is conditioned and denied");
        }
    }

    #[test]
    fn allowed_syscalls_are_allowed_whatever_the_arguments() {
        let prog = program();
        for (nr, name) in always_allowed() {
            for args in ARG_SAMPLES {
                assert_eq!(check(&prog, nr, args), ALLOW, "{name} {args:x?}");
            }
        }
    }

    #[test]
    fn denied_syscalls_get_eperm_whatever_the_arguments() {
        let prog = program();
        for (nr, name) in denied() {
            for args in ARG_SAMPLES {
                assert_eq!(check(&prog, nr, args), errno(libc::EPERM), "{name} {args:x?}");
            }
        }
    }

    #[test]
    fn unknown_syscalls_get_eperm_and_nothing_kills() {
        let prog = program();
        let allowed: BTreeSet<i64> = always_allowed().into_iter().map(|(nr, _)| nr).collect();
        for nr in (0..1024).chain([-1, 0x3fff_ffff, i64::from(i32::MAX)]) {
            let action = check(&prog, nr, [0; 6]);
            assert_ne!(action, KILL_PROCESS, "syscall {nr} kills");
            if !allowed.contains(&nr) {
                let expected = match nr {
                    libc::SYS_clone3 => errno(libc::ENOSYS),
                    // Family 0 (AF_UNSPEC) is not one we allow.
                    libc::SYS_socket | libc::SYS_socketpair => errno(libc::EAFNOSUPPORT),
                    // All-zero arguments satisfy these rules (tested on their own below).
                    libc::SYS_clone | libc::SYS_ioctl | libc::SYS_personality => ALLOW,
                    _ => errno(libc::EPERM),
                };
                assert_eq!(action, expected, "syscall {nr}");
            }
        }
    }

    #[test]
    fn only_allow_errno_and_the_arch_kill_are_ever_returned() {
        let prog = program();
        let ret = (libc::BPF_RET | libc::BPF_K) as u16;
        let ld_arch = sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 4, // offsetof(struct seccomp_data, arch)
        };
        for (index, insn) in prog.iter().enumerate().filter(|(_, i)| i.code == ret) {
            let action = insn.k & libc::SECCOMP_RET_ACTION_FULL;
            match action {
                libc::SECCOMP_RET_ALLOW | libc::SECCOMP_RET_ERRNO => {}
                libc::SECCOMP_RET_KILL_PROCESS => {
                    // seccompiler's arch check: load arch, compare, kill.
                    assert!(index >= 2, "kill at {index}");
                    assert_eq!(prog[index - 2], ld_arch, "kill at {index}");
                    assert_eq!(prog[index - 1].k, AUDIT_ARCH, "kill at {index}");
                }
                other => panic!("instruction {index} returns action {other:#x}"),
            }
        }
    }

    #[test]
    fn foreign_architecture_is_killed() {
        let prog = program();
        for (nr, _) in always_allowed().into_iter().take(20) {
            assert_eq!(run(&prog, AUDIT_ARCH_I386, nr, [0; 6]), KILL_PROCESS);
        }
        // i386 `int 0x80` with the i386 numbers of exit (1) and execve (11).
        assert_eq!(run(&prog, AUDIT_ARCH_I386, 1, [0; 6]), KILL_PROCESS);
        assert_eq!(run(&prog, AUDIT_ARCH_I386, 11, [0; 6]), KILL_PROCESS);
    }

    #[test]
    fn x32_syscalls_are_refused() {
        let prog = program();
        let every_number = always_allowed()
            .into_iter()
            .chain(denied())
            .map(|(nr, _)| nr)
            .chain([
                libc::SYS_clone,
                libc::SYS_clone3,
                libc::SYS_ioctl,
                libc::SYS_personality,
                libc::SYS_socket,
                libc::SYS_socketpair,
            ]);
        for nr in every_number {
            let x32 = nr | X32_SYSCALL_BIT;
            for args in [[0; 6], [libc::AF_UNIX as u64, 1, 0, 0, 0, 0]] {
                assert_eq!(
                    check(&prog, x32, args),
                    errno(libc::EPERM),
                    "x32 syscall {x32:#x}"
                );
            }
        }
    }

    #[test]
    fn clone_without_namespace_flags_only() {
        let prog = program();
        let clone = |flags: u64| check(&prog, libc::SYS_clone, [flags, 0, 0, 0, 0, 0]);
        // fork, as glibc does it; threads, as pthread_create does it; vfork as posix_spawn does.
        let fork = (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD) as u64;
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        let vfork = (libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as u64;
        for flags in [
            0,
            fork,
            thread,
            vfork,
            u64::from(u32::MAX) & !CLONE_NAMESPACE_FLAGS,
        ] {
            assert_eq!(clone(flags), ALLOW, "clone({flags:#x})");
        }
        for bit in 0..32 {
            let flag = 1u64 << bit;
            if flag & CLONE_NAMESPACE_FLAGS != 0 {
                assert_eq!(clone(flag), errno(libc::EPERM), "clone({flag:#x})");
                assert_eq!(clone(fork | flag), errno(libc::EPERM));
                assert_eq!(clone(flag | 0xffff_ffff_0000_0000), errno(libc::EPERM));
            }
        }
        // The kernel keeps only the low 32 bits of clone's flags, and so does the rule.
        assert_eq!(clone(0xffff_ffff_0000_0000 | fork), ALLOW);
        // clone3's flags are out of reach: always ENOSYS, so libc falls back to clone.
        for args in ARG_SAMPLES {
            assert_eq!(check(&prog, libc::SYS_clone3, args), errno(libc::ENOSYS));
        }
    }

    #[test]
    fn ioctl_refuses_terminal_injection_only() {
        let prog = program();
        let ioctl = |request: u64| check(&prog, libc::SYS_ioctl, [0, request, 0, 0, 0, 0]);
        for request in [
            TIOCSTI,
            TIOCLINUX,
            0x1_0000_5412,
            0xffff_ffff_0000_5412,
            0x8000_0000_0000_541c,
        ] {
            assert_eq!(ioctl(request), errno(libc::EPERM), "ioctl({request:#x})");
        }
        for request in [
            libc::TCGETS,
            libc::TCSETS,
            libc::TIOCGWINSZ,
            libc::FIONREAD,
            libc::FIONBIO,
            libc::FIOCLEX,
            0x5413,
            0x5411,
            0x5412_0000,
        ] {
            assert_eq!(ioctl(request), ALLOW, "ioctl({request:#x})");
        }
    }

    #[test]
    fn socket_families() {
        let prog = program();
        let socket = |nr: i64, family: i32| check(&prog, nr, [family as u64, 1, 0, 0, 0, 0]);
        for family in [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6] {
            assert_eq!(socket(libc::SYS_socket, family), ALLOW, "family {family}");
        }
        for family in [
            libc::AF_NETLINK,
            libc::AF_PACKET,
            libc::AF_VSOCK,
            libc::AF_ALG,
            libc::AF_KEY,
            libc::AF_BLUETOOTH,
            libc::AF_XDP,
            libc::AF_TIPC,
            libc::AF_UNSPEC,
            -1,
        ] {
            assert_eq!(
                socket(libc::SYS_socket, family),
                errno(libc::EAFNOSUPPORT),
                "family {family}"
            );
        }
        assert_eq!(socket(libc::SYS_socketpair, libc::AF_UNIX), ALLOW);
        for family in [libc::AF_INET, libc::AF_NETLINK, libc::AF_VSOCK] {
            assert_eq!(
                socket(libc::SYS_socketpair, family),
                errno(libc::EAFNOSUPPORT),
                "socketpair family {family}"
            );
        }
        // The kernel reads the family as an int: high bits do not change it.
        assert_eq!(
            check(&prog, libc::SYS_socket, [0x1_0000_0010, 3, 0, 0, 0, 0]),
            errno(libc::EAFNOSUPPORT)
        );
    }

    #[test]
    fn personality_query_and_default_only() {
        let prog = program();
        let personality = |p: u64| check(&prog, libc::SYS_personality, [p, 0, 0, 0, 0, 0]);
        assert_eq!(personality(PERSONALITY_QUERY), ALLOW);
        assert_eq!(personality(PER_LINUX), ALLOW);
        for persona in [
            0x0040000, // ADDR_NO_RANDOMIZE
            0x0400000, // READ_IMPLIES_EXEC
            0x0000008, // UNAME26
            0x0000001,
            0x0008000, // PER_LINUX32
            0xffff_fffe,
        ] {
            assert_eq!(
                personality(persona),
                errno(libc::EPERM),
                "personality({persona:#x})"
            );
        }
    }

    #[test]
    fn fall_through_rewrites_only_the_marker() {
        let ret = |k| sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k,
        };
        let marker = u32::from(FALL_THROUGH);
        let mut segment = vec![ret(marker), ret(ALLOW), ret(marker)];
        fall_through(&mut segment);
        let ja = (libc::BPF_JMP | libc::BPF_JA) as u16;
        assert_eq!((segment[0].code, segment[0].k), (ja, 2));
        assert_eq!(segment[1], ret(ALLOW));
        assert_eq!((segment[2].code, segment[2].k), (ja, 0));
    }
}
