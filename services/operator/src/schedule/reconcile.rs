//! The state machine of one BackupSchedule, re-entered from the top on every reconcile
//! (the status and the schedule's Backups are the whole state, so a restarted operator
//! goes on where the last one stopped):
//! 1. an invalid spec (cron, time zone, retention) or a missing repository ->
//!    Synchronizing False, InvalidSpec, with what to fix;
//! 2. the latest finished Backup not recorded yet -> lastSyncTime, lastSyncDuration,
//!    lastSnapshot; its VolumeSnapshot and temporary claim deleted; then the Backups the
//!    schedule no longer keeps deleted (a pruned snapshot's, failed ones past the
//!    history limit: [`super::history`]); a delete refused is a Warning event, never an
//!    end of the reconcile (cleaning up records must not stop backups);
//! 3. a Backup still running -> Synchronizing True; nothing fires (never two at once);
//! 4. paused -> Synchronizing False, Paused, no nextSyncTime;
//! 5. no nextSyncTime (or the spec changed) -> the next fire after now;
//! 6. nextSyncTime passed -> fire once (missed fires while the operator was away or a
//!    backup ran collapse into one): the Backup (after its VolumeSnapshot and temporary
//!    claim for copyMethod Snapshot), then the next fire after now.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::controller::Action;
use kube::Api;

use crate::controller::error::api_text;
use crate::controller::life::Life;
use crate::controller::Error;
use crate::crd::status::condition::reason;
use crate::crd::{
    Backup, BackupRepository, BackupSchedule, BackupScheduleStatus, BackupStatus, CopyMethod,
};

use super::build::{self, CLONE_ANNOTATION, SCHEDULE_LABEL, SNAPSHOT_ANNOTATION};
use super::consistent;
use super::group;
use super::history::{self, Why};
use super::{Context, SYNCHRONIZING};

/// How long a schedule waits before looking again at what no watch reports (a missing
/// repository or source claim).
pub const RECHECK: Duration = Duration::from_secs(60);
/// Longest wait between looks, whatever the next fire time.
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// Condition reasons of Synchronizing.
pub mod reasons {
    /// A Backup of the schedule runs.
    pub const BACKUP_RUNNING: &str = "BackupRunning";
    /// Waiting for the next fire time.
    pub const WAITING: &str = "WaitingForSchedule";
    /// `paused: true`.
    pub const PAUSED: &str = "Paused";
    /// The source claim of a snapshot does not exist.
    pub const SOURCE_MISSING: &str = "SourceMissing";
    /// The fire's VolumeSnapshot is not ready to restore from yet.
    pub const SNAPSHOT_PENDING: &str = "SnapshotPending";
    /// A hook or the freeze failed with policy Fail: the fire's backup was skipped.
    pub const CONSISTENCY_FAILED: &str = "ConsistencyFailed";
}

/// How often a schedule looks at a VolumeSnapshot that is not ready yet (no watch of
/// VolumeSnapshots: the operator does not need to list them).
pub const SNAPSHOT_RECHECK: Duration = Duration::from_secs(5);

pub(crate) fn to_time(t: DateTime<Utc>) -> Time {
    Time(Timestamp::from_millisecond(t.timestamp_millis()).unwrap_or(Timestamp::UNIX_EPOCH))
}

pub(crate) fn from_time(t: &Time) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.0.as_millisecond()).unwrap_or_default()
}

