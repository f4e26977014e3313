//! The store with the streams it is really given: airlock-fstree's exports of a directory
//! tree, put, read back byte for byte, and imported again.

mod util;

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use airlock_fstree::Root;
use airlock_snapshot::Store;
use util::*;

fn tree(base: &Path) {
    let ws = base.join("workspace");
    std::fs::create_dir_all(ws.join("src/deep/er")).unwrap();
    std::fs::write(ws.join("src/main.py"), b"print('hi')\n").unwrap();
    std::fs::write(ws.join("src/deep/er/data.bin"), noise(1, 3 << 20)).unwrap();
    std::fs::write(ws.join("empty"), b"").unwrap();
    std::fs::write(ws.join("copy-of-main.py"), b"print('hi')\n").unwrap();
    let long = "n".repeat(200);
    std::fs::write(ws.join(&long), noise(2, 5000)).unwrap();
    symlink("src/main.py", ws.join("link")).unwrap();
    symlink(format!("/nowhere/{}", "t".repeat(180)), ws.join("longlink")).unwrap();
    std::fs::set_permissions(ws.join("src/main.py"), std::fs::Permissions::from_mode(0o755)).unwrap();
    for i in 0..300 {
        std::fs::write(ws.join("src").join(format!("m{i}.txt")), noise(100 + i, 700)).unwrap();
    }
    let tmp = base.join("tmp");
    std::fs::create_dir_all(tmp.join("cache")).unwrap();
    std::fs::write(tmp.join("cache/x"), noise(3, 10_000)).unwrap();
}

fn roots(base: &Path) -> Vec<Root> {
    vec![
        Root::open(&base.join("workspace"), "/workspace").unwrap(),
        Root::open(&base.join("tmp"), "/tmp").unwrap(),
    ]
}

#[test]
fn fstree_exports_round_trip_byte_for_byte() {
    let t = tempdir();
    let src = t.path().join("src");
    tree(&src);
    let mut exported = Vec::new();
    airlock_fstree::export(&roots(&src), &mut exported).unwrap();

    let store = Store::open(&store_dir(&t), 1 << 30).unwrap();
    let rec = store.put(snap(Some("k1")), &mut &exported[..]).unwrap();
    assert_eq!(rec.files, 306);
    let back = tar_of(&store, &rec.id);
    assert!(
        back == exported,
        "tar() differs from the export ({} vs {} bytes)",
        back.len(),
        exported.len()
    );
    // airlock-fstree's headers are the canonical ones: none is kept verbatim.
    let json = std::fs::read_to_string(store_dir(&t).join(format!("records/{}.json", rec.id))).unwrap();
    assert!(!json.contains("\"r\":"), "raw headers kept");

    // Imported elsewhere, then exported again: the same stream.
    let dst = t.path().join("dst");
    std::fs::create_dir_all(dst.join("workspace")).unwrap();
    std::fs::create_dir_all(dst.join("tmp")).unwrap();
    let me = std::fs::metadata(&dst).unwrap();
    let owner = (me.uid(), me.gid());
    airlock_fstree::import(&roots(&dst), &mut store.tar(&rec.id).unwrap(), owner).unwrap();
    let mut again = Vec::new();
    airlock_fstree::export(&roots(&dst), &mut again).unwrap();
    assert!(again == exported, "export of the imported tree differs");

    // A snapshot after one change stores little.
    std::fs::write(src.join("workspace/src/m7.txt"), b"changed").unwrap();
    let mut second = Vec::new();
    airlock_fstree::export(&roots(&src), &mut second).unwrap();
    let rec2 = store.put(snap(Some("k1")), &mut &second[..]).unwrap();
    assert!(rec2.stored_bytes < 100_000, "{rec2:?}");
    assert!(tar_of(&store, &rec2.id) == second);
}
