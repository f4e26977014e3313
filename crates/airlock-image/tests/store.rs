//! The blob store: verification, budget, prune, and work done once under concurrency.

mod common;

use std::collections::HashSet;
use std::io::{self, Read};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use airlock_image::{BlobStatus, Digest, Error, LayerStatus, StoreOptions};
use common::{Layer, leftovers, put, store, store_with};
use tar::EntryType;

#[test]
fn blob_is_stored_once_and_fetch_skipped_when_present() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let blob = b"hello layer".to_vec();
    let d = Digest::of(&blob);
    let st = s.ensure_blob(&d, None, || Ok(&blob[..])).unwrap();
    assert_eq!(st, BlobStatus::Stored(blob.len() as u64));
    assert_eq!(std::fs::read(s.blob_path(&d)).unwrap(), blob);
    assert!(s.blob_path(&d).ends_with(format!("blobs/sha256/{}", d.hex())));
    let st = s
        .ensure_blob(&d, None, || -> io::Result<&[u8]> {
            panic!("fetched a stored blob")
        })
        .unwrap();
    assert_eq!(st, BlobStatus::Present);
    assert_eq!(s.blobs().unwrap(), vec![d]);
}

#[test]
fn digest_mismatch_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let claimed = Digest::of(b"what the manifest said");
    let err = s
        .ensure_blob(&claimed, None, || Ok(&b"what the registry sent"[..]))
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{msg}");
    assert!(msg.contains(&claimed.to_string()), "{msg}");
    assert!(
        msg.contains(&Digest::of(b"what the registry sent").to_string()),
        "{msg}"
    );
    assert!(s.blobs().unwrap().is_empty());
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
}

#[test]
fn truncated_blob_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let blob = vec![7u8; 100_000];
    let d = Digest::of(&blob);
    let err = s
        .ensure_blob(&d, Some(blob.len() as u64), || Ok(&blob[..60_000]))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Truncated {
                expected: 100_000,
                got: 60_000,
                ..
            }
        ),
        "{err}"
    );
    // Without a declared size the short content fails its digest instead.
    let err = s.ensure_blob(&d, None, || Ok(&blob[..60_000])).unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    // A stream that breaks off with an error.
    struct Broken(usize);
    impl Read for Broken {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0 == 0 {
                return Err(io::Error::new(io::ErrorKind::ConnectionReset, "peer went away"));
            }
            let n = buf.len().min(self.0);
            buf[..n].fill(7);
            self.0 -= n;
            Ok(n)
        }
    }
    let err = s.ensure_blob(&d, None, || Ok(Broken(50_000))).unwrap_err();
    assert!(err.to_string().contains(&d.to_string()), "{err}");
    // A stream longer than declared.
    let err = s.ensure_blob(&d, Some(10), || Ok(&blob[..])).unwrap_err();
    assert!(matches!(err, Error::TooLong { expected: 10, .. }), "{err}");
    assert!(s.blobs().unwrap().is_empty());
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
}

#[test]
fn blob_over_budget_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = store_with(
        dir.path(),
        StoreOptions {
            max_bytes: Some(1000),
            ..Default::default()
        },
    );
    let small = put(&s, &[1u8; 600]);
    assert_eq!(s.usage().unwrap(), 600);
    let big = vec![2u8; 500];
    let d = Digest::of(&big);
    // Size unknown: cut off while streaming.
    let err = s.ensure_blob(&d, None, || Ok(&big[..])).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            Error::OverBudget {
                budget: 1000,
                usage: 600,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("1000") && msg.contains("600"), "{msg}");
    // Size declared: refused before fetching.
    let err = s
        .ensure_blob(&d, Some(500), || -> io::Result<&[u8]> {
            panic!("fetched over budget")
        })
        .unwrap_err();
    assert!(matches!(err, Error::OverBudget { size: 500, .. }), "{err}");
    assert_eq!(s.blobs().unwrap(), vec![small]);
    assert_eq!(s.usage().unwrap(), 600);
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
    // Within the budget it fits.
    put(&s, &[3u8; 400]);
    assert_eq!(s.usage().unwrap(), 1000);
}

