//! [`restore`]: a backup written into any target.
//!
//! One fetch stage reads chunks from the repository, [`FETCHES_PER_WORKER`] GETs per
//! worker at once (an object store's latency per GET is far longer than the work on a
//! chunk), and hands them out in offset order (out of order when writes may be); workers
//! open them (the repository checks each chunk against its digest) and write them. Zero chunks, and 4 KiB zero blocks inside data
//! chunks, become `write_zeroes`, or nothing on a target known to read as zeroes (a new
//! file stays sparse). In order (targets that only take writes in order, or `--order in`)
//! chunks are still fetched in parallel but written one after another.
//!
//! The block hash of the restored image is computed from the plaintext written (never
//! taken from the backup's stored block digests) and compared with the manifest's before
//! the target is finished: a mismatch fails the restore and aborts the target.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_backup::{BackupId, Digest, FixedIndex, Repository};
use ferry_core::{Error, ErrorKind, IoBuf, Result, Target, ZeroMode};
use ferry_engine::{CancellationToken, Progress};
use futures::stream::{self, Stream, StreamExt};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::backup::{join_all, DEFAULT_WORKERS};
use crate::hash::{ChunkBlocks, OrderedHash};

/// Zero blocks inside data chunks are found at this granularity.
const SPARSE: usize = 4096;
/// GETs in flight per worker.
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
}

impl Default for RestoreOptions {
    fn default() -> Self {
        Self {
            workers: DEFAULT_WORKERS,
            order: RestoreOrder::Auto,
            verify: true,
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

struct Shared {
    repo: Repository,
    id: BackupId,
    index: FixedIndex,
    chunk_size: usize,
    /// Chunks from the fetch stage, in the order they are to be taken.
    fetched: tokio::sync::Mutex<mpsc::Receiver<Fetched>>,
    /// Blob buffers to fetch into, returned once a chunk is opened.
    blobs: Mutex<Vec<Vec<u8>>>,
    skip_zero: bool,
    /// In order: the next chunk to write.
    next: Option<watch::Sender<usize>>,
    max_write: usize,
    progress: Progress,
    stop: CancellationToken,
    hash: Mutex<OrderedHash>,
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
    let caps = target.caps();
    let in_order = match options.order {
        RestoreOrder::InOrder => true,
        RestoreOrder::Auto => !caps.random_write,
        RestoreOrder::OutOfOrder if !caps.random_write => {
            return Err(Error::invalid_input(format!(
                "{} takes writes only in order: restore in order",
                target.describe()
            )))
        }
        RestoreOrder::OutOfOrder => false,
    };
    let chunks = index.len();
    let workers = options.workers.clamp(1, 1024).min(chunks.max(1));
    progress.start(size, 0);
    let (to_workers, fetched) = mpsc::channel(1);
    let shared = Arc::new(Shared {
        repo: repo.clone(),
        id: id.clone(),
        chunk_size: index.chunk_size() as usize,
        index,
        fetched: tokio::sync::Mutex::new(fetched),
        blobs: Mutex::new(Vec::new()),
        skip_zero: target.is_zero(),
        next: in_order.then(|| watch::channel(0).0),
        max_write: (caps.block.maximum.max(SPARSE as u32) as usize) / SPARSE * SPARSE,
        progress: progress.clone(),
        stop: cancel.child_token(),
        hash: Mutex::new(OrderedHash::new(size, manifest.chunk_size)),
    });
    tracing::info!(backup = %id, target = %target.describe(), size, workers, in_order, "restore started");

    let mut set = JoinSet::new();
    let fetcher = Arc::clone(&shared);
    let fetches = workers * FETCHES_PER_WORKER;
    set.spawn(async move {
        let result = fetcher.fetch_all(fetches, in_order, to_workers).await;
        if result.is_err() {
            fetcher.stop.cancel();
        }
        result
    });
    for w in 0..workers {
        let (shared, target) = (Arc::clone(&shared), Arc::clone(&target));
        set.spawn(async move {
            let target = if w == 0 {
                target
            } else {
                target.connect().await?
            };
            let result = shared.work(target.as_ref()).await;
            if result.is_err() {
                shared.stop.cancel();
            }
            result
        });
    }
    let failure = join_all(&mut set, &shared.stop).await;
    let failure = failure.or_else(|| cancel.is_cancelled().then(Error::cancelled));
    if let Some(err) = failure {
        let _ = target.abort().await;
        return Err(err);
    }
    let shared = Arc::try_unwrap(shared)
        .map_err(|_| Error::internal("a restore worker outlived the restore"))?;
    let Some(block_hash) = shared.hash.into_inner().finish() else {
        let _ = target.abort().await;
        return Err(Error::internal(
            "the restore ended with chunks missing from the block hash",
        ));
    };
    let expected = manifest.block_hash.as_ref().filter(|_| options.verify);
    let verified = expected.is_some();
    if let Some(expected) = expected {
        if *expected != block_hash {
            let _ = target.abort().await;
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("the restored image of backup {id} has block hash {block_hash}, the backup recorded {expected}: the repository's data does not match the backup"),
            ));
        }
    }
    target.finish().await?;
    let snap = progress.snapshot();
    tracing::info!(backup = %id, %block_hash, "restore finished");
    Ok(RestoreReport {
        id: id.clone(),
        size,
        data_bytes: snap.data_bytes,
        zero_bytes: snap.zero_bytes,
        block_hash,
        verified,
        elapsed: started.elapsed(),
    })
}

/// A chunk from the fetch stage: a data chunk's blob, not yet opened, or a zero chunk.
enum Fetched {
    Data {
        i: usize,
        digest: Digest,
        blob: Vec<u8>,
    },
    Zero {
        i: usize,
    },
}

impl Shared {
    /// The fetch stage: `fetches` chunks at once, handed to the workers in offset order, or
    /// as they arrive when `in_order` is off. (In order, a chunk fetched late must not be
    /// overtaken: the workers would all wait for their turn behind it.)
    async fn fetch_all(
        &self,
        fetches: usize,
        in_order: bool,
        to_workers: mpsc::Sender<Fetched>,
    ) -> Result<()> {
        let chunks = stream::iter(0..self.index.len()).map(|i| self.fetch(i));
        if in_order {
            self.hand_out(chunks.buffered(fetches), to_workers).await
        } else {
            self.hand_out(chunks.buffer_unordered(fetches), to_workers)
                .await
        }
    }

