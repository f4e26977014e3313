//! The on-disk record: one JSON file per snapshot, `records/<id>.json`.
//!
//! It carries the public [`Record`] and the snapshot's entries in stream order; a regular
//! file's content is located by (digest, pack, offset, size), the pack named through the
//! record's `packs` table so a snapshot id is not repeated for every entry. Field names of
//! entries are one letter: a 1,000-file record stays near 100 KB.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Record;

/// Version of the record format; a record with another version is dropped at open.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// A record file.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RecordFile {
    pub version: u32,
    pub record: Record,
    /// `record.created` in milliseconds: what `created` is set from at load (a float does not
    /// always come back from JSON bit for bit).
    pub created_ms: u64,
    /// Bytes of the full state directory (allocated blocks) when the record was written.
    #[serde(default)]
    pub full_bytes: u64,
    /// Packs the entries point into (snapshot ids: a pack is named after the snapshot that wrote it).
    pub packs: Vec<String>,
    /// Zero bytes after the last entry (the end-of-archive marker as the producer wrote it).
    pub trailer: u64,
    pub entries: Vec<Entry>,
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Kind {
    #[serde(rename = "f")]
    File,
    #[serde(rename = "d")]
    Dir,
    #[serde(rename = "l")]
    Symlink,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}
fn is_zero8(v: &u8) -> bool {
    *v == 0
}

/// One tar entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Entry {
    #[serde(rename = "p")]
    pub path: Bytes,
    #[serde(rename = "k")]
    pub kind: Kind,
    #[serde(rename = "m")]
    pub mode: u32,
    #[serde(rename = "u", default, skip_serializing_if = "is_zero")]
    pub uid: u64,
    #[serde(rename = "g", default, skip_serializing_if = "is_zero")]
    pub gid: u64,
    #[serde(rename = "t")]
    pub mtime: u64,
    /// Content size (regular files).
    #[serde(rename = "s", default, skip_serializing_if = "is_zero")]
    pub size: u64,
    /// SHA-256 of the content (regular files).
    #[serde(rename = "h", default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
    /// Index into `RecordFile::packs` (regular files with content).
    #[serde(rename = "i", default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<u32>,
    #[serde(rename = "o", default, skip_serializing_if = "is_zero")]
    pub offset: u64,
    /// Symlink target.
    #[serde(rename = "l", default, skip_serializing_if = "Option::is_none")]
    pub link: Option<Bytes>,
    /// Which canonical header rebuilds this entry's header blocks byte for byte
    /// (see `tarout::HeaderMaker`); ignored when `raw` is present.
    #[serde(rename = "v", default, skip_serializing_if = "is_zero8")]
    pub variant: u8,
    /// The entry's header blocks exactly as they came (extension entries included), kept only
    /// when no canonical header reproduces them.
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<Raw>,
}

/// Bytes that are usually UTF-8 (paths, link targets): a JSON string when they are,
/// `{"b64": "..."}` otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bytes(pub Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("b64", &B64.encode(&self.0))?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Bytes;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or {\"b64\": string}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Bytes, E> {
                Ok(Bytes(v.as_bytes().to_vec()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Bytes, E> {
                Ok(Bytes(v.into_bytes()))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Bytes, A::Error> {
                let mut out = None;
                while let Some(key) = map.next_key::<String>()? {
                    let value: String = map.next_value()?;
                    if key == "b64" {
                        out = Some(B64.decode(value).map_err(de::Error::custom)?);
                    }
                }
                out.map(Bytes).ok_or_else(|| de::Error::missing_field("b64"))
            }
        }
        d.deserialize_any(V)
    }
}

/// Raw bytes, base64 in JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Raw(pub Vec<u8>);

impl Serialize for Raw {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&B64.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        B64.decode(s).map(Raw).map_err(de::Error::custom)
    }
}

/// A SHA-256 digest, lower-case hex in JSON.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Digest(pub [u8; 32]);

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl Digest {
    pub fn hex(&self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(HEX[(b >> 4) as usize] as char);
            s.push(HEX[(b & 15) as usize] as char);
        }
        s
    }

    fn from_hex(s: &str) -> Option<Digest> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return None;
        }
        let nib = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = (nib(b[2 * i])? << 4) | nib(b[2 * i + 1])?;
        }
        Some(Digest(out))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Digest::from_hex(&s).ok_or_else(|| de::Error::custom("not a sha256 hex digest"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_digest_round_trip() {
        let b = vec![Bytes(b"workspace/a".to_vec()), Bytes(vec![b'w', 0xff, 0xfe])];
        let j = serde_json::to_string(&b).unwrap();
        assert_eq!(j, r#"["workspace/a",{"b64":"d//+"}]"#);
        let back: Vec<Bytes> = serde_json::from_str(&j).unwrap();
        assert_eq!(back, b);
        let d = Digest([0xab; 32]);
        let j = serde_json::to_string(&d).unwrap();
        let back: Digest = serde_json::from_str(&j).unwrap();
        assert_eq!(back, d);
        assert!(serde_json::from_str::<Digest>("\"zz\"").is_err());
    }
}
