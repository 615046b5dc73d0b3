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
use ferry_backup::{BackupId, Manifest, Repository};
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
/// Where a page starts: after the snapshot (start time in milliseconds, id) the token
/// names. A position, not a snapshot that must still exist: a prune between two pages
/// neither restarts the listing nor repeats a snapshot.
fn page_start(token: &str) -> Result<Option<(i64, BackupId)>, ServiceError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || Error::invalid_input("page_token is not a token this server returned");
    let (ms, id) = token.split_once('/').ok_or_else(bad)?;
    let ms = ms.parse().map_err(|_| bad())?;
    let id = id.parse().map_err(|_| bad())?;
    Ok(Some((ms, id)))
}

/// The token of a page that ends with `last`.
fn page_token(last: &Manifest) -> String {
    format!("{}/{}", last.time.timestamp_millis(), last.id)
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
            let settings = InitSettings::from_proto("options", &req.options.unwrap_or_default())?;
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
            // Oldest first by start time (ids name the second only), then by id.
            let mut manifests = Vec::new();
            for id in repo.list_snapshots().await? {
                let manifest = match repo.load_manifest(&id).await {
                    Ok(m) => m,
                    // Deleted by a prune since it was listed.
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => return Err(e.into()),
                };
                let wanted = (req.source_id.is_empty() || manifest.source == req.source_id)
                    && req
                        .tags
                        .iter()
                        .all(|(k, v)| manifest.tags.get(k).is_some_and(|have| have == v));
                if wanted {
                    manifests.push(manifest);
                }
            }
            manifests.sort_by(|a, b| (a.time, &a.id).cmp(&(b.time, &b.id)));
            let start = match &after {
                Some((ms, id)) => {
                    manifests.partition_point(|m| (m.time.timestamp_millis(), &m.id) <= (*ms, id))
                }
                None => 0,
            };
            let page: Vec<_> = manifests.iter().skip(start).take(size).collect();
            let next_page_token = if start + page.len() < manifests.len() {
                page.last().map(|m| page_token(m)).unwrap_or_default()
            } else {
                String::new()
            };
            let snapshots = page.into_iter().map(results::snapshot).collect();
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
