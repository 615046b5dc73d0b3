//! [`RangeHashing`]: the layer digest of a blob read by ranged GETs, computed from the
//! ranges the readers fetch, so the blob is not downloaded a second time to be hashed.
//!
//! Each ranged read is offered to an [`OrderedVerifier`] (which hashes the prefix and
//! keeps at most [`AHEAD_LIMIT`] bytes that arrive ahead of it). A range nobody reads
//! (tar headers and padding, a qcow2's refcount blocks) would stall the prefix, and
//! everything after it would be dropped and fetched again: so when the range before the
//! first kept piece is not being read by anyone and is small, or the kept bytes pass half
//! the limit (the prefix is stuck), the reader that noticed fetches it at once (at most
//! [`FILL_MAX`] bytes a time). What is left when the copy ends is fetched by `finish`.

use ferry_registry::{Digest, OrderedVerifier};
use parking_lot::Mutex;

/// Bytes kept ahead of the hashed prefix (read by ranges out of order).
pub(super) const AHEAD_LIMIT: usize = 64 << 20;
/// A range before the first kept piece at most this long, that no read covers, is
/// fetched at once.
const SMALL_GAP: u64 = 256 << 10;
/// Most bytes one fill fetches.
pub(super) const FILL_MAX: u64 = 8 << 20;

/// The ranged reads' shared hash state.
pub(super) struct RangeHashing {
    state: Mutex<State>,
}

struct State {
    /// None once `finish` took it.
    ordered: Option<OrderedVerifier>,
    /// Ranged reads under way, `[start, end)`.
    in_flight: Vec<(u64, u64)>,
    /// A fill is under way (one at a time).
    filling: bool,
    /// Bytes fetched by fills.
    filled: u64,
}

impl RangeHashing {
    pub fn new(digest: Digest, size: u64) -> Self {
        Self {
            state: Mutex::new(State {
                ordered: Some(OrderedVerifier::new(digest, size, AHEAD_LIMIT)),
                in_flight: Vec::new(),
                filling: false,
                filled: 0,
            }),
        }
    }

    /// A ranged read of `[offset, offset + len)` starts.
    pub fn start(&self, offset: u64, len: u64) {
        self.state.lock().in_flight.push((offset, offset + len));
    }

    /// The read [`start`](Self::start)ed at `offset` ended with `bytes` (None when it
    /// failed). Returns a range the caller should fetch now and give to
    /// [`fill`](Self::fill), then [`fill_done`](Self::fill_done).
    pub fn end(
        &self,
        offset: u64,
        len: u64,
        bytes: Option<&[u8]>,
    ) -> ferry_registry::Result<Option<(u64, u64)>> {
        let mut state = self.state.lock();
        if let Some(i) = state
            .in_flight
            .iter()
            .position(|&r| r == (offset, offset + len))
        {
            state.in_flight.swap_remove(i);
        }
        if let (Some(ordered), Some(bytes)) = (state.ordered.as_mut(), bytes) {
            ordered.offer(offset, bytes)?;
        }
        Ok(state.claim_gap())
    }

    /// Bytes of a fill at `offset`.
    pub fn fill(&self, offset: u64, bytes: &[u8]) -> ferry_registry::Result<()> {
        let mut state = self.state.lock();
        state.filled += bytes.len() as u64;
        match state.ordered.as_mut() {
            Some(ordered) => ordered.offer(offset, bytes),
            None => Ok(()),
        }
    }

    /// The fill ended (whether or not it fetched everything).
    pub fn fill_done(&self) {
        self.state.lock().filling = false;
    }

    /// The verifier, for `finish` to fetch what is left and check the digest, with the
    /// bytes fills fetched (None when taken before).
    pub fn take(&self) -> Option<(OrderedVerifier, u64)> {
        let mut state = self.state.lock();
        let filled = state.filled;
        state.ordered.take().map(|o| (o, filled))
    }
}

