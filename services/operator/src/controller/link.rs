//! What the reconcilers need from a running mover, as a trait: start its jobs, follow
//! them, cancel them. The trait is the reconcilers' test seam (the scenario tests drive
//! them through a fake); [`super::grpc_link::GrpcMoverLink`] implements it over the
//! movers' JobService. A job is sent as the ferry-api request the mover's service takes
//! ([`JobRequest`], built by [`crate::mover::request`] and
//! [`crate::mover::backup_request`]); what comes back is read as a [`JobReport`], the
//! reconcilers' view of a job.
//!
//! Contract every implementation keeps:
//! - `start` is idempotent by the request's idempotency key: starting a job whose key
//!   the mover already knows returns that job as it is (running or finished);
//! - `watch` yields the job as it changes, ending after a report with a terminal state
//!   (an error or an early end means the link or the mover was lost);
//! - nothing here ever carries a secret value except [`MoverAddress::token`], which the
//!   address's `Debug` hides.

use std::collections::BTreeMap;

use async_trait::async_trait;
use ferry_api::proto;
use futures::stream::BoxStream;

use crate::crd::{Checkpoint, Progress};

/// Where a mover listens and how to authenticate to it.
#[derive(Clone, PartialEq, Eq)]
pub struct MoverAddress {
    /// Namespace of the mover pod.
    pub namespace: String,
    /// Name of the mover pod.
    pub pod: String,
    /// The pod's IP.
    pub ip: String,
    /// The gRPC port.
    pub port: u16,
    /// The per-mover bearer token (never logged: `Debug` hides it).
    pub token: String,
}

impl std::fmt::Debug for MoverAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoverAddress")
            .field("namespace", &self.namespace)
            .field("pod", &self.pod)
            .field("ip", &self.ip)
            .field("port", &self.port)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// A job to start on a mover: the request its job service takes (boxed: the requests
/// are large and a reconciler holds a few).
#[derive(Debug, Clone, PartialEq)]
pub enum JobRequest {
    /// A copy into one target or, in one pass, several, resuming from committed ranges
    /// when `resume_from` is set.
    Transfer(Box<proto::StartTransferRequest>),
    /// A checksum.
    Checksum(Box<proto::StartChecksumRequest>),
    /// A backup into a repository.
    Backup(Box<proto::StartBackupRequest>),
    /// A prune of a source's snapshots.
    Prune(Box<proto::StartPruneRequest>),
    /// A restore of a snapshot.
    Restore(Box<proto::StartRestoreRequest>),
    /// A copy of snapshots into another repository.
    Sync(Box<proto::StartSyncRequest>),
}

impl JobRequest {
    /// The request's idempotency key.
    pub fn idempotency_key(&self) -> &str {
        match self {
            Self::Transfer(request) => &request.idempotency_key,
            Self::Checksum(request) => &request.idempotency_key,
            Self::Backup(request) => &request.idempotency_key,
            Self::Prune(request) => &request.idempotency_key,
            Self::Restore(request) => &request.idempotency_key,
            Self::Sync(request) => &request.idempotency_key,
        }
    }

    /// The request's labels.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        match self {
            Self::Transfer(request) => &request.labels,
            Self::Checksum(request) => &request.labels,
            Self::Backup(request) => &request.labels,
            Self::Prune(request) => &request.labels,
            Self::Restore(request) => &request.labels,
            Self::Sync(request) => &request.labels,
        }
    }
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Accepted, not running yet.
    Queued,
    /// Moving bytes.
    Running,
    /// Done.
    Succeeded,
    /// Failed; the report's error says why.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl JobState {
    /// Whether the job will not change any more.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// Why a job failed: the stable kind (`timeout`, `no_space`, ...) and a message with
/// secrets already redacted by the mover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFailure {
    /// The error kind, as ferry names them.
    pub kind: String,
    /// What went wrong and what to do about it.
    pub message: String,
}

/// A job as the mover reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobReport {
    /// The mover's job id.
    pub id: String,
    /// Where the job is.
    pub state: JobState,
    /// Bytes so far.
    pub progress: Progress,
    /// The latest committed ranges of a copy.
    pub checkpoint: Option<Checkpoint>,
    /// The source's digest (`<algorithm>:<hex>`): a verified copy's, or a checksum's result.
    pub source_digest: Option<String>,
    /// The target's digest of a verified copy.
    pub target_digest: Option<String>,
    /// The version of the source the job read (a registry image's manifest digest, an
    /// HTTP object's ETag), when the source names one.
    pub source_version: Option<String>,
    /// Why a failed (or cancelled) job ended.
    pub error: Option<JobFailure>,
    /// A transfer's targets one by one (`Job.targets`); empty when the mover does not
    /// report them, and then the job's state stands for each of its targets.
    pub targets: Vec<TargetReport>,
    /// What a finished backup wrote.
    pub backup: Option<BackupSummary>,
    /// The snapshot a finished restore wrote.
    pub restored_snapshot: Option<String>,
    /// What a finished prune did.
    pub prune: Option<PruneSummary>,
    /// What a finished sync copied.
    pub sync: Option<SyncSummary>,
}

