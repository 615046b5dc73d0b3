//! What a schedule creates at a fire, as pure functions of the schedule, the fire time
//! and (for `copyMethod: Snapshot`) the source claim: the `Backup`, the `VolumeSnapshot`
//! and the temporary claim made from it. Names derive from the schedule and the fire
//! time, so a repeated fire finds what the first one created (409) instead of making
//! two.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, TypedLocalObjectReference,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::Resource;
use serde_json::json;

use crate::crd::validate::quantity_bytes;
use crate::crd::{Backup, BackupSchedule, BackupSpec};

/// Label of every Backup (and snapshot, and temporary claim) with its schedule's name.
pub const SCHEDULE_LABEL: &str = "ferry.dev/schedule";
/// Annotation of a Backup made from a VolumeSnapshot: the snapshot's name (the Backup's
/// source claim is the temporary claim made from it).
pub const SNAPSHOT_ANNOTATION: &str = "ferry.dev/volume-snapshot";
/// Annotation of a Backup made from a CSI clone: the cloned claim's name (the Backup's
/// source claim is the clone).
pub const CLONE_ANNOTATION: &str = "ferry.dev/clone-of";

/// The VolumeSnapshot API (snapshot.storage.k8s.io/v1).
pub fn volume_snapshot_api() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshot"),
        "volumesnapshots",
    )
}

/// The VolumeSnapshotContent API (snapshot.storage.k8s.io/v1, cluster-scoped).
pub fn volume_snapshot_content_api() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent"),
        "volumesnapshotcontents",
    )
}

/// The VolumeGroupSnapshot API (groupsnapshot.storage.k8s.io/v1beta1: served from
/// Kubernetes 1.32, and beside v1beta2 from 1.34).
pub fn volume_group_snapshot_api() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "groupsnapshot.storage.k8s.io",
            "v1beta1",
            "VolumeGroupSnapshot",
        ),
        "volumegroupsnapshots",
    )
}

/// The VolumeGroupSnapshotContent API (cluster-scoped).
pub fn volume_group_snapshot_content_api() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "groupsnapshot.storage.k8s.io",
            "v1beta1",
            "VolumeGroupSnapshotContent",
        ),
        "volumegroupsnapshotcontents",
    )
}

/// Label of a group snapshot (and of its member snapshots once handed out) with its
/// group's name.
pub const GROUP_LABEL: &str = "ferry.dev/volume-group";
/// Label of a handed-out member snapshot with its group snapshot's name.
pub const GROUP_SNAPSHOT_LABEL: &str = "ferry.dev/volume-group-snapshot";
/// Annotation of a handed-out member snapshot with the claim it is a snapshot of.
pub const MEMBER_OF_ANNOTATION: &str = "ferry.dev/snapshot-of";

/// Annotation of a group snapshot with the uid of the schedule that made it: only that
/// schedule deletes it when its fire fails.
pub const MADE_BY_ANNOTATION: &str = "ferry.dev/made-by";

/// Whether `name` is a group snapshot name of `group` ([`group_snapshot_name`]).
pub fn is_group_snapshot_name(group: &str, name: &str) -> bool {
    name.strip_prefix(group)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|stamp| stamp.len() == 14 && stamp.bytes().all(|b| b.is_ascii_digit()))
}

/// The group snapshot of the fire at `at`: `<group>-<YYYYMMDDHHMMSS>` (UTC), the same for
/// every schedule of the group.
pub fn group_snapshot_name(group: &str, at: DateTime<Utc>) -> String {
    format!("{group}-{}", at.format("%Y%m%d%H%M%S"))
}

