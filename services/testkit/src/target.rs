//! [`RecordingTarget`]: a target in memory that records every write and zero run in the
//! order issued, knows which ranges a completed flush made durable, and can fail a write
//! or slow writes down, so engine tests can compare what a copy did exactly.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferry_core::{Caps, Error, IoBuf, Result, Target, ZeroMode};
use parking_lot::Mutex;

use crate::check_range;
use crate::gauge::Gauge;

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
    /// The `[start, end)` range the operation covers.
    pub fn range(&self) -> (u64, u64) {
        match *self {
            Op::Write { offset, len } | Op::Zero { offset, len, .. } => (offset, offset + len),
        }
    }
}

/// The state a [`RecordingTarget`] shares with its clones and handles.
#[derive(Debug, Default)]
pub struct TargetLog {
    data: Mutex<Vec<u8>>,
    /// Operations in the order they were issued.
    ops: Mutex<Vec<Op>>,
    /// Ranges whose write or zeroing completed.
    completed: Mutex<Vec<(u64, u64)>>,
    /// Ranges completed before the start of a flush that completed.
    durable: Mutex<Vec<(u64, u64)>>,
    flushes: AtomicUsize,
    finished: AtomicBool,
    aborted: AtomicBool,
    /// Bytes of writes in progress, and their maximum.
    pub in_flight: Gauge,
}

/// What a target holds before a copy when it is not known to be zero.
pub const GARBAGE: u8 = 0xee;

/// A target that stores bytes in memory and records every operation. Clones and
/// [`Target::connect`] handles share the bytes and the [`TargetLog`].
#[derive(Debug, Clone)]
pub struct RecordingTarget {
    size: u64,
    caps: Caps,
    is_zero: bool,
    fail_write_at: Option<u64>,
    write_delay: Duration,
    /// Shared with every clone and handle.
    pub log: Arc<TargetLog>,
}

impl RecordingTarget {
    /// A target of `size` bytes of [`GARBAGE`], not known to be zero.
    pub fn new(size: u64) -> Self {
        Self::with_data(vec![GARBAGE; size as usize])
    }

    /// A target of `size` zero bytes that says it reads as zeroes.
    pub fn zeroed(size: u64) -> Self {
        Self {
            is_zero: true,
            ..Self::with_data(vec![0; size as usize])
        }
    }

    /// A target holding `data` already (not known to be zero).
    pub fn with_data(data: Vec<u8>) -> Self {
        Self {
            size: data.len() as u64,
            caps: Caps::default(),
            is_zero: false,
            fail_write_at: None,
            write_delay: Duration::ZERO,
            log: Arc::new(TargetLog {
                data: Mutex::new(data),
                ..TargetLog::default()
            }),
        }
    }

    /// Sets the capabilities (block sizes, random writes, ...) the target reports.
    pub fn with_caps(mut self, caps: Caps) -> Self {
        self.caps = caps;
        self
    }

    /// A write or zeroing that covers `offset` fails with EIO.
    pub fn fail_write_at(mut self, offset: u64) -> Self {
        self.fail_write_at = Some(offset);
        self
    }

    /// Every write sleeps `delay` (tokio time) before completing.
    pub fn with_write_delay(mut self, delay: Duration) -> Self {
        self.write_delay = delay;
        self
    }

    /// The bytes the target holds now.
    pub fn data(&self) -> Vec<u8> {
        self.log.data.lock().clone()
    }

    /// Every write and zeroing, in the order issued.
    pub fn ops(&self) -> Vec<Op> {
        self.log.ops.lock().clone()
    }

    /// The ranges of the writes, in the order issued.
    pub fn writes(&self) -> Vec<(u64, u64)> {
        self.ranges_of(|o| matches!(o, Op::Write { .. }))
    }

    /// The ranges of the zeroings, in the order issued.
    pub fn zeroes(&self) -> Vec<(u64, u64)> {
        self.ranges_of(|o| matches!(o, Op::Zero { .. }))
    }

    fn ranges_of(&self, pick: impl Fn(&Op) -> bool) -> Vec<(u64, u64)> {
        self.ops()
            .iter()
            .filter(|o| pick(o))
            .map(Op::range)
            .collect()
    }

