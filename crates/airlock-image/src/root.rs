//! Prepared image roots: one flattened tree per manifest digest, made ready for airlock to
//! mount as a sandbox's root.
//!
//! `<root>/roots/sha256/<hex>/` is built once ([`Store::image_root`]): under that digest's lock,
//! so concurrent callers build it once, in `tmp/root-<hex>-*` and renamed into place when
//! complete. It is read-only by convention: nothing may write in it, as its files are
//! shared with the unpacked layers (below) — a sandbox mounts it read-only, and a write
//! through any other path would change the layer, and every root sharing it, too. What preparing adds to the plain
//! [`Store::flatten`]:
//!
//! - Mount points: the directories [`ROOT_MOUNT_DIRS`] and the empty files
//!   [`ROOT_MOUNT_FILES`] exist, so the sandbox can mount and bind over them without
//!   writing to the tree. A symlink, file or directory the image placed at one of those
//!   paths where the other kind is needed is replaced in the prepared tree (never
//!   followed); an image's own regular file or directory of the right kind is kept.
//! - Modes: every file and directory gives "others" its owner's read bit, and its owner's
//!   execute bit when it has one (never a write bit; setuid and setgid are already gone at
//!   unpack). The files are the store owner's and the sandbox user is not that owner.
//! - Hard links instead of copies: a layer file whose mode already satisfies the rule
//!   above (nearly all: 0644 and 0755) is hard-linked into the root, since its inode needs
//!   no change; any other is copied and the copy's mode changed, so a layer's files never
//!   change. Directories are always new. A failed link (the filesystem's link limit) falls
//!   back to a copy.
//!
//! Disk use: a root costs its directories and inodes plus the bytes it copied; that copied
//! size is recorded in `roots/sha256/<hex>.size` and counted in [`Store::usage`] (linked
//! bytes are already counted once, in their layer).
//!
//! Measured on the build host (ext4, debug build, `root_of_a_real_tree`, an `--ignored`
//! test): a layer made from `/usr/lib/python3.11` (53 MB tar, 1,403 files), stored and
//! unpacked, then prepared as a root: 60–120 ms and 436 KiB more on disk (its
//! directories; no file copied), where the copying [`Store::flatten`] of the same layer
//! took 0.3–0.9 s and 53 MiB.
//!
//! Roots are removed with their image ([`Store::remove_image`], [`Store::prune_images`]).

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use rustix::fs::{self as rfs, Mode, OFlags};

use crate::catalog::Image;
use crate::error::io_err;
use crate::flatten::ApplyMode;
use crate::fsutil::{cstr, is_dir, lstat, open_dir_path, remove_all_at};
use crate::store::open_dir_fd;
use crate::{Digest, Error, Store};

/// Directories every prepared root has: the sandbox mounts over them (`/tmp` and
/// `/workspace` tmpfs, `/dev`, `/proc`), writes its identity files into `/etc`, and
/// `/.airlock` carries airlock's own files.
pub const ROOT_MOUNT_DIRS: &[&str] = &["/tmp", "/workspace", "/dev", "/proc", "/etc", "/.airlock"];

/// Empty regular files every prepared root has: the sandbox binds its generated identity
/// and name-resolution files over them.
pub const ROOT_MOUNT_FILES: &[&str] = &[
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
];

/// What [`Store::ensure_image_root`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootStatus {
    /// The root was already prepared.
    Present,
    /// The root was built now; this many bytes were copied rather than linked.
    Built(u64),
}

impl Store {
    /// Where the prepared root of the image whose manifest is `manifest` is (or would be).
    pub fn root_path(&self, manifest: &Digest) -> PathBuf {
        self.root().join("roots/sha256").join(manifest.hex())
    }

    /// Whether the prepared root of `manifest` exists.
    pub fn has_root(&self, manifest: &Digest) -> bool {
        self.root_path(manifest).is_dir()
    }

    /// The manifest digests of the prepared roots.
    pub fn roots(&self) -> Result<Vec<Digest>, Error> {
        self.list_dir("roots/sha256")
    }

    /// The image's prepared root (see the module's documentation), built on first use.
    ///
    /// (Named `image_root` because [`Store::root`] is the store's own directory.)
    pub fn image_root(&self, image: &Image) -> Result<PathBuf, Error> {
        self.ensure_image_root(image).map(|(p, _)| p)
    }

