//! The `Restore` kind: write a backup snapshot into a claim, run by a mover with the claim
//! attached (a Filesystem volume gets `disk.img`, a Block volume the image itself). The
//! snapshot is named through a `Backup` of the namespace (its repository and snapshot
//! id), directly by repository and snapshot id, or as the newest snapshot of a source in
//! a repository (at or before a time). The volume populator creates one for a
//! claim whose `dataSourceRef` names a Backup; it can also be created by hand to restore
//! into an existing claim.

// KubeSchema derives the schema from a copy of the spec struct in which the operator's
// never-stored lookup field is skipped, so never read: that copy is the only dead code here.
#![allow(dead_code)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::backup_repository::BackupRepositorySpec;
use super::settings::MoverSettings;
use super::status::{Phase, Progress};
use super::validate::{check_pvc_name, invalid, ValidationError};

/// Restore a backup snapshot into a claim.
// kube's printcolumn(...) entries repeat their keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "Restore",
    // Not `restores`: that plural is Velero's too.
    plural = "ferryrestores",
    singular = "ferryrestore",
    namespaced,
    status = "RestoreStatus",
    shortname = "frs",
    category = "ferry",
    doc = "Restores a backup snapshot (of a Backup, or by repository and id) into a PVC",
    printcolumn(name = "Backup", type_ = "string", json_path = ".spec.backup"),
    printcolumn(name = "PVC", type_ = "string", json_path = ".spec.targetPVC"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Snapshot", type_ = "string", json_path = ".status.snapshotId"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSpec {
    /// A succeeded Backup in this namespace: its repository and snapshot are restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub backup: Option<String>,
    /// Instead of `backup`: a BackupRepository in this namespace ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub repository: Option<String>,
    /// ... and the id of a snapshot in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[0-9A-Za-z-]+$"))]
    pub snapshot_id: Option<String>,
    /// ... or, instead of snapshotId, the newest snapshot of this source in it (a
    /// Backup's `<namespace>/<sourcePVC>` unless it set its own sourceId), as the mover
    /// finds it when it starts: VolSync's `latestImage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub source_id: Option<String>,
    /// With sourceId: the newest snapshot started at or before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_as_of: Option<Time>,
    /// The claim to write (in this namespace), at least as large as the image.
    #[serde(rename = "targetPVC")]
    #[schemars(length(min = 1, max = 253))]
    pub target_pvc: String,
    /// How the mover pod runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover: Option<MoverSettings>,
    /// The repository and snapshot, looked up by the operator before each reconcile (or
    /// why they cannot be); never stored.
    #[serde(skip)]
    #[schemars(skip)]
    pub resolved: Option<Result<ResolvedSnapshot, String>>,
}

/// A snapshot the operator found.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedSnapshot {
    /// The repository's spec.
    pub repository: BackupRepositorySpec,
    /// Which snapshot of it.
    pub snapshot: SnapshotChoice,
}

/// Which snapshot of a repository a Restore writes.
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotChoice {
    /// This id.
    Id(String),
    /// The newest of a source (started at or before `as_of`), found by the mover.
    Latest {
        source_id: String,
        as_of: Option<Time>,
    },
}

impl RestoreSpec {
    /// Checks what the schema cannot: one way of naming the snapshot, the names, and that
    /// the snapshot was found (the operator looks it up first).
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_pvc_name("spec.targetPVC", &self.target_pvc)?;
        let latest = self.source_id.is_some() || self.restore_as_of.is_some();
        match (&self.backup, &self.repository, &self.snapshot_id, latest) {
            (Some(backup), None, None, false) => check_pvc_name("spec.backup", backup)?,
            (None, Some(repository), Some(_), false) => {
                check_pvc_name("spec.repository", repository)?
            }
            (None, Some(repository), None, true) => {
                check_pvc_name("spec.repository", repository)?;
                let id = self.source_id.as_deref().unwrap_or_default();
                if id.is_empty() || id.len() > 1024 || id.chars().any(char::is_control) {
                    return Err(invalid(
                        "spec.sourceId",
                        "restoreAsOf goes with sourceId: name the source (1 to 1024 printable characters)",
                    ));
                }
            }
            _ => {
                return Err(invalid(
                    "spec",
                    "name the snapshot with backup, with repository and snapshotId, or with repository and sourceId (its newest snapshot)",
                ))
            }
        }
        match &self.resolved {
            None => Err(invalid("spec", "the snapshot was not looked up yet")),
            Some(Err(why)) => Err(invalid(
                if self.backup.is_some() {
                    "spec.backup"
                } else {
                    "spec.repository"
                },
                why,
            )),
            Some(Ok(found)) => {
                found.repository.validate().map_err(|e| {
                    invalid(
                        "spec.repository",
                        &format!("the repository is not valid: {e}"),
                    )
                })?;
                if found
                    .repository
                    .pvc
                    .as_ref()
                    .is_some_and(|p| p.name == self.target_pvc)
                {
                    return Err(invalid(
                        "spec.targetPVC",
                        "the repository is kept in this claim: restore into another one",
                    ));
                }
                Ok(())
            }
        }
    }
}

/// What the operator observed of a Restore.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// Pending, Running, Succeeded, Failed or Cancelled.
    #[serde(default)]
    pub phase: Phase,
    /// The snapshot restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// Bytes so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// Ready and Running, with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When the first mover started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the Restore reached a final phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Mover pods started so far.
    #[serde(default)]
    pub attempts: u32,
    /// The current (or last) mover pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover_pod: Option<String>,
    /// The node the mover runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// On failure: what went wrong and what to fix (never a secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RestoreSpec {
        RestoreSpec {
            backup: Some("web1-nightly-20261202030000".into()),
            repository: None,
            snapshot_id: None,
            source_id: None,
            restore_as_of: None,
            target_pvc: "web1-copy".into(),
            mover: None,
            resolved: Some(Ok(ResolvedSnapshot {
                repository: BackupRepositorySpec {
                    url: Some("s3://backups/site-a".into()),
                    s3: None,
                    pvc: None,
                    encryption: None,
                    initialize: None,
                },
                snapshot: SnapshotChoice::Id("20261202T030000Z-0a1b2c3d".into()),
            })),
        }
    }

    #[test]
    fn one_way_of_naming_the_snapshot_and_it_was_found() {
        spec().validate().unwrap();
        let mut s = spec();
        s.repository = Some("site-a".into());
        assert_eq!(s.validate().unwrap_err().field, "spec");
        s.backup = None;
        assert_eq!(s.validate().unwrap_err().field, "spec");
        s.snapshot_id = Some("20261202T030000Z-0a1b2c3d".into());
        s.validate().unwrap();
        let mut s = spec();
        s.resolved = Some(Err("Backup 'x' does not exist".into()));
        let e = s.validate().unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("spec.backup", "Backup 'x' does not exist")
        );
        assert!(serde_json::to_value(spec())
            .unwrap()
            .get("resolved")
            .is_none());
    }
}
