//! [`Session`]: one running backup. It stores and reuses chunks, keeps a heartbeat
//! record under `sessions/` so that garbage collection spares its chunks, and finishes
//! by writing the index and then the manifest.
//!
//! How a session stays safe from a concurrent GC is explained in [`crate::gc`]; in
//! short: its record tells GCs its start time, its `touch_older_than` and its parent;
//! chunks of the parent's index are reused without a request (GCs mark the parent's
//! index for it); other stored chunks it reuses are touched when older than
//! `touch_older_than`; and after writing its index it re-checks every reused chunk if a
//! GC ran meanwhile, before the manifest makes the backup exist.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use ferry_core::{Error, ErrorKind, Result};
use futures::stream::{self, StreamExt, TryStreamExt};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use crate::digest::Digest;
use crate::gc;
use crate::immutable::Immutability;
use crate::index::FixedIndex;
use crate::manifest::{now, BackupId, Manifest, SnapshotInfo};
use crate::repository::Repository;
use crate::store::{ObjectStore, PutMode};
use crate::verify;

/// How many store requests a session's checks run at once.
const PARALLEL_CHECKS: usize = 16;
/// A session record is small; anything larger is not one.
pub(crate) const MAX_SESSION_LEN: u64 = 64 << 10;

/// How a session behaves.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SessionOptions {
    /// Reused chunks last written or touched longer ago than this (by the store's clock,
    /// before the session started) are touched. GCs never sweep chunks younger than this
    /// before a running session's start, whatever their own grace period. Default 12 h
    /// (half the default GC grace period), so that a daily incremental backup touches
    /// each chunk about once a day.
    pub touch_older_than: Duration,
    /// How often the session record is rewritten (default 60 s).
    pub heartbeat: Duration,
    /// How long a session may go without a heartbeat before GCs consider it crashed
    /// (default 10 minutes).
    pub stale_after: Duration,
    /// How long finishing waits for a running GC to end (default 1 hour).
    pub gc_wait: Duration,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            touch_older_than: Duration::from_secs(12 * 3600),
            heartbeat: Duration::from_secs(60),
            stale_after: Duration::from_secs(600),
            gc_wait: Duration::from_secs(3600),
        }
    }
}

impl SessionOptions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_touch_older_than(mut self, age: Duration) -> Self {
        self.touch_older_than = age;
        self
    }

    pub fn with_heartbeat(mut self, every: Duration, stale_after: Duration) -> Self {
        self.heartbeat = every;
        self.stale_after = stale_after;
        self
    }

    pub fn with_gc_wait(mut self, wait: Duration) -> Self {
        self.gc_wait = wait;
        self
    }
}

/// The record under `sessions/<id>.json`, read by GCs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub id: BackupId,
    /// The store-clock time of the first write of this record.
    pub started: Option<DateTime<Utc>>,
    pub touch_older_than_secs: u64,
    pub stale_after_secs: u64,
    pub host: String,
    pub pid: u32,
    /// The backup whose index chunks this session reuses unchecked: GCs mark them.
    #[serde(default)]
    pub parent: Option<BackupId>,
}

/// What [`Session::put_chunk`] did with a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkOutcome {
    /// Uploaded by this call.
    New,
    /// Already stored: not uploaded again.
    Reused,
    /// All zeroes: not stored; the index records [`Digest::ZERO`].
    Zero,
}

/// The digest of a stored chunk and how it was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPut {
    pub digest: Digest,
    pub outcome: ChunkOutcome,
}

#[derive(Default)]
struct Chunks {
    new: HashSet<Digest>,
    reused: HashSet<Digest>,
}

/// A running backup: from [`Repository::begin_session`] to [`Session::finish`].
///
/// Methods take `&self`, so several workers may store chunks at once. Dropping a session
/// without finishing it abandons the backup: nothing is listed, and its chunks become
/// garbage for a later GC.
pub struct Session {
    repo: Repository,
    id: BackupId,
    time: DateTime<Utc>,
    started: SystemTime,
    touch_before: SystemTime,
    options: SessionOptions,
    bad: HashSet<Digest>,
    /// The parent's chunks (not marked bad): reused without asking the store.
    trusted: HashSet<Digest>,
    chunks: Mutex<Chunks>,
    heartbeat: Option<JoinHandle<()>>,
    /// Set when heartbeats failed for long enough that a GC may have taken the session
    /// for crashed.
    lapsed: Arc<AtomicBool>,
    /// An immutable repository's retention, and what the session knows of its chunks'.
    retention: Option<Retained>,
}

