//! The `VolumeImageSource` kind: the volume populator's data source. A claim whose
//! `dataSourceRef` names one is created already holding the image: the operator fills a
//! prime claim with a mover and rebinds its volume to the user's claim. The object itself
//! only describes the image (or, with `backup`, the newest backup of a source, which a
//! Restore writes); progress is reported on the claim (events) and the prime claim's
//! Transfer or Restore.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::endpoint::Endpoint;
use super::options::TransferOptions;
use super::settings::MoverSettings;
use super::storage_class_profile::CloneStrategy;
use super::validate::{check_digest, check_pvc_name, invalid, ValidationError};

/// An image to populate new claims with.
// kube's printcolumn(...) entries repeat their keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "VolumeImageSource",
    namespaced,
    shortname = "vis",
    category = "ferry",
    doc = "A disk image (URL or PVC) that PVCs name in dataSourceRef to be created holding it",
    printcolumn(name = "URL", type_ = "string", json_path = ".spec.source.url"),
    printcolumn(name = "PVC", type_ = "string", json_path = ".spec.source.pvc.name"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeImageSourceSpec {
    /// The image: exactly one of url, pvc or goldenImage. Left out with `backup`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("[has(self.url), has(self.pvc), has(self.goldenImage)].exists_one(x, x)").message("source: give exactly one of url, pvc or goldenImage"))]
    pub source: Option<Endpoint>,
    /// Instead of `source`: the newest backup of a source in a BackupRepository of this
    /// namespace, restored into each claim (VolSync's `latestImage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<LatestBackupRef>,
    /// How to copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<TransferOptions>,
    /// The digest the image must have (`sha256:<hex>` or `blkhash:<hex>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(sha256|blkhash):[0-9a-f]{64}$"))]
    pub expected_digest: Option<String>,
    /// How the mover pod runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover: Option<MoverSettings>,
    /// For an image in a claim (`pvc` or `goldenImage`): how each claim is made (`auto`,
    /// `snapshot`, `csi-clone`, `copy`), as a Transfer's `cloneStrategy`; default the
    /// claim's class's StorageClassProfile, else `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_strategy: Option<CloneStrategy>,
}

/// The newest backup of a source in a repository.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LatestBackupRef {
    /// A BackupRepository in this namespace.
    #[schemars(length(min = 1, max = 253))]
    pub repository: String,
    /// The source whose newest backup is restored (a Backup's `<namespace>/<sourcePVC>`
    /// unless it set its own sourceId).
    #[schemars(length(min = 1, max = 1024))]
    pub source_id: String,
    /// Only backups started at or before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_as_of: Option<Time>,
}

impl VolumeImageSourceSpec {
    /// Checks what the schema cannot (URLs, inline passwords, options, the digest).
    pub fn validate(&self) -> Result<(), ValidationError> {
        match (&self.source, &self.backup) {
            (Some(source), None) => source.validate("spec.source")?,
            (None, Some(backup)) => {
                check_pvc_name("spec.backup.repository", &backup.repository)?;
                if backup.source_id.is_empty()
                    || backup.source_id.len() > 1024
                    || backup.source_id.chars().any(char::is_control)
                {
                    return Err(invalid(
                        "spec.backup.sourceId",
                        "name the source: 1 to 1024 printable characters",
                    ));
                }
            }
            _ => {
                return Err(invalid(
                    "spec",
                    "give exactly one of source (an image) or backup (a repository's newest backup of a source)",
                ))
            }
        }
        if let Some(options) = &self.options {
            options.validate("spec.options")?;
        }
        if let Some(digest) = &self.expected_digest {
            check_digest("spec.expectedDigest", digest)?;
        }
        let in_claim = self
            .source
            .as_ref()
            .is_some_and(|s| s.pvc.is_some() || s.golden_image.is_some());
        if self.clone_strategy.is_some() && !in_claim {
            return Err(invalid(
                "spec.cloneStrategy",
                "only an image in a claim (source.pvc or source.goldenImage) can be cloned: leave cloneStrategy out",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_source_options_and_digest() {
        let mut s = VolumeImageSourceSpec {
            source: Some(Endpoint::url("s3://images/f.raw")),
            backup: None,
            options: None,
            expected_digest: Some(format!("sha256:{}", "f".repeat(64))),
            mover: None,
            clone_strategy: None,
        };
        s.validate().unwrap();
        s.expected_digest = Some("sha256:xyz".into());
        assert_eq!(s.validate().unwrap_err().field, "spec.expectedDigest");
        s.expected_digest = None;
        s.source = Some(Endpoint::url("s3://user:pw@images/f.raw"));
        assert!(s
            .validate()
            .unwrap_err()
            .message
            .contains("password inside the URL"));
        s.source = Some(Endpoint::url("s3://images/f.raw"));
        s.expected_digest = None;
        s.clone_strategy = Some(CloneStrategy::Snapshot);
        assert_eq!(s.validate().unwrap_err().field, "spec.cloneStrategy");
        s.source = Some(Endpoint::pvc("golden"));
        s.validate().unwrap();
    }
}
