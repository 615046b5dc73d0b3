//! The Restore kind as the reconciler sees it: one restore job of a snapshot into the
//! target claim. The snapshot is looked up before each reconcile ([`reconcile_restore`]:
//! the named Backup's repository and snapshot id, or the named repository) and carried in
//! the spec's never-stored `resolved`; what cannot be found makes the spec invalid.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use kube::{Api, Resource};

use crate::crd::{
    Backup, BackupRepository, Endpoint, Phase, ResolvedSnapshot, Restore, RestoreStatus,
    SecretKeyRef, SnapshotChoice, ValidationError,
};
use crate::mover::backup_request::restore_request;
use crate::mover::{find_pvc, restore_pod, MoverError, MoverPodInput, ResolvedPvc};

use super::context::Context;
use super::error::Error;
use super::kind::{Claim, MoverKind, Outcome};
use super::link::{JobReport, JobRequest};
use super::progress::{failure_text, first_failure, is_transient, overall};
use super::reconcile::reconcile;

/// The snapshot a Restore names, or why it cannot be used.
async fn resolve(
    ctx: &Context,
    namespace: &str,
    restore: &Restore,
) -> Result<Result<ResolvedSnapshot, String>, Error> {
    let backup = match &restore.spec.backup {
        Some(name) => {
            let backups: Api<Backup> = Api::namespaced(ctx.client.clone(), namespace);
            backups.get_opt(name).await?
        }
        None => None,
    };
    let (repository, snapshot) = match named_snapshot(restore, backup.as_ref()) {
        Ok(named) => named,
        Err(why) => return Ok(Err(why)),
    };
    let repositories: Api<BackupRepository> = Api::namespaced(ctx.client.clone(), namespace);
    let found = repositories.get_opt(&repository).await?;
    Ok(snapshot_in(&repository, snapshot, found))
}

/// The repository name and snapshot a Restore names: through its Backup (`backup`, the
/// named Backup as found, None when it does not exist) or directly.
pub fn named_snapshot(
    restore: &Restore,
    backup: Option<&Backup>,
) -> Result<(String, SnapshotChoice), String> {
    match (&restore.spec.backup, &restore.spec.repository) {
        (Some(name), _) => {
            let Some(backup) = backup else {
                return Err(format!(
                    "Backup '{name}' does not exist in this namespace: fix the name"
                ));
            };
            let status = backup.status.clone().unwrap_or_default();
            match (status.phase, status.snapshot_id) {
                (Phase::Succeeded, Some(id)) => {
                    Ok((backup.spec.repository.clone(), SnapshotChoice::Id(id)))
                }
                (phase, _) => Err(format!(
                    "Backup '{name}' has no snapshot to restore (phase {phase:?}): restore a Backup that succeeded"
                )),
            }
        }
        (None, Some(repository)) => Ok((
            repository.clone(),
            match &restore.spec.source_id {
                Some(source_id) => SnapshotChoice::Latest {
                    source_id: source_id.clone(),
                    as_of: restore.spec.restore_as_of.clone(),
                },
                None => SnapshotChoice::Id(restore.spec.snapshot_id.clone().unwrap_or_default()),
            },
        )),
        (None, None) => Err("name a backup, or a repository and snapshotId".into()),
    }
}

/// The snapshot `snapshot` of the repository named `name` (`found`: the
/// BackupRepository, None when it does not exist).
pub fn snapshot_in(
    name: &str,
    snapshot: SnapshotChoice,
    found: Option<BackupRepository>,
) -> Result<ResolvedSnapshot, String> {
    match found {
        Some(repo) => Ok(ResolvedSnapshot {
            repository: repo.spec,
            snapshot,
        }),
        None => Err(format!(
            "BackupRepository '{name}' does not exist in this namespace: create it, or fix the name"
        )),
    }
}

/// One reconcile of a Restore: its snapshot looked up, then the shared state machine. A
/// deleted or finished Restore needs no lookup.
pub async fn reconcile_restore(obj: Arc<Restore>, ctx: Arc<Context>) -> Result<Action, Error> {
    let finished = obj.status.as_ref().is_some_and(|s| s.phase.is_final());
    if obj.metadata.deletion_timestamp.is_some() || finished {
        return reconcile(obj, ctx).await;
    }
    let namespace = obj.metadata.namespace.clone().unwrap_or_default();
    let mut resolved = obj.as_ref().clone();
    resolved.spec.resolved = Some(resolve(&ctx, &namespace, &obj).await?);
    reconcile(Arc::new(resolved), ctx).await
}

fn found(restore: &Restore) -> Option<&ResolvedSnapshot> {
    restore.spec.resolved.as_ref().and_then(|r| r.as_ref().ok())
}

impl MoverKind for Restore {
    type Status = RestoreStatus;
    const KIND: &'static str = "Restore";
    const SHORT: &'static str = "frs";

    fn status(&self) -> Option<&RestoreStatus> {
        self.status.as_ref()
    }

    fn validate(&self) -> Result<(), ValidationError> {
        self.spec.validate()
    }

