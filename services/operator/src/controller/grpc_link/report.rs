//! A mover's job as the reconcilers read it: `proto::Job` (what the JobService answers
//! and streams) into a [`JobReport`], with digests spelled as the custom resources
//! spell them (`<algorithm>:<hex>`), a transfer's targets under their indexes in the
//! resource's `spec.targets` (from the job's [`TARGET_LABEL`]), and the snapshot lists of
//! a prune bounded (they come from the network).

use ferry_api::proto;

use crate::controller::link::{
    BackupSummary, JobFailure, JobReport, JobState, PruneSummary, SyncSummary, TargetReport,
};
use crate::crd::backup::is_snapshot_id;
use crate::crd::{kept_snapshots, pruned_snapshots, Checkpoint, Progress};
use crate::events::within;
use crate::mover::request::{target_indexes, TARGET_LABEL};

/// `<algorithm>:<hex>`, as the custom resources spell digests.
fn digest(d: Option<&proto::Digest>) -> Option<String> {
    let d = d.filter(|d| !d.hex.is_empty())?;
    let algorithm = ferry_api::options::hash_algorithm(d.algorithm).ok()?;
    Some(format!("{}:{}", algorithm.as_str(), d.hex))
}

fn failure(e: &proto::JobError) -> JobFailure {
    JobFailure {
        kind: e.kind.clone(),
        message: e.message.clone(),
    }
}

/// A transfer's targets, each with its index in the resource's `spec.targets` as the
/// job's target label names them (their position in the job without the label).
fn targets(job: &proto::Job) -> Vec<TargetReport> {
    let indexes = match &job.request {
        Some(proto::job::Request::Transfer(r)) => r
            .labels
            .get(TARGET_LABEL)
            .and_then(|l| target_indexes(l.as_str()))
            .filter(|i| i.len() == job.targets.len()),
        _ => None,
    };
    job.targets
        .iter()
        .enumerate()
        .map(|(k, t)| TargetReport {
            index: indexes.as_ref().map_or(k, |i| i[k]),
            state: match proto::TargetState::try_from(t.state) {
                Ok(proto::TargetState::Succeeded) => JobState::Succeeded,
                Ok(proto::TargetState::Failed) => JobState::Failed,
                _ => JobState::Running,
            },
            done_bytes: t.done_bytes,
            digest: digest(t.digest.as_ref()),
            error: t.error.as_ref().map(failure),
            resumable: t.resumable,
        })
        .collect()
}

