//! The operator's [`MoverLink`] over gRPC: the reconcilers of ferry-operator start,
//! follow and cancel a mover's jobs through the JobService of the `ferry serve` in the
//! mover pod, authenticated with the mover's bearer token. It lives here, beside the
//! generated types, because ferry-operator must not depend on this crate.
//!
//! `start` keeps the trait's idempotency contract: when the mover already has a job of
//! the same idempotency key started with another request (a restarted operator resuming
//! from a newer checkpoint), that job is looked up by its labels and returned.

use std::time::Duration;

use async_trait::async_trait;
use ferry_core::Secret;
use ferry_operator::controller::{
    BackupSummary, JobFailure, JobReport, JobRequest, JobState, LinkError, MoverAddress, MoverLink,
    PruneSummary, ReportStream, TargetReport,
};
use ferry_operator::crd::{
    kept_snapshots, pruned_snapshots, CacheMode, Checkpoint, CommitOrder, HashAlgorithm,
    ImageFormat, Preallocation, Progress,
};
use ferry_operator::mover::backup_request::{
    Parent, StartBackup, StartPrune, StartRestore, WireRepository, WireRetention,
};
use ferry_operator::mover::request::{
    target_indexes, EndpointOptions, SecretRef, StartChecksum, StartTransfer, WireEndpoint,
    WireTransferOptions, OWNER_UID_LABEL, TARGET_LABEL,
};
use futures_util::StreamExt;
use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use ferry_api::auth::BearerToken;
use ferry_api::proto::{self, job_service_client::JobServiceClient};

type Client = JobServiceClient<InterceptedService<Channel, BearerToken>>;

/// Most pages of jobs read when looking a job up by its labels.
const MAX_PAGES: usize = 16;

/// [`MoverLink`] over the movers' gRPC JobService.
#[derive(Debug, Clone)]
pub struct GrpcMoverLink {
    connect_timeout: Duration,
}

impl Default for GrpcMoverLink {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl GrpcMoverLink {
    /// A link that gives up connecting to a mover after `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Self {
        Self { connect_timeout }
    }

    async fn client(&self, mover: &MoverAddress) -> Result<Client, LinkError> {
        let host = if mover.ip.contains(':') {
            format!("[{}]", mover.ip)
        } else {
            mover.ip.clone()
        };
        let channel = Endpoint::from_shared(format!("http://{host}:{}", mover.port))
            .map_err(|e| LinkError::Rejected(format!("mover address {host}: {e}")))?
            .connect_timeout(self.connect_timeout)
            .connect()
            .await
            .map_err(|e| LinkError::Unavailable(format!("{}: {e}", mover.pod)))?;
        let token = Secret::new(mover.token.clone());
        let auth =
            BearerToken::new(Some(&token)).map_err(|e| LinkError::Rejected(e.to_string()))?;
        Ok(JobServiceClient::with_interceptor(channel, auth))
    }
}

/// A gRPC status as the reconciler needs it: worth asking again, or not.
fn link_error(status: &Status) -> LinkError {
    let text = format!("{:?}: {}", status.code(), status.message());
    match status.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::Cancelled
        | Code::Unknown
        | Code::ResourceExhausted
        | Code::FailedPrecondition => LinkError::Unavailable(text),
        _ => LinkError::Rejected(text),
    }
}

#[async_trait]
impl MoverLink for GrpcMoverLink {
    async fn start(&self, mover: &MoverAddress, job: &JobRequest) -> Result<JobReport, LinkError> {
        let mut client = self.client(mover).await?;
        let (result, labels) = match job {
            JobRequest::Transfer {
                request,
                resume_from,
            } => (
                client
                    .start_transfer(transfer_request(request, resume_from.as_ref()))
                    .await,
                &request.labels,
            ),
            JobRequest::Checksum(request) => (
                client.start_checksum(checksum_request(request)).await,
                &request.labels,
            ),
            JobRequest::Backup(request) => (
                client.start_backup(backup_request(request)).await,
                &request.labels,
            ),
            JobRequest::Prune(request) => (
                client.start_prune(prune_request(request)).await,
                &request.labels,
            ),
            JobRequest::Restore(request) => (
                client.start_restore(restore_request(request)).await,
                &request.labels,
            ),
        };
        match result {
            Ok(job) => Ok(report(&job.into_inner())),
            Err(status) if status.code() == Code::AlreadyExists => {
                find_by_key(&mut client, labels, job.idempotency_key())
                    .await?
                    .ok_or_else(|| link_error(&status))
            }
            Err(status) => Err(link_error(&status)),
        }
    }

