//! Backup requests (StartBackup, StartRestore, StartRepositoryVerify, StartPrune,
//! StartGc): validated into [`Accepted`] like transfers, and their options typed into
//! the specs their jobs run with. Errors name the field (INVALID_ARGUMENT), a directory
//! outside the allowed roots is PERMISSION_DENIED.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_backup::{BackupId, KeepPolicy};
use ferry_core::{Error, Result};
use ferry_image_backup::{ParentChoice, RestoreOrder};
use prost::Message;

use super::options::{ImageSpec, JobSpec, MAX_WORKERS};
use super::validation::{check_meta, invalid, Accepted, Meta, Validator};
use super::EndpointAccess;
use crate::backups::repository::{check_repository, InitSettings, RepoAccess};
use crate::model::job::{JobKind, JobPlan, ResolvedEndpoint};
use ferry_api::options;
use ferry_api::options::retention_from_proto;
use ferry_api::proto;

/// Longest source identity.
pub const MAX_SOURCE_ID_BYTES: usize = 1024;
/// Most snapshot ids a verify may name.
pub const MAX_SNAPSHOT_IDS: usize = 1000;
/// Longest grace period of a GC (ten years).
pub const MAX_GRACE_SECONDS: u64 = 10 * 366 * 24 * 3600;
/// The GC grace period when the request leaves it unset.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(24 * 3600);

/// A backup's endpoints and options.
#[derive(Debug, Clone)]
pub struct BackupSpec {
    pub source: EndpointAccess,
    pub image: ImageSpec,
    pub repository: RepoAccess,
    pub parent: ParentChoice,
    /// Never empty: the request's, or the source URL without user information.
    pub source_id: String,
    pub tags: BTreeMap<String, String>,
    pub workers: usize,
    pub dirty_bitmap: Option<String>,
    pub snapshot_metadata: Option<MetadataSpec>,
    /// The CSI handle recorded in the backup.
    pub volume_snapshot_handle: Option<String>,
    pub init: Option<InitSettings>,
    pub retention: Option<KeepPolicy>,
}

/// What a backup asks the CSI SnapshotMetadata service; the token stays a reference
/// until the job runs.
#[derive(Debug, Clone)]
pub struct MetadataSpec {
    pub address: String,
    pub ca_pem: Vec<u8>,
    pub token: proto::SecretRef,
    pub snapshot: String,
    pub namespace: String,
    pub base_snapshot_id: Option<String>,
}

/// Longest CA bundle of a SnapshotMetadata service.
pub const MAX_CA_BYTES: usize = 64 * 1024;
/// Longest address or snapshot handle.
const MAX_HANDLE_BYTES: usize = 1024;

/// `text` as the field `what`: 1 to `max` bytes without control characters.
fn bounded_text(what: &str, text: &str, max: usize) -> Result<()> {
    if text.is_empty() || text.len() > max || text.chars().any(char::is_control) {
        return Err(invalid(format!(
            "{what} must be 1 to {max} bytes without control characters"
        )));
    }
    Ok(())
}

impl MetadataSpec {
    fn new(m: &proto::SnapshotMetadataSource) -> Result<Self> {
        bounded_text("snapshot_metadata.address", &m.address, MAX_HANDLE_BYTES)?;
        if !m.address.starts_with("https://") {
            return Err(invalid(format!(
                "snapshot_metadata.address '{}' must be https://HOST:PORT (the service speaks TLS only)",
                m.address
            )));
        }
        if m.ca_certificate.is_empty() || m.ca_certificate.len() > MAX_CA_BYTES {
            return Err(invalid(format!(
                "snapshot_metadata.ca_certificate must hold 1 to {MAX_CA_BYTES} bytes of PEM"
            )));
        }
        let token = m.token.clone().ok_or_else(|| {
            invalid("snapshot_metadata.token is missing: name the file or environment variable holding the ServiceAccount token")
        })?;
        bounded_text("snapshot_metadata.snapshot", &m.snapshot, 253)?;
        bounded_text("snapshot_metadata.namespace", &m.namespace, 63)?;
        let base = (!m.base_snapshot_id.is_empty()).then(|| m.base_snapshot_id.clone());
        if let Some(base) = &base {
            bounded_text("snapshot_metadata.base_snapshot_id", base, MAX_HANDLE_BYTES)?;
        }
        Ok(Self {
            address: m.address.clone(),
            ca_pem: m.ca_certificate.clone(),
            token,
            snapshot: m.snapshot.clone(),
            namespace: m.namespace.clone(),
            base_snapshot_id: base,
        })
    }
}

