//! Chunk digests: the 32-byte names of chunks, and the reserved all-zero digest that
//! stands for a chunk of zeroes (never stored).
//!
//! A chunk is named from the SHA-256 of each of its 64 KiB blocks, the block digests of
//! the image's block hash (blksum's): a backup needs those anyway for the image's hash,
//! so the content is hashed once, and a restore checks every chunk against its name with
//! the same pass that rebuilds the image's hash.

use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

use ferry_blkhash::{is_zero, sha256, Hash, ZeroDigests, BLOCK_SIZE};
use ferry_core::{Error, Result};

/// The SHA-256 of a whole block of zeroes.
static ZERO_BLOCK: LazyLock<Hash> = LazyLock::new(|| ZeroDigests::new(0).for_len(BLOCK_SIZE));

/// The SHA-256 of each 64 KiB block of `data`, the last one short and unpadded (the block
/// digests of blksum's block hash).
pub fn block_digests(data: &[u8]) -> Vec<Hash> {
    block_digests_known_zero(data, &[])
}

/// [`block_digests`] of `data` where the full blocks `known_zero` marks are zeroes
/// whatever `data` holds there (read from a source's hole, left unfilled): their digest
/// is the zero block's, without reading them.
pub fn block_digests_known_zero(data: &[u8], known_zero: &[bool]) -> Vec<Hash> {
    data.chunks(BLOCK_SIZE)
        .enumerate()
        .map(|(i, block)| {
            let full = block.len() == BLOCK_SIZE;
            if full && (known_zero.get(i) == Some(&true) || is_zero(block)) {
                *ZERO_BLOCK
            } else {
                sha256(block)
            }
        })
        .collect()
}

/// Whether `blocks` are the block digests of `len` zero bytes.
pub(crate) fn blocks_are_zero(len: usize, blocks: &[Hash]) -> bool {
    let full = len / BLOCK_SIZE;
    let tail = len % BLOCK_SIZE;
    if blocks.len() != full + usize::from(tail != 0)
        || !blocks[..full].iter().all(|b| *b == *ZERO_BLOCK)
    {
        return false;
    }
    tail == 0 || blocks[full] == ZeroDigests::new(tail as u64).for_len(tail)
}

/// The name of a chunk: SHA-256 of its block digests in a plain repository, HMAC-SHA256
/// under the repository's id key in an encrypted one (see
/// [`crate::Repository::chunk_digest_of_blocks`]).
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
        if s.len() != 64
            || !s
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(Error::invalid_input(format!(
                "'{s}' is not a chunk digest (64 lowercase hex digits)"
            )));
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
        assert_eq!(
            Digest::from_chunk_name("chunks/ac/".to_string().as_str()),
            None
        );
        assert_eq!(
            Digest::from_chunk_name(&format!("chunks/cd/{}", "ab".repeat(32))),
            None
        );
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        assert!("AB".repeat(32).parse::<Digest>().is_err());
        assert!(Digest::ZERO.is_zero());
    }

    #[test]
    fn known_zero_blocks_are_not_read() {
        let b = BLOCK_SIZE;
        let mut data = vec![7u8; 3 * b + 100];
        data[b..2 * b].fill(0);
        // Block 0 is stale data in a hole; block 3 is short, so never taken as known.
        let got = block_digests_known_zero(&data, &[true, false, false, true]);
        let mut filled = data.clone();
        filled[..b].fill(0);
        assert_eq!(got, block_digests(&filled));
        assert_eq!(got[0], *ZERO_BLOCK);
        assert_eq!(got[1], *ZERO_BLOCK);
        assert_eq!(got[2], sha256(&data[2 * b..3 * b]));
        assert_eq!(got[3], sha256(&data[3 * b..]));
    }

    #[test]
    fn block_digests_are_blksums_and_zero_blocks_are_recognised() {
        let b = BLOCK_SIZE;
        let mut data = vec![0u8; 3 * b + 100];
        data[b + 7] = 1;
        let got = block_digests(&data);
        assert_eq!(got.len(), 4);
        for (i, block) in data.chunks(b).enumerate() {
            assert_eq!(got[i], sha256(block), "block {i}");
        }
        assert!(!blocks_are_zero(data.len(), &got));
        let zero = vec![0u8; 3 * b + 100];
        assert!(blocks_are_zero(zero.len(), &block_digests(&zero)));
        assert!(blocks_are_zero(2 * b, &block_digests(&zero[..2 * b])));
        // The right digests for another length are not zero for this one.
        assert!(!blocks_are_zero(2 * b + 1, &block_digests(&zero[..2 * b])));
        assert!(!blocks_are_zero(
            3 * b + 100,
            &block_digests(&zero[..3 * b + 99])
        ));
    }
}
