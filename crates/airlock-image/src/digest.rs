//! Content digests: `sha256:<64 lowercase hex>`, the only algorithm the store accepts.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

use crate::Error;

/// A validated `sha256:<hex>` content digest.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    /// The 64 lowercase hex digits, without the `sha256:` prefix.
    hex: String,
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        let mut h = Hasher::new();
        h.update(bytes);
        h.finish()
    }

    /// The 64 lowercase hex digits (the file name under `blobs/sha256/`).
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// Parses a bare 64-digit hex string (as found in store file names).
    pub fn from_hex(hex: &str) -> Result<Self, Error> {
        if hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Self { hex: hex.to_owned() })
        } else {
            Err(Error::InvalidDigest(hex.to_owned()))
        }
    }
}

impl FromStr for Digest {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| Error::InvalidDigest(s.to_owned()))?;
        Self::from_hex(hex).map_err(|_| Error::InvalidDigest(s.to_owned()))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Incremental sha256 over a stream, producing a [`Digest`].
#[derive(Debug, Default)]
pub(crate) struct Hasher(Sha256);

impl Hasher {
    pub(crate) fn new() -> Self {
        Self(Sha256::new())
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub(crate) fn finish(self) -> Digest {
        use fmt::Write as _;
        let out = self.0.finalize();
        let mut hex = String::with_capacity(64);
        for b in out.iter() {
            // Writing to a String cannot fail.
            let _ = write!(hex, "{b:02x}");
        }
        Digest { hex }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest_of_empty_input() {
        assert_eq!(
            Digest::of(b"").to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn parse_round_trips_and_rejects_bad_input() {
        let d = Digest::of(b"abc");
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        for bad in [
            "",
            "sha256:",
            "sha512:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            "sha256:BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD",
            "sha256:../../../../etc/passwd",
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad:?} accepted");
        }
    }
}