/// Which backup a restore writes.
#[derive(Debug, Clone, PartialEq)]
pub enum RestoreWhich {
    /// This one.
    Id(BackupId),
    /// The newest of a source, started at or before `as_of` when given, as found when
    /// the job starts.
    Latest {
        source_id: String,
        as_of: Option<chrono::DateTime<chrono::Utc>>,
    },
}

impl RestoreWhich {
    fn new(req: &proto::StartRestoreRequest) -> Result<Self> {
        let Some(latest) = &req.latest else {
            return Ok(Self::Id(snapshot_id("snapshot_id", &req.snapshot_id)?));
        };
        if !req.snapshot_id.is_empty() {
            return Err(invalid(
                "snapshot_id and latest both name the backup to restore: give one",
            ));
        }
        if latest.source_id.is_empty() {
            return Err(invalid("latest.source_id is empty: name the source"));
        }
        check_source_id("latest.source_id", &latest.source_id)?;
        let as_of = latest
            .as_of
            .as_ref()
            .map(|t| {
                chrono::DateTime::from_timestamp(
                    t.seconds,
                    u32::try_from(t.nanos).unwrap_or(u32::MAX),
                )
                .ok_or_else(|| invalid("latest.as_of is not a valid time"))
            })
            .transpose()?;
        Ok(Self::Latest {
            source_id: latest.source_id.clone(),
            as_of,
        })
    }

    /// The backup to restore, in `repo`.
    pub async fn resolve(&self, repo: &ferry_backup::Repository) -> Result<BackupId> {
        match self {
            Self::Id(id) => Ok(id.clone()),
            Self::Latest { source_id, as_of } => {
                match ferry_image_backup::latest_backup(repo, source_id, *as_of).await? {
                    Some(manifest) => Ok(manifest.id),
                    None => Err(Error::new(
                        ferry_core::ErrorKind::NotFound,
                        match as_of {
                            Some(t) => format!(
                                "the repository holds no backup of source '{source_id}' started at or before {}",
                                t.to_rfc3339()
                            ),
                            None => format!(
                                "the repository holds no backup of source '{source_id}'"
                            ),
                        },
                    )),
                }
            }
        }
    }
}

/// A restore's repository, backup and target.
#[derive(Debug, Clone)]
pub struct RestoreSpec {
    pub repository: RepoAccess,
    pub which: RestoreWhich,
    pub target: EndpointAccess,
    pub workers: usize,
    pub order: RestoreOrder,
    pub verify: bool,
    pub cache: ferry_endpoints::CacheMode,
}

/// A repository verify.
#[derive(Debug, Clone)]
pub struct VerifySpec {
    pub repository: RepoAccess,
    pub snapshots: Option<Vec<BackupId>>,
    pub mark_bad: bool,
}

/// A prune.
#[derive(Debug, Clone)]
pub struct PruneSpec {
    pub repository: RepoAccess,
    pub policy: KeepPolicy,
    pub source_id: Option<String>,
    pub dry_run: bool,
}

/// A garbage collection.
#[derive(Debug, Clone)]
pub struct GcSpec {
    pub repository: RepoAccess,
    pub grace: Duration,
}

fn workers(what: &str, n: u32) -> Result<usize> {
    match n {
        0 => Ok(ferry_image_backup::DEFAULT_WORKERS),
        n if n > MAX_WORKERS => Err(invalid(format!("{what} {n}: at most {MAX_WORKERS}"))),
        n => Ok(n as usize),
    }
}

fn parent(text: &str) -> Result<ParentChoice> {
    if text.is_empty() {
        return Ok(ParentChoice::Auto);
    }
    text.parse()
        .map_err(|e: Error| invalid(format!("parent: {}", e.message())))
}