/// `1h2m3s`, as Kubernetes prints durations.
pub fn duration_text(d: chrono::TimeDelta) -> String {
    let s = d.num_seconds().max(0);
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

/// Sets the Synchronizing condition (its transition time changes only with its status).
pub(crate) fn synchronizing(status: &mut BackupScheduleStatus, on: bool, why: &str, message: &str) {
    let mut life = Life {
        conditions: std::mem::take(&mut status.conditions),
        observed_generation: status.observed_generation,
        ..Life::default()
    };
    life.set_condition(SYNCHRONIZING, on, why, message);
    status.conditions = life.conditions;
}

/// Writes the status when it changed.
async fn write(
    ctx: &Context,
    obj: &BackupSchedule,
    before: &BackupScheduleStatus,
    next: &BackupScheduleStatus,
) -> Result<bool, Error> {
    if crate::controller::life::same_status(before, next) {
        return Ok(false);
    }
    let namespace = obj.metadata.namespace.as_deref().unwrap_or_default();
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    let api: Api<BackupSchedule> = Api::namespaced(ctx.client.clone(), namespace);
    let body = serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "BackupSchedule",
        "status": next,
    });
    api.patch_status(
        name,
        &PatchParams::apply(crate::events::REPORTER).force(),
        &Patch::Apply(body),
    )
    .await?;
    Ok(true)
}

/// How long until `t` (at least a second, at most [`MAX_WAIT`]).
fn until(now: DateTime<Utc>, t: DateTime<Utc>) -> Duration {
    let ms = (t - now).num_milliseconds().max(1000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(1000)).min(MAX_WAIT)
}

pub(crate) fn is_final(b: &Backup) -> bool {
    b.status.as_ref().is_some_and(|s| s.phase.is_final())
}

/// One reconcile of a schedule (see the module docs).
pub async fn reconcile(obj: Arc<BackupSchedule>, ctx: Arc<Context>) -> Result<Action, Error> {
    let (Some(namespace), Some(name)) = (&obj.metadata.namespace, &obj.metadata.name) else {
        return Err(Error::NotStored("BackupSchedule"));
    };
    if obj.metadata.deletion_timestamp.is_some() {
        // Its Backups, snapshots and temporary claims are owned by it: the garbage
        // collector removes them (a Backup's finalizer cancels a running mover).
        return Ok(Action::await_change());
    }
    let now = ctx.clock.now();
    let before = obj.status.clone().unwrap_or_default();
    let mut next = before.clone();
    let spec_changed = next.observed_generation != obj.metadata.generation;
    next.observed_generation = obj.metadata.generation;
    next.message = None;
    let cron = match obj.spec.validate() {
        Ok(cron) => cron,
        Err(e) => {
            let message = format!("{e}: fix the spec");
            return invalid(&ctx, &obj, &before, next, &message, Action::await_change()).await;
        }
    };
    if let Some(message) = missing_repository(&ctx, &obj, namespace).await? {
        return invalid(
            &ctx,
            &obj,
            &before,
            next,
            &message,
            Action::requeue(RECHECK),
        )
        .await;
    }
    let mine = schedule_backups(&ctx, namespace, name).await?;
    if let Some(done) = mine.iter().rev().find(|b| is_final(b)) {
        record(&ctx, &obj, &mut next, done).await?;
    }
    // Never fatal: a Backup that cannot be deleted must not stop the next ones.
    expire(&ctx, &obj, &mine).await;
    if let Some(running) = mine.iter().find(|b| !is_final(b)) {
        running_status(&mut next, running);
        write(&ctx, &obj, &before, &next).await?;
        // Its status changes wake the schedule (the controller watches its Backups).
        return Ok(Action::requeue(MAX_WAIT));
    }
    if obj.spec.paused == Some(true) {
        paused_status(&mut next);
        write(&ctx, &obj, &before, &next).await?;
        return Ok(Action::await_change());
    }
    let Some(due) = due(&mut next, spec_changed, &cron, now) else {
        let message = "the schedule never fires again: fix spec.trigger.schedule";
        return invalid(&ctx, &obj, &before, next, message, Action::await_change()).await;
    };
    if now < due {
        waiting_status(&mut next, due);
        write(&ctx, &obj, &before, &next).await?;
        return Ok(Action::requeue(until(now, due)));
    }
    fire(&ctx, &obj, &before, next, due, now, &cron).await
}

/// Synchronizing True: the Backup `running` runs.
pub(crate) fn running_status(next: &mut BackupScheduleStatus, running: &Backup) {
    let running = running.metadata.name.clone().unwrap_or_default();
    let message = format!("Backup {running} runs; the next fire waits for it");
    synchronizing(next, true, reasons::BACKUP_RUNNING, &message);
}

