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
    kept_snapshots, pruned_snapshots, Backup, BackupRepository, BackupRepositorySpec, BackupSpec,
    BackupStatus, Endpoint, MetadataLookup, SecondaryStatus, SecretKeyRef, ValidationError,
};
use crate::mover::backup_request::{
    backup_request, prune_request, secondary_prune_request, sync_request,
};
use crate::mover::{backup_pod, MoverError, MoverPodInput, ResolvedPvc};

use super::context::Context;
use super::error::Error;
use super::kind::{Claim, MoverKind, Outcome};
use super::link::{BackupSummary, JobReport, JobRequest};
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
    if let Some(secondary) = &obj.spec.secondary {
        resolved.spec.resolved_secondary =
            api.get_opt(&secondary.repository).await?.map(|r| r.spec);
    }
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

/// The steps of a Backup, in order, on one mover; the status records each one's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The backup job.
    Backup,
    /// The prune of the source's snapshots by `retain`.
    Prune,
    /// The copy into `secondary`.
    Sync,
    /// The prune of the secondary by its `retain`.
    SecondaryPrune,
    /// Nothing left.
    Done,
}

impl Step {
    /// The step as messages name it.
    fn name(self) -> &'static str {
        match self {
            Self::Backup => "backup",
            Self::Prune => "prune",
            Self::Sync => "sync",
            Self::SecondaryPrune => "secondary prune",
            Self::Done => "done",
        }
    }

    /// What the step does, for the message of the step before it.
    fn doing(self, spec: &BackupSpec) -> String {
        let secondary = spec
            .secondary
            .as_ref()
            .map_or("", |s| s.repository.as_str());
        match self {
            Self::Prune => "pruning the source's older snapshots".into(),
            Self::Sync => {
                format!("copying the snapshots into the secondary repository {secondary}")
            }
            Self::SecondaryPrune => format!("pruning the secondary repository {secondary}"),
            Self::Backup | Self::Done => String::new(),
        }
    }

    /// Whether the step's failure leaves the Backup to go on: the snapshot is written
    /// and restorable by then. A failed copy (or a prune of the secondary) is not retried
    /// on a new mover either: the next backup's copy sends what this one did not.
    fn failure_continues(self, kind: &str) -> bool {
        match self {
            Self::Backup | Self::Done => false,
            Self::Prune => !is_transient(kind),
            Self::Sync | Self::SecondaryPrune => true,
        }
    }
}

/// The step the status says is next.
fn next_step(spec: &BackupSpec, status: &BackupStatus) -> Step {
    if !backed_up(status) {
        return Step::Backup;
    }
    if spec.retain.is_some() && status.pruned.is_none() && status.prune_error.is_none() {
        return Step::Prune;
    }
    let Some(secondary) = &spec.secondary else {
        return Step::Done;
    };
    match &status.secondary {
        None => Step::Sync,
        Some(s)
            if secondary.retain.is_some()
                && s.error.is_none()
                && s.pruned.is_none()
                && s.prune_error.is_none() =>
        {
            Step::SecondaryPrune
        }
        Some(_) => Step::Done,
    }
}

