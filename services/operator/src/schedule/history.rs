//! Which of a schedule's Backups the schedule deletes, as a pure function of the schedule
//! and its Backups, so that an hourly schedule does not leave thousands of Backup objects
//! behind:
//! - a Backup whose snapshot a prune removed (the ids a Backup of the schedule lists in
//!   `status.prunedSnapshots`, in the same repository): it points at nothing any more;
//! - a Backup whose snapshot the newest prune that listed what it kept
//!   (`status.keptSnapshots`, complete) did not keep, of the same repository and source,
//!   and that ended before that prune's Backup started: its snapshot was removed by this
//!   prune or an earlier one, also by an attempt that was killed before it could report
//!   (a snapshot written after the prune read the repository is never judged by it);
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// A prune removed its snapshot (listed it in `prunedSnapshots`).
    SnapshotPruned,
    /// The newest prune that listed every snapshot it kept, the one of this Backup (its
    /// name), did not keep its snapshot.
    SnapshotNotKept(String),
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

/// The repository and source id a Backup's snapshot is stored under.
fn stored_under(backup: &Backup) -> (&str, String) {
    let namespace = backup.metadata.namespace.as_deref().unwrap_or_default();
    (
        backup.spec.repository.as_str(),
        backup.spec.source_id_in(namespace),
    )
}

/// The newest of `controlled` (sorted by name, that is by fire time) whose prune reported
/// what it kept; `None` when there is none, or when that list is incomplete (over the
/// bound): then no snapshot's absence from it means anything.
fn newest_kept_list<'a>(controlled: &[&'a Backup]) -> Option<&'a Backup> {
    let newest = controlled.iter().rev().find(|b| {
        b.status
            .as_ref()
            .is_some_and(|s| s.pruned.is_some() && !s.kept_snapshots.is_empty())
    })?;
    newest
        .status
        .as_ref()
        .is_some_and(|s| s.lists_every_kept_snapshot())
        .then_some(*newest)
}

/// Whether `prune`'s kept list judges `backup`: the same repository and source, an
/// earlier fire, and ended before the prune's Backup started (so its snapshot, if it
/// still existed, was in the repository when the prune read it). Without those times,
/// never.
fn judged_by(prune: &Backup, backup: &Backup) -> bool {
    let ended = backup
        .status
        .as_ref()
        .and_then(|s| s.completion_time.as_ref());
    let started = prune.status.as_ref().and_then(|s| s.start_time.as_ref());
    let (Some(ended), Some(started)) = (ended, started) else {
        return false;
    };
    stored_under(backup) == stored_under(prune)
        && backup.metadata.name < prune.metadata.name
        && ended.0 <= started.0
}

