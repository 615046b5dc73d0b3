//! A bounded cache of decoded chunks, for readers that come back to the same chunks: the
//! clients of a backup served over NBD ([`crate::BackupImage`]), and a restore running
//! beside them (a live restore), which takes a chunk a client already read from here
//! instead of fetching it again.
//!
//! A restore alone never needs this: it reads every chunk once, in order. A VM or an NBD
//! client does not: it reads a chunk in many small requests (nbdcopy's 256 KiB, a guest's
//! 4 KiB), at random, and again. Each chunk costs a GET and a decode, so the decoded
//! chunks are kept, least recently used first out, up to a byte bound; a chunk several
//! readers want at once is fetched once (the later readers wait for the first fetch).
//!
//! Every chunk is checked against its name when it is decoded, before it enters the cache,
//! and keeps its 64 KiB block digests, so a restore that takes it from here still computes
//! the image's block hash from plaintext that was checked.
//!
//! Memory: at most `capacity` bytes of decoded chunks are kept; beyond that, the chunks
//! being fetched (each a blob and its plaintext, about twice the chunk size), which the
//! callers bound: the NBD server's requests in flight and the read-ahead window, and up
//! to 8 spare plaintext and 8 spare blob buffers (fewer when `capacity` holds fewer
//! chunks).
//!
//! Buffers are reused: a chunk evicted that no reader holds any more gives its plaintext
//! buffer to the next fetch, and every fetch gives its blob buffer back. A fresh 4 MiB
//! buffer per chunk costs its page faults and its zeroing every time (ferry's allocator
//! maps buffers that large and unmaps them when freed): a quarter of the export's CPU
//! time under nbdcopy before they were reused.

use std::collections::HashMap;
use std::sync::Arc;

use ferry_backup::{Digest, Repository};
use ferry_blkhash::Hash;
use ferry_core::{Error, ErrorKind, Result};
use futures::future::{BoxFuture, FutureExt, Shared};
use lru::LruCache;
use parking_lot::Mutex;

/// The default bound of the cache: 128 MiB (32 chunks of the default 4 MiB).
pub const DEFAULT_CACHE_BYTES: u64 = 128 * 1024 * 1024;
/// Spare buffers kept for reuse, of each kind (plaintexts, blobs).
const SPARE: usize = 8;

/// A chunk as decoded and checked: its plaintext and its 64 KiB block digests.
#[derive(Debug)]
pub struct CachedChunk {
    pub(crate) data: Vec<u8>,
    pub(crate) blocks: Vec<Hash>,
}

/// A failed fetch, handed to every reader that waited for it (an [`Error`] is not `Clone`).
#[derive(Debug, Clone)]
struct Failure {
    kind: ErrorKind,
    message: String,
}

impl From<Failure> for Error {
    fn from(f: Failure) -> Self {
        Error::new(f.kind, f.message)
    }
}

type Loading = Shared<BoxFuture<'static, std::result::Result<Arc<CachedChunk>, Failure>>>;

struct State {
    lru: LruCache<Digest, Arc<CachedChunk>>,
    /// Bytes of plaintext in `lru`.
    bytes: u64,
    /// Chunks being fetched, shared by every reader that asks for one meanwhile.
    loading: HashMap<Digest, Loading>,
    hits: u64,
    misses: u64,
    /// Plaintext buffers of evicted chunks, for the next fetches.
    spare_plain: Vec<Vec<u8>>,
    /// Blob buffers of finished fetches.
    spare_blobs: Vec<Vec<u8>>,
    /// Spare buffers kept of each kind: [`SPARE`], or fewer for a small cache (the spares
    /// are memory the cache's bound does not count).
    spare_limit: usize,
}

impl State {
    /// Keeps `buf` for reuse unless enough are kept.
    fn spare(list: &mut Vec<Vec<u8>>, limit: usize, buf: Vec<u8>) {
        if list.len() < limit && buf.capacity() > 0 {
            list.push(buf);
        }
    }
}

/// Decoded chunks of one repository, least recently used evicted first beyond a byte
/// bound. Shared (`Arc`) by every reader of the repository's backups in one process.
pub struct ChunkCache {
    repo: Repository,
    capacity: u64,
    state: Mutex<State>,
}

impl std::fmt::Debug for ChunkCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock();
        f.debug_struct("ChunkCache")
            .field("capacity", &self.capacity)
            .field("bytes", &state.bytes)
            .field("chunks", &state.lru.len())
            .field("loading", &state.loading.len())
            .finish_non_exhaustive()
    }
}

