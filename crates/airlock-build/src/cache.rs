//! The layer cache: step keys to the layers they made, in `<store>/build-cache.json`.
//!
//! Read whole at the start of a build, written atomically (a temporary file in the store,
//! renamed) after each new layer. Two builds at once may each miss what the other adds
//! (the last rename wins); the cache is an accelerator, never a source of truth: an entry
//! whose layer is no longer in the store is a miss.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use airlock_image::{Digest, Store};
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::layer::Layer;

/// The most entries kept: a bound on the file's size (about 250 bytes an entry). Past it
/// the cache starts over (every entry is a miss once).
const MAX_ENTRIES: usize = 20_000;

/// The largest cache file read (MAX_ENTRIES entries fit well inside).
const MAX_FILE_BYTES: u64 = 16 << 20;

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    /// Key (hex) → the step's layer, or none (a WORKDIR that existed).
    steps: BTreeMap<String, Option<Entry>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    digest: String,
    diff_id: String,
    size: u64,
}

/// A loaded cache.
#[derive(Debug)]
pub(crate) struct Cache {
    path: PathBuf,
    file: File,
}

/// What the cache says about a key.
pub(crate) enum Hit {
    /// Not known (or its layer is gone).
    Miss,
    /// The step made this layer.
    Layer(Layer),
    /// The step made no layer.
    Empty,
}

impl Cache {
    pub(crate) fn load(store: &Store) -> Cache {
        let path = store.root().join("build-cache.json");
        let file = std::fs::File::open(&path)
            .ok()
            .and_then(|f| {
                let mut s = String::new();
                use std::io::Read;
                f.take(MAX_FILE_BYTES).read_to_string(&mut s).ok()?;
                serde_json::from_str(&s).ok()
            })
            .unwrap_or_default();
        Cache { path, file }
    }

    pub(crate) fn get(&self, store: &Store, key: &str) -> Hit {
        match self.file.steps.get(key) {
            None => Hit::Miss,
            Some(None) => Hit::Empty,
            Some(Some(e)) => {
                let parsed = (e.digest.parse::<Digest>(), e.diff_id.parse::<Digest>());
                match parsed {
                    (Ok(digest), Ok(diff_id)) if store.has_blob(&digest) && store.has_layer(&digest) => {
                        Hit::Layer(Layer {
                            digest,
                            diff_id,
                            size: e.size,
                        })
                    }
                    _ => Hit::Miss,
                }
            }
        }
    }

    pub(crate) fn put(&mut self, store: &Store, key: &str, layer: Option<&Layer>) -> Result<(), Error> {
        if self.file.steps.len() >= MAX_ENTRIES {
            self.file.steps.clear();
        }
        self.file.steps.insert(
            key.to_owned(),
            layer.map(|l| Entry {
                digest: l.digest.to_string(),
                diff_id: l.diff_id.to_string(),
                size: l.size,
            }),
        );
        let io = |source| Error::Io {
            op: "write the build cache",
            path: self.path.clone(),
            source,
        };
        let mut tmp = tempfile::Builder::new()
            .prefix(".build-cache-")
            .tempfile_in(store.root())
            .map_err(io)?;
        let json = serde_json::to_vec(&self.file).expect("plain data serializes");
        tmp.write_all(&json).map_err(io)?;
        tmp.persist(&self.path).map_err(|e| io(e.error))?;
        Ok(())
    }
}