fn snapshot_id(what: &str, text: &str) -> Result<BackupId> {
    if text.is_empty() {
        return Err(invalid(format!("{what} is empty: give a backup id")));
    }
    text.parse()
        .map_err(|e: Error| invalid(format!("{what}: {}", e.message())))
}

fn check_source_id(what: &str, id: &str) -> Result<()> {
    if id.len() > MAX_SOURCE_ID_BYTES || id.chars().any(char::is_control) {
        return Err(invalid(format!(
            "{what} must be at most {MAX_SOURCE_ID_BYTES} bytes without control characters"
        )));
    }
    Ok(())
}

/// The plan of a job that touches a repository only.
fn repository_plan(repository: ResolvedEndpoint) -> JobPlan {
    JobPlan {
        source: repository.clone(),
        target: None,
        target_key: None,
        hosts: Vec::new(),
        source_kind: "repository".into(),
        target_kind: None,
        more_targets: Vec::new(),
        repository: Some(repository),
    }
}

impl BackupSpec {
    pub fn new(req: &proto::StartBackupRequest, plan: &JobPlan) -> Result<Self> {
        check_source_id("source_id", &req.source_id)?;
        let source = EndpointAccess::new(&plan.source, req.source.as_ref(), "source");
        let source_id = if req.source_id.is_empty() {
            source.name()
        } else {
            req.source_id.clone()
        };
        check_tags(&req.tags)?;
        let dirty_bitmap = (!req.dirty_bitmap.is_empty()).then(|| req.dirty_bitmap.clone());
        if dirty_bitmap.is_some() && plan.source_kind != "nbd" {
            return Err(invalid(format!(
                "dirty_bitmap needs an NBD source (nbd://... or nbd+unix://...), not a {} source",
                plan.source_kind
            )));
        }
        if let Some(b) = &dirty_bitmap {
            if b.len() > 1024 || b.chars().any(char::is_control) {
                return Err(invalid(
                    "dirty_bitmap must be at most 1024 bytes without control characters",
                ));
            }
        }
        let snapshot_metadata = req
            .snapshot_metadata
            .as_ref()
            .map(MetadataSpec::new)
            .transpose()?;
        if snapshot_metadata.is_some() && dirty_bitmap.is_some() {
            return Err(invalid(
                "dirty_bitmap and snapshot_metadata both say which blocks changed: give one",
            ));
        }
        let volume_snapshot_handle =
            (!req.volume_snapshot_handle.is_empty()).then(|| req.volume_snapshot_handle.clone());
        if let Some(handle) = &volume_snapshot_handle {
            bounded_text("volume_snapshot_handle", handle, MAX_HANDLE_BYTES)?;
        }
        let repository = plan
            .repository
            .as_ref()
            .ok_or_else(|| Error::internal("backup job without a repository"))?;
        let init = req
            .init_if_missing
            .as_ref()
            .map(|o| InitSettings::from_proto("init_if_missing", o))
            .transpose()?;
        if let Some(init) = &init {
            init.check_for("init_if_missing", repository)?;
        }
        Ok(Self {
            source,
            image: ImageSpec::source(req.source.as_ref())?,
            repository: RepoAccess::new(repository, req.repository.as_ref()),
            parent: parent(&req.parent)?,
            source_id,
            tags: req.tags.clone(),
            workers: workers("workers", req.workers)?,
            dirty_bitmap,
            snapshot_metadata,
            volume_snapshot_handle,
            init,
            retention: req
                .retention
                .as_ref()
                .map(|r| retention_from_proto("retention", Some(r)))
                .transpose()?,
        })
    }
}

