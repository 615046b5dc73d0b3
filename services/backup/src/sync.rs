//! Replication: [`sync`] copies the backups one repository has and another lacks (Proxmox
//! Backup Server's sync jobs), so that a second site holds its own, complete copies.
//!
//! Each backup is copied as a backup is written (restic's order): its chunks first,
//! only those the destination lacks, then its index, then its manifest, through a
//! [`Session`] of the destination (so a GC there spares a copy in progress, and an
//! immutable destination retains what it receives). The destination never lists a
//! backup whose chunks are missing, and a sync killed at any point leaves chunks that
//! the next sync reuses instead of sending again: resuming is running it again.
//!
//! Every chunk sent is read from the source and checked against its name (decoded and
//! hashed) before it is written: a damaged chunk in the source stops the copy of its
//! backup, and nothing of that backup becomes visible in the destination.
//!
//! Two destinations:
//! - One that shares the source's keys: both unencrypted, or one made with
//!   [`Repository::init_from`] (the same repository id and key objects, so the same
//!   master keys). Chunks keep their names and are sent as stored (no re-compression,
//!   no re-encryption); the index and the manifest are written again, by the session.
//! - Any other: chunks are decoded with the source's keys and encoded (compressed and
//!   encrypted) with the destination's, under the destination's names; the index is
//!   rewritten with those names. A chunk the destination may already hold must still be
//!   read to learn its name there, except the chunks of a parent backup both
//!   repositories hold (their names map position by position).
//!
//! Both repositories must use one chunk size (an index cannot be re-cut without the
//! image): a difference is refused before anything is written.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use chrono::Utc;
use ferry_core::{Error, ErrorKind, Result};
use futures::stream::{self, StreamExt, TryStreamExt};
use parking_lot::Mutex;

use crate::config::{Config, FORMAT_VERSION, IMMUTABLE_FORMAT_VERSION, MAX_CONFIG_LEN};
use crate::digest::Digest;
use crate::immutable::Immutability;
use crate::index::FixedIndex;
use crate::key_slot;
use crate::keys::EncryptionConfig;
use crate::manifest::{BackupId, Manifest, SnapshotInfo};
use crate::prune::{plan, KeepPolicy, SnapshotRef};
use crate::rate::{FixedRate, RateLimit, RatePolicy};
use crate::repository::immutable_store;
use crate::repository::Repository;
use crate::session::{Session, SessionOptions};
use crate::store::{ObjectStore, Put, PutMode};

/// Chunks copied at once (each holds a blob and, while checked, its plaintext).
const PARALLEL_CHUNKS: usize = 8;

/// Plaintext buffers of chunks checked and dropped, reused by the next chunks: a fresh
/// chunk-sized buffer per chunk costs its zeroing and page faults every time (ferry's
/// allocator maps buffers that large and unmaps them when freed).
#[derive(Default)]
struct Spare(Mutex<Vec<Vec<u8>>>);

impl Spare {
    fn take(&self) -> Vec<u8> {
        self.0.lock().pop().unwrap_or_default()
    }

    fn give(&self, buf: Vec<u8>) {
        let mut spare = self.0.lock();
        if spare.len() < PARALLEL_CHUNKS {
            spare.push(buf);
        }
    }
}

/// What to copy.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct SyncOptions {
    /// Only the backups of this source identity.
    pub source_id: Option<String>,
    /// Only the backups this policy keeps (empty: all).
    pub keep: KeepPolicy,
    /// Remove the destination's backups (of `source_id`, if given) that the source no
    /// longer has; protected ones stay.
    pub remove_vanished: bool,
    /// Bytes sent per second at most (`None`: no limit).
    pub limit_rate: Option<u64>,
    /// A limit that changes with time (the job service's rate limit windows); when set
    /// it replaces `limit_rate`.
    pub rate_policy: Option<Arc<dyn RatePolicy>>,
    /// Told of the sync's progress.
    pub observer: Option<Arc<dyn SyncObserver>>,
}

