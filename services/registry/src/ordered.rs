//! [`OrderedVerifier`]: a blob's digest checked from pieces that arrive out of order (the
//! ranged reads of parallel readers), so that a blob read by ranges need not be
//! downloaded a second time to be hashed.
//!
//! SHA-256 takes its bytes in order and cannot combine hashes of separate pieces. The
//! verifier hashes the prefix it has, keeps pieces that arrive ahead of it in a buffer
//! bounded by a byte limit, and hashes them when the prefix reaches them. A piece that
//! does not fit is forgotten; so are the ranges nobody read (a tar header, what a qcow2
//! does not map, a range a resumed copy skipped). [`OrderedVerifier::next_gap`] names
//! the first such range, which the caller fetches and offers before the final
//! [`OrderedVerifier::check`]: every byte is hashed once and downloaded at most twice, and
//! once when the readers stay within the limit of each other.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::digest::{Digest, Verifier};
use crate::error::Result;

/// Hashes a blob of known size from pieces offered in any order (see the module
/// documentation).
#[derive(Debug)]
pub struct OrderedVerifier {
    verifier: Verifier,
    size: u64,
    /// Pieces ahead of the hashed prefix, by offset.
    ahead: BTreeMap<u64, Bytes>,
    ahead_bytes: usize,
    limit: usize,
    /// Bytes offered ahead of the prefix that did not fit under the limit.
    dropped: u64,
}

impl OrderedVerifier {
    /// A verifier of a blob of `size` bytes with digest `expected`, keeping at most
    /// `limit` bytes ahead of the hashed prefix.
    pub fn new(expected: Digest, size: u64, limit: usize) -> Self {
        Self {
            verifier: Verifier::new(expected, size),
            size,
            ahead: BTreeMap::new(),
            ahead_bytes: 0,
            limit,
            dropped: 0,
        }
    }

    /// The end of the hashed prefix.
    pub fn position(&self) -> u64 {
        self.verifier.seen()
    }

    /// Bytes held ahead of the prefix now.
    pub fn held(&self) -> usize {
        self.ahead_bytes
    }

    /// Bytes offered ahead of the prefix that were not kept (they are fetched again).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Offers the blob's bytes at `offset`: hashed now when they reach the hashed prefix
    /// (then any kept pieces they join), kept when they lie ahead and fit the limit,
    /// otherwise forgotten. Bytes past the blob's size are corrupt.
    pub fn offer(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        let end = offset.saturating_add(bytes.len() as u64);
        let pos = self.position();
        if end <= pos || bytes.is_empty() {
            return Ok(());
        }
        if offset <= pos {
            self.verifier.update(&bytes[(pos - offset) as usize..])?;
            return self.drain();
        }
        if end > self.size {
            // Hashed when the prefix reaches it, and refused then; nothing to keep.
            self.dropped += bytes.len() as u64;
            return Ok(());
        }
        if self.ahead_bytes + bytes.len() > self.limit {
            self.dropped += bytes.len() as u64;
            return Ok(());
        }
        match self.ahead.get(&offset) {
            Some(kept) if kept.len() >= bytes.len() => {}
            Some(kept) => {
                self.ahead_bytes -= kept.len();
                self.ahead_bytes += bytes.len();
                self.ahead.insert(offset, Bytes::copy_from_slice(bytes));
            }
            None => {
                self.ahead_bytes += bytes.len();
                self.ahead.insert(offset, Bytes::copy_from_slice(bytes));
            }
        }
        Ok(())
    }

    /// Hashes the kept pieces the prefix has reached; forgets those wholly behind it.
    fn drain(&mut self) -> Result<()> {
        while let Some(entry) = self.ahead.first_entry() {
            let pos = self.verifier.seen();
            let offset = *entry.key();
            if offset > pos {
                break;
            }
            let piece = entry.remove();
            self.ahead_bytes -= piece.len();
            let end = offset + piece.len() as u64;
            if end > pos {
                self.verifier.update(&piece[(pos - offset) as usize..])?;
            }
        }
        Ok(())
    }

