//! Test doubles: an in-memory source that reports extents and records its reads, and a
//! target that records every write and zero run and can inject faults and delays.
//!
//! They live inside the engine so its tests depend on nothing but ferry-core.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferry_core::{Caps, Error, Extent, IoBuf, Result, Source, Target, ZeroMode};
use parking_lot::Mutex;

use crate::ranges::RangeSet;

/// Tracks the bytes of concurrent requests and their maximum.
#[derive(Debug, Default)]
pub struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Gauge {
    fn enter(&self, n: usize) {
        let now = self.now.fetch_add(n, Ordering::SeqCst) + n;
        self.max.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self, n: usize) {
        self.now.fetch_sub(n, Ordering::SeqCst);
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

#[derive(Debug, Default)]
pub struct SourceStats {
    pub reads: Mutex<Vec<(u64, usize)>>,
    pub extent_calls: AtomicUsize,
    pub in_flight: Gauge,
    /// Distinct buffers (by address) read into, with their capacity.
    pub buffers: Mutex<HashSet<(usize, usize)>>,
}

#[derive(Debug, Clone)]
pub struct MemSource {
    data: Arc<Vec<u8>>,
    extents: Option<Arc<Vec<Extent>>>,
    caps: Caps,
    extent_limit: usize,
    read_delay: Duration,
    /// Reads at or after this offset never complete.
    hang_from: Option<u64>,
    pub stats: Arc<SourceStats>,
}

impl MemSource {
    pub fn new(data: Vec<u8>) -> Self {
        Self {
            data: Arc::new(data),
            extents: None,
            caps: Caps::default(),
            extent_limit: usize::MAX,
            read_delay: Duration::ZERO,
            hang_from: None,
            stats: Arc::default(),
        }
    }

    /// Extents covering the whole image, in order.
    pub fn with_extents(mut self, extents: Vec<Extent>) -> Self {
        self.caps.extents = true;
        self.extents = Some(Arc::new(extents));
        self
    }

    /// Makes `[start, end)` ranges holes: zeroed and reported as zero extents.
    pub fn with_holes(mut self, holes: &[(u64, u64)]) -> Self {
        let size = self.len();
        let data = Arc::make_mut(&mut self.data);
        for &(s, e) in holes {
            data[s as usize..e as usize].fill(0);
        }
        let mut extents = Vec::new();
        let mut pos = 0;
        for &(s, e) in holes {
            if s > pos {
                extents.push(Extent::data(pos, s - pos));
            }
            extents.push(Extent::zero(s, e - s));
            pos = e;
        }
        if pos < size {
            extents.push(Extent::data(pos, size - pos));
        }
        self.with_extents(ferry_core::merge_extents(extents))
    }

    pub fn with_caps(mut self, caps: Caps) -> Self {
        self.caps = caps;
        self
    }

    /// At most `n` extents per answer.
    pub fn with_extent_limit(mut self, n: usize) -> Self {
        self.extent_limit = n;
        self
    }

    pub fn with_read_delay(mut self, delay: Duration) -> Self {
        self.read_delay = delay;
        self
    }

    pub fn hang_from(mut self, offset: u64) -> Self {
        self.hang_from = Some(offset);
        self
    }

    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    pub fn caps_value(&self) -> Caps {
        self.caps
    }

    pub fn data(&self) -> &[u8] {
        &self.data
    }
}

#[async_trait]
impl Source for MemSource {
    fn describe(&self) -> String {
        "mem-source".into()
    }

    fn size(&self) -> u64 {
        self.len()
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.stats.extent_calls.fetch_add(1, Ordering::SeqCst);
        let end = offset + len;
        let Some(all) = &self.extents else {
            return Ok(vec![Extent::data(offset, len)]);
        };
        Ok(all
            .iter()
            .filter(|e| e.end() > offset && e.offset < end)
            .take(self.extent_limit)
            .map(|e| {
                let s = e.offset.max(offset);
                Extent {
                    offset: s,
                    len: e.end().min(end) - s,
                    kind: e.kind,
                }
            })
            .collect())
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let len = buf.len();
        let end = offset as usize + len;
        if end > self.data.len() {
            return Err(Error::invalid_input("read past the end").at("read", offset));
        }
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
        buf.copy_from_slice(&self.data[offset as usize..end]);
        self.stats.in_flight.leave(len);
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(self.clone()))
    }
}

/// One recorded target operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write {
        offset: u64,
        len: u64,
    },
    Zero {
        offset: u64,
        len: u64,
        mode: ZeroMode,
    },
}