fn check_tags(tags: &BTreeMap<String, String>) -> Result<()> {
    use super::validation::{MAX_LABELS, MAX_LABEL_KEY_BYTES, MAX_LABEL_VALUE_BYTES};
    if tags.len() > MAX_LABELS {
        return Err(invalid(format!(
            "{} tags: at most {MAX_LABELS}",
            tags.len()
        )));
    }
    for (k, v) in tags {
        if k.is_empty() || k.len() > MAX_LABEL_KEY_BYTES {
            return Err(invalid(format!(
                "tag key '{k}' must have 1 to {MAX_LABEL_KEY_BYTES} bytes"
            )));
        }
        if v.len() > MAX_LABEL_VALUE_BYTES {
            return Err(invalid(format!(
                "tag '{k}' value has {} bytes: at most {MAX_LABEL_VALUE_BYTES}",
                v.len()
            )));
        }
    }
    Ok(())
}

impl RestoreSpec {
    pub fn new(req: &proto::StartRestoreRequest, plan: &JobPlan) -> Result<Self> {
        ImageSpec::check_target(req.target.as_ref())?;
        let target = plan
            .target
            .as_ref()
            .ok_or_else(|| Error::internal("restore job without a target"))?;
        let repository = plan
            .repository
            .as_ref()
            .ok_or_else(|| Error::internal("restore job without a repository"))?;
        let order = match options::commit_order(req.order)? {
            ferry_engine::CommitOrder::Auto => RestoreOrder::Auto,
            ferry_engine::CommitOrder::InOrder => RestoreOrder::InOrder,
            ferry_engine::CommitOrder::OutOfOrder => RestoreOrder::OutOfOrder,
        };
        Ok(Self {
            repository: RepoAccess::new(repository, req.repository.as_ref()),
            which: RestoreWhich::new(req)?,
            target: EndpointAccess::new(target, req.target.as_ref(), "target"),
            workers: workers("workers", req.workers)?,
            order,
            verify: !req.skip_verify,
            cache: options::cache_mode(req.cache)?,
        })
    }
}

impl VerifySpec {
    pub fn new(req: &proto::StartRepositoryVerifyRequest, plan: &JobPlan) -> Result<Self> {
        if req.snapshot_ids.len() > MAX_SNAPSHOT_IDS {
            return Err(invalid(format!(
                "{} snapshot_ids: at most {MAX_SNAPSHOT_IDS}",
                req.snapshot_ids.len()
            )));
        }
        let ids = req
            .snapshot_ids
            .iter()
            .enumerate()
            .map(|(i, s)| snapshot_id(&format!("snapshot_ids[{i}]"), s))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            repository: repo_of(plan, req.repository.as_ref())?,
            snapshots: (!ids.is_empty()).then_some(ids),
            mark_bad: !req.no_mark_bad,
        })
    }
}

impl PruneSpec {
    pub fn new(req: &proto::StartPruneRequest, plan: &JobPlan) -> Result<Self> {
        check_source_id("source_id", &req.source_id)?;
        Ok(Self {
            repository: repo_of(plan, req.repository.as_ref())?,
            policy: retention_from_proto("retention", req.retention.as_ref())?,
            source_id: (!req.source_id.is_empty()).then(|| req.source_id.clone()),
            dry_run: req.dry_run,
        })
    }
}

impl GcSpec {
    pub fn new(req: &proto::StartGcRequest, plan: &JobPlan) -> Result<Self> {
        let grace = match req.grace_seconds {
            None => DEFAULT_GRACE,
            Some(s) if s > MAX_GRACE_SECONDS => {
                return Err(invalid(format!(
                    "grace_seconds {s}: at most {MAX_GRACE_SECONDS}"
                )))
            }
            Some(s) => Duration::from_secs(s),
        };
        Ok(Self {
            repository: repo_of(plan, req.repository.as_ref())?,
            grace,
        })
    }
}

fn repo_of(plan: &JobPlan, r: Option<&proto::Repository>) -> Result<RepoAccess> {
    let resolved = plan
        .repository
        .as_ref()
        .ok_or_else(|| Error::internal("repository job without a repository"))?;
    Ok(RepoAccess::new(resolved, r))
}

impl Validator {
    fn repository(&self, r: Option<&proto::Repository>) -> Result<ResolvedEndpoint> {
        check_repository(&self.roots, &self.secrets, "repository", r)
    }

