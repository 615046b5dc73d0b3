//! Reading a target back while the copy is still writing it.
//!
//! A verified copy hashes the target through a new read handle. Waiting for the copy to
//! end first costs a second pass after the copy; instead the read-back follows the
//! copy's checkpoints: a checkpoint is published only after a flush, and its committed
//! prefix (every byte from 0 to it written and flushed) is what the read-back may read.
//! [`Gated`] makes any source wait for that: reads and extents past the prefix wait for
//! the next checkpoint, so the block hash of the target is computed by the ordinary
//! checksum engine, running beside the copy and never ahead of its flushes.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Caps, Error, Extent, IoBuf, Result, Source};
use tokio_util::sync::CancellationToken;

use crate::progress::Progress;

/// The copy's published checkpoints, and whether the copy has ended.
#[derive(Debug)]
pub(crate) struct Gate {
    progress: Progress,
    ended: CancellationToken,
}

impl Gate {
    pub fn new(progress: Progress) -> Self {
        Self {
            progress,
            ended: CancellationToken::new(),
        }
    }

    /// The copy has ended (with the final checkpoint published when it succeeded).
    pub fn end(&self) {
        self.ended.cancel();
    }

    /// Waits until the bytes before `end` are committed and returns the committed prefix;
    /// fails when the copy ended without committing them.
    async fn committed_to(&self, end: u64) -> Result<u64> {
        loop {
            let published = self.progress.published();
            tokio::pin!(published);
            published.as_mut().enable();
            let prefix = self.progress.checkpoint().committed_prefix();
            if prefix >= end {
                return Ok(prefix);
            }
            if self.ended.is_cancelled() {
                return Err(Error::cancelled());
            }
            tokio::select! {
                _ = published => {}
                _ = self.ended.cancelled() => {}
            }
        }
    }
}

/// A source that reads only what the copy behind `gate` has committed.
pub(crate) struct Gated {
    inner: Arc<dyn Source>,
    gate: Arc<Gate>,
}

impl Gated {
    pub fn new(inner: Arc<dyn Source>, gate: Arc<Gate>) -> Self {
        Self { inner, gate }
    }
}

impl std::fmt::Debug for Gated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gated")
            .field("inner", &self.inner.describe())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Source for Gated {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    /// Extents of the committed part only: what lies past it is still being written.
    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let prefix = self.gate.committed_to(offset.saturating_add(1)).await?;
        let len = len.min(prefix - offset);
        self.inner.extents(offset, len).await
    }

    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let end = offset.saturating_add(buf.len() as u64);
        self.gate.committed_to(end).await?;
        self.inner.read_at(offset, buf).await
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Gated {
            inner: self.inner.connect().await?,
            gate: Arc::clone(&self.gate),
        }))
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Checkpoint;
    use ferry_testkit::MemSource;
    use std::time::Duration;

    #[tokio::test]
    async fn reads_wait_for_the_committed_prefix() {
        let progress = Progress::new();
        let gate = Arc::new(Gate::new(progress.clone()));
        let gated = Gated::new(Arc::new(MemSource::new(vec![5; 4096])), Arc::clone(&gate));
        let publish = |end| {
            progress.publish(Checkpoint {
                size: 4096,
                committed: vec![(0, end)],
            })
        };
        publish(1024);
        let buf = gated.read_at(0, IoBuf::new(1024)).await.unwrap();
        assert_eq!(&buf[..], &[5; 1024]);
        let extents = gated.extents(0, 4096).await.unwrap();
        assert_eq!(extents.last().unwrap().end(), 1024);

        let read = gated.read_at(1024, IoBuf::new(2048));
        tokio::pin!(read);
        let waited = tokio::time::timeout(Duration::from_millis(50), read.as_mut()).await;
        assert!(waited.is_err(), "a read past the prefix must wait");
        publish(3072);
        let buf = read.await.unwrap();
        assert_eq!(buf.len(), 2048);

        let past = gated.read_at(3072, IoBuf::new(1024));
        tokio::pin!(past);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), past.as_mut())
                .await
                .is_err()
        );
        gate.end();
        let err = past.await.unwrap_err();
        assert_eq!(err.kind(), ferry_core::ErrorKind::Cancelled);
    }
}
