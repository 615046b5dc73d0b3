//! The Restore kind as the reconciler sees it: one restore job of a snapshot into the
//! target claim. The snapshot is looked up before each reconcile ([`reconcile_restore`]:
//! the named Backup's repository and snapshot id, or the named repository) and carried in
//! the spec's never-stored `resolved`; what cannot be found makes the spec invalid.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use kube::{Api, Resource};

use crate::crd::status::condition::reason;
use crate::crd::{
    Backup, BackupRepository, Endpoint, Phase, ResolvedSnapshot, Restore, RestoreStatus,
    SecretKeyRef, ValidationError,
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
    let (repository, snapshot_id) = match named_snapshot(restore, backup.as_ref()) {
        Ok(named) => named,
        Err(why) => return Ok(Err(why)),
    };
    let repositories: Api<BackupRepository> = Api::namespaced(ctx.client.clone(), namespace);
    let found = repositories.get_opt(&repository).await?;
    Ok(snapshot_in(&repository, snapshot_id, found))
}

/// The repository name and snapshot id a Restore names: through its Backup (`backup`,
/// the named Backup as found, None when it does not exist) or directly.
pub fn named_snapshot(
    restore: &Restore,
    backup: Option<&Backup>,
) -> Result<(String, String), String> {
    match (&restore.spec.backup, &restore.spec.repository) {
        (Some(name), _) => {
            let Some(backup) = backup else {
                return Err(format!(
                    "Backup '{name}' does not exist in this namespace: fix the name"
                ));
            };
            let status = backup.status.clone().unwrap_or_default();
            match (status.phase, status.snapshot_id) {
                (Phase::Succeeded, Some(id)) => Ok((backup.spec.repository.clone(), id)),
                (phase, _) => Err(format!(
                    "Backup '{name}' has no snapshot to restore (phase {phase:?}): restore a Backup that succeeded"
                )),
            }
        }
        (None, Some(repository)) => Ok((
            repository.clone(),
            restore.spec.snapshot_id.clone().unwrap_or_default(),
        )),
        (None, None) => Err("name a backup, or a repository and snapshotId".into()),
    }
}

/// The snapshot `snapshot_id` of the repository named `name` (`found`: the
/// BackupRepository, None when it does not exist).
pub fn snapshot_in(
    name: &str,
    snapshot_id: String,
    found: Option<BackupRepository>,
) -> Result<ResolvedSnapshot, String> {
    match found {
        Some(repo) => Ok(ResolvedSnapshot {
            repository: repo.spec,
            snapshot_id,
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
            &found.snapshot_id,
            target,
        )))])
    }

    fn observe(&self, status: &mut RestoreStatus, reports: &[JobReport]) {
        status.progress = Some(overall(reports, None));
        status.snapshot_id = found(self).map(|f| f.snapshot_id.clone());
    }

    fn checkpoint_changed(_before: &RestoreStatus, _after: &RestoreStatus) -> bool {
        false
    }

    fn outcome(&self, _status: &RestoreStatus, reports: &[JobReport]) -> Outcome {
        match first_failure(reports) {
            Some((_, failed)) => {
                let (kind, message) = failure_text(failed);
                let message = format!("restore {kind}: {message}");
                if is_transient(&kind) {
                    Outcome::Retry { message }
                } else {
                    Outcome::Failed {
                        reason: reason::FAILED,
                        message,
                    }
                }
            }
            None => Outcome::Succeeded,
        }
    }

    fn keep_lookups(&self, written: &mut Self) {
        written.spec.resolved = self.spec.resolved.clone();
    }

    fn succeed(&self, _status: &mut RestoreStatus, _reports: &[JobReport]) {}
}
