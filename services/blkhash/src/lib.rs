//! ferry-blkhash: the blksum-compatible block hash, the construction itself, apart from how
//! the engine schedules it.
//!
//! `digest = SHA-256( SHA-256(b0) || ... || SHA-256(bn-1) || LE64(L) )` over blocks of
//! [`BLOCK_SIZE`] bytes, the last one short and unpadded. Block digests are independent
//! (so they are computed in parallel) and combined in order; an all-zero block's digest
//! is a constant, so zero ranges cost neither reading nor hashing.
//!
//! A crate of its own because two layers need it and neither may depend on the other: the
//! engine's checksum and copy tap compute it, and the backup repository names chunks by
//! their block digests (so an image is hashed once per backup, and a restore checks each
//! chunk with the pass that rebuilds the image's hash). ferry-core could hold it, but then
//! every crate would link sha2 for a hash most of them never compute.

#![forbid(unsafe_code)]

mod zero;

use sha2::{Digest as _, Sha256};

pub use zero::{is_zero, ZERO_PAGE};

/// Bytes per hashed block.
pub const BLOCK_SIZE: usize = 64 * 1024;

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> Hash {
    Sha256::digest(data).into()
}

/// Precomputed digests of all-zero blocks: the full block and the image's short last block.
#[derive(Debug, Clone, Copy)]
pub struct ZeroDigests {
    full: Hash,
    /// Digest of the short last block's length in zeroes (if the size is unaligned).
    tail: Hash,
}

impl ZeroDigests {
    /// The zero digests of an image of `size` bytes.
    pub fn new(size: u64) -> Self {
        let tail_len = (size % BLOCK_SIZE as u64) as usize;
        Self {
            full: sha256(&ZERO_PAGE[..BLOCK_SIZE]),
            tail: sha256(&ZERO_PAGE[..tail_len]),
        }
    }

    /// The digest of an all-zero block of `len` bytes (a full block or the short last one).
    pub fn for_len(&self, len: usize) -> Hash {
        if len == BLOCK_SIZE {
            self.full
        } else {
            self.tail
        }
    }
}

/// The digest of one block, using the zero digest when the block is all zeroes.
pub fn block_digest(block: &[u8], zeroes: &ZeroDigests) -> Hash {
    if is_zero(block) {
        zeroes.for_len(block.len())
    } else {
        sha256(block)
    }
}

/// Combines block digests, in block order, into the image digest.
#[derive(Debug, Clone, Default)]
pub struct Combiner {
    outer: Sha256,
}

/// Copies of one digest fed to the outer hash per call when a zero run is combined: large
/// enough that SHA-256 runs over whole buffers, not one 32-byte call per block.
const RUN_BATCH: usize = 256;

impl Combiner {
    /// Adds the next block's digest.
    pub fn add(&mut self, block: &Hash) {
        self.outer.update(block);
    }

    /// Adds consecutive block digests in one call.
    pub fn add_all(&mut self, blocks: &[Hash]) {
        self.outer.update(blocks.as_flattened());
    }

    /// Adds `count` copies of `digest` (a run of identical blocks, such as zeroes).
    pub fn add_run(&mut self, digest: &Hash, count: u64) {
        let batch = [*digest; RUN_BATCH];
        let mut left = count;
        while left > 0 {
            let n = left.min(RUN_BATCH as u64) as usize;
            self.outer.update(batch[..n].as_flattened());
            left -= n as u64;
        }
    }

    /// The image digest of an image of `size` bytes whose block digests were all added.
    pub fn finish(mut self, size: u64) -> Hash {
        self.outer.update(size.to_le_bytes());
        self.outer.finalize().into()
    }
}

/// The block hash of `data`, computed directly on one thread: the reference the parallel
/// engine is tested against, and handy for tests elsewhere.
pub fn digest_bytes(data: &[u8]) -> Hash {
    let mut combiner = Combiner::default();
    for block in data.chunks(BLOCK_SIZE) {
        combiner.add(&sha256(block));
    }
    combiner.finish(data.len() as u64)
}

/// Lower-case hex of a digest.
pub fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: usize = BLOCK_SIZE;

    fn hex_of(data: &[u8]) -> String {
        to_hex(&digest_bytes(data))
    }

    #[test]
    fn field_notes_vectors() {
        assert_eq!(
            hex_of(&vec![b'A'; B]),
            "2e3a5f57d5e726ee5de62db1a85ff816f4fa6ea4627807d9a51bdc4c883e165e"
        );
        assert_eq!(
            hex_of(&vec![0; B]),
            "8ab067ab7939a3d4f40cbb118956c07c06aeae2d075d6e0a2ebbb94bd42832af"
        );
        assert_eq!(
            hex_of(&vec![b'A'; B / 2]),
            "9467334d6d7668a2f06898185b5cddc78cdfbd962f50c6bf250101f03a0e54dc"
        );
        assert_eq!(
            hex_of(&vec![0; B / 2]),
            "842d185f0ff348b0d689e184bddc47f69a19032a6934c89b879479f1e86f9d56"
        );
        assert_eq!(
            hex_of(&vec![0; 8 * B]),
            "722ac11a3a81034edf196aa3ee68d1a2e345cd0838b0c78c2ce2fb015d4d817d"
        );
        assert_eq!(
            hex_of(&vec![0; 8 * B + B / 2]),
            "e623a5702b1feb08fbb3d18e35bbb7ec10146b8cd1bcff811200a3948c78c55c"
        );
    }

    #[test]
    fn zero_digests_match_hashing_zeroes() {
        let z = ZeroDigests::new(3 * B as u64 + 100);
        assert_eq!(z.for_len(B), sha256(&vec![0; B]));
        assert_eq!(z.for_len(100), sha256(&[0; 100]));
        assert_eq!(block_digest(&[0; 100], &z), sha256(&[0; 100]));
        assert_eq!(block_digest(&[1; 100], &z), sha256(&[1; 100]));
    }

    #[test]
    fn a_run_equals_its_blocks_added_one_by_one() {
        let digest = sha256(b"block");
        for count in [
            0,
            1,
            RUN_BATCH as u64 - 1,
            RUN_BATCH as u64,
            3 * RUN_BATCH as u64 + 7,
        ] {
            let mut one_by_one = Combiner::default();
            (0..count).for_each(|_| one_by_one.add(&digest));
            let mut run = Combiner::default();
            run.add_run(&digest, count);
            assert_eq!(run.finish(count), one_by_one.finish(count), "count {count}");
        }
        let blocks = [sha256(b"a"), sha256(b"b"), sha256(b"c")];
        let mut all = Combiner::default();
        all.add_all(&blocks);
        let mut each = Combiner::default();
        blocks.iter().for_each(|b| each.add(b));
        assert_eq!(all.finish(3), each.finish(3));
    }

    #[test]
    fn empty_image() {
        let mut h = Sha256::new();
        h.update(0u64.to_le_bytes());
        let expected: Hash = h.finalize().into();
        assert_eq!(digest_bytes(&[]), expected);
    }
}