    /// The parts of `[start, end)` that no completed flush made durable, in order.
    pub fn durable_gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut durable = self.log.durable.lock().clone();
        durable.sort_unstable();
        let mut gaps = Vec::new();
        let mut pos = start;
        for (s, e) in durable {
            if e <= pos {
                continue;
            }
            if s >= end {
                break;
            }
            if s > pos {
                gaps.push((pos, s));
            }
            pos = e;
        }
        if pos < end {
            gaps.push((pos, end));
        }
        gaps
    }

    /// Completed flushes (finish counts as one).
    pub fn flushes(&self) -> usize {
        self.log.flushes.load(Ordering::SeqCst)
    }

    /// Whether [`Target::finish`] was called and succeeded.
    pub fn is_finished(&self) -> bool {
        self.log.finished.load(Ordering::SeqCst)
    }

    /// Whether [`Target::abort`] was called.
    pub fn is_aborted(&self) -> bool {
        self.log.aborted.load(Ordering::SeqCst)
    }

    fn check(&self, what: &'static str, offset: u64, len: u64) -> Result<()> {
        check_range(what, offset, len, self.size)?;
        if self
            .fail_write_at
            .is_some_and(|f| offset <= f && f < offset + len)
        {
            return Err(Error::io(
                "injected write failure",
                std::io::Error::from_raw_os_error(EIO),
            )
            .at(what, offset));
        }
        Ok(())
    }

    fn complete(&self, offset: u64, len: u64) {
        self.log.completed.lock().push((offset, offset + len));
    }
}

/// The errno a failing disk gives.
const EIO: i32 = 5;

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
        self.check("write", offset, len)?;
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
        self.check("write_zeroes", offset, len)?;
        self.log.ops.lock().push(Op::Zero { offset, len, mode });
        self.log.data.lock()[offset as usize..(offset + len) as usize].fill(0);
        self.complete(offset, len);
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        let snapshot = self.log.completed.lock().clone();
        // Writes completing while the flush runs are not covered by it.
        tokio::task::yield_now().await;
        self.log.durable.lock().extend(snapshot);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stores_records_and_tracks_durability() {
        let tgt = RecordingTarget::zeroed(16);
        assert!(tgt.is_zero());
        let handle = tgt.connect().await.unwrap();
        let mut buf = IoBuf::new(4);
        buf.copy_from_slice(&[1, 2, 3, 4]);
        handle.write_at(2, buf).await.unwrap();
        assert_eq!(tgt.durable_gaps(0, 16), vec![(0, 16)]);
        handle.flush().await.unwrap();
        handle
            .write_zeroes(3, 1, ZeroMode::MayDeallocate)
            .await
            .unwrap();
        assert_eq!(tgt.durable_gaps(0, 16), vec![(0, 2), (6, 16)]);
        handle.finish().await.unwrap();
        assert_eq!(tgt.durable_gaps(2, 6), vec![]);
        assert_eq!(&tgt.data()[..8], &[0, 0, 1, 0, 3, 4, 0, 0]);
        assert_eq!(
            tgt.ops(),
            vec![
                Op::Write { offset: 2, len: 4 },
                Op::Zero {
                    offset: 3,
                    len: 1,
                    mode: ZeroMode::MayDeallocate
                },
            ]
        );
        assert_eq!(tgt.writes(), vec![(2, 6)]);
        assert_eq!(tgt.zeroes(), vec![(3, 4)]);
        assert_eq!(tgt.flushes(), 2);
        assert!(tgt.is_finished() && !tgt.is_aborted());
        let err = tgt.write_at(14, IoBuf::new(4)).await.unwrap_err();
        assert_eq!(err.context().operation, Some("write"));
        assert!(!RecordingTarget::with_data(vec![1]).is_zero());
        assert_eq!(RecordingTarget::new(2).data(), vec![GARBAGE; 2]);
    }

    #[tokio::test]
    async fn injects_a_write_failure() {
        let tgt = RecordingTarget::new(100).fail_write_at(50);
        let mut buf = IoBuf::new(10);
        buf.set_len(10);
        tgt.write_at(0, buf).await.unwrap();
        let mut buf = IoBuf::new(10);
        buf.set_len(10);
        let err = tgt.write_at(45, buf).await.unwrap_err();
        assert_eq!(err.context().offset, Some(45));
        assert!(tgt.write_zeroes(50, 1, ZeroMode::Allocate).await.is_err());
        assert_eq!(tgt.writes(), vec![(0, 10)]);
    }
}
