//! Merging zero runs across requests whose reads complete out of order.
//!
//! A request knows its own zero runs once its read completes, but a zero run touching
//! its edge may continue into the neighbouring request. Edge runs wait here until both
//! sides are known (a data byte or the span's end), then leave as one merged run, so a
//! zero range is written with one `write_zeroes` however many requests it crossed.

use std::collections::BTreeMap;

use crate::ranges::RangeSet;

#[derive(Debug)]
pub(crate) struct ZeroMerger {
    start: u64,
    end: u64,
    /// Bytes whose kind is known.
    resolved: RangeSet,
    /// Zero runs waiting for a neighbour: start -> end.
    open: BTreeMap<u64, u64>,
}

impl ZeroMerger {
    pub fn new(start: u64, end: u64) -> Self {
        Self {
            start,
            end,
            resolved: RangeSet::new(),
            open: BTreeMap::new(),
        }
    }

    /// Records that `[seg_start, seg_end)` is known, with a zero run at its head ending
    /// at `head_end` and one at its tail starting at `tail_start` (for an all-zero
    /// segment both describe the whole segment). Returns the runs now complete.
    pub fn resolve(
        &mut self,
        seg_start: u64,
        seg_end: u64,
        head_end: Option<u64>,
        tail_start: Option<u64>,
    ) -> [Option<(u64, u64)>; 2] {
        self.resolved.insert(seg_start, seg_end);
        if let Some(h) = head_end {
            self.add_open(seg_start, h);
        }
        if let Some(t) = tail_start {
            self.add_open(t, seg_end);
        }
        let left = self.take_if_closed(seg_start);
        let right = self.take_if_closed(seg_end);
        [left, right]
    }

    /// Whether every zero run has left (all segments resolved).
    #[cfg(test)]
    pub fn is_drained(&self) -> bool {
        self.open.is_empty()
    }

    fn add_open(&mut self, mut start: u64, mut end: u64) {
        if let Some((&s, &e)) = self.open.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.open.remove(&s);
            }
        }
        if let Some(e) = self.open.remove(&end) {
            end = e;
        }
        self.open.insert(start, end);
    }

    /// Removes and returns the open run touching `offset` if both its sides are known.
    fn take_if_closed(&mut self, offset: u64) -> Option<(u64, u64)> {
        let (&s, &e) = self.open.range(..=offset).next_back()?;
        if e < offset {
            return None;
        }
        let left = s == self.start || self.resolved.contains(s - 1);
        let right = e == self.end || self.resolved.contains(e);
        if left && right {
            self.open.remove(&s);
            Some((s, e))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(r: [Option<(u64, u64)>; 2]) -> Vec<(u64, u64)> {
        let mut v: Vec<_> = r.into_iter().flatten().collect();
        v.dedup();
        v
    }

    #[test]
    fn zero_runs_across_out_of_order_segments_merge() {
        // segments: [0,10) data with zero tail [6,10); [10,20) all zero; [20,30) zero head [20,25)
        let mut m = ZeroMerger::new(0, 30);
        assert_eq!(runs(m.resolve(10, 20, Some(20), Some(10))), vec![]);
        assert_eq!(runs(m.resolve(20, 30, Some(25), None)), vec![]);
        assert_eq!(runs(m.resolve(0, 10, None, Some(6))), vec![(6, 25)]);
        assert!(m.is_drained());
    }

    #[test]
    fn span_edges_close_runs() {
        let mut m = ZeroMerger::new(100, 200);
        assert_eq!(runs(m.resolve(100, 150, Some(150), Some(100))), vec![]);
        assert_eq!(
            runs(m.resolve(150, 200, Some(200), Some(150))),
            vec![(100, 200)]
        );
    }

    #[test]
    fn data_neighbour_closes_a_waiting_run() {
        let mut m = ZeroMerger::new(0, 30);
        assert_eq!(runs(m.resolve(0, 10, None, Some(5))), vec![]);
        // the next segment starts with data: the run [5,10) is complete
        assert_eq!(runs(m.resolve(10, 20, None, None)), vec![(5, 10)]);
        assert_eq!(runs(m.resolve(20, 30, Some(22), None)), vec![(20, 22)]);
        assert!(m.is_drained());
    }
}
