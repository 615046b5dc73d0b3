//! The `ferry.v1.JobService` gRPC handlers: thin glue from requests to the validator and
//! the job manager; errors become status codes in [`super::status`] only. A restore of a
//! backup the repository does not hold is NOT_FOUND at once (when the repository can
//! tell quickly), like an unknown job.

use std::pin::Pin;

use futures_util::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::convert::backup::RestoreSpec;
use super::convert::{self, JobSpec, Validator};
use super::jobs::{JobManager, ListFilter};
use super::metrics::RequestGuard;
use super::status::ServiceError;
use ferry_api::proto::{self, job_service_server::JobService};

/// Largest page ListJobs returns.
pub const MAX_PAGE_SIZE: usize = 1000;
/// Page size when the request leaves it 0.
pub const DEFAULT_PAGE_SIZE: usize = 100;

/// The service implementation.
#[derive(Debug, Clone)]
pub struct JobApi {
    manager: JobManager,
    validator: Validator,
    /// Ends watch streams when the server stops.
    stop: CancellationToken,
}

impl JobApi {
    pub fn new(manager: JobManager, validator: Validator, stop: CancellationToken) -> Self {
        Self {
            manager,
            validator,
            stop,
        }
    }

    fn guard(&self, method: &'static str) -> RequestGuard {
        self.manager.metrics().request(method)
    }

