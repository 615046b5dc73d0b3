//! Render's look at BackupRepositories (their Ready condition, [`repository::status`]) and
//! BackupSchedules: the schedule reconciler's steps through its own status functions: an
//! invalid spec or a missing repository, a Backup of the schedule still running, paused,
//! the next fire time; a fire that is due creates its objects (the VolumeSnapshot, taken
//! as ready, and the temporary claim for `copyMethod: Snapshot`; the Backup, which render
//! then plans like any resource). Finished Backups are not recorded nor expired here.

use chrono::Utc;
use serde_json::Value;

use crate::controller::repository::{self, Ready};
use crate::crd::{Backup, BackupSchedule, CopyMethod};
use crate::schedule::build;
use crate::schedule::reconcile::{
    due, fired_status, invalid_status, is_final, missing_repository_text, paused_status, reasons,
    running_status, synchronizing, waiting_status,
};

use super::input::{namespace_of, Cluster};
use super::{made_up_uid, Options, Resource, World};

/// Every BackupRepository with the status the operator writes, and its summary line.
pub(crate) fn repositories(cluster: &Cluster) -> Vec<(Value, String)> {
    let mut out = Vec::new();
    for ((namespace, name), repo) in &cluster.repositories {
        let mut repo = repo.clone();
        repo.metadata.namespace = Some(namespace.clone());
        let (status, ready) = repository::status(&repo, &cluster.secrets_in(namespace));
        let condition = status.conditions.first();
        let why = condition.map(|c| c.reason.clone()).unwrap_or_default();
        let message = condition.map(|c| c.message.clone()).unwrap_or_default();
        let state = if ready == Ready::Yes {
            "Ready"
        } else {
            "not Ready"
        };
        repo.status = Some(status);
        let note = format!("BackupRepository {namespace}/{name}: {state} ({why}): {message}");
        out.push((serde_json::to_value(&repo).unwrap_or(Value::Null), note));
    }
    out
}

/// Every BackupSchedule with the status the operator writes now, and its summary line; a
/// due fire's objects recorded in `world`, its Backup spawned.
pub(crate) fn schedules(world: &mut World<'_>, _options: &Options) -> Vec<(Value, String)> {
    let cluster = world.cluster;
    let now = Utc::now();
    let mut out = Vec::new();
    for (i, schedule) in cluster.schedules.iter().enumerate() {
        let mut obj = schedule.clone();
        let namespace = namespace_of(&obj.metadata);
        obj.metadata.namespace = Some(namespace.clone());
        obj.metadata.uid.get_or_insert_with(|| made_up_uid(4, i));
        let name = obj.metadata.name.clone().unwrap_or_default();
        let title = format!("BackupSchedule {namespace}/{name}:");
        if obj.metadata.deletion_timestamp.is_some() {
            let note = format!("{title} being deleted: nothing to plan");
            out.push((serde_json::to_value(&obj).unwrap_or(Value::Null), note));
            continue;
        }
        let mut next = obj.status.clone().unwrap_or_default();
        let spec_changed = next.observed_generation != obj.metadata.generation;
        next.observed_generation = obj.metadata.generation;
        next.message = None;
        let note = match obj.spec.validate() {
            Err(e) => {
                let message = format!("{e}: fix the spec");
                invalid_status(&mut next, &message);
                format!("{title} InvalidSpec: {message}")
            }
            Ok(_)
                if !cluster
                    .repositories
                    .contains_key(&(namespace.clone(), obj.spec.repository.clone())) =>
            {
                let message = missing_repository_text(&obj, &namespace);
                invalid_status(&mut next, &message);
                format!("{title} InvalidSpec: {message}")
            }
            Ok(cron) => {
                let mine = schedule_backups(cluster, &obj);
                if let Some(running) = mine.iter().find(|b| !is_final(b)) {
                    running_status(&mut next, running);
                    format!(
                        "{title} BackupRunning: Backup {} runs",
                        running.metadata.name.as_deref().unwrap_or_default()
                    )
                } else if obj.spec.paused == Some(true) {
                    paused_status(&mut next);
                    format!("{title} Paused: no backup fires")
                } else {
                    match due(&mut next, spec_changed, &cron, now) {
                        None => {
                            let message =
                                "the schedule never fires again: fix spec.trigger.schedule";
                            invalid_status(&mut next, message);
                            format!("{title} InvalidSpec: {message}")
                        }
                        Some(at) if now < at => {
                            waiting_status(&mut next, at);
                            format!(
                                "{title} WaitingForSchedule: the next backup starts at {}",
                                at.to_rfc3339()
                            )
                        }
                        Some(at) => {
                            let backup = build::backup_name(&name, at);
                            match fire(world, &obj, &backup) {
                                Ok(()) => {
                                    let message =
                                        fired_status(&mut next, &backup, cron.next_after(now));
                                    format!("{title} BackupRunning: {message}")
                                }
                                Err(message) => {
                                    next.message = Some(message.clone());
                                    synchronizing(
                                        &mut next,
                                        false,
                                        reasons::SOURCE_MISSING,
                                        &message,
                                    );
                                    format!("{title} SourceMissing: {message}")
                                }
                            }
                        }
                    }
                }
            }
        };
        obj.status = Some(next);
        out.push((serde_json::to_value(&obj).unwrap_or(Value::Null), note));
    }
    out
}

