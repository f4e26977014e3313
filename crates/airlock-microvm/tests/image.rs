//! Micro-VMs whose sandbox's root is an OCI image's prepared tree, against real VMs: the
//! image's squashfs is built once per digest and reused, the program sees the image and
//! nothing of the host's system directories, and VMs (and templates) of one image never
//! serve another. Needs root, qemu-system-x86_64, mksquashfs, busybox-static at
//! /bin/busybox, and the `airlock-guest` binary of this build (`cargo build -p
//! airlock-guest`).

mod common;

#[path = "../../airlock-sandbox/tests/common/image.rs"]
mod image;

use airlock_backend::{Backend, Capture, ImageRoot, Purpose, Shape};
use airlock_microvm::{MicroVmHost, VmBackend, VmSize};
use airlock_spec::{Limits, Spec};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// An image's tree made by hand (as the image store would leave it) with a digest of its
/// own, unique to this run, whose cached squashfs is removed when the test ends.
struct TestImage {
    _dir: tempfile::TempDir,
    root: ImageRoot,
    cache: PathBuf,
}

impl TestImage {
    /// The shared test tree, plus /opt/which.txt holding `name`.
    fn new(name: &str, cache: &Path) -> TestImage {
        let dir = tempfile::tempdir().unwrap();
        let root = image::make(dir.path());
        std::fs::write(root.join("opt/which.txt"), format!("{name}\n")).unwrap();
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
        let digest = format!("sha256:{:08x}{:032x}{:x}", std::process::id(), nanos, name.len());
        TestImage {
            _dir: dir,
            root: ImageRoot { digest, root },
            cache: cache.to_owned(),
        }
    }

    /// Where the VM cache keeps this image's squashfs.
    fn drive(&self) -> PathBuf {
        let (algo, hex) = self.root.digest.split_once(':').unwrap();
        self.cache
            .join(airlock_microvm::image::IMAGES_DIR)
            .join(format!("{algo}-{hex}.sqfs"))
    }
}

impl Drop for TestImage {
    fn drop(&mut self) {
        let drive = self.drive();
        let _ = std::fs::remove_file(&drive);
        let _ = std::fs::remove_file(drive.with_extension("sqfs.lock"));
    }
}

#[test]
fn a_vm_of_an_image_runs_in_the_image_and_reuses_its_cached_drive() {
    let options = common::options();
    let host = MicroVmHost::new(&options).expect("micro-VM host");
    let img = TestImage::new("first", &options.cache);
    let size = VmSize::for_limits(&Limits::default());

    // Without an image, in the same run, for comparison.
    let mut plain = host.boot(size).expect("boot");
    let plain_boot = plain.boot_time();
    let mut spec = common::sh("true");
    spec.image = Some("busybox".into());
    let err = plain.exec(&spec, &mut Capture, &[]).unwrap_err();
    assert!(err.to_string().contains("image"), "{err}");
    drop(plain);

    // The squashfs is built on first use of the digest, then the VM boots with it.
    let t = Instant::now();
    let drive = host.image_drive(&img.root).expect("image drive");
    let built = t.elapsed();
    assert!(drive.built_ms.is_some(), "{drive:?}");
    assert_eq!(drive.path, img.drive());
    assert_eq!(host.image_builds(), 1);
    let mut vm = host.boot_image(size, &img.root).expect("boot with the image");
    eprintln!(
        "image drive built in {built:?}; cold boot without an image {plain_boot:?}, with one {:?}",
        vm.boot_time()
    );
    assert_eq!(vm.image_digest(), Some(img.root.digest.as_str()));

    let r = common::ok(
        vm.exec(
            &common::sh("cat /opt/hello.txt /opt/which.txt"),
            &mut Capture,
            &[],
        )
        .unwrap(),
    );
    assert_eq!(r.stdout, "hello from the image\nfirst\n");

    // Nothing of the host's (or the guest's) system directories.
    let r = common::ok(
        vm.exec(
            &common::sh(
                "test -e /usr/bin/python3 && echo HOST-PYTHON; ls /usr 2>&1; id -u; id -g; id -un; echo end",
            ),
            &mut Capture,
            &[],
        )
        .unwrap(),
    );
    assert!(!r.stdout.contains("HOST-"), "{}", r.stdout);
    assert!(r.stdout.contains("No such file"), "{}", r.stdout);
    // The identity files are the engine's, bound over the image's empty ones.
    assert!(r.stdout.ends_with("1000\n1000\nsandbox\nend\n"), "{}", r.stdout);

    // The image is read-only; /workspace and /tmp are the sandbox's.
    let r = common::ok(
        vm.exec(
            &common::sh(
                "for f in /x /opt/x /bin/x /etc/passwd /.airlock/x; do touch $f 2>/dev/null && echo WROTE $f; done; echo w > /workspace/w && echo t > /tmp/t && cat /workspace/w /tmp/t",
            ),
            &mut Capture,
            &[],
        )
        .unwrap(),
    );
    assert_eq!(r.stdout, "w\nt\n");

    // The workdir, and a spec naming the image (resolved to this VM's by the service).
    let mut spec = common::sh("pwd; cat hello.txt");
    spec.workdir = Some("/opt".into());
    spec.image = Some("busybox".into());
    let r = common::ok(vm.exec(&spec, &mut Capture, &[]).unwrap());
    assert_eq!(r.stdout, "/opt\nhello from the image\n");
    drop(vm);

    // A second VM of the image reuses the squashfs: not rebuilt, not rewritten.
    let before = std::fs::metadata(&drive.path).unwrap();
    let mut again = host.boot_image(size, &img.root).expect("second boot");
    assert_eq!(host.image_builds(), 1);
    let after = std::fs::metadata(&drive.path).unwrap();
    assert_eq!(
        (after.ino(), after.mtime(), after.mtime_nsec()),
        (before.ino(), before.mtime(), before.mtime_nsec())
    );
    let r = common::ok(
        again
            .run(&common::sh("cat /opt/which.txt"), &mut Capture, &[])
            .unwrap(),
    );
    assert_eq!(r.stdout, "first\n");
}