/// Follows a sync's progress, in image bytes of the backups it copies.
pub trait SyncObserver: Send + Sync + std::fmt::Debug {
    /// The backups to copy are chosen: `backups` of them, `bytes` their image sizes.
    fn planned(&self, backups: usize, bytes: u64);
    /// `bytes` image bytes of a backup being copied are handled: their chunk was sent
    /// (`sent`), or needed no sending (a zero chunk, or one the destination had).
    fn handled(&self, bytes: u64, sent: bool);
}

impl SyncOptions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_source_id(mut self, source: impl Into<String>) -> Self {
        self.source_id = Some(source.into());
        self
    }

    pub fn with_keep(mut self, keep: KeepPolicy) -> Self {
        self.keep = keep;
        self
    }

    pub fn with_remove_vanished(mut self, on: bool) -> Self {
        self.remove_vanished = on;
        self
    }

    pub fn with_limit_rate(mut self, bytes_per_second: u64) -> Self {
        self.limit_rate = Some(bytes_per_second.max(1));
        self
    }

    pub fn with_rate_policy(mut self, policy: Arc<dyn RatePolicy>) -> Self {
        self.rate_policy = Some(policy);
        self
    }

    pub fn with_observer(mut self, observer: Arc<dyn SyncObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    fn limiter(&self) -> Option<RateLimit> {
        match (&self.rate_policy, self.limit_rate) {
            (Some(policy), _) => Some(RateLimit::new(policy.clone())),
            (None, Some(rate)) => Some(RateLimit::new(Arc::new(FixedRate(rate)))),
            (None, None) => None,
        }
    }
}

/// What a sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Backups written to the destination, oldest first.
    pub copied: Vec<BackupId>,
    /// Selected backups the destination had already.
    pub present: usize,
    /// Chunks sent (the destination lacked them).
    pub chunks_copied: u64,
    /// Chunks the destination had already.
    pub chunks_reused: u64,
    /// Bytes sent (stored form: compressed and encrypted as the destination stores them).
    pub bytes_copied: u64,
    /// Whether chunks were sent as stored (shared keys) or re-encoded.
    pub same_keys: bool,
    /// Backups removed from the destination (`remove_vanished`).
    pub removed: Vec<BackupId>,
}

/// What a layer above the repository stores beside each backup (ferry-image-backup's
/// block digests), copied with it: called once a backup's chunks are in the destination,
/// before its index and manifest, so that a listed copy has it too.
#[async_trait::async_trait]
pub trait CopyBeside: Send + Sync {
    async fn copy(
        &self,
        src: &Repository,
        dst: &Repository,
        manifest: &Manifest,
        src_index: &FixedIndex,
        dst_index: &FixedIndex,
    ) -> Result<()>;
}

/// Nothing beside the backups.
struct Nothing;

#[async_trait::async_trait]
impl CopyBeside for Nothing {
    async fn copy(
        &self,
        _: &Repository,
        _: &Repository,
        _: &Manifest,
        _: &FixedIndex,
        _: &FixedIndex,
    ) -> Result<()> {
        Ok(())
    }
}

/// Copies to `dst` the backups of `src` it lacks (see the module docs). Stops at the
/// first backup that cannot be copied; the ones copied before stay.
pub async fn sync(src: &Repository, dst: &Repository, options: &SyncOptions) -> Result<SyncReport> {
    sync_with(src, dst, options, &Nothing).await
}