/// Synchronizing True: the Backup `name` just started; the next fire at `following`.
/// Returns the message (of the BackupCreated event too).
pub(crate) fn fired_status(
    next: &mut BackupScheduleStatus,
    name: &str,
    following: Option<DateTime<Utc>>,
) -> String {
    next.last_backup = Some(name.to_string());
    next.last_result = None;
    next.next_sync_time = following.map(to_time);
    let message = format!("Backup {name} started");
    synchronizing(next, true, reasons::BACKUP_RUNNING, &message);
    message
}

/// Synchronizing False: paused, no next fire.
pub(crate) fn paused_status(next: &mut BackupScheduleStatus) {
    next.next_sync_time = None;
    synchronizing(next, false, reasons::PAUSED, "paused: no backup fires");
}

/// Synchronizing False: waiting for `due`.
pub(crate) fn waiting_status(next: &mut BackupScheduleStatus, due: DateTime<Utc>) {
    let message = format!("the next backup starts at {}", due.to_rfc3339());
    synchronizing(next, false, reasons::WAITING, &message);
}

/// What to fix when the schedule's BackupRepository does not exist; `None` when it does.
async fn missing_repository(
    ctx: &Context,
    obj: &BackupSchedule,
    namespace: &str,
) -> Result<Option<String>, Error> {
    let repositories: Api<BackupRepository> = Api::namespaced(ctx.client.clone(), namespace);
    if repositories.get_opt(&obj.spec.repository).await?.is_some() {
        return Ok(None);
    }
    Ok(Some(missing_repository_text(obj, namespace)))
}

/// What to fix when the schedule's BackupRepository does not exist.
pub(crate) fn missing_repository_text(obj: &BackupSchedule, namespace: &str) -> String {
    format!(
        "spec.repository: BackupRepository '{}' does not exist in namespace {namespace}: create it, or fix the name",
        obj.spec.repository
    )
}

/// The Backups of the schedule `name`, sorted by name (so by fire time).
async fn schedule_backups(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Vec<Backup>, Error> {
    let backups: Api<Backup> = Api::namespaced(ctx.client.clone(), namespace);
    let mut mine = backups
        .list(&ListParams::default().labels(&format!("{SCHEDULE_LABEL}={name}")))
        .await?
        .items;
    mine.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(mine)
}

/// The fire time to wait for: the recorded one, or (none recorded, or the spec changed)
/// the next after `now`, which is recorded. `None`: the schedule never fires again.
pub(crate) fn due(
    next: &mut BackupScheduleStatus,
    spec_changed: bool,
    cron: &ferry_cron::CronSpec,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    match (&next.next_sync_time, spec_changed) {
        (Some(t), false) => Some(from_time(t)),
        _ => {
            let first = cron.next_after(now)?;
            next.next_sync_time = Some(to_time(first));
            Some(first)
        }
    }
}

/// Synchronizing False (InvalidSpec) with `message`, and no next fire.
pub(crate) fn invalid_status(next: &mut BackupScheduleStatus, message: &str) {
    next.message = Some(message.to_string());
    next.next_sync_time = None;
    synchronizing(next, false, reason::INVALID_SPEC, message);
}

/// Synchronizing False (InvalidSpec) with the message; looked at again as `action` says.
async fn invalid(
    ctx: &Context,
    obj: &BackupSchedule,
    before: &BackupScheduleStatus,
    mut next: BackupScheduleStatus,
    message: &str,
    action: Action,
) -> Result<Action, Error> {
    invalid_status(&mut next, message);
    if write(ctx, obj, before, &next).await? {
        ctx.event(obj, true, reason::INVALID_SPEC, message).await;
    }
    Ok(action)
}

/// Records the latest finished Backup once, and removes its snapshot and temporary claim.
async fn record(
    ctx: &Context,
    obj: &BackupSchedule,
    next: &mut BackupScheduleStatus,
    done: &Backup,
) -> Result<(), Error> {
    let name = done.metadata.name.clone().unwrap_or_default();
    if is_recorded(next, &name) {
        return Ok(());
    }
    let status = done.status.clone().unwrap_or_default();
    note_result(next, &name, done, &status);
    // Only a Backup this schedule made (its controller) had a snapshot and a temporary
    // claim made for it, named after it: never delete what a Backup's spec names, which
    // anyone who may create Backups could point at any claim.
    let made_here = history::controls(obj, done);
    let annotated = |key: &str| {
        done.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(key))
    };
    let with_snapshot = annotated(SNAPSHOT_ANNOTATION);
    // Its own snapshot is named after it; a member of a group snapshot is not.
    let snapshot_name = done
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SNAPSHOT_ANNOTATION))
        .cloned()
        .unwrap_or_else(|| name.clone());
    if made_here && annotated(CLONE_ANNOTATION) {
        let namespace = obj.metadata.namespace.as_deref().unwrap_or_default();
        delete_temp_claim(ctx, namespace, &name).await?;
    }
    let namespace = obj.metadata.namespace.as_deref().unwrap_or_default();
    if made_here && with_snapshot {
        delete_temp_claim(ctx, namespace, &name).await?;
        for snapshot in snapshots_done(next, &snapshot_name, &status) {
            delete_done_snapshot(ctx, obj, namespace, &snapshot).await?;
        }
    } else if status.phase == crate::crd::Phase::Succeeded {
        // Made some other way (copyMethod changed): the kept base is no one's parent now.
        if let Some(base) = next.base_snapshot.take() {
            delete_done_snapshot(ctx, obj, namespace, &base).await?;
        }
    }
    let (warning, why, note) = result_event(&name, &status);
    ctx.event(obj, warning, why, &note).await;
    if let Some(failure) = status.secondary.as_ref().and_then(|s| s.failure()) {
        let note = format!("Backup {name}'s copy into the secondary repository: {failure}");
        ctx.event(obj, true, "SecondaryCopyFailed", &note).await;
    }
    if made_here {
        warn_unlisted_snapshots(ctx, obj, &name, &status).await;
    }
    Ok(())
}

