//! Committing to the target: every write and zero run goes through here, which adds the
//! error context, counts progress, remembers what was written, and turns that into
//! checkpoints (flush first, then publish: a checkpoint never claims unflushed bytes).

use std::sync::Arc;

use ferry_core::{IoBuf, Result, Target, ZeroMode};
use parking_lot::Mutex;

use crate::progress::{Checkpoint, Progress};
use crate::ranges::RangeSet;

pub(crate) struct Committer {
    /// The handle the copy was given: flushes, finish and abort go to it.
    target: Arc<dyn Target>,
    progress: Progress,
    size: u64,
    /// Zero runs need no write (the target reads as zeroes already).
    skip_zero: bool,
    zero_mode: ZeroMode,
    /// Completed writes and zero runs, plus the ranges a resumed copy skipped.
    written: Mutex<RangeSet>,
}

impl std::fmt::Debug for Committer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committer")
            .field("target", &self.target.describe())
            .field("skip_zero", &self.skip_zero)
            .finish_non_exhaustive()
    }
}

impl Committer {
    pub fn new(
        target: Arc<dyn Target>,
        progress: Progress,
        size: u64,
        skip_zero: bool,
        zero_mode: ZeroMode,
        resumed: RangeSet,
    ) -> Self {
        for (start, end) in resumed.to_vec() {
            progress.report_written(start, end, false);
        }
        Self {
            target,
            progress,
            size,
            skip_zero,
            zero_mode,
            written: Mutex::new(resumed),
        }
    }

    /// Writes the buffer's view at `offset` through the worker's handle `target`.
    pub async fn write(&self, target: &dyn Target, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let len = buf.len() as u64;
        let buf = target
            .write_at(offset, buf)
            .await
            .map_err(|e| e.at("write", offset).with_endpoint(target.describe()))?;
        self.mark(offset, offset + len, false);
        self.progress.add_data(len);
        Ok(buf)
    }

    /// Makes `[start, end)` read as zeroes, or just records it when the target is known zero.
    pub async fn zero(&self, target: &dyn Target, start: u64, end: u64) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        if !self.skip_zero {
            target
                .write_zeroes(start, end - start, self.zero_mode)
                .await
                .map_err(|e| e.at("write_zeroes", start).with_endpoint(target.describe()))?;
        }
        self.mark(start, end, true);
        self.progress.add_zero(end - start);
        Ok(())
    }

    fn mark(&self, start: u64, end: u64, zero: bool) {
        self.written.lock().insert(start, end);
        self.progress.report_written(start, end, zero);
    }

    /// Flushes the target and publishes what was written before the flush started.
    pub async fn checkpoint(&self) -> Result<()> {
        let written = self.written.lock().clone();
        self.target.flush().await.map_err(|e| {
            e.with_operation("flush")
                .with_endpoint(self.target.describe())
        })?;
        self.publish(&written);
        Ok(())
    }

    /// Finishes the target (which flushes it) and publishes the final checkpoint.
    pub async fn finish(&self) -> Result<()> {
        let written = self.written.lock().clone();
        self.target.finish().await.map_err(|e| {
            e.with_operation("finish")
                .with_endpoint(self.target.describe())
        })?;
        self.publish(&written);
        Ok(())
    }

    /// Bytes written (or skipped as resumed) so far.
    pub fn written_bytes(&self) -> u64 {
        self.written.lock().len()
    }

    fn publish(&self, written: &RangeSet) {
        self.progress.publish(Checkpoint {
            size: self.size,
            committed: written.to_vec(),
        });
    }
}
