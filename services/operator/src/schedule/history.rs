//! Which of a schedule's Backups the schedule deletes, as a pure function of the schedule
//! and its Backups, so that an hourly schedule does not leave thousands of Backup objects
//! behind:
//! - a Backup whose snapshot a prune removed (the ids a Backup of the schedule lists in
//!   `status.prunedSnapshots`, in the same repository): it points at nothing any more;
//! - failed (or cancelled) Backups beyond `failedBackupsHistoryLimit`, oldest first, as
//!   CronJob's `failedJobsHistoryLimit` does; one whose snapshot was written stays until a
//!   prune removes that snapshot.
//!
//! Only Backups the schedule controls (an owner reference with `controller: true` and the
//! schedule's uid) are candidates, and only their prune lists are believed: a Backup
//! anyone made with the schedule's label is never deleted. Successful Backups of a
//! schedule without `retain` are never deleted (their snapshots are never pruned).

use std::collections::BTreeSet;

use crate::crd::{Backup, BackupSchedule, Phase};

/// Why a Backup is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A prune removed its snapshot.
    SnapshotPruned,
    /// It failed, and newer failed ones fill the history.
    FailedHistory,
}

/// A Backup to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// Its name.
    pub name: String,
    /// Its uid (the delete's precondition: never a newer object of the same name).
    pub uid: String,
    /// Why.
    pub why: Why,
}

/// Whether `schedule` made `backup` (is its controller).
pub fn controls(schedule: &BackupSchedule, backup: &Backup) -> bool {
    let Some(uid) = schedule.metadata.uid.as_ref() else {
        return false;
    };
    backup
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && &r.uid == uid)
}