/// [`sync`], with what `beside` stores beside each backup.
pub async fn sync_with(
    src: &Repository,
    dst: &Repository,
    options: &SyncOptions,
    beside: &dyn CopyBeside,
) -> Result<SyncReport> {
    if src.chunk_size() != dst.chunk_size() {
        return Err(Error::invalid_input(format!(
            "{} uses {} chunks and {} {}: a sync needs one chunk size in both (create the destination with --chunk-size {} or with --from)",
            src.store().location(),
            show(src.chunk_size()),
            dst.store().location(),
            show(dst.chunk_size()),
            show(src.chunk_size()),
        )));
    }
    if src.config().id == dst.config().id && src.store().location() == dst.store().location() {
        return Err(Error::invalid_input(
            "the source and the destination are the same repository",
        ));
    }
    let wanted = selected(src, options).await?;
    let have: BTreeSet<BackupId> = dst.list_snapshots().await?.into_iter().collect();
    let limiter = options.limiter();
    let observer = options.observer.as_deref();
    if let Some(o) = observer {
        let missing = wanted.iter().filter(|m| !have.contains(&m.id));
        let (count, bytes) = missing.fold((0, 0), |(n, b), m| (n + 1, b + m.image_size));
        o.planned(count, bytes);
    }
    let mut report = SyncReport {
        same_keys: same_names(src, dst),
        ..SyncReport::default()
    };
    for manifest in &wanted {
        if have.contains(&manifest.id) {
            report.present += 1;
            continue;
        }
        let copied = copy_backup(src, dst, manifest, limiter.as_ref(), observer, beside).await?;
        report.chunks_copied += copied.chunks_copied;
        report.chunks_reused += copied.chunks_reused;
        report.bytes_copied += copied.bytes_copied;
        report.copied.push(manifest.id.clone());
    }
    if options.remove_vanished {
        report.removed = remove_vanished(src, dst, options).await?;
    }
    Ok(report)
}

fn show(size: u32) -> String {
    format!("{} KiB", size >> 10)
}

/// Whether chunks keep their names and stored form from `src` to `dst`: both
/// unencrypted, or both opened with the same master keys of the same repository id.
fn same_names(src: &Repository, dst: &Repository) -> bool {
    match (src.unlocked(), dst.unlocked()) {
        (None, None) => true,
        (Some(s), Some(d)) => {
            src.config().id == dst.config().id
                && s.masters.len() == d.masters.len()
                && s.masters.iter().zip(&d.masters).all(|(a, b)| a.id == b.id)
        }
        _ => false,
    }
}

/// The source's backups to copy, oldest first: those of `source_id` that the policy
/// keeps.
async fn selected(src: &Repository, options: &SyncOptions) -> Result<Vec<Manifest>> {
    let mut manifests = Vec::new();
    for id in src.list_snapshots().await? {
        let manifest = src.load_manifest(&id).await?;
        if options
            .source_id
            .as_deref()
            .is_none_or(|s| s == manifest.source)
        {
            manifests.push(manifest);
        }
    }
    if options.keep.is_empty() {
        return Ok(manifests);
    }
    let refs: Vec<SnapshotRef> = manifests.iter().map(SnapshotRef::from).collect();
    let kept: HashSet<BackupId> = plan(&refs, &options.keep, Utc::now())
        .kept()
        .map(|s| s.id.clone())
        .collect();
    manifests.retain(|m| kept.contains(&m.id));
    Ok(manifests)
}

/// The destination's backups (of `source_id`) the source no longer has, removed as a
/// prune removes them; protected ones are kept.
async fn remove_vanished(
    src: &Repository,
    dst: &Repository,
    options: &SyncOptions,
) -> Result<Vec<BackupId>> {
    let in_src: HashSet<BackupId> = src.list_snapshots().await?.into_iter().collect();
    let protected = dst.protected_backups().await?;
    let mut removed = Vec::new();
    for id in dst.list_snapshots().await? {
        if in_src.contains(&id) || protected.contains(&id) {
            continue;
        }
        let manifest = dst.load_manifest(&id).await?;
        if options
            .source_id
            .as_deref()
            .is_some_and(|s| s != manifest.source)
        {
            continue;
        }
        dst.record_pruned(&id).await?;
        dst.delete_snapshot(&id).await?;
        removed.push(id);
    }
    Ok(removed)
}

/// What copying one backup did.
#[derive(Debug, Default)]
struct Copied {
    chunks_copied: u64,
    chunks_reused: u64,
    bytes_copied: u64,
}

