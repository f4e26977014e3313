//! Which kernel modules the guest must load, and in what order.
//!
//! The distribution kernel builds the virtio transport, block and console drivers and
//! squashfs as modules. A kernel package as shipped has no `modules.dep` (depmod makes it
//! at install time, and we never install the guest kernel), so the order comes from each
//! module's own `.modinfo` section: its `depends=` entry names the modules it needs.

use goblin::elf::Elf;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// What went wrong while resolving modules.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// The modules directory could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A module (or a dependency) is not in the tree.
    #[error("kernel module {0} not found (is it built in, compressed, or missing from this kernel?)")]
    Missing(String),
    /// A module file is not a relocatable ELF object with a .modinfo section.
    #[error("{path}: not a kernel module: {reason}")]
    Malformed {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Modules depend on each other in a cycle.
    #[error("kernel modules depend on each other in a cycle at {0}")]
    Cycle(String),
}

/// A module to load, with its bytes.
#[derive(Debug, Clone)]
pub struct Module {
    /// Its name (`virtio_mmio`).
    pub name: String,
    /// The `.ko` file's content.
    pub data: Vec<u8>,
}

/// The kernel's own name for a module: `-` and `_` are the same.
fn canonical(name: &str) -> String {
    name.replace('-', "_")
}

/// Every `*.ko` under `dir`, by canonical name.
fn index(dir: &Path, out: &mut BTreeMap<String, PathBuf>) -> Result<(), ModuleError> {
    let entries = fs::read_dir(dir).map_err(|source| ModuleError::Read {
        path: dir.to_owned(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            index(&path, out)?;
        } else if let Some(name) = path.file_name().and_then(|n| n.to_str())
            && let Some(stem) = name.strip_suffix(".ko")
        {
            out.insert(canonical(stem), path);
        }
    }
    Ok(())
}

/// The `depends=` list of a module's `.modinfo` section.
fn depends(path: &Path, data: &[u8]) -> Result<Vec<String>, ModuleError> {
    let malformed = |reason: String| ModuleError::Malformed {
        path: path.to_owned(),
        reason,
    };
    let elf = Elf::parse(data).map_err(|e| malformed(e.to_string()))?;
    let section = elf
        .section_headers
        .iter()
        .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(".modinfo"))
        .ok_or_else(|| malformed("no .modinfo section".into()))?;
    let range = section
        .file_range()
        .ok_or_else(|| malformed(".modinfo has no data".into()))?;
    let info = data
        .get(range)
        .ok_or_else(|| malformed(".modinfo outside the file".into()))?;
    Ok(info
        .split(|b| *b == 0)
        .filter_map(|entry| entry.strip_prefix(b"depends="))
        .flat_map(|list| list.split(|b| *b == b','))
        .filter(|d| !d.is_empty())
        .map(|d| canonical(&String::from_utf8_lossy(d)))
        .collect())
}

/// Resolves `wanted` (and what they depend on) in the module tree `dir`
/// (`lib/modules/<release>`), returning them in load order: dependencies first.
/// Names listed in `builtin` (the tree's `modules.builtin`) are skipped.
pub fn resolve(dir: &Path, wanted: &[&str]) -> Result<Vec<Module>, ModuleError> {
    let mut paths = BTreeMap::new();
    index(&dir.join("kernel"), &mut paths)?;
    let builtin: BTreeSet<String> = fs::read_to_string(dir.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit('/').next())
        .filter_map(|f| f.strip_suffix(".ko"))
        .map(canonical)
        .collect();

    let mut order = Vec::new();
    let mut done = BTreeSet::new();
    for name in wanted {
        visit(
            &canonical(name),
            &paths,
            &builtin,
            &mut done,
            &mut BTreeSet::new(),
            &mut order,
        )?;
    }
    Ok(order)
}

fn visit(
    name: &str,
    paths: &BTreeMap<String, PathBuf>,
    builtin: &BTreeSet<String>,
    done: &mut BTreeSet<String>,
    active: &mut BTreeSet<String>,
    order: &mut Vec<Module>,
) -> Result<(), ModuleError> {
    if done.contains(name) || builtin.contains(name) {
        return Ok(());
    }
    if !active.insert(name.to_owned()) {
        return Err(ModuleError::Cycle(name.to_owned()));
    }
    let path = paths
        .get(name)
        .ok_or_else(|| ModuleError::Missing(name.to_owned()))?;
    let data = fs::read(path).map_err(|source| ModuleError::Read {
        path: path.clone(),
        source,
    })?;
    for dep in depends(path, &data)? {
        visit(&dep, paths, builtin, done, active, order)?;
    }
    active.remove(name);
    done.insert(name.to_owned());
    order.push(Module {
        name: name.to_owned(),
        data,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_modules_are_named() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("kernel")).unwrap();
        let err = resolve(dir.path(), &["virtio-blk"]).unwrap_err();
        assert!(err.to_string().contains("virtio_blk"), "{err}");
    }

    #[test]
    fn builtin_modules_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("kernel")).unwrap();
        fs::write(dir.path().join("modules.builtin"), "kernel/fs/ext4/ext4.ko\n").unwrap();
        assert!(resolve(dir.path(), &["ext4"]).unwrap().is_empty());
    }

    #[test]
    fn non_elf_modules_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("kernel/fs")).unwrap();
        fs::write(dir.path().join("kernel/fs/x.ko"), b"not elf").unwrap();
        let err = resolve(dir.path(), &["x"]).unwrap_err();
        assert!(matches!(err, ModuleError::Malformed { .. }), "{err}");
    }
}
