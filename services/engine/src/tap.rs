//! The source's block hash, taken from the bytes a copy reads anyway.
//!
//! A verified copy must know the source's digest. Reading the source a second time for it
//! costs a whole second pass over the network or the disk; instead every segment the copy
//! reads (or knows to be zero) is handed to the tap, which hashes the 64 KiB blocks it
//! covers and combines their digests in block order. Segments arrive in any order and need
//! not be block-aligned (extents end on 4 KiB boundaries): a block cut by a segment edge is
//! assembled in a buffer of its own until all of its bytes have arrived. Held memory is
//! bounded by the segments in flight: digests wait only for the blocks before them.
//!
//! Each block's read-back check value (see `blockcheck`) is added up as well, from the same
//! bytes while they are in the cache: it is what the target read back is compared with.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use ferry_blkhash::{is_zero, sha256, Combiner, Hash, ZeroDigests, BLOCK_SIZE};
use ferry_core::{Error, Result};
use parking_lot::Mutex;

use crate::blockcheck::data_block_value;

const BLOCK: u64 = BLOCK_SIZE as u64;

/// Collects the block digests of an image of `size` bytes from the segments of a copy.
#[derive(Debug)]
pub(crate) struct BlockTap {
    size: u64,
    zeroes: ZeroDigests,
    state: Mutex<State>,
    /// The sum of the check values of the blocks hashed so far.
    check: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Blocks cut by a segment edge, with the bytes that have arrived so far.
    partial: HashMap<u64, Partial>,
    /// Digests of finished blocks not yet combined, by their first block.
    ready: BTreeMap<u64, Ready>,
    /// The next block to combine.
    next: u64,
    combiner: Combiner,
}

#[derive(Debug)]
struct Partial {
    bytes: Vec<u8>,
    filled: u64,
}

#[derive(Debug)]
enum Ready {
    Digests(Vec<Hash>),
    /// This many full-size zero blocks.
    Zero(u64),
}

impl Ready {
    fn blocks(&self) -> u64 {
        match self {
            Ready::Digests(d) => d.len() as u64,
            Ready::Zero(n) => *n,
        }
    }
}

impl BlockTap {
    pub fn new(size: u64) -> Self {
        Self {
            size,
            zeroes: ZeroDigests::new(size),
            state: Mutex::default(),
            check: AtomicU64::new(0),
        }
    }

    /// The source's bytes `data` at `offset` (a segment the copy read). Hashes the whole
    /// blocks it covers on the caller's thread: call it where blocking is fine.
    pub fn data(&self, offset: u64, data: &[u8]) {
        let end = offset + data.len() as u64;
        let mut whole: Vec<Hash> = Vec::new();
        let mut whole_from = None;
        let mut check = 0u64;
        let mut pos = offset;
        while pos < end {
            let (block, start, block_end) = self.block_at(pos);
            let n = end.min(block_end) - pos;
            let bytes = &data[(pos - offset) as usize..(pos - offset + n) as usize];
            if pos == start && n == block_end - start {
                whole_from.get_or_insert(block);
                let (digest, value) = self.block(block, bytes);
                whole.push(digest);
                check = check.wrapping_add(value);
            } else {
                self.fill(block, pos - start, n, Some(bytes));
            }
            pos += n;
        }
        self.check.fetch_add(check, Ordering::Relaxed);
        if let Some(first) = whole_from {
            self.insert(first, Ready::Digests(whole));
        }
    }

    /// The digest and check value of the whole block `index`.
    fn block(&self, index: u64, bytes: &[u8]) -> (Hash, u64) {
        if is_zero(bytes) {
            (self.zeroes.for_len(bytes.len()), 0)
        } else {
            (sha256(bytes), data_block_value(index, bytes))
        }
    }

    /// The sum of the check values of every block handed over (complete once
    /// [`BlockTap::finish`] succeeds).
    pub fn check(&self) -> u64 {
        self.check.load(Ordering::Relaxed)
    }

    /// `len` zero bytes at `offset` (a range the copy knows to be zero, not read).
    pub fn zero(&self, offset: u64, len: u64) {
        let end = offset + len;
        let mut pos = offset;
        let mut run: Option<(u64, u64)> = None;
        while pos < end {
            let (block, start, block_end) = self.block_at(pos);
            let n = end.min(block_end) - pos;
            if pos == start && n == BLOCK {
                run.get_or_insert((block, 0)).1 += 1;
            } else {
                if let Some((first, count)) = run.take() {
                    self.insert(first, Ready::Zero(count));
                }
                if pos == start && n == block_end - start {
                    // The image's short last block has a digest of its own length.
                    let digest = self.zeroes.for_len(n as usize);
                    self.insert(block, Ready::Digests(vec![digest]));
                } else {
                    self.fill(block, pos - start, n, None);
                }
            }
            pos += n;
        }
        if let Some((first, count)) = run {
            self.insert(first, Ready::Zero(count));
        }
    }

    /// The image's digest, once every block has arrived.
    pub fn finish(&self) -> Result<Hash> {
        let mut state = self.state.lock();
        let blocks = self.size.div_ceil(BLOCK);
        if state.next != blocks || !state.partial.is_empty() {
            return Err(Error::internal(format!(
                "the copy handed {} of {blocks} blocks to the source's hash",
                state.next
            )));
        }
        Ok(std::mem::take(&mut state.combiner).finish(self.size))
    }