/// The VolumeGroupSnapshot `name` of the schedule's group: over the claims its selector
/// matches, owned by no schedule (the group's schedules share it).
pub fn volume_group_snapshot(schedule: &BackupSchedule, name: &str) -> Option<DynamicObject> {
    let group = schedule.spec.volume_group.as_ref()?;
    let mut spec = json!({"source": {"selector": {"matchLabels": group.selector}}});
    if let Some(class) = &group.volume_group_snapshot_class_name {
        spec["volumeGroupSnapshotClassName"] = json!(class);
    }
    let mut object = DynamicObject::new(name, &volume_group_snapshot_api());
    object.metadata = ObjectMeta {
        name: Some(name.to_string()),
        namespace: schedule.metadata.namespace.clone(),
        labels: Some(BTreeMap::from([
            (GROUP_LABEL.to_string(), group.name.clone()),
            (
                "app.kubernetes.io/managed-by".to_string(),
                "ferry-operator".to_string(),
            ),
        ])),
        annotations: Some(BTreeMap::from([(
            MADE_BY_ANNOTATION.to_string(),
            schedule.metadata.uid.clone().unwrap_or_default(),
        )])),
        ..ObjectMeta::default()
    };
    object.data = json!({ "spec": spec });
    Some(object)
}

/// Longest object name.
const MAX_NAME: usize = 253;

/// The Backup of the fire at `at`: `<schedule>-<YYYYMMDDHHMMSS>` (UTC).
pub fn backup_name(schedule: &str, at: DateTime<Utc>) -> String {
    let stamp = at.format("%Y%m%d%H%M%S").to_string();
    let keep = MAX_NAME - stamp.len() - 1 - "-src".len();
    let prefix = schedule[..keep.min(schedule.len())].trim_end_matches(['-', '.']);
    format!("{prefix}-{stamp}")
}

/// Whether `name` is one [`backup_name`] gives the schedule (its fires' Backups and
/// their own VolumeSnapshots are named so).
pub fn is_fire_name(schedule: &str, name: &str) -> bool {
    let Some((prefix, stamp)) = name.rsplit_once('-') else {
        return false;
    };
    let keep = MAX_NAME - 14 - 1 - "-src".len();
    let expected = schedule[..keep.min(schedule.len())].trim_end_matches(['-', '.']);
    prefix == expected && stamp.len() == 14 && stamp.bytes().all(|b| b.is_ascii_digit())
}

/// The temporary claim made from a fire's VolumeSnapshot.
pub fn temp_claim_name(backup: &str) -> String {
    format!("{backup}-src")
}

fn meta(schedule: &BackupSchedule, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: schedule.metadata.namespace.clone(),
        labels: Some(BTreeMap::from([
            (
                SCHEDULE_LABEL.to_string(),
                schedule.metadata.name.clone().unwrap_or_default(),
            ),
            (
                "app.kubernetes.io/managed-by".to_string(),
                "ferry-operator".to_string(),
            ),
        ])),
        owner_references: schedule.controller_owner_ref(&()).map(|r| vec![r]),
        ..ObjectMeta::default()
    }
}

/// The Backup of a fire; `snapshot` names the VolumeSnapshot whose temporary claim it
/// reads (copyMethod Snapshot), and the source id stays the schedule's claim's, so
/// `parent: auto` and pruning see one source whichever way it was read.
pub fn backup(schedule: &BackupSchedule, name: &str, snapshot: Option<&str>) -> Backup {
    let spec = &schedule.spec;
    let namespace = schedule.metadata.namespace.clone().unwrap_or_default();
    let source_pvc = match snapshot {
        Some(_) => temp_claim_name(name),
        None => spec.source_pvc.clone(),
    };
    let mut b = Backup::new(
        name,
        BackupSpec {
            source_pvc,
            path: spec.path.clone(),
            repository: spec.repository.clone(),
            source_id: Some(spec.source_id_in(&namespace)),
            parent: None,
            tags: spec.tags.clone(),
            retain: spec.retain.clone(),
            mover: spec.mover.clone(),
            volume_snapshot: snapshot.map(str::to_string),
            resolved_repository: None,
            resolved_snapshot_metadata: None,
            secondary: spec.secondary.clone(),
            resolved_secondary: None,
        },
    );
    b.metadata = meta(schedule, name);
    if let Some(snapshot) = snapshot {
        b.metadata.annotations = Some(BTreeMap::from([(
            SNAPSHOT_ANNOTATION.to_string(),
            snapshot.to_string(),
        )]));
    }
    b
}

