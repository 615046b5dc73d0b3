//! The Backup kind as the reconciler sees it: two steps on one mover, the backup job and,
//! when `retain` is set, the prune of the source's snapshots after it. The status says
//! which step is done (a snapshot id once the backup is written), so a replacement mover
//! or a restarted operator goes on with the right one.
//!
//! The named BackupRepository is looked up before each reconcile ([`reconcile_backup`])
//! and carried in the spec's never-stored `resolvedRepository`; a missing or invalid one
//! makes the spec invalid, and the Backup fails with InvalidSpec.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use kube::Api;

use crate::crd::status::condition::reason;
use crate::crd::{
    kept_snapshots, pruned_snapshots, Backup, BackupRepository, BackupStatus, Endpoint,
    MetadataLookup, SecretKeyRef, ValidationError,
};
use crate::mover::backup_request::{backup_request, prune_request};
use crate::mover::{backup_pod, MoverError, MoverPodInput, ResolvedPvc};

use super::context::Context;
use super::error::Error;
use super::kind::{Claim, MoverKind, Outcome};
use super::link::{JobReport, JobRequest, JobState};
use super::progress::{failure_text, first_failure, is_transient, overall};
use super::reconcile::reconcile;
use super::snapshot_metadata;

/// One reconcile of a Backup: its repository looked up, then the shared state machine.
/// A deleted or finished Backup needs no repository.
pub async fn reconcile_backup(obj: Arc<Backup>, ctx: Arc<Context>) -> Result<Action, Error> {
    let finished = obj.status.as_ref().is_some_and(|s| s.phase.is_final());
    if obj.metadata.deletion_timestamp.is_some() || finished {
        return reconcile(obj, ctx).await;
    }
    let namespace = obj.metadata.namespace.clone().unwrap_or_default();
    let api: Api<BackupRepository> = Api::namespaced(ctx.client.clone(), &namespace);
    let repository = api.get_opt(&obj.spec.repository).await?;
    let mut resolved = obj.as_ref().clone();
    resolved.spec.resolved_repository = repository.map(|r| r.spec);
    if mover_may_start(&obj, &ctx) {
        resolved.spec.resolved_snapshot_metadata = snapshot_metadata::lookup(&ctx, &obj).await?;
    }
    reconcile(Arc::new(resolved), ctx).await
}

/// Whether this reconcile may make a mover or send it the backup job, which need the
/// SnapshotMetadata lookup: not while the job is followed, nor once the backup is
/// written (the prune needs none).
fn mover_may_start(obj: &Backup, ctx: &Context) -> bool {
    let status = obj.status.clone().unwrap_or_default();
    let uid = obj.metadata.uid.as_deref().unwrap_or_default();
    obj.spec.volume_snapshot.is_some()
        && !backed_up(&status)
        && !ctx.is_watching(uid, status.attempts)
}

/// Whether the backup step is done (its snapshot recorded).
fn backed_up(status: &BackupStatus) -> bool {
    status.snapshot_id.is_some()
}

/// Whether the prune step is due and not done.
fn prune_due(backup: &Backup, status: &BackupStatus) -> bool {
    backup.spec.retain.is_some() && status.pruned.is_none()
}

impl MoverKind for Backup {
    type Status = BackupStatus;
    const KIND: &'static str = "Backup";
    const SHORT: &'static str = "fbk";

    fn status(&self) -> Option<&BackupStatus> {
        self.status.as_ref()
    }

    fn validate(&self) -> Result<(), ValidationError> {
        self.spec.validate()
    }

