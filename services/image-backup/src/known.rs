//! Ranges known before a backup starts, from the storage rather than the source: the
//! changed ranges of a snapshot since its base ([`KnownChanges`], an incremental reads only
//! those chunks) and its allocated ranges ([`AllocatedOnly`], a full backup reads only
//! those and takes everything else as zeroes). The CSI SnapshotMetadata service is where
//! they come from; the caller validates them (sorted, disjoint, within the image) before
//! they get here, and they are checked again on the way in.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Caps, Error, Extent, IoBuf, Result, Source};

use crate::changed::ChangedRanges;

/// Checks that `ranges` are sorted, disjoint, non-empty and within `size` bytes.
fn check(ranges: &[(u64, u64)], size: u64) -> Result<()> {
    let mut end = 0;
    for &(s, e) in ranges {
        if s < end || e <= s || e > size {
            return Err(Error::invalid_input(format!(
                "the range {s}..{e} is out of order, empty or past the image's {size} bytes"
            )));
        }
        end = e;
    }
    Ok(())
}

/// The ranges of `ranges` within `offset..offset + len`, cut to it.
fn within(ranges: &[(u64, u64)], offset: u64, len: u64) -> Vec<(u64, u64)> {
    let end = offset + len;
    let first = ranges.partition_point(|&(_, e)| e <= offset);
    ranges[first..]
        .iter()
        .take_while(|&&(s, _)| s < end)
        .map(|&(s, e)| (s.max(offset), e.min(end)))
        .collect()
}

/// Changed ranges given as a list.
#[derive(Debug, Clone)]
pub struct KnownChanges {
    ranges: Arc<Vec<(u64, u64)>>,
    what: String,
}

impl KnownChanges {
    /// `ranges` of an image of `size` bytes (sorted, disjoint, `[start, end)`); `what`
    /// names where they come from, for messages.
    pub fn new(ranges: Vec<(u64, u64)>, size: u64, what: impl Into<String>) -> Result<Self> {
        check(&ranges, size)?;
        Ok(Self {
            ranges: Arc::new(ranges),
            what: what.into(),
        })
    }
}

#[async_trait]
impl ChangedRanges for KnownChanges {
    async fn changed(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        Ok(within(&self.ranges, offset, len))
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}

/// A source whose extents outside the allocated ranges are zeroes: a backup never reads
/// them. Inside, the source's own extents stand.
#[derive(Clone)]
pub struct AllocatedOnly {
    inner: Arc<dyn Source>,
    ranges: Arc<Vec<(u64, u64)>>,
}

impl AllocatedOnly {
    /// `inner` with data only in `ranges` (sorted, disjoint, within its size).
    pub fn new(inner: Arc<dyn Source>, ranges: Vec<(u64, u64)>) -> Result<Self> {
        check(&ranges, inner.size())?;
        Ok(Self {
            inner,
            ranges: Arc::new(ranges),
        })
    }
}

impl std::fmt::Debug for AllocatedOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocatedOnly")
            .field("source", &self.inner.describe())
            .field("ranges", &self.ranges.len())
            .finish()
    }
}

#[async_trait]
impl Source for AllocatedOnly {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn caps(&self) -> Caps {
        let mut caps = self.inner.caps();
        caps.extents = true;
        caps
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let len = len.min(self.size().saturating_sub(offset));
        if len == 0 {
            return Ok(Vec::new());
        }
        let inside = within(&self.ranges, offset, len);
        match inside.first() {
            None => Ok(vec![Extent::zero(offset, len)]),
            Some(&(s, _)) if s > offset => Ok(vec![Extent::zero(offset, s - offset)]),
            Some(&(_, e)) => {
                // Inside an allocated range: the source's extents, cut at its end.
                let mut out = self.inner.extents(offset, e - offset).await?;
                out.retain(|x| x.offset < e);
                if let Some(last) = out.last_mut() {
                    last.len = last.len.min(e - last.offset);
                }
                Ok(out)
            }
        }
    }

    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        self.inner.read_at(offset, buf).await
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Self {
            inner: self.inner.connect().await?,
            ranges: self.ranges.clone(),
        }))
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_testkit::MemSource;

    #[tokio::test]
    async fn only_the_allocated_ranges_are_data() {
        let source = Arc::new(MemSource::new(vec![7u8; 1000]));
        let only = AllocatedOnly::new(source, vec![(100, 200), (500, 600)]).unwrap();
        let mut extents = Vec::new();
        let mut at = 0;
        while at < 1000 {
            let got = only.extents(at, 1000 - at).await.unwrap();
            at = got.last().unwrap().end();
            extents.extend(got);
        }
        let merged = ferry_core::merge_extents(extents);
        let want = vec![
            Extent::zero(0, 100),
            Extent::data(100, 100),
            Extent::zero(200, 300),
            Extent::data(500, 100),
            Extent::zero(600, 400),
        ];
        assert_eq!(merged, want);
        assert!(AllocatedOnly::new(Arc::new(MemSource::new(vec![0; 10])), vec![(5, 20)]).is_err());
    }

    #[tokio::test]
    async fn known_changes_answer_within_the_window() {
        let known = KnownChanges::new(vec![(10, 20), (30, 40)], 100, "delta").unwrap();
        assert_eq!(
            known.changed(15, 20).await.unwrap(),
            vec![(15, 20), (30, 35)]
        );
        assert!(known.changed(40, 60).await.unwrap().is_empty());
        assert!(KnownChanges::new(vec![(10, 20), (15, 40)], 100, "x").is_err());
        assert!(KnownChanges::new(vec![(10, 10)], 100, "x").is_err());
    }
}
