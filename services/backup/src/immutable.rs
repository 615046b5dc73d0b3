//! Immutable repositories: a repository in an S3 bucket with Object Lock, where every
//! object version ferry writes is retained (compliance or governance mode) for a period
//! fixed at `init`, so that credentials able to write backups cannot destroy them.
//!
//! # What changes on an immutable repository
//! - Every PUT carries a retain-until date: now + the period for records (config, keys,
//!   indexes, manifests, sessions, leases, marks), now + 1.5 periods for chunks
//!   ([`crate::store::Retention::shared_extra`]), which later backups share.
//! - Nothing ends by destroying a version: a delete without a version id (a finished
//!   session, a released lease, a prune) leaves a delete marker, and the versions it hides
//!   stay until their retention passes. `undelete` brings them back.
//! - A chunk a new backup reuses must stay retained as long as the new backup: its
//!   retention is extended to now + 1.5 periods when it ends within `period + period/10`
//!   of the backup's start. A chunk found by a HEAD carries its retain-until date, so
//!   only those that need it get one PutObjectRetention each. The chunks of the parent
//!   (reused without a request) are covered by the parent manifest's
//!   `chunks_retained_until`, the earliest retention of its chunks: while it reaches far
//!   enough no request is made; when it does not, every such chunk is extended once
//!   (one request per chunk, 16 at a time), which then covers the next 0.4 periods of
//!   backups. This batching in time is the choice measured against one request per
//!   reused chunk per backup (docs/BACKUP.md).
//! - The config and the key objects are extended at each backup the same way: they
//!   must outlive every backup.
//! - Prune records what it removes (`pruned/<backup id>`) and hides it with delete
//!   markers; GC destroys versions only once their retention has passed (a HEAD of each
//!   candidate version says so; a refusal because a backup extended it meanwhile counts
//!   as retained), and a backup hidden without a prune record is never destroyed: an
//!   attacker's delete markers can be undone for as long as the GC keeps them.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use ferry_core::{Error, ErrorKind, Result, Secret};
use futures::stream::{self, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::blob::OVERHEAD;
use crate::digest::Digest;
use crate::gc::{GcLease, GcReport};
use crate::index::{FixedIndex, MAX_INDEX_LEN};
use crate::key_slot::KEYS_PREFIX;
use crate::manifest::BackupId;
use crate::repository::Repository;
use crate::store::{LockMode, ObjectStore, ObjectVersion, PutMode, Retention};

/// Where prune records the backups it removed from an immutable repository.
pub(crate) const PRUNED_PREFIX: &str = "pruned/";
const PARALLEL: usize = 16;

/// An immutable repository's retention, from its config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Immutability {
    pub mode: LockMode,
    /// How long every object version is retained after it is written, in seconds.
    pub period_secs: u64,
}

impl Immutability {
    /// A retention of `days` days in `mode`.
    pub fn days(mode: LockMode, days: u32) -> Self {
        Self {
            mode,
            period_secs: u64::from(days) * 86_400,
        }
    }

    pub fn period(&self) -> Duration {
        Duration::from_secs(self.period_secs)
    }

    /// What the store writes with.
    pub(crate) fn retention(&self) -> Retention {
        Retention {
            mode: self.mode,
            period: self.period(),
            shared_extra: self.period() / 2,
        }
    }

    /// The retain-until date a chunk reused by a backup that started at `start` must
    /// reach without an extension.
    pub(crate) fn needed(&self, start: SystemTime) -> SystemTime {
        start + self.period() + self.period() / 10
    }

    /// What an extension sets: as a new chunk gets.
    pub(crate) fn extended(&self, now: SystemTime) -> SystemTime {
        now + self.period() + self.period() / 2
    }
}

/// A backup hidden by a delete marker, or whose manifest was overwritten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HiddenBackup {
    pub id: BackupId,
    /// When its manifest was hidden (the delete marker's time), if it was.
    pub hidden: Option<DateTime<Utc>>,
    /// Whether a prune recorded removing it (else something else deleted it).
    pub pruned: bool,
    /// Whether its manifest was written again after the first time (never by ferry).
    pub overwritten: bool,
}

/// What [`undelete`] brought back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct UndeleteReport {
    /// Backups listed again.
    pub backups: Vec<BackupId>,
    /// The config and key objects brought back (the repository could not open without).
    pub repository_objects: u64,
    /// Chunks of listed backups that were hidden or overwritten and are current again.
    pub chunks: u64,
    /// Chunks of listed backups that no version holds intact.
    pub chunks_lost: u64,
}