    fn claims(&self) -> Vec<Claim<'_>> {
        let mut claims = vec![Claim::Existing(self.spec.source_pvc.as_str())];
        if let Some(pvc) = self
            .spec
            .resolved_repository
            .as_ref()
            .and_then(|r| r.pvc.as_ref())
        {
            claims.push(Claim::Existing(pvc.name.as_str()));
        }
        claims
    }

    fn endpoints(&self) -> Vec<&Endpoint> {
        Vec::new()
    }

    fn secret_keys(&self) -> Vec<&SecretKeyRef> {
        self.spec
            .resolved_repository
            .as_ref()
            .map_or_else(Vec::new, |repo| repo.secret_refs())
    }

    fn mover_pod(&self, input: &MoverPodInput<'_>) -> Result<Pod, MoverError> {
        backup_pod(self, input)
    }

    fn jobs(
        &self,
        status: &BackupStatus,
        pvcs: &[ResolvedPvc],
    ) -> Result<Vec<JobRequest>, MoverError> {
        if !backed_up(status) {
            return Ok(vec![JobRequest::Backup(Box::new(backup_request(
                self, pvcs,
            )?))]);
        }
        if prune_due(self, status) {
            if let Some(prune) = prune_request(self)? {
                return Ok(vec![JobRequest::Prune(Box::new(prune))]);
            }
        }
        Ok(Vec::new())
    }

    fn observe(&self, status: &mut BackupStatus, reports: &[JobReport]) {
        // The prune's progress is not the backup's: keep the backup's once it is done.
        if !backed_up(status) {
            status.progress = Some(overall(reports, None));
        }
    }

    fn checkpoint_changed(_before: &BackupStatus, _after: &BackupStatus) -> bool {
        false
    }

    fn outcome(&self, status: &BackupStatus, reports: &[JobReport]) -> Outcome {
        if let Some((_, failed)) = first_failure(reports) {
            let (kind, message) = failure_text(failed);
            if backed_up(status) && failed.state == JobState::Failed && !is_transient(&kind) {
                // The snapshot is written and restorable: a prune that fails does not undo
                // the backup (as a backup job of the service ends): `succeed` records why.
                return Outcome::Succeeded;
            }
            let step = if backed_up(status) { "prune" } else { "backup" };
            let message = format!("{step} {kind}: {message}");
            return if is_transient(&kind) {
                Outcome::Retry { message }
            } else {
                Outcome::Failed {
                    reason: reason::FAILED,
                    message,
                }
            };
        }
        let snapshot = reports.iter().find_map(|r| r.backup.as_ref());
        match snapshot {
            Some(b) if self.spec.retain.is_some() && status.pruned.is_none() => {
                Outcome::Continue {
                    message: format!(
                        "snapshot {} written ({} bytes new); pruning the source's older snapshots",
                        b.snapshot_id, b.bytes_new
                    ),
                }
            }
            None if !backed_up(status) && !reports.is_empty() => Outcome::Failed {
                reason: reason::FAILED,
                message: "the mover reported the backup done without a snapshot id: check the mover's version".into(),
            },
            _ => Outcome::Succeeded,
        }
    }

    fn keep_lookups(&self, written: &mut Self) {
        written.spec.resolved_repository = self.spec.resolved_repository.clone();
        written.spec.resolved_snapshot_metadata = self.spec.resolved_snapshot_metadata.clone();
    }

    fn succeed(&self, status: &mut BackupStatus, reports: &[JobReport]) {
        for r in reports {
            if let Some(b) = &r.backup {
                status.snapshot_id = Some(b.snapshot_id.clone());
                status.parent_id = (!b.parent_id.is_empty()).then(|| b.parent_id.clone());
                status.bytes_read = Some(b.bytes_read);
                status.bytes_new = Some(b.bytes_new);
                status.bytes_reused = Some(b.bytes_reused);
                status.block_hash = (!b.block_hash.is_empty()).then(|| b.block_hash.clone());
                status.changed_block_tracking = (!b.changed_block_tracking.is_empty())
                    .then(|| b.changed_block_tracking.clone());
                let not_asked = match &self.spec.resolved_snapshot_metadata {
                    Some(MetadataLookup::Unavailable(why)) => Some(why.clone()),
                    _ => None,
                };
                let full_reason = (!b.full_reason.is_empty()).then(|| b.full_reason.clone());
                status.full_reason = match (not_asked, full_reason) {
                    (Some(a), Some(b)) => Some(format!("{a}; {b}")),
                    (a, b) => a.or(b),
                };
                status.snapshot_handle = match &self.spec.resolved_snapshot_metadata {
                    Some(MetadataLookup::Service(service)) => Some(service.snapshot_handle.clone()),
                    _ => None,
                };
            }
            if let Some(p) = &r.prune {
                status.pruned = Some(p.removed);
                status.kept = Some(p.kept);
                // Bounded and checked here too: the status is what a schedule acts on.
                status.pruned_snapshots =
                    pruned_snapshots(p.removed_ids.iter().map(String::as_str));
                status.kept_snapshots = kept_snapshots(p.kept_ids.iter().map(String::as_str));
            }
        }
        if let Some((_, failed)) = first_failure(reports) {
            let (kind, message) = failure_text(failed);
            status.prune_error = Some(format!("prune {kind}: {message}"));
        }
    }
}
