//! Garbage collection: removes chunks no backup references, without ever removing one
//! that a running or finishing backup needs.
//!
//! # The lease
//! One GC at a time holds `locks/gc` (holder, start, expiry). It is created create-only;
//! a lease past its expiry (a crashed GC) is taken over by replacing exactly the stale
//! version read (S3 `If-Match`, a rename check on disk), so of two GCs racing for a
//! stale lease one wins. The holder renews it every third of its lifetime and stops
//! before deleting anything once a renewal shows the lease was lost. At the end, the GC
//! writes `locks/gc-last` and removes the lease. A GC whose holder names one run that
//! can restart (a service's job) takes over its own earlier run's lease at once.
//!
//! # What is swept
//! A chunk is removed only if (1) no index lists it, and (2) it was last written or
//! touched before the cutoff
//!
//! ```text
//! cutoff = min( GC start - grace,
//!               for every running session S: S.start - max(grace, S.touch_older_than) )
//! ```
//!
//! with every time taken from the store's clock (the lease's and session records'
//! modification times), never from a host's. Indexes without a manifest (crashed
//! backups) older than the cutoff are removed first, so their chunks become garbage.
//!
//! # Why a running backup is safe (the reasoning of Proxmox Backup Server's GC)
//! A backup writes chunks, then its index, then its manifest. Until its index is written,
//! its chunks are referenced by nothing, so they must be protected otherwise:
//!
//! - A chunk the session uploads is written after the session started, so it is younger
//!   than any cutoff that counts the session.
//! - A chunk of its parent's index (an incremental backup) is reused without a request:
//!   the session record names the parent, and a GC marks the index of every running
//!   session's parent. If that index is gone (the parent was pruned during the backup),
//!   the GC cannot know those chunks and removes nothing unreferenced at all. The session
//!   checks that the parent's index exists after its record was written, so a GC that
//!   lists the record either finds the index or holds back.
//! - Another stored chunk the session reuses (deduplication) is touched if it is older
//!   than `touch_older_than` before the session's start; otherwise it is younger than
//!   `S.start - touch_older_than`. Either way it is at or after the cutoff of any GC that
//!   saw the session's record.
//! - A GC that started before the session's record existed may have listed a reused
//!   chunk with its old time and may delete it after the session touched it, or may have
//!   missed a parent pruned meanwhile. So after writing its index (which every later GC
//!   marks) and before its manifest, a session checks whether a GC ran since it started
//!   (a lease is held, or `locks/gc-last` is newer than the session's start): it first
//!   waits for a running GC to end, then heads every chunk it reused. A missing one fails
//!   the backup with a clear error and removes its index: a backup never points at data
//!   that is gone.
//!
//! # Immutable repositories
//! On S3 Object Lock the sweep works on versions (see [`crate::immutable`]): the same
//! chunks are candidates, and of those only the versions whose retention has passed are
//! destroyed; the rest wait for a later GC. Deleted records (delete markers) lose their
//! expired versions the same way.
//!
//! Sessions whose record has not been rewritten for their `stale_after` are crashed and
//! ignored (and their records removed). A grace period of zero is allowed: running
//! sessions are still protected by the rule above.

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
use crate::index::FixedIndex;
use crate::keys::random;
use crate::manifest::BackupId;
use crate::repository::Repository;
use crate::session::{SessionRecord, MAX_SESSION_LEN};
use crate::store::{ObjectMeta, ObjectStore, Put, PutMode, Version};
use crate::verify;

const LEASE: &str = "locks/gc";
const LAST: &str = "locks/gc-last";
const MAX_LEASE_LEN: u64 = 64 << 10;
const PARALLEL_DELETES: usize = 16;

/// How a GC runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GcOptions {
    /// Unreferenced chunks younger than this are kept (default 24 h; zero is allowed).
    pub grace: Duration,
    /// The lease's lifetime; it is renewed every third of it (default 10 minutes).
    pub lease_ttl: Duration,
    /// Who runs the GC, shown to others that find the lease taken.
    pub holder: String,
    /// Take over a live lease of the same holder: set when the holder names one run that
    /// may restart after its process died (a service's job ID), never for a name that two
    /// live processes could share.
    pub resumes_own_lease: bool,
}

