//! [`backup`]: one image into the repository, full or incremental.
//!
//! Workers take chunk numbers from a shared cursor. For each chunk a worker first asks
//! the dirty bitmap (when there is one and a parent fits) whether the chunk changed: a
//! clean chunk takes the parent's digest and block digests and is not read. Otherwise it
//! asks the source for the chunk's extents: an all-zero chunk becomes the zero marker
//! without a read; else the data extents are read into the worker's buffer (zero extents
//! filled with zeroes), the block digests computed on a blocking thread, and the chunk
//! handed to the session, which uploads it only if the repository lacks it. A chunk
//! whose change digest ([`crate::change`]) equals the parent's is the parent's chunk: it
//! takes the parent's digest and block digests without being hashed with SHA-256.
//!
//! Write order: chunks, then the block digests, then (in [`Session::finish`]) the index
//! and the manifest, so an interrupted backup is never listed. Running it again uploads
//! nothing the first run stored (the repository deduplicates).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_backup::{
    block_digests_known_zero, BackupId, ChunkPut, Digest, FixedIndex, Manifest, Repository,
    Session, SessionOptions, SnapshotInfo,
};
use ferry_blkhash::Hash;
use ferry_core::{Caps, Error, ErrorKind, Extent, ExtentKind, IoBuf, Result, Source};
use ferry_engine::{CancellationToken, Progress};
use parking_lot::Mutex;
use tokio::task::JoinSet;

use crate::blocks::{self, BlockDigests};
use crate::change::{zero_blocks, ChangeDigest};
use crate::changed::{ChangedRanges, ChangedWindows};
use crate::hash::{blocks_in, ChunkBlocks, OrderedHash};
use crate::parent::{self, Chosen, Parent, ParentChoice};

/// Workers when the caller chose none.
pub const DEFAULT_WORKERS: usize = 8;
/// Largest read request when the source states no preference.
const DEFAULT_REQUEST: u64 = 4 << 20;
/// Chunks whose changes are asked for at once (1 GiB of 4 MiB chunks).
const CHANGED_WINDOW_CHUNKS: u64 = 256;

/// How to make a backup.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BackupOptions {
    /// The source's identity: backups are grouped by it (parent `auto`, pruning). A URL
    /// without secrets, or a name of the caller's choosing.
    pub source_id: String,
    pub parent: ParentChoice,
    pub tags: BTreeMap<String, String>,
    /// Chunks in flight at once (default [`DEFAULT_WORKERS`]).
    pub workers: usize,
    /// The source's changes since the parent (a dirty bitmap, or the CSI SnapshotMetadata
    /// service's delta): only changed chunks are read.
    pub changed: Option<Arc<dyn ChangedRanges>>,
    /// The storage snapshot the source is (a CSI snapshot handle), kept in the manifest.
    pub snapshot_id: Option<String>,
    pub session: SessionOptions,
}

impl BackupOptions {
    pub fn new(source_id: impl Into<String>) -> Self {
        Self {
            source_id: source_id.into(),
            parent: ParentChoice::Auto,
            tags: BTreeMap::new(),
            workers: DEFAULT_WORKERS,
            changed: None,
            snapshot_id: None,
            session: SessionOptions::default(),
        }
    }

    pub fn with_parent(mut self, parent: ParentChoice) -> Self {
        self.parent = parent;
        self
    }

    pub fn with_tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.insert(key.into(), value.into());
        self
    }

    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    pub fn with_changed(mut self, changed: Arc<dyn ChangedRanges>) -> Self {
        self.changed = Some(changed);
        self
    }

    pub fn with_snapshot_id(mut self, id: impl Into<String>) -> Self {
        self.snapshot_id = Some(id.into());
        self
    }

    pub fn with_session(mut self, session: SessionOptions) -> Self {
        self.session = session;
        self
    }
}

