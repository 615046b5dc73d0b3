//! The `Backup` kind: one backup of a claim into a `BackupRepository`, run by a mover
//! with the claim attached (a Filesystem volume's `disk.img`, or a Block volume itself),
//! and, when `retain` is set, a prune of the source's older backups afterwards. Deleting a
//! Backup never deletes its snapshot from the repository: a prune does.

// KubeSchema derives the schema from a copy of the spec struct in which the operator's
// never-stored lookup field is skipped, so never read: that copy is the only dead code here.
#![allow(dead_code)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::backup_repository::{named_repository, BackupRepositorySpec};
use super::secondary::{Secondary, SecondaryStatus};
use super::settings::MoverSettings;
use super::status::{Phase, Progress};
use super::validate::{check_pvc_name, invalid, ValidationError};

/// Most tags a backup may carry.
pub const MAX_TAGS: usize = 32;

/// Most snapshot ids a Backup's `status.prunedSnapshots` lists (about 40 KiB of ids).
pub const MAX_PRUNED_SNAPSHOTS: usize = 1000;

/// Whether `id` looks like a snapshot id (`20261202T101500Z-0a1b2c3d`): 1 to 128
/// letters, digits and `-`.
pub fn is_snapshot_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Most snapshot ids a Backup's `status.keptSnapshots` lists (about 40 KiB of ids).
pub const MAX_KEPT_SNAPSHOTS: usize = 1000;

/// The first `max` well-formed ids of `ids`.
fn listed<'a>(ids: impl IntoIterator<Item = &'a str>, max: usize) -> Vec<String> {
    ids.into_iter()
        .filter(|id| is_snapshot_id(id))
        .take(max)
        .map(str::to_string)
        .collect()
}

/// What `status.prunedSnapshots` records of a prune's removed snapshot ids (oldest first,
/// as the mover reports them): the first [`MAX_PRUNED_SNAPSHOTS`] well-formed ones.
pub fn pruned_snapshots<'a>(ids: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    listed(ids, MAX_PRUNED_SNAPSHOTS)
}

/// What `status.keptSnapshots` records of a prune's kept snapshot ids (oldest first, as
/// the mover reports them): the first [`MAX_KEPT_SNAPSHOTS`] well-formed ones.
pub fn kept_snapshots<'a>(ids: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    listed(ids, MAX_KEPT_SNAPSHOTS)
}

/// Back up a claim.
// kube's printcolumn(...) entries repeat their keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "Backup",
    // Not `backups`: that plural is Velero's and Longhorn's too, and `kubectl get backups`
    // would pick one of them.
    plural = "ferrybackups",
    singular = "ferrybackup",
    namespaced,
    status = "BackupStatus",
    shortname = "fbk",
    category = "ferry",
    doc = "Backs up a PVC into a BackupRepository (deleting it keeps the snapshot: prune removes snapshots)",
    printcolumn(name = "PVC", type_ = "string", json_path = ".spec.sourcePVC"),
    printcolumn(name = "Repository", type_ = "string", json_path = ".spec.repository"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Snapshot", type_ = "string", json_path = ".status.snapshotId"),
    printcolumn(name = "New", type_ = "integer", json_path = ".status.bytesNew"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// The claim to back up (in this namespace): a Filesystem volume's image file, or a
    /// Block volume.
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
    /// The source's identity in the repository: backups are grouped by it for
    /// `parent: auto` and for pruning (default `<namespace>/<sourcePVC>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub source_id: Option<String>,
    /// `auto` (the latest backup of the same source, the default), `none` (a full
    /// backup), or a snapshot id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^(auto|none|[0-9A-Za-z-]+)$")
    )]
    pub parent: Option<String>,
    /// Tags recorded in the snapshot's manifest (at most 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, String>>,
    /// After the backup, prune the source's snapshots by these rules (a BackupSchedule
    /// sets it from its own `retain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain: Option<Retention>,
    /// How the mover pod runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover: Option<MoverSettings>,
    /// The VolumeSnapshot `sourcePVC` was restored from and not written since (a
    /// BackupSchedule with `copyMethod: Snapshot` sets it). With a Block claim and a
    /// SnapshotMetadataService for the snapshot's CSI driver, the mover asks that service
    /// which blocks changed since the parent backup's snapshot (or, for a first backup,
    /// which are allocated) and reads only those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub volume_snapshot: Option<String>,
    /// After the backup (and its prune), copy the source's snapshots into a second
    /// BackupRepository (another site), and prune there by its own rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary: Option<Secondary>,
    /// The named repository's spec, looked up by the operator before each reconcile;
    /// never stored.
    #[serde(skip)]
    #[schemars(skip)]
    pub resolved_repository: Option<BackupRepositorySpec>,
    /// The secondary repository's spec, looked up like `resolved_repository`; never
    /// stored.
    #[serde(skip)]
    #[schemars(skip)]
    pub resolved_secondary: Option<BackupRepositorySpec>,
    /// The SnapshotMetadataService of `volumeSnapshot`'s driver, looked up by the operator
    /// before a mover starts; never stored.
    #[serde(skip)]
    #[schemars(skip)]
    pub resolved_snapshot_metadata: Option<MetadataLookup>,
}

