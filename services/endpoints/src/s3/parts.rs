//! How an image maps onto multipart-upload parts, which bytes of a part have arrived, and
//! the bounded pool of part buffers. Pure bookkeeping: no network here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ferry_core::{Error, Result};
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

const MIB: u64 = 1024 * 1024;
/// S3's smallest part (every part but the last).
pub const MIN_PART_SIZE: u64 = 5 * MIB;
/// S3's largest part.
pub const MAX_PART_SIZE: u64 = 5 * 1024 * MIB;
/// S3's limit on parts in one upload.
pub const MAX_PARTS: u64 = 10_000;
/// S3's largest object.
pub const MAX_OBJECT_SIZE: u64 = 5 * 1024 * 1024 * MIB;

/// The part size used unless the job asks for another (measured: see docs/BENCHMARKS.md).
pub fn default_part_size() -> u64 {
    16 * MIB
}

/// The part size for an image of `size` bytes: the requested (or default) size, raised to
/// a whole number of MiB large enough that the image fits in [`MAX_PARTS`] parts.
pub fn part_size_for(size: u64, requested: Option<u64>) -> Result<u64> {
    if size > MAX_OBJECT_SIZE {
        return Err(Error::invalid_input(format!(
            "an S3 object holds at most 5 TiB; the image has {size} bytes"
        )));
    }
    let base = requested.unwrap_or_else(default_part_size);
    if !(MIN_PART_SIZE..=MAX_PART_SIZE).contains(&base) {
        return Err(Error::invalid_input(format!(
            "S3 part size {base} is outside S3's limits of 5 MiB to 5 GiB"
        )));
    }
    let needed = size.div_ceil(MAX_PARTS).div_ceil(MIB) * MIB;
    Ok(base.max(needed))
}

/// The parts of an image: all `part_size` long but the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub size: u64,
    pub part_size: u64,
}

/// A piece of a request that falls in one part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub part: usize,
    /// Offset inside the part.
    pub start: u64,
    pub len: u64,
    /// Offset of the piece inside the request.
    pub request_offset: u64,
}

impl Layout {
    pub fn count(&self) -> usize {
        self.size.div_ceil(self.part_size) as usize
    }

    pub fn part_start(&self, part: usize) -> u64 {
        part as u64 * self.part_size
    }

    pub fn part_len(&self, part: usize) -> u64 {
        (self.size - self.part_start(part)).min(self.part_size)
    }

    /// Splits `offset..offset + len` at part boundaries; the caller checked the range.
    pub fn segments(&self, offset: u64, len: u64) -> impl Iterator<Item = Segment> + '_ {
        let end = offset + len;
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let part = (at / self.part_size) as usize;
            let start = at - self.part_start(part);
            let n = (self.part_len(part) - start).min(end - at);
            let seg = Segment {
                part,
                start,
                len: n,
                request_offset: at - offset,
            };
            at += n;
            Some(seg)
        })
    }
}

/// Sorted, merged `[start, end)` ranges: which bytes of a part have arrived.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RangeSet(Vec<(u64, u64)>);

impl RangeSet {
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let i = self.0.partition_point(|&(_, e)| e < start);
        let mut j = i;
        let (mut s, mut e) = (start, end);
        while j < self.0.len() && self.0[j].0 <= e {
            s = s.min(self.0[j].0);
            e = e.max(self.0[j].1);
            j += 1;
        }
        self.0.splice(i..j, [(s, e)]);
    }

    pub fn total(&self) -> u64 {
        self.0.iter().map(|(s, e)| e - s).sum()
    }

    /// The first byte not covered, counting from 0.
    pub fn first_gap(&self) -> u64 {
        match self.0.first() {
            Some(&(0, e)) => e,
            _ => 0,
        }
    }
}

/// Part buffers, at most as many as there are permits. A buffer returns to the pool (and
/// its permit to the semaphore) when the upload that owned it drops its body.
#[derive(Debug)]
pub(crate) struct BufferPool {
    capacity: usize,
    permits: Arc<Semaphore>,
    free: Mutex<Vec<Vec<u8>>>,
    /// Permits granted beyond the budget to break a stall; taken back as buffers return.
    overdraft: AtomicUsize,
}