/// What a finished backup did.
#[derive(Debug, Clone)]
pub struct BackupReport {
    /// The stored manifest (id, sizes, counts, block hash).
    pub manifest: Manifest,
    /// Why the backup was made without a parent, when it was.
    pub full_reason: Option<String>,
    /// Bytes read from the source.
    pub bytes_read: u64,
    /// Chunks read from the source.
    pub chunks_read: u64,
    /// Chunks taken from the parent unread (clean in the dirty bitmap).
    pub chunks_unread: u64,
    /// Chunks read and found unchanged since the parent by their change digest (not
    /// hashed with SHA-256).
    pub chunks_unchanged: u64,
    pub elapsed: Duration,
}

/// What every worker shares.
struct Shared {
    session: Session,
    size: u64,
    chunk_size: u64,
    chunks: usize,
    cursor: AtomicUsize,
    /// The parent: chunks clean in `changed` are taken unread, and chunks read whose
    /// block digests equal the parent's take its digest.
    parent: Option<Parent>,
    changed: Option<ChangedWindows>,
    request: u64,
    minimum: u64,
    progress: Progress,
    stop: CancellationToken,
    state: Mutex<State>,
    bytes_read: AtomicU64,
    chunks_read: AtomicU64,
    chunks_unread: AtomicU64,
    chunks_unchanged: AtomicU64,
}

impl Shared {
    fn new(
        session: Session,
        index: FixedIndex,
        parent: Option<Parent>,
        options: &BackupOptions,
        caps: &Caps,
        progress: &Progress,
        cancel: &CancellationToken,
    ) -> Self {
        let size = index.image_size();
        let chunk_size = index.chunk_size();
        let chunks = index.len();
        let wanted = u64::from(caps.request_size.unwrap_or(0)).max(DEFAULT_REQUEST);
        Self {
            session,
            size,
            chunk_size: u64::from(chunk_size),
            chunks,
            cursor: AtomicUsize::new(0),
            changed: options
                .changed
                .clone()
                .filter(|_| parent.is_some())
                .map(|c| {
                    ChangedWindows::new(c, size, CHANGED_WINDOW_CHUNKS * u64::from(chunk_size))
                }),
            parent,
            request: ferry_engine::read_request_size(caps, wanted),
            minimum: u64::from(caps.block.minimum.max(1)),
            progress: progress.clone(),
            stop: cancel.child_token(),
            state: Mutex::new(State {
                index,
                blocks: BlockDigests::new(chunks),
                hash: OrderedHash::new(size, chunk_size),
            }),
            bytes_read: AtomicU64::new(0),
            chunks_read: AtomicU64::new(0),
            chunks_unread: AtomicU64::new(0),
            chunks_unchanged: AtomicU64::new(0),
        }
    }
}

struct State {
    index: FixedIndex,
    blocks: BlockDigests,
    hash: OrderedHash,
}

