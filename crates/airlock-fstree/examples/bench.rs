//! Costs of a scan, a diff, an export and an import of a tree on a tmpfs.
//!
//!     cargo run --release -p airlock-fstree --example bench -- [files] [bytes-each]
//!
//! Makes the tree under /dev/shm (a tmpfs on most hosts), prints milliseconds per step.

use std::time::Instant;

use airlock_fstree::{Index, Root, diff, export, import};

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let files = args.first().copied().unwrap_or(1000);
    let each = args.get(1).copied().unwrap_or(10_000);
    let base = tempfile::tempdir_in("/dev/shm").unwrap();
    let src = base.path().join("src");
    for i in 0..files {
        let dir = src.join(format!("d{:02}", i % 20));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i:05}")), vec![b'x'; each as usize]).unwrap();
    }
    let roots = [Root::open(&src, "/workspace").unwrap()];
    let time = |what: &str, n: u32, f: &mut dyn FnMut()| {
        f();
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        println!("{what}: {:.3} ms", t.elapsed().as_secs_f64() * 1e3 / f64::from(n));
    };
    println!("{files} files of {each} bytes in 20 dirs");
    let mut index = Index::default();
    time("scan", 200, &mut || index = Index::scan(&roots).unwrap());
    let again = Index::scan(&roots).unwrap();
    time("diff (nothing changed)", 200, &mut || {
        assert!(diff(&index, &again).0.is_empty())
    });
    let empty = Index::default();
    time("diff (all created)", 200, &mut || drop(diff(&empty, &again)));
    let mut tar = Vec::with_capacity((files * (each + 1024)) as usize);
    time("export", 20, &mut || {
        tar.clear();
        export(&roots, &mut tar).unwrap();
    });
    println!("tar: {} bytes", tar.len());
    let dst = base.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    let dst_roots = [Root::open(&dst, "/workspace").unwrap()];
    time("import (clear + unpack)", 20, &mut || {
        import(&dst_roots, &mut &tar[..], (1000, 1000)).unwrap();
    });
    time("clear", 1, &mut || airlock_fstree::clear(&dst_roots).unwrap());
}
