//! Which ranges of a source changed since its parent backup: a dirty bitmap.
//!
//! An incremental backup with a [`ChangedRanges`] reads only the chunks it marks
//! changed; every other chunk is taken from the parent backup unread. The bitmap must
//! have been started (or cleared) when the parent backup was taken: ferry cannot check
//! that, the system that keeps the bitmap (QEMU, libvirt, Proxmox) does.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::spec::NbdSpec;
use ferry_core::{Error, ErrorKind, Result, Source};
use ferry_endpoints::nbd::{NbdOptions, NbdSource};

/// Ranges of an image written since the parent backup.
#[async_trait]
pub trait ChangedRanges: Send + Sync + std::fmt::Debug {
    /// The changed ranges within `offset..offset + len`: sorted, disjoint `[start, end)`.
    async fn changed(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>>;

    /// What the ranges come from, for messages (`dirty bitmap b0 of nbd://...`).
    fn describe(&self) -> String;
}

/// A QEMU dirty bitmap exported over NBD (`qemu-nbd -B NAME`, or a QEMU NBD server with
/// the bitmap added to the export): the context `qemu:dirty-bitmap:NAME`.
#[derive(Debug, Clone)]
pub struct NbdDirtyBitmap {
    source: NbdSource,
    bitmap: String,
}

impl NbdDirtyBitmap {
    /// Opens `spec` selecting `qemu:dirty-bitmap:BITMAP` besides `base:allocation`; fails
    /// clearly when the server does not export that bitmap.
    pub async fn open(spec: &NbdSpec, bitmap: &str) -> Result<Self> {
        let context = format!(
            "{}{bitmap}",
            ferry_endpoints::nbd::DIRTY_BITMAP_CONTEXT_PREFIX
        );
        let options = NbdOptions {
            extra_contexts: vec![context.clone()],
            ..NbdOptions::default()
        };
        let source = NbdSource::open(spec, &options).await?;
        if !source.info().has_context(&context) {
            let _ = source.close().await;
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("the NBD server does not export the dirty bitmap '{bitmap}' (metadata context {context}): export it (qemu-nbd -B {bitmap}) or back up without --dirty-bitmap"),
            )
            .with_endpoint(source.describe()));
        }
        Ok(Self {
            source,
            bitmap: bitmap.to_string(),
        })
    }

    /// The export as a source to back up (the same connection).
    pub fn source(&self) -> Arc<dyn Source> {
        Arc::new(self.source.clone())
    }
}

#[async_trait]
impl ChangedRanges for NbdDirtyBitmap {
    async fn changed(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        self.source.dirty_ranges(&self.bitmap, offset, len).await
    }

    fn describe(&self) -> String {
        format!("dirty bitmap {} of {}", self.bitmap, self.source.describe())
    }
}

/// Asks a [`ChangedRanges`] for whole windows of chunks at once, not once per chunk: an
/// NBD dirty bitmap answers a 1 GiB window in one or a few round trips, where a query per
/// 4 MiB chunk cost a round trip each (1024 for a 4 GiB image, most of a dirty-bitmap
/// backup's time). Workers take chunks in order, so the last two windows are kept.
#[derive(Debug)]
pub(crate) struct ChangedWindows {
    changed: Arc<dyn ChangedRanges>,
    size: u64,
    window: u64,
    kept: tokio::sync::Mutex<Vec<Window>>,
}

/// A window's start and its changed ranges.
type Window = (u64, Vec<(u64, u64)>);

/// Windows kept at once: the one the workers are in and the one before it.
const KEPT_WINDOWS: usize = 2;

impl ChangedWindows {
    /// Windows of `window` bytes (a multiple of the chunk size) over an image of `size`.
    pub fn new(changed: Arc<dyn ChangedRanges>, size: u64, window: u64) -> Self {
        Self {
            changed,
            size,
            window: window.max(1),
            kept: tokio::sync::Mutex::new(Vec::new()),
        }
    }

    /// Whether anything in `offset..offset + len` (within one window) changed.
    pub async fn any_changed(&self, offset: u64, len: u64) -> Result<bool> {
        let start = offset / self.window * self.window;
        let end = offset + len;
        if end > start + self.window {
            return Ok(!self.changed.changed(offset, len).await?.is_empty());
        }
        let mut kept = self.kept.lock().await;
        if !kept.iter().any(|(s, _)| *s == start) {
            let ranges = self
                .changed
                .changed(start, self.window.min(self.size - start))
                .await?;
            if kept.len() == KEPT_WINDOWS {
                kept.remove(0);
            }
            kept.push((start, ranges));
        }
        let ranges = kept
            .iter()
            .find(|(s, _)| *s == start)
            .map(|(_, r)| r.as_slice())
            .unwrap_or_default();
        // The first range ending after offset decides: ranges are sorted and disjoint.
        let i = ranges.partition_point(|&(_, stop)| stop <= offset);
        Ok(ranges.get(i).is_some_and(|&(s, _)| s < end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Debug)]
    struct Counted {
        ranges: Vec<(u64, u64)>,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl ChangedRanges for Counted {
        async fn changed(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            Ok(self
                .ranges
                .iter()
                .filter(|(s, e)| *s < offset + len && *e > offset)
                .map(|(s, e)| (*s.max(&offset), *e.min(&(offset + len))))
                .collect())
        }

        fn describe(&self) -> String {
            "counted".into()
        }
    }

    #[tokio::test]
    async fn windows_answer_like_the_ranges_with_one_query_each() {
        let counted = Arc::new(Counted {
            ranges: vec![(5, 7), (40, 41), (99, 120)],
            calls: AtomicUsize::new(0),
        });
        let windows = ChangedWindows::new(counted.clone(), 130, 50);
        let mut got = Vec::new();
        for chunk in 0..13 {
            let len = 10.min(130 - chunk * 10);
            got.push(windows.any_changed(chunk * 10, len).await.unwrap());
        }
        let want: Vec<bool> = (0..13).map(|c| [0, 4, 9, 10, 11].contains(&c)).collect();
        assert_eq!(got, want);
        assert_eq!(
            counted.calls.load(Ordering::Relaxed),
            3,
            "one query per window"
        );
        // A chunk of an earlier kept window is answered without asking again.
        assert!(windows.any_changed(100, 10).await.unwrap());
        assert_eq!(counted.calls.load(Ordering::Relaxed), 3);
    }
}
