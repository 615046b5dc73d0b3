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
const SMALL_GAP: u64 = 1 << 20;
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

    #[test]
    fn a_small_unread_gap_is_claimed_once_and_an_in_flight_one_never() {
        let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 253) as u8).collect();
        let h = RangeHashing::new(Digest::of(&data), data.len() as u64);
        // Headers at 0..1024 were never read; a read at 1024 arrives ahead.
        h.start(1024, 1 << 20);
        h.start(2 << 20, 1 << 20);
        let at = 1024usize;
        let gap = h
            .end(1024, 1 << 20, Some(&data[at..at + (1 << 20)]))
            .unwrap();
        assert_eq!(gap, Some((0, 1024)));
        // While it is being filled, no one else claims it.
        h.start(3 << 20, 1 << 20);
        assert_eq!(
            h.end(3 << 20, 1 << 20, Some(&data[3 << 20..])).unwrap(),
            None
        );
        h.fill(0, &data[..1024]).unwrap();
        h.fill_done();
        // Now the prefix is at 1024 + 1 MiB.
        let gap = h
            .end(2 << 20, 1 << 20, Some(&data[2 << 20..3 << 20]))
            .unwrap();
        // The read at 2 MiB ended ahead of the prefix (1024 + 1 MiB): the 1 MiB - 1024
        // gap before it is small and unread.
        let (s, e) = gap.unwrap();
        assert_eq!((s, e), ((1 << 20) + 1024, 2 << 20));
        h.fill(s, &data[s as usize..e as usize]).unwrap();
        h.fill_done();
        let (ordered, filled) = h.take().unwrap();
        assert_eq!(filled, 1024 + (1 << 20) - 1024);
        assert_eq!(ordered.next_gap(), None);
        ordered.check().unwrap();
        assert!(h.take().is_none());
    }
}