/// What the operator found of a Backup's `volumeSnapshot` and its driver's CSI
/// SnapshotMetadata service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataLookup {
    /// The service to ask, and the snapshot's CSI handle.
    Service(MetadataService),
    /// Why the mover reads without it (change digests, or every allocated chunk).
    Unavailable(String),
}

/// A driver's SnapshotMetadataService (cbt.storage.k8s.io), as the mover needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataService {
    /// The object's name: the CSI driver's.
    pub driver: String,
    /// `https://HOST:PORT`.
    pub address: String,
    /// The CA certificate(s), PEM.
    pub ca_pem: Vec<u8>,
    /// The audience its tokens must be minted for.
    pub audience: String,
    /// The CSI handle of the Backup's VolumeSnapshot (recorded in the backup: the next
    /// backup's delta is asked since it).
    pub snapshot_handle: String,
}

/// Which snapshots of a source a prune keeps (restic's rules; a snapshot is kept when any
/// rule keeps it). Left out or 0: the rule is off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// The latest N snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<u32>,
    /// The latest snapshot of each of the last N hours that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hourly: Option<u32>,
    /// The latest snapshot of each of the last N days that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily: Option<u32>,
    /// The latest snapshot of each of the last N weeks that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weekly: Option<u32>,
    /// The latest snapshot of each of the last N months that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monthly: Option<u32>,
    /// The latest snapshot of each of the last N years that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yearly: Option<u32>,
    /// Every snapshot newer than this before the newest one: `1y2m3d4h` (years, months,
    /// days, hours; any may be left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+y)?([0-9]+m)?([0-9]+d)?([0-9]+h)?$"))]
    pub within: Option<String>,
}

impl Retention {
    /// Whether no rule is on (a prune with no rule would be refused).
    pub fn is_empty(&self) -> bool {
        [
            self.last,
            self.hourly,
            self.daily,
            self.weekly,
            self.monthly,
            self.yearly,
        ]
        .iter()
        .all(|n| n.unwrap_or(0) == 0)
            && self.within.is_none()
    }

    /// Checks the rules at `field`.
    pub fn validate(&self, field: &str) -> Result<(), ValidationError> {
        if let Some(within) = &self.within {
            check_within(&format!("{field}.within"), within)?;
        }
        if self.is_empty() {
            return Err(invalid(
                field,
                "no rule keeps anything: set at least one of last, hourly, daily, weekly, monthly, yearly or within (or leave retain out to keep every snapshot)",
            ));
        }
        Ok(())
    }
}

/// `1y2m3d4h`: units in that order, each at most once, at least one.
fn check_within(field: &str, text: &str) -> Result<(), ValidationError> {
    let mut order = 0;
    let mut digits = 0;
    let mut ok = !text.is_empty() && text.len() <= 64;
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits += 1;
            continue;
        }
        let rank = match c {
            'y' => 1,
            'm' => 2,
            'd' => 3,
            'h' => 4,
            _ => 0,
        };
        if rank <= order || digits == 0 || digits > 9 {
            ok = false;
            break;
        }
        order = rank;
        digits = 0;
    }
    if !ok || digits != 0 || order == 0 {
        return Err(invalid(
            field,
            &format!("'{text}' is not a duration like 7d or 1y2m3d4h (years, months, days, hours)"),
        ));
    }
    if text.bytes().all(|b| b == b'0' || b.is_ascii_alphabetic()) {
        return Err(invalid(
            field,
            &format!("'{text}' keeps nothing: give a duration longer than zero"),
        ));
    }
    Ok(())
}

/// A snapshot id or `auto`/`none`.
fn check_parent(field: &str, parent: &str) -> Result<(), ValidationError> {
    if !is_snapshot_id(parent) {
        return Err(invalid(
            field,
            &format!(
                "'{parent}' is not auto, none or a snapshot id (like 20261202T101500Z-0a1b2c3d)"
            ),
        ));
    }
    Ok(())
}