/// What a step that ended without a failure did, for the message of its end.
fn step_done(step: Step, reports: &[JobReport]) -> String {
    let summary = |f: &dyn Fn(&JobReport) -> Option<String>| reports.iter().find_map(f);
    let text = match step {
        Step::Backup => summary(&|r| {
            r.backup.as_ref().map(|b| {
                format!(
                    "snapshot {} written ({} bytes new)",
                    b.snapshot_id, b.bytes_new
                )
            })
        }),
        Step::Prune | Step::SecondaryPrune => summary(&|r| {
            r.prune
                .as_ref()
                .map(|p| format!("{} removed {} snapshots", step.name(), p.removed))
        }),
        Step::Sync => summary(&|r| {
            r.sync.as_ref().map(|y| {
                format!(
                    "sync copied {} snapshots ({} chunks, {} bytes)",
                    y.copied, y.chunks_copied, y.bytes_copied
                )
            })
        }),
        Step::Done => None,
    };
    text.unwrap_or_else(|| format!("{} done", step.name()))
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
        let repositories = [
            &self.spec.resolved_repository,
            &self.spec.resolved_secondary,
        ];
        std::iter::once(self.spec.source_pvc.as_str())
            .chain(
                repositories
                    .into_iter()
                    .filter_map(|r| r.as_ref()?.pvc.as_ref())
                    .map(|pvc| pvc.name.as_str()),
            )
            .map(Claim::Existing)
            .collect()
    }

    fn endpoints(&self) -> Vec<&Endpoint> {
        Vec::new()
    }

    fn secret_keys(&self) -> Vec<&SecretKeyRef> {
        [
            &self.spec.resolved_repository,
            &self.spec.resolved_secondary,
        ]
        .into_iter()
        .flatten()
        .flat_map(BackupRepositorySpec::secret_refs)
        .collect()
    }

    fn mover_pod(&self, input: &MoverPodInput<'_>) -> Result<Pod, MoverError> {
        backup_pod(self, input)
    }

    fn jobs(
        &self,
        status: &BackupStatus,
        pvcs: &[ResolvedPvc],
    ) -> Result<Vec<JobRequest>, MoverError> {
        Ok(match next_step(&self.spec, status) {
            Step::Backup => vec![JobRequest::Backup(Box::new(backup_request(self, pvcs)?))],
            Step::Prune => prune_request(self)?
                .map(|r| JobRequest::Prune(Box::new(r)))
                .into_iter()
                .collect(),
            Step::Sync => sync_request(self)?
                .map(|r| JobRequest::Sync(Box::new(r)))
                .into_iter()
                .collect(),
            Step::SecondaryPrune => secondary_prune_request(self)?
                .map(|r| JobRequest::Prune(Box::new(r)))
                .into_iter()
                .collect(),
            Step::Done => Vec::new(),
        })
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
        let step = next_step(&self.spec, status);
        let mut after = status.clone();
        self.record(&mut after, reports);
        let next = next_step(&self.spec, &after);
        let done = match first_failure(reports) {
            Some((_, failed)) => {
                let (kind, message) = failure_text(failed);
                let message = format!("{} {kind}: {message}", step.name());
                if !step.failure_continues(&kind) {
                    return if is_transient(&kind) {
                        Outcome::Retry { message }
                    } else {
                        Outcome::Failed {
                            reason: reason::FAILED,
                            message,
                        }
                    };
                }
                message
            }
            None if next == step && step != Step::Done => return Outcome::Failed {
                reason: reason::FAILED,
                message: format!(
                    "the mover reported the {} done without its result: check the mover's version",
                    step.name()
                ),
            },
            None => step_done(step, reports),
        };
        match next {
            Step::Done => Outcome::Succeeded,
            next => Outcome::Continue {
                message: format!("{done}; {}", next.doing(&self.spec)),
            },
        }
    }

    fn keep_lookups(&self, written: &mut Self) {
        written.spec.resolved_repository = self.spec.resolved_repository.clone();
        written.spec.resolved_secondary = self.spec.resolved_secondary.clone();
        written.spec.resolved_snapshot_metadata = self.spec.resolved_snapshot_metadata.clone();
    }

    fn succeed(&self, status: &mut BackupStatus, reports: &[JobReport]) {
        self.record(status, reports);
    }
}

impl Backup {
    /// What the step the status says is next produced, into the status: a backup's
    /// snapshot, a prune's lists, a copy's counts, or the step's failure.
    fn record(&self, status: &mut BackupStatus, reports: &[JobReport]) {
        let step = next_step(&self.spec, status);
        let failure = first_failure(reports).map(|(_, failed)| {
            let (kind, message) = failure_text(failed);
            format!("{} {kind}: {message}", step.name())
        });
        let prune = reports.iter().find_map(|r| r.prune.as_ref());
        match step {
            Step::Backup => {
                if let Some(b) = reports.iter().find_map(|r| r.backup.as_ref()) {
                    self.record_backup(status, b);
                }
            }
            Step::Prune => match (prune, failure) {
                (Some(p), _) => {
                    status.pruned = Some(p.removed);
                    status.kept = Some(p.kept);
                    // Bounded and checked here too: the status is what a schedule acts on.
                    status.pruned_snapshots =
                        pruned_snapshots(p.removed_ids.iter().map(String::as_str));
                    status.kept_snapshots = kept_snapshots(p.kept_ids.iter().map(String::as_str));
                }
                (None, failure) => status.prune_error = failure,
            },
            Step::Sync => {
                let sync = reports.iter().find_map(|r| r.sync.as_ref());
                if sync.is_none() && failure.is_none() {
                    return;
                }
                let sync = sync.cloned().unwrap_or_default();
                status.secondary = Some(SecondaryStatus {
                    repository: self
                        .spec
                        .secondary
                        .as_ref()
                        .map(|s| s.repository.clone())
                        .unwrap_or_default(),
                    snapshots_copied: sync.copied,
                    snapshots_present: sync.present,
                    chunks_copied: sync.chunks_copied,
                    bytes_copied: sync.bytes_copied,
                    snapshots_removed: sync.removed,
                    pruned: None,
                    error: failure,
                    prune_error: None,
                });
            }
            Step::SecondaryPrune => {
                if let Some(secondary) = status.secondary.as_mut() {
                    match (prune, failure) {
                        (Some(p), _) => secondary.pruned = Some(p.removed),
                        (None, failure) => secondary.prune_error = failure,
                    }
                }
            }
            Step::Done => {}
        }
    }

    fn record_backup(&self, status: &mut BackupStatus, b: &BackupSummary) {
        status.snapshot_id = Some(b.snapshot_id.clone());
        status.parent_id = (!b.parent_id.is_empty()).then(|| b.parent_id.clone());
        status.bytes_read = Some(b.bytes_read);
        status.bytes_new = Some(b.bytes_new);
        status.bytes_reused = Some(b.bytes_reused);
        status.block_hash = (!b.block_hash.is_empty()).then(|| b.block_hash.clone());
        status.changed_block_tracking =
            (!b.changed_block_tracking.is_empty()).then(|| b.changed_block_tracking.clone());
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
}