/// Backs `source` up into `repo`. `progress` counts image bytes done (chunks taken from
/// the parent unread count as zero bytes); `cancel` stops the backup (nothing is listed).
pub async fn backup(
    repo: &Repository,
    source: Arc<dyn Source>,
    options: &BackupOptions,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<BackupReport> {
    let started = Instant::now();
    if !source.size_known() {
        return Err(Error::unsupported(
            "the image's size is not known before it is read (a compressed stream that does \
             not record it), and a backup needs it: give it with --source-size, or count it \
             first with --prescan",
        )
        .with_endpoint(source.describe()));
    }
    let size = source.size();
    let index = FixedIndex::new(size, repo.chunk_size())?;
    let (parent, full_reason) = choose_parent(repo, options, size).await?;
    let parent_id = parent.as_ref().map(|p| p.manifest.id.clone());
    let caps = source.caps();
    let workers = if caps.sequential_read {
        1
    } else {
        options.workers.clamp(1, 1024)
    }
    .min(index.len().max(1));
    progress.start(size, 0);
    let session = match &parent {
        Some(p) => {
            repo.begin_incremental_session(options.session.clone(), &p.manifest.id, &p.index)
                .await?
        }
        None => repo.begin_session(options.session.clone()).await?,
    };
    let id = session.id().clone();
    tracing::info!(backup = %id, source = %options.source_id, size, workers, parent = ?parent_id, "backup started");
    let shared = Arc::new(Shared::new(
        session, index, parent, options, &caps, progress, cancel,
    ));
    let failure = run_workers(&shared, &source, workers).await;
    let Shared {
        session,
        state,
        bytes_read,
        chunks_read,
        chunks_unread,
        chunks_unchanged,
        ..
    } = Arc::try_unwrap(shared)
        .map_err(|_| Error::internal("a backup worker outlived the backup"))?;
    if let Some(err) = failure.or_else(|| cancel.is_cancelled().then(Error::cancelled)) {
        session.abandon().await;
        return Err(err);
    }
    let State {
        index,
        blocks,
        hash,
    } = state.into_inner();
    let manifest = finish(
        repo, session, &id, &index, &blocks, hash, options, parent_id,
    )
    .await?;
    let report = BackupReport {
        manifest,
        full_reason,
        bytes_read: bytes_read.into_inner(),
        chunks_read: chunks_read.into_inner(),
        chunks_unread: chunks_unread.into_inner(),
        chunks_unchanged: chunks_unchanged.into_inner(),
        elapsed: started.elapsed(),
    };
    tracing::info!(
        backup = %id,
        bytes_new = report.manifest.bytes_new,
        bytes_read = report.bytes_read,
        chunks_unread = report.chunks_unread,
        chunks_unchanged = report.chunks_unchanged,
        "backup finished"
    );
    Ok(report)
}

/// The parent an incremental backup builds on, or why the backup is a full one (logged,
/// as a warning when a changed-range source goes unused).
async fn choose_parent(
    repo: &Repository,
    options: &BackupOptions,
    size: u64,
) -> Result<(Option<Parent>, Option<String>)> {
    let chosen = parent::choose(repo, &options.parent, &options.source_id, size).await?;
    let reason = match chosen {
        Chosen::Parent(p) => return Ok((Some(*p), None)),
        Chosen::Full(reason) => reason,
    };
    match &options.changed {
        Some(changed) => tracing::warn!(
            source = %options.source_id,
            "full backup, the {} is not used: {reason}",
            changed.describe()
        ),
        None => tracing::info!(source = %options.source_id, "full backup: {reason}"),
    }
    Ok((None, Some(reason)))
}

/// Runs `workers` workers (each on its own connection of `source` but the first) until
/// every chunk is done or one fails; returns the first failure.
async fn run_workers(
    shared: &Arc<Shared>,
    source: &Arc<dyn Source>,
    workers: usize,
) -> Option<Error> {
    let mut set = JoinSet::new();
    for w in 0..workers {
        let (shared, source) = (Arc::clone(shared), Arc::clone(source));
        set.spawn(async move {
            let source = if w == 0 {
                source
            } else {
                source.connect().await?
            };
            let result = shared.work(source.as_ref()).await;
            if result.is_err() {
                shared.stop.cancel();
            }
            if w > 0 {
                let _ = source.close().await;
            }
            result
        });
    }
    join_all(&mut set, &shared.stop).await
}

/// Stores the block digests, then lets the session write the index and the manifest.
#[allow(clippy::too_many_arguments)]
async fn finish(
    repo: &Repository,
    session: Session,
    id: &BackupId,
    index: &FixedIndex,
    blocks: &BlockDigests,
    hash: OrderedHash,
    options: &BackupOptions,
    parent: Option<BackupId>,
) -> Result<Manifest> {
    let Some(block_hash) = hash.finish() else {
        session.abandon().await;
        return Err(Error::internal(
            "the backup ended with chunks missing from the block hash",
        ));
    };
    if let Err(err) = blocks::store(repo, id, index, blocks).await {
        session.abandon().await;
        return Err(err);
    }
    let mut info = SnapshotInfo::new(options.source_id.clone()).with_block_hash(block_hash);
    if let Some(parent) = parent {
        info = info.with_parent(parent);
    }
    for (k, v) in &options.tags {
        info = info.with_tag(k.clone(), v.clone());
    }
    if let Some(snapshot) = &options.snapshot_id {
        info = info.with_snapshot_id(snapshot.clone());
    }
    session.finish(index, info).await
}

/// Waits for every worker; the first real error (not a cancellation caused by it) wins.
pub(crate) async fn join_all(
    set: &mut JoinSet<Result<()>>,
    stop: &CancellationToken,
) -> Option<Error> {
    let mut first: Option<Error> = None;
    while let Some(joined) = set.join_next().await {
        let result = joined
            .map_err(|e| Error::internal(format!("a worker panicked: {e}")))
            .and_then(|r| r);
        if let Err(err) = result {
            stop.cancel();
            let replace = match &first {
                None => true,
                Some(f) => f.kind() == ErrorKind::Cancelled && err.kind() != ErrorKind::Cancelled,
            };
            if replace {
                first = Some(err);
            }
        }
    }
    first
}

impl Shared {
    /// One worker: chunks from the cursor until none are left.
    async fn work(&self, source: &dyn Source) -> Result<()> {
        let mut buf: Option<IoBuf> = None;
        loop {
            if self.stop.is_cancelled() {
                return Err(Error::cancelled());
            }
            let i = self.cursor.fetch_add(1, Ordering::Relaxed);
            if i >= self.chunks {
                return Ok(());
            }
            let offset = i as u64 * self.chunk_size;
            let len = self.chunk_size.min(self.size - offset);
            if let Some((digest, blocks, change)) = self.clean_in_parent(i, offset, len).await? {
                self.chunks_unread.fetch_add(1, Ordering::Relaxed);
                self.progress.add_zero(len);
                self.record(i, digest, blocks, change)?;
                continue;
            }
            let extents = extents_of(source, offset, len).await?;
            if extents.iter().all(|e| e.kind == ExtentKind::Zero) {
                self.progress.add_zero(len);
                self.record(i, Digest::ZERO, ChunkBlocks::Zero, None)?;
                continue;
            }
            let data = buf
                .take()
                .unwrap_or_else(|| IoBuf::new(self.chunk_size as usize));
            let (data, read, holes) = self.read_chunk(source, data, offset, len, &extents).await?;
            self.bytes_read.fetch_add(read, Ordering::Relaxed);
            self.chunks_read.fetch_add(1, Ordering::Relaxed);
            let repo = self.session.repository().clone();
            let parent = self.parent_chunk(i, len);
            let (data, hashed, holes) = tokio::task::spawn_blocking(move || {
                let hashed = hash_chunk(&repo, &data, &holes, parent);
                (data, hashed, holes)
            })
            .await
            .map_err(|_| Error::internal("a hashing thread panicked"))?;
            if hashed.unchanged {
                self.chunks_unchanged.fetch_add(1, Ordering::Relaxed);
            }
            let (put, data) = self
                .store(hashed.digest, data, &holes)
                .await
                .map_err(|e| e.at("store chunk", offset))?;
            buf = Some(data);
            self.progress.add_data(len);
            let blocks = if put.digest.is_zero() {
                ChunkBlocks::Zero
            } else {
                ChunkBlocks::Data(hashed.blocks)
            };
            self.record(i, put.digest, blocks, Some(hashed.change))?;
        }
    }

    /// Stores a hashed chunk unless the repository has it, zeroing its unfilled holes
    /// only when it must be stored.
    async fn store(
        &self,
        digest: Digest,
        data: IoBuf,
        holes: &[bool],
    ) -> Result<(ChunkPut, IoBuf)> {
        match self.session.lookup(&digest).await? {
            Some(put) => Ok((put, data)),
            None => {
                self.session
                    .store_hashed_chunk(digest, fill_holes(data, holes))
                    .await
            }
        }
    }

    /// A chunk the dirty bitmap says is clean, taken from the parent: its digest, block
    /// digests and change digest (if known). `None`: read it (changed, no bitmap, or the
    /// parent's chunk is missing).
    async fn clean_in_parent(
        &self,
        i: usize,
        offset: u64,
        len: u64,
    ) -> Result<Option<(Digest, ChunkBlocks, Option<ChangeDigest>)>> {
        let (Some(parent), Some(changed)) = (&self.parent, &self.changed) else {
            return Ok(None);
        };
        if changed.any_changed(offset, len).await? {
            return Ok(None);
        }
        let Some(digest) = parent.index.digest(i) else {
            return Ok(None);
        };
        if digest.is_zero() {
            return Ok(Some((digest, ChunkBlocks::Zero, None)));
        }
        let Some(blocks) = parent.blocks.get(i) else {
            return Ok(None);
        };
        if !self.session.reuse_chunk(&digest).await? {
            tracing::warn!(chunk = %digest, "a verify found a clean chunk of the parent missing or damaged: reading it");
            return Ok(None);
        }
        Ok(Some((
            digest,
            ChunkBlocks::Data(blocks.to_vec()),
            parent.blocks.change(i),
        )))
    }

    /// The parent's chunk `i`, when it has a data chunk of `len` bytes there.
    fn parent_chunk(&self, i: usize, len: u64) -> Option<ParentChunk> {
        let parent = self.parent.as_ref()?;
        let digest = parent.index.digest(i).filter(|d| !d.is_zero())?;
        let blocks = parent.blocks.get(i)?;
        (blocks.len() == blocks_in(len)).then(|| ParentChunk {
            digest,
            blocks: blocks.to_vec(),
            change: parent.blocks.change(i),
        })
    }

    fn record(
        &self,
        i: usize,
        digest: Digest,
        blocks: ChunkBlocks,
        change: Option<ChangeDigest>,
    ) -> Result<()> {
        let mut state = self.state.lock();
        state.index.set(i, digest)?;
        match &blocks {
            ChunkBlocks::Data(d) => state.blocks.set(i, d.clone(), change),
            ChunkBlocks::Zero => state.blocks.clear(i),
        }
        state.hash.add(i, blocks);
        Ok(())
    }

    /// Fills `buf` with the chunk at `offset`: data extents read (widened to the source's
    /// minimum block), zero extents as zeroes, except the whole 64 KiB blocks inside zero
    /// extents: those are left as they are and marked in the returned holes, since an
    /// unchanged chunk never needs them (see [`fill_holes`]). Returns the buffer viewing
    /// the chunk, the bytes read, and the holes.
    async fn read_chunk(
        &self,
        source: &dyn Source,
        mut buf: IoBuf,
        offset: u64,
        len: u64,
        extents: &[Extent],
    ) -> Result<(IoBuf, u64, Vec<bool>)> {
        let end = offset + len;
        let mut holes = vec![false; (len / BLOCK) as usize];
        for e in extents.iter().filter(|e| e.kind != ExtentKind::Data) {
            let (start, stop) = (e.offset - offset, e.end() - offset);
            let (first, last) = (start.div_ceil(BLOCK), stop / BLOCK);
            if first >= last {
                buf.set_view(start as usize, (stop - start) as usize);
                buf.fill(0);
                continue;
            }
            holes[first as usize..last as usize].fill(true);
            for (from, to) in [(start, first * BLOCK), (last * BLOCK, stop)] {
                if from < to {
                    buf.set_view(from as usize, (to - from) as usize);
                    buf.fill(0);
                }
            }
        }
        let mut read = 0;
        let mut done_to = offset;
        for e in extents.iter().filter(|e| e.kind == ExtentKind::Data) {
            let start = (e.offset / self.minimum * self.minimum).max(done_to);
            let stop = e
                .end()
                .div_ceil(self.minimum)
                .saturating_mul(self.minimum)
                .min(end);
            let mut at = start;
            while at < stop {
                let n = (stop - at).min(self.request);
                buf.set_view((at - offset) as usize, n as usize);
                buf = source.read_at(at, buf).await?;
                at += n;
                read += n;
            }
            done_to = done_to.max(stop);
        }
        buf.set_len(len as usize);
        Ok((buf, read, holes))
    }
}

/// The parent backup's data chunk at the place of a chunk being read.
struct ParentChunk {
    digest: Digest,
    blocks: Vec<Hash>,
    change: Option<ChangeDigest>,
}

/// A chunk read and hashed: its digest, block digests and change digest, and whether it
/// is the parent's chunk by its change digest.
struct Hashed {
    digest: Digest,
    blocks: Vec<Hash>,
    change: ChangeDigest,
    unchanged: bool,
}

/// Hashes a chunk whose full blocks `holes` marks were left unfilled. A chunk whose
/// change digest is the parent's takes the parent's digest and block digests; any other
/// is hashed block by block (and still takes the parent's digest when its block digests
/// turn out to be the parent's, as they do when the parent's change digest is unknown).
fn hash_chunk(
    repo: &Repository,
    data: &[u8],
    holes: &[bool],
    parent: Option<ParentChunk>,
) -> Hashed {
    let zero = zero_blocks(data, holes);
    let change = ChangeDigest::of(data, &zero);
    let parent = match parent {
        Some(p) if p.change == Some(change) => {
            return Hashed {
                digest: p.digest,
                blocks: p.blocks,
                change,
                unchanged: true,
            }
        }
        other => other,
    };
    let blocks = block_digests_known_zero(data, &zero);
    let digest = match parent {
        Some(p) if p.blocks == blocks => p.digest,
        _ => repo.chunk_digest_of_blocks(data.len(), &blocks),
    };
    Hashed {
        digest,
        blocks,
        change,
        unchanged: false,
    }
}

/// The block hash's block: holes are tracked in whole blocks.
const BLOCK: u64 = ferry_blkhash::BLOCK_SIZE as u64;

/// Zeroes the blocks [`Shared::read_chunk`] left unfilled, before a chunk is stored.
fn fill_holes(mut buf: IoBuf, holes: &[bool]) -> IoBuf {
    let block = BLOCK as usize;
    for (i, _) in holes.iter().enumerate().filter(|(_, hole)| **hole) {
        buf[i * block..(i + 1) * block].fill(0);
    }
    buf
}

/// The extents of `offset..offset + len`, asked until covered, merged.
async fn extents_of(source: &dyn Source, offset: u64, len: u64) -> Result<Vec<Extent>> {
    let end = offset + len;
    let mut out = Vec::new();
    let mut at = offset;
    while at < end {
        let got = source.extents(at, end - at).await?;
        let before = at;
        for e in got {
            let stop = e.end().min(end);
            if e.offset != at || stop <= at {
                break;
            }
            out.push(Extent {
                offset: at,
                len: stop - at,
                kind: e.kind,
            });
            at = stop;
        }
        if at == before {
            return Err(Error::protocol(format!(
                "{} reported no extent at offset {at}",
                source.describe()
            ))
            .at("extents", at));
        }
    }
    Ok(ferry_core::merge_extents(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_testkit::MemSource;

    #[tokio::test]
    async fn extents_cover_the_range_exactly() {
        let mut data = vec![0u8; 1 << 20];
        data[300_000] = 1;
        let source = MemSource::sparse(data, 4096).with_extent_limit(1);
        let extents = extents_of(&source, 100_000, 500_000).await.unwrap();
        assert_eq!(extents.first().unwrap().offset, 100_000);
        assert_eq!(extents.last().unwrap().end(), 600_000);
        assert!(extents.windows(2).all(|w| w[0].end() == w[1].offset));
        assert!(extents
            .iter()
            .any(|e| e.kind == ExtentKind::Data && e.offset <= 300_000 && e.end() > 300_000));
    }
}