/// What a session on an immutable repository knows of its chunks' retention.
struct Retained {
    imm: Immutability,
    /// The parent manifest's `chunks_retained_until` (`None`: unknown).
    parent_until: Option<SystemTime>,
    /// The earliest retain-until of the chunks stored or checked so far.
    horizon: Mutex<Option<SystemTime>>,
}

impl Retained {
    fn note(&self, until: SystemTime) {
        let mut h = self.horizon.lock();
        *h = Some(h.map_or(until, |h| h.min(until)));
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("time", &self.time)
            .finish()
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

impl Repository {
    /// Starts a backup session: writes its record, learns the store's clock from it, and
    /// starts its heartbeat.
    pub async fn begin_session(&self, options: SessionOptions) -> Result<Session> {
        self.start_session(options, None, None).await
    }

    /// [`Repository::begin_session`] for an incremental backup of `parent`, whose index
    /// is `parent_index`: the session reuses the parent's chunks by digest without a
    /// request per chunk, trusting the index as Proxmox Backup Server trusts the previous
    /// snapshot's. Chunks a verify marked missing or damaged are not trusted. If the parent
    /// is removed as the session starts, its chunks are checked one by one instead.
    pub async fn begin_incremental_session(
        &self,
        options: SessionOptions,
        parent: &BackupId,
        parent_index: &FixedIndex,
    ) -> Result<Session> {
        self.start_session(options, Some((parent, parent_index)), None)
            .await
    }

    /// A session that writes a copy of another repository's backup `id`, taken at
    /// `time` (`ferry backup sync`): the copy keeps the backup's id and time.
    pub(crate) async fn begin_copy_session(
        &self,
        options: SessionOptions,
        id: &BackupId,
        time: DateTime<Utc>,
        parent: Option<(&BackupId, &FixedIndex)>,
    ) -> Result<Session> {
        self.start_session(options, parent, Some((id.clone(), time)))
            .await
    }

    async fn start_session(
        &self,
        options: SessionOptions,
        parent: Option<(&BackupId, &FixedIndex)>,
        copy_of: Option<(BackupId, DateTime<Utc>)>,
    ) -> Result<Session> {
        let (id, time) = match copy_of {
            Some(copy) => copy,
            None => {
                let time = now();
                (BackupId::generate(time)?, time)
            }
        };
        let stale_after = session_stale_after(&options);
        let store = Arc::clone(self.store());
        let mut record = SessionRecord {
            id: id.clone(),
            started: None,
            touch_older_than_secs: options.touch_older_than.as_secs(),
            stale_after_secs: stale_after.as_secs(),
            host: host_name(),
            pid: std::process::id(),
            parent: parent.map(|(id, _)| id.clone()),
        };
        let name = id.session_name();
        store
            .put(&name, Bytes::from(json(&record)), PutMode::Overwrite)
            .await?;
        // The record exists (naming the parent) before the parent's index is checked.
        let ((started, body), bad, parent_kept) = tokio::try_join!(
            stamp_record(store.as_ref(), &name, &mut record),
            verify::bad_chunks(store.as_ref()),
            parent_index_exists(store.as_ref(), parent.map(|(id, _)| id)),
        )?;
        let trusted = trusted_chunks(parent, parent_kept, &bad);
        let retention = match self.immutability() {
            None => None,
            Some(imm) => {
                self.extend_repository_retention().await?;
                let parent_until = match parent {
                    Some((id, _)) if !trusted.is_empty() => match self.load_manifest(id).await {
                        Ok(m) => m.chunks_retained_until.map(SystemTime::from),
                        Err(e) if e.kind() == ErrorKind::NotFound => None,
                        Err(e) => return Err(e),
                    },
                    _ => None,
                };
                Some(Retained {
                    imm: *imm,
                    parent_until,
                    horizon: Mutex::new(None),
                })
            }
        };
        let lapsed = Arc::new(AtomicBool::new(false));
        let heartbeat = tokio::spawn(beat(
            Arc::clone(&store),
            name,
            body,
            options.heartbeat,
            stale_after,
            Arc::clone(&lapsed),
        ));
        tracing::info!(backup = %id, repository = %store.location(), "backup session started");
        Ok(Session {
            repo: self.clone(),
            id,
            time,
            started,
            touch_before: started
                .checked_sub(options.touch_older_than)
                .unwrap_or(SystemTime::UNIX_EPOCH),
            options,
            bad,
            trusted,
            chunks: Mutex::new(Chunks::default()),
            heartbeat: Some(heartbeat),
            lapsed,
            retention,
        })
    }
}

/// How long a session may go without a heartbeat before GCs consider it crashed: a GC
/// must not take a live session for crashed between two heartbeats.
fn session_stale_after(options: &SessionOptions) -> Duration {
    options
        .stale_after
        .max(options.heartbeat * 3)
        .max(Duration::from_secs(1))
}

/// Rewrites the session record `name` with its start time, read from the store's clock
/// (the first write's modification time). Returns that time and the record's body.
async fn stamp_record(
    store: &dyn ObjectStore,
    name: &str,
    record: &mut SessionRecord,
) -> Result<(SystemTime, Bytes)> {
    let started = store
        .head(name)
        .await?
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Io,
                format!("the session record {name} vanished after it was written"),
            )
        })?
        .modified;
    record.started = Some(DateTime::<Utc>::from(started));
    let body = Bytes::from(json(record));
    store.put(name, body.clone(), PutMode::Overwrite).await?;
    Ok((started, body))
}

