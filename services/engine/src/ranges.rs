//! A set of byte ranges kept sorted and merged.
//!
//! Checkpoints, resume and zero-run merging all ask the same questions of byte ranges
//! ("is this byte covered?", "what of this range is not?"), so they share one type.

use std::collections::BTreeMap;

/// Disjoint, non-adjacent `[start, end)` ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_ranges(ranges: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut set = Self::new();
        for (s, e) in ranges {
            set.insert(s, e);
        }
        set
    }

    /// Adds `[start, end)`, merging with overlapping or adjacent ranges.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut start, mut end) = (start, end);
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.map.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.map.range(start..=end).next() {
            end = end.max(e);
            self.map.remove(&s);
        }
        self.map.insert(start, end);
    }

    /// The range containing `offset`, if any.
    pub fn containing(&self, offset: u64) -> Option<(u64, u64)> {
        self.map
            .range(..=offset)
            .next_back()
            .filter(|(_, &e)| e > offset)
            .map(|(&s, &e)| (s, e))
    }

    pub fn contains(&self, offset: u64) -> bool {
        self.containing(offset).is_some()
    }

    /// The parts of `[start, end)` not in the set, in order.
    pub fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut pos = start;
        if let Some((_, e)) = self.containing(start) {
            pos = e.min(end);
        }
        for (&s, &e) in self.map.range(pos..end) {
            if s > pos {
                out.push((pos, s));
            }
            pos = e.min(end);
        }
        if pos < end {
            out.push((pos, end));
        }
        out
    }

    /// Total bytes covered.
    pub fn len(&self) -> u64 {
        self.map.iter().map(|(s, e)| e - s).sum()
    }

    pub fn to_vec(&self) -> Vec<(u64, u64)> {
        self.map.iter().map(|(&s, &e)| (s, e)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_overlapping_and_adjacent() {
        let mut s = RangeSet::new();
        s.insert(10, 20);
        s.insert(30, 40);
        s.insert(20, 25);
        assert_eq!(s.to_vec(), vec![(10, 25), (30, 40)]);
        s.insert(5, 35);
        assert_eq!(s.to_vec(), vec![(5, 40)]);
        s.insert(50, 50);
        assert_eq!(s.len(), 35);
    }

    #[test]
    fn gaps_and_containment() {
        let s = RangeSet::from_ranges([(10, 20), (30, 40)]);
        assert_eq!(s.gaps(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(s.gaps(15, 35), vec![(20, 30)]);
        assert_eq!(s.gaps(12, 18), vec![]);
        assert!(s.contains(10) && s.contains(19) && !s.contains(20) && !s.contains(9));
        assert_eq!(s.containing(35), Some((30, 40)));
    }
}
