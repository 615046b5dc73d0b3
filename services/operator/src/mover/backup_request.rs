//! The backup job requests the operator sends a mover (a backup, the prune after it, the
//! copy into a secondary repository and the prune there, a restore): ferry-api's
//! `StartBackupRequest`, `StartPruneRequest`, `StartSyncRequest` and
//! `StartRestoreRequest`, built from the resource by pure functions.
//!
//! The repository becomes its URL inside the mover (an `s3://` URL with its options, or
//! the directory of its claim), the encryption key a `SecretRef{file}` under the mover's
//! `--secrets-dir`. Idempotency keys are the resource's uid and the step
//! (`<uid>/backup`, `<uid>/prune`, `<uid>/sync`, `<uid>/prune-secondary`,
//! `<uid>/restore`), so a reconcile that repeats itself
//! starts nothing twice.

use ferry_api::proto;
use kube::Resource;

use super::endpoint::{claim_image, endpoint};
use super::pod::metadata_token;
use super::request::{owner_labels, uid_of};
use super::{layout, wire, MoverError, ResolvedPvc};
use crate::crd::{
    Backup, BackupRepositorySpec, Endpoint, MetadataLookup, PvcRef, Retention, Secondary,
    SnapshotChoice, ValidationError, VolumeMode,
};

/// The repository's directory when it is kept in a claim.
pub fn repository_dir(pvc: &PvcRef) -> String {
    match &pvc.path {
        Some(path) => format!("{}/{}/{path}", layout::VOLUMES_DIR, pvc.name),
        None => format!("{}/{}", layout::VOLUMES_DIR, pvc.name),
    }
}

/// A repository as the mover opens it.
pub fn repository(repo: &BackupRepositorySpec) -> proto::Repository {
    let key = repo.key().map(wire::secret_ref);
    match &repo.pvc {
        Some(pvc) => proto::Repository {
            url: repository_dir(pvc),
            s3: None,
            key,
        },
        None => proto::Repository {
            url: repo.url.clone().unwrap_or_default(),
            s3: repo.s3.as_ref().map(wire::s3_options),
            key,
        },
    }
}

fn uid_and_repository(backup: &Backup) -> Result<(String, &BackupRepositorySpec), MoverError> {
    backup.spec.validate()?;
    let uid = uid_of(backup, "Backup")?;
    let repo = backup.spec.resolved_repository.as_ref().ok_or_else(|| {
        MoverError::Invalid(ValidationError {
            field: "spec.repository".into(),
            message: "the repository was not looked up".into(),
        })
    })?;
    Ok((uid, repo))
}

/// The backup request of a Backup.
pub fn backup_request(
    backup: &Backup,
    pvcs: &[ResolvedPvc],
) -> Result<proto::StartBackupRequest, MoverError> {
    let (uid, repo) = uid_and_repository(backup)?;
    let spec = &backup.spec;
    let source = Endpoint {
        pvc: Some(PvcRef {
            name: spec.source_pvc.clone(),
            path: spec.path.clone(),
            namespace: None,
        }),
        ..Endpoint::default()
    };
    let namespace = backup.meta().namespace.clone().unwrap_or_default();
    let metadata = metadata_source(backup, pvcs, &namespace);
    Ok(proto::StartBackupRequest {
        source: Some(endpoint(&source, pvcs)?),
        repository: Some(repository(repo)),
        // `auto` (the latest snapshot of the same source), `none` (a full backup) or a
        // snapshot id, as the wire spells them.
        parent: spec.parent.clone().unwrap_or_else(|| "auto".into()),
        source_id: spec.source_id_in(&namespace),
        tags: spec.tags.clone().unwrap_or_default(),
        init_if_missing: repo
            .initialize
            .unwrap_or(false)
            .then(proto::RepositoryInit::default),
        idempotency_key: format!("{uid}/backup"),
        labels: owner_labels(&uid),
        volume_snapshot_handle: metadata
            .as_ref()
            .map(|(_, handle)| handle.clone())
            .unwrap_or_default(),
        snapshot_metadata: metadata.map(|(source, _)| source),
        ..proto::StartBackupRequest::default()
    })
}

