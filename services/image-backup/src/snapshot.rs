//! A backup as a [`Source`]: the image a snapshot holds, read chunk by chunk from the
//! repository, so that a restore is the engine's copy (its workers, commit order, zero
//! skipping, request sizing, rate limit and progress) and nothing of the write path is
//! written twice.
//!
//! Extents come from the index: a zero chunk is a zero extent (never fetched), a stored
//! chunk a data extent. The engine asks for a chunk per request (the source prefers and
//! caps requests at the chunk size); such a read takes the chunk's blob, and decodes and
//! checks it (against its name) off the async threads straight into the engine's buffer.
//!
//! An object store's latency per GET is far longer than the work on a chunk, so the
//! source keeps a window of GETs running ahead of the reads ([`ReadAhead`]): the data
//! chunks after the furthest one read, in index order, as many as the window holds. The
//! restore gives the engine work units of one chunk, so its workers take chunks in index
//! order and the chunks fetched ahead are the ones read next, in order or out of order.
//! A read of part of a chunk (a target that takes smaller writes) shares one fetch of the
//! chunk with the other reads of it, held only until every byte of it was read.
//!
//! Every chunk opened hands its block digests to the image's block hash, and every zero
//! chunk the precomputed ones, so the restored image's block hash comes from the
//! plaintext read (never from digests the backup stored), at no cost beyond the check
//! each chunk needs anyway.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use ferry_backup::{BackupId, Digest, FixedIndex, Repository};
use ferry_core::{
    merge_extents, BlockSizes, Caps, Error, ErrorKind, Extent, IoBuf, Result, Source,
};
use parking_lot::Mutex;
use tokio::sync::OnceCell;
use tokio::task::JoinHandle;

use crate::chunk_cache::{CachedChunk, ChunkCache};
use crate::hash::{ChunkBlocks, OrderedHash};

/// A chunk opened for reads of parts of it, and the bytes of it not read yet.
struct SharedChunk {
    data: Arc<OnceCell<IoBuf>>,
    unread: u64,
}

struct Inner {
    repo: Repository,
    id: BackupId,
    index: FixedIndex,
    size: u64,
    chunk_size: u64,
    hash: Mutex<OrderedHash>,
    /// Blob buffers to fetch into, returned once a chunk is opened.
    blobs: Arc<Mutex<Vec<Vec<u8>>>>,
    partial: Mutex<HashMap<usize, SharedChunk>>,
    ahead: ReadAhead,
    /// The chunk cache of a live restore, shared with the NBD export of the same backup:
    /// a chunk its clients read (or are reading) is taken from there, not fetched again.
    cache: Option<Arc<ChunkCache>>,
}

/// A GET running ahead of its read; stopped when dropped unread.
struct Fetching(JoinHandle<Result<Vec<u8>>>);

impl Drop for Fetching {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The GETs running ahead of the reads: the data chunks after the furthest chunk read,
/// started in index order, at most `window` fetched and not yet read.
struct ReadAhead {
    window: usize,
    state: Mutex<AheadState>,
}

struct AheadState {
    /// The next chunk to start a fetch of (chunks before it were read or are fetching).
    cursor: usize,
    fetching: BTreeMap<usize, Fetching>,
}

/// The image of one backup, readable by any number of workers at once.
#[derive(Clone)]
pub(crate) struct SnapshotSource {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SnapshotSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotSource")
            .field("backup", &self.inner.id)
            .field("size", &self.inner.size)
            .finish_non_exhaustive()
    }
}

impl SnapshotSource {
    /// The image of backup `id`, whose index is `index`, with at most `read_ahead`
    /// chunks fetched ahead of the reads, and chunks taken from `cache` when it holds them.
    pub fn new(
        repo: Repository,
        id: BackupId,
        index: FixedIndex,
        read_ahead: usize,
        cache: Option<Arc<ChunkCache>>,
    ) -> Self {
        let size = index.image_size();
        let chunk_size = index.chunk_size();
        let mut hash = OrderedHash::new(size, chunk_size);
        for i in 0..index.len() {
            if index.digest(i).is_some_and(|d| d.is_zero()) {
                hash.add(i, ChunkBlocks::Zero);
            }
        }
        Self {
            inner: Arc::new(Inner {
                repo,
                id,
                size,
                chunk_size: u64::from(chunk_size),
                index,
                hash: Mutex::new(hash),
                blobs: Arc::new(Mutex::new(Vec::new())),
                partial: Mutex::new(HashMap::new()),
                ahead: ReadAhead {
                    window: read_ahead,
                    state: Mutex::new(AheadState {
                        cursor: 0,
                        fetching: BTreeMap::new(),
                    }),
                },
                cache,
            }),
        }
    }

