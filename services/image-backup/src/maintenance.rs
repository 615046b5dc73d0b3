//! Prune and garbage collection with the block digests this crate stores beside each
//! backup: the repository's own operations, then the matching block digests objects.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use ferry_backup::{BackupId, GcOptions, GcReport, KeepPolicy, PruneReport, Repository};
use ferry_core::Result;

use crate::blocks;

/// [`Repository::prune`], then the block digests of every backup it deleted.
pub async fn prune(
    repo: &Repository,
    policy: &KeepPolicy,
    now: DateTime<Utc>,
    dry_run: bool,
) -> Result<PruneReport> {
    prune_source(repo, policy, None, now, dry_run).await
}

/// [`prune`] of the backups of one source identity only (`None`: every source).
pub async fn prune_source(
    repo: &Repository,
    policy: &KeepPolicy,
    source: Option<&str>,
    now: DateTime<Utc>,
    dry_run: bool,
) -> Result<PruneReport> {
    let report = repo.prune_source(policy, source, now, dry_run).await?;
    for id in &report.deleted {
        blocks::delete(repo, id).await?;
    }
    Ok(report)
}

/// [`Repository::gc`], then block digests objects left without a backup (a backup
/// deleted by other means, or one that stopped between its block digests and its
/// manifest) that are older than the grace period and belong to no running session.
/// Returns the GC's report and how many such objects were removed.
pub async fn gc(repo: &Repository, options: &GcOptions) -> Result<(GcReport, u64)> {
    let report = repo.gc(options).await?;
    let removed = remove_orphan_block_digests(repo, options.grace).await?;
    Ok((report, removed))
}

async fn remove_orphan_block_digests(repo: &Repository, grace: Duration) -> Result<u64> {
    let store = repo.store();
    let backups: HashSet<BackupId> = repo.list_snapshots().await?.into_iter().collect();
    let sessions: HashSet<BackupId> = store
        .list("sessions/")
        .await?
        .into_iter()
        .filter_map(|m| {
            m.name
                .strip_prefix("sessions/")
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|n| n.parse().ok())
        })
        .collect();
    let cutoff = SystemTime::now()
        .checked_sub(grace)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut removed = 0;
    for meta in store.list(blocks::PREFIX).await? {
        let Some(id) = meta
            .name
            .strip_prefix(blocks::PREFIX)
            .and_then(|n| n.parse::<BackupId>().ok())
        else {
            continue;
        };
        if backups.contains(&id) || sessions.contains(&id) || meta.modified >= cutoff {
            continue;
        }
        store.delete(&meta.name).await?;
        removed += 1;
    }
    Ok(removed)
}