impl Default for GcOptions {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(24 * 3600),
            lease_ttl: Duration::from_secs(600),
            holder: format!(
                "{} pid {}",
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_else(|_| "unknown".into()),
                std::process::id()
            ),
            resumes_own_lease: false,
        }
    }
}

impl GcOptions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    pub fn with_holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = holder.into();
        self
    }

    /// See [`GcOptions::resumes_own_lease`].
    pub fn resuming_own_lease(mut self) -> Self {
        self.resumes_own_lease = true;
        self
    }
}

/// What a GC did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GcReport {
    /// Indexes read (each backup's, and those of backups still being written).
    pub indexes: u64,
    /// Indexes of crashed backups (no manifest) that were removed.
    pub orphan_indexes_removed: u64,
    /// Chunks in the store when the sweep began.
    pub chunks_scanned: u64,
    pub chunks_removed: u64,
    pub bytes_removed: u64,
    /// Chunks kept because an index lists them.
    pub chunks_referenced: u64,
    /// Chunks kept although unreferenced, because they are younger than the cutoff.
    pub chunks_recent: u64,
    /// Stored bytes of every kept chunk.
    pub bytes_kept: u64,
    /// Stale records of crashed backup sessions removed.
    pub stale_sessions_removed: u64,
    /// Running backup sessions that moved the cutoff.
    pub running_sessions: u64,
    /// Running incremental backups whose parent was removed during them. While one runs
    /// the chunks of its parent are unknown, so nothing unreferenced was removed.
    pub sessions_without_parent: u64,
    /// Immutable repositories: unreferenced chunks kept because a version is still
    /// retained (Object Lock); they go in a later GC.
    #[serde(default)]
    pub chunks_retained: u64,
    /// Immutable repositories: object versions (and delete markers) destroyed...
    #[serde(default)]
    pub versions_removed: u64,
    /// ...and kept because their retention has not passed.
    #[serde(default)]
    pub versions_retained: u64,
    /// Immutable repositories: backups hidden by a delete marker that no prune recorded
    /// (kept; `ferry backup undelete` lists and restores them).
    #[serde(default)]
    pub hidden_backups: u64,
    /// The cutoff: unreferenced chunks older than this were removed.
    pub cutoff: Option<DateTime<Utc>>,
    /// Wall time of the whole GC.
    pub duration: Duration,
}

/// The content of `locks/gc`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub holder: String,
    /// Random, tells two leases of one holder apart.
    pub nonce: String,
    pub started: DateTime<Utc>,
    pub expires: DateTime<Utc>,
}

impl LeaseRecord {
    /// Whether the lease has expired (its holder stopped renewing it).
    pub fn is_stale(&self) -> bool {
        self.expires < Utc::now()
    }
}

/// The error source of a refused GC: another one holds the lease.
#[derive(Debug, Clone)]
pub struct LeaseHeld {
    pub holder: String,
    pub expires: DateTime<Utc>,
}

impl std::fmt::Display for LeaseHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "held by {} until {}",
            self.holder,
            self.expires.to_rfc3339()
        )
    }
}

impl std::error::Error for LeaseHeld {}

/// The current GC lease, if any (a damaged one reads as stale).
pub async fn current_lease(store: &dyn ObjectStore) -> Result<Option<LeaseRecord>> {
    Ok(store
        .get(LEASE, MAX_LEASE_LEN)
        .await?
        .map(|data| serde_json::from_slice(&data).unwrap_or_else(|_| damaged_lease())))
}

fn damaged_lease() -> LeaseRecord {
    LeaseRecord {
        holder: "unknown (damaged lease)".into(),
        nonce: String::new(),
        started: DateTime::<Utc>::from(SystemTime::UNIX_EPOCH),
        expires: DateTime::<Utc>::from(SystemTime::UNIX_EPOCH),
    }
}

/// When the last GC finished (the store's clock), if one ever did.
pub(crate) async fn last_run(store: &dyn ObjectStore) -> Result<Option<SystemTime>> {
    Ok(store.head(LAST).await?.map(|m| m.modified))
}

/// The lease held by a running GC. Renewed in the background; released by
/// [`GcLease::release`] (or left to expire if the holder dies).
#[derive(Debug)]
pub struct GcLease {
    store: Arc<dyn ObjectStore>,
    nonce: String,
    lost: Arc<AtomicBool>,
    renewer: Option<JoinHandle<()>>,
}

