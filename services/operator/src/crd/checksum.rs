//! The `Checksum` kind: the digest of an endpoint (a URL or a claim), computed by a mover
//! and written to the status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::endpoint::Endpoint;
use super::options::ChecksumOptions;
use super::settings::MoverSettings;
use super::status::{Phase, Progress};
use super::validate::ValidationError;

/// Compute the digest of `source`.
// kube's printcolumn(...) entries repeat their keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "Checksum",
    namespaced,
    status = "ChecksumStatus",
    shortname = "fcs",
    category = "ferry",
    doc = "Computes the checksum of a disk image (URL or PVC)",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Digest", type_ = "string", json_path = ".status.digest"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ChecksumSpec {
    /// What to read: exactly one of url or pvc.
    #[x_kube(validation = Rule::new("[has(self.url), has(self.pvc), has(self.goldenImage)].exists_one(x, x)").message("source: give exactly one of url, pvc or goldenImage"))]
    pub source: Endpoint,
    /// How to compute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<ChecksumOptions>,
    /// How the mover pod runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover: Option<MoverSettings>,
}

impl ChecksumSpec {
    /// Checks what the schema cannot (URLs, inline passwords, options).
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.source.validate("spec.source")?;
        if let Some(options) = &self.options {
            options.validate("spec.options")?;
        }
        Ok(())
    }
}

/// What the operator observed of a Checksum.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChecksumStatus {
    /// Pending, Running, Succeeded, Failed or Cancelled.
    #[serde(default)]
    pub phase: Phase,
    /// The digest, `<algorithm>:<hex>`, once Succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Bytes read so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// Ready and Running, with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When the first mover started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the Checksum reached a final phase.
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

    #[test]
    fn validates_source_and_options() {
        let mut s = ChecksumSpec {
            source: Endpoint::pvc("golden"),
            options: None,
            mover: None,
        };
        s.validate().unwrap();
        s.source = Endpoint::url("ftp://h/x");
        assert_eq!(s.validate().unwrap_err().field, "spec.source.url");
        s.source = Endpoint::pvc("golden");
        s.options = Some(ChecksumOptions {
            workers: Some(0),
            ..ChecksumOptions::default()
        });
        assert_eq!(s.validate().unwrap_err().field, "spec.options.workers");
    }
}