/// What the mover asks the CSI SnapshotMetadata service, and the snapshot handle it
/// records: only for a Block source claim and a service the operator found. The token
/// is the file [`metadata_token`] names; the base snapshot is the one the parent backup
/// recorded.
fn metadata_source(
    backup: &Backup,
    pvcs: &[ResolvedPvc],
    namespace: &str,
) -> Option<(proto::SnapshotMetadataSource, String)> {
    let Some(MetadataLookup::Service(service)) = &backup.spec.resolved_snapshot_metadata else {
        return None;
    };
    let block = pvcs
        .iter()
        .any(|p| p.name == backup.spec.source_pvc && p.mode == VolumeMode::Block);
    let snapshot = backup.spec.volume_snapshot.clone()?;
    let token = metadata_token(backup)?;
    block.then(|| {
        (
            proto::SnapshotMetadataSource {
                address: service.address.clone(),
                ca_certificate: service.ca_pem.clone(),
                token: Some(proto::SecretRef {
                    source: Some(proto::secret_ref::Source::File(token)),
                }),
                snapshot,
                namespace: namespace.to_string(),
                base_snapshot_id: String::new(),
            },
            service.snapshot_handle.clone(),
        )
    })
}

/// The prune after a Backup (None when it sets no `retain`).
pub fn prune_request(backup: &Backup) -> Result<Option<proto::StartPruneRequest>, MoverError> {
    let (uid, repo) = uid_and_repository(backup)?;
    Ok(backup
        .spec
        .retain
        .as_ref()
        .map(|retain| prune(backup, &uid, repo, retain, "prune")))
}

/// A prune of the Backup's source in `repo` by `retain`, as step `step`.
fn prune(
    backup: &Backup,
    uid: &str,
    repo: &BackupRepositorySpec,
    retain: &Retention,
    step: &str,
) -> proto::StartPruneRequest {
    let namespace = backup.meta().namespace.clone().unwrap_or_default();
    proto::StartPruneRequest {
        repository: Some(repository(repo)),
        retention: Some(wire::retention(retain)),
        source_id: backup.spec.source_id_in(&namespace),
        idempotency_key: format!("{uid}/{step}"),
        labels: owner_labels(uid),
        ..proto::StartPruneRequest::default()
    }
}

/// The secondary repository of a Backup, once looked up (None when it names none).
fn secondary(backup: &Backup) -> Result<Option<(&Secondary, &BackupRepositorySpec)>, MoverError> {
    let Some(secondary) = &backup.spec.secondary else {
        return Ok(None);
    };
    let repo = backup.spec.resolved_secondary.as_ref().ok_or_else(|| {
        MoverError::Invalid(ValidationError {
            field: "spec.secondary.repository".into(),
            message: "the repository was not looked up".into(),
        })
    })?;
    Ok(Some((secondary, repo)))
}

/// The copy of the Backup's source's snapshots into its secondary repository (None when
/// it names none): the selection by the secondary's `retain`, the destination created
/// from the primary when its BackupRepository says `initialize`.
pub fn sync_request(backup: &Backup) -> Result<Option<proto::StartSyncRequest>, MoverError> {
    let (uid, primary) = uid_and_repository(backup)?;
    let Some((secondary, repo)) = secondary(backup)? else {
        return Ok(None);
    };
    let namespace = backup.meta().namespace.clone().unwrap_or_default();
    Ok(Some(proto::StartSyncRequest {
        source: Some(repository(primary)),
        destination: Some(repository(repo)),
        source_id: backup.spec.source_id_in(&namespace),
        retention: secondary.retain.as_ref().map(wire::retention),
        remove_vanished: secondary.remove_vanished.unwrap_or(false),
        rate_limit: secondary.rate_limit.unwrap_or(0),
        rate_limit_windows: secondary
            .rate_limit_windows
            .iter()
            .map(wire::rate_limit_window)
            .collect(),
        init_destination_if_missing: repo.initialize.unwrap_or(false),
        idempotency_key: format!("{uid}/sync"),
        labels: owner_labels(&uid),
        ..proto::StartSyncRequest::default()
    }))
}

