//! Progress counters and checkpoints, shared between a running copy and its observers.
//!
//! The engine updates them as requests complete; the CLI's progress bar, the job service
//! and its store read them at any time from another task without locking the data path
//! (the counters are atomics; the checkpoint changes only every checkpoint interval).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferry_core::WrittenRanges;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Which ranges of the target hold the source's bytes durably (written and flushed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The source size the ranges refer to.
    pub size: u64,
    /// Sorted, merged `[start, end)` ranges.
    pub committed: Vec<(u64, u64)>,
}

impl Checkpoint {
    /// Bytes covered by the committed ranges.
    pub fn committed_bytes(&self) -> u64 {
        self.committed.iter().map(|(s, e)| e - s).sum()
    }

    /// Whether every byte of the image is committed.
    pub fn is_complete(&self) -> bool {
        self.committed_bytes() == self.size
    }

    /// The end of the committed range that starts at offset 0: every byte before it is
    /// durable.
    pub fn committed_prefix(&self) -> u64 {
        match self.committed.first() {
            Some(&(0, end)) => end,
            _ => 0,
        }
    }
}

/// A point-in-time copy of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressSnapshot {
    /// Bytes to process; 0 while a source whose size shows only at its end is read.
    pub total: u64,
    /// Bytes processed (including ranges a resumed copy skipped).
    pub done: u64,
    /// Bytes read and written as data by this run.
    pub data_bytes: u64,
    /// Bytes handled as zeroes by this run (written as zeroes or skipped).
    pub zero_bytes: u64,
}

/// The observer slot, set once before the copy starts.
#[derive(Default)]
struct Observer(std::sync::OnceLock<Arc<dyn WrittenRanges>>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Some(..)"
        } else {
            "None"
        })
    }
}

#[derive(Debug, Default)]
struct Inner {
    total: AtomicU64,
    done: AtomicU64,
    data_bytes: AtomicU64,
    zero_bytes: AtomicU64,
    checkpoint: Mutex<Checkpoint>,
    /// Woken whenever a checkpoint is published.
    published: tokio::sync::Notify,
    written: Observer,
}

/// Live progress of one copy or checksum. Clones share the same counters.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    inner: Arc<Inner>,
}

impl Progress {
    pub fn new() -> Self {
        Self::default()
    }

    /// Progress whose copy reports every range it writes to `observer` (see
    /// [`WrittenRanges`]).
    pub fn with_written(observer: Arc<dyn WrittenRanges>) -> Self {
        let progress = Self::default();
        let _ = progress.inner.written.0.set(observer);
        progress
    }

    /// Tells the observer, if any, that `[start, end)` is on the target.
    pub(crate) fn report_written(&self, start: u64, end: u64, zero: bool) {
        if let Some(observer) = self.inner.written.0.get() {
            observer.written(start, end, zero);
        }
    }

    pub fn snapshot(&self) -> ProgressSnapshot {
        let i = &self.inner;
        ProgressSnapshot {
            total: i.total.load(Ordering::Relaxed),
            done: i.done.load(Ordering::Relaxed),
            data_bytes: i.data_bytes.load(Ordering::Relaxed),
            zero_bytes: i.zero_bytes.load(Ordering::Relaxed),
        }
    }

    /// The latest published checkpoint.
    pub fn checkpoint(&self) -> Checkpoint {
        self.inner.checkpoint.lock().clone()
    }

    /// Starts counting a run over `total` bytes of which `already_done` need no work
    /// (used by the engine, and by other data paths such as backups that report here).
    pub fn start(&self, total: u64, already_done: u64) {
        let i = &self.inner;
        i.total.store(total, Ordering::Relaxed);
        i.done.store(already_done, Ordering::Relaxed);
        i.data_bytes.store(0, Ordering::Relaxed);
        i.zero_bytes.store(0, Ordering::Relaxed);
    }

    /// Sets the total once it is known: a source whose size shows only at its end runs
    /// with a total of 0 until then.
    pub fn set_total(&self, total: u64) {
        self.inner.total.store(total, Ordering::Relaxed);
    }

    /// Counts bytes moved as data.
    pub fn add_data(&self, bytes: u64) {
        self.inner.data_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.inner.done.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts bytes handled as zeroes.
    pub fn add_zero(&self, bytes: u64) {
        self.inner.zero_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.inner.done.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn publish(&self, checkpoint: Checkpoint) {
        *self.inner.checkpoint.lock() = checkpoint;
        self.inner.published.notify_waiters();
    }

    /// Resolves at the next [`Progress::publish`] after it is enabled or first polled.
    pub(crate) fn published(&self) -> tokio::sync::futures::Notified<'_> {
        self.inner.published.notified()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_checkpoint_are_shared_by_clones() {
        let p = Progress::new();
        let q = p.clone();
        p.start(100, 10);
        p.add_data(30);
        p.add_zero(20);
        assert_eq!(
            q.snapshot(),
            ProgressSnapshot {
                total: 100,
                done: 60,
                data_bytes: 30,
                zero_bytes: 20
            }
        );
        p.publish(Checkpoint {
            size: 100,
            committed: vec![(0, 60)],
        });
        assert_eq!(q.checkpoint().committed_bytes(), 60);
        assert!(!q.checkpoint().is_complete());
    }

    #[test]
    fn checkpoint_round_trips_through_json() {
        let c = Checkpoint {
            size: 8,
            committed: vec![(0, 4), (6, 8)],
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, r#"{"size":8,"committed":[[0,4],[6,8]]}"#);
        assert_eq!(serde_json::from_str::<Checkpoint>(&json).unwrap(), c);
    }
}