    /// The first range `[start, end)` the verifier still needs and holds no piece of
    /// (up to the next kept piece or the blob's end); None once the whole blob is hashed.
    pub fn next_gap(&self) -> Option<(u64, u64)> {
        let pos = self.position();
        if pos >= self.size {
            return None;
        }
        let end = self
            .ahead
            .keys()
            .next()
            .copied()
            .unwrap_or(self.size)
            .min(self.size);
        Some((pos, end))
    }

    /// After the whole blob was offered: its size and digest must match.
    pub fn check(self) -> Result<()> {
        self.verifier.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn blob(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// Offers `pieces` (offset, len) of `data`, then fills the gaps as a caller would.
    /// Returns the bytes fetched for the gaps.
    fn run(data: &[u8], pieces: &[(usize, usize)], limit: usize) -> (Result<()>, u64) {
        let mut v = OrderedVerifier::new(Digest::of(data), data.len() as u64, limit);
        for &(at, len) in pieces {
            v.offer(at as u64, &data[at..at + len]).unwrap();
        }
        let mut fetched = 0;
        while let Some((start, end)) = v.next_gap() {
            assert!(start < end, "an empty gap at {start}");
            let (s, e) = (start as usize, end as usize);
            fetched += (e - s) as u64;
            v.offer(start, &data[s..e]).unwrap();
        }
        (v.check(), fetched)
    }

    #[test]
    fn in_order_pieces_need_no_second_fetch() {
        let data = blob(10_000);
        let pieces: Vec<_> = (0..10).map(|i| (i * 1000, 1000)).collect();
        let (r, fetched) = run(&data, &pieces, 0);
        r.unwrap();
        assert_eq!(fetched, 0);
    }

    #[test]
    fn out_of_order_pieces_within_the_limit_need_no_second_fetch() {
        let data = blob(10_000);
        let mut pieces: Vec<_> = (0..10).map(|i| (i * 1000, 1000)).collect();
        pieces.reverse();
        let (r, fetched) = run(&data, &pieces, 9000);
        r.unwrap();
        assert_eq!(fetched, 0);
        // Overlapping and repeated pieces too.
        let pieces = [(500, 2000), (0, 1000), (500, 2000), (2400, 7600), (100, 50)];
        let (r, fetched) = run(&data, &pieces, 10_000);
        r.unwrap();
        assert_eq!(fetched, 0);
    }

    #[test]
    fn what_does_not_fit_or_was_never_read_is_fetched_once() {
        let data = blob(10_000);
        // Reversed with room for two pieces: 9000.. and 8000.. kept, the rest dropped
        // until 0.. arrives; the gap 1000..8000 is fetched.
        let mut pieces: Vec<_> = (0..10).map(|i| (i * 1000, 1000)).collect();
        pieces.reverse();
        let (r, fetched) = run(&data, &pieces, 2000);
        r.unwrap();
        assert_eq!(fetched, 7000);
        // Holes nobody read (headers, unmapped clusters).
        let (r, fetched) = run(&data, &[(512, 3000), (5000, 4000)], 10_000);
        r.unwrap();
        assert_eq!(fetched, 512 + 1488 + 1000);
        let (r, fetched) = run(&data, &[], 0);
        r.unwrap();
        assert_eq!(fetched, 10_000);
    }

    #[test]
    fn a_wrong_byte_anywhere_is_corrupt() {
        let data = blob(10_000);
        let mut v = OrderedVerifier::new(Digest::of(&data), 10_000, 10_000);
        let mut bad = data.clone();
        bad[7777] ^= 1;
        v.offer(5000, &bad[5000..10_000]).unwrap();
        v.offer(0, &data[..5000]).unwrap();
        assert_eq!(v.next_gap(), None);
        assert_eq!(v.check().unwrap_err().kind(), ErrorKind::Corrupt);
        // A blob longer than its descriptor.
        let mut v = OrderedVerifier::new(Digest::of(&data), 9_999, 10_000);
        assert!(v.offer(0, &data).is_err());
    }
}
