//! Figures, printed, never asserted (timings vary with the machine's load):
//! `cargo test --release -p airlock-snapshot --test figures -- --nocapture`
//!
//! A 10 MB workspace of 1,000 files (10 dirs, 10,000 bytes each, all distinct) as a tar
//! stream in memory; the store on the target directory's disk.

mod util;

use std::io::Read;
use std::time::{Duration, Instant};

use airlock_snapshot::Store;
use util::*;

/// One run in a debug build (the suite stays quick; the figures mean nothing there).
const RUNS: usize = if cfg!(debug_assertions) { 1 } else { 9 };

/// CPU time of the whole process (all threads), in ms.
fn cpu_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_PROCESS_CPUTIME_ID is always present on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// Runs `f`, returns its wall time and the CPU time the process spent meanwhile.
fn timed<T>(wall: &mut Vec<Duration>, cpu: &mut Vec<f64>, f: impl FnOnce() -> T) -> T {
    let (c, start) = (cpu_ms(), Instant::now());
    let out = f();
    wall.push(start.elapsed());
    cpu.push(cpu_ms() - c);
    out
}

fn median(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    (v[v.len() / 2].as_secs_f64() * 1e3, v[0].as_secs_f64() * 1e3)
}

#[test]
fn put_and_tar_figures() {
    let input = build(&workspace(1000, 10_000, 42));
    let mut wall: [Vec<Duration>; 4] = Default::default();
    let mut cpu: [Vec<f64>; 4] = Default::default();
    let (mut first_stored, mut second_stored) = (0, 0);
    for _ in 0..RUNS {
        let t = tempdir();
        let store = Store::open(&store_dir(&t), 1 << 30).unwrap();
        let [w0, w1, w2, w3] = &mut wall;
        let [c0, c1, c2, c3] = &mut cpu;
        let a = timed(w0, c0, || store.put(snap(Some("k1")), &mut &input[..]).unwrap());
        let b = timed(w1, c1, || store.put(snap(Some("k1")), &mut &input[..]).unwrap());
        let mut out = Vec::with_capacity(input.len());
        timed(w2, c2, || {
            store.tar(&b.id).unwrap().read_to_end(&mut out).unwrap()
        });
        assert!(out == input);
        timed(w3, c3, || {
            store.delete(&a.id).unwrap();
            store.delete(&b.id).unwrap();
        });
        (first_stored, second_stored) = (a.stored_bytes, b.stored_bytes);
    }
    let names = [
        "put, first (10 MB, 1,000 files)",
        "put, same content again",
        "tar() read fully",
        "delete both",
    ];
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap();
    let load = loadavg.split(' ').next().unwrap_or("?");
    println!(
        "input: {} bytes of tar, 1,000 files of 10,000 bytes; load average {load}",
        input.len()
    );
    for ((name, w), c) in names.iter().zip(wall).zip(cpu) {
        let (med, min) = median(w);
        let mut c = c;
        c.sort_by(f64::total_cmp);
        println!(
            "{name:<34} wall median {med:6.2} ms, min {min:6.2} ms; CPU median {:6.2} ms ({RUNS} runs)",
            c[c.len() / 2]
        );
    }
    println!("stored_bytes: first {first_stored}, second {second_stored}");
}