impl State {
    /// The range to fetch now, if the prefix waits on one nobody is reading.
    fn claim_gap(&mut self) -> Option<(u64, u64)> {
        if self.filling {
            return None;
        }
        let ordered = self.ordered.as_ref()?;
        if ordered.held() == 0 {
            return None;
        }
        let (start, end) = ordered.next_gap()?;
        if self.in_flight.iter().any(|&(a, b)| a < end && b > start) {
            return None;
        }
        if end - start > SMALL_GAP && ordered.held() < AHEAD_LIMIT / 2 {
            return None;
        }
        self.filling = true;
        Some((start, end.min(start + FILL_MAX)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    fn data(len: u64) -> Vec<u8> {
        (0..len).map(|i| (i % 253) as u8).collect()
    }

    fn part(data: &[u8], start: u64, end: u64) -> &[u8] {
        &data[start as usize..end as usize]
    }

    #[test]
    fn a_small_unread_gap_is_claimed_once_and_an_in_flight_one_never() {
        let data = data(1 << 20);
        let h = RangeHashing::new(Digest::of(&data), data.len() as u64);
        // Headers at 0..1024 were never read; a read at 1024 arrives ahead of them while
        // another read is under way further on.
        let a = (K, K + 256 * K);
        let b = (512 * K, 768 * K);
        h.start(a.0, a.1 - a.0);
        h.start(b.0, b.1 - b.0);
        let gap = h.end(a.0, a.1 - a.0, Some(part(&data, a.0, a.1))).unwrap();
        assert_eq!(gap, Some((0, K)));
        // While it is being filled, no one else claims a range.
        let c = (768 * K, 1024 * K);
        h.start(c.0, c.1 - c.0);
        let gap = h.end(c.0, c.1 - c.0, Some(part(&data, c.0, c.1))).unwrap();
        assert_eq!(gap, None);
        h.fill(0, part(&data, 0, K)).unwrap();
        h.fill_done();
        // The prefix is at a.1; the range up to b is in flight: nothing to claim.
        h.start(K, 0);
        assert_eq!(h.end(K, 0, None).unwrap(), None);
        // b ends: the small range a.1..b.0 nobody reads is claimed.
        let gap = h.end(b.0, b.1 - b.0, Some(part(&data, b.0, b.1))).unwrap();
        assert_eq!(gap, Some((a.1, b.0)));
        h.fill(a.1, part(&data, a.1, b.0)).unwrap();
        h.fill_done();
        let (ordered, filled) = h.take().unwrap();
        assert_eq!(filled, K + (b.0 - a.1));
        assert_eq!(ordered.next_gap(), None);
        ordered.check().unwrap();
        assert!(h.take().is_none());
    }

    #[test]
    fn a_large_gap_waits_until_the_prefix_is_stuck() {
        let size = 48 << 20;
        let data = data(size);
        let h = RangeHashing::new(Digest::of(&data), size);
        // 8 MiB at 8 MiB: the 8 MiB before it may still be read by someone.
        let piece = 8 << 20;
        h.start(piece, piece);
        let gap = h
            .end(piece, piece, Some(part(&data, piece, 2 * piece)))
            .unwrap();
        assert_eq!(gap, None);
        // More than half the buffer held ahead: the prefix is stuck, its gap fetched in
        // FILL_MAX steps.
        for i in 2..6 {
            h.start(i * piece, piece);
            let gap = h
                .end(
                    i * piece,
                    piece,
                    Some(part(&data, i * piece, (i + 1) * piece)),
                )
                .unwrap();
            if i == 4 {
                assert_eq!(gap, Some((0, FILL_MAX)), "{i}");
                h.fill(0, part(&data, 0, FILL_MAX)).unwrap();
                h.fill_done();
            } else {
                assert_eq!(gap, None, "{i}");
            }
        }
        let (mut ordered, filled) = h.take().unwrap();
        assert_eq!(filled, FILL_MAX);
        assert_eq!(ordered.position(), 6 * piece);
        assert_eq!(ordered.next_gap(), None);
        ordered.offer(0, &data).unwrap();
        ordered.check().unwrap();
    }
}