impl Op {
    pub fn range(&self) -> (u64, u64) {
        match *self {
            Op::Write { offset, len } | Op::Zero { offset, len, .. } => (offset, offset + len),
        }
    }
}

#[derive(Debug, Default)]
pub struct TargetLog {
    pub data: Mutex<Vec<u8>>,
    /// Operations in the order they were issued.
    pub ops: Mutex<Vec<Op>>,
    completed: Mutex<RangeSet>,
    /// Ranges completed before the start of a flush that completed.
    pub durable: Mutex<RangeSet>,
    pub flushes: AtomicUsize,
    pub finished: AtomicBool,
    pub aborted: AtomicBool,
    pub in_flight: Gauge,
}

#[derive(Debug, Clone)]
pub struct RecordingTarget {
    size: u64,
    caps: Caps,
    is_zero: bool,
    fail_write_at: Option<u64>,
    write_delay: Duration,
    pub log: Arc<TargetLog>,
}

/// What a target holds before a copy when it is not known to be zero.
pub const GARBAGE: u8 = 0xee;

impl RecordingTarget {
    pub fn new(size: u64) -> Self {
        Self {
            size,
            caps: Caps::default(),
            is_zero: false,
            fail_write_at: None,
            write_delay: Duration::ZERO,
            log: Arc::new(TargetLog {
                data: Mutex::new(vec![GARBAGE; size as usize]),
                ..TargetLog::default()
            }),
        }
    }

    /// A target that reads as zeroes and says so.
    pub fn zeroed(size: u64) -> Self {
        let t = Self::new(size);
        t.log.data.lock().fill(0);
        Self { is_zero: true, ..t }
    }

    pub fn with_caps(mut self, caps: Caps) -> Self {
        self.caps = caps;
        self
    }

    pub fn fail_write_at(mut self, offset: u64) -> Self {
        self.fail_write_at = Some(offset);
        self
    }

    pub fn with_write_delay(mut self, delay: Duration) -> Self {
        self.write_delay = delay;
        self
    }

    pub fn data(&self) -> Vec<u8> {
        self.log.data.lock().clone()
    }

    pub fn ops(&self) -> Vec<Op> {
        self.log.ops.lock().clone()
    }

    pub fn writes(&self) -> Vec<(u64, u64)> {
        self.ops()
            .iter()
            .filter(|o| matches!(o, Op::Write { .. }))
            .map(|o| o.range())
            .collect()
    }

    pub fn zeroes(&self) -> Vec<(u64, u64)> {
        self.ops()
            .iter()
            .filter(|o| matches!(o, Op::Zero { .. }))
            .map(|o| o.range())
            .collect()
    }

    pub fn durable(&self) -> RangeSet {
        self.log.durable.lock().clone()
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        if offset + len > self.size {
            return Err(Error::invalid_input("write past the end"));
        }
        if self
            .fail_write_at
            .is_some_and(|f| offset <= f && f < offset + len)
        {
            return Err(Error::io(
                "injected write failure",
                std::io::Error::from_raw_os_error(5),
            ));
        }
        Ok(())
    }

    fn complete(&self, offset: u64, len: u64) {
        self.log.completed.lock().insert(offset, offset + len);
    }
}

#[async_trait]
impl Target for RecordingTarget {
    fn describe(&self) -> String {
        "recording-target".into()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    fn is_zero(&self) -> bool {
        self.is_zero
    }

    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let len = buf.len() as u64;
        self.check(offset, len)?;
        self.log.ops.lock().push(Op::Write { offset, len });
        self.log.in_flight.enter(len as usize);
        if !self.write_delay.is_zero() {
            tokio::time::sleep(self.write_delay).await;
        }
        self.log.data.lock()[offset as usize..(offset + len) as usize].copy_from_slice(&buf);
        self.log.in_flight.leave(len as usize);
        self.complete(offset, len);
        Ok(buf)
    }

    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.check(offset, len)?;
        self.log.ops.lock().push(Op::Zero { offset, len, mode });
        self.log.data.lock()[offset as usize..(offset + len) as usize].fill(0);
        self.complete(offset, len);
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        let snapshot = self.log.completed.lock().clone();
        tokio::task::yield_now().await;
        let mut durable = self.log.durable.lock();
        for (s, e) in snapshot.to_vec() {
            durable.insert(s, e);
        }
        self.log.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn connect(&self) -> Result<Arc<dyn Target>> {
        Ok(Arc::new(self.clone()))
    }

    async fn finish(&self) -> Result<()> {
        self.flush().await?;
        self.log.finished.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn abort(&self) -> Result<()> {
        self.log.aborted.store(true, Ordering::SeqCst);
        Ok(())
    }
}