/// How a chunk of the source gets its name in the destination.
enum Naming {
    /// The same name, the blob sent as stored.
    Same,
    /// Re-encoded; the names of chunks known already (from a parent both hold).
    Reencode(HashMap<Digest, Digest>),
}

/// Copies one backup: its chunks the destination lacks, then (by the session) its
/// index and manifest.
async fn copy_backup(
    src: &Repository,
    dst: &Repository,
    manifest: &Manifest,
    limiter: Option<&RateLimit>,
    observer: Option<&dyn SyncObserver>,
    beside: &dyn CopyBeside,
) -> Result<Copied> {
    let id = &manifest.id;
    let within = |e: Error| {
        Error::new(
            e.kind(),
            format!("backup {id} was not copied: {}", e.message()),
        )
    };
    let index = src.load_index(manifest).await.map_err(within)?;
    // The parent, when the destination holds it, lets the session reuse its chunks
    // without a request each (and maps names when re-encoding).
    let parent = match &manifest.parent {
        Some(p) => parent_in_both(src, dst, p).await.map_err(within)?,
        None => None,
    };
    let naming = if same_names(src, dst) && src.uses_current_master_key(manifest) {
        Naming::Same
    } else {
        let mut known = HashMap::new();
        if let Some((_, src_parent, dst_parent)) = &parent {
            for (s, d) in src_parent.digests().iter().zip(dst_parent.digests()) {
                known.insert(*s, *d);
            }
        }
        Naming::Reencode(known)
    };
    let session = dst
        .begin_copy_session(
            SessionOptions::default(),
            id,
            manifest.time,
            parent.as_ref().map(|(p, _, d)| (p, d)),
        )
        .await
        .map_err(within)?;
    let result = copy_chunks(src, &session, &index, &naming, limiter, observer).await;
    let copied = match result {
        Ok((dst_index, copied)) => beside
            .copy(src, dst, manifest, &index, &dst_index)
            .await
            .map(|()| (dst_index, copied)),
        Err(e) => Err(e),
    };
    let (dst_index, copied) = match copied {
        Ok(done) => done,
        Err(e) => {
            session.abandon().await;
            return Err(within(e));
        }
    };
    let mut info = SnapshotInfo::new(manifest.source.clone());
    info.parent = manifest.parent.clone();
    info.tags = manifest.tags.clone();
    info.block_hash = manifest.block_hash.clone();
    info.snapshot_id = manifest.snapshot_id.clone();
    session.finish(&dst_index, info).await.map_err(within)?;
    tracing::info!(backup = %id, chunks = copied.chunks_copied, "copied a backup");
    Ok(copied)
}

/// The parent `id` with its index in both repositories, if both hold it.
async fn parent_in_both(
    src: &Repository,
    dst: &Repository,
    id: &BackupId,
) -> Result<Option<(BackupId, FixedIndex, FixedIndex)>> {
    let load = |repo: &Repository| {
        let (repo, id) = (repo.clone(), id.clone());
        async move {
            match repo.load_manifest(&id).await {
                Ok(m) => repo.load_index(&m).await.map(Some),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            }
        }
    };
    let (s, d) = tokio::try_join!(load(src), load(dst))?;
    Ok(match (s, d) {
        (Some(s), Some(d)) if s.len() == d.len() => Some((id.clone(), s, d)),
        _ => None,
    })
}