#[test]
fn layer_over_budget_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = store_with(
        dir.path(),
        StoreOptions {
            max_bytes: Some(200_000),
            ..Default::default()
        },
    );
    // A small gzip blob that unpacks to 1 MB (a decompression bomb in miniature).
    let blob = Layer::new().file("zeros", &vec![0u8; 1_000_000], 0o644).gzip();
    assert!(blob.len() < 10_000);
    let d = put(&s, &blob);
    let err = s.unpack_layer(&d, None).unwrap_err();
    assert!(matches!(err, Error::OverBudget { budget: 200_000, .. }), "{err}");
    assert!(!s.has_layer(&d));
    assert!(s.layers().unwrap().is_empty());
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
}

#[test]
fn concurrent_fetches_of_one_blob_fetch_once() {
    let dir = tempfile::tempdir().unwrap();
    let blob = Arc::new(vec![9u8; 1_000_000]);
    let d = Digest::of(&blob);
    let fetches = Arc::new(AtomicUsize::new(0));
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (root, blob, d, fetches, barrier) = (
                dir.path().to_path_buf(),
                blob.clone(),
                d.clone(),
                fetches.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                // Each thread opens the store itself, as a separate process would.
                let s = store(&root);
                barrier.wait();
                s.ensure_blob(&d, None, || {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    Ok(io::Cursor::new(blob.to_vec()))
                })
                .unwrap()
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    assert_eq!(
        results
            .iter()
            .filter(|r| matches!(r, BlobStatus::Stored(_)))
            .count(),
        1
    );
    assert_eq!(
        results.iter().filter(|r| **r == BlobStatus::Present).count(),
        threads - 1
    );
}

#[test]
fn concurrent_unpacks_of_one_layer_unpack_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut layer = Layer::new();
    for i in 0..200 {
        layer = layer.file(&format!("d{}/f{i}", i % 10), &[i as u8; 4096], 0o644);
    }
    let d = put(&store(dir.path()), &layer.gzip());
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (root, d, barrier) = (dir.path().to_path_buf(), d.clone(), barrier.clone());
            std::thread::spawn(move || {
                let s = store(&root);
                barrier.wait();
                s.unpack_layer(&d, None).unwrap()
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let unpacked = results
        .iter()
        .filter(|r| matches!(r, LayerStatus::Unpacked(_)))
        .count();
    assert_eq!(unpacked, 1, "{results:?}");
    let s = store(dir.path());
    assert_eq!(
        std::fs::read(s.layer_path(&d).join("d3/f13")).unwrap(),
        vec![13u8; 4096]
    );
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
}

/// A gzip layer of a few directories of files, big enough to arrive in many chunks.
fn teed_layer() -> Vec<u8> {
    let mut layer = Layer::new();
    for i in 0..200u32 {
        let content: Vec<u8> = (0..4096u32).map(|j| (i.wrapping_mul(31) ^ j) as u8).collect();
        layer = layer.file(&format!("d{}/f{i}", i % 10), &content, 0o644);
    }
    layer.gzip()
}

#[test]
fn a_layer_unpacked_while_it_downloads_is_stored_with_its_blob() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let blob = teed_layer();
    let d = Digest::of(&blob);
    let (b, l) = s
        .ensure_layer(&d, Some(blob.len() as u64), None, || Ok(&blob[..]))
        .unwrap();
    assert_eq!(b, BlobStatus::Stored(blob.len() as u64));
    assert!(
        matches!(l, LayerStatus::Unpacked(ref r) if r.entries == 200),
        "{l:?}"
    );
    assert_eq!(std::fs::read(s.blob_path(&d)).unwrap(), blob);
    let f13: Vec<u8> = (0..4096u32).map(|j| ((13u32 * 31) ^ j) as u8).collect();
    assert_eq!(std::fs::read(s.layer_path(&d).join("d3/f13")).unwrap(), f13);
    let again = s
        .ensure_layer(&d, None, None, || -> io::Result<&[u8]> {
            panic!("fetched a stored layer")
        })
        .unwrap();
    assert_eq!(again, (BlobStatus::Present, LayerStatus::Present));
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
}

#[test]
fn a_teed_unpack_whose_digest_mismatches_leaves_neither_blob_nor_layer() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    // A valid layer that unpacks fine, under another layer's digest.
    let sent = teed_layer();
    let claimed = Digest::of(b"the layer the manifest names");
    let err = s
        .ensure_layer(&claimed, Some(sent.len() as u64), None, || Ok(&sent[..]))
        .unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&Digest::of(&sent).to_string()), "{err}");
    assert!(!s.has_blob(&claimed));
    assert!(!s.has_layer(&claimed));
    assert!(s.blobs().unwrap().is_empty() && s.layers().unwrap().is_empty());
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
}