fn phase(backup: &Backup) -> Phase {
    backup.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// The Backups of `backups` (the schedule's, by label) that the schedule deletes, oldest
/// first within each reason. Backups already being deleted are left out.
pub fn expired(schedule: &BackupSchedule, backups: &[Backup]) -> Vec<Expired> {
    let controlled: Vec<&Backup> = backups.iter().filter(|b| controls(schedule, b)).collect();
    // (repository, snapshot id) of every snapshot a prune of the schedule's removed (a
    // Backup being deleted still says what its prune did).
    let pruned: BTreeSet<(&str, &str)> = controlled
        .iter()
        .flat_map(|b| {
            let repository = b.spec.repository.as_str();
            b.status
                .iter()
                .flat_map(|s| s.pruned_snapshots.iter())
                .map(move |id| (repository, id.as_str()))
        })
        .collect();
    let mut mine: Vec<&Backup> = controlled
        .into_iter()
        .filter(|b| b.metadata.deletion_timestamp.is_none() && phase(b).is_final())
        .filter(|b| b.metadata.name.is_some() && b.metadata.uid.is_some())
        .collect();
    // Names sort by fire time.
    mine.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let snapshot = |b: &Backup| b.status.as_ref().and_then(|s| s.snapshot_id.clone());
    let mut out: Vec<Expired> = Vec::new();
    let entry = |b: &Backup, why| Expired {
        name: b.metadata.name.clone().unwrap_or_default(),
        uid: b.metadata.uid.clone().unwrap_or_default(),
        why,
    };
    for b in &mine {
        if let Some(id) = snapshot(b) {
            if pruned.contains(&(b.spec.repository.as_str(), id.as_str())) {
                out.push(entry(b, Why::SnapshotPruned));
            }
        }
    }
    // Failed ones without a snapshot, newest first: those past the limit go.
    let failed: Vec<&&Backup> = mine
        .iter()
        .rev()
        .filter(|b| matches!(phase(b), Phase::Failed | Phase::Cancelled))
        .filter(|b| snapshot(b).is_none())
        .collect();
    let limit = schedule.spec.failed_history_limit();
    for b in failed.iter().skip(limit).rev() {
        out.push(entry(b, Why::FailedHistory));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schedule(limit: Option<u32>) -> BackupSchedule {
        let mut s: BackupSchedule = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "BackupSchedule",
            "metadata": {"name": "hourly", "namespace": "vms", "uid": "uid-s"},
            "spec": {"sourcePVC": "web1", "repository": "site-a",
                     "trigger": {"schedule": "@hourly"}, "retain": {"last": 2}},
        }))
        .unwrap();
        s.spec.failed_backups_history_limit = limit;
        s
    }

    fn backup(name: &str, owner: &str, status: serde_json::Value) -> Backup {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Backup",
            "metadata": {"name": name, "namespace": "vms", "uid": format!("uid-{name}"),
                         "labels": {"ferry.dev/schedule": "hourly"},
                         "ownerReferences": [{"apiVersion": "ferry.dev/v1alpha1",
                             "kind": "BackupSchedule", "name": "hourly", "uid": owner,
                             "controller": true}]},
            "spec": {"sourcePVC": "web1", "repository": "site-a"},
            "status": status,
        }))
        .unwrap()
    }

    fn names(e: &[Expired], why: Why) -> Vec<&str> {
        e.iter()
            .filter(|x| x.why == why)
            .map(|x| x.name.as_str())
            .collect()
    }

    #[test]
    fn backups_of_pruned_snapshots_go_others_stay() {
        let backups = vec![
            backup(
                "b1",
                "uid-s",
                json!({"phase": "Succeeded", "snapshotId": "s1"}),
            ),
            backup(
                "b2",
                "uid-s",
                json!({"phase": "Succeeded", "snapshotId": "s2"}),
            ),
            // Someone else's Backup of a pruned snapshot, and its prune list: ignored.
            backup(
                "x1",
                "uid-other",
                json!({"phase": "Succeeded", "snapshotId": "s0", "prunedSnapshots": ["s2"]}),
            ),
            backup(
                "b3",
                "uid-s",
                json!({"phase": "Succeeded", "snapshotId": "s3", "prunedSnapshots": ["s0", "s1"]}),
            ),
        ];
        let e = expired(&schedule(None), &backups);
        assert_eq!(names(&e, Why::SnapshotPruned), ["b1"]);
        assert_eq!(e[0].uid, "uid-b1");
        assert!(names(&e, Why::FailedHistory).is_empty());

        // Another repository's snapshot of the same id is not the pruned one.
        let mut other = backups.clone();
        other[0].spec.repository = "site-b".into();
        assert!(expired(&schedule(None), &other).is_empty());

        // Being deleted already: not again; what its own prune removed still counts.
        let deleted = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let mut deleting = backups.clone();
        deleting[0].metadata.deletion_timestamp = deleted.clone();
        assert!(expired(&schedule(None), &deleting).is_empty());
        let mut deleting = backups;
        deleting[3].metadata.deletion_timestamp = deleted;
        assert_eq!(
            names(&expired(&schedule(None), &deleting), Why::SnapshotPruned),
            ["b1"]
        );
    }

    #[test]
    fn failed_backups_past_the_limit_go_oldest_first() {
        let failed = json!({"phase": "Failed", "message": "no_space"});
        let backups = vec![
            backup("b5", "uid-s", failed.clone()),
            backup("b1", "uid-s", failed.clone()),
            backup("b2", "uid-s", json!({"phase": "Cancelled"})),
            // Failed after its snapshot was written (a prune that kept failing): stays.
            backup(
                "b3",
                "uid-s",
                json!({"phase": "Failed", "snapshotId": "s3"}),
            ),
            backup("b4", "uid-s", failed.clone()),
            backup("b6", "uid-s", json!({"phase": "Running"})),
            backup("b7", "uid-other", failed.clone()),
            backup("b0", "uid-other", failed),
        ];
        let limit = |n| {
            names(&expired(&schedule(n), &backups), Why::FailedHistory)
                .into_iter()
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(limit(Some(2)), ["b1", "b2"]);
        assert_eq!(limit(None), ["b1"], "3 by default");
        assert_eq!(limit(Some(0)), ["b1", "b2", "b4", "b5"]);
        assert!(limit(Some(100)).is_empty());
    }
}
