//! The `BackupSchedule` kind, in the shape of VolSync's ReplicationSource: back a claim up
//! on a cron schedule into a `BackupRepository`, keep what `retain` says, optionally from
//! a VolumeSnapshot (`copyMethod: Snapshot`) so the backup sees one instant of the volume.
//! Each fire creates a `Backup` owned by the schedule; a fire never overlaps the previous
//! backup.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::backup::{Retention, MAX_TAGS};
use super::secondary::Secondary;
use super::settings::MoverSettings;
use super::validate::{check_pvc_name, invalid, ValidationError};

/// Failed Backups a schedule keeps unless `failedBackupsHistoryLimit` says otherwise.
pub const DEFAULT_FAILED_HISTORY: u32 = 3;
/// Most failed Backups a schedule may keep.
pub const MAX_FAILED_HISTORY: u32 = 100;

/// Back up a claim on a schedule.
// kube's printcolumn(...) entries repeat their keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "BackupSchedule",
    namespaced,
    status = "BackupScheduleStatus",
    shortname = "fbs",
    category = "ferry",
    doc = "Backs up a PVC into a BackupRepository on a cron schedule, pruning by retain",
    printcolumn(name = "PVC", type_ = "string", json_path = ".spec.sourcePVC"),
    printcolumn(
        name = "Schedule",
        type_ = "string",
        json_path = ".spec.trigger.schedule"
    ),
    printcolumn(name = "Last sync", type_ = "date", json_path = ".status.lastSyncTime"),
    printcolumn(name = "Next sync", type_ = "date", json_path = ".status.nextSyncTime"),
    printcolumn(
        name = "Last snapshot",
        type_ = "string",
        json_path = ".status.lastSnapshot"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BackupScheduleSpec {
    /// The claim to back up (in this namespace).
    #[serde(rename = "sourcePVC")]
    #[schemars(length(min = 1, max = 253))]
    pub source_pvc: String,
    /// The image file inside a Filesystem volume (default `disk.img`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub path: Option<String>,
    /// The name of a BackupRepository in this namespace.
    #[schemars(length(min = 1, max = 253))]
    pub repository: String,
    /// When to back up.
    pub trigger: Trigger,
    /// Which snapshots of the claim to keep: a prune runs after each successful backup,
    /// and the schedule then deletes its Backups whose snapshots the prune removed.
    /// Left out: every snapshot is kept, and so is every successful Backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain: Option<Retention>,
    /// How many of the schedule's failed (or cancelled) Backups to keep, newest first
    /// (default 3, at most 100; 0 keeps none): older ones are deleted. A failed Backup
    /// whose snapshot was written is kept until a prune removes that snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub failed_backups_history_limit: Option<u32>,
    /// Stop firing (a running backup finishes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Direct: back up the claim as it is (default). Clone: back up a CSI clone of it,
    /// deleted when the backup ends. Snapshot: back up a VolumeSnapshot of
    /// it, through a temporary claim; both are deleted when the backup ends, but for the
    /// latest successful backup's snapshot when the CSI driver offers a SnapshotMetadata
    /// service: kept as the base the next backup's changed blocks are asked since
    /// (`status.baseSnapshot`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_method: Option<CopyMethod>,
    /// The VolumeSnapshotClass of `copyMethod: Snapshot` (default: the cluster's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub volume_snapshot_class_name: Option<String>,
    /// The storage class of the temporary claim of `copyMethod: Snapshot` or `Clone`
    /// (default: the source claim's; a clone's driver must clone into it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,
    /// Tags recorded in every snapshot (at most 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, String>>,
    /// How the mover pods run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover: Option<MoverSettings>,
    /// copyMethod Snapshot: what makes the snapshot consistent for a running app: commands
    /// run in its pods before and after the snapshot is cut, and a KubeVirt VM's guest
    /// filesystems frozen while it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<Consistency>,
    /// After each backup (and its prune), copy the claim's snapshots into a second
    /// BackupRepository (another site), and prune there by its own rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary: Option<Secondary>,
    /// copyMethod Snapshot: take the claim's snapshot in one VolumeGroupSnapshot with the
    /// other claims of its app (one instant for all of them), shared by the schedules of
    /// those claims that name the same group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group: Option<VolumeGroup>,
}

/// A VolumeGroupSnapshot (groupsnapshot.storage.k8s.io) shared by the schedules of an
/// app's claims: the first schedule to fire at a fire time creates it over every claim
/// the selector matches, and each schedule backs its own claim up from its member
/// snapshot. The schedules of one group share one trigger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroup {
    /// The group's name: its group snapshots are `<name>-<YYYYMMDDHHMMSS>` (the fire time,
    /// UTC).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// The labels of the group's claims (all of them: matchLabels); the schedule's own
    /// claim must carry them.
    #[schemars(length(min = 1, max = 16))]
    pub selector: BTreeMap<String, String>,
    /// The VolumeGroupSnapshotClass (default: the cluster's default for the driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub volume_group_snapshot_class_name: Option<String>,
}