    /// [`Store::image_root`], saying whether it was built now.
    pub fn ensure_image_root(&self, image: &Image) -> Result<(PathBuf, RootStatus), Error> {
        let d = &image.manifest_digest;
        let dest = self.root_path(d);
        if dest.is_dir() {
            return Ok((dest, RootStatus::Present));
        }
        let _lock = self.digest_lock("root", d)?;
        if dest.is_dir() {
            return Ok((dest, RootStatus::Present));
        }
        let n = image.layers.len();
        for (i, l) in image.layers.iter().enumerate() {
            if !self.has_layer(l) {
                return Err(Error::ImageIncomplete {
                    manifest: d.clone(),
                    missing: format!("layer {} of {n} ({l}) is not unpacked", i + 1),
                });
            }
        }
        let tmp_dir = self.root().join("tmp");
        let tmp = tempfile::Builder::new()
            .prefix(&format!("root-{}-", d.hex()))
            .tempdir_in(&tmp_dir)
            .map_err(io_err("create temporary root", &tmp_dir))?;
        let tree = tmp.path().join("tree");
        let copied = self.flatten_with(&image.layers, &tree, ApplyMode::LinkReadable)?;
        let fd = open_dir_fd(&tree)?;
        self.add_mount_points(&fd)
            .map_err(io_err("prepare mount points in", &tree))?;
        drop(fd);
        let _store = self.store_lock()?;
        self.check_budget(copied)?;
        fs::rename(&tree, &dest).map_err(io_err("store root", &dest))?;
        self.record_root_size(d, copied)?;
        Ok((dest, RootStatus::Built(copied)))
    }

    /// Creates [`ROOT_MOUNT_DIRS`] and [`ROOT_MOUNT_FILES`] in the tree at `root`,
    /// replacing whatever of the wrong kind is there, following no symlink.
    fn add_mount_points(&self, root: &OwnedFd) -> io::Result<()> {
        let owner = self.owner();
        for path in ROOT_MOUNT_DIRS {
            let name = cstr(path.trim_start_matches('/').as_ref())?;
            match lstat(root, &name)? {
                Some(st) if is_dir(&st) => continue,
                Some(_) => remove_all_at(root, &name)?,
                None => {}
            }
            let fd = open_dir_path(root, &[name.to_str().unwrap_or_default().as_ref()], Some(owner))?;
            rfs::fchmod(&fd, Mode::from_raw_mode(0o755))?;
        }
        let etc = open_dir_path(root, &["etc".as_ref()], None)?;
        for path in ROOT_MOUNT_FILES {
            let base = path.strip_prefix("/etc/").unwrap_or(path);
            let name = cstr(base.as_ref())?;
            match lstat(&etc, &name)? {
                Some(st) if rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::RegularFile => {
                    continue;
                }
                Some(_) => remove_all_at(&etc, &name)?,
                None => {}
            }
            let fd = rfs::openat(
                &etc,
                &*name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )?;
            owner.apply(&fd)?;
            rfs::fchmod(&fd, Mode::from_raw_mode(0o644))?;
        }
        Ok(())
    }

    fn root_size_path(&self, d: &Digest) -> PathBuf {
        self.root().join("roots/sha256").join(format!("{}.size", d.hex()))
    }

    /// The bytes a root copied (0 when its record is missing).
    pub(crate) fn root_size(&self, d: &Digest) -> u64 {
        fs::read_to_string(self.root_size_path(d))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// With the store lock held: writes the root's copied size.
    fn record_root_size(&self, d: &Digest, size: u64) -> Result<(), Error> {
        self.write_size_record(&self.root_size_path(d), size)
    }

    /// Removes the prepared root of `manifest`, if any, waiting for a build in progress;
    /// returns the bytes freed. The tree is renamed out of `roots/` first (so it disappears
    /// at once), then deleted.
    pub(crate) fn remove_root(&self, manifest: &Digest) -> Result<u64, Error> {
        let _lock = self.digest_lock("root", manifest)?;
        let _store = self.store_lock()?;
        let p = self.root_path(manifest);
        if !p.is_dir() {
            return Ok(0);
        }
        let size = self.root_size(manifest);
        self.remove_tree(&p, &self.root_size_path(manifest))?;
        Ok(size)
    }
}