    /// The block holding `pos`: its index, start and end.
    fn block_at(&self, pos: u64) -> (u64, u64, u64) {
        let block = pos / BLOCK;
        let start = block * BLOCK;
        (block, start, (start + BLOCK).min(self.size))
    }

    /// Adds `n` bytes (zeroes, for `None`) at `at` within a block cut by a segment edge;
    /// the block's digest is ready once all of its bytes are there.
    fn fill(&self, block: u64, at: u64, n: u64, bytes: Option<&[u8]>) {
        let (_, start, end) = self.block_at(block * BLOCK);
        let len = end - start;
        let complete = {
            let mut state = self.state.lock();
            let partial = state.partial.entry(block).or_insert_with(|| Partial {
                bytes: vec![0; len as usize],
                filled: 0,
            });
            if let Some(b) = bytes {
                partial.bytes[at as usize..(at + n) as usize].copy_from_slice(b);
            }
            partial.filled += n;
            if partial.filled >= len {
                state.partial.remove(&block)
            } else {
                None
            }
        };
        if let Some(partial) = complete {
            let (digest, value) = self.block(block, &partial.bytes);
            self.check.fetch_add(value, Ordering::Relaxed);
            self.insert(block, Ready::Digests(vec![digest]));
        }
    }

    fn insert(&self, first: u64, ready: Ready) {
        let mut state = self.state.lock();
        state.ready.insert(first, ready);
        let full = self.zeroes.for_len(BLOCK_SIZE);
        loop {
            let next = state.next;
            let Some(ready) = state.ready.remove(&next) else {
                break;
            };
            state.next += ready.blocks();
            match ready {
                Ready::Digests(digests) => state.combiner.add_all(&digests),
                Ready::Zero(count) => state.combiner.add_run(&full, count),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockcheck::blocks_value;
    use ferry_blkhash::digest_bytes;
    use proptest::prelude::*;

    /// Hands `data` to a tap in the given pieces (in the given order), zero pieces as
    /// known-zero ranges.
    fn tapped(data: &[u8], pieces: &[(u64, u64, bool)]) -> Result<Hash> {
        let tap = BlockTap::new(data.len() as u64);
        for &(start, end, zero) in pieces {
            if zero {
                tap.zero(start, end - start);
            } else {
                tap.data(start, &data[start as usize..end as usize]);
            }
        }
        let digest = tap.finish()?;
        assert_eq!(tap.check(), blocks_value(0, data), "the read-back check");
        Ok(digest)
    }

    #[test]
    fn pieces_in_any_order_give_the_block_hash() {
        let b = BLOCK;
        let size = 5 * b + 1000;
        let mut data: Vec<u8> = (0..size).map(|i| (i % 251) as u8 | 1).collect();
        data[(b as usize)..(3 * b as usize + 4096)].fill(0);
        let pieces = [
            (3 * b + 4096, 5 * b + 1000, false),
            (b, 3 * b + 4096, true),
            (0, 4096, false),
            (4096, b, false),
        ];
        assert_eq!(tapped(&data, &pieces).unwrap(), digest_bytes(&data));
        let mut zeroes = vec![0u8; size as usize];
        assert_eq!(
            tapped(&zeroes, &[(0, size, true)]).unwrap(),
            digest_bytes(&zeroes)
        );
        zeroes.truncate(3 * b as usize);
        assert_eq!(
            tapped(&zeroes, &[(b, 3 * b, true), (0, b, true)]).unwrap(),
            digest_bytes(&zeroes)
        );
    }

    #[test]
    fn a_missing_piece_is_an_error_not_a_wrong_digest() {
        let data = vec![7u8; 3 * BLOCK_SIZE];
        let err = tapped(&data, &[(0, BLOCK, false), (2 * BLOCK, 3 * BLOCK, false)]);
        assert!(err.unwrap_err().to_string().contains("1 of 3 blocks"));
        let err = tapped(&data, &[(0, 100, false)]);
        assert!(err.is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Cut an image at random 512-byte boundaries, mark random pieces zero (their
        /// bytes zeroed), hand them over shuffled: always the direct block hash.
        #[test]
        fn random_cuts_match_the_direct_hash(
            size in 0usize..(6 * BLOCK_SIZE + 3),
            cuts in prop::collection::vec(0usize..(6 * BLOCK_SIZE / 512 + 1), 0..24),
            zero_mask in any::<u32>(),
            seed in any::<u64>(),
        ) {
            let mut data: Vec<u8> = (0..size).map(|i| (i as u64 ^ seed) as u8 | 1).collect();
            let mut bounds: Vec<usize> = cuts.iter().map(|c| (c * 512).min(size)).collect();
            bounds.extend([0, size]);
            bounds.sort_unstable();
            bounds.dedup();
            let mut pieces = Vec::new();
            for (i, w) in bounds.windows(2).enumerate() {
                let zero = zero_mask >> (i % 32) & 1 == 1;
                if zero {
                    data[w[0]..w[1]].fill(0);
                }
                pieces.push((w[0] as u64, w[1] as u64, zero));
            }
            let rotate = (seed as usize) % pieces.len().max(1);
            pieces.rotate_left(rotate);
            pieces.reverse();
            prop_assert_eq!(tapped(&data, &pieces).unwrap(), digest_bytes(&data));
        }
    }
}
