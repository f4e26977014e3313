//! A binary search over syscall numbers, put in front of seccompiler's rule chains.
//!
//! seccompiler lays a filter out as one comparison per syscall, in a row: the kernel's check of
//! a syscall near the end of our 300-entry allowlist runs hundreds of instructions, and what the
//! kernel does once per filter it installs (convert the program, JIT it, and run it for every
//! syscall number to find those it may cache as always allowed) grows with that length. Every
//! sandbox installs the filter, so this was the largest single cost of building one.
//!
//! Here each syscall number is first classed by the policy alone: allowed whatever its
//! arguments, refused with an errno whatever its arguments, or "look at the arguments". A
//! balanced tree of `>=` comparisons over the ranges of equal class decides the first two in
//! about `log2(ranges)` instructions without reading an argument (so the kernel caches every
//! always-allowed number), and sends the rest to seccompiler's chains, which now hold only the
//! few syscalls that have argument rules.

use seccompiler::sock_filter;

/// What the dispatcher does with one syscall number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// `SECCOMP_RET_ALLOW`.
    Allow,
    /// `SECCOMP_RET_ERRNO` with this errno.
    Errno(u32),
    /// Go on to the argument rules.
    Rules,
}

/// A leaf or comparison of the tree, before the position of the rule chains is known.
enum Insn {
    Raw(sock_filter),
    /// `ja` to the first instruction after the tree.
    ToRules,
}

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
/// `offsetof(struct seccomp_data, nr)` and `arch`.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

fn ret(class: Class) -> Insn {
    match class {
        Class::Allow => Insn::Raw(insn(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW)),
        Class::Errno(errno) => Insn::Raw(insn(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | errno)),
        Class::Rules => Insn::ToRules,
    }
}

/// Builds `[architecture check][load nr][tree][rules]`.
///
/// `classes` maps syscall numbers (all below the x32 bit) to their class; every other number,
/// x32 and negative ones included, gets `default`. `audit_arch` is the architecture the
/// program accepts; any other is killed, as seccompiler's own check does (the rule chains
/// repeat that check, harmlessly). `rules` is appended as is and must end in returns.
pub(crate) fn program(
    audit_arch: u32,
    classes: &[(u32, Class)],
    default: Class,
    rules: Vec<sock_filter>,
) -> Vec<sock_filter> {
    let ranges = ranges(classes, default);
    let mut tree = Vec::new();
    emit(&ranges, &mut tree);
    let mut program = vec![
        insn(LD_W_ABS, 0, 0, OFFSET_ARCH),
        insn(JEQ_K, 1, 0, audit_arch),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        insn(LD_W_ABS, 0, 0, OFFSET_NR),
    ];
    let rules_at = program.len() + tree.len();
    for op in tree {
        let raw = match op {
            Insn::Raw(raw) => raw,
            Insn::ToRules => {
                // After a jump the kernel runs instruction `here + 1 + k`. Programs are at
                // most BPF_MAXINSNS long, so this fits in u32.
                let k = rules_at - program.len() - 1;
                insn(JA, 0, 0, u32::try_from(k).unwrap_or(u32::MAX))
            }
        };
        program.push(raw);
    }
    program.extend(rules);
    program
}

/// The number line cut into ranges of one class: `(first number, class)`, ascending, the
/// first starting at 0, neighbours of different classes. The last runs to `u32::MAX`.
fn ranges(classes: &[(u32, Class)], default: Class) -> Vec<(u32, Class)> {
    let mut sorted = classes.to_vec();
    sorted.sort_by_key(|(nr, _)| *nr);
    let mut ranges: Vec<(u32, Class)> = vec![(0, default)];
    let mut push = |start: u32, class: Class| {
        if let Some(last) = ranges.last_mut() {
            if last.1 == class {
                return;
            }
            if last.0 == start {
                // An empty range (a number right where the previous range began).
                *last = (start, class);
                return;
            }
        }
        ranges.push((start, class));
    };
    for (nr, class) in sorted {
        push(nr, class);
        if let Some(next) = nr.checked_add(1) {
            push(next, default);
        }
    }
    // Two neighbours may have become equal where an empty range was replaced.
    ranges.dedup_by(|b, a| a.1 == b.1);
    ranges
}

/// Emits the decision for a number known to lie in `ranges` (non-empty): a leaf for one
/// range, else `if nr >= start of the middle range { right half } else { left half }`.
fn emit(ranges: &[(u32, Class)], out: &mut Vec<Insn>) {
    if let [(_, class)] = ranges {
        out.push(ret(*class));
        return;
    }
    let (left, right) = ranges.split_at(ranges.len() / 2);
    let mut left_code = Vec::new();
    emit(left, &mut left_code);
    match u8::try_from(left_code.len()) {
        // Conditional jumps reach 255 instructions ahead at most.
        Ok(skip) => out.push(Insn::Raw(insn(JGE_K, skip, 0, right[0].0))),
        Err(_) => {
            out.push(Insn::Raw(insn(JGE_K, 0, 1, right[0].0)));
            let skip = u32::try_from(left_code.len()).unwrap_or(u32::MAX);
            out.push(Insn::Raw(insn(JA, 0, 0, skip)));
        }
    }
    out.extend(left_code);
    emit(right, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_neighbours_and_fill_gaps_with_the_default() {
        let deny = Class::Errno(1);
        let classes = [
            (0, Class::Allow),
            (1, Class::Allow),
            (3, Class::Allow),
            (4, Class::Rules),
            (7, deny),
        ];
        assert_eq!(
            ranges(&classes, deny),
            vec![
                (0, Class::Allow),
                (2, deny),
                (3, Class::Allow),
                (4, Class::Rules),
                (5, deny),
            ]
        );
        assert_eq!(ranges(&[], Class::Allow), vec![(0, Class::Allow)]);
        assert_eq!(
            ranges(&[(u32::MAX, Class::Allow)], deny),
            vec![(0, deny), (u32::MAX, Class::Allow)]
        );
    }
}
