//! The backup job requests the operator sends a mover (a backup, the prune after it, a
//! restore), as plain Rust data mirroring the gRPC API's `StartBackupRequest`,
//! `StartPruneRequest` and `StartRestoreRequest` (ferry-mover converts them).
//!
//! The repository becomes its URL inside the mover (an `s3://` URL with its options, or
//! the directory of its claim), the encryption key a `SecretRef{file}` under the mover's
//! `--secrets-dir`. Idempotency keys are the resource's uid and the step
//! (`<uid>/backup`, `<uid>/prune`, `<uid>/restore`), so a reconcile that repeats itself
//! starts nothing twice.

use std::collections::BTreeMap;

use kube::Resource;

use super::layout;
use super::request::{wire_endpoint, EndpointOptions, SecretRef, WireEndpoint, OWNER_UID_LABEL};
use super::{MoverError, ResolvedPvc};
use crate::crd::{Backup, BackupRepositorySpec, Endpoint, PvcRef, Retention, ValidationError};

/// A repository as the mover opens it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireRepository {
    /// `s3://bucket/prefix`, or the repository's directory inside the mover.
    pub url: String,
    /// S3 options of an `s3://` URL.
    pub options: Option<EndpointOptions>,
    /// The encryption passphrase's file.
    pub key: Option<SecretRef>,
}

/// Which snapshot a backup builds on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parent {
    /// The latest snapshot of the same source.
    Auto,
    /// None: a full backup.
    None,
    /// This snapshot.
    Id(String),
}

/// `StartBackupRequest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartBackup {
    pub source: WireEndpoint,
    pub repository: WireRepository,
    /// Create the repository when it does not exist.
    pub initialize: bool,
    pub source_id: String,
    pub parent: Parent,
    pub tags: BTreeMap<String, String>,
    pub idempotency_key: String,
    pub labels: BTreeMap<String, String>,
}

/// The keep rules of a prune; 0 and empty mean off, as on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireRetention {
    pub last: u32,
    pub hourly: u32,
    pub daily: u32,
    pub weekly: u32,
    pub monthly: u32,
    pub yearly: u32,
    pub within: String,
}

/// `StartPruneRequest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartPrune {
    pub repository: WireRepository,
    /// Only this source's snapshots.
    pub source_id: String,
    pub retain: WireRetention,
    pub idempotency_key: String,
    pub labels: BTreeMap<String, String>,
}

/// `StartRestoreRequest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartRestore {
    pub repository: WireRepository,
    pub snapshot_id: String,
    pub target: WireEndpoint,
    pub idempotency_key: String,
    pub labels: BTreeMap<String, String>,
}

/// The repository's directory when it is kept in a claim.
pub fn repository_dir(pvc: &PvcRef) -> String {
    match &pvc.path {
        Some(path) => format!("{}/{}/{path}", layout::VOLUMES_DIR, pvc.name),
        None => format!("{}/{}", layout::VOLUMES_DIR, pvc.name),
    }
}

/// A repository as the mover opens it.
pub fn wire_repository(repo: &BackupRepositorySpec) -> WireRepository {
    let key = repo.key().map(|r| SecretRef::File(layout::secret_file(r)));
    match &repo.pvc {
        Some(pvc) => WireRepository {
            url: repository_dir(pvc),
            options: None,
            key,
        },
        None => {
            let endpoint = Endpoint {
                url: repo.url.clone(),
                s3: repo.s3.clone(),
                ..Endpoint::default()
            };
            // A URL endpoint never names a claim, so this cannot fail.
            let wire = wire_endpoint(&endpoint, &[]).unwrap_or_default();
            WireRepository {
                url: wire.url,
                options: wire.options,
                key,
            }
        }
    }
}

fn uid_and_repository(backup: &Backup) -> Result<(String, &BackupRepositorySpec), MoverError> {
    backup.spec.validate()?;
    let uid = backup
        .meta()
        .uid
        .clone()
        .ok_or(MoverError::NotStored("Backup"))?;
    let repo = backup.spec.resolved_repository.as_ref().ok_or_else(|| {
        MoverError::Invalid(ValidationError {
            field: "spec.repository".into(),
            message: "the repository was not looked up".into(),
        })
    })?;
    Ok((uid, repo))
}

fn labels(uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(OWNER_UID_LABEL.to_string(), uid.to_string())])
}

/// The backup request of a Backup.
pub fn backup_request(backup: &Backup, pvcs: &[ResolvedPvc]) -> Result<StartBackup, MoverError> {
    let (uid, repo) = uid_and_repository(backup)?;
    let spec = &backup.spec;
    let source = Endpoint {
        pvc: Some(PvcRef {
            name: spec.source_pvc.clone(),
            path: spec.path.clone(),
        }),
        ..Endpoint::default()
    };
    let namespace = backup.meta().namespace.clone().unwrap_or_default();
    Ok(StartBackup {
        source: wire_endpoint(&source, pvcs)?,
        repository: wire_repository(repo),
        initialize: repo.initialize.unwrap_or(false),
        source_id: spec.source_id_in(&namespace),
        parent: match spec.parent.as_deref() {
            None | Some("auto") => Parent::Auto,
            Some("none") => Parent::None,
            Some(id) => Parent::Id(id.to_string()),
        },
        tags: spec.tags.clone().unwrap_or_default(),
        idempotency_key: format!("{uid}/backup"),
        labels: labels(&uid),
    })
}

/// The rules on the wire.
pub fn wire_retention(r: &Retention) -> WireRetention {
    WireRetention {
        last: r.last.unwrap_or(0),
        hourly: r.hourly.unwrap_or(0),
        daily: r.daily.unwrap_or(0),
        weekly: r.weekly.unwrap_or(0),
        monthly: r.monthly.unwrap_or(0),
        yearly: r.yearly.unwrap_or(0),
        within: r.within.clone().unwrap_or_default(),
    }
}

