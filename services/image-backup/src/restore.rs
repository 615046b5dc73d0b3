//! [`restore`]: a backup written into any target, as the engine's copy of the backup's
//! image ([`SnapshotSource`]) into the target.
//!
//! The engine brings the write path: its workers read a chunk per request, in work units
//! of one chunk (the source keeps a window of GETs running ahead of them, as an object
//! store's latency per GET is far longer than the work on a chunk), and write in offset
//! order or out of order as the target allows; zero
//! chunks, and 4 KiB zero blocks inside data chunks, become `write_zeroes`, or nothing on a
//! target known to read as zeroes (a new file stays sparse).
//!
//! The block hash of the restored image is computed from the plaintext read (never taken
//! from the backup's stored block digests) and compared with the manifest's before the
//! target is finished ([`HashCheckedTarget`]): a mismatch fails the restore and aborts the
//! target.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ferry_backup::{BackupId, FixedIndex, Repository};
use ferry_core::{Caps, Error, ErrorKind, IoBuf, Result, Target, ZeroMode};
use ferry_engine::{CancellationToken, CommitOrder, CopyOptions, Progress};
use parking_lot::Mutex;

use crate::backup::DEFAULT_WORKERS;
use crate::chunk_cache::ChunkCache;
use crate::snapshot::SnapshotSource;

/// Zero blocks inside data chunks are found at this granularity.
const SPARSE: usize = 4096;
/// GETs running ahead of the reads, per worker.
const FETCHES_PER_WORKER: usize = 2;

/// The order chunks are written in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RestoreOrder {
    /// Out of order when the target takes random writes, else in order.
    #[default]
    Auto,
    /// In offset order (fetches still run ahead in parallel).
    InOrder,
    /// As fetches complete.
    OutOfOrder,
}

/// How to restore.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RestoreOptions {
    /// Chunks opened and written at once (default 8); twice as many are fetched at once.
    pub workers: usize,
    pub order: RestoreOrder,
    /// Fail when the block hash of what was written differs from the manifest's
    /// (default on).
    pub verify: bool,
    /// A cache shared with readers of the same backup (a live restore's NBD export):
    /// chunks it holds are taken from it instead of fetched again. The restore does not
    /// add to it (it reads each chunk once; the clients' chunks stay).
    pub cache: Option<Arc<ChunkCache>>,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        Self {
            workers: DEFAULT_WORKERS,
            order: RestoreOrder::Auto,
            verify: true,
            cache: None,
        }
    }
}

impl RestoreOptions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    pub fn with_order(mut self, order: RestoreOrder) -> Self {
        self.order = order;
        self
    }

    pub fn with_verify(mut self, on: bool) -> Self {
        self.verify = on;
        self
    }

    pub fn with_cache(mut self, cache: Arc<ChunkCache>) -> Self {
        self.cache = Some(cache);
        self
    }
}

/// What a finished restore did.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    pub id: BackupId,
    pub size: u64,
    /// Bytes written as data.
    pub data_bytes: u64,
    /// Bytes of zeroes (written as zeroes, or skipped on a zero target).
    pub zero_bytes: u64,
    /// The block hash of what was written (equal to the manifest's when it has one).
    pub block_hash: String,
    /// Whether the block hash was checked against the manifest's (it had one, and the
    /// check was not turned off).
    pub verified: bool,
    pub elapsed: Duration,
}