    async fn watch(&self, mover: &MoverAddress, job_id: &str) -> Result<ReportStream, LinkError> {
        let mut client = self.client(mover).await?;
        let stream = client
            .watch_job(proto::WatchJobRequest { id: job_id.into() })
            .await
            .map_err(|s| link_error(&s))?
            .into_inner();
        Ok(stream
            .map(|event| match event {
                Ok(proto::JobEvent { job: Some(job) }) => Ok(report(&job)),
                Ok(proto::JobEvent { job: None }) => Err(LinkError::Unavailable(
                    "the mover sent an event without a job".into(),
                )),
                Err(status) => Err(link_error(&status)),
            })
            .boxed())
    }

    async fn cancel(&self, mover: &MoverAddress, owner_uid: &str) -> Result<(), LinkError> {
        let mut client = self.client(mover).await?;
        let labels = [(OWNER_UID_LABEL.to_string(), owner_uid.to_string())].into();
        let states = vec![
            proto::JobState::Queued as i32,
            proto::JobState::Running as i32,
        ];
        for job in list(&mut client, &labels, states).await? {
            match client
                .cancel_job(proto::CancelJobRequest { id: job.id })
                .await
            {
                Ok(_) => {}
                // Ended in the meantime.
                Err(s) if s.code() == Code::FailedPrecondition || s.code() == Code::NotFound => {}
                Err(s) => return Err(link_error(&s)),
            }
        }
        Ok(())
    }
}

