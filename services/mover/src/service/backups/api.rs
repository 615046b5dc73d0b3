//! The `ferry.v1.BackupService` gRPC handlers: create a repository, describe it, list
//! and read its backups. Quick reads of small objects, answered at once (data moves in
//! jobs). Requests are checked as job requests are (allowed roots, secret references).

use tonic::{Request, Response, Status};

use super::repository::{check_repository, InitSettings, RepoAccess};
use super::results;
use crate::service::convert::Validator;
use crate::service::metrics::{Metrics, RequestGuard};
use crate::service::proto::{self, backup_service_server::BackupService};
use crate::service::status::ServiceError;
use ferry_backup::{BackupId, Repository};
use ferry_core::{Error, ErrorKind};

/// Largest page ListSnapshots returns.
pub const MAX_PAGE_SIZE: usize = 1000;
/// Page size when the request leaves it 0.
pub const DEFAULT_PAGE_SIZE: usize = 100;

/// The service implementation.
#[derive(Debug, Clone)]
pub struct BackupApi {
    validator: Validator,
    metrics: Metrics,
}

impl BackupApi {
    pub fn new(validator: Validator, metrics: Metrics) -> Self {
        Self { validator, metrics }
    }

    fn access(&self, r: Option<&proto::Repository>) -> Result<RepoAccess, ServiceError> {
        let resolved = check_repository(
            &self.validator.roots,
            &self.validator.secrets,
            "repository",
            r,
        )?;
        Ok(RepoAccess::new(&resolved, r))
    }

    async fn open(&self, r: Option<&proto::Repository>) -> Result<Repository, ServiceError> {
        let access = self.access(r)?;
        Ok(access.open(&self.validator.secrets, None).await?)
    }
}

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

fn info(url: String, repo: &Repository) -> proto::RepositoryInfo {
    let c = repo.config();
    proto::RepositoryInfo {
        url,
        id: c.id.clone(),
        chunk_size: u64::from(c.chunk_size),
        zstd_level: c.zstd_level.unwrap_or(0),
        encrypted: repo.is_encrypted(),
        format_version: c.format_version,
    }
}

fn snapshot_id(text: &str) -> Result<BackupId, ServiceError> {
    if text.is_empty() {
        return Err(Error::invalid_input("id is empty: give a backup id").into());
    }
    text.parse()
        .map_err(|e: Error| Error::invalid_input(format!("id: {}", e.message())).into())
}

/// The position after which a page starts: the last id of the previous page.
fn page_start(token: &str) -> Result<Option<BackupId>, ServiceError> {
    if token.is_empty() {
        return Ok(None);
    }
    token
        .parse()
        .map(Some)
        .map_err(|_| Error::invalid_input("page_token is not a token this server returned").into())
}

#[tonic::async_trait]
impl BackupService for BackupApi {
    async fn init_repository(
        &self,
        request: Request<proto::InitRepositoryRequest>,
    ) -> Result<Response<proto::RepositoryInfo>, Status> {
        let guard = self.metrics.request("InitRepository");
        let req = request.get_ref();
        let r = async {
            let access = self.access(req.repository.as_ref())?;
            let settings =
                InitSettings::from_proto("options", &req.options.clone().unwrap_or_default())?;
            match access.init(&self.validator.secrets, &settings).await? {
                Some(repo) => Ok(info(access.name(), &repo)),
                None => Err(ServiceError::RepositoryExists { url: access.name() }),
            }
        }
        .await;
        reply(guard, r)
    }

    async fn get_repository(
        &self,
        request: Request<proto::GetRepositoryRequest>,
    ) -> Result<Response<proto::RepositoryInfo>, Status> {
        let guard = self.metrics.request("GetRepository");
        let req = request.get_ref();
        let r = async {
            let access = self.access(req.repository.as_ref())?;
            let repo = access.open(&self.validator.secrets, None).await?;
            Ok(info(access.name(), &repo))
        }
        .await;
        reply(guard, r)
    }

    async fn list_snapshots(
        &self,
        request: Request<proto::ListSnapshotsRequest>,
    ) -> Result<Response<proto::ListSnapshotsResponse>, Status> {
        let guard = self.metrics.request("ListSnapshots");
        let req = request.get_ref();
        let r = async {
            let after = page_start(&req.page_token)?;
            let size = match req.page_size as usize {
                0 => DEFAULT_PAGE_SIZE,
                n => n.min(MAX_PAGE_SIZE),
            };
            let repo = self.open(req.repository.as_ref()).await?;
            let mut snapshots = Vec::new();
            let mut next_page_token = String::new();
            for id in repo.list_snapshots().await? {
                if after.as_ref().is_some_and(|a| id <= *a) {
                    continue;
                }
                let manifest = match repo.load_manifest(&id).await {
                    Ok(m) => m,
                    // Deleted by a prune since it was listed.
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => return Err(e.into()),
                };
                if !req.source_id.is_empty() && manifest.source != req.source_id {
                    continue;
                }
                if !req
                    .tags
                    .iter()
                    .all(|(k, v)| manifest.tags.get(k).is_some_and(|have| have == v))
                {
                    continue;
                }
                if snapshots.len() == size {
                    next_page_token = snapshots
                        .last()
                        .map(|s: &proto::Snapshot| s.id.clone())
                        .unwrap_or_default();
                    break;
                }
                snapshots.push(results::snapshot(&manifest));
            }
            Ok(proto::ListSnapshotsResponse {
                snapshots,
                next_page_token,
            })
        }
        .await;
        reply(guard, r)
    }

    async fn get_snapshot(
        &self,
        request: Request<proto::GetSnapshotRequest>,
    ) -> Result<Response<proto::Snapshot>, Status> {
        let guard = self.metrics.request("GetSnapshot");
        let req = request.get_ref();
        let r = async {
            let id = snapshot_id(&req.id)?;
            let repo = self.open(req.repository.as_ref()).await?;
            let manifest = repo.load_manifest(&id).await?;
            Ok(results::snapshot(&manifest))
        }
        .await;
        reply(guard, r)
    }
}
