//! [`CountingSource`]: a wrapper that counts the bytes read through a real source (and
//! every handle it connects), optionally failing reads from an offset on. Backup tests
//! use it to show which chunks an incremental backup read, and to cut a backup off.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Caps, Error, ErrorKind, Extent, IoBuf, Result, Source};

/// Counts the bytes read from a source; every handle it connects shares the count.
pub struct CountingSource {
    inner: Arc<dyn Source>,
    read: Arc<AtomicU64>,
    fail_from: Option<u64>,
}

impl std::fmt::Debug for CountingSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingSource")
            .field("source", &self.inner.describe())
            .field("read", &self.read.load(Ordering::Relaxed))
            .finish()
    }
}

impl CountingSource {
    /// Wraps `inner`; returns the wrapper and the shared count of bytes read.
    pub fn wrap(inner: Arc<dyn Source>) -> (Arc<Self>, Arc<AtomicU64>) {
        Self::failing_from(inner, None)
    }

    /// As [`CountingSource::wrap`], and reads at or past `fail_from` fail with an I/O
    /// error (when set).
    pub fn failing_from(
        inner: Arc<dyn Source>,
        fail_from: Option<u64>,
    ) -> (Arc<Self>, Arc<AtomicU64>) {
        let read = Arc::new(AtomicU64::new(0));
        let source = Arc::new(Self {
            inner,
            read: Arc::clone(&read),
            fail_from,
        });
        (source, read)
    }
}

#[async_trait]
impl Source for CountingSource {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.inner.extents(offset, len).await
    }

    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        if self.fail_from.is_some_and(|f| offset >= f) {
            return Err(Error::new(ErrorKind::Io, "injected read failure").at("read", offset));
        }
        self.read.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.inner.read_at(offset, buf).await
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Self {
            inner: self.inner.connect().await?,
            read: Arc::clone(&self.read),
            fail_from: self.fail_from,
        }))
    }
}
