//! [`MemSource`]: an image in memory that reports extents like a sparse file and records
//! every read, so a test can check what the engine asked for, in which buffers and how
//! many bytes at once, and can slow reads down or make them hang.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferry_core::{merge_extents, Caps, Extent, IoBuf, Result, Source, UNKNOWN_SIZE};
use parking_lot::Mutex;

use crate::check_range;
use crate::gauge::Gauge;

/// What a [`MemSource`] and every handle connected from it were asked.
#[derive(Debug, Default)]
pub struct SourceStats {
    reads: Mutex<Vec<(u64, usize)>>,
    /// Calls of [`Source::extents`].
    pub extent_calls: AtomicUsize,
    /// Bytes of reads in progress, and their maximum.
    pub in_flight: Gauge,
    buffers: Mutex<HashSet<(usize, usize)>>,
}

impl SourceStats {
    /// Every read as `(offset, length)`, in the order received.
    pub fn reads(&self) -> Vec<(u64, usize)> {
        self.reads.lock().clone()
    }

    /// The distinct buffers (by address) read into, with their capacity.
    pub fn buffers(&self) -> HashSet<(usize, usize)> {
        self.buffers.lock().clone()
    }

    /// Calls of [`Source::extents`] so far.
    pub fn extent_calls(&self) -> usize {
        self.extent_calls.load(Ordering::SeqCst)
    }
}

/// A source over bytes in memory. Clones and [`Source::connect`] handles share the bytes
/// and the [`SourceStats`].
///
/// Without extents it reports everything as data, as a source that cannot see holes
/// does; [`MemSource::with_holes`], [`MemSource::sparse`] and [`MemSource::with_extents`]
/// give it a layout and set `caps.extents`.
#[derive(Debug, Clone)]
pub struct MemSource {
    data: Arc<Vec<u8>>,
    extents: Option<Arc<Vec<Extent>>>,
    caps: Caps,
    extent_limit: usize,
    read_delay: Duration,
    /// Reads at or after this offset never complete.
    hang_from: Option<u64>,
    /// Says its size is not known: a stream read with `read_some` until it ends.
    unknown_size: bool,
    /// Shared with every clone and handle.
    pub stats: Arc<SourceStats>,
}

impl MemSource {
    /// All data, no extent information, default caps.
    pub fn new(data: Vec<u8>) -> Self {
        Self {
            data: Arc::new(data),
            extents: None,
            caps: Caps::default(),
            extent_limit: usize::MAX,
            read_delay: Duration::ZERO,
            hang_from: None,
            unknown_size: false,
            stats: Arc::default(),
        }
    }

    /// A sequential source that does not know its size before it is read (as a gzip
    /// stream): `size()` is [`UNKNOWN_SIZE`] and `read_some` comes back short at the end.
    pub fn with_unknown_size(mut self) -> Self {
        self.unknown_size = true;
        self.caps.sequential_read = true;
        self
    }

    /// Reports every all-zero `block`-sized block as a zero extent, as a sparse file
    /// would (the last block may be short).
    pub fn sparse(data: Vec<u8>, block: usize) -> Self {
        let block = block.max(1);
        let extents = data.chunks(block).enumerate().map(|(i, chunk)| {
            let offset = (i * block) as u64;
            if chunk.iter().all(|&b| b == 0) {
                Extent::zero(offset, chunk.len() as u64)
            } else {
                Extent::data(offset, chunk.len() as u64)
            }
        });
        let extents = merge_extents(extents);
        Self::new(data).with_extents(extents)
    }

    /// Answers [`Source::extents`] from `extents` (meant to cover the image, in order; a
    /// test may give a broken layout on purpose) and sets `caps.extents`.
    pub fn with_extents(mut self, extents: Vec<Extent>) -> Self {
        self.caps.extents = true;
        self.extents = Some(Arc::new(extents));
        self
    }

    /// Makes the `[start, end)` ranges holes: their bytes become zeroes and they are
    /// reported as zero extents, the rest as data.
    ///
    /// # Panics
    /// If a hole overlaps another or reaches past the end: a broken test.
    pub fn with_holes(mut self, holes: &[(u64, u64)]) -> Self {
        let size = self.len();
        let data = Arc::make_mut(&mut self.data);
        let mut sorted = holes.to_vec();
        sorted.sort_unstable();
        let mut extents = Vec::new();
        let mut pos = 0;
        for (start, end) in sorted {
            assert!(
                pos <= start && start <= end && end <= size,
                "hole {start}..{end} overlaps another or lies outside the {size}-byte image"
            );
            data[start as usize..end as usize].fill(0);
            extents.push(Extent::data(pos, start - pos));
            extents.push(Extent::zero(start, end - start));
            pos = end;
        }
        extents.push(Extent::data(pos, size - pos));
        self.with_extents(merge_extents(extents))
    }

    /// Sets the capabilities (block sizes, ...) the source reports.
    pub fn with_caps(mut self, caps: Caps) -> Self {
        self.caps = caps;
        self
    }

