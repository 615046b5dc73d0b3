//! Splitting requests for direct I/O.
//!
//! O_DIRECT needs the file offset, the length and the buffer address aligned. The engine
//! aligns its requests to `Caps::block.minimum`, but the last request of an image whose
//! size is not a multiple of the alignment ends in a partial block, and a caller may still
//! hand over an unaligned piece. Such a request is cut into an aligned middle, done with
//! O_DIRECT, and unaligned edges, done on a second, page-cache descriptor of the same file
//! (the kernel keeps the two coherent: direct I/O writes back and invalidates cached pages
//! in its range). The alignment is at least a page, so the edges never share a page with
//! a direct request of a well-aligned caller.

use std::ops::Range;

/// One piece of a request: a range of the caller's buffer and whether it may go through
/// the O_DIRECT descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) range: Range<usize>,
    pub(crate) direct: bool,
}

/// Cuts a request of `len` bytes at file `offset` from a buffer at address `addr` into at
/// most three non-empty pieces, in order: an unaligned head, an aligned middle and an
/// unaligned tail. `align` and `mem_align` are powers of two.
pub(crate) fn plan(
    offset: u64,
    len: usize,
    addr: usize,
    align: u32,
    mem_align: usize,
) -> Vec<Piece> {
    let align_u64 = u64::from(align);
    let head = ((align_u64 - offset % align_u64) % align_u64).min(len as u64) as usize;
    let middle_addr_ok = addr.wrapping_add(head).is_multiple_of(mem_align.max(1));
    let middle = if middle_addr_ok {
        (len - head) / align as usize * align as usize
    } else {
        0
    };
    let mut pieces = Vec::with_capacity(3);
    if middle == 0 {
        if len > 0 {
            pieces.push(Piece {
                range: 0..len,
                direct: false,
            });
        }
        return pieces;
    }
    if head > 0 {
        pieces.push(Piece {
            range: 0..head,
            direct: false,
        });
    }
    pieces.push(Piece {
        range: head..head + middle,
        direct: true,
    });
    if head + middle < len {
        pieces.push(Piece {
            range: head + middle..len,
            direct: false,
        });
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(range: Range<usize>, direct: bool) -> Piece {
        Piece { range, direct }
    }

    #[test]
    fn aligned_request_is_one_direct_piece() {
        assert_eq!(
            plan(8192, 1 << 20, 4096, 4096, 4096),
            vec![p(0..1 << 20, true)]
        );
    }

    #[test]
    fn partial_last_block_goes_through_the_page_cache() {
        assert_eq!(
            plan(4096, 8192 + 1, 0, 4096, 4096),
            vec![p(0..8192, true), p(8192..8193, false)]
        );
    }

    #[test]
    fn unaligned_offset_splits_head_middle_tail() {
        assert_eq!(
            plan(4000, 96 + 4096 + 10, 4096 - 96, 4096, 4096),
            vec![p(0..96, false), p(96..4192, true), p(4192..4202, false)]
        );
    }

    #[test]
    fn misaligned_memory_falls_back_to_the_page_cache() {
        assert_eq!(plan(0, 8192, 4097, 4096, 4096), vec![p(0..8192, false)]);
        assert_eq!(plan(4000, 8192, 4096, 4096, 4096), vec![p(0..8192, false)]);
    }

    #[test]
    fn small_and_empty_requests() {
        assert_eq!(plan(0, 100, 0, 4096, 4096), vec![p(0..100, false)]);
        assert_eq!(plan(10, 100, 0, 4096, 4096), vec![p(0..100, false)]);
        assert!(plan(0, 0, 0, 4096, 4096).is_empty());
    }
}