    /// NOT_FOUND at once for a backup the repository does not hold. Only a definite
    /// answer counts: a repository that cannot be read now (or not within a few seconds)
    /// is left to the job, which retries transient errors.
    async fn snapshot_exists(&self, spec: &RestoreSpec) -> Result<(), ServiceError> {
        let check = async {
            let repo = spec.repository.open(&self.validator.secrets, None).await?;
            let id = spec.which.resolve(&repo).await?;
            repo.load_manifest(&id).await.map(|_| ())
        };
        match tokio::time::timeout(SNAPSHOT_CHECK_TIMEOUT, check).await {
            Ok(Err(e)) if e.kind() == ferry_core::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }
}

/// How long StartRestore looks for the backup before leaving it to the job.
const SNAPSHOT_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn reply<T>(mut guard: RequestGuard, r: Result<T, ServiceError>) -> Result<Response<T>, Status> {
    match r {
        Ok(v) => {
            guard.set_code(tonic::Code::Ok);
            Ok(Response::new(v))
        }
        Err(e) => {
            let status: Status = e.into();
            guard.set_code(status.code());
            Err(status)
        }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<proto::JobEvent, Status>> + Send>>;

#[tonic::async_trait]
impl JobService for JobApi {
    async fn start_transfer(
        &self,
        request: Request<proto::StartTransferRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let guard = self.guard("StartTransfer");
        let r = async {
            let accepted = self.validator.transfer(request.get_ref())?;
            let record = self.manager.submit(accepted).await?;
            Ok(convert::job_to_proto(&record))
        }
        .await;
        reply(guard, r)
    }

    async fn start_checksum(
        &self,
        request: Request<proto::StartChecksumRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let guard = self.guard("StartChecksum");
        let r = async {
            let accepted = self.validator.checksum(request.get_ref())?;
            let record = self.manager.submit(accepted).await?;
            Ok(convert::job_to_proto(&record))
        }
        .await;
        reply(guard, r)
    }

    async fn start_backup(
        &self,
        request: Request<proto::StartBackupRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let guard = self.guard("StartBackup");
        let r = async {
            let accepted = self.validator.backup(request.get_ref())?;
            let record = self.manager.submit(accepted).await?;
            Ok(convert::job_to_proto(&record))
        }
        .await;
        reply(guard, r)
    }

    async fn start_restore(
        &self,
        request: Request<proto::StartRestoreRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let guard = self.guard("StartRestore");
        let r = async {
            let accepted = self.validator.restore(request.get_ref())?;
            // A retry under the key of an accepted request gets its job, even when the
            // backup has been pruned since.
            if let JobSpec::Restore(spec) = accepted.spec.as_ref() {
                if !self.manager.has_key(&accepted.idempotency_key) {
                    self.snapshot_exists(spec).await?;
                }
            }
            let record = self.manager.submit(accepted).await?;
            Ok(convert::job_to_proto(&record))
        }
        .await;
        reply(guard, r)
    }

    async fn start_repository_verify(
        &self,
        request: Request<proto::StartRepositoryVerifyRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let guard = self.guard("StartRepositoryVerify");
        let r = async {
            let accepted = self.validator.repository_verify(request.get_ref())?;
            let record = self.manager.submit(accepted).await?;
            Ok(convert::job_to_proto(&record))
        }
        .await;
        reply(guard, r)
    }

    async fn start_prune(
        &self,
        request: Request<proto::StartPruneRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let guard = self.guard("StartPrune");
        let r = async {
            let accepted = self.validator.prune(request.get_ref())?;
            let record = self.manager.submit(accepted).await?;
            Ok(convert::job_to_proto(&record))
        }
        .await;
        reply(guard, r)
    }

    async fn start_gc(
        &self,
        request: Request<proto::StartGcRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let guard = self.guard("StartGc");
        let r = async {
            let accepted = self.validator.gc(request.get_ref())?;
            let record = self.manager.submit(accepted).await?;
            Ok(convert::job_to_proto(&record))
        }
        .await;
        reply(guard, r)
    }

    async fn start_sync(
        &self,
        request: Request<proto::StartSyncRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let guard = self.guard("StartSync");
        let r = async {
            let accepted = self.validator.sync(request.get_ref())?;
            let record = self.manager.submit(accepted).await?;
            Ok(convert::job_to_proto(&record))
        }
        .await;
        reply(guard, r)
    }

    async fn get_job(
        &self,
        request: Request<proto::GetJobRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let guard = self.guard("GetJob");
        let r = self
            .manager
            .get(&request.get_ref().id)
            .map(|r| convert::job_to_proto(&r));
        reply(guard, r)
    }

    async fn list_jobs(
        &self,
        request: Request<proto::ListJobsRequest>,
    ) -> Result<Response<proto::ListJobsResponse>, Status> {
        let guard = self.guard("ListJobs");
        let req = request.get_ref();
        let r = (|| {
            let mut states = Vec::new();
            for s in &req.states {
                match convert::state_from_proto(*s) {
                    Some(state) => states.push(state),
                    None => {
                        return Err(ServiceError::Core(ferry_core::Error::invalid_input(
                            format!("state {s} is not a job state to filter by"),
                        )))
                    }
                }
            }
            let filter = ListFilter {
                states,
                labels: req.labels.clone(),
                kind: convert::kind_from_proto(req.kind)?,
            };
            let size = match req.page_size as usize {
                0 => DEFAULT_PAGE_SIZE,
                n => n.min(MAX_PAGE_SIZE),
            };
            let page = self.manager.list(&filter, size, &req.page_token)?;
            Ok(proto::ListJobsResponse {
                jobs: page.jobs.iter().map(convert::job_to_proto).collect(),
                next_page_token: page.next_token,
            })
        })();
        reply(guard, r)
    }

    type WatchJobStream = EventStream;

    async fn watch_job(
        &self,
        request: Request<proto::WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let guard = self.guard("WatchJob");
        let r = self.manager.watch(&request.get_ref().id).map(|rx| {
            let stop = self.stop.clone();
            let stream = futures_util::stream::unfold(
                (rx, false, true),
                move |(mut rx, finished, first)| {
                    let stop = stop.clone();
                    async move {
                        if finished {
                            return None;
                        }
                        if !first {
                            tokio::select! {
                                changed = rx.changed() => changed.ok()?,
                                _ = stop.cancelled() => return None,
                            }
                        }
                        let record = rx.borrow_and_update().clone();
                        let terminal = record.state.is_terminal();
                        let event = proto::JobEvent {
                            job: Some(convert::job_to_proto(&record)),
                        };
                        Some((Ok(event), (rx, terminal, false)))
                    }
                },
            );
            Box::pin(stream) as EventStream
        });
        reply(guard, r)
    }

    async fn end_relay(
        &self,
        request: Request<proto::EndRelayRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let guard = self.guard("EndRelay");
        let r = self
            .manager
            .end_relay(&request.get_ref().id)
            .map(|r| convert::job_to_proto(&r));
        reply(guard, r)
    }

    async fn cancel_job(
        &self,
        request: Request<proto::CancelJobRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let guard = self.guard("CancelJob");
        let r = self
            .manager
            .cancel(&request.get_ref().id)
            .await
            .map(|r| convert::job_to_proto(&r));
        reply(guard, r)
    }
}