    /// Answers at most `n` extents per call, as servers with a reply limit do.
    pub fn with_extent_limit(mut self, n: usize) -> Self {
        self.extent_limit = n;
        self
    }

    /// Every read sleeps `delay` (tokio time) before completing.
    pub fn with_read_delay(mut self, delay: Duration) -> Self {
        self.read_delay = delay;
        self
    }

    /// Reads at or after `offset` never complete (for cancellation tests).
    pub fn hang_from(mut self, offset: u64) -> Self {
        self.hang_from = Some(offset);
        self
    }

    /// The image's size.
    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    /// Whether the image is empty.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The caps, without the [`Source`] trait in scope.
    pub fn caps_value(&self) -> Caps {
        self.caps
    }

    /// The image's bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }
}

/// `extent` cut to `[offset, end)`.
fn clip(extent: &Extent, offset: u64, end: u64) -> Extent {
    let start = extent.offset.max(offset);
    Extent {
        offset: start,
        len: extent.end().min(end) - start,
        kind: extent.kind,
    }
}

#[async_trait]
impl Source for MemSource {
    fn describe(&self) -> String {
        "mem-source".into()
    }

    fn size(&self) -> u64 {
        if self.unknown_size {
            UNKNOWN_SIZE
        } else {
            self.len()
        }
    }

    fn size_known(&self) -> bool {
        !self.unknown_size
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    async fn read_some(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let n = self.len().saturating_sub(offset).min(buf.len() as u64) as usize;
        let start = buf.view().start;
        buf.set_view(start, n);
        if n == 0 {
            return Ok(buf);
        }
        self.read_at(offset, buf).await
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.stats.extent_calls.fetch_add(1, Ordering::SeqCst);
        check_range("extents", offset, len, self.len())?;
        let end = offset + len;
        let Some(all) = &self.extents else {
            return Ok(merge_extents([Extent::data(offset, len)]));
        };
        Ok(all
            .iter()
            .filter(|e| e.end() > offset && e.offset < end)
            .take(self.extent_limit)
            .map(|e| clip(e, offset, end))
            .collect())
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let len = buf.len();
        check_range("read", offset, len as u64, self.len())?;
        self.stats
            .buffers
            .lock()
            .insert((buf.full().as_ptr() as usize, buf.capacity()));
        self.stats.reads.lock().push((offset, len));
        self.stats.in_flight.enter(len);
        if self.hang_from.is_some_and(|h| offset >= h) {
            std::future::pending::<()>().await;
        }
        if !self.read_delay.is_zero() {
            tokio::time::sleep(self.read_delay).await;
        }
        buf.copy_from_slice(&self.data[offset as usize..offset as usize + len]);
        self.stats.in_flight.leave(len);
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reports_holes_and_reads_bytes() {
        let src = MemSource::new((1..=100u8).collect()).with_holes(&[(50, 100), (10, 20)]);
        assert!(src.caps_value().extents);
        assert_eq!(
            src.extents(0, 100).await.unwrap(),
            vec![
                Extent::data(0, 10),
                Extent::zero(10, 10),
                Extent::data(20, 30),
                Extent::zero(50, 50)
            ]
        );
        assert_eq!(
            src.extents(15, 10).await.unwrap(),
            vec![Extent::zero(15, 5), Extent::data(20, 5)]
        );
        let mut buf = IoBuf::new(8);
        buf.set_len(8);
        let buf = src.read_at(6, buf).await.unwrap();
        assert_eq!(&buf[..], &[7, 8, 9, 10, 0, 0, 0, 0]);
        assert!(src.read_at(95, IoBuf::new(8)).await.is_err());
        assert!(src.extents(95, 8).await.is_err());
        assert_eq!(src.stats.reads(), vec![(6, 8)]);
        assert_eq!(src.stats.extent_calls(), 3);
    }

    #[test]
    #[should_panic(expected = "lies outside")]
    fn a_hole_past_the_end_is_a_broken_test() {
        let _ = MemSource::new(vec![0; 10]).with_holes(&[(5, 11)]);
    }

    #[tokio::test]
    async fn without_extents_everything_is_data() {
        let src = MemSource::new(vec![0; 10]);
        assert!(!src.caps_value().extents);
        assert_eq!(src.extents(2, 8).await.unwrap(), vec![Extent::data(2, 8)]);
        assert!(src.extents(0, 0).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn sparse_source_finds_zero_blocks_and_limits_answers() {
        let mut data = vec![0u8; 10];
        data[4] = 1;
        let src = MemSource::sparse(data, 4);
        assert_eq!(
            src.extents(0, 10).await.unwrap(),
            vec![Extent::zero(0, 4), Extent::data(4, 4), Extent::zero(8, 2)]
        );
        let limited = src.with_extent_limit(2);
        assert_eq!(limited.extents(0, 10).await.unwrap().len(), 2);
    }
}