/// Whether the index of the parent backup (if any) is still stored.
async fn parent_index_exists(store: &dyn ObjectStore, parent: Option<&BackupId>) -> Result<bool> {
    match parent {
        Some(id) => Ok(store.head(&id.index_name()).await?.is_some()),
        None => Ok(false),
    }
}

/// The parent's chunks a session reuses without asking the store: none if the parent's
/// index is gone, and never one marked bad.
fn trusted_chunks(
    parent: Option<(&BackupId, &FixedIndex)>,
    parent_kept: bool,
    bad: &HashSet<Digest>,
) -> HashSet<Digest> {
    match parent {
        // GCs that list this record mark the parent's index while it exists; checking
        // that it still exists after the record was written closes the gap before.
        Some((_, index)) if parent_kept => index
            .digests()
            .iter()
            .filter(|d| !d.is_zero() && !bad.contains(d))
            .copied()
            .collect(),
        Some((id, _)) => {
            tracing::warn!(backup = %id, "the parent backup was removed as this one started: its chunks are checked one by one");
            HashSet::new()
        }
        None => HashSet::new(),
    }
}

fn json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

async fn beat(
    store: Arc<dyn ObjectStore>,
    name: String,
    body: Bytes,
    every: Duration,
    stale_after: Duration,
    lapsed: Arc<AtomicBool>,
) {
    let every = every.max(Duration::from_millis(100));
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(every).await;
        match store.put(&name, body.clone(), PutMode::Overwrite).await {
            Ok(_) => last_ok = Instant::now(),
            Err(err) => {
                tracing::warn!(session = %name, error = %err, "backup session heartbeat failed")
            }
        }
        if last_ok.elapsed() >= stale_after / 2 {
            lapsed.store(true, Ordering::SeqCst);
        }
    }
}

impl Session {
    /// The id the backup will have.
    pub fn id(&self) -> &BackupId {
        &self.id
    }

    /// The repository this session writes to.
    pub fn repository(&self) -> &Repository {
        &self.repo
    }

    /// Stores one chunk of the image (1 byte up to the chunk size; only the last chunk of
    /// an image may be short) unless it is already stored. The digest is computed here.
    pub async fn put_chunk(&self, data: &[u8]) -> Result<ChunkPut> {
        self.check_len(data.len())?;
        let digest = self.repo.chunk_digest(data);
        if let Some(put) = self.lookup(&digest).await? {
            return Ok(put);
        }
        let blob = self.repo.encode_chunk(data)?;
        self.store_new(digest, blob).await
    }

