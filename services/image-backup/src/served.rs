//! A backup's image as a [`Source`] for readers that are not a restore: the clients of
//! `ferry backup serve` (a VM booting from it, `qemu-img convert`, nbdcopy), which read
//! any part of it, in requests of any size, at any time, many at once.
//!
//! Chunks are fetched on demand and kept decoded in a bounded [`ChunkCache`] (a chunk
//! read in 64 requests of 64 KiB is fetched once). Zero chunks are zero extents and are
//! never fetched. A reader going front to back is noticed (it reads the chunk after one
//! read recently) and the next data chunks are fetched ahead of it, concurrently, at
//! most `read_ahead` at a time for all readers together: an object store's latency per
//! GET is far longer than the time to hand a chunk to a client.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use ferry_backup::{BackupId, Digest, FixedIndex};
use ferry_core::{BlockSizes, Caps, Error, Extent, IoBuf, Result, Source};
use parking_lot::Mutex;

use crate::chunk_cache::ChunkCache;
use crate::snapshot::{index_digest, index_extents};

/// The default read-ahead: chunks fetched ahead of a sequential reader, for all readers
/// together (32 MiB of the default 4 MiB chunks).
pub const DEFAULT_READ_AHEAD: usize = 8;
/// Chunks remembered as read recently, to tell a sequential reader (several readers at
/// once each have their own run).
const RECENT: usize = 64;

struct Inner {
    cache: Arc<ChunkCache>,
    id: BackupId,
    index: FixedIndex,
    size: u64,
    chunk_size: u64,
    read_ahead: usize,
    /// Read-ahead fetches running now.
    prefetching: Arc<AtomicUsize>,
    /// The chunks read most recently, newest last.
    recent: Mutex<VecDeque<usize>>,
}

/// The image of one backup, read through a shared chunk cache; any number of readers at
/// once (`connect` hands out handles on the same cache).
#[derive(Clone)]
pub struct BackupImage {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BackupImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupImage")
            .field("backup", &self.inner.id)
            .field("size", &self.inner.size)
            .finish_non_exhaustive()
    }
}

/// Counts a read-ahead fetch while it runs.
struct Prefetching(Arc<AtomicUsize>);

impl Drop for Prefetching {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl BackupImage {
    /// Opens backup `id` of the cache's repository (its manifest and index). The
    /// read-ahead is capped at half the chunks the cache holds, so that chunks fetched
    /// ahead are not evicted before they are read.
    pub async fn open(cache: Arc<ChunkCache>, id: &BackupId, read_ahead: usize) -> Result<Self> {
        let repo = cache.repository().clone();
        let manifest = repo.load_manifest(id).await?;
        let index = repo.load_index(&manifest).await?;
        let chunk_size = u64::from(index.chunk_size());
        let fits = (cache.capacity() / chunk_size / 2) as usize;
        Ok(Self {
            inner: Arc::new(Inner {
                id: id.clone(),
                size: index.image_size(),
                chunk_size,
                index,
                read_ahead: read_ahead.min(fits),
                prefetching: Arc::new(AtomicUsize::new(0)),
                recent: Mutex::new(VecDeque::with_capacity(RECENT)),
                cache,
            }),
        })
    }

    /// The read-ahead in effect, in chunks (after the cap by the cache's size).
    pub fn read_ahead(&self) -> usize {
        self.inner.read_ahead
    }

    /// The backup's chunk size.
    pub fn chunk_size(&self) -> u64 {
        self.inner.chunk_size
    }
}

impl Inner {
    fn digest(&self, i: usize) -> Result<Digest> {
        index_digest(&self.index, i)
    }

    /// Notes a read of chunk `i`; when the chunk before it was read recently, the reader
    /// goes front to back: starts fetching the data chunks after `i`.
    fn noticed(&self, i: usize) {
        let sequential = {
            let mut recent = self.recent.lock();
            let sequential = i > 0 && recent.contains(&(i - 1));
            if !recent.contains(&i) {
                if recent.len() == RECENT {
                    recent.pop_front();
                }
                recent.push_back(i);
            }
            sequential
        };
        if sequential && self.read_ahead > 0 {
            self.read_ahead_of(i);
        }
    }

    /// Starts fetches of the data chunks among the `read_ahead` after `i` that are
    /// neither cached nor on their way, while fewer than `read_ahead` run.
    fn read_ahead_of(&self, i: usize) {
        let end = (i + 1 + self.read_ahead).min(self.index.len());
        for j in i + 1..end {
            let Some(digest) = self.index.digest(j).filter(|d| !d.is_zero()) else {
                continue;
            };
            if self.prefetching.fetch_add(1, Ordering::Relaxed) >= self.read_ahead {
                self.prefetching.fetch_sub(1, Ordering::Relaxed);
                return;
            }
            let counted = Prefetching(self.prefetching.clone());
            let (_, len) = self.index.chunk_range(j);
            match self.cache.prefetch(digest, len) {
                Some(done) => {
                    tokio::spawn(async move {
                        done.await;
                        drop(counted);
                    });
                }
                None => drop(counted),
            }
        }
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
}

#[async_trait]
impl Source for BackupImage {
    fn describe(&self) -> String {
        format!("backup {}", self.inner.id)
    }

    fn size(&self) -> u64 {
        self.inner.size
    }

    fn caps(&self) -> Caps {
        let chunk = u32::try_from(self.inner.chunk_size).unwrap_or(u32::MAX);
        Caps {
            extents: true,
            multi_conn: true,
            block: BlockSizes {
                minimum: 1,
                preferred: chunk,
                maximum: chunk,
            },
            request_size: Some(chunk),
            ..Caps::default()
        }
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        index_extents(&self.inner.index, self.inner.size, offset, len)
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let inner = &self.inner;
        let len = buf.view().len() as u64;
        if offset.checked_add(len).is_none_or(|end| end > inner.size) {
            return Err(Error::invalid_input(format!(
                "read of {len} bytes at {offset} is past the end of the {}-byte image of backup {}",
                inner.size, inner.id
            )));
        }
        let bytes: &mut [u8] = &mut buf;
        let mut at = offset;
        while at < offset + len {
            let i = (at / inner.chunk_size) as usize;
            let (chunk_offset, chunk_len) = inner.index.chunk_range(i);
            let stop = (chunk_offset + chunk_len).min(offset + len);
            let part = &mut bytes[(at - offset) as usize..(stop - offset) as usize];
            let digest = inner.digest(i)?;
            inner.noticed(i);
            if digest.is_zero() {
                part.fill(0);
            } else {
                let chunk = inner
                    .cache
                    .get(digest, chunk_len)
                    .await
                    .map_err(|e| inner.located(i, &digest, e))?;
                let from = (at - chunk_offset) as usize;
                part.copy_from_slice(&chunk.data[from..from + part.len()]);
            }
            at = stop;
        }
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(self.clone()))
    }
}