/// How a cache did: chunks taken from it and chunks fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Plaintext bytes held now.
    pub bytes: u64,
}

impl ChunkCache {
    /// A cache of at most `capacity` bytes of decoded chunks of `repo`.
    pub fn new(repo: Repository, capacity: u64) -> Arc<Self> {
        let repo_chunk = repo.chunk_size();
        Arc::new(Self {
            repo,
            capacity,
            state: Mutex::new(State {
                lru: LruCache::unbounded(),
                bytes: 0,
                loading: HashMap::new(),
                hits: 0,
                misses: 0,
                spare_plain: Vec::new(),
                spare_blobs: Vec::new(),
                spare_limit: SPARE
                    .min(usize::try_from(capacity / u64::from(repo_chunk.max(1))).unwrap_or(SPARE)),
            }),
        })
    }

    pub fn repository(&self) -> &Repository {
        &self.repo
    }

    /// The bound, in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn stats(&self) -> CacheStats {
        let state = self.state.lock();
        CacheStats {
            hits: state.hits,
            misses: state.misses,
            bytes: state.bytes,
        }
    }

    /// The chunk if it is cached now (never fetches; a cached chunk becomes the most
    /// recently used).
    pub fn cached(&self, digest: &Digest) -> Option<Arc<CachedChunk>> {
        let mut state = self.state.lock();
        let found = state.lru.get(digest).cloned();
        if found.is_some() {
            state.hits += 1;
        }
        found
    }

    /// Whether the chunk is cached or being fetched.
    pub fn holds(&self, digest: &Digest) -> bool {
        let state = self.state.lock();
        state.lru.contains(digest) || state.loading.contains_key(digest)
    }

    /// The chunk named `digest`, `len` bytes long: from the cache, from a fetch already
    /// running, or fetched, decoded and checked now. The fetch runs on its own task: a
    /// reader that gives up does not stop it for the others (nor the cache's copy).
    pub async fn get(self: &Arc<Self>, digest: Digest, len: u64) -> Result<Arc<CachedChunk>> {
        let loading = {
            let mut state = self.state.lock();
            if let Some(chunk) = state.lru.get(&digest).cloned() {
                state.hits += 1;
                return Ok(chunk);
            }
            self.loading(&mut state, digest, len)
        };
        loading.await.map_err(Error::from)
    }

    /// Starts fetching the chunk unless it is cached or on its way; the returned future
    /// (None when nothing was started) completes when it is in.
    pub fn prefetch(
        self: &Arc<Self>,
        digest: Digest,
        len: u64,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let mut state = self.state.lock();
        if state.lru.contains(&digest) || state.loading.contains_key(&digest) {
            return None;
        }
        let loading = self.loading(&mut state, digest, len);
        Some(loading.map(|_| ()))
    }

    /// The running fetch of `digest`, started if there is none. Called with the state
    /// locked, so that a fetch that completes meanwhile cannot be missed.
    fn loading(self: &Arc<Self>, state: &mut State, digest: Digest, len: u64) -> Loading {
        if let Some(loading) = state.loading.get(&digest) {
            return loading.clone();
        }
        state.misses += 1;
        let cache = self.clone();
        let task = tokio::spawn(async move {
            let loaded = cache.load(digest, len).await;
            let mut state = cache.state.lock();
            state.loading.remove(&digest);
            let chunk = loaded.map_err(|e| Failure {
                kind: e.kind(),
                message: e.message().to_string(),
            })?;
            cache.insert(&mut state, digest, chunk.clone());
            Ok(chunk)
        });
        let loading = async move {
            task.await.unwrap_or_else(|_| {
                Err(Failure {
                    kind: ErrorKind::Internal,
                    message: "a chunk fetch was stopped".into(),
                })
            })
        }
        .boxed()
        .shared();
        state.loading.insert(digest, loading.clone());
        loading
    }

    /// Adds a chunk, evicting the least recently used beyond the bound (their buffers
    /// kept for reuse when no reader holds them).
    fn insert(&self, state: &mut State, digest: Digest, chunk: Arc<CachedChunk>) {
        let len = chunk.data.len() as u64;
        let mut evicted = state.lru.put(digest, chunk);
        state.bytes += len;
        loop {
            if let Some(old) = evicted.take() {
                state.bytes -= old.data.len() as u64;
                if let Ok(old) = Arc::try_unwrap(old) {
                    let limit = state.spare_limit;
                    State::spare(&mut state.spare_plain, limit, old.data);
                }
            }
            if state.bytes <= self.capacity {
                break;
            }
            match state.lru.pop_lru() {
                Some((_, old)) => evicted = Some(old),
                None => break,
            }
        }
    }

    /// Fetches, decodes and checks one chunk (decoding off the async threads), into
    /// spare buffers when there are.
    async fn load(&self, digest: Digest, len: u64) -> Result<Arc<CachedChunk>> {
        let (blob, data) = {
            let mut state = self.state.lock();
            (state.spare_blobs.pop(), state.spare_plain.pop())
        };
        let blob = self
            .repo
            .fetch_chunk_into(&digest, blob.unwrap_or_default())
            .await?;
        let repo = self.repo.clone();
        let (blob, chunk) = tokio::task::spawn_blocking(move || {
            let mut data = data.unwrap_or_default();
            // A spare buffer's bytes are overwritten by the decoding: only a buffer
            // shorter than a chunk is grown (and zeroed where it grows).
            data.resize(repo.chunk_size() as usize, 0);
            let chunk = repo
                .open_chunk(&digest, &blob, &mut data)
                .and_then(|(got, blocks)| {
                    if got as u64 != len {
                        return Err(Error::new(
                            ErrorKind::Corrupt,
                            format!("chunk {digest} holds {got} bytes, the index says {len}"),
                        ));
                    }
                    data.truncate(got);
                    Ok(Arc::new(CachedChunk { data, blocks }))
                });
            (blob, chunk)
        })
        .await
        .map_err(|_| Error::internal("a chunk decoding thread panicked"))?;
        let mut state = self.state.lock();
        let limit = state.spare_limit;
        State::spare(&mut state.spare_blobs, limit, blob);
        drop(state);
        chunk
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_backup::{InitOptions, LocalStore, SessionOptions};

    const CHUNK: u32 = 64 << 10;

    /// A repository with three stored chunks (each of one byte value).
    async fn repo_with_chunks(dir: &std::path::Path) -> (Repository, Vec<Digest>) {
        let store = Arc::new(LocalStore::new(dir));
        let repo = Repository::init(store, InitOptions::new().with_chunk_size(CHUNK))
            .await
            .unwrap();
        let session = repo.begin_session(SessionOptions::new()).await.unwrap();
        let mut digests = Vec::new();
        for b in 1..=3u8 {
            digests.push(
                session
                    .put_chunk(&vec![b; CHUNK as usize])
                    .await
                    .unwrap()
                    .digest,
            );
        }
        session.abandon().await;
        (repo, digests)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_share_one_fetch_and_the_bound_evicts_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, d) = repo_with_chunks(dir.path()).await;
        let cache = ChunkCache::new(repo, 2 * u64::from(CHUNK));
        let len = u64::from(CHUNK);
        let (a, b) = tokio::join!(cache.get(d[0], len), cache.get(d[0], len));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(Arc::ptr_eq(&a, &b), "two fetches of one chunk");
        assert!(a.data.iter().all(|&x| x == 1));
        assert_eq!(cache.stats().misses, 1);
        cache.get(d[1], len).await.unwrap();
        cache.get(d[2], len).await.unwrap();
        // Two chunks fit: the first one read is out, the others in.
        assert!(cache.cached(&d[0]).is_none());
        assert!(cache.cached(&d[1]).is_some() && cache.cached(&d[2]).is_some());
        assert_eq!(cache.stats().bytes, 2 * len);
        cache.get(d[0], len).await.unwrap();
        assert_eq!(cache.stats().misses, 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_damaged_or_missing_chunk_fails_every_reader_and_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, d) = repo_with_chunks(dir.path()).await;
        let path = dir.path().join(d[0].chunk_name());
        let mut blob = std::fs::read(&path).unwrap();
        let last = blob.len() - 1;
        blob[last] ^= 0xff;
        std::fs::write(&path, &blob).unwrap();
        let cache = ChunkCache::new(repo, 8 * u64::from(CHUNK));
        let len = u64::from(CHUNK);
        let (a, b) = tokio::join!(cache.get(d[0], len), cache.get(d[0], len));
        for e in [a.unwrap_err(), b.unwrap_err()] {
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        }
        assert!(!cache.holds(&d[0]));
        // A wrong length from the index is refused too.
        let e = cache.get(d[1], len - 1).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        std::fs::remove_file(dir.path().join(d[2].chunk_name())).unwrap();
        let e = cache.get(d[2], len).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        assert_eq!(cache.stats().bytes, 0);
    }
}