impl BufferPool {
    pub fn new(capacity: usize, permits: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            permits: Arc::new(Semaphore::new(permits)),
            free: Mutex::new(Vec::new()),
            overdraft: AtomicUsize::new(0),
        })
    }

    /// Raises the budget (one more writer).
    pub fn add_permits(&self, n: usize) {
        self.permits.add_permits(n);
    }

    /// Grants one buffer beyond the budget, taken back when a buffer returns.
    pub fn overdraw(&self) {
        self.overdraft.fetch_add(1, Ordering::AcqRel);
        self.permits.add_permits(1);
    }

    /// Permits currently available (for tests and stall detection).
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    /// A buffer if the budget allows one right now.
    pub fn try_take(self: &Arc<Self>) -> Option<PartBuffer> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        Some(self.wrap(permit))
    }

    /// Waits for the budget to allow a buffer.
    pub async fn take(self: &Arc<Self>) -> PartBuffer {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the pool semaphore is never closed");
        self.wrap(permit)
    }

    fn wrap(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> PartBuffer {
        let data = self
            .free
            .lock()
            .pop()
            .unwrap_or_else(|| vec![0u8; self.capacity]);
        PartBuffer {
            data,
            len: self.capacity,
            home: Arc::clone(self),
            permit: Some(permit),
        }
    }
}

/// One part's bytes. Contents are stale when taken from the pool: the assembler writes
/// every byte (data or zeroes) before the part is uploaded.
#[derive(Debug)]
pub(crate) struct PartBuffer {
    data: Vec<u8>,
    len: usize,
    home: Arc<BufferPool>,
    permit: Option<OwnedSemaphorePermit>,
}

impl PartBuffer {
    /// Limits the buffer to the part's length (the last part is short).
    pub fn truncate(&mut self, len: usize) {
        self.len = len.min(self.data.len());
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.data[..self.len]
    }
}

impl AsRef<[u8]> for PartBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

impl Drop for PartBuffer {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        self.home.free.lock().push(data);
        if let Some(permit) = self.permit.take() {
            let taken_back = self
                .home
                .overdraft
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok();
            if taken_back {
                permit.forget();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_sizes() {
        assert_eq!(part_size_for(0, None).unwrap(), default_part_size());
        assert_eq!(part_size_for(1 << 40, None).unwrap(), 105 * MIB);
        let five_tib = MAX_OBJECT_SIZE;
        let p = part_size_for(five_tib, None).unwrap();
        assert!(five_tib.div_ceil(p) <= MAX_PARTS);
        assert!(part_size_for(five_tib + 1, None).is_err());
        assert!(part_size_for(10, Some(MIB)).is_err());
        assert_eq!(part_size_for(10, Some(5 * MIB)).unwrap(), 5 * MIB);
    }

    #[test]
    fn layout_splits_at_boundaries() {
        let l = Layout {
            size: 25,
            part_size: 10,
        };
        assert_eq!(l.count(), 3);
        assert_eq!(l.part_len(2), 5);
        let segs: Vec<_> = l.segments(8, 15).collect();
        assert_eq!(
            segs,
            vec![
                Segment {
                    part: 0,
                    start: 8,
                    len: 2,
                    request_offset: 0
                },
                Segment {
                    part: 1,
                    start: 0,
                    len: 10,
                    request_offset: 2
                },
                Segment {
                    part: 2,
                    start: 0,
                    len: 3,
                    request_offset: 12
                },
            ]
        );
        assert_eq!(l.segments(0, 0).count(), 0);
    }

    #[test]
    fn range_set_merges() {
        let mut r = RangeSet::default();
        r.insert(10, 20);
        r.insert(30, 40);
        r.insert(0, 5);
        assert_eq!(r.total(), 25);
        assert_eq!(r.first_gap(), 5);
        r.insert(5, 30);
        assert_eq!(r, RangeSet(vec![(0, 40)]));
        r.insert(35, 38);
        r.insert(40, 40);
        assert_eq!(r.total(), 40);
        r.insert(39, 50);
        assert_eq!(r, RangeSet(vec![(0, 50)]));
    }

    #[tokio::test]
    async fn pool_bounds_and_reuses() {
        let pool = BufferPool::new(64, 2);
        let a = pool.try_take().unwrap();
        let b = pool.take().await;
        assert!(pool.try_take().is_none());
        let ptr = a.as_ref().as_ptr();
        drop(a);
        let c = pool.try_take().unwrap();
        assert_eq!(c.as_ref().as_ptr(), ptr, "buffer reused");
        pool.overdraw();
        let d = pool.try_take().unwrap();
        drop((b, c, d));
        assert_eq!(pool.available(), 2, "the overdraft is taken back");
    }
}