fn record(holder: &str, nonce: &str, ttl: Duration) -> LeaseRecord {
    let now = Utc::now();
    LeaseRecord {
        holder: holder.to_string(),
        nonce: nonce.to_string(),
        started: now,
        expires: chrono::Duration::from_std(ttl)
            .ok()
            .and_then(|ttl| now.checked_add_signed(ttl))
            .unwrap_or(DateTime::<Utc>::MAX_UTC),
    }
}

/// Reads back the lease after writing it: its version, if it is still ours.
async fn read_back(store: &dyn ObjectStore, nonce: &str) -> Result<Option<Version>> {
    Ok(match store.get_versioned(LEASE, MAX_LEASE_LEN).await? {
        Some((data, version)) => serde_json::from_slice::<LeaseRecord>(&data)
            .ok()
            .filter(|r| r.nonce == nonce)
            .map(|_| version),
        None => None,
    })
}

impl GcLease {
    /// Takes the lease, or takes over a stale one; refuses (kind InvalidInput, source
    /// [`LeaseHeld`]) while another GC holds it.
    pub async fn acquire(store: Arc<dyn ObjectStore>, holder: &str, ttl: Duration) -> Result<Self> {
        Self::acquire_as(store, holder, ttl, false).await
    }

    /// [`GcLease::acquire`], also taking over a live lease of `holder` itself when
    /// `resume_own` (the same run, restarted).
    pub async fn acquire_as(
        store: Arc<dyn ObjectStore>,
        holder: &str,
        ttl: Duration,
        resume_own: bool,
    ) -> Result<Self> {
        let nonce = hex::encode(random::<8>()?);
        let ttl = ttl.max(Duration::from_secs(1));
        let body =
            || Bytes::from(serde_json::to_vec(&record(holder, &nonce, ttl)).unwrap_or_default());
        for _ in 0..3 {
            let written = match store.put(LEASE, body(), PutMode::CreateOnly).await? {
                Put::Written => true,
                Put::Conflict => {
                    let Some((data, version)) = store.get_versioned(LEASE, MAX_LEASE_LEN).await?
                    else {
                        continue;
                    };
                    let current: LeaseRecord =
                        serde_json::from_slice(&data).unwrap_or_else(|_| damaged_lease());
                    let own = resume_own && current.holder == holder;
                    if !current.is_stale() && !own {
                        return Err(Error::invalid_input(format!(
                            "another garbage collection is running on {} ({}); try again later",
                            store.location(),
                            LeaseHeld {
                                holder: current.holder.clone(),
                                expires: current.expires
                            }
                        ))
                        .with_source(LeaseHeld {
                            holder: current.holder,
                            expires: current.expires,
                        }));
                    }
                    if own {
                        tracing::info!(holder = %current.holder, "resuming: taking over the lease of this garbage collection's earlier run");
                    } else {
                        tracing::warn!(holder = %current.holder, expired = %current.expires, "taking over a stale garbage collection lease");
                    }
                    store
                        .put(LEASE, body(), PutMode::ReplaceIf(version))
                        .await?
                        == Put::Written
                }
            };
            if written {
                if let Some(version) = read_back(store.as_ref(), &nonce).await? {
                    return Ok(Self::start(store, holder.to_string(), nonce, version, ttl));
                }
            }
        }
        Err(Error::invalid_input(format!(
            "another garbage collection took the lease on {} first; try again later",
            store.location()
        )))
    }

