//! Extents: what a source says about a byte range before anyone reads it.

/// What a range of an image reads as.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtentKind {
    /// Allocated data: must be read.
    Data,
    /// Reads as zeroes (a hole, or allocated zeroes): needs no read.
    Zero,
}

/// A contiguous range of an image and what it reads as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub kind: ExtentKind,
}

impl Extent {
    pub fn data(offset: u64, len: u64) -> Self {
        Self {
            offset,
            len,
            kind: ExtentKind::Data,
        }
    }

    pub fn zero(offset: u64, len: u64) -> Self {
        Self {
            offset,
            len,
            kind: ExtentKind::Zero,
        }
    }

    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// Merges adjacent extents of the same kind and drops empty ones.
///
/// Sources report extents in whatever granularity their protocol uses; callers want the
/// fewest, largest runs.
pub fn merge_extents(extents: impl IntoIterator<Item = Extent>) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    for e in extents.into_iter().filter(|e| e.len > 0) {
        match out.last_mut() {
            Some(last) if last.kind == e.kind && last.end() == e.offset => last.len += e.len,
            _ => out.push(e),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_adjacent_same_kind_and_drops_empty() {
        let merged = merge_extents([
            Extent::data(0, 10),
            Extent::data(10, 5),
            Extent::zero(15, 0),
            Extent::zero(15, 5),
            Extent::zero(20, 5),
            Extent::data(25, 1),
        ]);
        assert_eq!(
            merged,
            vec![
                Extent::data(0, 15),
                Extent::zero(15, 10),
                Extent::data(25, 1)
            ]
        );
    }

    #[test]
    fn keeps_gaps_apart() {
        let merged = merge_extents([Extent::data(0, 10), Extent::data(20, 5)]);
        assert_eq!(merged.len(), 2);
    }
}