impl BackupSpec {
    /// Checks what the schema cannot: names, the parent, tags, the retention rules, and
    /// that the named repository exists and is valid (the operator looks it up first).
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_pvc_name("spec.sourcePVC", &self.source_pvc)?;
        if let Some(path) = &self.path {
            super::validate::check_relative_path("spec.path", path)?;
        }
        check_pvc_name("spec.repository", &self.repository)?;
        if let Some(parent) = &self.parent {
            check_parent("spec.parent", parent)?;
        }
        if let Some(snapshot) = &self.volume_snapshot {
            check_pvc_name("spec.volumeSnapshot", snapshot)?;
        }
        if let Some(id) = &self.source_id {
            if id.is_empty() || id.len() > 253 || id.chars().any(char::is_control) {
                return Err(invalid(
                    "spec.sourceId",
                    "the source id must be 1 to 253 printable characters",
                ));
            }
        }
        if let Some(tags) = &self.tags {
            if tags.len() > MAX_TAGS {
                return Err(invalid("spec.tags", &format!("at most {MAX_TAGS} tags")));
            }
            for (k, v) in tags {
                let key_ok = !k.is_empty()
                    && k.len() <= 128
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
                if !key_ok || v.len() > 256 || v.chars().any(char::is_control) {
                    return Err(invalid(
                        &format!("spec.tags.{k}"),
                        "a tag key is 1 to 128 letters, digits, '-', '_', '.', '/'; its value at most 256 printable characters",
                    ));
                }
            }
        }
        if let Some(retain) = &self.retain {
            retain.validate("spec.retain")?;
        }
        let repo = named_repository(
            "spec.repository",
            &self.repository,
            self.resolved_repository.as_ref(),
        )?;
        if repo.pvc.as_ref().is_some_and(|p| p.name == self.source_pvc) {
            return Err(invalid(
                "spec.repository",
                &format!(
                    "BackupRepository '{}' is kept in the claim being backed up: keep it in another claim or in S3",
                    self.repository
                ),
            ));
        }
        if let Some(secondary) = &self.secondary {
            secondary.validate(
                "spec.secondary",
                &self.repository,
                &self.source_pvc,
                Some((self.resolved_secondary.as_ref(), Some(repo))),
            )?;
        }
        Ok(())
    }

    /// The source id: `sourceId`, or `<namespace>/<sourcePVC>`.
    pub fn source_id_in(&self, namespace: &str) -> String {
        self.source_id
            .clone()
            .unwrap_or_else(|| format!("{namespace}/{}", self.source_pvc))
    }
}

/// What the operator observed of a Backup.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// Pending, Running, Succeeded, Failed or Cancelled.
    #[serde(default)]
    pub phase: Phase,
    /// The snapshot's id in the repository, once the backup is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// The snapshot this one built on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// Bytes of the volume read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_read: Option<u64>,
    /// Bytes of new chunks stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_new: Option<u64>,
    /// Bytes of chunks the repository already had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_reused: Option<u64>,
    /// The image's block hash (`blkhash:<hex>`, blksum-compatible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_hash: Option<String>,
    /// How the blocks to read were found: SnapshotMetadata (the CSI service's allocated
    /// ranges or delta), ChangeDigests (an incremental that read every allocated chunk and
    /// compared it), or absent (a full backup that read every allocated chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_block_tracking: Option<String>,
    /// Why the backup read more than the changed blocks: made in full although a parent
    /// was asked for, or the CSI SnapshotMetadata service not used (none for the driver,
    /// a Filesystem claim, the service's failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_reason: Option<String>,
    /// The CSI handle of `spec.volumeSnapshot`, recorded in the backup: the next backup's
    /// delta is asked since it, so its schedule keeps that VolumeSnapshot until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
    /// Snapshots the prune after the backup removed (when `retain` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pruned: Option<u64>,
    /// Snapshots of the source the prune kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<u64>,
    /// The ids of the snapshots the prune removed, oldest first (at most 1000: the first
    /// ones, when `pruned` is larger). A BackupSchedule deletes its Backups of these
    /// snapshots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub pruned_snapshots: Vec<String>,
    /// The ids of the source's snapshots the prune kept, oldest first (at most 1000: the
    /// first ones, when `kept` is larger). A BackupSchedule deletes its older Backups of
    /// the source whose snapshots are not among them (removed by this prune or an earlier
    /// one, also by an attempt that was killed), when the list is complete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub kept_snapshots: Vec<String>,
    /// Why the prune after the backup failed (the snapshot is written and restorable all
    /// the same; the next backup's prune tries again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prune_error: Option<String>,
    /// What the copy into `spec.secondary` (and the prune there) did, once it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary: Option<SecondaryStatus>,
    /// Bytes so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// Ready and Running, with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When the first mover started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the Backup reached a final phase.
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