/// The versions of every object, by name.
type Versions = BTreeMap<String, Vec<ObjectVersion>>;

async fn versions(store: &dyn ObjectStore, prefix: &str) -> Result<Versions> {
    let mut out = Versions::new();
    for v in store.list_versions(prefix).await? {
        out.entry(v.name.clone()).or_default().push(v);
    }
    // Oldest first (the store's time, then the listing's order for equal times: S3
    // lists a key's versions newest first).
    for list in out.values_mut() {
        list.reverse();
        list.sort_by_key(|v| v.modified);
    }
    Ok(out)
}

fn latest(list: &[ObjectVersion]) -> Option<&ObjectVersion> {
    list.iter().find(|v| v.latest)
}

fn is_hidden(list: &[ObjectVersion]) -> bool {
    latest(list).is_none_or(|v| v.delete_marker) && list.iter().any(|v| !v.delete_marker)
}

/// Whether a write-once object was written again (its current version is not its first).
fn is_overwritten(list: &[ObjectVersion]) -> bool {
    let first = list.iter().find(|v| !v.delete_marker);
    match (first, latest(list)) {
        (Some(first), Some(latest)) => {
            !latest.delete_marker && first.version_id != latest.version_id
        }
        _ => false,
    }
}

fn backup_of_manifest(name: &str) -> Option<BackupId> {
    name.strip_prefix("snapshots/")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// The backups whose manifests are hidden or overwritten (store level: works while the
/// config itself is hidden).
pub async fn hidden_backups(store: &dyn ObjectStore) -> Result<Vec<HiddenBackup>> {
    let all = versions(store, "snapshots/").await?;
    let pruned: HashSet<String> = store
        .list(PRUNED_PREFIX)
        .await?
        .into_iter()
        .map(|m| m.name)
        .collect();
    Ok(all
        .iter()
        .filter_map(|(name, list)| {
            let id = backup_of_manifest(name)?;
            let hidden = is_hidden(list);
            let overwritten = is_overwritten(list);
            (hidden || overwritten).then(|| HiddenBackup {
                hidden: hidden
                    .then(|| latest(list).map(|v| DateTime::<Utc>::from(v.modified)))
                    .flatten(),
                pruned: pruned.contains(&format!("{PRUNED_PREFIX}{id}")),
                overwritten,
                id,
            })
        })
        .collect())
}

/// Makes the newest (`newest`) or first real version of `name` current again if it is
/// not; returns whether it did.
async fn bring_back(
    store: &dyn ObjectStore,
    name: &str,
    list: &[ObjectVersion],
    newest: bool,
) -> Result<bool> {
    let mut real = list.iter().filter(|v| !v.delete_marker);
    let Some(good) = (if newest {
        real.next_back()
    } else {
        real.next()
    }) else {
        return Ok(false);
    };
    if latest(list).is_some_and(|l| l.version_id == good.version_id) {
        return Ok(false);
    }
    store.restore_version(name, &good.version_id).await?;
    Ok(true)
}

/// Brings back what delete markers hide (and undoes overwrites of objects ferry writes
/// once): the config and, when no key object is left, the key objects; the backups
/// `ids` (every hidden one when `None`); then every chunk any listed backup names whose
/// current version is missing or not the content it is named by (the newest intact
/// version is made current). Needs only the rights to write (no version is destroyed).
pub async fn undelete(
    store: Arc<dyn ObjectStore>,
    passphrase: Option<&Secret>,
    ids: Option<&[BackupId]>,
) -> Result<UndeleteReport> {
    let mut report = UndeleteReport::default();
    let top = versions(store.as_ref(), "").await?;
    if let Some(list) = top.get("config") {
        if is_hidden(list) && bring_back(store.as_ref(), "config", list, true).await? {
            report.repository_objects += 1;
        }
    }
    let keys: Vec<(&String, &Vec<ObjectVersion>)> = top
        .range(KEYS_PREFIX.to_string()..)
        .take_while(|(n, _)| n.starts_with(KEYS_PREFIX))
        .collect();
    if !keys.is_empty()
        && keys
            .iter()
            .all(|(_, l)| latest(l).is_none_or(|v| v.delete_marker))
    {
        for (name, list) in keys {
            if bring_back(store.as_ref(), name, list, true).await? {
                report.repository_objects += 1;
            }
        }
    }
    let repo = Repository::open(Arc::clone(&store), passphrase).await?;
    // From here on with the repository's retention (the config says which).
    repo.extend_repository_retention().await?;
    let store = Arc::clone(repo.store());
    let hidden = hidden_backups(store.as_ref()).await?;
    for h in hidden
        .iter()
        .filter(|h| ids.is_none_or(|ids| ids.contains(&h.id)))
    {
        for name in [
            h.id.manifest_name(),
            h.id.index_name(),
            format!("blockdigests/{}", h.id),
        ] {
            if let Some(list) = top.get(&name) {
                if is_hidden(list) || is_overwritten(list) {
                    bring_back(store.as_ref(), &name, list, false).await?;
                }
            }
        }
        store.delete(&format!("{PRUNED_PREFIX}{}", h.id)).await?;
        report.backups.push(h.id.clone());
    }
    if let Some(ids) = ids {
        if let Some(missing) = ids.iter().find(|id| !report.backups.contains(id)) {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "backup {missing} is not hidden in {} (ferry backup undelete REPO lists what is)",
                    store.location()
                ),
            ));
        }
    }
    // Chunks: only those with more than one version, or hidden, need a look.
    let suspect: BTreeMap<&String, &Vec<ObjectVersion>> = top
        .iter()
        .filter(|(n, l)| n.starts_with("chunks/") && (l.len() > 1 || is_hidden(l)))
        .collect();
    if suspect.is_empty() {
        return Ok(report);
    }
    let mut needed = HashSet::new();
    for id in repo.list_snapshots().await? {
        let manifest = repo.load_manifest(&id).await?;
        let index = repo.load_index(&manifest).await?;
        needed.extend(index.digests().iter().filter(|d| !d.is_zero()).copied());
    }
    let outcomes: Vec<Option<bool>> = stream::iter(needed.into_iter().filter_map(|d| {
        suspect
            .get(&d.chunk_name())
            .map(|list| (d, (*list).clone()))
    }))
    .map(|(digest, list)| repair_chunk(&repo, digest, list))
    .buffer_unordered(PARALLEL)
    .try_collect()
    .await?;
    for outcome in outcomes {
        match outcome {
            Some(true) => report.chunks += 1,
            Some(false) => {}
            None => report.chunks_lost += 1,
        }
    }
    tracing::info!(repository = %store.location(), backups = report.backups.len(), chunks = report.chunks, "undeleted");
    Ok(report)
}