/// Jobs with these labels (and states, when given), at most [`MAX_PAGES`] pages.
async fn list(
    client: &mut Client,
    labels: &std::collections::BTreeMap<String, String>,
    states: Vec<i32>,
) -> Result<Vec<proto::Job>, LinkError> {
    let mut jobs = Vec::new();
    let mut page_token = String::new();
    for _ in 0..MAX_PAGES {
        let page = client
            .list_jobs(proto::ListJobsRequest {
                states: states.clone(),
                labels: labels.clone(),
                kind: 0,
                page_size: 100,
                page_token,
            })
            .await
            .map_err(|s| link_error(&s))?
            .into_inner();
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    Ok(jobs)
}

async fn find_by_key(
    client: &mut Client,
    labels: &std::collections::BTreeMap<String, String>,
    key: &str,
) -> Result<Option<JobReport>, LinkError> {
    Ok(list(client, labels, Vec::new())
        .await?
        .iter()
        .find(|j| j.idempotency_key == key)
        .map(report))
}

fn secret(r: &SecretRef) -> proto::SecretRef {
    match r {
        SecretRef::File(file) => proto::SecretRef {
            source: Some(proto::secret_ref::Source::File(file.clone())),
        },
    }
}

fn endpoint(e: &WireEndpoint) -> proto::Endpoint {
    let options = e.options.as_ref().map(|o| match o {
        EndpointOptions::Iscsi { user, password } => {
            proto::endpoint::Options::Iscsi(proto::IscsiOptions {
                user: user.clone(),
                password: password.as_ref().map(secret),
            })
        }
        EndpointOptions::S3(s3) => proto::endpoint::Options::S3(proto::S3Options {
            endpoint_url: s3.endpoint_url.clone(),
            region: s3.region.clone(),
            access_key_id: s3.access_key_id.as_ref().map(secret),
            secret_access_key: s3.secret_access_key.as_ref().map(secret),
            session_token: s3.session_token.as_ref().map(secret),
            force_path_style: s3.force_path_style,
        }),
        EndpointOptions::Nbd {
            tls_certificates_dir,
        } => proto::endpoint::Options::Nbd(proto::NbdOptions {
            tls_certificates_dir: tls_certificates_dir.clone(),
        }),
        EndpointOptions::Http(http) => proto::endpoint::Options::Http(proto::HttpOptions {
            user: http.user.clone(),
            password: http.password.as_ref().map(secret),
            bearer_token: http.bearer_token.as_ref().map(secret),
            headers: http
                .headers
                .iter()
                .map(|(name, value)| proto::HttpHeader {
                    name: name.clone(),
                    value: Some(secret(value)),
                })
                .collect(),
            ca_certificates: http.ca_certificates.as_ref().map(secret),
            client_certificate: http.client_certificate.as_ref().map(secret),
            client_key: http.client_key.as_ref().map(secret),
            ..proto::HttpOptions::default()
        }),
    });
    proto::Endpoint {
        url: e.url.clone(),
        options,
        format: image_format(e.format) as i32,
        allow_backing: e.allow_backing,
        ..proto::Endpoint::default()
    }
}

fn image_format(f: ImageFormat) -> proto::ImageFormat {
    match f {
        ImageFormat::Auto => proto::ImageFormat::Auto,
        ImageFormat::Raw => proto::ImageFormat::Raw,
        ImageFormat::Qcow2 => proto::ImageFormat::Qcow2,
        ImageFormat::Gz => proto::ImageFormat::Gz,
        ImageFormat::Xz => proto::ImageFormat::Xz,
        ImageFormat::Zst => proto::ImageFormat::Zst,
    }
}

fn hash(a: HashAlgorithm) -> i32 {
    match a {
        HashAlgorithm::Blkhash => proto::HashAlgorithm::Blkhash as i32,
        HashAlgorithm::Sha256 => proto::HashAlgorithm::Sha256 as i32,
    }
}

fn cache(c: CacheMode) -> i32 {
    match c {
        CacheMode::PageCache => proto::CacheMode::PageCache as i32,
        CacheMode::Direct => proto::CacheMode::None as i32,
    }
}

fn transfer_options(o: &WireTransferOptions) -> proto::TransferOptions {
    proto::TransferOptions {
        workers: o.workers,
        request_size: o.request_size,
        order: match o.order {
            CommitOrder::Auto => proto::CommitOrder::Auto,
            CommitOrder::InOrder => proto::CommitOrder::InOrder,
            CommitOrder::OutOfOrder => proto::CommitOrder::OutOfOrder,
        } as i32,
        sparse_size: o.sparse_size,
        target_is_zero: o.target_is_zero,
        preallocation: match o.preallocation {
            Preallocation::Off => proto::Preallocation::Off,
            Preallocation::Falloc => proto::Preallocation::Falloc,
            Preallocation::Full => proto::Preallocation::Full,
            Preallocation::Grow => proto::Preallocation::Grow,
        } as i32,
        preallocation_step: o.preallocation_step,
        cache: cache(o.cache),
        rate_limit: o.rate_limit,
        verify: o.verify,
        verify_algorithm: hash(o.verify_algorithm),
    }
}

/// The wire request of a copy, resuming from `resume_from` when given.
pub fn transfer_request(
    r: &StartTransfer,
    resume_from: Option<&Checkpoint>,
) -> proto::StartTransferRequest {
    proto::StartTransferRequest {
        source: Some(endpoint(&r.source)),
        target: Some(endpoint(&r.target)),
        options: Some(transfer_options(&r.options)),
        idempotency_key: r.idempotency_key.clone(),
        labels: r.labels.clone(),
        priority: r.priority,
        refuse_if_target_busy: r.refuse_if_target_busy,
        more_targets: r.more_targets.iter().map(endpoint).collect(),
        resume_from: resume_from.map(|c| proto::Checkpoint {
            size: c.size,
            committed: c
                .committed
                .iter()
                .map(|[start, end]| proto::Range {
                    start: *start,
                    end: *end,
                })
                .collect(),
        }),
    }
}

/// The wire request of a checksum.
pub fn checksum_request(r: &StartChecksum) -> proto::StartChecksumRequest {
    proto::StartChecksumRequest {
        source: Some(endpoint(&r.source)),
        options: Some(proto::ChecksumOptions {
            algorithm: hash(r.options.algorithm),
            workers: r.options.workers,
            request_size: r.options.request_size,
            threads: r.options.threads,
            cache: cache(r.options.cache),
        }),
        idempotency_key: r.idempotency_key.clone(),
        labels: r.labels.clone(),
        priority: r.priority,
    }
}

fn repository(r: &WireRepository) -> proto::Repository {
    let s3 = match &r.options {
        Some(EndpointOptions::S3(s3)) => Some(proto::S3Options {
            endpoint_url: s3.endpoint_url.clone(),
            region: s3.region.clone(),
            access_key_id: s3.access_key_id.as_ref().map(secret),
            secret_access_key: s3.secret_access_key.as_ref().map(secret),
            session_token: s3.session_token.as_ref().map(secret),
            force_path_style: s3.force_path_style,
        }),
        _ => None,
    };
    proto::Repository {
        url: r.url.clone(),
        s3,
        key: r.key.as_ref().map(secret),
    }
}

fn retention(r: &WireRetention) -> proto::Retention {
    let count = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    proto::Retention {
        keep_last: count(r.last),
        keep_hourly: count(r.hourly),
        keep_daily: count(r.daily),
        keep_weekly: count(r.weekly),
        keep_monthly: count(r.monthly),
        keep_yearly: count(r.yearly),
        keep_within: r.within.clone(),
    }
}

/// The wire request of a backup.
pub fn backup_request(r: &StartBackup) -> proto::StartBackupRequest {
    proto::StartBackupRequest {
        source: Some(endpoint(&r.source)),
        repository: Some(repository(&r.repository)),
        parent: match &r.parent {
            Parent::Auto => "auto".into(),
            Parent::None => "none".into(),
            Parent::Id(id) => id.clone(),
        },
        source_id: r.source_id.clone(),
        tags: r.tags.clone().into_iter().collect(),
        init_if_missing: r.initialize.then(proto::RepositoryInit::default),
        idempotency_key: r.idempotency_key.clone(),
        labels: r.labels.clone(),
        ..proto::StartBackupRequest::default()
    }
}

/// The wire request of a prune.
pub fn prune_request(r: &StartPrune) -> proto::StartPruneRequest {
    proto::StartPruneRequest {
        repository: Some(repository(&r.repository)),
        retention: Some(retention(&r.retain)),
        source_id: r.source_id.clone(),
        idempotency_key: r.idempotency_key.clone(),
        labels: r.labels.clone(),
        ..proto::StartPruneRequest::default()
    }
}

/// The wire request of a restore.
pub fn restore_request(r: &StartRestore) -> proto::StartRestoreRequest {
    proto::StartRestoreRequest {
        repository: Some(repository(&r.repository)),
        snapshot_id: r.snapshot_id.clone(),
        target: Some(endpoint(&r.target)),
        idempotency_key: r.idempotency_key.clone(),
        labels: r.labels.clone(),
        refuse_if_target_busy: true,
        ..proto::StartRestoreRequest::default()
    }
}

/// `<algorithm>:<hex>`, as the custom resources spell digests.
fn digest(d: Option<&proto::Digest>) -> Option<String> {
    let d = d.filter(|d| !d.hex.is_empty())?;
    let algorithm = match proto::HashAlgorithm::try_from(d.algorithm).ok()? {
        proto::HashAlgorithm::Blkhash => "blkhash",
        proto::HashAlgorithm::Sha256 => "sha256",
    };
    Some(format!("{algorithm}:{}", d.hex))
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
    JobReport {
        id: job.id.clone(),
        state,
        progress,
        checkpoint,
        source_digest,
        target_digest,
        error: job.error.as_ref().map(failure),
        targets: targets(job),
        backup,
        prune,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ferry_operator::mover::request::{S3Options, WireChecksumOptions};

    use super::*;

    #[test]
    fn requests_map_field_by_field() {
        let r = StartTransfer {
            source: WireEndpoint {
                url: "s3://b/k".into(),
                options: Some(EndpointOptions::S3(S3Options {
                    region: "eu".into(),
                    access_key_id: Some(SecretRef::File("s3/id".into())),
                    secret_access_key: Some(SecretRef::File("s3/key".into())),
                    ..S3Options::default()
                })),
                ..WireEndpoint::default()
            },
            target: WireEndpoint {
                url: "/dev/ferry/copy".into(),
                options: None,
                ..WireEndpoint::default()
            },
            more_targets: vec![WireEndpoint {
                url: "/dev/ferry/copy2".into(),
                options: None,
                ..WireEndpoint::default()
            }],
            options: WireTransferOptions {
                workers: 4,
                order: CommitOrder::InOrder,
                cache: CacheMode::Direct,
                verify: true,
                verify_algorithm: HashAlgorithm::Sha256,
                ..WireTransferOptions::default()
            },
            idempotency_key: "uid/0".into(),
            labels: BTreeMap::from([("ferry.dev/owner-uid".into(), "uid".into())]),
            priority: 0,
            refuse_if_target_busy: true,
        };
        let checkpoint = Checkpoint::new(100, [(0, 10), (20, 30)]);
        let p = transfer_request(&r, Some(&checkpoint));
        let Some(proto::endpoint::Options::S3(s3)) = p.source.as_ref().unwrap().options.clone()
        else {
            panic!("{p:?}")
        };
        assert_eq!(
            s3.secret_access_key.unwrap().source,
            Some(proto::secret_ref::Source::File("s3/key".into()))
        );
        let o = p.options.unwrap();
        assert_eq!(o.order, proto::CommitOrder::InOrder as i32);
        assert_eq!(o.cache, proto::CacheMode::None as i32);
        assert_eq!(o.verify_algorithm, proto::HashAlgorithm::Sha256 as i32);
        assert!(p.refuse_if_target_busy);
        assert_eq!(p.more_targets.len(), 1);
        assert_eq!(p.more_targets[0].url, "/dev/ferry/copy2");
        let resume = p.resume_from.unwrap();
        assert_eq!(resume.size, 100);
        assert_eq!(
            resume.committed,
            vec![
                proto::Range { start: 0, end: 10 },
                proto::Range { start: 20, end: 30 }
            ]
        );
        let c = checksum_request(&StartChecksum {
            source: r.target.clone(),
            options: WireChecksumOptions {
                algorithm: HashAlgorithm::Sha256,
                ..WireChecksumOptions::default()
            },
            idempotency_key: "uid".into(),
            labels: BTreeMap::new(),
            priority: 0,
        });
        assert_eq!(
            c.options.unwrap().algorithm,
            proto::HashAlgorithm::Sha256 as i32
        );
    }

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

    #[test]
    fn statuses_split_into_retry_and_refuse() {
        assert!(matches!(
            link_error(&Status::unavailable("down")),
            LinkError::Unavailable(_)
        ));
        assert!(matches!(
            link_error(&Status::invalid_argument("bad")),
            LinkError::Rejected(_)
        ));
        assert!(matches!(
            link_error(&Status::unauthenticated("token")),
            LinkError::Rejected(_)
        ));
    }

    /// The link against a real job service in this process: a verified copy, the same
    /// start again (another resume_from) answered with the same job, a checksum, a wrong
    /// token refused, a cancel of nothing running.
    #[tokio::test]
    async fn drives_a_real_job_service() {
        use ferry_operator::mover::request::{StartChecksum, WireChecksumOptions};
        use ferry_server::config::ServiceConfig;
        use ferry_server::server;

        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let mut cfg = ServiceConfig::new(dir.path().join("data"));
        cfg.grpc_listen = "127.0.0.1:0".parse().unwrap();
        cfg.metrics_listen = None;
        cfg.allow_roots = vec![root.clone()];
        cfg.auth_token = Some(Secret::new("t0ken"));
        let service = server::start(cfg).await.unwrap();
        let addr = service.grpc_addr();
        let src = root.join("src.img");
        let dst = root.join("dst.img");
        let dst2 = root.join("dst2.img");
        let bytes: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
        std::fs::write(&src, &bytes).unwrap();
        let mover = MoverAddress {
            namespace: "ns".into(),
            pod: "p".into(),
            ip: addr.ip().to_string(),
            port: addr.port(),
            token: "t0ken".into(),
        };
        let link = GrpcMoverLink::default();
        let file = |p: &std::path::Path| WireEndpoint {
            url: p.display().to_string(),
            options: None,
            ..WireEndpoint::default()
        };
        let request = StartTransfer {
            source: file(&src),
            target: file(&dst),
            more_targets: vec![file(&dst2)],
            options: WireTransferOptions {
                verify: true,
                verify_algorithm: HashAlgorithm::Sha256,
                ..WireTransferOptions::default()
            },
            idempotency_key: "uid/0,1".into(),
            labels: BTreeMap::from([
                (OWNER_UID_LABEL.to_string(), "uid".to_string()),
                (TARGET_LABEL.to_string(), "0,1".to_string()),
            ]),
            priority: 0,
            refuse_if_target_busy: true,
        };
        let job = JobRequest::Transfer {
            request: Box::new(request.clone()),
            resume_from: None,
        };
        let started = link.start(&mover, &job).await.unwrap();
        let again = JobRequest::Transfer {
            request: Box::new(request),
            resume_from: Some(Checkpoint::new(3 << 20, [(0, 1 << 20)])),
        };
        assert_eq!(link.start(&mover, &again).await.unwrap().id, started.id);

        async fn last(link: &GrpcMoverLink, mover: &MoverAddress, id: &str) -> JobReport {
            let mut stream = link.watch(mover, id).await.unwrap();
            let mut last = None;
            while let Some(r) = stream.next().await {
                let r = r.unwrap();
                let end = r.state.is_terminal();
                last = Some(r);
                if end {
                    break;
                }
            }
            last.expect("at least one report")
        }
        let copied = last(&link, &mover, &started.id).await;
        assert_eq!(copied.state, JobState::Succeeded, "{copied:?}");
        assert_eq!(std::fs::read(&dst).unwrap(), bytes);
        assert_eq!(std::fs::read(&dst2).unwrap(), bytes);
        let targets: Vec<(usize, JobState)> =
            copied.targets.iter().map(|t| (t.index, t.state)).collect();
        assert_eq!(
            targets,
            [(0, JobState::Succeeded), (1, JobState::Succeeded)]
        );
        let source_digest = copied.source_digest.clone().unwrap();
        assert!(source_digest.starts_with("sha256:"), "{source_digest}");
        assert_eq!(
            copied.target_digest.as_deref(),
            Some(source_digest.as_str())
        );
        for t in &copied.targets {
            assert_eq!(t.digest.as_deref(), Some(source_digest.as_str()), "{t:?}");
        }
        assert_eq!(copied.progress.total_bytes, 3 << 20);

        let checksum = JobRequest::Checksum(StartChecksum {
            source: file(&dst),
            options: WireChecksumOptions {
                algorithm: HashAlgorithm::Sha256,
                ..WireChecksumOptions::default()
            },
            idempotency_key: "uid-c".into(),
            labels: BTreeMap::from([(OWNER_UID_LABEL.to_string(), "uid-c".to_string())]),
            priority: 0,
        });
        let started = link.start(&mover, &checksum).await.unwrap();
        let summed = last(&link, &mover, &started.id).await;
        assert_eq!(summed.source_digest, Some(source_digest));

        let wrong = MoverAddress {
            token: "wrong".into(),
            ..mover.clone()
        };
        assert!(matches!(
            link.start(&wrong, &checksum).await,
            Err(LinkError::Rejected(_))
        ));
        link.cancel(&mover, "uid").await.unwrap();
        service.shutdown().await;
    }

    /// Backup jobs through the link against a real job service in this process: a
    /// backup into a directory repository it creates, a second backup on top of it, a
    /// prune keeping the last one, and a restore of the kept snapshot, whose bytes and
    /// block hash are the source's.
    #[tokio::test]
    async fn drives_backups_through_a_real_job_service() {
        use ferry_operator::mover::backup_request::{
            Parent, StartBackup, StartPrune, StartRestore, WireRepository, WireRetention,
        };
        use ferry_server::config::ServiceConfig;
        use ferry_server::server;

        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("repo")).unwrap();
        let mut cfg = ServiceConfig::new(dir.path().join("data"));
        cfg.grpc_listen = "127.0.0.1:0".parse().unwrap();
        cfg.metrics_listen = None;
        cfg.allow_roots = vec![root.clone()];
        cfg.auth_token = Some(Secret::new("t0ken"));
        let service = server::start(cfg).await.unwrap();
        let addr = service.grpc_addr();
        let mover = MoverAddress {
            namespace: "ns".into(),
            pod: "p".into(),
            ip: addr.ip().to_string(),
            port: addr.port(),
            token: "t0ken".into(),
        };
        let link = GrpcMoverLink::default();
        let src = root.join("src.img");
        let mut bytes: Vec<u8> = (0..12u32 << 20).map(|i| (i % 251) as u8).collect();
        // The second 4 MiB chunk is all zeroes: never stored.
        bytes[(4 << 20)..(8 << 20)].fill(0);
        std::fs::write(&src, &bytes).unwrap();
        let repo = WireRepository {
            url: root.join("repo").display().to_string(),
            options: None,
            key: None,
        };
        let labels = |uid: &str| BTreeMap::from([(OWNER_UID_LABEL.to_string(), uid.to_string())]);
        async fn last(link: &GrpcMoverLink, mover: &MoverAddress, id: &str) -> JobReport {
            let mut stream = link.watch(mover, id).await.unwrap();
            let mut last = None;
            while let Some(r) = stream.next().await {
                let r = r.unwrap();
                let end = r.state.is_terminal();
                last = Some(r);
                if end {
                    break;
                }
            }
            last.expect("at least one report")
        }
        let backup = |uid: &str| {
            JobRequest::Backup(Box::new(StartBackup {
                source: WireEndpoint {
                    url: src.display().to_string(),
                    ..WireEndpoint::default()
                },
                repository: repo.clone(),
                initialize: true,
                source_id: "vms/web1".into(),
                parent: Parent::Auto,
                tags: BTreeMap::from([("vm".into(), "web1".into())]),
                idempotency_key: format!("{uid}/backup"),
                labels: labels(uid),
            }))
        };
        let started = link.start(&mover, &backup("b1")).await.unwrap();
        let first = last(&link, &mover, &started.id).await;
        assert_eq!(first.state, JobState::Succeeded, "{first:?}");
        let first = first.backup.expect("a backup summary");
        assert!(first.parent_id.is_empty(), "{first:?}");
        assert_eq!(first.bytes_new + first.bytes_reused, 8 << 20, "{first:?}");
        assert!(first.block_hash.starts_with("blkhash:"), "{first:?}");
        // The same request again: the same job.
        assert_eq!(
            link.start(&mover, &backup("b1")).await.unwrap().id,
            started.id
        );
        let started = link.start(&mover, &backup("b2")).await.unwrap();
        let second = last(&link, &mover, &started.id).await.backup.unwrap();
        assert_eq!(second.parent_id, first.snapshot_id);
        assert_eq!(second.bytes_new, 0, "nothing changed: {second:?}");
        assert_eq!(second.block_hash, first.block_hash);

        let prune = JobRequest::Prune(Box::new(StartPrune {
            repository: repo.clone(),
            source_id: "vms/web1".into(),
            retain: WireRetention {
                last: 1,
                ..WireRetention::default()
            },
            idempotency_key: "b2/prune".into(),
            labels: labels("b2"),
        }));
        let started = link.start(&mover, &prune).await.unwrap();
        let pruned = last(&link, &mover, &started.id).await;
        assert_eq!(pruned.state, JobState::Succeeded, "{pruned:?}");
        assert_eq!(
            pruned.prune,
            Some(PruneSummary {
                kept: 1,
                removed: 1,
                removed_ids: vec![first.snapshot_id.clone()],
                kept_ids: vec![second.snapshot_id.clone()],
            })
        );

        let dst = root.join("restored.img");
        let restore = JobRequest::Restore(Box::new(StartRestore {
            repository: repo.clone(),
            snapshot_id: second.snapshot_id.clone(),
            target: WireEndpoint {
                url: dst.display().to_string(),
                ..WireEndpoint::default()
            },
            idempotency_key: "r1/restore".into(),
            labels: labels("r1"),
        }));
        let started = link.start(&mover, &restore).await.unwrap();
        let restored = last(&link, &mover, &started.id).await;
        assert_eq!(restored.state, JobState::Succeeded, "{restored:?}");
        assert_eq!(std::fs::read(&dst).unwrap(), bytes);

        // The pruned snapshot is gone: restoring it fails, saying so.
        let gone = JobRequest::Restore(Box::new(StartRestore {
            snapshot_id: first.snapshot_id.clone(),
            idempotency_key: "r2/restore".into(),
            labels: labels("r2"),
            target: WireEndpoint {
                url: root.join("gone.img").display().to_string(),
                ..WireEndpoint::default()
            },
            repository: repo.clone(),
        }));
        match link.start(&mover, &gone).await {
            Err(LinkError::Rejected(e)) => assert!(e.contains("NotFound"), "{e}"),
            Ok(started) => {
                let failed = last(&link, &mover, &started.id).await;
                assert_eq!(failed.state, JobState::Failed, "{failed:?}");
                assert_eq!(failed.error.unwrap().kind, "not_found");
            }
            Err(e) => panic!("{e}"),
        }
        service.shutdown().await;
    }
}