impl BackupStatus {
    /// Whether `keptSnapshots` names every snapshot the prune kept (none left out by the
    /// bound, nor as malformed): only then does a snapshot's absence from it mean the
    /// snapshot is gone.
    pub fn lists_every_kept_snapshot(&self) -> bool {
        !self.kept_snapshots.is_empty() && self.kept == Some(self.kept_snapshots.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::backup_repository::BackupRepositorySpec;
    use crate::crd::PvcRef;

    fn spec() -> BackupSpec {
        BackupSpec {
            source_pvc: "web1".into(),
            path: None,
            repository: "site-a".into(),
            source_id: None,
            parent: None,
            tags: None,
            retain: None,
            mover: None,
            volume_snapshot: None,
            resolved_snapshot_metadata: None,
            secondary: None,
            resolved_secondary: None,
            resolved_repository: Some(BackupRepositorySpec {
                url: Some("s3://backups/site-a".into()),
                s3: None,
                pvc: None,
                encryption: None,
                initialize: None,
            }),
        }
    }

    #[test]
    fn validates_names_parent_retention_and_repository() {
        spec().validate().unwrap();
        assert_eq!(spec().source_id_in("vms"), "vms/web1");
        let mut s = spec();
        s.parent = Some("../x".into());
        assert_eq!(s.validate().unwrap_err().field, "spec.parent");
        let mut s = spec();
        s.retain = Some(Retention::default());
        assert!(s.validate().unwrap_err().message.contains("no rule"));
        s.retain = Some(Retention {
            within: Some("2x".into()),
            ..Retention::default()
        });
        assert_eq!(s.validate().unwrap_err().field, "spec.retain.within");
        for good in ["7d", "1y2m3d4h", "12h"] {
            s.retain = Some(Retention {
                within: Some(good.into()),
                ..Retention::default()
            });
            s.validate().unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in ["d", "3d2y", "3", "1d1d", "", "0d", "0y00h"] {
            assert!(check_within("f", bad).is_err(), "{bad}");
        }
        let mut s = spec();
        s.resolved_repository = None;
        let e = s.validate().unwrap_err();
        assert!(
            e.message
                .contains("BackupRepository 'site-a' does not exist"),
            "{e}"
        );
        let mut s = spec();
        s.resolved_repository = Some(BackupRepositorySpec {
            url: None,
            s3: None,
            pvc: Some(PvcRef {
                name: "web1".into(),
                path: None,
                namespace: None,
            }),
            encryption: None,
            initialize: None,
        });
        assert!(s
            .validate()
            .unwrap_err()
            .message
            .contains("claim being backed up"));
    }

    #[test]
    fn pruned_snapshot_lists_are_bounded_and_hold_only_ids() {
        let ids: Vec<String> = (0..MAX_PRUNED_SNAPSHOTS + 5)
            .map(|i| format!("20261202T101500Z-{i:08x}"))
            .collect();
        let listed = pruned_snapshots(ids.iter().map(String::as_str));
        assert_eq!(listed.len(), MAX_PRUNED_SNAPSHOTS);
        assert_eq!(listed[0], ids[0], "the oldest first");
        let odd = ["a b", "", "../x", "20261202T101500Z-0a1b2c3d"];
        assert_eq!(
            pruned_snapshots(odd),
            ["20261202T101500Z-0a1b2c3d"],
            "nothing but ids"
        );
        assert!(!is_snapshot_id(&"a".repeat(129)));
        let status = BackupStatus::default();
        let json = serde_json::to_value(&status).unwrap();
        assert!(json.get("prunedSnapshots").is_none(), "{json}");
        assert!(json.get("keptSnapshots").is_none(), "{json}");
        assert!(
            !status.lists_every_kept_snapshot(),
            "no list: nothing known"
        );

        let kept = kept_snapshots(ids.iter().map(String::as_str));
        assert_eq!(kept.len(), MAX_KEPT_SNAPSHOTS);
        assert_eq!(kept[0], ids[0], "the oldest first");
        let complete = BackupStatus {
            kept: Some(2),
            kept_snapshots: kept_snapshots(odd.iter().copied().chain(["s-2"])),
            ..BackupStatus::default()
        };
        assert!(complete.lists_every_kept_snapshot());
        let malformed = BackupStatus {
            kept: Some(3),
            ..complete.clone()
        };
        assert!(
            !malformed.lists_every_kept_snapshot(),
            "an id left out as malformed"
        );
        let truncated = BackupStatus {
            kept: Some(ids.len() as u64),
            kept_snapshots: kept,
            ..BackupStatus::default()
        };
        assert!(!truncated.lists_every_kept_snapshot(), "over the bound");
    }

    #[test]
    fn the_resolved_repository_is_never_stored() {
        let json = serde_json::to_value(spec()).unwrap();
        assert!(json.get("resolvedRepository").is_none(), "{json}");
        assert_eq!(json["sourcePVC"], "web1");
    }
}