/// The Backup of a fire of `copyMethod: Clone`: of the clone, under the source's id.
pub fn clone_backup(schedule: &BackupSchedule, name: &str) -> Backup {
    let mut b = backup(schedule, name, None);
    b.spec.source_pvc = temp_claim_name(name);
    b.metadata.annotations = Some(BTreeMap::from([(
        CLONE_ANNOTATION.to_string(),
        schedule.spec.source_pvc.clone(),
    )]));
    b
}

/// The VolumeSnapshot of the schedule's claim for a fire.
pub fn volume_snapshot(schedule: &BackupSchedule, name: &str) -> DynamicObject {
    let mut spec = json!({
        "source": {"persistentVolumeClaimName": schedule.spec.source_pvc},
    });
    if let Some(class) = &schedule.spec.volume_snapshot_class_name {
        spec["volumeSnapshotClassName"] = json!(class);
    }
    let mut object = DynamicObject::new(name, &volume_snapshot_api());
    object.metadata = meta(schedule, name);
    object.data = json!({ "spec": spec });
    object
}

/// How far a VolumeSnapshot is.
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotState {
    /// Ready to restore from, with its `restoreSize` when the driver gives one.
    Ready(Option<Quantity>),
    /// Not ready yet; the snapshot controller's error when it reports one.
    Pending(Option<String>),
}

/// The state of a VolumeSnapshot as the API returned it.
pub fn snapshot_state(snapshot: &DynamicObject) -> SnapshotState {
    let status = &snapshot.data["status"];
    if status["readyToUse"].as_bool() == Some(true) {
        let size = status["restoreSize"]
            .as_str()
            .map(|q| Quantity(q.to_string()));
        return SnapshotState::Ready(size);
    }
    SnapshotState::Pending(status["error"]["message"].as_str().map(str::to_string))
}

/// The temporary claim of the Backup `backup` restored from the fire's VolumeSnapshot
/// `snapshot` (its own, or its member of a group snapshot): the source claim's access
/// and volume modes, in `storageClassName` or the source's class, and the larger of the
/// source's request and the snapshot's `restoreSize` (a volume provisioned larger than
/// its request, or expanded, restores only into a claim as large as the snapshot).
pub fn temp_claim(
    schedule: &BackupSchedule,
    backup: &str,
    snapshot: &str,
    source: &PersistentVolumeClaim,
    restore_size: Option<&Quantity>,
) -> PersistentVolumeClaim {
    let data_source = TypedLocalObjectReference {
        api_group: Some("snapshot.storage.k8s.io".into()),
        kind: "VolumeSnapshot".into(),
        name: snapshot.to_string(),
    };
    made_from(schedule, backup, source, restore_size, data_source)
}

/// The temporary claim of a fire of `copyMethod: Clone` (`name`: the Backup's): a CSI
/// clone of the source claim, as large as the larger of its request and its capacity (a
/// clone is never smaller than its source).
pub fn clone_claim(
    schedule: &BackupSchedule,
    name: &str,
    source: &PersistentVolumeClaim,
) -> PersistentVolumeClaim {
    let capacity = source
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"));
    let data_source = TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".into(),
        name: source.metadata.name.clone().unwrap_or_default(),
    };
    made_from(schedule, name, source, capacity, data_source)
}

