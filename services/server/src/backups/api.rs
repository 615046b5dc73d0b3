//! The `ferry.v1.BackupService` gRPC handlers: create a repository (immutable, too),
//! describe it, list and read its backups, protect and unprotect one, manage its keys
//! ([`super::keys`]). Quick reads and
//! writes of small objects, answered at once (data moves in jobs). Requests are checked
//! as job requests are (allowed roots, secret references).

use tonic::{Request, Response, Status};

use super::keys;
use super::pages::{self, Position};
use super::repository::{check_repository, InitSettings, RepoAccess};
use super::results;
use crate::convert::Validator;
use crate::metrics::{Metrics, RequestGuard};
use crate::status::ServiceError;
use ferry_api::proto::{self, backup_service_server::BackupService};
use ferry_backup::{BackupId, LockMode, Manifest, Repository};
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
        immutable_days: c.immutable.map_or(0, |i| {
            u32::try_from(i.period_secs / 86_400).unwrap_or(u32::MAX)
        }),
        immutable_mode: match c.immutable.map(|i| i.mode) {
            None => proto::ImmutableMode::Unspecified,
            Some(LockMode::Governance) => proto::ImmutableMode::Governance,
            Some(LockMode::Compliance) => proto::ImmutableMode::Compliance,
        } as i32,
    }
}

/// A backup's manifest with its protection, as GetSnapshot answers.
fn snapshot_of(manifest: &Manifest, protected: bool) -> proto::Snapshot {
    proto::Snapshot {
        protected,
        ..results::snapshot(manifest)
    }
}

fn snapshot_id(text: &str) -> Result<BackupId, ServiceError> {
    if text.is_empty() {
        return Err(Error::invalid_input("id is empty: give a backup id").into());
    }
    text.parse()
        .map_err(|e: Error| Error::invalid_input(format!("id: {}", e.message())).into())
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
            settings.check_for("options", access.resolved())?;
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
            let after = Position::parse(&req.page_token)?;
            let size = match req.page_size as usize {
                0 => DEFAULT_PAGE_SIZE,
                n => n.min(MAX_PAGE_SIZE),
            };
            let repo = self.open(req.repository.as_ref()).await?;
            let ids = repo.list_snapshots().await?;
            let load = |id: BackupId| {
                let repo = repo.clone();
                async move {
                    match repo.load_manifest(&id).await {
                        Ok(m) => Ok(Some(m)),
                        // Deleted by a prune since it was listed.
                        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
                        Err(e) => Err(e),
                    }
                }
            };
            let wanted = |m: &Manifest| {
                (req.source_id.is_empty() || m.source == req.source_id)
                    && req
                        .tags
                        .iter()
                        .all(|(k, v)| m.tags.get(k).is_some_and(|have| have == v))
            };
            let page = pages::page(&ids, after.as_ref(), size, load, wanted).await?;
            let next_page_token = match page.manifests.last() {
                Some(last) if page.more => Position::of(last).token(),
                _ => String::new(),
            };
            let protected = repo.protected_backups().await?;
            let snapshots = page
                .manifests
                .iter()
                .map(|m| snapshot_of(m, protected.contains(&m.id)))
                .collect();
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
            Ok(snapshot_of(&manifest, repo.is_protected(&id).await?))
        }
        .await;
        reply(guard, r)
    }

    async fn protect_snapshot(
        &self,
        request: Request<proto::ProtectSnapshotRequest>,
    ) -> Result<Response<proto::ProtectSnapshotResponse>, Status> {
        let guard = self.metrics.request("ProtectSnapshot");
        reply(guard, self.set_protection(request.get_ref(), true).await)
    }

    async fn unprotect_snapshot(
        &self,
        request: Request<proto::ProtectSnapshotRequest>,
    ) -> Result<Response<proto::ProtectSnapshotResponse>, Status> {
        let guard = self.metrics.request("UnprotectSnapshot");
        reply(guard, self.set_protection(request.get_ref(), false).await)
    }

    async fn list_keys(
        &self,
        request: Request<proto::ListKeysRequest>,
    ) -> Result<Response<proto::ListKeysResponse>, Status> {
        let guard = self.metrics.request("ListKeys");
        let r = async {
            let repo = self.open(request.get_ref().repository.as_ref()).await?;
            Ok(keys::list(&repo).await?)
        }
        .await;
        reply(guard, r)
    }

    async fn add_key(
        &self,
        request: Request<proto::AddKeyRequest>,
    ) -> Result<Response<proto::RepositoryKey>, Status> {
        let guard = self.metrics.request("AddKey");
        let req = request.get_ref();
        let r = async {
            let repo = self.open(req.repository.as_ref()).await?;
            Ok(keys::add(&repo, &self.validator.secrets, req).await?)
        }
        .await;
        reply(guard, r)
    }

    async fn remove_key(
        &self,
        request: Request<proto::RemoveKeyRequest>,
    ) -> Result<Response<proto::RemoveKeyResponse>, Status> {
        let guard = self.metrics.request("RemoveKey");
        let req = request.get_ref();
        let r = async {
            let repo = self.open(req.repository.as_ref()).await?;
            Ok(keys::remove(&repo, req).await?)
        }
        .await;
        reply(guard, r)
    }

    async fn rotate_key(
        &self,
        request: Request<proto::RotateKeyRequest>,
    ) -> Result<Response<proto::RotateKeyResponse>, Status> {
        let guard = self.metrics.request("RotateKey");
        let req = request.get_ref();
        let r = async {
            let repo = self.open(req.repository.as_ref()).await?;
            Ok(keys::rotate(&repo, &self.validator.secrets, req).await?)
        }
        .await;
        reply(guard, r)
    }
}

impl BackupApi {
    /// Protects or unprotects a backup; answers with it as it is now.
    async fn set_protection(
        &self,
        req: &proto::ProtectSnapshotRequest,
        protect: bool,
    ) -> Result<proto::ProtectSnapshotResponse, ServiceError> {
        let id = snapshot_id(&req.id)?;
        let repo = self.open(req.repository.as_ref()).await?;
        let manifest = repo.load_manifest(&id).await?;
        let was_protected = if protect {
            repo.protect(&id).await?
        } else {
            repo.unprotect(&id).await?
        };
        Ok(proto::ProtectSnapshotResponse {
            snapshot: Some(snapshot_of(&manifest, protect)),
            was_protected,
        })
    }
}