    /// Validates a StartBackup request.
    pub fn backup(&self, req: &proto::StartBackupRequest) -> Result<Accepted> {
        check_meta(&req.idempotency_key, &req.labels)?;
        let source = self.checked_endpoint("source", req.source.as_ref())?;
        let repository = self.repository(req.repository.as_ref())?;
        let plan = JobPlan {
            source: source.resolved,
            target: None,
            target_key: None,
            hosts: source.host.into_iter().collect(),
            source_kind: source.kind.to_string(),
            target_kind: None,
            more_targets: Vec::new(),
            repository: Some(repository),
        };
        let spec = JobSpec::Backup(Box::new(BackupSpec::new(req, &plan)?));
        let meta = Meta {
            key: &req.idempotency_key,
            labels: &req.labels,
            priority: req.priority,
            refuse_if_target_busy: false,
        };
        Ok(Accepted::new(
            JobKind::Backup,
            req.encode_to_vec(),
            spec,
            plan,
            meta,
        ))
    }

    /// Validates a StartRestore request.
    pub fn restore(&self, req: &proto::StartRestoreRequest) -> Result<Accepted> {
        check_meta(&req.idempotency_key, &req.labels)?;
        let repository = self.repository(req.repository.as_ref())?;
        let target = self.checked_endpoint("target", req.target.as_ref())?;
        let plan = JobPlan {
            source: repository.clone(),
            target: Some(target.resolved),
            target_key: Some(target.key),
            hosts: target.host.into_iter().collect(),
            source_kind: "repository".into(),
            target_kind: Some(target.kind.to_string()),
            more_targets: Vec::new(),
            repository: Some(repository),
        };
        let spec = JobSpec::Restore(Box::new(RestoreSpec::new(req, &plan)?));
        let meta = Meta {
            key: &req.idempotency_key,
            labels: &req.labels,
            priority: req.priority,
            refuse_if_target_busy: req.refuse_if_target_busy,
        };
        Ok(Accepted::new(
            JobKind::Restore,
            req.encode_to_vec(),
            spec,
            plan,
            meta,
        ))
    }

    /// Validates a StartRepositoryVerify request.
    pub fn repository_verify(&self, req: &proto::StartRepositoryVerifyRequest) -> Result<Accepted> {
        check_meta(&req.idempotency_key, &req.labels)?;
        let plan = repository_plan(self.repository(req.repository.as_ref())?);
        let spec = JobSpec::RepositoryVerify(Box::new(VerifySpec::new(req, &plan)?));
        let meta = Meta {
            key: &req.idempotency_key,
            labels: &req.labels,
            priority: req.priority,
            refuse_if_target_busy: false,
        };
        Ok(Accepted::new(
            JobKind::RepositoryVerify,
            req.encode_to_vec(),
            spec,
            plan,
            meta,
        ))
    }

    /// Validates a StartPrune request.
    pub fn prune(&self, req: &proto::StartPruneRequest) -> Result<Accepted> {
        check_meta(&req.idempotency_key, &req.labels)?;
        let plan = repository_plan(self.repository(req.repository.as_ref())?);
        let spec = JobSpec::Prune(Box::new(PruneSpec::new(req, &plan)?));
        let meta = Meta {
            key: &req.idempotency_key,
            labels: &req.labels,
            priority: req.priority,
            refuse_if_target_busy: false,
        };
        Ok(Accepted::new(
            JobKind::Prune,
            req.encode_to_vec(),
            spec,
            plan,
            meta,
        ))
    }