/// A temporary claim `<name>-src` from `data_source`, shaped like `source` and at least
/// `at_least` large.
fn made_from(
    schedule: &BackupSchedule,
    name: &str,
    source: &PersistentVolumeClaim,
    at_least: Option<&Quantity>,
    data_source: TypedLocalObjectReference,
) -> PersistentVolumeClaim {
    let from = source.spec.clone().unwrap_or_default();
    let mut resources = from.resources.clone().unwrap_or_default();
    let requested = resources
        .requests
        .as_ref()
        .and_then(|r| r.get("storage"))
        .and_then(quantity_bytes);
    if let Some(size) = at_least {
        if quantity_bytes(size) > requested {
            resources
                .requests
                .get_or_insert_with(BTreeMap::new)
                .insert("storage".to_string(), size.clone());
        }
    }
    PersistentVolumeClaim {
        metadata: meta(schedule, &temp_claim_name(name)),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: from.access_modes.clone(),
            storage_class_name: schedule
                .spec
                .storage_class_name
                .clone()
                .or(from.storage_class_name.clone()),
            volume_mode: from.volume_mode.clone(),
            resources: Some(resources),
            data_source: Some(data_source),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_fire_time_and_stay_short_enough() {
        let at = DateTime::parse_from_rfc3339("2026-12-02T03:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(backup_name("nightly", at), "nightly-20261202030000");
        assert_eq!(
            temp_claim_name("nightly-20261202030000"),
            "nightly-20261202030000-src"
        );
        let long = backup_name(&"a".repeat(260), at);
        assert!(temp_claim_name(&long).len() <= MAX_NAME, "{long}");
        assert!(is_fire_name("nightly", "nightly-20261202030000"));
        assert!(is_fire_name(&"a".repeat(260), &long));
        for other in [
            "snapshot-9f8e7d",
            "nightly-2026120203000",
            "daily-20261202030000",
            "nightly",
        ] {
            assert!(!is_fire_name("nightly", other), "{other}");
        }
        assert_eq!(
            group_snapshot_name("db", at),
            "db-20261202030000",
            "the same for every schedule of the group"
        );
        assert!(is_group_snapshot_name("db", "db-20261202030000"));
        for other in [
            "db-2026120203000x",
            "dbx-20261202030000",
            "db-data-20261202030000",
        ] {
            assert!(!is_group_snapshot_name("db", other), "{other}");
        }
    }

    #[test]
    fn a_snapshot_is_ready_only_when_it_says_so_and_its_size_never_shrinks_the_claim() {
        let snapshot = |status: serde_json::Value| {
            let mut o = DynamicObject::new("s", &volume_snapshot_api());
            o.data = json!({ "status": status });
            o
        };
        assert_eq!(
            snapshot_state(&snapshot(json!({"readyToUse": false,
                "error": {"message": "driver timeout"}}))),
            SnapshotState::Pending(Some("driver timeout".into()))
        );
        assert_eq!(
            snapshot_state(&snapshot(json!({"restoreSize": "1Gi"}))),
            SnapshotState::Pending(None)
        );
        assert_eq!(
            snapshot_state(&snapshot(json!({"readyToUse": true, "restoreSize": "1Gi"}))),
            SnapshotState::Ready(Some(Quantity("1Gi".into())))
        );
        let schedule: BackupSchedule = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "BackupSchedule",
            "metadata": {"name": "nightly", "namespace": "vms", "uid": "u"},
            "spec": {"sourcePVC": "web1", "repository": "repo",
                     "trigger": {"schedule": "0 3 * * *"}},
        }))
        .unwrap();
        let source: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "web1"},
            "spec": {"resources": {"requests": {"storage": "2Gi"}}},
        }))
        .unwrap();
        let size = |restore: Option<&str>| {
            let q = restore.map(|r| Quantity(r.into()));
            let claim = temp_claim(&schedule, "n", "n", &source, q.as_ref());
            claim.spec.unwrap().resources.unwrap().requests.unwrap()["storage"]
                .0
                .clone()
        };
        assert_eq!(size(None), "2Gi");
        assert_eq!(size(Some("1Gi")), "2Gi");
        assert_eq!(size(Some("2148532224")), "2148532224");
    }
}
