//! The `StorageClassProfile` kind: what ferry should know of a StorageClass that the class
//! itself does not say, in the spirit of CDI's StorageProfile. Cluster-scoped and named
//! after its class; today the clone strategy its claims get by default.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a Transfer from a claim into new claims is done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CloneStrategy {
    /// A snapshot when the source's driver has a VolumeSnapshotClass, else a copy.
    #[default]
    Auto,
    /// One VolumeSnapshot of the source, restored into every target by the storage.
    Snapshot,
    /// Every target a CSI clone of the source claim (same storage class).
    CsiClone,
    /// A mover copies the bytes.
    Copy,
}

impl CloneStrategy {
    /// The spelling in specs and statuses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Snapshot => "snapshot",
            Self::CsiClone => "csi-clone",
            Self::Copy => "copy",
        }
    }
}

/// Defaults for the claims of one StorageClass (the profile's name is the class's).
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "StorageClassProfile",
    shortname = "fscp",
    category = "ferry",
    doc = "Defaults for the claims of the StorageClass of the same name"
)]
#[serde(rename_all = "camelCase")]
pub struct StorageClassProfileSpec {
    /// How Transfers from a claim into new claims of this class are done when they do not
    /// say (`auto`, `snapshot`, `csi-clone` when the class's driver clones, `copy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_strategy: Option<CloneStrategy>,
}