#[test]
fn pooled_vms_of_two_images_never_serve_each_other() {
    let options = common::options();
    let (a, b) = (
        TestImage::new("image-a", &options.cache),
        TestImage::new("image-b", &options.cache),
    );
    let limits = Limits::default();
    let backend = VmBackend::new(options, Some(limits.clone()));
    let shape = |img: &TestImage| {
        let mut s = Shape::of(&Spec::new(vec!["true".into()]));
        s.limits = limits.clone();
        s.image = Some(img.root.clone());
        s
    };
    let (shape_a, shape_b) = (shape(&a), shape(&b));
    let plain = Shape::of(&Spec::new(vec!["true".into()]));
    assert!(backend.serves(&shape_a, &shape_a));
    assert!(!backend.serves(&shape_a, &shape_b));
    assert!(!backend.serves(&shape_b, &shape_a));
    assert!(!backend.serves(&plain, &shape_a));
    assert!(!backend.serves(&shape_a, &plain));

    let pool = Purpose::Pool { behind: false };
    let which = |shape: &Shape| {
        let mut vm = backend.create(shape, pool).expect("pool VM");
        let r = vm
            .exec_once(&common::sh("cat /opt/which.txt"), &mut Capture, &[])
            .unwrap();
        assert_eq!(r.exit_code, Some(0), "{r:?}");
        (r.stdout, vm.setup_time())
    };
    // Each image's first pool VM builds that image's template; the next of image A is
    // cloned from A's, not from B's (built last), nor from the host's.
    let (first_a, _) = which(&shape_a);
    let (first_b, _) = which(&shape_b);
    let (second_a, clone_time) = which(&shape_a);
    assert_eq!(
        (first_a.as_str(), first_b.as_str(), second_a.as_str()),
        ("image-a\n", "image-b\n", "image-a\n")
    );
    eprintln!("a pooled VM of an image restored from its template in {clone_time:?}");

    // The same clone, without the pool's fallback to a cold boot: A's template serves it.
    let host = backend.host().expect("host");
    let mut vm = host
        .clone_image(VmSize::for_limits(&limits), Some(&limits), &a.root)
        .expect("a clone of image A's template");
    assert_eq!(vm.image_digest(), Some(a.root.digest.as_str()));
    let r = common::ok(
        vm.run(&common::sh("cat /opt/which.txt"), &mut Capture, &[])
            .unwrap(),
    );
    assert_eq!(r.stdout, "image-a\n");
    drop(vm);

    // A session of image B, on a service whose pool has templates: its own VM, of B.
    let mut session = backend.create(&shape_b, Purpose::Session).expect("session VM");
    session.open_session(&shape_b).expect("open the session");
    let r = session
        .exec(&common::sh("cat /opt/which.txt"), &mut Capture, &[])
        .unwrap();
    assert_eq!(r.stdout, "image-b\n", "{r:?}");
}

/// How long `mksquashfs` takes for a tree of about 50 MB (run by hand:
/// `cargo test -p airlock-microvm --test image -- --ignored --nocapture`).
#[test]
#[ignore]
fn image_drive_build_time_of_a_50_mb_tree() {
    let dir = tempfile::tempdir().unwrap();
    let root = image::make(dir.path());
    // Half incompressible, half text: about what a language runtime's tree holds.
    let mut rng = std::fs::File::open("/dev/urandom").unwrap();
    for i in 0..25 {
        let mut data = vec![0u8; 1 << 20];
        std::io::Read::read_exact(&mut rng, &mut data).unwrap();
        std::fs::write(root.join(format!("opt/blob{i}.bin")), &data).unwrap();
        let text: String = (0..(1 << 20) / 32)
            .map(|n| format!("line {n:08} of file {i:04} ...\n"))
            .collect();
        std::fs::write(root.join(format!("opt/text{i}.txt")), text).unwrap();
    }
    let builder = airlock_microvm::image::ImageBuilder {
        cache: dir.path().join("cache"),
        agent: PathBuf::from("/nonexistent"),
        host_root: PathBuf::from("/"),
    };
    let drive = builder.image_drive("sha256:50", &root).unwrap();
    let size = std::fs::metadata(&drive.path).unwrap().len();
    eprintln!(
        "squashfs of a ~50 MB tree: built in {} ms, {} MB",
        drive.built_ms.unwrap(),
        size >> 20
    );
}