/// Sends the chunks of `index` the destination lacks, [`PARALLEL_CHUNKS`] at once;
/// returns the destination's index (the source's, or with re-encoded names).
async fn copy_chunks(
    src: &Repository,
    session: &Session,
    index: &FixedIndex,
    naming: &Naming,
    limiter: Option<&RateLimit>,
    observer: Option<&dyn SyncObserver>,
) -> Result<(FixedIndex, Copied)> {
    let copied = Mutex::new(Copied::default());
    let renamed: Mutex<HashMap<Digest, Digest>> = Mutex::new(HashMap::new());
    let spare = Spare::default();
    // Each distinct chunk once, with its length (the last chunk may be short) and the
    // image bytes it stands for (every place it appears).
    let mut distinct: Vec<(Digest, u64, u64)> = Vec::new();
    let mut seen: HashMap<Digest, usize> = HashMap::new();
    let mut zero_bytes = 0;
    for (i, d) in index.digests().iter().enumerate() {
        let len = index.chunk_range(i).1;
        if d.is_zero() {
            zero_bytes += len;
        } else if let Some(&at) = seen.get(d) {
            distinct[at].2 += len;
        } else {
            seen.insert(*d, distinct.len());
            distinct.push((*d, len, len));
        }
    }
    if let Some(o) = observer {
        o.handled(zero_bytes, false);
    }
    stream::iter(distinct)
        .map(|(digest, len, image_bytes)| {
            let (copied, renamed, spare) = (&copied, &renamed, &spare);
            async move {
                let (name, sent) = match naming {
                    Naming::Same => (digest, copy_same(src, session, digest, len, spare).await?),
                    Naming::Reencode(known) => {
                        copy_reencoded(src, session, digest, len, known.get(&digest), spare).await?
                    }
                };
                if naming_changes(naming) {
                    renamed.lock().insert(digest, name);
                }
                if let Some(o) = observer {
                    o.handled(image_bytes, sent.is_some());
                }
                match sent {
                    Some(bytes) => {
                        {
                            let mut c = copied.lock();
                            c.chunks_copied += 1;
                            c.bytes_copied += bytes;
                        }
                        if let Some(limit) = limiter {
                            limit.take(bytes).await;
                        }
                    }
                    None => copied.lock().chunks_reused += 1,
                }
                Ok::<_, Error>(())
            }
        })
        .buffer_unordered(PARALLEL_CHUNKS)
        .try_collect::<()>()
        .await?;
    let dst_index = match naming {
        Naming::Same => index.clone(),
        Naming::Reencode(_) => {
            let renamed = renamed.into_inner();
            let mut out = FixedIndex::new(index.image_size(), index.chunk_size())?;
            for (i, d) in index.digests().iter().enumerate() {
                let name = if d.is_zero() {
                    Digest::ZERO
                } else {
                    *renamed
                        .get(d)
                        .ok_or_else(|| Error::internal("a chunk was not copied"))?
                };
                out.set(i, name)?;
            }
            out
        }
    };
    Ok((dst_index, copied.into_inner()))
}

fn naming_changes(naming: &Naming) -> bool {
    matches!(naming, Naming::Reencode(_))
}

/// A chunk under the same name: nothing if the destination has it; else its blob, read
/// and checked against its name, sent as stored. Returns the bytes sent.
async fn copy_same(
    src: &Repository,
    session: &Session,
    digest: Digest,
    len: u64,
    spare: &Spare,
) -> Result<Option<u64>> {
    if session.lookup(&digest).await?.is_some() {
        return Ok(None);
    }
    let (blob, plain, _) = fetch_checked(src, digest, len, spare.take()).await?;
    spare.give(plain);
    let bytes = blob.len() as u64;
    session.store_encoded(digest, blob).await?;
    Ok(Some(bytes))
}

/// A chunk re-encoded for the destination: its name there (known from the parent, or
/// computed from its plaintext), and, when the destination lacks it, the bytes sent.
async fn copy_reencoded(
    src: &Repository,
    session: &Session,
    digest: Digest,
    len: u64,
    known: Option<&Digest>,
    spare: &Spare,
) -> Result<(Digest, Option<u64>)> {
    if let Some(name) = known {
        if session.lookup(name).await?.is_some() {
            return Ok((*name, None));
        }
    }
    let (_, plain, blocks) = fetch_checked(src, digest, len, spare.take()).await?;
    let dst = session.repository().clone();
    let name = dst.chunk_digest_of_blocks(plain.len(), &blocks);
    if session.lookup(&name).await?.is_some() {
        spare.give(plain);
        return Ok((name, None));
    }
    let (blob, plain) = tokio::task::spawn_blocking(move || (dst.encode_chunk(&plain), plain))
        .await
        .map_err(|_| Error::internal("a chunk encoding thread panicked"))?;
    spare.give(plain);
    let blob = blob?;
    let bytes = blob.len() as u64;
    session.store_encoded(name, blob).await?;
    Ok((name, Some(bytes)))
}