/// The Backups of `backups` (the schedule's, by label) that the schedule deletes, oldest
/// first within each reason. Backups already being deleted are left out.
pub fn expired(schedule: &BackupSchedule, backups: &[Backup]) -> Vec<Expired> {
    let mut controlled: Vec<&Backup> = backups.iter().filter(|b| controls(schedule, b)).collect();
    // Names sort by fire time.
    controlled.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
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
    let kept_list = newest_kept_list(&controlled);
    let kept: BTreeSet<&str> = kept_list
        .iter()
        .flat_map(|b| b.status.iter().flat_map(|s| s.kept_snapshots.iter()))
        .map(String::as_str)
        .collect();
    let mine: Vec<&Backup> = controlled
        .into_iter()
        .filter(|b| b.metadata.deletion_timestamp.is_none() && phase(b).is_final())
        .filter(|b| b.metadata.name.is_some() && b.metadata.uid.is_some())
        .collect();
    let snapshot = |b: &Backup| b.status.as_ref().and_then(|s| s.snapshot_id.clone());
    let mut out: Vec<Expired> = Vec::new();
    let entry = |b: &Backup, why| Expired {
        name: b.metadata.name.clone().unwrap_or_default(),
        uid: b.metadata.uid.clone().unwrap_or_default(),
        why,
    };
    for b in &mine {
        let Some(id) = snapshot(b) else {
            continue;
        };
        if pruned.contains(&(b.spec.repository.as_str(), id.as_str())) {
            out.push(entry(b, Why::SnapshotPruned));
        } else if let Some(prune) = kept_list {
            if judged_by(prune, b) && !kept.contains(id.as_str()) {
                let by = prune.metadata.name.clone().unwrap_or_default();
                out.push(entry(b, Why::SnapshotNotKept(by)));
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

    /// A prune killed after it removed s1, whose second attempt removed s2 and kept s3
    /// and its own s4: b1 (s1, by absence) and b2 (s2, listed) go; b3, the pruning b4 and
    /// b5, made after the prune, stay.
    #[test]
    fn backups_of_snapshots_the_newest_prune_did_not_keep_go() {
        let done = |id: &str, ended: &str| json!({"phase": "Succeeded", "snapshotId": id, "completionTime": ended});
        let mut prune = done("s4", "2026-12-04T03:10:00Z");
        prune["startTime"] = json!("2026-12-04T03:00:01Z");
        prune["pruned"] = json!(1);
        prune["kept"] = json!(2);
        prune["prunedSnapshots"] = json!(["s2"]);
        prune["keptSnapshots"] = json!(["s3", "s4"]);
        let backups = vec![
            backup("b1", "uid-s", done("s1", "2026-12-01T03:10:00Z")),
            backup("b2", "uid-s", done("s2", "2026-12-02T03:10:00Z")),
            backup("b3", "uid-s", done("s3", "2026-12-03T03:10:00Z")),
            backup("b4", "uid-s", prune.clone()),
            backup("b5", "uid-s", done("s5", "2026-12-05T03:10:00Z")),
            // Not the schedule's: never deleted.
            backup("a0", "uid-other", done("s0", "2026-11-30T03:10:00Z")),
        ];
        let e = expired(&schedule(None), &backups);
        assert_eq!(
            e.iter()
                .map(|x| (x.name.as_str(), &x.why))
                .collect::<Vec<_>>(),
            [
                ("b1", &Why::SnapshotNotKept("b4".into())),
                ("b2", &Why::SnapshotPruned)
            ]
        );

        // Another source or repository, or no end time: not judged by this prune.
        for change in 0..3 {
            let mut other = backups.clone();
            let b1 = &mut other[0];
            match change {
                0 => b1.spec.source_id = Some("vms/web2".into()),
                1 => b1.spec.repository = "site-b".into(),
                _ => b1.status.as_mut().unwrap().completion_time = None,
            }
            let e = expired(&schedule(None), &other);
            assert_eq!(names(&e, Why::SnapshotPruned), ["b2"], "{change}");
            assert!(!e.iter().any(|x| x.name == "b1"), "{change}: {e:?}");
        }

        // Ended after the prune's Backup started (not there when the prune looked): stays.
        let mut late = backups.clone();
        late[0].status.as_mut().unwrap().completion_time =
            backups[4].status.as_ref().unwrap().completion_time.clone();
        assert!(!expired(&schedule(None), &late)
            .iter()
            .any(|x| x.name == "b1"));

        // A kept list over the bound (kept counts more than it lists): nothing by absence.
        let mut truncated = backups.clone();
        truncated[3].status.as_mut().unwrap().kept = Some(1500);
        let e = expired(&schedule(None), &truncated);
        assert_eq!(
            e.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(),
            ["b2"]
        );

        // Only the newest kept list counts: b5's prune kept s1..s5 but is truncated, so b4's
        // older, complete list is not used either.
        let mut newer = backups.clone();
        let status = newer[4].status.as_mut().unwrap();
        status.pruned = Some(0);
        status.kept = Some(5000);
        status.kept_snapshots = vec!["s5".into()];
        assert_eq!(
            expired(&schedule(None), &newer)
                .iter()
                .map(|x| x.name.as_str())
                .collect::<Vec<_>>(),
            ["b2"]
        );

        // A prune without a kept list (an older operator's): nothing by absence.
        let mut unlisted = backups;
        unlisted[3].status.as_mut().unwrap().kept_snapshots.clear();
        assert_eq!(
            names(&expired(&schedule(None), &unlisted), Why::SnapshotPruned),
            ["b2"]
        );
        assert_eq!(expired(&schedule(None), &unlisted).len(), 1);
    }
}
