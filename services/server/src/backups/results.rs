//! What the backup library reports, as the wire shows it: job results (BackupResult,
//! RestoreResult, RepositoryVerifyResult, PruneResult, GcResult) and snapshots
//! (manifests). Long lists are cut at [`MAX_LISTED`] so a result stays small.

use std::time::Duration;

use chrono::{DateTime, Utc};
use ferry_backup::{ChunkFault, GcReport, KeepReason, Manifest, PruneReport, VerifyReport};
use ferry_image_backup::{BackupReport, RestoreReport};

use ferry_api::proto;

/// Most entries of a list in a result (bad chunks, broken snapshots, pruned snapshots).
pub const MAX_LISTED: usize = 1000;

fn blkhash(hex: &str) -> proto::Digest {
    proto::Digest {
        algorithm: proto::HashAlgorithm::Blkhash as i32,
        hex: hex.to_string(),
    }
}

pub(crate) fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

fn rate(bytes: u64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 {
        bytes as f64 / s
    } else {
        0.0
    }
}

/// A backup's manifest.
pub fn snapshot(m: &Manifest) -> proto::Snapshot {
    proto::Snapshot {
        id: m.id.to_string(),
        time: Some(timestamp(m.time)),
        source_id: m.source.clone(),
        parent_id: m
            .parent
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        tags: m.tags.clone(),
        size: m.image_size,
        chunk_size: u64::from(m.chunk_size),
        digest: m.block_hash.as_deref().map(blkhash),
        bytes_new: m.bytes_new,
        bytes_reused: m.bytes_reused,
        bytes_zero: m.bytes_zero,
        chunks_new: m.chunks_new,
        chunks_reused: m.chunks_reused,
        chunks_zero: m.chunks_zero,
        ferry_version: m.ferry_version.clone(),
        protected: false,
    }
}

/// What a backup did (its prune, when one ran, is added by the caller).
pub fn backup(r: &BackupReport) -> proto::BackupResult {
    let m = &r.manifest;
    proto::BackupResult {
        snapshot_id: m.id.to_string(),
        parent_id: m
            .parent
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        full_reason: r.full_reason.clone().unwrap_or_default(),
        source_id: m.source.clone(),
        size: m.image_size,
        bytes_read: r.bytes_read,
        bytes_new: m.bytes_new,
        bytes_reused: m.bytes_reused,
        bytes_zero: m.bytes_zero,
        chunks_new: m.chunks_new,
        chunks_reused: m.chunks_reused,
        chunks_zero: m.chunks_zero,
        chunks_read: r.chunks_read,
        chunks_unread: r.chunks_unread,
        chunks_unchanged: r.chunks_unchanged,
        digest: m.block_hash.as_deref().map(blkhash),
        seconds: r.elapsed.as_secs_f64(),
        throughput_bytes_per_second: rate(m.image_size, r.elapsed),
        prune: None,
        prune_error: None,
        // The caller knows how the blocks to read were found.
        changed_block_tracking: String::new(),
    }
}

/// What a restore did; `checked` says whether the digest was compared.
pub fn restore(r: &RestoreReport, checked: bool) -> proto::RestoreResult {
    proto::RestoreResult {
        snapshot_id: r.id.to_string(),
        size: r.size,
        data_bytes: r.data_bytes,
        zero_bytes: r.zero_bytes,
        digest: checked.then(|| blkhash(&r.block_hash)),
        verified: checked && r.verified,
        seconds: r.elapsed.as_secs_f64(),
        throughput_bytes_per_second: rate(r.size, r.elapsed),
    }
}

/// What a verify found.
pub fn verify(r: &VerifyReport, elapsed: Duration) -> proto::RepositoryVerifyResult {
    proto::RepositoryVerifyResult {
        ok: r.is_ok(),
        snapshots_checked: r.snapshots_checked,
        chunks_checked: r.chunks_checked,
        bytes_checked: r.bytes_checked,
        chunks_bad: r.problems.len() as u64,
        bad_chunks: r
            .problems
            .iter()
            .take(MAX_LISTED)
            .map(|p| {
                let (fault, message) = match &p.fault {
                    ChunkFault::Missing => ("missing", String::new()),
                    ChunkFault::Damaged(why) => ("damaged", why.clone()),
                };
                proto::BadChunk {
                    digest: p.digest.to_string(),
                    fault: fault.into(),
                    message,
                    snapshot_ids: p
                        .snapshots
                        .iter()
                        .take(MAX_LISTED)
                        .map(ToString::to_string)
                        .collect(),
                }
            })
            .collect(),
        unreadable_snapshots: r
            .unreadable_snapshots
            .iter()
            .take(MAX_LISTED)
            .map(|(id, reason)| proto::UnreadableSnapshot {
                id: id.to_string(),
                reason: reason.clone(),
            })
            .collect(),
        broken_snapshots: r
            .broken_snapshots
            .iter()
            .take(MAX_LISTED)
            .map(ToString::to_string)
            .collect(),
        seconds: elapsed.as_secs_f64(),
    }
}

fn reason(r: &KeepReason) -> &'static str {
    match r {
        KeepReason::Last => "last",
        KeepReason::Hourly => "hourly",
        KeepReason::Daily => "daily",
        KeepReason::Weekly => "weekly",
        KeepReason::Monthly => "monthly",
        KeepReason::Yearly => "yearly",
        KeepReason::Within(_) => "within",
        KeepReason::EmptyPolicy => "empty_policy",
        KeepReason::Protected => "protected",
    }
}

/// What a prune kept and removed, oldest first.
pub fn prune(r: &PruneReport, dry_run: bool) -> proto::PruneResult {
    let mut decisions: Vec<_> = r.plan.decisions.iter().collect();
    decisions
        .sort_by(|a, b| (a.snapshot.time, &a.snapshot.id).cmp(&(b.snapshot.time, &b.snapshot.id)));
    let entry = |d: &ferry_backup::prune::Decision| proto::PrunedSnapshot {
        id: d.snapshot.id.to_string(),
        source_id: d.snapshot.source.clone(),
        time: Some(timestamp(d.snapshot.time)),
        reasons: d.reasons.iter().map(|r| reason(r).to_string()).collect(),
    };
    proto::PruneResult {
        kept: decisions
            .iter()
            .filter(|d| d.keep())
            .take(MAX_LISTED)
            .map(|d| entry(d))
            .collect(),
        removed: decisions
            .iter()
            .filter(|d| !d.keep())
            .take(MAX_LISTED)
            .map(|d| entry(d))
            .collect(),
        dry_run,
    }
}

/// What a GC did.
pub fn gc(r: &GcReport, block_digests_removed: u64) -> proto::GcResult {
    proto::GcResult {
        indexes: r.indexes,
        chunks_scanned: r.chunks_scanned,
        chunks_removed: r.chunks_removed,
        bytes_removed: r.bytes_removed,
        chunks_referenced: r.chunks_referenced,
        chunks_recent: r.chunks_recent,
        bytes_kept: r.bytes_kept,
        orphan_indexes_removed: r.orphan_indexes_removed,
        block_digests_removed,
        stale_sessions_removed: r.stale_sessions_removed,
        running_sessions: r.running_sessions,
        seconds: r.duration.as_secs_f64(),
        sessions_without_parent: r.sessions_without_parent,
    }
}