/// A job as the reconciler reads it.
pub fn report(job: &proto::Job) -> JobReport {
    let state = match proto::JobState::try_from(job.state) {
        Ok(proto::JobState::Running) => JobState::Running,
        Ok(proto::JobState::Succeeded) => JobState::Succeeded,
        Ok(proto::JobState::Failed) => JobState::Failed,
        Ok(proto::JobState::Cancelled) => JobState::Cancelled,
        _ => JobState::Queued,
    };
    let progress = job
        .progress
        .as_ref()
        .map(|p| Progress {
            total_bytes: p.total_bytes,
            done_bytes: p.done_bytes,
            resumed_bytes: p.resumed_bytes,
            committed_bytes: p.committed_bytes,
        })
        .unwrap_or_default();
    let checkpoint = job
        .checkpoint
        .as_ref()
        .map(|c| Checkpoint::new(c.size, c.committed.iter().map(|r| (r.start, r.end))));
    let (source_digest, target_digest) = match &job.result {
        Some(proto::job::Result::TransferResult(r)) => (
            digest(r.source_digest.as_ref()),
            digest(r.target_digest.as_ref()),
        ),
        Some(proto::job::Result::ChecksumResult(r)) => (digest(r.digest.as_ref()), None),
        _ => (None, None),
    };
    let backup = match &job.result {
        Some(proto::job::Result::BackupResult(r)) => Some(BackupSummary {
            snapshot_id: r.snapshot_id.clone(),
            parent_id: r.parent_id.clone(),
            bytes_read: r.bytes_read,
            bytes_new: r.bytes_new,
            bytes_reused: r.bytes_reused,
            block_hash: digest(r.digest.as_ref()).unwrap_or_default(),
            // Bounded: the texts come from the network and go into the status.
            changed_block_tracking: within(&r.changed_block_tracking, 32).to_string(),
            full_reason: within(&r.full_reason, 1024).to_string(),
        }),
        _ => None,
    };
    let prune = match &job.result {
        Some(proto::job::Result::PruneResult(r)) => Some(PruneSummary {
            kept: r.kept.len() as u64,
            removed: r.removed.len() as u64,
            // Bounded: the list comes from the network.
            removed_ids: pruned_snapshots(r.removed.iter().map(|s| s.id.as_str())),
            kept_ids: kept_snapshots(r.kept.iter().map(|s| s.id.as_str())),
        }),
        _ => None,
    };
    let sync = match &job.result {
        Some(proto::job::Result::SyncResult(r)) => Some(SyncSummary {
            copied: r.backups_copied,
            present: r.backups_present,
            chunks_copied: r.chunks_copied,
            bytes_copied: r.bytes_copied,
            removed: r.removed.len() as u64,
        }),
        _ => None,
    };
    JobReport {
        id: job.id.clone(),
        state,
        progress,
        checkpoint,
        source_digest,
        target_digest,
        // Bounded: the text comes from the network.
        source_version: (!job.source_version.is_empty() && job.source_version.len() <= 256)
            .then(|| job.source_version.clone()),
        error: job.error.as_ref().map(failure),
        targets: targets(job),
        backup,
        prune,
        sync,
        restored_snapshot: match &job.result {
            // Checked: the id goes into the status.
            Some(proto::job::Result::RestoreResult(r)) if is_snapshot_id(&r.snapshot_id) => {
                Some(r.snapshot_id.clone())
            }
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_become_reports() {
        let job = proto::Job {
            id: "j1".into(),
            state: proto::JobState::Succeeded as i32,
            progress: Some(proto::Progress {
                total_bytes: 100,
                done_bytes: 100,
                committed_bytes: 100,
                ..proto::Progress::default()
            }),
            checkpoint: Some(proto::Checkpoint {
                size: 100,
                committed: vec![proto::Range { start: 0, end: 100 }],
            }),
            result: Some(proto::job::Result::TransferResult(proto::TransferResult {
                source_digest: Some(proto::Digest {
                    algorithm: proto::HashAlgorithm::Sha256 as i32,
                    hex: "ab".into(),
                }),
                target_digest: Some(proto::Digest {
                    algorithm: proto::HashAlgorithm::Sha256 as i32,
                    hex: "ab".into(),
                }),
                ..proto::TransferResult::default()
            })),
            ..proto::Job::default()
        };
        let r = report(&job);
        assert_eq!(r.source_version, None);
        let pinned = proto::Job {
            source_version: format!("sha256:{}", "ab".repeat(32)),
            ..job.clone()
        };
        assert_eq!(
            report(&pinned).source_version,
            Some(format!("sha256:{}", "ab".repeat(32)))
        );
        let huge = proto::Job {
            source_version: "x".repeat(10_000),
            ..job.clone()
        };
        assert_eq!(report(&huge).source_version, None);
        assert_eq!(r.state, JobState::Succeeded);
        assert_eq!(r.progress.total_bytes, 100);
        assert_eq!(r.checkpoint, Some(Checkpoint::new(100, [(0, 100)])));
        assert_eq!(r.source_digest.as_deref(), Some("sha256:ab"));
        assert_eq!(r.target_digest.as_deref(), Some("sha256:ab"));
        let failed = proto::Job {
            state: proto::JobState::Failed as i32,
            error: Some(proto::JobError {
                kind: "no_space".into(),
                message: "full".into(),
            }),
            ..proto::Job::default()
        };
        let r = report(&failed);
        assert_eq!(
            r.error,
            Some(JobFailure {
                kind: "no_space".into(),
                message: "full".into()
            })
        );
        assert_eq!(r.source_digest, None);
    }

    /// Each target outcome of a fan-out is reported under its index in the resource's
    /// targets, as the job's target label lists them.
    #[test]
    fn target_outcomes_keep_the_resource_indexes() {
        let outcome = |state: proto::TargetState| proto::TargetOutcome {
            target: "/dev/ferry/t".into(),
            state: state as i32,
            ..proto::TargetOutcome::default()
        };
        let mut job = proto::Job {
            state: proto::JobState::Failed as i32,
            request: Some(proto::job::Request::Transfer(proto::StartTransferRequest {
                labels: [(TARGET_LABEL.to_string(), "2,5".to_string())].into(),
                ..proto::StartTransferRequest::default()
            })),
            targets: vec![
                outcome(proto::TargetState::Succeeded),
                proto::TargetOutcome {
                    error: Some(proto::JobError {
                        kind: "io".into(),
                        message: "gone".into(),
                    }),
                    resumable: false,
                    ..outcome(proto::TargetState::Failed)
                },
            ],
            ..proto::Job::default()
        };
        let r = report(&job);
        let seen: Vec<(usize, JobState)> = r.targets.iter().map(|t| (t.index, t.state)).collect();
        assert_eq!(seen, [(2, JobState::Succeeded), (5, JobState::Failed)]);
        assert_eq!(r.targets[1].error.as_ref().unwrap().kind, "io");
        assert!(!r.targets[1].resumable);
        job.request = None;
        let seen: Vec<usize> = report(&job).targets.iter().map(|t| t.index).collect();
        assert_eq!(seen, [0, 1]);
    }
}
