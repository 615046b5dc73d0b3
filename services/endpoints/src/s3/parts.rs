//! How an image maps onto multipart-upload parts, which bytes of a part have arrived, and
//! the bounded pool of part buffers. Pure bookkeeping: no network here.

use std::sync::Arc;

use ferry_core::{Error, Result};
use parking_lot::Mutex;
use tokio::sync::Notify;

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

/// Part buffers within a budget of `budget` at once (one per writer handle plus one),
/// the last of which only the lowest part still being assembled may take.
///
/// That reservation is what keeps the upload from deadlocking: every write that waits
/// here waits for a part above the lowest one, whose missing bytes are never held back by
/// such a write (the engine writes each request's pieces in offset order, see the target
/// module's docs), so the lowest part always either has a buffer or can take the reserved
/// one, completes, and returns its buffer when its upload ends.
#[derive(Debug)]
pub(crate) struct BufferPool {
    capacity: usize,
    state: Mutex<PoolState>,
    /// Signalled when a buffer returns, the budget grows or the lowest part moves on.
    changed: Notify,
}

#[derive(Debug)]
struct PoolState {
    budget: usize,
    taken: usize,
    /// Buffers returned, reused before allocating.
    free: Vec<Vec<u8>>,
}

impl BufferPool {
    pub fn new(capacity: usize, budget: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            state: Mutex::new(PoolState {
                budget,
                taken: 0,
                free: Vec::new(),
            }),
            changed: Notify::new(),
        })
    }

    /// Raises the budget (one more writer).
    pub fn add_budget(&self, n: usize) {
        self.state.lock().budget += n;
        self.changed.notify_waiters();
    }

    /// Buffers that may still be taken (for tests).
    #[cfg(test)]
    pub fn available(&self) -> usize {
        let state = self.state.lock();
        state.budget - state.taken
    }

    /// Wakes the waiters to check again (the lowest part moved on, or the upload failed).
    pub fn wake(&self) {
        self.changed.notify_waiters();
    }

    /// A buffer if the budget allows one right now: the last one only when `lowest`.
    pub fn try_take(self: &Arc<Self>, lowest: bool) -> Option<PartBuffer> {
        let reused = {
            let mut state = self.state.lock();
            let left = state.budget - state.taken;
            if left == 0 || (left == 1 && !lowest) {
                return None;
            }
            state.taken += 1;
            state.free.pop()
        };
        let data = reused.unwrap_or_else(|| vec![0u8; self.capacity]);
        Some(PartBuffer {
            data,
            len: self.capacity,
            home: Arc::clone(self),
        })
    }

    /// Waits until [`BufferPool::try_take`] succeeds. `lowest` says whether the part is the
    /// lowest one still being assembled, or fails to stop the wait (an aborted upload).
    pub async fn take(self: &Arc<Self>, lowest: impl Fn() -> Result<bool>) -> Result<PartBuffer> {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if let Some(buf) = self.try_take(lowest()?) {
                return Ok(buf);
            }
            changed.await;
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
        {
            let mut state = self.home.state.lock();
            state.free.push(data);
            state.taken -= 1;
        }
        self.home.changed.notify_waiters();
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
        let pool = BufferPool::new(64, 3);
        let a = pool.try_take(false).unwrap();
        let b = pool.take(|| Ok(false)).await.unwrap();
        assert!(
            pool.try_take(false).is_none(),
            "the last buffer is reserved"
        );
        let ptr = a.as_ref().as_ptr();
        drop(a);
        let c = pool.try_take(false).unwrap();
        assert_eq!(c.as_ref().as_ptr(), ptr, "buffer reused");
        let d = pool.try_take(true).unwrap();
        assert!(pool.try_take(true).is_none(), "never beyond the budget");
        pool.add_budget(1);
        let e = pool.try_take(true).unwrap();
        drop((b, c, d, e));
        assert_eq!(pool.available(), 4);
    }

    #[tokio::test]
    async fn the_reserved_buffer_goes_to_the_lowest_part() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let pool = BufferPool::new(64, 2);
        let held = pool.try_take(false).unwrap();
        let lowest = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (pool, lowest) = (Arc::clone(&pool), Arc::clone(&lowest));
            tokio::spawn(async move { pool.take(|| Ok(lowest.load(Ordering::SeqCst))).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "a higher part waits for the reserve");
        lowest.store(true, Ordering::SeqCst);
        pool.wake();
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the lowest part gets the reserved buffer")
            .unwrap()
            .unwrap();
        assert_eq!(pool.available(), 0);
        drop((held, got));
        let failed = pool
            .take(|| Err(Error::invalid_input("aborted")))
            .await
            .map(|_| ());
        assert!(failed.is_err(), "a failed check ends the wait");
    }
}