/// Whether the Backup `name` (or a later one) is recorded already.
fn is_recorded(next: &BackupScheduleStatus, name: &str) -> bool {
    match next.last_backup.as_deref() {
        Some(last) => last > name || (last == name && next.last_result.is_some()),
        None => false,
    }
}

/// Sets lastBackup, its result, lastSyncTime, lastSyncDuration and (when it succeeded)
/// lastSnapshot and the secondary's lastSecondarySnapshot and secondaryError from the
/// finished Backup `name`.
fn note_result(next: &mut BackupScheduleStatus, name: &str, done: &Backup, status: &BackupStatus) {
    let ended = status.completion_time.as_ref().map(from_time);
    let started = status
        .start_time
        .as_ref()
        .or(done.metadata.creation_timestamp.as_ref())
        .map(from_time);
    next.last_backup = Some(name.to_string());
    next.last_result = Some(format!("{:?}", status.phase));
    next.last_sync_time = ended.map(to_time);
    next.last_sync_duration = match (started, ended) {
        (Some(s), Some(e)) => Some(duration_text(e - s)),
        _ => None,
    };
    if status.phase == crate::crd::Phase::Succeeded {
        next.last_snapshot = status.snapshot_id.clone();
        match &status.secondary {
            Some(secondary) => {
                next.secondary_error = secondary.failure().map(str::to_string);
                if secondary.error.is_none() {
                    next.last_secondary_snapshot = status.snapshot_id.clone();
                }
            }
            // No secondary (any more): no error of one to show.
            None => next.secondary_error = None,
        }
    }
}

