//! The `VolumeImageSource` kind: the volume populator's data source. A claim whose
//! `dataSourceRef` names one is created already holding the image: the operator fills a
//! prime claim with a mover and rebinds its volume to the user's claim. The object itself
//! only describes the image; progress is reported on the claim (events) and the prime
//! claim's Transfer.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::endpoint::Endpoint;
use super::options::TransferOptions;
use super::settings::MoverSettings;
use super::validate::{check_digest, ValidationError};

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
    /// The image: exactly one of url or pvc.
    #[x_kube(validation = Rule::new("[has(self.url), has(self.pvc), has(self.goldenImage)].exists_one(x, x)").message("source: give exactly one of url, pvc or goldenImage"))]
    pub source: Endpoint,
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
}

impl VolumeImageSourceSpec {
    /// Checks what the schema cannot (URLs, inline passwords, options, the digest).
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.source.validate("spec.source")?;
        if let Some(options) = &self.options {
            options.validate("spec.options")?;
        }
        if let Some(digest) = &self.expected_digest {
            check_digest("spec.expectedDigest", digest)?;
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
            source: Endpoint::url("s3://images/f.raw"),
            options: None,
            expected_digest: Some(format!("sha256:{}", "f".repeat(64))),
            mover: None,
        };
        s.validate().unwrap();
        s.expected_digest = Some("sha256:xyz".into());
        assert_eq!(s.validate().unwrap_err().field, "spec.expectedDigest");
        s.expected_digest = None;
        s.source = Endpoint::url("s3://user:pw@images/f.raw");
        assert!(s
            .validate()
            .unwrap_err()
            .message
            .contains("password inside the URL"));
    }
}