    async fn hand_out(
        &self,
        chunks: impl Stream<Item = Result<Fetched>>,
        to_workers: mpsc::Sender<Fetched>,
    ) -> Result<()> {
        let mut chunks = std::pin::pin!(chunks);
        loop {
            let next = tokio::select! {
                next = chunks.next() => next,
                () = self.stop.cancelled() => return Err(Error::cancelled()),
            };
            let Some(fetched) = next.transpose()? else {
                return Ok(());
            };
            tokio::select! {
                sent = to_workers.send(fetched) => if sent.is_err() {
                    return Err(Error::internal("the restore's workers went away"));
                },
                () = self.stop.cancelled() => return Err(Error::cancelled()),
            }
        }
    }

    /// Fetches chunk `i` into a pooled buffer (nothing for a zero chunk).
    async fn fetch(&self, i: usize) -> Result<Fetched> {
        let digest = self
            .index
            .digest(i)
            .ok_or_else(|| Error::internal("a chunk number outside the index"))?;
        if digest.is_zero() {
            return Ok(Fetched::Zero { i });
        }
        let buf = self.blobs.lock().pop().unwrap_or_default();
        let blob = self
            .repo
            .fetch_chunk_into(&digest, buf)
            .await
            .map_err(|e| self.located(i, &digest, e))?;
        Ok(Fetched::Data { i, digest, blob })
    }

    /// One worker: opens and writes the chunks the fetch stage hands out, until it ends.
    async fn work(&self, target: &dyn Target) -> Result<()> {
        let mut buf: Option<IoBuf> = None;
        loop {
            let next = self.fetched.lock().await.recv().await;
            if self.stop.is_cancelled() {
                return Err(Error::cancelled());
            }
            match next {
                None => return Ok(()),
                Some(Fetched::Zero { i }) => {
                    let (offset, len) = self.index.chunk_range(i);
                    self.turn(i).await?;
                    self.zeroes_at(target, offset, len).await?;
                    self.done(i);
                    self.hash.lock().add(i, ChunkBlocks::Zero);
                }
                Some(Fetched::Data { i, digest, blob }) => {
                    let data = buf.take().unwrap_or_else(|| IoBuf::new(self.chunk_size));
                    let (data, blob) = self.write_fetched(target, i, digest, blob, data).await?;
                    buf = Some(data);
                    self.blobs.lock().push(blob);
                }
            }
        }
    }