/// The VolumeSnapshots the schedule no longer needs once its Backup `name` (made from
/// the snapshot of that name) ended with `status`, and `status.baseSnapshot` updated: a
/// successful backup that recorded its snapshot's CSI handle keeps its snapshot as the
/// base of the next delta (the driver diffs against it) and frees the previous base; one
/// that recorded none frees both; a failed one frees its own and keeps the base.
pub(crate) fn snapshots_done(
    next: &mut BackupScheduleStatus,
    name: &str,
    status: &BackupStatus,
) -> Vec<String> {
    let succeeded = status.phase == crate::crd::Phase::Succeeded;
    let mut done = Vec::new();
    if succeeded && status.snapshot_handle.is_some() {
        done.extend(next.base_snapshot.take().filter(|base| base != name));
        next.base_snapshot = Some(name.to_string());
        return done;
    }
    if next.base_snapshot.as_deref() != Some(name) {
        done.push(name.to_string());
    }
    if succeeded {
        done.extend(next.base_snapshot.take());
    }
    done
}

/// Deletes the temporary claim made for the Backup `name`.
async fn delete_temp_claim(ctx: &Context, namespace: &str, name: &str) -> Result<(), Error> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    gone(
        claims
            .delete(&build::temp_claim_name(name), &DeleteParams::default())
            .await,
    )
}

/// Deletes a VolumeSnapshot the schedule made.
/// Deletes a VolumeSnapshot the schedule is done with: one it made (named like its
/// Backups) at once; any other (a member of a group snapshot) only when it is the
/// schedule's (an owner reference to it): a Backup's annotation, which whoever may edit
/// Backups can change, never decides alone what the operator deletes.
async fn delete_done_snapshot(
    ctx: &Context,
    obj: &BackupSchedule,
    namespace: &str,
    name: &str,
) -> Result<(), Error> {
    let schedule = obj.metadata.name.as_deref().unwrap_or_default();
    if !build::is_fire_name(schedule, name) {
        let snapshots: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), namespace, &build::volume_snapshot_api());
        let Some(member) = snapshots.get_opt(name).await? else {
            return Ok(());
        };
        let uid = obj.metadata.uid.as_deref().unwrap_or_default();
        let ours = member
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == uid);
        if !ours {
            return Ok(());
        }
    }
    delete_volume_snapshot(ctx, namespace, name).await
}

async fn delete_volume_snapshot(ctx: &Context, namespace: &str, name: &str) -> Result<(), Error> {
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), namespace, &build::volume_snapshot_api());
    gone(snapshots.delete(name, &DeleteParams::default()).await)
}

/// The event of a finished Backup: whether it is a warning, its reason and its note.
fn result_event(name: &str, status: &BackupStatus) -> (bool, &'static str, String) {
    match status.phase {
        crate::crd::Phase::Succeeded => (
            false,
            "BackupSucceeded",
            format!(
                "Backup {name} succeeded: snapshot {}",
                status.snapshot_id.as_deref().unwrap_or("(none)")
            ),
        ),
        phase => (
            true,
            "BackupFailed",
            format!(
                "Backup {name} ended {phase:?}: {}",
                status.message.as_deref().unwrap_or("see its status")
            ),
        ),
    }
}

/// Warns when the prune of the schedule's Backup `name` listed fewer snapshots than it
/// removed or kept: the schedule cannot delete the Backups of the ones left out.
async fn warn_unlisted_snapshots(
    ctx: &Context,
    obj: &BackupSchedule,
    name: &str,
    status: &BackupStatus,
) {
    // A complete kept list finds the Backups of every snapshot removed, listed or not.
    let all_kept_listed = status.lists_every_kept_snapshot();
    let listed = status.pruned_snapshots.len() as u64;
    if status.pruned.is_some_and(|n| n > listed) && !all_kept_listed {
        let note = format!(
            "Backup {name}'s prune removed {} snapshots but lists only the first {listed}: the Backups of the others stay; delete them with kubectl delete backup",
            status.pruned.unwrap_or_default()
        );
        ctx.event(obj, true, "PrunedSnapshotsUnlisted", &note).await;
    }
    if !status.kept_snapshots.is_empty() && !all_kept_listed {
        let note = format!(
            "Backup {name}'s prune kept {} snapshots but lists only {}: the schedule does not delete Backups by their snapshots' absence from it, so the Backups of snapshots removed by a prune that was killed or failed stay; delete them with kubectl delete backup",
            status.kept.unwrap_or_default(),
            status.kept_snapshots.len()
        );
        ctx.event(obj, true, "KeptSnapshotsUnlisted", &note).await;
    }
}

