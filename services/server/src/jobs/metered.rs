//! Source and Target wrappers that count bytes and errors into the service metrics and
//! open a tracing span for a sample of requests, so every endpoint kind is observed the
//! same way without knowing anything about metrics itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Caps, Extent, IoBuf, Result, Source, Target, ZeroMode};
use prometheus::IntCounter;
use tracing::Instrument;

use crate::metrics::Metrics;

/// One request in this many gets its own span.
const SPAN_SAMPLE: u64 = 256;

#[derive(Debug)]
struct Meter {
    metrics: Metrics,
    kind: &'static str,
    read: IntCounter,
    written: IntCounter,
    zeroed: IntCounter,
    requests: AtomicU64,
    /// Whether failed requests are counted and sampled requests get a span: not for an
    /// image over a metered byte source, whose failures and spans are the byte source's.
    observes_requests: bool,
}

impl Meter {
    fn new(metrics: &Metrics, kind: &'static str) -> Arc<Self> {
        let read = metrics.bytes_read.with_label_values(&[kind]);
        Self::counting_reads(metrics, kind, read, true)
    }

    /// Counts the bytes read from a decoded image of `format` over a `kind` source.
    fn image(metrics: &Metrics, kind: &'static str, format: &'static str) -> Arc<Self> {
        let read = metrics.image_bytes_read.with_label_values(&[format, kind]);
        Self::counting_reads(metrics, kind, read, false)
    }

    fn counting_reads(
        metrics: &Metrics,
        kind: &'static str,
        read: IntCounter,
        observes_requests: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            metrics: metrics.clone(),
            kind,
            read,
            written: metrics.bytes_written.with_label_values(&[kind]),
            zeroed: metrics.bytes_zeroed.with_label_values(&[kind]),
            requests: AtomicU64::new(0),
            observes_requests,
        })
    }

    fn error<T>(&self, operation: &'static str, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if self.observes_requests && e.kind() != ferry_core::ErrorKind::Cancelled {
                self.metrics
                    .io_errors
                    .with_label_values(&[self.kind, operation])
                    .inc();
            }
        }
        r
    }

    fn sampled(&self) -> bool {
        self.requests
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SPAN_SAMPLE)
    }

    async fn run<T>(
        &self,
        operation: &'static str,
        offset: u64,
        len: u64,
        f: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let r = if self.observes_requests && self.sampled() {
            let span =
                tracing::info_span!("endpoint", endpoint = self.kind, operation, offset, len);
            f.instrument(span).await
        } else {
            f.await
        };
        self.error(operation, r)
    }
}

/// A metered source.
pub struct MeteredSource {
    inner: Arc<dyn Source>,
    meter: Arc<Meter>,
}

impl std::fmt::Debug for MeteredSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MeteredSource({})", self.inner.describe())
    }
}

impl MeteredSource {
    pub fn wrap(inner: Arc<dyn Source>, metrics: &Metrics, kind: &'static str) -> Arc<dyn Source> {
        Arc::new(Self {
            inner,
            meter: Meter::new(metrics, kind),
        })
    }

    /// Wraps the image decoded from a metered byte source: its reads are counted by
    /// `format` (`ferry_image_read_bytes_total`); failures stay the byte source's.
    pub fn wrap_image(
        inner: Arc<dyn Source>,
        metrics: &Metrics,
        kind: &'static str,
        format: &'static str,
    ) -> Arc<dyn Source> {
        Arc::new(Self {
            inner,
            meter: Meter::image(metrics, kind, format),
        })
    }
}

#[async_trait]
impl Source for MeteredSource {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn size_known(&self) -> bool {
        self.inner.size_known()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn version(&self) -> Option<String> {
        self.inner.version()
    }

    async fn read_some(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let len = buf.len() as u64;
        let r = self
            .meter
            .run("read", offset, len, self.inner.read_some(offset, buf))
            .await;
        if let Ok(buf) = &r {
            self.meter.read.inc_by(buf.len() as u64);
        }
        r
    }

    async fn finish(&self) -> Result<()> {
        self.meter.error("finish", self.inner.finish().await)
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.meter
            .run("extents", offset, len, self.inner.extents(offset, len))
            .await
    }

    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let len = buf.len() as u64;
        let r = self
            .meter
            .run("read", offset, len, self.inner.read_at(offset, buf))
            .await;
        if r.is_ok() {
            self.meter.read.inc_by(len);
        }
        r
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        let inner = self.meter.error("connect", self.inner.connect().await)?;
        Ok(Arc::new(Self {
            inner,
            meter: self.meter.clone(),
        }))
    }

    async fn close(&self) -> Result<()> {
        self.meter.error("close", self.inner.close().await)
    }
}

/// A metered target.
pub struct MeteredTarget {
    inner: Arc<dyn Target>,
    meter: Arc<Meter>,
    counts: Arc<JobCounts>,
}

impl std::fmt::Debug for MeteredTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MeteredTarget({})", self.inner.describe())
    }
}

impl MeteredTarget {
    pub fn wrap(
        inner: Arc<dyn Target>,
        metrics: &Metrics,
        kind: &'static str,
        counts: Arc<JobCounts>,
    ) -> Arc<dyn Target> {
        Arc::new(Self {
            inner,
            meter: Meter::new(metrics, kind),
            counts,
        })
    }
}

#[async_trait]
impl Target for MeteredTarget {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn is_zero(&self) -> bool {
        self.inner.is_zero()
    }

    fn can_grow(&self) -> bool {
        self.inner.can_grow()
    }

    async fn set_end(&self, end: u64) -> Result<()> {
        self.meter
            .run("set_end", end, 0, self.inner.set_end(end))
            .await
    }

    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let len = buf.len() as u64;
        let r = self
            .meter
            .run("write", offset, len, self.inner.write_at(offset, buf))
            .await;
        if r.is_ok() {
            self.meter.written.inc_by(len);
            self.counts.written.fetch_add(len, Ordering::Relaxed);
        }
        r
    }

    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        let r = self
            .meter
            .run(
                "write_zeroes",
                offset,
                len,
                self.inner.write_zeroes(offset, len, mode),
            )
            .await;
        if r.is_ok() {
            self.meter.zeroed.inc_by(len);
            self.counts.zeroed.fetch_add(len, Ordering::Relaxed);
        }
        r
    }

    async fn flush(&self) -> Result<()> {
        self.meter.run("flush", 0, 0, self.inner.flush()).await
    }

    async fn connect(&self) -> Result<Arc<dyn Target>> {
        let inner = self.meter.error("connect", self.inner.connect().await)?;
        Ok(Arc::new(Self {
            inner,
            meter: self.meter.clone(),
            counts: self.counts.clone(),
        }))
    }

    async fn finish(&self) -> Result<()> {
        self.meter.run("finish", 0, 0, self.inner.finish()).await
    }

    async fn abort(&self) -> Result<()> {
        self.meter.error("abort", self.inner.abort().await)
    }
}

/// Bytes one job wrote and zeroed, to derive the bytes it skipped.
#[derive(Debug, Default)]
pub struct JobCounts {
    pub written: AtomicU64,
    pub zeroed: AtomicU64,
}