/// The Backups of `schedule` in the file, by name (so by fire time).
fn schedule_backups(cluster: &Cluster, schedule: &BackupSchedule) -> Vec<Backup> {
    let mut mine: Vec<Backup> = cluster
        .backups
        .values()
        .filter(|b| crate::schedule::history::controls(schedule, b))
        .cloned()
        .collect();
    mine.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    mine
}

/// A due fire's objects: for `copyMethod: Snapshot` the VolumeSnapshot (taken as ready,
/// with no restore size) and the temporary claim, for `Clone` the clone, then the Backup. Err: the source claim
/// does not exist (the fire waits for it).
fn fire(world: &mut World<'_>, schedule: &BackupSchedule, name: &str) -> Result<(), String> {
    let namespace = schedule.metadata.namespace.clone().unwrap_or_default();
    let method = schedule.spec.copy_method.unwrap_or_default();
    if method != CopyMethod::Direct {
        let claims = world.claims_in(&namespace);
        let Some(source) = claims.get(&schedule.spec.source_pvc) else {
            return Err(format!(
                "pvc/{} does not exist in namespace {namespace}: the backup starts once it does",
                schedule.spec.source_pvc
            ));
        };
        let claim = match method {
            CopyMethod::Clone => build::clone_claim(schedule, name, source),
            _ => match &schedule.spec.volume_group {
                // The member's name shows only once the group snapshot is ready: the plan
                // names the group snapshot, made once for the group's schedules.
                Some(group) => {
                    let at = name.rsplit('-').next().unwrap_or_default();
                    let group_snapshot = format!("{}-{at}", group.name);
                    if let Some(object) = build::volume_group_snapshot(schedule, &group_snapshot) {
                        world.create_once(&object);
                    }
                    build::temp_claim(schedule, name, &group_snapshot, source, None)
                }
                None => {
                    world.create(&build::volume_snapshot(schedule, name));
                    build::temp_claim(schedule, name, name, source, None)
                }
            },
        };
        world.create_claim(&claim);
    }
    let mut backup = match method {
        CopyMethod::Clone => build::clone_backup(schedule, name),
        _ => build::backup(
            schedule,
            name,
            (method == CopyMethod::Snapshot).then_some(name),
        ),
    };
    backup.metadata.uid = Some(made_up_uid(5, world.spawned.len()));
    world.spawned.push(Resource::Backup(Box::new(backup)));
    Ok(())
}