    /// Opens a fetched chunk (decoded and checked off the async threads) into `data` and
    /// writes it in its turn. Returns both buffers for reuse.
    async fn write_fetched(
        &self,
        target: &dyn Target,
        i: usize,
        digest: Digest,
        blob: Vec<u8>,
        mut data: IoBuf,
    ) -> Result<(IoBuf, Vec<u8>)> {
        let (offset, len) = self.index.chunk_range(i);
        let repo = self.repo.clone();
        let opened = tokio::task::spawn_blocking(move || {
            data.set_len(data.capacity());
            let (got, digests) = repo.open_chunk(&digest, &blob, &mut data)?;
            if got as u64 != len {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("the chunk holds {got} bytes, the index says {len}"),
                ));
            }
            data.set_len(got);
            let runs = runs(&data);
            Ok((data, digests, runs, blob))
        })
        .await
        .map_err(|_| Error::internal("a chunk decoding thread panicked"))?;
        let (data, digests, runs, blob) = opened.map_err(|e| self.located(i, &digest, e))?;
        self.turn(i).await?;
        let data = self.write_chunk(target, data, offset, &runs).await?;
        self.done(i);
        self.hash.lock().add(i, ChunkBlocks::Data(digests));
        Ok((data, blob))
    }

    /// An error about chunk `i`, naming the backup, the chunk, its offset and digest.
    fn located(&self, i: usize, digest: &Digest, e: Error) -> Error {
        let (offset, _) = self.index.chunk_range(i);
        Error::new(
            e.kind(),
            format!(
                "backup {}: chunk {i} at offset {offset} ({digest}): {}",
                self.id,
                e.message()
            ),
        )
    }

    /// Waits until chunk `i` may be written (in order: every chunk before it is).
    async fn turn(&self, i: usize) -> Result<()> {
        let Some(next) = &self.next else {
            return Ok(());
        };
        let mut rx = next.subscribe();
        tokio::select! {
            waited = rx.wait_for(|n| *n >= i) => waited
                .map(|_| ())
                .map_err(|_| Error::internal("the restore's order keeper went away")),
            () = self.stop.cancelled() => Err(Error::cancelled()),
        }
    }

    fn done(&self, i: usize) {
        if let Some(next) = &self.next {
            next.send_modify(|n| *n = (*n).max(i + 1));
        }
    }

    async fn zeroes_at(&self, target: &dyn Target, offset: u64, len: u64) -> Result<()> {
        if len > 0 && !self.skip_zero {
            target
                .write_zeroes(offset, len, ZeroMode::MayDeallocate)
                .await?;
        }
        self.progress.add_zero(len);
        Ok(())
    }

    /// Writes a chunk's data runs; its 4 KiB zero blocks become zeroes.
    async fn write_chunk(
        &self,
        target: &dyn Target,
        mut data: IoBuf,
        offset: u64,
        runs: &[(usize, usize, bool)],
    ) -> Result<IoBuf> {
        let len = data.len();
        for &(start, run_len, zero) in runs {
            if zero {
                self.zeroes_at(target, offset + start as u64, run_len as u64)
                    .await?;
                continue;
            }
            let mut at = start;
            while at < start + run_len {
                let n = (start + run_len - at).min(self.max_write);
                data.set_view(at, n);
                data = target.write_at(offset + at as u64, data).await?;
                at += n;
            }
            self.progress.add_data(run_len as u64);
        }
        data.set_len(len);
        Ok(data)
    }
}

/// Alternating zero and data runs of a chunk, by 4 KiB blocks: `(start, len, zero)`.
fn runs(data: &[u8]) -> Vec<(usize, usize, bool)> {
    let mut out: Vec<(usize, usize, bool)> = Vec::new();
    for (n, block) in data.chunks(SPARSE).enumerate() {
        let zero = ferry_blkhash::is_zero(block);
        match out.last_mut() {
            Some(last) if last.2 == zero => last.1 += block.len(),
            _ => out.push((n * SPARSE, block.len(), zero)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_zero_and_data_blocks() {
        let mut data = vec![0u8; 5 * SPARSE + 10];
        data[SPARSE + 1] = 1;
        data[2 * SPARSE] = 1;
        data[5 * SPARSE + 3] = 1;
        assert_eq!(
            runs(&data),
            vec![
                (0, SPARSE, true),
                (SPARSE, 2 * SPARSE, false),
                (3 * SPARSE, 2 * SPARSE, true),
                (5 * SPARSE, 10, false)
            ]
        );
    }
}
