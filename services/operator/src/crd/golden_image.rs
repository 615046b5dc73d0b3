//! The `GoldenImage` kind, in the spirit of CDI's DataImportCron: an image source polled
//! on a cron schedule, imported into a new claim only when its version changed (an HTTP
//! ETag or Last-Modified), the newest imports kept, older ones deleted, and the newest
//! claim named in the status, where Transfers and VolumeImageSources find it
//! (`source: {goldenImage: {name}}`), so new VMs always clone the newest image.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::backup_schedule::Trigger;
use super::endpoint::{AccessMode, Endpoint, VolumeMode};
use super::options::TransferOptions;
use super::settings::MoverSettings;
use super::validate::{check_quantity, invalid, ValidationError};

/// Imports kept unless `importsToKeep` says otherwise (CDI's default).
pub const DEFAULT_KEEP: u32 = 3;
/// Most imports kept.
pub const MAX_KEEP: u32 = 100;
/// How long an import's VolumeSnapshot may take to be ready, by default: six hours.
pub const DEFAULT_SNAPSHOT_TIMEOUT: u32 = 6 * 3600;
/// The longest `snapshotTimeoutSeconds`: a week.
pub const MAX_SNAPSHOT_TIMEOUT: u32 = 7 * 24 * 3600;

/// An image kept current in a claim.
// kube's printcolumn(...) entries repeat their keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "GoldenImage",
    namespaced,
    status = "GoldenImageStatus",
    shortname = "fgi",
    category = "ferry",
    doc = "Imports an image into a new PVC on a cron schedule whenever its version changed, keeping the newest imports",
    printcolumn(name = "URL", type_ = "string", json_path = ".spec.source.url"),
    printcolumn(name = "Current", type_ = "string", json_path = ".status.currentClaim"),
    printcolumn(
        name = "Snapshot",
        type_ = "string",
        json_path = ".status.currentSnapshot"
    ),
    printcolumn(name = "Last poll", type_ = "date", json_path = ".status.lastPollTime"),
    printcolumn(name = "Next poll", type_ = "date", json_path = ".status.nextPollTime"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GoldenImageSpec {
    /// Where the image is: a URL with its options (http(s), s3, docker registry, ...).
    pub source: Endpoint,
    /// When to look for a new version.
    pub trigger: Trigger,
    /// How many imports to keep, newest first (default 3, at most 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub imports_to_keep: Option<u32>,
    /// The claims the imports are written into.
    pub claim: ImportClaim,
    /// What each import is kept as: its claim (default), or a VolumeSnapshot of it, the
    /// claim deleted once the snapshot is ready (CDI's `sourceFormat: snapshot`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_as: Option<KeepAs>,
    /// The VolumeSnapshotClass of the imports' snapshots (`keepAs: Snapshot`; default:
    /// the cluster's default class of the claim's driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    /// How long an import's VolumeSnapshot may take to be ready before the import fails
    /// (`keepAs: Snapshot`; default 21600, six hours: the first snapshot of a large cloud
    /// disk can take hours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 604800))]
    pub snapshot_timeout_seconds: Option<u32>,
    /// How to copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<TransferOptions>,
    /// How the import's mover pod runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover: Option<MoverSettings>,
}

/// What an import is kept as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum KeepAs {
    /// The claim the import wrote.
    #[default]
    Claim,
    /// A VolumeSnapshot of that claim (named like it); the claim is deleted once the
    /// snapshot is ready. Consumers restore a claim from it.
    Snapshot,
}

/// The claim each import creates: `<name>-<version hash>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportClaim {
    /// Storage class (default: the cluster's default class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Requested size; at least the image size.
    pub size: Quantity,
    /// Filesystem (the image is `disk.img` in it) or Block (default Filesystem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<VolumeMode>,
    /// Access modes (default ReadWriteOnce).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4))]
    pub access_modes: Option<Vec<AccessMode>>,
}