    fn start(
        store: Arc<dyn ObjectStore>,
        holder: String,
        nonce: String,
        version: Version,
        ttl: Duration,
    ) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let version = Arc::new(Mutex::new(version));
        let renewer = tokio::spawn(renew(
            Arc::clone(&store),
            holder,
            nonce.clone(),
            ttl,
            version,
            Arc::clone(&lost),
        ));
        Self {
            store,
            nonce,
            lost,
            renewer: Some(renewer),
        }
    }

    /// Whether the lease was lost (renewals failed for its lifetime, or another GC took
    /// it over): the GC must stop removing things.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.is_lost() {
            Err(Error::new(
                ErrorKind::Cancelled,
                format!(
                    "the garbage collection lost its lease on {} (renewals failed or another GC took over); it stopped",
                    self.store.location()
                ),
            ))
        } else {
            Ok(())
        }
    }

    /// Gives the lease up, if it is still ours.
    pub async fn release(mut self) -> Result<()> {
        self.stop_renewing().await;
        if read_back(self.store.as_ref(), &self.nonce).await?.is_some() {
            self.store.delete(LEASE).await?;
        }
        Ok(())
    }

    async fn stop_renewing(&mut self) {
        if let Some(task) = self.renewer.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for GcLease {
    fn drop(&mut self) {
        // An unreleased lease simply expires.
        if let Some(task) = self.renewer.take() {
            task.abort();
        }
    }
}

async fn renew(
    store: Arc<dyn ObjectStore>,
    holder: String,
    nonce: String,
    ttl: Duration,
    version: Arc<Mutex<Version>>,
    lost: Arc<AtomicBool>,
) {
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(ttl / 3).await;
        let body =
            Bytes::from(serde_json::to_vec(&record(&holder, &nonce, ttl)).unwrap_or_default());
        let expected = version.lock().clone();
        match store.put(LEASE, body, PutMode::ReplaceIf(expected)).await {
            Ok(Put::Written) => match read_back(store.as_ref(), &nonce).await {
                Ok(Some(v)) => {
                    *version.lock() = v;
                    last_ok = Instant::now();
                }
                Ok(None) => {
                    lost.store(true, Ordering::SeqCst);
                    return;
                }
                Err(err) => tracing::warn!(error = %err, "cannot read back the GC lease"),
            },
            Ok(Put::Conflict) => {
                lost.store(true, Ordering::SeqCst);
                return;
            }
            Err(err) => tracing::warn!(error = %err, "cannot renew the GC lease"),
        }
        if last_ok.elapsed() >= ttl {
            lost.store(true, Ordering::SeqCst);
            return;
        }
    }
}

#[derive(Serialize, Deserialize)]
struct LastRun {
    holder: String,
    started: DateTime<Utc>,
    finished: DateTime<Utc>,
    error: Option<String>,
    report: GcReport,
}

fn before(t: SystemTime, d: Duration) -> SystemTime {
    t.checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH)
}

impl Repository {
    /// Runs a garbage collection (see the module docs for what is removed and why that
    /// is safe).
    pub async fn gc(&self, options: &GcOptions) -> Result<GcReport> {
        let began = Instant::now();
        let started_at = Utc::now();
        let store = Arc::clone(self.store());
        let lease = GcLease::acquire_as(
            Arc::clone(&store),
            &options.holder,
            options.lease_ttl,
            options.resumes_own_lease,
        )
        .await?;
        let result = self.collect(&lease, options).await;
        // Recorded even when the GC failed half-way: backups that ran meanwhile must
        // re-check the chunks they rely on.
        let mut report = result.as_ref().cloned().unwrap_or_default();
        report.duration = began.elapsed();
        let last = LastRun {
            holder: options.holder.clone(),
            started: started_at,
            finished: Utc::now(),
            error: result.as_ref().err().map(|e| e.to_string()),
            report: report.clone(),
        };
        let recorded = store
            .put(
                LAST,
                Bytes::from(serde_json::to_vec_pretty(&last).unwrap_or_default()),
                PutMode::Overwrite,
            )
            .await;
        if let Err(err) = result {
            // Without a release the lease stays until it expires, which also makes
            // backups re-check.
            if recorded.is_ok() {
                let _ = lease.release().await;
            }
            return Err(err);
        }
        recorded?;
        lease.release().await?;
        tracing::info!(
            removed = report.chunks_removed,
            bytes_removed = report.bytes_removed,
            kept = report.chunks_referenced + report.chunks_recent,
            "garbage collection finished"
        );
        Ok(report)
    }

    async fn collect(&self, lease: &GcLease, options: &GcOptions) -> Result<GcReport> {
        let mut report = GcReport::default();
        let gc_start = self.lease_start().await?;
        let sessions = self
            .scan_sessions(lease, options, gc_start, &mut report)
            .await?;
        let marks = self.mark(lease, &sessions, &mut report).await?;
        let cutoff = cutoff_for_lost_parents(&sessions, &marks, &mut report);
        report.cutoff = Some(DateTime::<Utc>::from(cutoff));
        if self.immutability().is_some() {
            self.sweep_versions(lease, cutoff, &marks.referenced, &mut report)
                .await?;
        } else {
            self.sweep(lease, cutoff, &marks.referenced, &mut report)
                .await?;
        }
        Ok(report)
    }