/// Makes the newest intact version of a chunk current: `Some(true)` if it was not,
/// `Some(false)` if it was, `None` if no version is intact.
async fn repair_chunk(
    repo: &Repository,
    digest: Digest,
    list: Vec<ObjectVersion>,
) -> Result<Option<bool>> {
    let store = repo.store();
    let name = digest.chunk_name();
    let max = u64::from(repo.chunk_size()) + OVERHEAD;
    for v in list.iter().rev().filter(|v| !v.delete_marker) {
        let Some(blob) = store.get_version(&name, &v.version_id, max).await? else {
            continue;
        };
        let mut out = vec![0u8; repo.chunk_size() as usize];
        if repo.open_chunk(&digest, &blob, &mut out).is_err() {
            continue;
        }
        if v.latest {
            return Ok(Some(false));
        }
        store.restore_version(&name, &v.version_id).await?;
        return Ok(Some(true));
    }
    Ok(None)
}

/// What the GC may destroy of one object's versions.
enum Reap {
    /// Nothing.
    Keep,
    /// Every version whose retention passed, then the delete markers once no data
    /// version is left (a deleted object, or an unreferenced chunk).
    All,
    /// Versions other than the current one (a live object's history).
    History,
}

/// What destroying one object's versions did.
#[derive(Default)]
struct Reaped {
    versions: u64,
    bytes: u64,
    retained: u64,
    /// Every data version is gone.
    emptied: bool,
}

impl Repository {
    /// The repository's retention, when it is immutable.
    pub fn immutability(&self) -> Option<&Immutability> {
        self.config().immutable.as_ref()
    }

