//! Zero detection: which blocks of a read buffer are all zeroes.
//!
//! Every byte the copy reads passes through here. The check of one block is
//! [`ferry_blkhash::is_zero`] (a compare against a static zero page, near memory speed),
//! shared with the block hash; this module splits a buffer into zero and data runs on the
//! image's sparse grid.

use ferry_blkhash::is_zero;

/// A run of a buffer that is all zeroes or holds data, relative to the buffer start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub start: usize,
    pub len: usize,
    pub zero: bool,
}

impl Run {
    pub fn end(&self) -> usize {
        self.start + self.len
    }
}

/// Splits `buf`, which holds the image bytes at `offset`, into alternating zero and data
/// runs, appended to `out` (cleared first).
///
/// Blocks are `sparse` bytes on the image's grid (not the buffer's). A partial block at
/// either end of the buffer counts as data, because writing it as zeroes would split a
/// block the target may not be able to zero on its own, except a partial block that ends
/// at `image_end`, the image's last block. `sparse == 0` makes everything data.
pub(crate) fn scan(buf: &[u8], offset: u64, sparse: usize, image_end: u64, out: &mut Vec<Run>) {
    out.clear();
    let len = buf.len();
    if len == 0 {
        return;
    }
    if sparse == 0 {
        out.push(Run {
            start: 0,
            len,
            zero: false,
        });
        return;
    }
    let mut push = |start: usize, end: usize, zero: bool| match out.last_mut() {
        Some(last) if last.zero == zero => last.len = end - last.start,
        _ => out.push(Run {
            start,
            len: end - start,
            zero,
        }),
    };
    let sparse64 = sparse as u64;
    let misalign = (offset % sparse64) as usize;
    let mut pos = if misalign == 0 {
        0
    } else {
        (sparse - misalign).min(len)
    };
    if pos > 0 {
        push(0, pos, false);
    }
    let buf_end = offset + len as u64;
    while pos < len {
        let end = (pos + sparse).min(len);
        let full = end - pos == sparse || buf_end == image_end;
        let zero = full && is_zero(&buf[pos..end]);
        push(pos, end, zero);
        pos = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(buf: &[u8], offset: u64, sparse: usize, image_end: u64) -> Vec<(usize, usize, bool)> {
        let mut out = Vec::new();
        scan(buf, offset, sparse, image_end, &mut out);
        out.iter().map(|r| (r.start, r.len, r.zero)).collect()
    }

    #[test]
    fn merges_adjacent_blocks_of_a_kind() {
        let mut buf = vec![0u8; 16];
        buf[4] = 1; // block 1 of 4-byte blocks
        buf[9] = 1; // block 2
        assert_eq!(
            runs(&buf, 0, 4, 100),
            vec![(0, 4, true), (4, 8, false), (12, 4, true)]
        );
    }

    #[test]
    fn blocks_follow_the_image_grid() {
        let buf = vec![0u8; 10];
        // offset 2 with 4-byte blocks: 2 bytes partial (data), 4 full (zero), 4 full (zero)
        assert_eq!(runs(&buf, 2, 4, 100), vec![(0, 2, false), (2, 8, true)]);
        // a partial tail block is data unless it ends the image
        assert_eq!(
            runs(&buf[..7], 0, 4, 100),
            vec![(0, 4, true), (4, 3, false)]
        );
        assert_eq!(runs(&buf[..7], 0, 4, 7), vec![(0, 7, true)]);
    }

    #[test]
    fn zero_sparse_size_keeps_everything_data() {
        assert_eq!(runs(&[0u8; 8], 0, 0, 8), vec![(0, 8, false)]);
        assert_eq!(runs(&[], 0, 4, 8), vec![]);
    }
}