/// Restores backup `id` of `repo` into `target` (at least the image's size).
pub async fn restore(
    repo: &Repository,
    id: &BackupId,
    target: Arc<dyn Target>,
    options: &RestoreOptions,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<RestoreReport> {
    let started = Instant::now();
    let manifest = repo.load_manifest(id).await?;
    let index = repo.load_index(&manifest).await?;
    let size = manifest.image_size;
    if target.size() < size {
        return Err(Error::invalid_input(format!(
            "{} holds {} bytes, less than the {size}-byte image of backup {id}: restore into a target of at least {size} bytes",
            target.describe(),
            target.size()
        )));
    }
    let copy = copy_options(options, target.as_ref(), &index)?;
    let workers = copy.workers;
    let source = SnapshotSource::new(
        repo.clone(),
        id.clone(),
        index,
        workers * FETCHES_PER_WORKER,
        options.cache.clone(),
    );
    let expected = manifest.block_hash.clone().filter(|_| options.verify);
    let verified = expected.is_some();
    let checked = Arc::new(HashCheckedTarget {
        inner: target.clone(),
        source: source.clone(),
        id: id.clone(),
        expected,
        block_hash: Mutex::new(None),
    });
    tracing::info!(backup = %id, target = %target.describe(), size, workers, order = ?copy.order, "restore started");
    let copied = ferry_engine::copy(
        Arc::new(source.clone()),
        checked.clone(),
        &copy,
        progress,
        cancel,
    )
    .await;
    source.stop_read_ahead();
    let report = copied?;
    let block_hash = checked
        .block_hash
        .lock()
        .take()
        .ok_or_else(|| Error::internal("the restore finished without a block hash"))?;
    tracing::info!(backup = %id, %block_hash, "restore finished");
    Ok(RestoreReport {
        id: id.clone(),
        size,
        data_bytes: report.data_bytes,
        zero_bytes: report.zero_bytes,
        block_hash,
        verified,
        elapsed: started.elapsed(),
    })
}

/// The engine's options for a restore of the image `index` describes into `target`.
fn copy_options(
    options: &RestoreOptions,
    target: &dyn Target,
    index: &FixedIndex,
) -> Result<CopyOptions> {
    let order = match options.order {
        RestoreOrder::Auto => CommitOrder::Auto,
        RestoreOrder::InOrder => CommitOrder::InOrder,
        RestoreOrder::OutOfOrder if !target.caps().random_write => {
            return Err(Error::invalid_input(format!(
                "{} takes writes only in order: restore in order",
                target.describe()
            )));
        }
        RestoreOrder::OutOfOrder => CommitOrder::OutOfOrder,
    };
    let workers = options.workers.clamp(1, 1024).min(index.len().max(1));
    let chunk_size = index.chunk_size() as usize;
    Ok(CopyOptions {
        workers,
        order,
        sparse_size: SPARSE,
        // Units of one chunk: the workers take chunks in index order, the order the
        // source fetches them ahead in.
        work_unit: chunk_size as u64,
        // One request (one plaintext chunk) per worker; the blobs fetched ahead are
        // bounded by the source's window.
        max_in_flight_bytes: Some(workers * chunk_size),
        // One flush, at the end: a restore that fails is started again, not resumed.
        checkpoint_interval: Duration::ZERO,
        ..CopyOptions::default()
    })
}

/// The restore's target: writes go straight through; `finish` first takes the block hash
/// of everything read and, when the manifest has one to check against, fails on a
/// mismatch, so that the engine aborts the target instead of finishing a wrong image.
struct HashCheckedTarget {
    inner: Arc<dyn Target>,
    source: SnapshotSource,
    id: BackupId,
    expected: Option<String>,
    /// The block hash, once `finish` took it.
    block_hash: Mutex<Option<String>>,
}

impl std::fmt::Debug for HashCheckedTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashCheckedTarget")
            .field("inner", &self.inner.describe())
            .field("expected", &self.expected)
            .finish_non_exhaustive()
    }
}

impl HashCheckedTarget {
    fn check(&self) -> Result<String> {
        let block_hash = self.source.take_block_hash().ok_or_else(|| {
            Error::internal("the restore ended with chunks missing from the block hash")
        })?;
        match &self.expected {
            Some(expected) if *expected != block_hash => Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the restored image of backup {} has block hash {block_hash}, the backup recorded {expected}: the repository's data does not match the backup",
                    self.id
                ),
            )),
            _ => Ok(block_hash),
        }
    }
}

#[async_trait]
impl Target for HashCheckedTarget {
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

    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        self.inner.write_at(offset, buf).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.inner.write_zeroes(offset, len, mode).await
    }

    async fn flush(&self) -> Result<()> {
        self.inner.flush().await
    }

    async fn connect(&self) -> Result<Arc<dyn Target>> {
        self.inner.connect().await
    }

    async fn finish(&self) -> Result<()> {
        let block_hash = self.check()?;
        self.inner.finish().await?;
        *self.block_hash.lock() = Some(block_hash);
        Ok(())
    }

    async fn abort(&self) -> Result<()> {
        self.inner.abort().await
    }
}