    /// [`Session::put_chunk`] for a caller that hashed the chunk itself (`digest` must be
    /// [`Repository::chunk_digest`] of `data`, computed off the async threads) and owns
    /// its buffer: compressing and encrypting a new chunk runs on a blocking thread, so
    /// that the async threads keep other reads and uploads moving. The buffer comes back.
    pub async fn put_hashed_chunk<B>(&self, digest: Digest, data: B) -> Result<(ChunkPut, B)>
    where
        B: std::ops::Deref<Target = [u8]> + Send + 'static,
    {
        self.check_len(data.len())?;
        match self.lookup(&digest).await? {
            Some(put) => Ok((put, data)),
            None => self.store_hashed_chunk(digest, data).await,
        }
    }

    /// The second half of [`Session::put_hashed_chunk`]: encodes and uploads a chunk that
    /// [`Session::lookup`] found missing.
    pub async fn store_hashed_chunk<B>(&self, digest: Digest, data: B) -> Result<(ChunkPut, B)>
    where
        B: std::ops::Deref<Target = [u8]> + Send + 'static,
    {
        self.check_len(data.len())?;
        debug_assert_eq!(digest, self.repo.chunk_digest(&data));
        let repo = self.repo.clone();
        let (blob, data) = tokio::task::spawn_blocking(move || (repo.encode_chunk(&data), data))
            .await
            .map_err(|_| Error::internal("a chunk encoding thread panicked"))?;
        Ok((self.store_new(digest, blob?).await?, data))
    }

    fn check_len(&self, len: usize) -> Result<()> {
        if len == 0 || len as u64 > u64::from(self.repo.chunk_size()) {
            return Err(Error::invalid_input(format!(
                "a chunk of {len} bytes: chunks hold 1 to {} bytes",
                self.repo.chunk_size()
            )));
        }
        Ok(())
    }

    /// The first half of [`Session::put_hashed_chunk`], for a caller that prepares the
    /// chunk's data only when it must be stored: `Some` when a chunk with this digest
    /// needs no upload (all zeroes, or stored already, and then recorded as reused).
    pub async fn lookup(&self, digest: &Digest) -> Result<Option<ChunkPut>> {
        let outcome = if digest.is_zero() {
            ChunkOutcome::Zero
        } else if self.known(digest)
            || self.reuse_trusted(digest)
            || (!self.bad.contains(digest) && self.reuse_stored(digest).await?)
        {
            ChunkOutcome::Reused
        } else {
            return Ok(None);
        };
        Ok(Some(ChunkPut {
            digest: *digest,
            outcome,
        }))
    }

    /// Stores a chunk already encoded for this repository (a blob copied from a
    /// repository with the same keys, checked against `digest` by the caller), which
    /// [`Session::lookup`] found missing.
    pub(crate) async fn store_encoded(&self, digest: Digest, blob: Vec<u8>) -> Result<ChunkPut> {
        self.store_new(digest, blob).await
    }

    async fn store_new(&self, digest: Digest, blob: Vec<u8>) -> Result<ChunkPut> {
        self.repo.store_blob(&digest, blob).await?;
        if let Some(r) = &self.retention {
            // Written after the session started, with the chunks' retention.
            r.note(r.imm.extended(self.started));
        }
        if self.bad.contains(&digest) {
            self.repo.store().delete(&digest.bad_name()).await?;
        }
        self.chunks.lock().new.insert(digest);
        Ok(ChunkPut {
            digest,
            outcome: ChunkOutcome::New,
        })
    }

    /// Reuses a stored chunk by digest without its data (an incremental backup's
    /// unchanged chunk, from the parent's index). `false` means it is missing or marked
    /// damaged: read the data and [`Session::put_chunk`] it.
    pub async fn reuse_chunk(&self, digest: &Digest) -> Result<bool> {
        if digest.is_zero() || self.known(digest) || self.reuse_trusted(digest) {
            return Ok(true);
        }
        if self.bad.contains(digest) {
            return Ok(false);
        }
        self.reuse_stored(digest).await
    }

    fn known(&self, digest: &Digest) -> bool {
        let chunks = self.chunks.lock();
        chunks.new.contains(digest) || chunks.reused.contains(digest)
    }

    /// Records a chunk of the parent's index as reused, without a request.
    fn reuse_trusted(&self, digest: &Digest) -> bool {
        let trusted = self.trusted.contains(digest);
        if trusted {
            self.chunks.lock().reused.insert(*digest);
        }
        trusted
    }

