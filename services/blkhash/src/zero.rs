//! All-zero blocks: the zero page the block hash's zero digests are computed from, and the
//! fast check that tells a zero block from data.
//!
//! Every byte the engine reads passes through [`is_zero`] (its zero detection and this
//! crate's block digests share it), so the check must run near memory speed: it compares
//! against a static zero page (glibc's vectorized memcmp) instead of looking at bytes one
//! at a time.

use crate::BLOCK_SIZE;

/// A page of zeroes to compare against, and to feed hashers for zero ranges: one block.
pub static ZERO_PAGE: [u8; BLOCK_SIZE] = [0; BLOCK_SIZE];

/// Whether every byte of `buf` is zero.
#[inline]
pub fn is_zero(buf: &[u8]) -> bool {
    buf.chunks(ZERO_PAGE.len())
        .all(|chunk| chunk == &ZERO_PAGE[..chunk.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_zero_finds_any_set_byte() {
        let mut buf = vec![0u8; 200_000];
        assert!(is_zero(&buf));
        assert!(is_zero(&[]));
        for pos in [0, 1, 15, 16, 65_535, 65_536, 199_999] {
            buf[pos] = 1;
            assert!(!is_zero(&buf), "{pos}");
            buf[pos] = 0;
        }
    }
}
