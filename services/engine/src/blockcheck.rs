//! The check a verified copy compares between the source and the target read back.
//!
//! A verified copy must prove that the target, read back after its flush, holds the
//! source's bytes. Hashing the read-back with the block hash would cost as much CPU as
//! hashing the source (SHA-256 runs at about 2 GB/s per core) on top of the copy, which
//! already keeps the cores busy. The source's block hash is still computed (it is the
//! digest reported and stored); the comparison itself uses a cheaper check that both sides
//! compute per block of the block hash (`blkhash::BLOCK_SIZE`):
//!
//! - an all-zero block contributes 0, so zero ranges known from extents cost nothing;
//! - any other block contributes `mix(index, CRC-64/NVME(block))`, where `mix` is a
//!   bijection of the CRC for a given block index (computed with carry-less
//!   multiplication, CRC-64 runs at many GB/s per core);
//! - the image's check is the sum of its blocks' values modulo 2^64, so the blocks can be
//!   added in any order as they arrive.
//!
//! What it catches: a block whose bytes differ has a different CRC (always for damage
//! within 64 consecutive bits, with a probability of 1 - 2^-64 for any other), so its value
//! differs and the sum changes; a block written at the wrong place changes the sum because
//! its index is mixed in; a lost write leaves zeroes (value 0) or stale bytes. Several
//! damaged blocks could cancel out only with a probability of about 2^-64. It guards
//! against corruption, not against someone forging a target on purpose.

use ferry_blkhash::is_zero;

/// The check value of block `index` (the block's bytes: a full block, or the image's short
/// last one).
pub(crate) fn block_value(index: u64, block: &[u8]) -> u64 {
    if is_zero(block) {
        0
    } else {
        value_of_crc(index, crc(block))
    }
}

/// The check value of a block that is known not to be all zeroes.
pub(crate) fn data_block_value(index: u64, block: &[u8]) -> u64 {
    value_of_crc(index, crc(block))
}

/// The sum of the check values of the blocks of `buf`, which holds the image's bytes from
/// block `first` on (the reference the engine's checks are tested against).
#[cfg(test)]
pub(crate) fn blocks_value(first: u64, buf: &[u8]) -> u64 {
    buf.chunks(ferry_blkhash::BLOCK_SIZE)
        .zip(first..)
        .fold(0u64, |sum, (block, index)| {
            sum.wrapping_add(block_value(index, block))
        })
}

fn crc(block: &[u8]) -> u64 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, block)
}

/// A bijection of `crc` for a fixed `index`: SplitMix64's finaliser (itself a bijection)
/// of the CRC xor a mix of the index. Never 0 for two different CRCs of one index.
fn value_of_crc(index: u64, crc: u64) -> u64 {
    mix(crc ^ mix(index.wrapping_add(0x243f_6a88_85a3_08d3)))
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_blkhash::BLOCK_SIZE;

    const B: usize = BLOCK_SIZE;

    fn image() -> Vec<u8> {
        let mut data: Vec<u8> = (0..4 * B + 100).map(|i| (i % 251) as u8 | 1).collect();
        data[B..2 * B].fill(0);
        data
    }

    #[test]
    fn zero_blocks_count_nothing_and_data_blocks_something() {
        assert_eq!(block_value(3, &[0; B]), 0);
        assert_eq!(block_value(3, &[0; 100]), 0);
        assert_ne!(block_value(3, &[1; B]), 0);
        assert_eq!(block_value(3, &[1; B]), data_block_value(3, &[1; B]));
        let data = image();
        let by_block: u64 = data
            .chunks(B)
            .enumerate()
            .map(|(i, b)| block_value(i as u64, b))
            .fold(0, u64::wrapping_add);
        assert_eq!(blocks_value(0, &data), by_block);
        // Any split on block boundaries gives the same sum.
        let split = blocks_value(0, &data[..2 * B]).wrapping_add(blocks_value(2, &data[2 * B..]));
        assert_eq!(split, by_block);
    }

    /// A flipped bit anywhere, a lost block, a block swapped with another or a short
    /// read-back all change the check.
    #[test]
    fn damage_changes_the_check() {
        let data = image();
        let good = blocks_value(0, &data);
        for pos in [0, 17, B - 1, 2 * B, 3 * B + 5, data.len() - 1] {
            for bit in [0, 3, 7] {
                let mut bad = data.clone();
                bad[pos] ^= 1 << bit;
                assert_ne!(blocks_value(0, &bad), good, "byte {pos} bit {bit}");
            }
        }
        let mut lost = data.clone();
        lost[2 * B..3 * B].fill(0);
        assert_ne!(blocks_value(0, &lost), good);
        let mut swapped = data.clone();
        let (a, b) = swapped.split_at_mut(3 * B);
        a[2 * B..].swap_with_slice(&mut b[..B]);
        assert_ne!(blocks_value(0, &swapped), good);
        assert_ne!(blocks_value(0, &data[..3 * B]), good);
    }
}