/// The prune after a Backup (None when it sets no `retain`).
pub fn prune_request(backup: &Backup) -> Result<Option<StartPrune>, MoverError> {
    let (uid, repo) = uid_and_repository(backup)?;
    let Some(retain) = &backup.spec.retain else {
        return Ok(None);
    };
    let namespace = backup.meta().namespace.clone().unwrap_or_default();
    Ok(Some(StartPrune {
        repository: wire_repository(repo),
        source_id: backup.spec.source_id_in(&namespace),
        retain: wire_retention(retain),
        idempotency_key: format!("{uid}/prune"),
        labels: labels(&uid),
    }))
}

/// A restore of `snapshot_id` from `repo` into the claim `target` (its whole device when
/// Block, `disk.img` when Filesystem), for the resource of uid `uid`.
pub fn restore_request(
    uid: &str,
    repo: &BackupRepositorySpec,
    snapshot_id: &str,
    target: &ResolvedPvc,
) -> StartRestore {
    let r = PvcRef {
        name: target.name.clone(),
        path: None,
    };
    StartRestore {
        repository: wire_repository(repo),
        snapshot_id: snapshot_id.to_string(),
        target: WireEndpoint {
            url: layout::pvc_image(&r, target.mode),
            ..WireEndpoint::default()
        },
        idempotency_key: format!("{uid}/restore"),
        labels: labels(uid),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::crd::{BackupSpec, Encryption, S3Options, SecretKeyRef, VolumeMode};
    use crate::mover::request::S3Options as WireS3;

    fn secret(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    fn backup(repo: BackupRepositorySpec) -> Backup {
        let mut b = Backup::new(
            "web1-nightly",
            BackupSpec {
                source_pvc: "web1".into(),
                path: None,
                repository: "site-a".into(),
                source_id: None,
                parent: Some("none".into()),
                tags: Some(BTreeMap::from([("vm".into(), "web1".into())])),
                retain: Some(Retention {
                    daily: Some(7),
                    within: Some("2d".into()),
                    ..Retention::default()
                }),
                mover: None,
                resolved_repository: Some(repo),
            },
        );
        b.metadata = ObjectMeta {
            name: Some("web1-nightly".into()),
            namespace: Some("vms".into()),
            uid: Some("uid-b".into()),
            ..ObjectMeta::default()
        };
        b
    }

    #[test]
    fn an_s3_repository_with_a_key_becomes_files_never_values() {
        let repo = BackupRepositorySpec {
            url: Some("s3://backups/site-a".into()),
            s3: Some(S3Options {
                endpoint_url: Some("http://minio:9000".into()),
                access_key_id: Some(secret("s3", "id")),
                secret_access_key: Some(secret("s3", "secret")),
                force_path_style: Some(true),
                ..S3Options::default()
            }),
            pvc: None,
            encryption: Some(Encryption {
                key_secret_ref: secret("backup-key", "passphrase"),
            }),
            initialize: Some(true),
        };
        let b = backup(repo);
        let pvcs = [ResolvedPvc::new("web1", VolumeMode::Block)];
        let r = backup_request(&b, &pvcs).unwrap();
        assert_eq!(r.source.url, "/dev/ferry/web1");
        assert_eq!(
            r.repository,
            WireRepository {
                url: "s3://backups/site-a".into(),
                options: Some(EndpointOptions::S3(WireS3 {
                    endpoint_url: "http://minio:9000".into(),
                    region: String::new(),
                    access_key_id: Some(SecretRef::File("s3/id".into())),
                    secret_access_key: Some(SecretRef::File("s3/secret".into())),
                    session_token: None,
                    force_path_style: true,
                })),
                key: Some(SecretRef::File("backup-key/passphrase".into())),
            }
        );
        assert!(r.initialize);
        assert_eq!(r.source_id, "vms/web1");
        assert_eq!(r.parent, Parent::None);
        assert_eq!(r.idempotency_key, "uid-b/backup");
        assert_eq!(r.labels[OWNER_UID_LABEL], "uid-b");
        let p = prune_request(&b).unwrap().unwrap();
        assert_eq!(p.idempotency_key, "uid-b/prune");
        assert_eq!(p.retain.daily, 7);
        assert_eq!(p.retain.within, "2d");
        assert_eq!(p.source_id, "vms/web1");
        assert!(matches!(
            backup_request(&b, &[]),
            Err(MoverError::UnresolvedPvc(_))
        ));
    }

    #[test]
    fn a_claim_repository_is_its_directory() {
        let repo = BackupRepositorySpec {
            url: None,
            s3: None,
            pvc: Some(PvcRef {
                name: "repo".into(),
                path: Some("ferry".into()),
            }),
            encryption: None,
            initialize: None,
        };
        let b = backup(repo.clone());
        let pvcs = [
            ResolvedPvc::new("web1", VolumeMode::Filesystem),
            ResolvedPvc::new("repo", VolumeMode::Filesystem),
        ];
        let r = backup_request(&b, &pvcs).unwrap();
        assert_eq!(r.source.url, "/var/run/ferry/volumes/web1/disk.img");
        assert_eq!(r.repository.url, "/var/run/ferry/volumes/repo/ferry");
        assert_eq!(r.repository.key, None);
        assert!(!r.initialize);
        let restore = restore_request(
            "uid-c",
            &repo,
            "20261202T101500Z-0a1b2c3d",
            &ResolvedPvc::new("new", VolumeMode::Block),
        );
        assert_eq!(restore.target.url, "/dev/ferry/new");
        assert_eq!(restore.idempotency_key, "uid-c/restore");
    }
}