    /// Heads a stored chunk, touches it if old, records it as reused.
    async fn reuse_stored(&self, digest: &Digest) -> Result<bool> {
        let name = digest.chunk_name();
        let store = self.repo.store();
        let Some(meta) = store.head(&name).await? else {
            return Ok(false);
        };
        if let Some(r) = &self.retention {
            // Retention, not the modification time, keeps it from GCs (see crate::immutable).
            match meta.retain_until {
                Some(until) if until >= r.imm.needed(self.started) => r.note(until),
                _ => {
                    let now = SystemTime::now();
                    if !store.extend_retention(&name, r.imm.extended(now)).await? {
                        return Ok(false);
                    }
                    r.note(r.imm.extended(self.started));
                }
            }
        } else if meta.modified < self.touch_before {
            match store.touch(&name).await {
                Ok(()) => {}
                // Removed between the head and the touch: store it again.
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        self.chunks.lock().reused.insert(*digest);
        Ok(true)
    }

    /// Finishes the backup: checks that every chunk of `index` was stored or reused by
    /// this session, re-checks reused chunks if a GC ran meanwhile, writes the index,
    /// then the manifest, and ends the session.
    pub async fn finish(mut self, index: &FixedIndex, info: SnapshotInfo) -> Result<Manifest> {
        if index.chunk_size() != self.repo.chunk_size() {
            return Err(Error::invalid_input(format!(
                "the index uses {}-byte chunks but the repository {}-byte chunks",
                index.chunk_size(),
                self.repo.chunk_size()
            )));
        }
        let (new, reused) = {
            let chunks = self.chunks.lock();
            (chunks.new.clone(), chunks.reused.clone())
        };
        if let Some(stray) = index
            .digests()
            .iter()
            .find(|d| !d.is_zero() && !new.contains(d) && !reused.contains(d))
        {
            return Err(Error::invalid_input(format!(
                "the index names chunk {stray}, which this session neither stored nor reused"
            )));
        }
        self.extend_trusted(&reused).await?;
        // Every chunk the index names must be durable before the index is.
        self.repo.store().persist().await?;
        let index_sha256 = self.repo.store_index(&self.id, index).await?;
        // From here on every GC marks this index; one that ran before may have swept
        // what the session reused, so that is checked before the manifest is written.
        if let Err(err) = self.check_after_gc(&new, &reused).await {
            if let Err(e) = self.repo.store().delete(&self.id.index_name()).await {
                tracing::warn!(backup = %self.id, error = %e, "cannot remove the index of a failed backup; a GC removes it");
            }
            return Err(err);
        }
        let mut manifest = Manifest {
            id: self.id.clone(),
            time: self.time,
            image_size: index.image_size(),
            chunk_size: index.chunk_size(),
            source: info.source,
            parent: info.parent,
            tags: info.tags,
            block_hash: info.block_hash,
            snapshot_id: info.snapshot_id,
            bytes_new: 0,
            bytes_reused: 0,
            bytes_zero: 0,
            chunks_new: 0,
            chunks_reused: 0,
            chunks_zero: 0,
            index_sha256,
            ferry_version: env!("CARGO_PKG_VERSION").to_string(),
            master_key: self.repo.current_master_key().map(String::from),
            chunks_retained_until: self
                .retention
                .as_ref()
                .and_then(|r| *r.horizon.lock())
                .map(DateTime::<Utc>::from),
        };
        let mut seen = HashSet::new();
        for (i, digest) in index.digests().iter().enumerate() {
            let (_, len) = index.chunk_range(i);
            if digest.is_zero() {
                manifest.bytes_zero += len;
                manifest.chunks_zero += 1;
            } else if new.contains(digest) && seen.insert(*digest) {
                manifest.bytes_new += len;
                manifest.chunks_new += 1;
            } else {
                manifest.bytes_reused += len;
                manifest.chunks_reused += 1;
            }
        }
        self.repo.store_manifest(&manifest).await?;
        self.end().await;
        tracing::info!(backup = %manifest.id, bytes_new = manifest.bytes_new, bytes_reused = manifest.bytes_reused, "backup finished");
        Ok(manifest)
    }

    /// On an immutable repository, makes the parent's chunks this backup reused without
    /// a request retained as long as this backup: nothing to do while the parent
    /// manifest's `chunks_retained_until` reaches far enough; else one
    /// PutObjectRetention per such chunk, [`PARALLEL_CHECKS`] at a time.
    async fn extend_trusted(&self, reused: &HashSet<Digest>) -> Result<()> {
        let Some(r) = &self.retention else {
            return Ok(());
        };
        let trusted: Vec<Digest> = reused
            .iter()
            .filter(|d| self.trusted.contains(d))
            .copied()
            .collect();
        if trusted.is_empty() {
            return Ok(());
        }
        if let Some(until) = r.parent_until.filter(|&u| u >= r.imm.needed(self.started)) {
            r.note(until);
            return Ok(());
        }
        let store = self.repo.store();
        let until = r.imm.extended(SystemTime::now());
        let missing: Vec<Digest> = stream::iter(trusted.iter().copied())
            .map(|d| async move {
                store
                    .extend_retention(&d.chunk_name(), until)
                    .await
                    .map(|found| (d, !found))
            })
            .buffer_unordered(PARALLEL_CHECKS)
            .try_filter_map(|(d, gone)| async move { Ok(gone.then_some(d)) })
            .try_collect()
            .await?;
        if let Some(first) = missing.first() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "{} chunk(s) of the parent backup (first {first}) are missing; the backup was not written: run `ferry backup verify`, then the backup again",
                    missing.len()
                ),
            ));
        }
        tracing::info!(backup = %self.id, chunks = trusted.len(), "extended the retention of the parent's chunks");
        r.note(r.imm.extended(self.started));
        Ok(())
    }

    /// Ends the session without a backup: nothing is listed, and the chunks it stored
    /// become garbage for a later GC.
    pub async fn abandon(mut self) {
        self.end().await;
    }

    async fn end(&mut self) {
        if let Some(task) = self.heartbeat.take() {
            task.abort();
            let _ = task.await;
        }
        if let Err(err) = self.repo.store().delete(&self.id.session_name()).await {
            tracing::warn!(backup = %self.id, error = %err, "cannot remove the backup session record; GCs ignore it once stale");
        }
    }

    /// If a GC ran since the session started, checks that the chunks it may have swept
    /// are still stored.
    async fn check_after_gc(&self, new: &HashSet<Digest>, reused: &HashSet<Digest>) -> Result<()> {
        if !self.gc_ran().await? {
            return Ok(());
        }
        // Chunks this session uploaded are safe from a GC that saw the session; one that
        // took it for crashed (heartbeats failed) may have removed them too.
        if self.lapsed.load(Ordering::SeqCst) {
            self.recheck(&reused.union(new).copied().collect()).await
        } else {
            self.recheck(reused).await
        }
    }

    /// Whether a GC ran (or runs) since this session started: waits for a running one to
    /// end first, so that nothing is swept after the re-check.
    async fn gc_ran(&self) -> Result<bool> {
        let store = self.repo.store();
        let deadline = tokio::time::Instant::now() + self.options.gc_wait;
        let mut ran = false;
        loop {
            match gc::current_lease(store.as_ref()).await? {
                Some(lease) if !lease.is_stale() => {
                    ran = true;
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Error::new(
                            ErrorKind::Timeout,
                            format!(
                                "a garbage collection by {} has been running for longer than the session waits ({} s): finish the backup later",
                                lease.holder,
                                self.options.gc_wait.as_secs()
                            ),
                        ));
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Some(_) => return Ok(true),
                None => break,
            }
        }
        Ok(ran
            || gc::last_run(store.as_ref())
                .await?
                .is_some_and(|t| t >= self.started))
    }

    async fn recheck(&self, reused: &HashSet<Digest>) -> Result<()> {
        let store = self.repo.store();
        let missing: Vec<Digest> = stream::iter(reused.iter().copied())
            .map(|d| async move { store.head(&d.chunk_name()).await.map(|m| (d, m.is_none())) })
            .buffer_unordered(PARALLEL_CHECKS)
            .try_filter_map(|(d, gone)| async move { Ok(gone.then_some(d)) })
            .try_collect()
            .await?;
        if let Some(first) = missing.first() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "{} chunk(s) this backup needs (first {first}) were removed by a garbage collection that ran during the backup; the backup was not written: run it again",
                    missing.len()
                ),
            ));
        }
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let Some(task) = self.heartbeat.take() else {
            return;
        };
        task.abort();
        let store = Arc::clone(self.repo.store());
        let name = self.id.session_name();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = task.await;
                let _ = store.delete(&name).await;
            });
        }
    }
}