/// Reads chunk `digest` of the source and checks it against its name and the index's
/// length; returns its blob, plaintext (in `plain`'s allocation, whose bytes are
/// overwritten) and block digests.
async fn fetch_checked(
    src: &Repository,
    digest: Digest,
    len: u64,
    mut plain: Vec<u8>,
) -> Result<(Vec<u8>, Vec<u8>, Vec<ferry_blkhash::Hash>)> {
    let blob = src.fetch_chunk(&digest).await?;
    let repo = src.clone();
    tokio::task::spawn_blocking(move || {
        plain.resize(repo.chunk_size() as usize, 0);
        let (got, blocks) = repo.open_chunk(&digest, &blob, &mut plain)?;
        if got as u64 != len {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("chunk {digest} holds {got} bytes, the index says {len}"),
            ));
        }
        plain.truncate(got);
        Ok((blob, plain, blocks))
    })
    .await
    .map_err(|_| Error::internal("a chunk checking thread panicked"))?
    .map_err(|e| {
        Error::new(
            e.kind(),
            format!(
                "{} (in the source {}; nothing of it was copied)",
                e.message(),
                src.store().location()
            ),
        )
    })
}

impl Repository {
    /// Creates a repository at `store` that shares the keys of the repository in `src`
    /// (its repository id, chunk size, compression and key objects, so the same
    /// passphrases open it and chunks keep their names and stored form), for [`sync`] to
    /// fill without re-encrypting. Needs no passphrase: the key objects are copied as
    /// they are (each wraps the master keys, bound to the repository id). `immutable`
    /// makes the new repository immutable, whatever the source is.
    pub async fn init_from(
        store: Arc<dyn ObjectStore>,
        src: &dyn ObjectStore,
        immutable: Option<Immutability>,
    ) -> Result<()> {
        let location = store.location();
        let exists = || {
            Error::invalid_input(format!(
                "{location} already holds a repository (it has a config): sync into it instead"
            ))
        };
        let data = src.get("config", MAX_CONFIG_LEN).await?.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("there is no repository at {} (no config)", src.location()),
            )
        })?;
        let config = Config::parse(&data, &src.location())?;
        if store.head("config").await?.is_some() {
            return Err(exists());
        }
        let format_version = match (&config.encryption, &immutable) {
            (Some(EncryptionConfig::Single(_)), _) => {
                return Err(Error::invalid_input(format!(
                    "{} keeps its key in its config (format 2): run `ferry backup key list` on it first, which moves the key into a key object that can be shared",
                    src.location()
                )))
            }
            (_, Some(_)) => IMMUTABLE_FORMAT_VERSION,
            _ => FORMAT_VERSION,
        };
        let config = Config {
            format_version,
            immutable,
            ..config
        };
        let store = match &config.immutable {
            None => store,
            Some(imm) => immutable_store(&store, imm).await?,
        };
        if config.encryption.is_some() {
            let slots = key_slot::load_all(src).await?;
            if slots.is_empty() {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("{} has no key objects to share", src.location()),
                ));
            }
            for slot in slots {
                store
                    .put(
                        &slot.name(),
                        bytes::Bytes::from(slot.to_json()),
                        PutMode::CreateOnly,
                    )
                    .await?;
            }
        }
        match store
            .put(
                "config",
                bytes::Bytes::from(config.to_json()),
                PutMode::CreateOnly,
            )
            .await?
        {
            Put::Written => {}
            Put::Conflict => return Err(exists()),
        }
        tracing::info!(repository = %location, from = %src.location(), "created a repository sharing another's keys");
        Ok(())
    }
}
