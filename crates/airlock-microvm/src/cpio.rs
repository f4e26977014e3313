//! A writer for the "newc" cpio format, the one the kernel unpacks as an initramfs
//! (Documentation/driver-api/early-userspace/buffer-format.rst): a 110-byte ASCII header
//! per entry, the NUL-terminated name, the data, each padded to 4 bytes, and a
//! `TRAILER!!!` entry at the end.

use std::io::{self, Write};

const MAGIC: &str = "070701";
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

/// Writes entries in order; parents must come before their children.
#[derive(Debug)]
pub struct Writer<W: Write> {
    out: W,
    /// Bytes written so far (for padding).
    offset: u64,
    /// Next inode number: every entry gets its own (no hard links).
    ino: u32,
    /// Device number of the entry being written (device nodes only).
    rdev: (u32, u32),
}

impl<W: Write> Writer<W> {
    /// A writer on `out`.
    pub fn new(out: W) -> Self {
        Writer {
            out,
            offset: 0,
            ino: 1,
            rdev: (0, 0),
        }
    }

    /// A directory, owned by root.
    pub fn dir(&mut self, name: &str, mode: u32) -> io::Result<()> {
        self.entry(name, S_IFDIR | (mode & 0o7777), &[])
    }

    /// A regular file, owned by root.
    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, S_IFREG | (mode & 0o7777), data)
    }

    /// A character device node, owned by root.
    pub fn chardev(&mut self, name: &str, mode: u32, major: u32, minor: u32) -> io::Result<()> {
        self.rdev = (major, minor);
        let r = self.entry(name, S_IFCHR | (mode & 0o7777), &[]);
        self.rdev = (0, 0);
        r
    }

    /// A symbolic link to `target`.
    pub fn symlink(&mut self, name: &str, target: &str) -> io::Result<()> {
        self.entry(name, S_IFLNK | 0o777, target.as_bytes())
    }

    /// Writes the trailer and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.entry("TRAILER!!!", 0, &[])?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) -> io::Result<()> {
        let name = name.trim_start_matches('/');
        if name.is_empty() || name.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad cpio entry name {name:?}"),
            ));
        }
        let size = u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "cpio entry over 4 GiB"))?;
        let nlink = if mode & S_IFDIR != 0 { 2 } else { 1 };
        let ino = if name == "TRAILER!!!" { 0 } else { self.ino };
        self.ino += 1;
        // ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor
        // namesize check: 13 fields of 8 hex digits.
        let (uid, gid, mtime, dev_major, dev_minor) = (0, 0, 0, 0, 0);
        let (rdev_major, rdev_minor) = self.rdev;
        let namesize = name.len() + 1;
        let check = 0;
        let header = format!(
            "{MAGIC}{ino:08x}{mode:08x}{uid:08x}{gid:08x}{nlink:08x}{mtime:08x}{size:08x}\
             {dev_major:08x}{dev_minor:08x}{rdev_major:08x}{rdev_minor:08x}{namesize:08x}{check:08x}"
        );
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.offset += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let rem = (4 - self.offset % 4) % 4;
        self.put(&[0u8; 3][..rem as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cpio(1) from the host lists what we wrote, when it is installed.
    #[test]
    fn host_cpio_reads_the_archive() {
        let mut w = Writer::new(Vec::new());
        w.dir("lib", 0o755).unwrap();
        w.file("lib/a.ko", 0o644, b"hello").unwrap();
        w.symlink("lib64", "lib").unwrap();
        w.file("init", 0o755, &[1, 2, 3, 4, 5, 6, 7]).unwrap();
        w.dir("dev", 0o755).unwrap();
        w.chardev("dev/console", 0o600, 5, 1).unwrap();
        let bytes = w.finish().unwrap();
        assert_eq!(bytes.len() % 4, 0);
        assert_eq!(&bytes[..6], b"070701");
        let Ok(mut child) = std::process::Command::new("cpio")
            .args(["-t", "-v"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
        else {
            return;
        };
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let listing = String::from_utf8_lossy(&out.stdout);
        for want in ["lib", "lib/a.ko", "lib64 -> lib", "init", "5,   1"] {
            assert!(listing.contains(want), "{want} in {listing}");
        }
    }
}
