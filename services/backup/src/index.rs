//! The fixed index of one backup: the digest of every chunk of the image, in order.
//!
//! Chunk `i` covers bytes `[i * chunk_size, min((i + 1) * chunk_size, image_size))`; a
//! chunk of zeroes has the marker [`Digest::ZERO`] and is not stored. Serialized (then
//! stored as a blob, so compressed and encrypted like chunks):
//!
//! ```text
//! magic "FRYFIDX1" | image size u64 LE | chunk size u32 LE | 0u32 | count u64 LE
//! | count x 32-byte digest | SHA-256 of everything before it
//! ```

use ferry_core::{Error, ErrorKind, Result};
use sha2::{Digest as _, Sha256};

use crate::config::check_chunk_size;
use crate::digest::Digest;

const MAGIC: [u8; 8] = *b"FRYFIDX1";
const HEAD_LEN: usize = 32;
const TRAILER_LEN: usize = 32;
/// The most chunks one index may list: 2^25, a 128 TiB image in 4 MiB chunks.
pub const MAX_INDEX_ENTRIES: u64 = 1 << 25;
/// The largest serialized index.
pub(crate) const MAX_INDEX_LEN: u64 = HEAD_LEN as u64 + MAX_INDEX_ENTRIES * 32 + TRAILER_LEN as u64;

/// The chunks of one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedIndex {
    image_size: u64,
    chunk_size: u32,
    digests: Vec<Digest>,
}

fn corrupt(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, message)
}

impl FixedIndex {
    /// How many chunks an image of `image_size` bytes has.
    pub fn chunk_count(image_size: u64, chunk_size: u32) -> u64 {
        image_size.div_ceil(u64::from(chunk_size.max(1)))
    }

    /// An index of `image_size` bytes whose chunks are all zero until [`FixedIndex::set`].
    pub fn new(image_size: u64, chunk_size: u32) -> Result<Self> {
        check_chunk_size(chunk_size)?;
        let count = Self::chunk_count(image_size, chunk_size);
        if count > MAX_INDEX_ENTRIES {
            return Err(Error::invalid_input(format!(
                "an image of {image_size} bytes has {count} chunks of {chunk_size} bytes, more than the {MAX_INDEX_ENTRIES} an index holds: use a larger chunk size"
            )));
        }
        Ok(Self {
            image_size,
            chunk_size,
            digests: vec![Digest::ZERO; count as usize],
        })
    }

    pub fn image_size(&self) -> u64 {
        self.image_size
    }

    pub fn chunk_size(&self) -> u32 {
        self.chunk_size
    }

    /// The number of chunks.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Whether the image is empty.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Every chunk's digest, in image order.
    pub fn digests(&self) -> &[Digest] {
        &self.digests
    }

    /// Chunk `i`'s digest.
    pub fn digest(&self, i: usize) -> Option<Digest> {
        self.digests.get(i).copied()
    }

    /// Sets chunk `i`'s digest.
    pub fn set(&mut self, i: usize, digest: Digest) -> Result<()> {
        let count = self.digests.len();
        let slot = self
            .digests
            .get_mut(i)
            .ok_or_else(|| Error::invalid_input(format!("chunk {i} is past the end of an index of {count} chunks")))?;
        *slot = digest;
        Ok(())
    }

    /// The byte range of chunk `i`: its offset and length (the last chunk may be short).
    pub fn chunk_range(&self, i: usize) -> (u64, u64) {
        let offset = i as u64 * u64::from(self.chunk_size);
        let len = u64::from(self.chunk_size).min(self.image_size.saturating_sub(offset));
        (offset, len)
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEAD_LEN + self.digests.len() * 32 + TRAILER_LEN);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.image_size.to_le_bytes());
        out.extend_from_slice(&self.chunk_size.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(self.digests.len() as u64).to_le_bytes());
        for d in &self.digests {
            out.extend_from_slice(&d.0);
        }
        let sum = Sha256::digest(&out);
        out.extend_from_slice(&sum);
        out
    }

    pub(crate) fn decode(data: &[u8]) -> Result<Self> {
        if data.len() < HEAD_LEN + TRAILER_LEN {
            return Err(corrupt(format!("the index is truncated ({} bytes)", data.len())));
        }
        let (body, sum) = data.split_at(data.len() - TRAILER_LEN);
        if Sha256::digest(body).as_slice() != sum {
            return Err(corrupt("the index is damaged (its checksum does not match)"));
        }
        if body[..8] != MAGIC {
            return Err(corrupt("not a ferry fixed index (unknown magic)"));
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&body[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let image_size = u64_at(8);
        let mut cs = [0u8; 4];
        cs.copy_from_slice(&body[16..20]);
        let chunk_size = u32::from_le_bytes(cs);
        let count = u64_at(24);
        check_chunk_size(chunk_size).map_err(|e| corrupt(format!("the index: {}", e.message())))?;
        if count != Self::chunk_count(image_size, chunk_size) || count > MAX_INDEX_ENTRIES {
            return Err(corrupt(format!(
                "the index lists {count} chunks for an image of {image_size} bytes in {chunk_size}-byte chunks"
            )));
        }
        let entries = &body[HEAD_LEN..];
        if entries.len() as u64 != count * 32 {
            return Err(corrupt("the index's length does not match its chunk count"));
        }
        let digests = entries
            .chunks_exact(32)
            .map(|c| {
                let mut d = [0u8; 32];
                d.copy_from_slice(c);
                Digest(d)
            })
            .collect();
        Ok(Self {
            image_size,
            chunk_size,
            digests,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_a_short_last_chunk() {
        let mut index = FixedIndex::new(3 * 65536 + 100, 65536).unwrap();
        assert_eq!(index.len(), 4);
        index.set(1, Digest([9; 32])).unwrap();
        assert!(index.set(4, Digest([9; 32])).is_err());
        assert_eq!(index.chunk_range(3), (3 * 65536, 100));
        assert_eq!(index.chunk_range(0), (0, 65536));
        let decoded = FixedIndex::decode(&index.encode()).unwrap();
        assert_eq!(decoded, index);
        assert!(FixedIndex::new(0, 65536).unwrap().is_empty());
    }

    #[test]
    fn damage_is_detected() {
        let index = FixedIndex::new(10 * 65536, 65536).unwrap();
        let mut data = index.encode();
        data[40] ^= 1;
        assert_eq!(FixedIndex::decode(&data).unwrap_err().kind(), ErrorKind::Corrupt);
        let data = index.encode();
        assert!(FixedIndex::decode(&data[..data.len() - 1]).is_err());
    }

    #[test]
    fn impossible_sizes_are_refused() {
        assert!(FixedIndex::new(u64::MAX, 65536).is_err());
        assert!(FixedIndex::new(100, 1000).is_err());
    }
}