impl JobReport {
    /// A report of job `id` in `state` that says nothing else yet.
    pub fn new(id: impl Into<String>, state: JobState) -> Self {
        Self {
            id: id.into(),
            state,
            progress: Progress::default(),
            checkpoint: None,
            source_digest: None,
            target_digest: None,
            source_version: None,
            error: None,
            targets: Vec::new(),
            backup: None,
            prune: None,
            sync: None,
            restored_snapshot: None,
        }
    }
}

/// What a backup job wrote, once it succeeded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackupSummary {
    /// The snapshot's id.
    pub snapshot_id: String,
    /// The snapshot it built on (empty for a full backup).
    pub parent_id: String,
    /// Bytes of the source read.
    pub bytes_read: u64,
    /// Bytes of chunks stored new.
    pub bytes_new: u64,
    /// Bytes of chunks the repository already had.
    pub bytes_reused: u64,
    /// The image's block hash, `blkhash:<hex>`.
    pub block_hash: String,
    /// How the blocks to read were found (SnapshotMetadata, DirtyBitmap, ChangeDigests;
    /// empty for a full read).
    pub changed_block_tracking: String,
    /// Why it read more than the changed blocks (empty when it did not).
    pub full_reason: String,
}

/// What a prune job did, once it succeeded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneSummary {
    /// Snapshots kept.
    pub kept: u64,
    /// Snapshots removed.
    pub removed: u64,
    /// The ids of the snapshots removed, oldest first; at most
    /// [`crate::crd::MAX_PRUNED_SNAPSHOTS`] of them (the first ones) when more were
    /// removed, so fewer than `removed` then.
    pub removed_ids: Vec<String>,
    /// The ids of the source's snapshots kept, oldest first; at most
    /// [`crate::crd::MAX_KEPT_SNAPSHOTS`] of them (the first ones) when more were kept,
    /// so fewer than `kept` then.
    pub kept_ids: Vec<String>,
}

/// What a sync job copied, once it succeeded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncSummary {
    /// Snapshots copied.
    pub copied: u64,
    /// Selected snapshots the destination had already.
    pub present: u64,
    /// Chunks sent.
    pub chunks_copied: u64,
    /// Bytes sent, as the destination stores them.
    pub bytes_copied: u64,
    /// Snapshots removed from the destination (remove_vanished).
    pub removed: u64,
}

/// One target of a transfer job as the mover reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetReport {
    /// The target's index in the resource's `spec.targets`.
    pub index: usize,
    /// Where it is: Running, Succeeded or Failed.
    pub state: JobState,
    /// Bytes of the source done for it.
    pub done_bytes: u64,
    /// Its digest read back, when the job verifies (`<algorithm>:<hex>`).
    pub digest: Option<String>,
    /// Why it failed.
    pub error: Option<JobFailure>,
    /// It holds every range of the job's checkpoint (false for a target dropped while
    /// the copy went on: a copy resumed from the checkpoint must not include it).
    pub resumable: bool,
}

/// A stream of reports of one job.
pub type ReportStream = BoxStream<'static, Result<JobReport, LinkError>>;

/// The mover could not be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// Not reachable, or the call broke off: worth asking again later.
    #[error("the mover is not reachable: {0}")]
    Unavailable(String),
    /// The mover refused the request as written (retrying it cannot help).
    #[error("the mover refused the request: {0}")]
    Rejected(String),
}

/// Everything the reconcilers need from a running mover.
#[async_trait]
pub trait MoverLink: Send + Sync {
    /// Starts a job (or returns the job of the same idempotency key).
    async fn start(&self, mover: &MoverAddress, job: &JobRequest) -> Result<JobReport, LinkError>;

    /// Follows a job until its terminal state.
    async fn watch(&self, mover: &MoverAddress, job_id: &str) -> Result<ReportStream, LinkError>;

    /// Cancels every job of the resource with this uid (the jobs' owner-uid label).
    async fn cancel(&self, mover: &MoverAddress, owner_uid: &str) -> Result<(), LinkError>;

    /// Tells the relay of every running job of the resource with this uid that no reader
    /// is still to come (its copy done, it ends once its readers have gone).
    async fn end_relay(&self, mover: &MoverAddress, owner_uid: &str) -> Result<(), LinkError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_never_printed() {
        let mover = MoverAddress {
            namespace: "vms".into(),
            pod: "import-ft-1".into(),
            ip: "10.0.0.1".into(),
            port: 50051,
            token: "s3cr3t-token".into(),
        };
        let text = format!("{mover:?}");
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(text.contains("import-ft-1"), "{text}");
    }
}