impl GoldenImageSpec {
    /// Checks what the schema cannot: the source (a URL), the schedule, the size.
    pub fn validate(&self) -> Result<ferry_cron::CronSpec, ValidationError> {
        if self.source.url.is_none() {
            return Err(invalid(
                "spec.source",
                "give a url: a GoldenImage imports from a URL",
            ));
        }
        self.source.validate("spec.source")?;
        if let Some(keep) = self.imports_to_keep {
            if keep == 0 || keep > MAX_KEEP {
                return Err(invalid(
                    "spec.importsToKeep",
                    &format!("keep 1 to {MAX_KEEP} imports"),
                ));
            }
        }
        check_quantity("spec.claim.size", &self.claim.size)?;
        if let Some(seconds) = self.snapshot_timeout_seconds {
            if !(60..=MAX_SNAPSHOT_TIMEOUT).contains(&seconds) {
                return Err(invalid(
                    "spec.snapshotTimeoutSeconds",
                    &format!("give 60 to {MAX_SNAPSHOT_TIMEOUT} seconds"),
                ));
            }
        }
        if let Some(options) = &self.options {
            options.validate("spec.options")?;
        }
        let zone = self.trigger.time_zone.as_deref().unwrap_or("UTC");
        ferry_cron::CronSpec::parse(&self.trigger.schedule, zone, false)
            .map_err(|e| invalid("spec.trigger.schedule", &e.to_string()))
    }

    /// What imports are kept as.
    pub fn keep_as(&self) -> KeepAs {
        self.keep_as.unwrap_or_default()
    }

    /// How many imports are kept.
    pub fn keep(&self) -> usize {
        self.imports_to_keep.unwrap_or(DEFAULT_KEEP) as usize
    }

    /// How long an import's VolumeSnapshot may take to be ready.
    pub fn snapshot_timeout(&self) -> chrono::TimeDelta {
        chrono::TimeDelta::seconds(
            self.snapshot_timeout_seconds
                .unwrap_or(DEFAULT_SNAPSHOT_TIMEOUT)
                .into(),
        )
    }
}

/// One import kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportRecord {
    /// The claim holding it (deleted when it is kept as a snapshot).
    pub claim: String,
    /// The VolumeSnapshot holding it (`keepAs: Snapshot`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The source's version it holds (`etag:...`, `last-modified:...`; empty when the
    /// source gave none).
    #[serde(default)]
    pub version: String,
    /// When its import succeeded.
    pub imported_at: Time,
}

/// An import under way.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Importing {
    /// Its Transfer (owned by the GoldenImage, deleted once recorded).
    pub transfer: String,
    /// The claim it creates.
    pub claim: String,
    /// The version it imports.
    #[serde(default)]
    pub version: String,
    /// Its VolumeSnapshot, once the copy succeeded (`keepAs: Snapshot`): the import ends
    /// when it is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// What the operator observed of a GoldenImage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GoldenImageStatus {
    /// The newest successful import's claim: what `source: {goldenImage}` reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_claim: Option<String>,
    /// The newest successful import's VolumeSnapshot (`keepAs: Snapshot`; then there is
    /// no current claim): `source: {goldenImage}` restores a claim from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_snapshot: Option<String>,
    /// The version it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// The imports kept, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub imports: Vec<ImportRecord>,
    /// The import under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub importing: Option<Importing>,
    /// When the source was last asked for its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_poll_time: Option<Time>,
    /// When it is asked next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_poll_time: Option<Time>,
    /// Ready (an import is current) and Progressing (an import runs), with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: serde_json::Value) -> GoldenImageSpec {
        let mut spec = serde_json::json!({
            "source": {"url": "https://images.example.com/fedora.qcow2"},
            "trigger": {"schedule": "@daily"},
            "claim": {"size": "10Gi"},
        });
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(spec).unwrap()
    }

    #[test]
    fn the_snapshot_timeout_is_a_minute_to_a_week() {
        assert_eq!(
            spec(serde_json::json!({})).snapshot_timeout(),
            chrono::TimeDelta::hours(6)
        );
        let hour = spec(serde_json::json!({"snapshotTimeoutSeconds": 3600}));
        assert!(hour.validate().is_ok());
        assert_eq!(hour.snapshot_timeout(), chrono::TimeDelta::hours(1));
        for wrong in [59, 7 * 24 * 3600 + 1] {
            let e = spec(serde_json::json!({"snapshotTimeoutSeconds": wrong}))
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("spec.snapshotTimeoutSeconds") && e.contains("60 to 604800 seconds"),
                "{e}"
            );
        }
    }
}