    /// Extends the retention of the config and the key objects so that they outlive a
    /// backup starting now (each a HEAD; a PutObjectRetention only when needed).
    pub(crate) async fn extend_repository_retention(&self) -> Result<()> {
        let Some(imm) = self.immutability() else {
            return Ok(());
        };
        let store = self.store();
        let now = SystemTime::now();
        let mut names = vec!["config".to_string()];
        names.extend(store.list(KEYS_PREFIX).await?.into_iter().map(|m| m.name));
        for name in names {
            if let Some(meta) = store.head(&name).await? {
                if meta.retain_until.is_none_or(|t| t < imm.needed(now)) {
                    store.extend_retention(&name, imm.extended(now)).await?;
                }
            }
        }
        Ok(())
    }

    /// The indexes of backups hidden without a prune record (read from their newest
    /// version, hidden or not), so that a GC keeps every chunk they name.
    pub(crate) async fn hidden_unpruned_indexes(&self) -> Result<BTreeMap<BackupId, FixedIndex>> {
        let store = self.store();
        let mut out = BTreeMap::new();
        for h in hidden_backups(store.as_ref()).await? {
            if h.pruned || h.hidden.is_none() {
                continue;
            }
            let name = h.id.index_name();
            let newest = store
                .list_versions(&name)
                .await?
                .into_iter()
                .filter(|v| v.name == name && !v.delete_marker)
                .max_by_key(|v| v.modified);
            let Some(v) = newest else {
                continue;
            };
            let Some(blob) = store
                .get_version(&name, &v.version_id, MAX_INDEX_LEN + OVERHEAD)
                .await?
            else {
                continue;
            };
            out.insert(h.id.clone(), self.decode_index(&h.id, &blob)?.0);
        }
        Ok(out)
    }

    /// Records, before a prune hides a backup of an immutable repository, that the
    /// prune removed it: the GC destroys its versions once retained no longer.
    pub(crate) async fn record_pruned(&self, id: &BackupId) -> Result<()> {
        if self.immutability().is_none() {
            return Ok(());
        }
        let record = serde_json::json!({ "backup": id, "time": Utc::now() }).to_string();
        self.store()
            .put(
                &format!("{PRUNED_PREFIX}{id}"),
                Bytes::from(record),
                PutMode::Overwrite,
            )
            .await?;
        Ok(())
    }

    /// The GC's sweep on an immutable repository: by versions. Unreferenced chunks
    /// older than `cutoff`, deleted objects and the history of live records lose the
    /// versions whose retention has passed; a backup hidden without a prune record keeps
    /// all of them (and is counted in `hidden_backups`).
    pub(crate) async fn sweep_versions(
        &self,
        lease: &GcLease,
        cutoff: SystemTime,
        referenced: &HashSet<Digest>,
        report: &mut GcReport,
    ) -> Result<()> {
        let store = self.store();
        let period = self.immutability().map_or(Duration::ZERO, |i| i.period());
        let all = versions(store.as_ref(), "").await?;
        let manifests_ever: HashSet<BackupId> =
            all.keys().filter_map(|n| backup_of_manifest(n)).collect();
        let pruned: HashSet<BackupId> = all
            .iter()
            .filter(|(n, l)| n.starts_with(PRUNED_PREFIX) && !is_hidden(l) && latest(l).is_some())
            .filter_map(|(n, _)| n.strip_prefix(PRUNED_PREFIX)?.parse().ok())
            .collect();
        let mut work = Vec::new();
        let mut stored = HashSet::new();
        for (name, list) in &all {
            let current = latest(list).filter(|v| !v.delete_marker);
            let reap = if let Some(digest) = Digest::from_chunk_name(name) {
                match current {
                    Some(v) => {
                        stored.insert(digest);
                        report.chunks_scanned += 1;
                        if referenced.contains(&digest) {
                            report.chunks_referenced += 1;
                            report.bytes_kept += v.size;
                            Reap::Keep
                        } else if v.modified >= cutoff {
                            report.chunks_recent += 1;
                            report.bytes_kept += v.size;
                            Reap::Keep
                        } else {
                            Reap::All
                        }
                    }
                    // Hidden: never one a backup needs (undelete brings those back).
                    None if referenced.contains(&digest) => Reap::Keep,
                    None => Reap::All,
                }
            } else if let Some(id) = backup_object(name) {
                match current {
                    Some(_) => Reap::Keep,
                    None if pruned.contains(&id) || !manifests_ever.contains(&id) => Reap::All,
                    None => {
                        if name.starts_with("snapshots/") {
                            report.hidden_backups += 1;
                            tracing::warn!(backup = %id, "a backup is hidden by a delete marker but no prune removed it: it is kept (ferry backup undelete brings it back)");
                        }
                        Reap::Keep
                    }
                }
            } else if name.starts_with(KEYS_PREFIX) {
                if current.is_some() {
                    Reap::Keep
                } else {
                    Reap::All
                }
            } else if current.is_some() {
                Reap::History
            } else {
                Reap::All
            };
            if !matches!(reap, Reap::Keep) {
                work.push((name.clone(), list.clone(), reap));
            }
        }
        // Prune records of backups none of whose objects is left.
        for id in &pruned {
            if !all.contains_key(&id.manifest_name()) && !all.contains_key(&id.index_name()) {
                store.delete(&format!("{PRUNED_PREFIX}{id}")).await?;
            }
        }
        let now = SystemTime::now();
        let results: Vec<(String, Reaped)> = stream::iter(work)
            .map(|(name, list, reap)| async move {
                lease.check()?;
                let reaped =
                    reap_versions(store.as_ref(), &name, &list, &reap, period, now).await?;
                Ok::<_, Error>((name, reaped))
            })
            .buffer_unordered(PARALLEL)
            .try_collect()
            .await?;
        for (name, r) in results {
            report.versions_removed += r.versions;
            report.versions_retained += r.retained;
            if name.starts_with("chunks/") {
                if r.emptied {
                    report.chunks_removed += 1;
                    report.bytes_removed += r.bytes;
                } else if r.retained > 0 {
                    report.chunks_retained += 1;
                }
            }
        }
        // Marks of chunks a verify found missing, once no backup needs them.
        for digest in crate::verify::bad_chunks(store.as_ref())
            .await?
            .iter()
            .filter(|d| !stored.contains(d) && !referenced.contains(d))
        {
            lease.check()?;
            store.delete(&digest.bad_name()).await?;
        }
        Ok(())
    }
}