    /// Stops the GETs still running ahead (a restore that failed or was cancelled).
    pub fn stop_read_ahead(&self) {
        let stopped = std::mem::take(&mut self.inner.ahead.state.lock().fetching);
        drop(stopped);
    }

    /// The block hash of the image, once every chunk was read (None before, or when it
    /// was taken already).
    pub fn take_block_hash(&self) -> Option<String> {
        let inner = &self.inner;
        let fresh = OrderedHash::new(inner.size, inner.chunk_size as u32);
        std::mem::replace(&mut *inner.hash.lock(), fresh).finish()
    }
}

impl Inner {
    fn chunk_of(&self, offset: u64) -> usize {
        (offset / self.chunk_size) as usize
    }

    fn digest(&self, i: usize) -> Result<Digest> {
        index_digest(&self.index, i)
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

    /// Starts the GET of chunk `i`'s blob into a pooled buffer.
    fn start_fetch(&self, digest: Digest) -> Fetching {
        let repo = self.repo.clone();
        let buf = self.blobs.lock().pop().unwrap_or_default();
        Fetching(tokio::spawn(async move {
            repo.fetch_chunk_into(&digest, buf).await
        }))
    }

    /// The blob of chunk `i`: the one fetched ahead, or fetched now. Moves the window
    /// past `i` and fills it first, so that the next chunks are on their way while this
    /// one is awaited.
    async fn blob(&self, i: usize) -> Result<Vec<u8>> {
        let digest = self.digest(i)?;
        let fetching = {
            let mut state = self.ahead.state.lock();
            let fetching = state.fetching.remove(&i);
            state.cursor = state.cursor.max(i + 1);
            self.fill_window(&mut state);
            fetching
        };
        let fetching = fetching.unwrap_or_else(|| self.start_fetch(digest));
        let mut fetching = fetching;
        let joined = (&mut fetching.0).await;
        joined
            .map_err(|_| Error::internal("a chunk fetch was stopped"))?
            .map_err(|e| self.located(i, &digest, e))
    }

    /// Starts fetches of the data chunks from the cursor on until the window is full.
    fn fill_window(&self, state: &mut AheadState) {
        while state.fetching.len() < self.ahead.window && state.cursor < self.index.len() {
            let i = state.cursor;
            state.cursor += 1;
            match self.index.digest(i) {
                Some(digest) if !digest.is_zero() && !self.in_cache(&digest) => {
                    state.fetching.insert(i, self.start_fetch(digest));
                }
                _ => {}
            }
        }
    }

    /// Whether the shared cache holds the chunk, or is fetching it.
    fn in_cache(&self, digest: &Digest) -> bool {
        self.cache.as_ref().is_some_and(|c| c.holds(digest))
    }

    /// Chunk `i` from the shared cache, when it holds it (or is fetching it); its block
    /// digests are handed to the block hash.
    async fn cached(&self, i: usize) -> Result<Option<Arc<CachedChunk>>> {
        let digest = self.digest(i)?;
        let Some(cache) = self.cache.as_ref().filter(|c| c.holds(&digest)) else {
            return Ok(None);
        };
        let (_, len) = self.index.chunk_range(i);
        let chunk = cache
            .get(digest, len)
            .await
            .map_err(|e| self.located(i, &digest, e))?;
        self.hash
            .lock()
            .add(i, ChunkBlocks::Data(chunk.blocks.clone()));
        Ok(Some(chunk))
    }

    /// Opens chunk `i`'s `blob` into `out`'s view (the chunk's length), off the async
    /// threads; hands its block digests to the block hash. Returns `out`.
    async fn open_into(&self, i: usize, blob: Vec<u8>, mut out: IoBuf) -> Result<IoBuf> {
        let digest = self.digest(i)?;
        let (_, len) = self.index.chunk_range(i);
        let repo = self.repo.clone();
        let opened = tokio::task::spawn_blocking(move || {
            let got = repo.open_chunk(&digest, &blob, &mut out);
            (got, out, blob)
        })
        .await
        .map_err(|_| Error::internal("a chunk decoding thread panicked"))?;
        let (got, out, blob) = opened;
        self.blobs.lock().push(blob);
        let (got, digests) = got.map_err(|e| self.located(i, &digest, e))?;
        if got as u64 != len {
            return Err(self.located(
                i,
                &digest,
                Error::new(
                    ErrorKind::Corrupt,
                    format!("the chunk holds {got} bytes, the index says {len}"),
                ),
            ));
        }
        self.hash.lock().add(i, ChunkBlocks::Data(digests));
        Ok(out)
    }

    /// Copies `buf.len()` bytes of chunk `i` from `at` (within the chunk) into `buf`,
    /// sharing one fetch of the chunk with the other partial reads of it.
    async fn read_part(&self, i: usize, at: u64, buf: &mut [u8]) -> Result<()> {
        let (_, len) = self.index.chunk_range(i);
        let cell = {
            let mut partial = self.partial.lock();
            let entry = partial.entry(i).or_insert_with(|| SharedChunk {
                data: Arc::new(OnceCell::new()),
                unread: len,
            });
            entry.data.clone()
        };
        let data = cell
            .get_or_try_init(|| async {
                let blob = self.blob(i).await?;
                self.open_into(i, blob, IoBuf::new(len as usize)).await
            })
            .await;
        let read = match data {
            Ok(data) => {
                let from = at as usize;
                buf.copy_from_slice(&data[from..from + buf.len()]);
                Ok(())
            }
            Err(e) => Err(e),
        };
        let mut partial = self.partial.lock();
        if let Some(entry) = partial.get_mut(&i) {
            entry.unread = entry.unread.saturating_sub(buf.len() as u64);
            if entry.unread == 0 || read.is_err() {
                partial.remove(&i);
            }
        }
        read
    }
}

#[async_trait]
impl Source for SnapshotSource {
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
        let view = buf.view();
        let len = view.len() as u64;
        if offset.checked_add(len).is_none_or(|end| end > inner.size) {
            return Err(Error::invalid_input(format!(
                "read of {len} bytes at {offset} is past the end of the {}-byte image of backup {}",
                inner.size, inner.id
            )));
        }
        let i = inner.chunk_of(offset);
        let (chunk_offset, chunk_len) = inner.index.chunk_range(i);
        if offset == chunk_offset && len == chunk_len {
            // The engine's usual request: the whole chunk, decoded straight into its buffer
            // (or copied from the cache a live restore shares with its export).
            if let Some(chunk) = inner.cached(i).await? {
                let whole: &mut [u8] = &mut buf;
                whole.copy_from_slice(&chunk.data);
                return Ok(buf);
            }
            let blob = inner.blob(i).await?;
            return inner.open_into(i, blob, buf).await;
        }
        let mut at = offset;
        let bytes: &mut [u8] = &mut buf;
        while at < offset + len {
            let i = inner.chunk_of(at);
            let (chunk_offset, chunk_len) = inner.index.chunk_range(i);
            let stop = (chunk_offset + chunk_len).min(offset + len);
            let part = &mut bytes[(at - offset) as usize..(stop - offset) as usize];
            if inner.digest(i)?.is_zero() {
                part.fill(0);
            } else {
                inner.read_part(i, at - chunk_offset, part).await?;
            }
            at = stop;
        }
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(self.clone()))
    }
}

/// The digest of chunk `i` of `index` (a number past the index is ferry's own error).
pub(crate) fn index_digest(index: &FixedIndex, i: usize) -> Result<Digest> {
    index
        .digest(i)
        .ok_or_else(|| Error::internal("a chunk number outside the index"))
}

/// The extents of `len` bytes at `offset` of an image of `size` bytes whose chunks
/// `index` lists: zero chunks are zero extents (never read), the others data.
pub(crate) fn index_extents(
    index: &FixedIndex,
    size: u64,
    offset: u64,
    len: u64,
) -> Result<Vec<Extent>> {
    let chunk_size = u64::from(index.chunk_size());
    let end = offset.saturating_add(len).min(size);
    let mut extents = Vec::new();
    let mut at = offset;
    while at < end {
        let i = (at / chunk_size) as usize;
        let (chunk_offset, chunk_len) = index.chunk_range(i);
        let stop = (chunk_offset + chunk_len).min(end);
        extents.push(if index_digest(index, i)?.is_zero() {
            Extent::zero(at, stop - at)
        } else {
            Extent::data(at, stop - at)
        });
        at = stop;
    }
    Ok(merge_extents(extents))
}