/// Commands and a freeze around a schedule's snapshot. Order: the pre hooks, the freeze,
/// the snapshot cut, the unfreeze, the post hooks. Once a pre hook ran, the unfreeze and
/// the post hooks always run, whatever failed after it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Consistency {
    /// Run before the snapshot, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub pre: Vec<Hook>,
    /// Run after the snapshot was cut (or failed to be), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub post: Vec<Hook>,
    /// Also run the hooks Velero's annotations declare on the running pods that use the
    /// claim (`pre.hook.backup.velero.io/command`, `/container`, `/on-error`, `/timeout`
    /// and the same with `post.`), after the ones above (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub velero_annotations: Option<bool>,
    /// A KubeVirt VirtualMachineInstance of this namespace whose guest filesystems are
    /// frozen through its guest agent while the snapshot is cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze: Option<Freeze>,
}

/// A command run in a container of a pod, through the API (as `kubectl exec`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// The pod (in this namespace).
    #[schemars(length(min = 1, max = 253))]
    pub pod: String,
    /// Its container (default: the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub container: Option<String>,
    /// The command and its arguments (no shell unless you run one).
    #[schemars(length(min = 1, max = 64))]
    pub command: Vec<String>,
    /// How long it may run (default 30, at most 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: Option<u32>,
    /// Fail (the default): a failure or a timeout skips this fire's backup. Continue: it
    /// is a warning event and the backup goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_error: Option<OnError>,
}

/// What a failed hook or freeze does to the fire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OnError {
    /// Skip this fire's backup (after the unfreeze and the post hooks).
    #[default]
    Fail,
    /// Warn and go on.
    Continue,
}

/// A KubeVirt guest freeze.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Freeze {
    /// The VirtualMachineInstance.
    #[schemars(length(min = 1, max = 253))]
    pub virtual_machine_instance: String,
    /// KubeVirt unfreezes by itself after this long, should the operator not (default
    /// 300, at least 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 3600))]
    pub unfreeze_timeout_seconds: Option<u32>,
    /// Fail (the default): a guest that cannot be frozen skips this fire's backup.
    /// Continue: the snapshot is cut unfrozen, with a warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_error: Option<OnError>,
}

impl VolumeGroup {
    fn validate(&self) -> Result<(), ValidationError> {
        let label_value = |v: &str| {
            v.len() <= 63
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                && v.starts_with(|c: char| c.is_ascii_alphanumeric())
                && v.ends_with(|c: char| c.is_ascii_alphanumeric())
        };
        let dns_label = !self.name.is_empty()
            && self.name.len() <= 48
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !self.name.starts_with('-')
            && !self.name.ends_with('-');
        if !dns_label {
            return Err(invalid(
                "spec.volumeGroup.name",
                "a group name is 1 to 48 lowercase letters, digits and '-' (its snapshots add the fire time)",
            ));
        }
        if self.selector.is_empty() || self.selector.len() > 16 {
            return Err(invalid(
                "spec.volumeGroup.selector",
                "give 1 to 16 labels that the group's claims carry",
            ));
        }
        for (k, v) in &self.selector {
            let (prefix, key) = k.rsplit_once('/').unwrap_or(("", k));
            if key.is_empty() || !label_value(key) || prefix.len() > 253 || !label_value(v) {
                return Err(invalid(
                    &format!("spec.volumeGroup.selector.{k}"),
                    "not a label: a key of letters, digits, '-', '_', '.' (an optional prefix/) and a value of at most 63 of them",
                ));
            }
        }
        if let Some(class) = &self.volume_group_snapshot_class_name {
            check_pvc_name("spec.volumeGroup.volumeGroupSnapshotClassName", class)?;
        }
        Ok(())
    }