#[test]
fn a_teed_download_cut_short_leaves_neither_blob_nor_layer() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let blob = teed_layer();
    let d = Digest::of(&blob);
    let half = blob.len() / 2;
    let err = s
        .ensure_layer(&d, Some(blob.len() as u64), None, || Ok(&blob[..half]))
        .unwrap_err();
    assert!(
        matches!(err, Error::Truncated { got, .. } if got == half as u64),
        "{err}"
    );
    assert!(!s.has_blob(&d) && !s.has_layer(&d));
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
}

#[test]
fn a_teed_layer_the_unpack_refuses_keeps_only_its_verified_blob() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let blob = Layer::new()
        .file("ok", b"fine", 0o644)
        .raw(EntryType::Regular, "../../outside/pwned", "", b"x")
        .gzip();
    let d = Digest::of(&blob);
    let err = s.ensure_layer(&d, None, None, || Ok(&blob[..])).unwrap_err();
    assert!(matches!(err, Error::UnsafeEntry { .. }), "{err}");
    // As `ensure_blob` then `unpack_layer` would leave it: the blob, verified; no layer.
    assert!(s.has_blob(&d));
    assert!(!s.has_layer(&d));
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
}

#[test]
fn a_teed_layer_whose_gzip_stream_is_corrupt_is_refused_not_cut_short() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let mut blob = teed_layer();
    // Garbage in the middle of the deflate stream: the digest matches (it is of these
    // bytes), the decompression fails part way.
    let mid = blob.len() / 2;
    blob[mid..mid + 64].fill(0xff);
    let d = Digest::of(&blob);
    let err = s.ensure_layer(&d, None, None, || Ok(&blob[..])).unwrap_err();
    assert!(matches!(err, Error::Archive { .. }), "{err}");
    assert!(!s.has_layer(&d));
    assert!(s.layers().unwrap().is_empty());
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
}

#[test]
fn a_teed_layer_over_budget_leaves_neither_blob_nor_layer() {
    let dir = tempfile::tempdir().unwrap();
    let s = store_with(
        dir.path(),
        StoreOptions {
            max_bytes: Some(100_000),
            ..Default::default()
        },
    );
    let blob: Vec<u8> = (0..50_000u32)
        .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
        .collect();
    let blob = Layer::new().file("big", &blob, 0o644).tar();
    let d = Digest::of(&blob);
    // The size is not declared, so the download itself runs into the budget.
    let err = s.ensure_layer(&d, None, None, || Ok(&blob[..])).unwrap_err();
    assert!(matches!(err, Error::OverBudget { budget: 100_000, .. }), "{err}");
    assert!(!s.has_blob(&d) && !s.has_layer(&d));
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
}

#[test]
fn concurrent_teed_layers_of_one_digest_fetch_and_unpack_once() {
    let dir = tempfile::tempdir().unwrap();
    let blob = Arc::new(teed_layer());
    let d = Digest::of(&blob);
    let fetches = Arc::new(AtomicUsize::new(0));
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (root, blob, d, fetches, barrier) = (
                dir.path().to_path_buf(),
                blob.clone(),
                d.clone(),
                fetches.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                let s = store(&root);
                barrier.wait();
                s.ensure_layer(&d, Some(blob.len() as u64), None, || {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    Ok(io::Cursor::new(blob.to_vec()))
                })
                .unwrap()
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    let made = results
        .iter()
        .filter(|(b, l)| matches!(b, BlobStatus::Stored(_)) && matches!(l, LayerStatus::Unpacked(_)))
        .count();
    assert_eq!(made, 1, "{results:?}");
    assert_eq!(
        results
            .iter()
            .filter(|r| **r == (BlobStatus::Present, LayerStatus::Present))
            .count(),
        threads - 1
    );
    let s = store(dir.path());
    assert!(s.has_blob(&d) && s.has_layer(&d));
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
}

#[test]
fn a_teed_layer_whose_blob_is_stored_is_unpacked_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let blob = teed_layer();
    let d = put(&s, &blob);
    let (b, l) = s
        .ensure_layer(&d, None, None, || -> io::Result<&[u8]> {
            panic!("fetched a stored blob")
        })
        .unwrap();
    assert_eq!(b, BlobStatus::Present);
    assert!(matches!(l, LayerStatus::Unpacked(_)), "{l:?}");
    assert!(s.has_layer(&d));
}