    /// When the GC lease was taken, by the store's clock.
    async fn lease_start(&self) -> Result<SystemTime> {
        Ok(self
            .store()
            .head(LEASE)
            .await?
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Cancelled,
                    "the GC lease vanished as it was taken",
                )
            })?
            .modified)
    }

    /// Running sessions move the cutoff back, and their parents' chunks are marked;
    /// crashed ones are cleaned up.
    async fn scan_sessions(
        &self,
        lease: &GcLease,
        options: &GcOptions,
        gc_start: SystemTime,
        report: &mut GcReport,
    ) -> Result<RunningSessions> {
        let store = self.store();
        let mut sessions = RunningSessions {
            cutoff: before(gc_start, options.grace),
            parents: HashSet::new(),
        };
        for meta in store.list("sessions/").await? {
            let Some(data) = store.get(&meta.name, MAX_SESSION_LEN).await? else {
                continue;
            };
            let record: Option<SessionRecord> = serde_json::from_slice(&data).ok();
            if session_is_stale(&meta, record.as_ref(), gc_start) {
                lease.check()?;
                store.delete(&meta.name).await?;
                report.stale_sessions_removed += 1;
                continue;
            }
            report.running_sessions += 1;
            if let Some(r) = &record {
                tracing::debug!(backup = %r.id, host = %r.host, pid = r.pid, parent = ?r.parent, "a backup is running");
                sessions.parents.extend(r.parent.clone());
            }
            sessions.cutoff =
                sessions
                    .cutoff
                    .min(session_cutoff(&meta, record.as_ref(), options.grace));
        }
        Ok(sessions)
    }

    /// Collects the chunks every index lists. Indexes without a manifest (crashed
    /// backups) older than the cutoff, and no running session's parent, are removed
    /// instead.
    async fn mark(
        &self,
        lease: &GcLease,
        sessions: &RunningSessions,
        report: &mut GcReport,
    ) -> Result<Marks> {
        let store = self.store();
        let mut manifests: HashSet<BackupId> = self.list_snapshots().await?.into_iter().collect();
        let mut marks = Marks::default();
        if self.immutability().is_some() {
            // A backup hidden without a prune keeps its index and chunks (undelete).
            let hidden = self.hidden_unpruned_indexes().await?;
            manifests.extend(hidden.keys().cloned());
            for index in hidden.values() {
                marks
                    .referenced
                    .extend(index.digests().iter().filter(|d| !d.is_zero()).copied());
            }
        }
        for meta in store.list("indexes/").await? {
            let Some(id) = meta
                .name
                .strip_prefix("indexes/")
                .and_then(|n| n.parse::<BackupId>().ok())
            else {
                continue;
            };
            if !manifests.contains(&id)
                && meta.modified < sessions.cutoff
                && !sessions.parents.contains(&id)
            {
                lease.check()?;
                store.delete(&meta.name).await?;
                report.orphan_indexes_removed += 1;
                continue;
            }
            let Some(index) = self.index_to_mark(&id).await? else {
                continue;
            };
            report.indexes += 1;
            marks
                .referenced
                .extend(index.digests().iter().filter(|d| !d.is_zero()).copied());
            marks.indexes.insert(id);
        }
        Ok(marks)
    }

    /// The index of `id`, or `None` if a prune deleted it since the listing (it
    /// references nothing any more).
    async fn index_to_mark(&self, id: &BackupId) -> Result<Option<FixedIndex>> {
        match self.read_index(id).await {
            Ok((index, _)) => Ok(Some(index)),
            Err(err) if err.kind() == ErrorKind::NotFound => Ok(None),
            Err(err) => Err(Error::new(
                err.kind(),
                format!(
                    "garbage collection stopped before removing anything: {}; run verify, and delete that backup if it is damaged",
                    err.message()
                ),
            )),
        }
    }

    /// Removes the unreferenced chunks older than `cutoff`, and the bad marks no stored
    /// or referenced chunk needs any more.
    async fn sweep(
        &self,
        lease: &GcLease,
        cutoff: SystemTime,
        referenced: &HashSet<Digest>,
        report: &mut GcReport,
    ) -> Result<()> {
        let store = self.store();
        let bad = verify::bad_chunks(store.as_ref()).await?;
        let (doomed, stored) =
            doomed_chunks(store.list("chunks/").await?, referenced, cutoff, report);
        let removed = delete_chunks(lease, store.as_ref(), doomed).await?;
        for (digest, size) in &removed {
            report.chunks_removed += 1;
            report.bytes_removed += size;
            if bad.contains(digest) {
                store.delete(&digest.bad_name()).await?;
            }
        }
        // Marks of chunks a verify found missing, once no backup needs them.
        for digest in bad
            .iter()
            .filter(|d| !stored.contains(d) && !referenced.contains(d))
        {
            lease.check()?;
            store.delete(&digest.bad_name()).await?;
        }
        Ok(())
    }
}