    /// The selector as a label selector query (`k=v,k2=v2`).
    pub fn selector_query(&self) -> String {
        self.selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Trigger {
    /// Five cron fields (minute hour day-of-month month day-of-week) or @hourly, @daily,
    /// @weekly, @monthly, @yearly.
    #[schemars(length(min = 1, max = 256))]
    pub schedule: String,
    /// The IANA time zone of the schedule (default UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: Option<String>,
}

/// How a schedule reads the claim.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CopyMethod {
    /// The claim itself, while it may be in use.
    #[default]
    Direct,
    /// A VolumeSnapshot of the claim, through a temporary claim made from it.
    Snapshot,
    /// A CSI clone of the claim (a temporary claim whose dataSource is the claim: the
    /// driver copies it, often at once), backed up and then deleted, as VolSync's
    /// `copyMethod: Clone`. The driver must clone, within one storage class.
    Clone,
}

impl BackupScheduleSpec {
    /// The source id its Backups are stored under: `<namespace>/<sourcePVC>`, whichever
    /// way the claim is read.
    pub fn source_id_in(&self, namespace: &str) -> String {
        format!("{namespace}/{}", self.source_pvc)
    }
}

impl BackupScheduleSpec {
    /// Checks what the schema cannot: names, the cron expression and time zone, the
    /// retention rules, tags.
    pub fn validate(&self) -> Result<ferry_cron::CronSpec, ValidationError> {
        check_pvc_name("spec.sourcePVC", &self.source_pvc)?;
        if let Some(path) = &self.path {
            super::validate::check_relative_path("spec.path", path)?;
        }
        check_pvc_name("spec.repository", &self.repository)?;
        let zone = self.trigger.time_zone.as_deref().unwrap_or("");
        let cron = ferry_cron::CronSpec::parse(&self.trigger.schedule, zone, false)
            .map_err(|e| invalid("spec.trigger", e.message()))?;
        if self.consistency.is_some() && self.copy_method != Some(CopyMethod::Snapshot) {
            return Err(invalid(
                "spec.consistency",
                "hooks and a freeze surround a snapshot's cut: set copyMethod: Snapshot",
            ));
        }
        if let Some(retain) = &self.retain {
            retain.validate("spec.retain")?;
        }
        if let Some(group) = &self.volume_group {
            group.validate()?;
            if self.copy_method != Some(CopyMethod::Snapshot) {
                return Err(invalid(
                    "spec.volumeGroup",
                    "a group snapshot replaces the claim's own snapshot: set copyMethod: Snapshot",
                ));
            }
        }
        if let Some(secondary) = &self.secondary {
            secondary.validate("spec.secondary", &self.repository, &self.source_pvc, None)?;
        }
        for (field, name) in [
            (
                "spec.volumeSnapshotClassName",
                &self.volume_snapshot_class_name,
            ),
            ("spec.storageClassName", &self.storage_class_name),
        ] {
            if let Some(name) = name {
                check_pvc_name(field, name)?;
            }
        }
        if self.tags.as_ref().is_some_and(|t| t.len() > MAX_TAGS) {
            return Err(invalid("spec.tags", &format!("at most {MAX_TAGS} tags")));
        }
        if let Some(limit) = self.failed_backups_history_limit {
            if limit > MAX_FAILED_HISTORY {
                return Err(invalid(
                    "spec.failedBackupsHistoryLimit",
                    &format!(
                        "{limit} is more than {MAX_FAILED_HISTORY}: keep 0 to {MAX_FAILED_HISTORY} failed Backups"
                    ),
                ));
            }
        }
        Ok(cron)
    }

