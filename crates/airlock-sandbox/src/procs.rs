//! The process table of the pid namespace this process sees in /proc, read for the
//! sweeps that must spare some subtrees: init's after an exec (every keeper's programs
//! survive it), a keeper's after its program (only its own subtree goes), and the
//! supervisor's at a session exec's deadline (see `cgroup`).

use std::collections::HashMap;

/// One process: its parent and whether it is a zombie (dead, not yet reaped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Its parent's pid (0 for the namespace's init).
    pub ppid: i32,
    /// It has exited and waits to be reaped.
    pub zombie: bool,
}

/// Parses `/proc/<pid>/stat`: the parent's pid and state come after the command's
/// closing parenthesis (the command may itself hold spaces and parentheses).
pub(crate) fn parse_stat(stat: &str) -> Option<Entry> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some(Entry {
        ppid,
        zombie: state == "Z" || state == "X",
    })
}

/// Every process of `/proc` (under `proc`), by pid. Processes that end while it is read
/// are left out.
pub(crate) fn table(proc: &str) -> HashMap<i32, Entry> {
    let Ok(dir) = std::fs::read_dir(proc) else {
        return HashMap::new();
    };
    let pids = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()));
    table_of(proc, pids)
}

/// The processes `pids` of `/proc` (under `proc`), by pid; those that ended are left out.
pub(crate) fn table_of(proc: &str, pids: impl IntoIterator<Item = i32>) -> HashMap<i32, Entry> {
    pids.into_iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("{proc}/{pid}/stat")).ok()?;
            Some((pid, parse_stat(&stat)?))
        })
        .collect()
}

/// Whether `pid` is one of `roots` or descends from one: `Some(true)`; `Some(false)`
/// when its ancestry reaches `top` (or the namespace's root) first; `None` when it
/// cannot be told (an ancestor ended while the table was read: ask again).
pub(crate) fn under(table: &HashMap<i32, Entry>, pid: i32, roots: &[i32], top: i32) -> Option<bool> {
    let mut cur = pid;
    // A chain longer than pid_max cannot exist; the bound only guards a corrupt table.
    for _ in 0..(1 << 22) {
        if roots.contains(&cur) {
            return Some(true);
        }
        if cur == top || cur <= 1 {
            return Some(false);
        }
        cur = table.get(&cur)?.ppid;
        if cur == 0 {
            return Some(false);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_parentheses_in_the_command() {
        let e = parse_stat("42 (a) b (c)) S 7 42 42 0 -1").unwrap();
        assert_eq!(
            e,
            Entry {
                ppid: 7,
                zombie: false
            }
        );
        assert!(parse_stat("43 (x) Z 1 0").unwrap().zombie);
    }

    #[test]
    fn ancestry() {
        let e = |ppid| Entry { ppid, zombie: false };
        let t: HashMap<i32, Entry> =
            [(1, e(0)), (5, e(1)), (6, e(5)), (7, e(6)), (8, e(1)), (9, e(40))].into();
        assert_eq!(under(&t, 7, &[5], 1), Some(true));
        assert_eq!(under(&t, 5, &[5], 1), Some(true));
        assert_eq!(under(&t, 8, &[5], 1), Some(false));
        assert_eq!(under(&t, 9, &[5], 1), None);
    }
}
