//! Job records on the wire: `ferry.v1.Job` from a record (with the request echoed), and
//! the wire's job states and kinds as the domain's.

use ferry_core::{Error, ErrorKind, Result};
use ferry_engine::HashAlgorithm;
use prost::Message;

use super::checkpoint::checkpoint_to_proto;
use crate::model::job::{
    DigestRecord, JobKind, JobRecord, JobState, ResultRecord, TargetRecord, TargetState,
};
use ferry_api::proto;

fn timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

pub fn state(s: JobState) -> proto::JobState {
    match s {
        JobState::Queued => proto::JobState::Queued,
        JobState::Running => proto::JobState::Running,
        JobState::Succeeded => proto::JobState::Succeeded,
        JobState::Failed => proto::JobState::Failed,
        JobState::Cancelled => proto::JobState::Cancelled,
    }
}

/// The domain state of a wire state (None for UNSPECIFIED and unknown values).
pub fn state_from_proto(v: i32) -> Option<JobState> {
    match proto::JobState::try_from(v).ok()? {
        proto::JobState::Unspecified => None,
        proto::JobState::Queued => Some(JobState::Queued),
        proto::JobState::Running => Some(JobState::Running),
        proto::JobState::Succeeded => Some(JobState::Succeeded),
        proto::JobState::Failed => Some(JobState::Failed),
        proto::JobState::Cancelled => Some(JobState::Cancelled),
    }
}

fn digest(d: &DigestRecord) -> proto::Digest {
    let algorithm = d.algorithm.parse().unwrap_or(HashAlgorithm::Blkhash);
    proto::Digest {
        algorithm: proto::HashAlgorithm::from(algorithm) as i32,
        hex: d.hex.clone(),
    }
}

fn throughput(size: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        size as f64 / seconds
    } else {
        0.0
    }
}

fn target(t: &TargetRecord) -> proto::TargetOutcome {
    proto::TargetOutcome {
        target: t.target.clone(),
        state: match t.state {
            TargetState::Running => proto::TargetState::Running,
            TargetState::Succeeded => proto::TargetState::Succeeded,
            TargetState::Failed => proto::TargetState::Failed,
        } as i32,
        error: t.error.as_ref().map(|e| proto::JobError {
            kind: e.kind.clone(),
            message: e.message.clone(),
        }),
        digest: t.digest.as_ref().map(digest),
        done_bytes: t.done,
        resumable: t.resumable,
    }
}

/// Replaces each endpoint's URL with its shown form ([`super::shown_url`]: no user info,
/// no query of an HTTP URL, which may carry a presigned signature), for everything the
/// service sends back of a stored request: jobs and schedule templates.
pub fn show_urls<'a>(endpoints: impl IntoIterator<Item = &'a mut proto::Endpoint>) {
    for ep in endpoints {
        ep.url = super::shown_url(&ep.url);
    }
}

/// The wire value of a job kind.
pub fn kind_to_proto(kind: JobKind) -> proto::JobKind {
    match kind {
        JobKind::Transfer => proto::JobKind::Transfer,
        JobKind::Checksum => proto::JobKind::Checksum,
        JobKind::Backup => proto::JobKind::Backup,
        JobKind::Restore => proto::JobKind::Restore,
        JobKind::RepositoryVerify => proto::JobKind::RepositoryVerify,
        JobKind::Prune => proto::JobKind::Prune,
        JobKind::Gc => proto::JobKind::Gc,
        JobKind::Sync => proto::JobKind::Sync,
    }
}

/// The request a job was started with, its URLs shown as the API shows them.
fn request_to_proto(r: &JobRecord) -> Option<proto::job::Request> {
    match r.kind {
        JobKind::Transfer => proto::StartTransferRequest::decode(r.request.as_slice())
            .ok()
            .map(proto::job::Request::Transfer),
        JobKind::Checksum => proto::StartChecksumRequest::decode(r.request.as_slice())
            .ok()
            .map(proto::job::Request::Checksum),
        JobKind::Backup => proto::StartBackupRequest::decode(r.request.as_slice())
            .ok()
            .map(proto::job::Request::Backup),
        JobKind::Restore => proto::StartRestoreRequest::decode(r.request.as_slice())
            .ok()
            .map(proto::job::Request::Restore),
        JobKind::RepositoryVerify => {
            proto::StartRepositoryVerifyRequest::decode(r.request.as_slice())
                .ok()
                .map(proto::job::Request::RepositoryVerify)
        }
        JobKind::Prune => proto::StartPruneRequest::decode(r.request.as_slice())
            .ok()
            .map(proto::job::Request::Prune),
        JobKind::Gc => proto::StartGcRequest::decode(r.request.as_slice())
            .ok()
            .map(proto::job::Request::Gc),
        JobKind::Sync => proto::StartSyncRequest::decode(r.request.as_slice())
            .ok()
            .map(proto::job::Request::Sync),
    }
    .map(|mut request| {
        let endpoints: Vec<&mut proto::Endpoint> = match &mut request {
            proto::job::Request::Transfer(t) => t
                .source
                .iter_mut()
                .chain(t.target.iter_mut())
                .chain(t.more_targets.iter_mut())
                .collect(),
            proto::job::Request::Checksum(c) => c.source.iter_mut().collect(),
            proto::job::Request::Backup(b) => b.source.iter_mut().collect(),
            proto::job::Request::Restore(r) => r.target.iter_mut().collect(),
            _ => Vec::new(),
        };
        show_urls(endpoints);
        request
    })
}