/// Deletes the Backups the schedule no longer keeps ([`history::expired`]), each only
/// as the object it saw (its uid a precondition), and says so in one event. A delete
/// refused (RBAC without `delete backups`, a webhook, an unavailable API server) is a
/// Warning event and a log line, never an error: the schedule goes on firing, and the
/// next reconcile tries again.
async fn expire(ctx: &Context, obj: &BackupSchedule, mine: &[Backup]) {
    let expired = history::expired(obj, mine);
    if expired.is_empty() {
        return;
    }
    let namespace = obj.metadata.namespace.as_deref().unwrap_or_default();
    let schedule = obj.metadata.name.as_deref().unwrap_or_default();
    let backups: Api<Backup> = Api::namespaced(ctx.client.clone(), namespace);
    let limit = obj.spec.failed_history_limit();
    let mut done = Vec::new();
    let mut refused = Vec::new();
    for e in &expired {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(e.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match backups.delete(&e.name, &params).await {
            Ok(_) => {}
            // Gone already, or another object of that name now (409: the uid differs):
            // nothing of the schedule's left to delete.
            Err(kube::Error::Api(err)) if err.code == 404 || err.code == 409 => continue,
            Err(error) => {
                tracing::warn!(%namespace, %schedule, backup = %e.name, %error,
                    "cannot delete a Backup the schedule no longer keeps");
                let why = api_text(&error);
                refused.push(format!("{} ({why})", e.name));
                continue;
            }
        }
        done.push(match &e.why {
            Why::SnapshotPruned => format!("{} (its snapshot was pruned)", e.name),
            Why::SnapshotNotKept(by) => format!(
                "{} (its snapshot was pruned: Backup {by}'s prune did not keep it)",
                e.name
            ),
            Why::FailedHistory => {
                format!("{} (failed; failedBackupsHistoryLimit is {limit})", e.name)
            }
        });
    }
    if !done.is_empty() {
        let note = format!("deleted Backup {}", done.join(", "));
        ctx.event(obj, false, "BackupsDeleted", &note).await;
    }
    if !refused.is_empty() {
        // What to do first: the note is cut to fit.
        let note = format!(
            "cannot delete {} Backup(s) the schedule no longer keeps; backups go on firing and the schedule tries again on its next reconcile (a 403: the operator's RBAC lacks delete on ferrybackups.ferry.dev; re-apply it from this release): {}",
            refused.len(),
            refused.join(", ")
        );
        ctx.event(obj, true, "BackupsNotDeleted", &note).await;
    }
}

/// A delete that found nothing is done too.
fn gone<T>(result: Result<T, kube::Error>) -> Result<(), Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The fire's VolumeSnapshot cut between the schedule's hooks and freeze
/// ([`consistent::take`]), with one Warning event for what failed but did not stop it;
/// Err: why it was not cut.
async fn consistent_cut(
    ctx: &Context,
    obj: &BackupSchedule,
    name: &str,
) -> Result<Result<DynamicObject, String>, Error> {
    let outcome = consistent::take(
        ctx,
        obj,
        &build::volume_snapshot_api(),
        &build::volume_snapshot(obj, name),
    )
    .await?;
    if !outcome.warnings.is_empty() {
        let note = outcome.warnings.join("; ");
        ctx.event(obj, true, "ConsistencyWarning", &note).await;
    }
    Ok(match (outcome.snapshot, outcome.failed) {
        (Some(snapshot), None) => Ok(snapshot),
        (_, Some(why)) => Err(why),
        (None, None) => Err(format!("VolumeSnapshot {name} was not created")),
    })
}

/// A create that found the object already made (by an earlier try of this fire) is done.
fn made<T>(result: Result<T, kube::Error>) -> Result<(), Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Skips the fire at hand (`why`: its hooks or its group snapshot failed): Synchronizing
/// False (ConsistencyFailed), a BackupSkipped event, the next fire waited for.
#[allow(clippy::too_many_arguments)]
async fn skip_fire(
    ctx: &Context,
    obj: &BackupSchedule,
    before: &BackupScheduleStatus,
    mut next: BackupScheduleStatus,
    now: DateTime<Utc>,
    cron: &ferry_cron::CronSpec,
    why: &str,
) -> Result<Action, Error> {
    let message = format!("this fire's backup is skipped: {why}");
    next.message = Some(message.clone());
    let following = cron.next_after(now);
    next.next_sync_time = following.map(to_time);
    synchronizing(&mut next, false, reasons::CONSISTENCY_FAILED, &message);
    write(ctx, obj, before, &next).await?;
    ctx.event(obj, true, "BackupSkipped", &message).await;
    Ok(match following {
        Some(t) => Action::requeue(until(now, t)),
        None => Action::await_change(),
    })
}

/// Starts the Backup of the fire at `due`, then waits for the next fire time.
async fn fire(
    ctx: &Context,
    obj: &BackupSchedule,
    before: &BackupScheduleStatus,
    mut next: BackupScheduleStatus,
    due: DateTime<Utc>,
    now: DateTime<Utc>,
    cron: &ferry_cron::CronSpec,
) -> Result<Action, Error> {
    let namespace = obj.metadata.namespace.as_deref().unwrap_or_default();
    let schedule = obj.metadata.name.as_deref().unwrap_or_default();
    let name = build::backup_name(schedule, due);
    let method = obj.spec.copy_method.unwrap_or_default();
    let snapshot = method == CopyMethod::Snapshot;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let source = match method {
        CopyMethod::Direct => None,
        CopyMethod::Snapshot | CopyMethod::Clone => {
            match claims.get_opt(&obj.spec.source_pvc).await? {
                Some(source) => Some(source),
                None => {
                    let message = format!(
                        "pvc/{} does not exist in namespace {namespace}: the backup starts once it does",
                        obj.spec.source_pvc
                    );
                    next.message = Some(message.clone());
                    synchronizing(&mut next, false, reasons::SOURCE_MISSING, &message);
                    write(ctx, obj, before, &next).await?;
                    return Ok(Action::requeue(RECHECK));
                }
            }
        }
    };
    if let (CopyMethod::Clone, Some(source)) = (method, &source) {
        made(
            claims
                .create(
                    &PostParams::default(),
                    &build::clone_claim(obj, &name, source),
                )
                .await,
        )?;
    }
    let mut snapshot_name = name.clone();
    if let (true, Some(source)) = (snapshot, source) {
        let snapshots: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), namespace, &build::volume_snapshot_api());
        let mut member = None;
        let mut own = None;
        if let Some(group) = &obj.spec.volume_group {
            // A fallback of an earlier pass of this fire made the claim's own snapshot.
            own = snapshots.get_opt(&name).await?;
            if own.is_none() {
                let group_snapshot = build::group_snapshot_name(&group.name, due);
                match group::member(ctx, obj, &group_snapshot).await? {
                    group::Member::Ready(m) => member = Some(*m),
                    group::Member::Pending(message) => {
                        next.message = Some(message.clone());
                        synchronizing(&mut next, true, reasons::SNAPSHOT_PENDING, &message);
                        write(ctx, obj, before, &next).await?;
                        return Ok(Action::requeue(SNAPSHOT_RECHECK));
                    }
                    group::Member::Refused(why) => {
                        return skip_fire(ctx, obj, before, next, now, cron, &why).await;
                    }
                    group::Member::Unsupported(why) => {
                        let note = format!(
                            "no group snapshot for pvc/{}: {why}; it gets a snapshot of its own, not of its group's instant",
                            obj.spec.source_pvc
                        );
                        ctx.event(obj, true, "GroupSnapshotUnavailable", &note)
                            .await;
                    }
                }
            }
        }
        let current = match (member, own) {
            (Some(member), _) => member,
            (None, Some(own)) => own,
            (None, None) if consistent::wanted(obj) => match snapshots.get_opt(&name).await? {
                // Cut by an earlier pass of this fire, its hooks run then.
                Some(existing) => existing,
                None => match consistent_cut(ctx, obj, &name).await? {
                    Ok(cut) => cut,
                    Err(why) => {
                        // Made before what failed after it: nothing will back it up.
                        gone(snapshots.delete(&name, &DeleteParams::default()).await)?;
                        return skip_fire(ctx, obj, before, next, now, cron, &why).await;
                    }
                },
            },
            (None, None) => match snapshots
                .create(&PostParams::default(), &build::volume_snapshot(obj, &name))
                .await
            {
                Ok(created) => created,
                Err(kube::Error::Api(e)) if e.code == 409 => snapshots.get(&name).await?,
                Err(e) => return Err(e.into()),
            },
        };
        snapshot_name = current.metadata.name.clone().unwrap_or_default();
        let restore_size = match build::snapshot_state(&current) {
            build::SnapshotState::Ready(size) => size,
            build::SnapshotState::Pending(error) => {
                let mut message = format!(
                    "VolumeSnapshot {snapshot_name} of pvc/{} is not ready yet: the backup starts once it is",
                    obj.spec.source_pvc
                );
                if let Some(error) = error {
                    message.push_str(&format!(" (the snapshot controller says: {error})"));
                }
                next.message = Some(message.clone());
                synchronizing(&mut next, true, reasons::SNAPSHOT_PENDING, &message);
                write(ctx, obj, before, &next).await?;
                return Ok(Action::requeue(SNAPSHOT_RECHECK));
            }
        };
        let claim = build::temp_claim(obj, &name, &snapshot_name, &source, restore_size.as_ref());
        made(claims.create(&PostParams::default(), &claim).await)?;
        next.message = None;
    }
    let backups: Api<Backup> = Api::namespaced(ctx.client.clone(), namespace);
    let backup = match method {
        CopyMethod::Clone => build::clone_backup(obj, &name),
        _ => build::backup(obj, &name, snapshot.then_some(snapshot_name.as_str())),
    };
    made(backups.create(&PostParams::default(), &backup).await)?;
    let following = cron.next_after(now);
    let message = fired_status(&mut next, &name, following);
    write(ctx, obj, before, &next).await?;
    ctx.event(obj, false, "BackupCreated", &message).await;
    Ok(match following {
        Some(t) => Action::requeue(until(now, t)),
        None => Action::await_change(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Phase;

    fn ended(phase: Phase, handle: Option<&str>) -> BackupStatus {
        BackupStatus {
            phase,
            snapshot_handle: handle.map(str::to_string),
            ..BackupStatus::default()
        }
    }

    #[test]
    fn the_latest_tracked_snapshot_is_kept_as_the_base_and_frees_the_one_before() {
        let mut next = BackupScheduleStatus::default();
        let tracked = ended(Phase::Succeeded, Some("h"));
        assert!(snapshots_done(&mut next, "s1", &tracked).is_empty());
        assert_eq!(next.base_snapshot.as_deref(), Some("s1"));
        assert_eq!(
            snapshots_done(&mut next, "s1", &tracked),
            Vec::<String>::new(),
            "again: nothing"
        );
        assert_eq!(snapshots_done(&mut next, "s2", &tracked), ["s1"]);
        assert_eq!(next.base_snapshot.as_deref(), Some("s2"));
        let failed = ended(Phase::Failed, None);
        assert_eq!(snapshots_done(&mut next, "s3", &failed), ["s3"]);
        assert_eq!(
            next.base_snapshot.as_deref(),
            Some("s2"),
            "a failure keeps the base"
        );
        let untracked = ended(Phase::Succeeded, None);
        assert_eq!(snapshots_done(&mut next, "s4", &untracked), ["s4", "s2"]);
        assert_eq!(
            next.base_snapshot, None,
            "its parent records no handle: no base needed"
        );
        assert_eq!(snapshots_done(&mut next, "s5", &untracked), ["s5"]);
    }
}