    /// How many failed Backups to keep (`failedBackupsHistoryLimit`, default 3).
    pub fn failed_history_limit(&self) -> usize {
        let limit = self
            .failed_backups_history_limit
            .unwrap_or(DEFAULT_FAILED_HISTORY)
            .min(MAX_FAILED_HISTORY);
        usize::try_from(limit).unwrap_or(0)
    }
}

/// What the operator observed of a schedule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupScheduleStatus {
    /// When the latest backup ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    /// How long the latest backup took (`1h2m3s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_duration: Option<String>,
    /// When the next backup starts (none while paused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_sync_time: Option<Time>,
    /// The snapshot id of the latest successful backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot: Option<String>,
    /// The latest Backup the schedule created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup: Option<String>,
    /// The phase the latest finished Backup ended in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_result: Option<String>,
    /// copyMethod Snapshot with a CSI SnapshotMetadata service: the VolumeSnapshot of the
    /// latest successful backup, kept (its temporary claim deleted) because the next
    /// backup's changed blocks are asked for since it; deleted when a newer one replaces
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_snapshot: Option<String>,
    /// `spec.secondary`: the latest snapshot whose Backup copied it into the secondary
    /// repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_secondary_snapshot: Option<String>,
    /// `spec.secondary`: why the latest Backup's copy into the secondary repository (or
    /// its prune there) failed; cleared by the next one that succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary_error: Option<String>,
    /// Synchronizing: True while a backup runs; False between backups (reason
    /// WaitingForSchedule), when paused (Paused) or when the spec cannot run
    /// (InvalidSpec).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// What is wrong, when the schedule cannot run (never a secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    fn spec() -> BackupScheduleSpec {
        BackupScheduleSpec {
            source_pvc: "web1".into(),
            path: None,
            repository: "site-a".into(),
            trigger: Trigger {
                schedule: "@daily".into(),
                time_zone: Some("Europe/Oslo".into()),
            },
            retain: Some(Retention {
                daily: Some(7),
                ..Retention::default()
            }),
            paused: None,
            copy_method: Some(CopyMethod::Snapshot),
            volume_snapshot_class_name: None,
            storage_class_name: None,
            tags: None,
            mover: None,
            consistency: None,
            failed_backups_history_limit: None,
            secondary: None,
            volume_group: None,
        }
    }

    #[test]
    fn validates_the_trigger_and_retention() {
        spec().validate().unwrap();
        let mut s = spec();
        s.trigger.schedule = "61 * * * *".into();
        let e = s.validate().unwrap_err();
        assert_eq!(e.field, "spec.trigger");
        assert!(e.message.contains("not valid"), "{e}");
        let mut s = spec();
        s.trigger.time_zone = Some("Mars/Base".into());
        assert!(s.validate().unwrap_err().message.contains("IANA"));
        let mut s = spec();
        s.retain = Some(Retention::default());
        assert_eq!(s.validate().unwrap_err().field, "spec.retain");
    }

    #[test]
    fn the_failed_history_limit_is_0_to_100_default_3() {
        let mut s = spec();
        assert_eq!(s.failed_history_limit(), 3);
        for ok in [0, 1, 100] {
            s.failed_backups_history_limit = Some(ok);
            s.validate().unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert_eq!(s.failed_history_limit(), ok as usize);
        }
        s.failed_backups_history_limit = Some(101);
        let e = s.validate().unwrap_err();
        assert_eq!(e.field, "spec.failedBackupsHistoryLimit");
        assert!(e.message.contains("keep 0 to 100"), "{e}");
        // The API server refuses it too: the schema says 0..=100.
        let crd = serde_json::to_value(BackupSchedule::crd()).unwrap();
        let field = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["failedBackupsHistoryLimit"];
        assert_eq!(
            (field["minimum"].as_f64(), field["maximum"].as_f64()),
            (Some(0.0), Some(100.0)),
            "{field}"
        );
    }
}