#[test]
fn prune_keeps_named_digests_and_removes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let a = put(&s, &Layer::new().file("a", &[1u8; 1000], 0o644).gzip());
    let b = put(&s, &Layer::new().file("b", &[2u8; 3000], 0o644).gzip());
    s.unpack_layer(&a, None).unwrap();
    s.unpack_layer(&b, None).unwrap();
    let before = s.usage().unwrap();
    let b_blob = std::fs::metadata(s.blob_path(&b)).unwrap().len();
    let report = s.prune(&HashSet::from([a.clone()])).unwrap();
    assert_eq!(report.blobs, vec![b.clone()]);
    assert_eq!(report.layers, vec![b.clone()]);
    assert_eq!(report.freed_bytes, b_blob + 3000);
    assert_eq!(s.usage().unwrap(), before - report.freed_bytes);
    assert!(s.has_blob(&a) && s.has_layer(&a));
    assert!(!s.has_blob(&b) && !s.has_layer(&b));
    let a_size = s.usage().unwrap();
    assert_eq!(s.remove(&a).unwrap(), a_size);
    assert_eq!(s.usage().unwrap(), 0);
    assert!(s.blobs().unwrap().is_empty() && s.layers().unwrap().is_empty());
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
    // The per-digest lock files of what is gone go with the next prune.
    assert!(std::fs::read_dir(dir.path().join("locks")).unwrap().count() > 0);
    s.prune(&HashSet::new()).unwrap();
    assert_eq!(std::fs::read_dir(dir.path().join("locks")).unwrap().count(), 0);
}

#[test]
fn usage_of_a_layer_is_the_same_with_or_without_its_size_record() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let blob = Layer::new()
        .file("a", &[1u8; 7000], 0o644)
        .file("b/c", &[2u8; 300], 0o644)
        .gzip();
    let d = put(&s, &blob);
    s.unpack_layer(&d, None).unwrap();
    let with_record = s.usage().unwrap();
    assert_eq!(with_record, blob.len() as u64 + 7300);
    let record = dir.path().join(format!("layers/sha256/{}.size", d.hex()));
    assert_eq!(std::fs::read_to_string(&record).unwrap(), "7300");
    std::fs::remove_file(&record).unwrap();
    assert_eq!(s.usage().unwrap(), with_record);
    assert_eq!(s.layers().unwrap(), vec![d]);
}

#[test]
fn prune_clears_work_left_by_a_crash_but_not_work_in_progress() {
    use rustix::fs::{FlockOperation, flock};
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let crashed = Digest::of(b"crashed");
    let busy = Digest::of(b"busy");
    let tmp = dir.path().join("tmp");
    std::fs::write(tmp.join(format!("blob-{}-x1", crashed.hex())), b"partial").unwrap();
    std::fs::create_dir_all(tmp.join(format!("layer-{}-x2/usr", crashed.hex()))).unwrap();
    std::fs::create_dir_all(tmp.join("removed-x3/layer")).unwrap();
    std::fs::write(tmp.join(format!("blob-{}-x4", busy.hex())), b"partial").unwrap();
    // Another process is still writing `busy`: it holds the blob's lock.
    let lock = std::fs::File::create(dir.path().join(format!("locks/blob-{}", busy.hex()))).unwrap();
    flock(&lock, FlockOperation::LockExclusive).unwrap();
    let report = s.prune(&HashSet::new()).unwrap();
    assert_eq!(report.stale_work, 3);
    assert_eq!(leftovers(&s), [format!("blob-{}-x4", busy.hex())]);
    assert!(dir.path().join(format!("locks/blob-{}", busy.hex())).exists());
    drop(lock);
    assert_eq!(s.prune(&HashSet::new()).unwrap().stale_work, 1);
    assert!(leftovers(&s).is_empty());
}