    /// Validates a StartGc request.
    pub fn gc(&self, req: &proto::StartGcRequest) -> Result<Accepted> {
        check_meta(&req.idempotency_key, &req.labels)?;
        let plan = repository_plan(self.repository(req.repository.as_ref())?);
        let spec = JobSpec::Gc(Box::new(GcSpec::new(req, &plan)?));
        let meta = Meta {
            key: &req.idempotency_key,
            labels: &req.labels,
            priority: req.priority,
            refuse_if_target_busy: false,
        };
        Ok(Accepted::new(
            JobKind::Gc,
            req.encode_to_vec(),
            spec,
            plan,
            meta,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretResolver;
    use crate::security::AllowRoots;
    use ferry_core::ErrorKind;

    fn validator(root: &std::path::Path) -> Validator {
        Validator {
            roots: AllowRoots::new(&[root.to_path_buf()]).unwrap(),
            secrets: SecretResolver::new(None),
        }
    }

    fn backup(root: &std::path::Path) -> proto::StartBackupRequest {
        std::fs::write(root.join("a.img"), [1u8; 4096]).unwrap();
        proto::StartBackupRequest {
            source: Some(proto::Endpoint {
                url: root.join("a.img").display().to_string(),
                ..Default::default()
            }),
            repository: Some(proto::Repository {
                url: root.join("repo").display().to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_backup_is_accepted_with_its_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let acc = validator(&root).backup(&backup(&root)).unwrap();
        assert_eq!(acc.kind, JobKind::Backup);
        assert_eq!(
            acc.plan.repository,
            Some(ResolvedEndpoint::File(root.join("repo")))
        );
        let JobSpec::Backup(spec) = acc.spec.as_ref() else {
            panic!("not a backup spec")
        };
        assert_eq!(spec.parent, ParentChoice::Auto);
        assert_eq!(spec.source_id, root.join("a.img").display().to_string());
        assert_eq!(spec.workers, ferry_image_backup::DEFAULT_WORKERS);
        assert!(spec.init.is_none() && spec.retention.is_none());
    }

    #[test]
    fn bad_backup_requests_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let v = validator(&root);
        let check = |f: &dyn Fn(&mut proto::StartBackupRequest), kind: ErrorKind, what: &str| {
            let mut req = backup(&root);
            f(&mut req);
            let e = v.backup(&req).unwrap_err();
            assert_eq!(e.kind(), kind, "{e}");
            assert!(e.to_string().contains(what), "{what}: {e}");
        };
        check(
            &|r| r.repository.as_mut().unwrap().url = "/etc/ferry-repo".into(),
            ErrorKind::PermissionDenied,
            "repository",
        );
        check(
            &|r| r.repository.as_mut().unwrap().url = "nbd://h/e".into(),
            ErrorKind::InvalidInput,
            "repository.url",
        );
        check(
            &|r| r.repository.as_mut().unwrap().url = "s3://b:pw@x".into(),
            ErrorKind::InvalidInput,
            "repository.url",
        );
        check(
            &|r| r.parent = "latest".into(),
            ErrorKind::InvalidInput,
            "parent",
        );
        check(&|r| r.workers = 1000, ErrorKind::InvalidInput, "workers");
        check(
            &|r| {
                r.init_if_missing = Some(proto::RepositoryInit {
                    chunk_size: 0,
                    zstd_level: Some(23),
                    ..Default::default()
                })
            },
            ErrorKind::InvalidInput,
            "init_if_missing.zstd_level",
        );
        check(
            &|r| {
                r.repository.as_mut().unwrap().key = Some(proto::SecretRef {
                    source: Some(proto::secret_ref::Source::Env(
                        "FERRY_TEST_UNSET_KEY_VARIABLE".into(),
                    )),
                })
            },
            ErrorKind::InvalidInput,
            "repository.key",
        );
        check(
            &|r| r.source_id = "x".repeat(MAX_SOURCE_ID_BYTES + 1),
            ErrorKind::InvalidInput,
            "source_id",
        );
    }

    #[test]
    fn grace_and_snapshot_ids_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let v = validator(&root);
        let repo = Some(proto::Repository {
            url: root.join("repo").display().to_string(),
            ..Default::default()
        });
        let gc = v
            .gc(&proto::StartGcRequest {
                repository: repo.clone(),
                ..Default::default()
            })
            .unwrap();
        let JobSpec::Gc(spec) = gc.spec.as_ref() else {
            panic!()
        };
        assert_eq!(spec.grace, DEFAULT_GRACE);
        let e = v
            .repository_verify(&proto::StartRepositoryVerifyRequest {
                repository: repo,
                snapshot_ids: vec!["20261202T101500Z-0a1b2c3d".into(), "nope".into()],
                ..Default::default()
            })
            .unwrap_err();
        assert!(e.to_string().contains("snapshot_ids[1]"), "{e}");
    }
}