/// The prune of the secondary repository after the copy (None when the secondary sets
/// no `retain`).
pub fn secondary_prune_request(
    backup: &Backup,
) -> Result<Option<proto::StartPruneRequest>, MoverError> {
    let (uid, _) = uid_and_repository(backup)?;
    let Some((secondary, repo)) = secondary(backup)? else {
        return Ok(None);
    };
    Ok(secondary
        .retain
        .as_ref()
        .map(|retain| prune(backup, &uid, repo, retain, "prune-secondary")))
}

/// A restore of `snapshot` from `repo` into the claim `target` (its whole device when
/// Block, `disk.img` when Filesystem), for the resource of uid `uid`.
pub fn restore_request(
    uid: &str,
    repo: &BackupRepositorySpec,
    snapshot: &SnapshotChoice,
    target: &ResolvedPvc,
) -> proto::StartRestoreRequest {
    let (snapshot_id, latest) = match snapshot {
        SnapshotChoice::Id(id) => (id.clone(), None),
        SnapshotChoice::Latest { source_id, as_of } => (
            String::new(),
            Some(proto::LatestBackup {
                source_id: source_id.clone(),
                as_of: as_of.as_ref().map(|t| prost_types::Timestamp {
                    seconds: t.0.as_second(),
                    nanos: t.0.subsec_nanosecond(),
                }),
            }),
        ),
    };
    proto::StartRestoreRequest {
        repository: Some(repository(repo)),
        snapshot_id,
        latest,
        target: Some(claim_image(target)),
        idempotency_key: format!("{uid}/restore"),
        labels: owner_labels(uid),
        refuse_if_target_busy: true,
        ..proto::StartRestoreRequest::default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use std::collections::BTreeMap;

    use super::*;
    use crate::crd::{
        BackupSpec, Encryption, MetadataService, Retention, S3Options, SecretKeyRef, VolumeMode,
    };
    use crate::mover::request::OWNER_UID_LABEL;

    fn secret(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    fn file(name: &str) -> Option<proto::SecretRef> {
        Some(proto::SecretRef {
            source: Some(proto::secret_ref::Source::File(name.into())),
        })
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
                volume_snapshot: None,
                resolved_repository: Some(repo),
                resolved_snapshot_metadata: None,
                secondary: None,
                resolved_secondary: None,
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
        assert_eq!(r.source.unwrap().url, "/dev/ferry/web1");
        assert_eq!(
            r.repository,
            Some(proto::Repository {
                url: "s3://backups/site-a".into(),
                s3: Some(proto::S3Options {
                    endpoint_url: "http://minio:9000".into(),
                    region: String::new(),
                    access_key_id: file("s3/id"),
                    secret_access_key: file("s3/secret"),
                    session_token: None,
                    force_path_style: true,
                }),
                key: file("backup-key/passphrase"),
            })
        );
        assert_eq!(r.init_if_missing, Some(proto::RepositoryInit::default()));
        assert_eq!(r.source_id, "vms/web1");
        assert_eq!(r.parent, "none");
        assert_eq!(r.tags, BTreeMap::from([("vm".into(), "web1".into())]));
        assert_eq!(r.retention, None, "the prune is a job of its own");
        assert_eq!(r.idempotency_key, "uid-b/backup");
        assert_eq!(r.labels[OWNER_UID_LABEL], "uid-b");
        let p = prune_request(&b).unwrap().unwrap();
        assert_eq!(p.idempotency_key, "uid-b/prune");
        let retain = p.retention.unwrap();
        assert_eq!(retain.keep_daily, 7);
        assert_eq!(retain.keep_within, "2d");
        assert_eq!(p.repository, r.repository);
        assert_eq!(p.source_id, "vms/web1");
        assert!(matches!(
            backup_request(&b, &[]),
            Err(MoverError::UnresolvedPvc(_))
        ));
    }

    #[test]
    fn a_found_service_is_asked_for_a_block_claim_with_the_minted_tokens_file() {
        let repo = BackupRepositorySpec {
            url: Some("s3://backups/site-a".into()),
            s3: None,
            pvc: None,
            encryption: None,
            initialize: None,
        };
        let mut b = backup(repo);
        b.spec.volume_snapshot = Some("nightly-20261202030000".into());
        b.spec.resolved_snapshot_metadata = Some(MetadataLookup::Service(MetadataService {
            driver: "hostpath.csi.k8s.io".into(),
            address: "https://csi-snapshot-metadata.csi:6443".into(),
            ca_pem: b"-----BEGIN CERTIFICATE-----".to_vec(),
            audience: "cbt.example".into(),
            snapshot_handle: "h-7".into(),
        }));
        let block = [ResolvedPvc::new("web1", VolumeMode::Block)];
        let r = backup_request(&b, &block).unwrap();
        assert_eq!(r.volume_snapshot_handle, "h-7");
        assert_eq!(
            r.snapshot_metadata,
            Some(proto::SnapshotMetadataSource {
                address: "https://csi-snapshot-metadata.csi:6443".into(),
                ca_certificate: b"-----BEGIN CERTIFICATE-----".to_vec(),
                token: file("_snapshot-metadata/token"),
                snapshot: "nightly-20261202030000".into(),
                namespace: "vms".into(),
                base_snapshot_id: String::new(),
            }),
            "the base is the parent's recorded handle: none sent"
        );
        let filesystem = [ResolvedPvc::new("web1", VolumeMode::Filesystem)];
        let r = backup_request(&b, &filesystem).unwrap();
        assert_eq!(
            r.snapshot_metadata, None,
            "a file's blocks are not the volume's"
        );
        assert_eq!(r.volume_snapshot_handle, "");
        b.spec.resolved_snapshot_metadata = Some(MetadataLookup::Unavailable("no service".into()));
        let r = backup_request(&b, &block).unwrap();
        assert_eq!(r.snapshot_metadata, None);
    }

    #[test]
    fn a_claim_repository_is_its_directory() {
        let repo = BackupRepositorySpec {
            url: None,
            s3: None,
            pvc: Some(PvcRef {
                name: "repo".into(),
                path: Some("ferry".into()),
                namespace: None,
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
        assert_eq!(
            r.source.unwrap().url,
            "/var/run/ferry/volumes/web1/disk.img"
        );
        let repository = r.repository.unwrap();
        assert_eq!(repository.url, "/var/run/ferry/volumes/repo/ferry");
        assert_eq!(repository.key, None);
        assert_eq!(repository.s3, None);
        assert_eq!(r.init_if_missing, None);
        let restore = restore_request(
            "uid-c",
            &repo,
            &SnapshotChoice::Id("20261202T101500Z-0a1b2c3d".into()),
            &ResolvedPvc::new("new", VolumeMode::Block),
        );
        assert_eq!(restore.target.unwrap().url, "/dev/ferry/new");
        assert_eq!(restore.snapshot_id, "20261202T101500Z-0a1b2c3d");
        assert_eq!(restore.latest, None);
        assert_eq!(restore.idempotency_key, "uid-c/restore");
        assert!(restore.refuse_if_target_busy);
        let as_of: Time = serde_json::from_str("\"2026-12-02T03:00:00Z\"").unwrap();
        let latest = restore_request(
            "uid-c",
            &repo,
            &SnapshotChoice::Latest {
                source_id: "vms/web1".into(),
                as_of: Some(as_of),
            },
            &ResolvedPvc::new("new", VolumeMode::Block),
        );
        assert_eq!(latest.snapshot_id, "");
        assert_eq!(
            latest.latest,
            Some(proto::LatestBackup {
                source_id: "vms/web1".into(),
                as_of: Some(prost_types::Timestamp {
                    seconds: 1_796_180_400,
                    nanos: 0
                }),
            })
        );
    }
}
