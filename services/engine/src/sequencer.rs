//! The in-order commit point: requests wait for their turn, write, and pass it on.
//!
//! Reads run ahead in every worker; a request whose read completed waits until the
//! commit offset reaches its start, commits, then advances the offset past itself (and
//! past ranges a resumed copy skips). Zero runs accumulate here across requests and
//! units and are written as one run right before the next data write.

use ferry_core::{Error, Result};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::ranges::RangeSet;

/// A pending zero run is written once it grows this large, so checkpoints of a long
/// hole still advance.
const MAX_PENDING_ZERO: u64 = 1 << 30;

#[derive(Debug)]
pub(crate) struct Sequencer {
    next: watch::Sender<u64>,
    pending_zero: Mutex<Option<(u64, u64)>>,
    skip: RangeSet,
    size: u64,
}

impl Sequencer {
    /// Starts at the first byte not in `skip` (the resumed ranges).
    pub fn new(size: u64, skip: RangeSet) -> Self {
        let start = skip_from(&skip, 0);
        Self {
            next: watch::Sender::new(start),
            pending_zero: Mutex::new(None),
            skip,
            size,
        }
    }

    /// Waits until the commit offset reaches `offset`.
    pub async fn wait_turn(&self, offset: u64) -> Result<()> {
        let mut rx = self.next.subscribe();
        let at = *rx
            .wait_for(|&next| next >= offset)
            .await
            .map_err(|_| Error::internal("commit sequencer closed"))?;
        if at != offset {
            return Err(Error::internal(format!(
                "commit sequencer passed offset {offset} (now at {at})"
            )));
        }
        Ok(())
    }

    /// Adds zero bytes `[start, end)` to the pending run. Returns a run to write first
    /// when the pending one cannot be extended (not contiguous) or is large enough.
    pub fn add_zero(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        let mut pending = self.pending_zero.lock();
        match *pending {
            Some((s, e)) if e == start && e - s < MAX_PENDING_ZERO => {
                *pending = Some((s, end));
                None
            }
            other => {
                *pending = Some((start, end));
                other
            }
        }
    }

    /// Takes the pending zero run (to write it before data, or at the end).
    pub fn take_zero(&self) -> Option<(u64, u64)> {
        self.pending_zero.lock().take()
    }

    /// Moves the commit offset to `end` (past resumed ranges) and says whether the
    /// image is now complete.
    pub fn advance(&self, end: u64) -> bool {
        let next = skip_from(&self.skip, end);
        self.next.send_replace(next);
        next >= self.size
    }
}

fn skip_from(skip: &RangeSet, offset: u64) -> u64 {
    skip.containing(offset).map_or(offset, |(_, e)| e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn turns_are_taken_in_order_and_skip_resumed_ranges() {
        let seq = Arc::new(Sequencer::new(
            100,
            RangeSet::from_ranges([(0, 10), (40, 60)]),
        ));
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (start, end) in [(60u64, 100u64), (20, 40), (10, 20)] {
            let (seq, order) = (seq.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                seq.wait_turn(start).await.unwrap();
                order.lock().push(start);
                seq.advance(end)
            }));
        }
        let mut complete = Vec::new();
        for t in tasks {
            complete.push(t.await.unwrap());
        }
        assert_eq!(*order.lock(), vec![10, 20, 60]);
        assert_eq!(complete, vec![true, false, false]);
    }

    #[test]
    fn zero_runs_accumulate_until_broken() {
        let seq = Sequencer::new(100, RangeSet::new());
        assert_eq!(seq.add_zero(0, 10), None);
        assert_eq!(seq.add_zero(10, 20), None);
        assert_eq!(seq.add_zero(30, 40), Some((0, 20)));
        assert_eq!(seq.take_zero(), Some((30, 40)));
        assert_eq!(seq.take_zero(), None);
    }
}
