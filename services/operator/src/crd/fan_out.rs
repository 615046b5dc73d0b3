//! A Transfer into more targets than one mover can attach: the target generator
//! (`pvcTemplates`, thousands of claims without listing them), how targets are split into
//! mover groups (`fanOut`), and the summary of the groups the Transfer's status keeps. Each
//! group is a child Transfer whose own status holds its targets' states, so no object
//! grows with the number of targets (etcd refuses objects over 1.5 MiB).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::endpoint::{AccessMode, PvcTemplate, TransferTarget, VolumeMode};
use super::status::Phase;
use super::validate::{check_quantity, invalid, ValidationError};

/// Most claims one `pvcTemplates` generates.
pub const MAX_GENERATED: u32 = 100_000;
/// Most targets of one mover group (the mover's job takes at most 64 targets).
pub const MAX_GROUP: u32 = 64;

/// `count` claims named `<namePrefix><index>` (index from 0), all alike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PvcTemplates {
    /// The claims' names are this prefix followed by their index (0, 1, ...).
    #[schemars(length(min = 1, max = 200))]
    pub name_prefix: String,
    /// How many claims.
    #[schemars(range(min = 1, max = 100000))]
    pub count: u32,
    /// Storage class (default: the cluster's default class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Requested size of each; at least the image size.
    pub size: Quantity,
    /// Filesystem (the image is `disk.img` in it) or Block (default Filesystem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<VolumeMode>,
    /// Access modes (default ReadWriteOnce).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4))]
    pub access_modes: Option<Vec<AccessMode>>,
}

impl PvcTemplates {
    /// The claim name of generated target `index`.
    pub fn name(&self, index: u32) -> String {
        format!("{}{index}", self.name_prefix)
    }

    /// Whether `name` is one of the generated claims.
    pub fn generates(&self, name: &str) -> bool {
        let Some(index) = name.strip_prefix(&self.name_prefix) else {
            return false;
        };
        let canonical = !index.is_empty()
            && index.bytes().all(|b| b.is_ascii_digit())
            && (index == "0" || !index.starts_with('0'));
        canonical && index.parse::<u32>().is_ok_and(|i| i < self.count)
    }

    /// Generated target `index` as a `pvcTemplate` target.
    pub fn target(&self, index: u32) -> TransferTarget {
        TransferTarget {
            endpoint: Default::default(),
            pvc_template: Some(PvcTemplate {
                name: self.name(index),
                storage_class_name: self.storage_class_name.clone(),
                size: self.size.clone(),
                volume_mode: self.volume_mode,
                access_modes: self.access_modes.clone(),
            }),
        }
    }

    pub(crate) fn validate(&self, field: &str) -> Result<(), ValidationError> {
        if self.count == 0 || self.count > MAX_GENERATED {
            return Err(invalid(
                &format!("{field}.count"),
                &format!("give 1 to {MAX_GENERATED} claims"),
            ));
        }
        // The longest generated name must be a valid claim name.
        let longest = self.name(self.count - 1);
        let first = PvcTemplate {
            name: longest,
            storage_class_name: None,
            size: self.size.clone(),
            volume_mode: None,
            access_modes: None,
        };
        let target = TransferTarget {
            endpoint: Default::default(),
            pvc_template: Some(first),
        };
        target
            .validate(field)
            .map_err(|e| invalid(&format!("{field}.namePrefix"), &e.message))?;
        check_quantity(&format!("{field}.size"), &self.size)
    }
}

/// How targets are split into mover groups.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FanOut {
    /// Most targets one mover writes (default and at most 64; a group is also at most what
    /// its node can still attach).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub max_targets_per_mover: Option<u32>,
    /// Read the source once (default true): the first group's mover serves what it writes
    /// to the other groups' movers over NBD (mutual TLS with the movers' certificates, port
    /// 10810), so the source serves about one image's bytes however many groups there are.
    /// A source claim is never relayed (each group reads it from the storage); `false`:
    /// every group reads the source itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<bool>,
}

/// A fan-out group's part in reading the source once, set by the operator on the child
/// Transfers of a fan-out: the groups form a tree of relays, each reading its parent's and
/// serving its own readers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupRelay {
    /// Serve the image this Transfer writes into its first claim target to the movers of
    /// the same fan-out while it is written (and for a while after).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub serve: bool,
    /// Read the source through the relay of this Transfer (a group of the same fan-out)
    /// while its mover serves; from the source itself once that Transfer has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub from: Option<String>,
}

impl GroupRelay {
    pub(crate) fn validate(&self, field: &str) -> Result<(), ValidationError> {
        if self.from.is_none() && !self.serve {
            return Err(invalid(field, "give serve: true, from, or both"));
        }
        Ok(())
    }
}

impl FanOut {
    pub(crate) fn validate(&self, field: &str) -> Result<(), ValidationError> {
        match self.max_targets_per_mover {
            Some(n) if n == 0 || n > MAX_GROUP => Err(invalid(
                &format!("{field}.maxTargetsPerMover"),
                &format!("give 1 to {MAX_GROUP}"),
            )),
            _ => Ok(()),
        }
    }
}

/// One mover group: a child Transfer writing some of the targets on one node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupStatus {
    /// The child Transfer.
    pub name: String,
    /// The node its mover is placed on (none: the scheduler places it, for targets whose
    /// volumes decide their node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Its targets as `[first, end)` index ranges over the Transfer's targets (`targets`
    /// first, then the generated ones).
    pub targets: Vec<[u32; 2]>,
    /// The child's phase.
    #[serde(default)]
    pub phase: Phase,
}

impl GroupStatus {
    /// How many targets the group writes.
    pub fn count(&self) -> u32 {
        self.targets.iter().map(|[a, b]| b - a).sum()
    }

    /// Its target indices in order.
    pub fn indices(&self) -> impl Iterator<Item = u32> + '_ {
        self.targets.iter().flat_map(|&[a, b]| a..b)
    }
}

/// The groups of a Transfer that fans out, and how far they are.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FanOutStatus {
    /// Every group, planned once; each group's targets' states are in its child's status.
    pub groups: Vec<GroupStatus>,
    /// Targets in all.
    pub targets: u32,
    /// Targets written (and verified, when asked).
    pub targets_succeeded: u32,
    /// Targets that failed.
    pub targets_failed: u32,
    /// Groups whose mover is running.
    pub groups_running: u32,
    /// Groups done.
    pub groups_succeeded: u32,
    /// Groups failed or cancelled.
    pub groups_failed: u32,
}
