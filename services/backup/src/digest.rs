//! Chunk digests: the 32-byte names of chunks, and the reserved all-zero digest that
//! stands for a chunk of zeroes (never stored).

use std::fmt;
use std::str::FromStr;

use ferry_core::{Error, Result};

/// The digest of a chunk's plaintext: SHA-256 in a plain repository, HMAC-SHA256 under
/// the repository's id key in an encrypted one (see [`crate::Repository::chunk_digest`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The marker of a chunk that is all zeroes: never stored, restored as zeroes.
    pub const ZERO: Digest = Digest([0; 32]);

    /// Whether this is the zero-chunk marker.
    pub fn is_zero(&self) -> bool {
        *self == Self::ZERO
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The object that stores this chunk: `chunks/<first 2 hex>/<64 hex>`.
    pub fn chunk_name(&self) -> String {
        let hex = self.to_hex();
        format!("chunks/{}/{hex}", &hex[..2])
    }

    /// The record that marks this chunk as damaged: `bad/<64 hex>`.
    pub fn bad_name(&self) -> String {
        format!("bad/{}", self.to_hex())
    }

    /// The digest named by a chunk object (`chunks/ab/ab...`), if it is one.
    pub fn from_chunk_name(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("chunks/")?;
        let (dir, file) = rest.split_once('/')?;
        let digest: Digest = file.parse().ok()?;
        (dir.len() == 2 && file.starts_with(dir)).then_some(digest)
    }
}

impl FromStr for Digest {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let mut out = [0u8; 32];
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(Error::invalid_input(format!("'{s}' is not a chunk digest (64 lowercase hex digits)")));
        }
        hex::decode_to_slice(s, &mut out)
            .map_err(|_| Error::invalid_input(format!("'{s}' is not a chunk digest")))?;
        Ok(Self(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let d = Digest([0xab; 32]);
        let name = d.chunk_name();
        assert_eq!(name, format!("chunks/ab/{}", "ab".repeat(32)));
        assert_eq!(Digest::from_chunk_name(&name), Some(d));
        assert_eq!(Digest::from_chunk_name("chunks/ac/".to_string().as_str()), None);
        assert_eq!(Digest::from_chunk_name(&format!("chunks/cd/{}", "ab".repeat(32))), None);
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        assert!("AB".repeat(32).parse::<Digest>().is_err());
        assert!(Digest::ZERO.is_zero());
    }
}
