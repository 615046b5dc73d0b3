//! Verify-after-copy: the block hash of the source and of the target, which must match.
//!
//! A target may be larger than the source (an existing disk written over the source's
//! length only), so the target is read through [`Prefix`], a view of its first
//! `source.size()` bytes; the bytes past that are not the copy's business.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use async_trait::async_trait;
use ferry_core::{Caps, Extent, IoBuf, Result, Source};
use ferry_endpoints::{open_source, EndpointSpec, SourceOptions};
use ferry_engine::{checksum, CancellationToken, ChecksumOptions, Digest, Progress};

/// The digests of both sides and how long computing them took.
#[derive(Debug)]
pub struct Verified {
    pub source: Digest,
    pub target: Digest,
    pub elapsed: Duration,
}

/// Hashes the source and the (re-opened) target concurrently and fails on a mismatch.
pub async fn verify(
    source: Arc<dyn Source>,
    target_spec: &EndpointSpec,
    target_name: &str,
    options: &SourceOptions,
    checksum_options: &ChecksumOptions,
    progress: &Progress,
    cancel: &CancellationToken,
) -> anyhow::Result<Verified> {
    let started = Instant::now();
    let target = open_source(target_spec, options)
        .await
        .map_err(|e| super::named(e, target_name, "verify: cannot open the target for reading"))?;
    if target.size() < source.size() {
        bail!(
            "verify: the target {target_name} is {} bytes, smaller than the source's {}",
            target.size(),
            source.size()
        );
    }
    let target: Arc<dyn Source> = if target.size() == source.size() {
        target
    } else {
        Arc::new(Prefix::new(target, source.size()))
    };
    let target_progress = Progress::new();
    let (source_digest, target_digest) = tokio::join!(
        checksum(source, checksum_options, progress, cancel),
        checksum(target.clone(), checksum_options, &target_progress, cancel),
    );
    let _ = target.close().await;
    let source_digest =
        source_digest.map_err(|e| super::failed(e, "verify: checksum of the source"))?;
    let target_digest =
        target_digest.map_err(|e| super::failed(e, "verify: checksum of the target"))?;
    if source_digest != target_digest {
        bail!(
            "verify failed: the target {target_name} differs from the source ({} of the source {}, of the target {})",
            source_digest.algorithm,
            source_digest.hex(),
            target_digest.hex()
        );
    }
    Ok(Verified {
        source: source_digest,
        target: target_digest,
        elapsed: started.elapsed(),
    })
}

/// The first `size` bytes of a larger source.
pub struct Prefix {
    inner: Arc<dyn Source>,
    size: u64,
}

impl Prefix {
    pub fn new(inner: Arc<dyn Source>, size: u64) -> Self {
        let size = size.min(inner.size());
        Self { inner, size }
    }
}

impl std::fmt::Debug for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefix")
            .field("inner", &self.inner.describe())
            .field("size", &self.size)
            .finish()
    }
}

#[async_trait]
impl Source for Prefix {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut extents = self.inner.extents(offset, end - offset).await?;
        extents.retain(|e| e.offset < end);
        for e in &mut extents {
            if e.end() > end {
                e.len = end - e.offset;
            }
        }
        Ok(extents)
    }

    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        self.inner.read_at(offset, buf).await
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Prefix {
            inner: self.inner.connect().await?,
            size: self.size,
        }))
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}
