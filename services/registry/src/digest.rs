//! Content digests (`sha256:HEX`): parsed strictly, and checked over bytes as they arrive
//! ([`Verifier`]), so a blob is never trusted before its last byte matched.

use std::fmt;

use sha2::{Digest as _, Sha256};

use crate::{Error, Result};

/// A `sha256:` digest (the only algorithm registries use for content in practice; others
/// are refused rather than trusted unchecked).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Digest([u8; 32]);

impl Digest {
    /// Parses `sha256:` and 64 lowercase hex digits.
    pub fn parse(text: &str) -> Result<Self> {
        let hex = text.strip_prefix("sha256:").ok_or_else(|| {
            Error::new(
                crate::ErrorKind::Unsupported,
                format!(
                    "digest {:?} is not sha256: ferry checks sha256 digests only",
                    clip(text)
                ),
            )
        })?;
        if hex.len() != 64 {
            return Err(Error::protocol(format!(
                "digest {:?} is not 64 hex digits",
                clip(text)
            )));
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.as_bytes().chunks_exact(2).enumerate() {
            let nibble = |b: u8| match b {
                b'0'..=b'9' => Some(b - b'0'),
                b'a'..=b'f' => Some(b - b'a' + 10),
                _ => None,
            };
            match (nibble(pair[0]), nibble(pair[1])) {
                (Some(h), Some(l)) => out[i] = h << 4 | l,
                _ => {
                    return Err(Error::protocol(format!(
                        "digest {:?} is not lowercase hex",
                        clip(text)
                    )))
                }
            }
        }
        Ok(Self(out))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }
}

/// At most 80 characters of untrusted text, for messages.
pub(crate) fn clip(text: &str) -> String {
    text.chars().take(80).collect()
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Checks that a stream of `size` bytes has digest `expected`, as it passes.
pub struct Verifier {
    expected: Digest,
    size: u64,
    seen: u64,
    hasher: Sha256,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("expected", &self.expected)
            .field("size", &self.size)
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

impl Verifier {
    pub fn new(expected: Digest, size: u64) -> Self {
        Self {
            expected,
            size,
            seen: 0,
            hasher: Sha256::new(),
        }
    }

    /// Bytes hashed so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Hashes the next bytes; more than the descriptor's size is corrupt at once.
    pub fn update(&mut self, bytes: &[u8]) -> Result<()> {
        self.seen += bytes.len() as u64;
        if self.seen > self.size {
            return Err(Error::corrupt(format!(
                "blob {} is longer than the {} bytes its descriptor gives",
                self.expected, self.size
            )));
        }
        self.hasher.update(bytes);
        Ok(())
    }

    /// After the last byte: the size and the digest must match.
    pub fn check(self) -> Result<()> {
        if self.seen != self.size {
            return Err(Error::corrupt(format!(
                "blob {} ended after {} of the {} bytes its descriptor gives (cut short)",
                self.expected, self.seen, self.size
            )));
        }
        let got = Digest(self.hasher.finalize().into());
        if got != self.expected {
            return Err(Error::corrupt(format!(
                "blob {} does not match its digest: its bytes hash to {got}",
                self.expected
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_checks() {
        let d = Digest::of(b"abc");
        assert_eq!(
            d.to_string(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(Digest::parse(&d.to_string()).unwrap(), d);
        assert!(Digest::parse("sha512:00").is_err());
        assert!(Digest::parse(&d.to_string().to_uppercase()).is_err());
        let mut v = Verifier::new(d.clone(), 3);
        v.update(b"ab").unwrap();
        v.update(b"c").unwrap();
        v.check().unwrap();
        let mut v = Verifier::new(d.clone(), 3);
        v.update(b"abd").unwrap();
        assert_eq!(v.check().unwrap_err().kind(), crate::ErrorKind::Corrupt);
        let mut v = Verifier::new(d.clone(), 3);
        v.update(b"ab").unwrap();
        assert!(v.check().unwrap_err().message().contains("cut short"));
        let mut v = Verifier::new(d, 3);
        assert!(v.update(b"abcd").is_err());
    }
}