/// The backup a per-backup object (manifest, index, block digests, prune record) is of.
fn backup_object(name: &str) -> Option<BackupId> {
    if let Some(id) = backup_of_manifest(name) {
        return Some(id);
    }
    name.strip_prefix("indexes/")
        .or_else(|| name.strip_prefix("blockdigests/"))?
        .parse()
        .ok()
}

/// Whether one version's retention has passed, by the store's word: a version written
/// less than a period ago is retained without asking.
async fn expired(
    store: &dyn ObjectStore,
    v: &ObjectVersion,
    period: Duration,
    now: SystemTime,
) -> Result<bool> {
    if v.delete_marker {
        return Ok(true);
    }
    if v.modified + period > now {
        return Ok(false);
    }
    Ok(match store.head_version(&v.name, &v.version_id).await? {
        None => true,
        Some(meta) => meta.retain_until.is_none_or(|t| t <= now),
    })
}

async fn reap_versions(
    store: &dyn ObjectStore,
    name: &str,
    list: &[ObjectVersion],
    reap: &Reap,
    period: Duration,
    now: SystemTime,
) -> Result<Reaped> {
    let mut out = Reaped::default();
    let current = latest(list).map(|v| v.version_id.clone());
    let mut data_left = 0;
    for v in list.iter().filter(|v| !v.delete_marker) {
        if matches!(reap, Reap::History) && Some(&v.version_id) == current.as_ref() {
            data_left += 1;
            continue;
        }
        if !expired(store, v, period, now).await? {
            out.retained += 1;
            data_left += 1;
            continue;
        }
        match store.delete_version(name, &v.version_id).await {
            Ok(()) => {
                out.versions += 1;
                out.bytes += v.size;
            }
            // Extended meanwhile (a backup reused it): retained after all.
            Err(e) if e.kind() == ErrorKind::PermissionDenied => {
                let still = store
                    .head_version(name, &v.version_id)
                    .await?
                    .and_then(|m| m.retain_until)
                    .is_some_and(|t| t > SystemTime::now());
                if !still {
                    return Err(Error::new(
                        ErrorKind::PermissionDenied,
                        format!("{}; destroying old versions needs the repository's maintenance credentials (s3:DeleteObjectVersion)", e.message()),
                    ));
                }
                out.retained += 1;
                data_left += 1;
            }
            Err(e) => return Err(e),
        }
    }
    out.emptied = data_left == 0;
    // Markers go when nothing is left under them, or when they hide nothing (history).
    if out.emptied || matches!(reap, Reap::History) {
        for m in list.iter().filter(|v| v.delete_marker) {
            store.delete_version(name, &m.version_id).await?;
            out.versions += 1;
        }
    }
    Ok(out)
}