/// The result of a finished job.
fn result_to_proto(r: &JobRecord) -> Option<proto::job::Result> {
    r.result.as_ref().and_then(|res| match res {
        ResultRecord::Transfer {
            size,
            data_bytes,
            zero_bytes,
            seconds,
            source_digest,
            target_digest,
            resumed_bytes,
        } => Some(proto::job::Result::TransferResult(proto::TransferResult {
            size: *size,
            data_bytes: *data_bytes,
            zero_bytes: *zero_bytes,
            seconds: *seconds,
            throughput_bytes_per_second: throughput(*size, *seconds),
            source_digest: source_digest.as_ref().map(digest),
            target_digest: target_digest.as_ref().map(digest),
            resumed_bytes: *resumed_bytes,
        })),
        ResultRecord::Checksum {
            digest: d,
            size,
            seconds,
        } => Some(proto::job::Result::ChecksumResult(proto::ChecksumResult {
            digest: Some(digest(d)),
            size: *size,
            seconds: *seconds,
            throughput_bytes_per_second: throughput(*size, *seconds),
        })),
        ResultRecord::Backup { result } => proto::BackupResult::decode(result.as_slice())
            .ok()
            .map(proto::job::Result::BackupResult),
        ResultRecord::Restore { result } => proto::RestoreResult::decode(result.as_slice())
            .ok()
            .map(proto::job::Result::RestoreResult),
        ResultRecord::RepositoryVerify { result } => {
            proto::RepositoryVerifyResult::decode(result.as_slice())
                .ok()
                .map(proto::job::Result::RepositoryVerifyResult)
        }
        ResultRecord::Prune { result } => proto::PruneResult::decode(result.as_slice())
            .ok()
            .map(proto::job::Result::PruneResult),
        ResultRecord::Gc { result } => proto::GcResult::decode(result.as_slice())
            .ok()
            .map(proto::job::Result::GcResult),
        ResultRecord::Sync { result } => proto::SyncResult::decode(result.as_slice())
            .ok()
            .map(proto::job::Result::SyncResult),
    })
}

/// The wire form of a job.
pub fn job_to_proto(r: &JobRecord) -> proto::Job {
    let p = &r.progress;
    proto::Job {
        id: r.id.clone(),
        kind: kind_to_proto(r.kind) as i32,
        state: state(r.state) as i32,
        idempotency_key: r.idempotency_key.clone(),
        labels: r.labels.clone(),
        priority: r.priority,
        create_time: Some(timestamp(r.created_ms)),
        start_time: r.started_ms.map(timestamp),
        end_time: r.ended_ms.map(timestamp),
        progress: Some(proto::Progress {
            total_bytes: p.total,
            done_bytes: p.done,
            data_bytes: p.data,
            zero_bytes: p.zero,
            resumed_bytes: p.resumed,
            committed_bytes: p.committed,
            bytes_per_second: p.bytes_per_second,
        }),
        attempt: r.attempt,
        request: request_to_proto(r),
        result: result_to_proto(r),
        error: r.error.as_ref().map(|e| proto::JobError {
            kind: e.kind.clone(),
            message: e.message.clone(),
        }),
        message: r.message.clone(),
        checkpoint: r.checkpoint.as_ref().map(checkpoint_to_proto),
        targets: r.targets.iter().map(target).collect(),
        source_version: r.source_version.clone().unwrap_or_default(),
    }
}

/// The kind of a wire JobKind filter (None: any).
pub fn kind_from_proto(v: i32) -> Result<Option<JobKind>> {
    match proto::JobKind::try_from(v) {
        Ok(proto::JobKind::Unspecified) => Ok(None),
        Ok(proto::JobKind::Transfer) => Ok(Some(JobKind::Transfer)),
        Ok(proto::JobKind::Checksum) => Ok(Some(JobKind::Checksum)),
        Ok(proto::JobKind::Backup) => Ok(Some(JobKind::Backup)),
        Ok(proto::JobKind::Restore) => Ok(Some(JobKind::Restore)),
        Ok(proto::JobKind::RepositoryVerify) => Ok(Some(JobKind::RepositoryVerify)),
        Ok(proto::JobKind::Prune) => Ok(Some(JobKind::Prune)),
        Ok(proto::JobKind::Gc) => Ok(Some(JobKind::Gc)),
        Ok(proto::JobKind::Sync) => Ok(Some(JobKind::Sync)),
        Err(_) => Err(Error::new(
            ErrorKind::InvalidInput,
            format!("kind {v} is not a JobKind"),
        )),
    }
}
