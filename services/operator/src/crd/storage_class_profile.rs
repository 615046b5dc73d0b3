//! The `StorageClassProfile` kind: what ferry should know of a StorageClass that the class
//! itself does not say, in the spirit of CDI's StorageProfile. Cluster-scoped and named
//! after its class: the clone strategy its claims get by default, the volume and access
//! modes of the claims ferry makes when their template leaves them out, and the share a
//! file system takes of a volume (see [`crate::class_defaults`]).

use kube::CustomResource;

use super::endpoint::{AccessMode, VolumeMode};
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
    /// The volume mode of a claim ferry makes in this class when its template gives none
    /// (instead of Filesystem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<VolumeMode>,
    /// The access modes of a claim ferry makes in this class when its template gives none
    /// (instead of ReadWriteOnce).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4))]
    pub access_modes: Option<Vec<AccessMode>>,
    /// The share of a Filesystem volume of this class its file system takes for itself, as
    /// a fraction (`"0.055"`, CDI's default, when left out): a claim the populator fills
    /// with an image file asks for this much more than the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^0(\.[0-9]{1,6})?$"))]
    pub filesystem_overhead: Option<String>,
}

impl StorageClassProfileSpec {
    /// The file system's share, in parts per million; None when not given or not a
    /// fraction below 1 with at most 6 decimals.
    pub fn filesystem_overhead_ppm(&self) -> Option<u32> {
        let text = self.filesystem_overhead.as_deref()?;
        let decimals = match text.split_once('.') {
            None if text == "0" => "",
            Some(("0", d)) if !d.is_empty() && d.len() <= 6 => d,
            _ => return None,
        };
        if !decimals.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let padded = format!("{decimals:0<6}");
        padded.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filesystem_overhead_is_a_fraction_below_one() {
        let of = |s: &str| {
            StorageClassProfileSpec {
                filesystem_overhead: Some(s.into()),
                ..Default::default()
            }
            .filesystem_overhead_ppm()
        };
        assert_eq!(of("0.055"), Some(55_000));
        assert_eq!(of("0"), Some(0));
        assert_eq!(of("0.1"), Some(100_000));
        assert_eq!(of("0.000001"), Some(1));
        for bad in [
            "1",
            "0.",
            ".5",
            "0.0000001",
            "0.5x",
            "-0.1",
            "0,5",
            "00.1",
            "",
        ] {
            assert_eq!(of(bad), None, "{bad}");
        }
        assert_eq!(
            StorageClassProfileSpec::default().filesystem_overhead_ppm(),
            None
        );
    }
}
