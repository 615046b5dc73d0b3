//! The image's block hash assembled from chunks that complete out of order.
//!
//! Chunks are whole multiples of the 64 KiB block, so the image's block digests are the
//! chunks' block digests one after another. Workers hand in each chunk's block digests
//! as they finish; this combines every chunk whose predecessors are all in, so the
//! outer hash advances in block order while later chunks are still being read.

use std::collections::BTreeMap;

use ferry_blkhash::{to_hex, Combiner, Hash, ZeroDigests, BLOCK_SIZE};

/// The block digests of one chunk, or `Zero` for a chunk of zeroes (whose block digests
/// are the precomputed zero digests).
#[derive(Debug, Clone)]
pub(crate) enum ChunkBlocks {
    Zero,
    Data(Vec<Hash>),
}

/// Blocks in a chunk of `len` bytes.
pub(crate) fn blocks_in(len: u64) -> usize {
    len.div_ceil(BLOCK_SIZE as u64) as usize
}

/// Combines chunk block digests, in chunk order, into the image's block hash.
#[derive(Debug)]
pub(crate) struct OrderedHash {
    size: u64,
    chunk_size: u64,
    chunks: usize,
    next: usize,
    pending: BTreeMap<usize, ChunkBlocks>,
    combiner: Combiner,
    zeroes: ZeroDigests,
}

impl OrderedHash {
    pub fn new(size: u64, chunk_size: u32) -> Self {
        let chunk_size = u64::from(chunk_size);
        Self {
            size,
            chunk_size,
            chunks: size.div_ceil(chunk_size) as usize,
            next: 0,
            pending: BTreeMap::new(),
            combiner: Combiner::default(),
            zeroes: ZeroDigests::new(size),
        }
    }

    fn chunk_len(&self, i: usize) -> u64 {
        let offset = i as u64 * self.chunk_size;
        self.chunk_size.min(self.size.saturating_sub(offset))
    }

    /// Hands in chunk `i`'s block digests; combines every chunk now in order. A chunk
    /// handed in again (read twice) is taken once.
    pub fn add(&mut self, i: usize, blocks: ChunkBlocks) {
        if i < self.next || i >= self.chunks {
            return;
        }
        self.pending.entry(i).or_insert(blocks);
        while let Some(blocks) = self.pending.remove(&self.next) {
            let len = self.chunk_len(self.next);
            match blocks {
                ChunkBlocks::Data(digests) => self.combiner.add_all(&digests),
                ChunkBlocks::Zero => {
                    let full = len / BLOCK_SIZE as u64;
                    self.combiner
                        .add_run(&self.zeroes.for_len(BLOCK_SIZE), full);
                    let tail = (len % BLOCK_SIZE as u64) as usize;
                    if tail > 0 {
                        self.combiner.add(&self.zeroes.for_len(tail));
                    }
                }
            }
            self.next += 1;
        }
    }

    /// The block hash in lowercase hex, once every chunk was handed in.
    pub fn finish(self) -> Option<String> {
        (self.next == self.chunks && self.pending.is_empty())
            .then(|| to_hex(&self.combiner.finish(self.size)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_backup::block_digests;
    use ferry_blkhash::digest_bytes;

    #[test]
    fn out_of_order_chunks_give_the_image_hash() {
        let chunk = 2 * BLOCK_SIZE;
        let size = 3 * chunk + BLOCK_SIZE + 100;
        let mut data = vec![0u8; size];
        data[chunk..2 * chunk].fill(7);
        data[3 * chunk + 5] = 1;
        let mut hash = OrderedHash::new(size as u64, chunk as u32);
        for i in [3usize, 1, 0, 2] {
            let part = &data[i * chunk..((i + 1) * chunk).min(size)];
            let blocks = if part.iter().all(|&b| b == 0) {
                ChunkBlocks::Zero
            } else {
                ChunkBlocks::Data(block_digests(part))
            };
            hash.add(i, blocks);
        }
        assert_eq!(hash.finish().unwrap(), to_hex(&digest_bytes(&data)));
    }

    #[test]
    fn a_zero_short_last_chunk_uses_the_tail_digest() {
        let size = BLOCK_SIZE + 10;
        let mut hash = OrderedHash::new(size as u64, (2 * BLOCK_SIZE) as u32);
        hash.add(0, ChunkBlocks::Zero);
        assert_eq!(
            hash.finish().unwrap(),
            to_hex(&digest_bytes(&vec![0; size]))
        );
    }

    #[test]
    fn a_chunk_handed_in_twice_counts_once() {
        let size = 2 * BLOCK_SIZE;
        let mut data = vec![0u8; size];
        data[3] = 9;
        let mut hash = OrderedHash::new(size as u64, BLOCK_SIZE as u32);
        let first = ChunkBlocks::Data(block_digests(&data[..BLOCK_SIZE]));
        hash.add(0, first.clone());
        hash.add(0, first);
        hash.add(1, ChunkBlocks::Zero);
        hash.add(1, ChunkBlocks::Zero);
        hash.add(7, ChunkBlocks::Zero);
        assert_eq!(hash.finish().unwrap(), to_hex(&digest_bytes(&data)));
    }

    #[test]
    fn a_missing_chunk_gives_no_hash() {
        let mut hash = OrderedHash::new(3 * BLOCK_SIZE as u64, BLOCK_SIZE as u32);
        hash.add(0, ChunkBlocks::Zero);
        hash.add(2, ChunkBlocks::Zero);
        assert!(hash.finish().is_none());
    }
}