/// What the running backup sessions ask of a GC.
struct RunningSessions {
    /// Unreferenced chunks and orphan indexes older than this may be removed.
    cutoff: SystemTime,
    /// The backups whose index chunks a running session reuses unchecked.
    parents: HashSet<BackupId>,
}

/// What the indexes reference.
#[derive(Default)]
struct Marks {
    /// Every chunk some index lists (zero chunks aside).
    referenced: HashSet<Digest>,
    /// The backups whose index was read.
    indexes: HashSet<BackupId>,
}

/// Whether a session record was not rewritten for its `stale_after` (the session
/// crashed).
fn session_is_stale(
    meta: &ObjectMeta,
    record: Option<&SessionRecord>,
    gc_start: SystemTime,
) -> bool {
    let stale_after = Duration::from_secs(record.map_or(600, |r| r.stale_after_secs));
    meta.modified
        .checked_add(stale_after)
        .is_some_and(|t| t < gc_start)
}

/// The cutoff a running session allows: its start less the larger of the grace period
/// and its `touch_older_than`.
fn session_cutoff(
    meta: &ObjectMeta,
    record: Option<&SessionRecord>,
    grace: Duration,
) -> SystemTime {
    let (start, touch) = match record {
        Some(r) => (
            r.started.map(SystemTime::from).unwrap_or(meta.modified),
            Duration::from_secs(r.touch_older_than_secs),
        ),
        // An unreadable record of a live session: keep everything it may use.
        None => (SystemTime::UNIX_EPOCH, Duration::ZERO),
    };
    before(start, grace.max(touch))
}

/// The sessions' cutoff, or the epoch (nothing unreferenced is removed) while a running
/// session's parent index is gone and so its chunks are unknown.
fn cutoff_for_lost_parents(
    sessions: &RunningSessions,
    marks: &Marks,
    report: &mut GcReport,
) -> SystemTime {
    let mut cutoff = sessions.cutoff;
    for parent in sessions
        .parents
        .iter()
        .filter(|p| !marks.indexes.contains(p))
    {
        tracing::warn!(parent = %parent, "a running backup reuses the chunks of a backup removed meanwhile: nothing unreferenced is removed until it ends");
        report.sessions_without_parent += 1;
        cutoff = SystemTime::UNIX_EPOCH;
    }
    cutoff
}

/// Counts the stored chunks that are kept, and returns the ones to remove (with their
/// sizes) and every stored chunk.
fn doomed_chunks(
    chunks: Vec<ObjectMeta>,
    referenced: &HashSet<Digest>,
    cutoff: SystemTime,
    report: &mut GcReport,
) -> (Vec<(Digest, u64)>, HashSet<Digest>) {
    let mut doomed = Vec::new();
    let mut stored = HashSet::new();
    for meta in chunks {
        let Some(digest) = Digest::from_chunk_name(&meta.name) else {
            continue;
        };
        stored.insert(digest);
        report.chunks_scanned += 1;
        if referenced.contains(&digest) {
            report.chunks_referenced += 1;
            report.bytes_kept += meta.size;
        } else if meta.modified < cutoff {
            doomed.push((digest, meta.size));
        } else {
            report.chunks_recent += 1;
            report.bytes_kept += meta.size;
        }
    }
    (doomed, stored)
}

/// Deletes chunks, several at once, checking before each that the lease still holds.
async fn delete_chunks(
    lease: &GcLease,
    store: &dyn ObjectStore,
    doomed: Vec<(Digest, u64)>,
) -> Result<Vec<(Digest, u64)>> {
    stream::iter(doomed)
        .map(|(digest, size)| async move {
            lease.check()?;
            store.delete(&digest.chunk_name()).await?;
            Ok::<_, Error>((digest, size))
        })
        .buffer_unordered(PARALLEL_DELETES)
        .try_collect()
        .await
}