    fn claims(&self) -> Vec<Claim<'_>> {
        let mut claims = vec![Claim::Existing(self.spec.target_pvc.as_str())];
        if let Some(pvc) = found(self).and_then(|f| f.repository.pvc.as_ref()) {
            claims.push(Claim::Existing(pvc.name.as_str()));
        }
        claims
    }

    fn endpoints(&self) -> Vec<&Endpoint> {
        Vec::new()
    }

    fn secret_keys(&self) -> Vec<&SecretKeyRef> {
        found(self).map_or_else(Vec::new, |found| found.repository.secret_refs())
    }

    fn mover_pod(&self, input: &MoverPodInput<'_>) -> Result<Pod, MoverError> {
        self.spec.validate()?;
        let found = found(self).ok_or(MoverError::NotStored("Restore"))?;
        restore_pod(
            self,
            "Restore",
            &found.repository,
            &self.spec.target_pvc,
            self.spec.mover.as_ref(),
            input,
        )
    }

    fn jobs(
        &self,
        _status: &RestoreStatus,
        pvcs: &[ResolvedPvc],
    ) -> Result<Vec<JobRequest>, MoverError> {
        self.spec.validate()?;
        let found = found(self).ok_or(MoverError::NotStored("Restore"))?;
        let uid = self
            .meta()
            .uid
            .clone()
            .ok_or(MoverError::NotStored("Restore"))?;
        let target = find_pvc(pvcs, &self.spec.target_pvc)?;
        Ok(vec![JobRequest::Restore(Box::new(restore_request(
            &uid,
            &found.repository,
            &found.snapshot,
            target,
        )))])
    }

    fn observe(&self, status: &mut RestoreStatus, reports: &[JobReport]) {
        status.progress = Some(overall(reports, None));
        // The newest snapshot of a source is known once the mover found it.
        let restored = reports.iter().find_map(|r| r.restored_snapshot.clone());
        status.snapshot_id = match found(self).map(|f| &f.snapshot) {
            Some(SnapshotChoice::Id(id)) => Some(id.clone()),
            _ => restored.or(status.snapshot_id.take()),
        };
    }

    fn checkpoint_changed(_before: &RestoreStatus, _after: &RestoreStatus) -> bool {
        false
    }

    fn outcome(&self, _status: &RestoreStatus, reports: &[JobReport]) -> Outcome {
        match first_failure(reports) {
            Some((_, failed)) => {
                let (kind, message) = failure_text(failed);
                let message = format!("restore {kind}: {message}");
                Outcome::of_failure(is_transient(&kind), message)
            }
            None => Outcome::Succeeded,
        }
    }

    fn keep_lookups(&self, written: &mut Self) {
        written.spec.resolved = self.spec.resolved.clone();
    }

    fn succeed(&self, _status: &mut RestoreStatus, _reports: &[JobReport]) {}
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::controller::JobState;

    fn latest_restore() -> Restore {
        let mut r: Restore = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Restore",
            "metadata": {"name": "r", "namespace": "vms", "uid": "u"},
            "spec": {"repository": "site-a", "sourceId": "vms/web1",
                     "restoreAsOf": "2026-12-02T03:00:00Z", "targetPVC": "disk"},
        }))
        .unwrap();
        let (repository, snapshot) = named_snapshot(&r, None).unwrap();
        assert_eq!(repository, "site-a");
        let repo: BackupRepository = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "BackupRepository",
            "metadata": {"name": "site-a", "namespace": "vms"},
            "spec": {"url": "s3://backups/site-a"},
        }))
        .unwrap();
        r.spec.resolved = Some(snapshot_in(&repository, snapshot, Some(repo)));
        r
    }

    #[test]
    fn the_newest_snapshot_of_a_source_is_asked_for_and_recorded_once_found() {
        let r = latest_restore();
        r.spec.validate().unwrap();
        let jobs = r
            .jobs(
                &RestoreStatus::default(),
                &[ResolvedPvc::new("disk", crate::crd::VolumeMode::Block)],
            )
            .unwrap();
        let JobRequest::Restore(request) = &jobs[0] else {
            panic!("{jobs:?}")
        };
        assert_eq!(request.snapshot_id, "");
        let latest = request.latest.as_ref().unwrap();
        assert_eq!(latest.source_id, "vms/web1");
        assert_eq!(latest.as_of.as_ref().unwrap().seconds, 1_796_180_400);

        let mut status = RestoreStatus::default();
        let mut report = JobReport::new("j", JobState::Running);
        r.observe(&mut status, std::slice::from_ref(&report));
        assert_eq!(
            status.snapshot_id, None,
            "not known before the mover found it"
        );
        report.restored_snapshot = Some("20261202T020000Z-00000001".into());
        r.observe(&mut status, std::slice::from_ref(&report));
        assert_eq!(
            status.snapshot_id.as_deref(),
            Some("20261202T020000Z-00000001")
        );
        report.restored_snapshot = None;
        r.observe(&mut status, std::slice::from_ref(&report));
        assert_eq!(
            status.snapshot_id.as_deref(),
            Some("20261202T020000Z-00000001"),
            "kept once known"
        );
    }

    #[test]
    fn a_source_id_goes_with_a_repository_and_not_with_a_snapshot_id() {
        let mut r = latest_restore();
        r.spec.snapshot_id = Some("20261202T020000Z-00000001".into());
        assert_eq!(r.spec.validate().unwrap_err().field, "spec");
        let mut r = latest_restore();
        r.spec.source_id = None;
        assert_eq!(r.spec.validate().unwrap_err().field, "spec.sourceId");
    }
}
