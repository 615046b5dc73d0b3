//! The `Transfer` kind: copy one source into one or more targets (URLs, existing claims,
//! or claims the operator creates), with per-target status and a checkpoint that survives
//! the mover pod.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::endpoint::{Endpoint, TransferTarget};
use super::fan_out::{FanOut, FanOutStatus, GroupRelay, PvcTemplates};
use super::options::TransferOptions;
use super::settings::MoverSettings;
use super::status::{Checkpoint, Phase, Progress};
use super::storage_class_profile::CloneStrategy;
use super::validate::{check_digest, invalid, ValidationError};

/// Most targets listed in one Transfer (`pvcTemplates` generates more).
pub const MAX_TARGETS: usize = 1000;
/// Most targets one mover writes: a Transfer with more fans out over mover groups.
pub const MAX_ONE_MOVER: usize = 64;

/// Copy a disk image from `source` into every target.
// kube's printcolumn(...) entries repeat their keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "Transfer",
    namespaced,
    status = "TransferStatus",
    shortname = "ft",
    category = "ferry",
    doc = "Copies a disk image from a source (URL or PVC) into one or more targets",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Total",
        type_ = "integer",
        json_path = ".status.progress.totalBytes",
        description = "image size in bytes"
    ),
    printcolumn(
        name = "Done",
        type_ = "integer",
        json_path = ".status.progress.doneBytes",
        description = "bytes processed"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".status.node",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TransferSpec {
    /// What to read: exactly one of url or pvc.
    #[x_kube(validation = Rule::new("[has(self.url), has(self.pvc), has(self.goldenImage)].exists_one(x, x)").message("source: give exactly one of url, pvc or goldenImage"))]
    pub source: Endpoint,
    /// What to write: up to 1000 targets, each exactly one of url, pvc or pvcTemplate
    /// (with `pvcTemplates`, at least one target in all).
    #[serde(default)]
    #[schemars(length(max = 1000))]
    #[x_kube(validation = Rule::new("self.all(t, [has(t.url), has(t.pvc), has(t.pvcTemplate)].exists_one(x, x))").message("each target: give exactly one of url, pvc or pvcTemplate"))]
    pub targets: Vec<TransferTarget>,
    /// How to copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<TransferOptions>,
    /// The digest the image must have (`sha256:<hex>` or `blkhash:<hex>`); the Transfer
    /// fails when a target's digest differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(sha256|blkhash):[0-9a-f]{64}$"))]
    pub expected_digest: Option<String>,
    /// How the mover pod runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mover: Option<MoverSettings>,
    /// What becomes of the claims the `pvcTemplate` targets created when the Transfer is
    /// deleted: `Retain` (the default) keeps them, as CDI keeps an imported PVC; `Delete`
    /// deletes them with the Transfer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_retention: Option<ClaimRetention>,
    /// From a claim into new claims (`pvcTemplate` targets): `auto` (the default: a
    /// VolumeSnapshot restored into each target when the source's driver has a
    /// VolumeSnapshotClass, else a copy), `snapshot`, `csi-clone` (same storage class) or
    /// `copy`. A strategy named here that the storage cannot do fails the Transfer; the
    /// target class's StorageClassProfile gives the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_strategy: Option<CloneStrategy>,
    /// Claims to create and fill besides `targets`: `count` alike claims named
    /// `<namePrefix><index>`. A Transfer with these fans out over mover groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_templates: Option<PvcTemplates>,
    /// Split the targets over mover groups, each what one node can attach (always with
    /// `pvcTemplates` or more than 64 targets; given here, also for fewer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fan_out: Option<FanOut>,
    /// Set by the operator on the groups of a fan-out: this group serves what it writes to
    /// the others, or reads the source through another group's relay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<GroupRelay>,
}

impl TransferSpec {
    /// Every target: those listed, then the generated ones.
    pub fn all_targets(&self) -> std::borrow::Cow<'_, [TransferTarget]> {
        match &self.pvc_templates {
            None => std::borrow::Cow::Borrowed(&self.targets),
            Some(t) => {
                let mut all = self.targets.clone();
                all.extend((0..t.count).map(|i| t.target(i)));
                std::borrow::Cow::Owned(all)
            }
        }
    }

    /// The namespace of the source claim when it is not `own` (the Transfer's): a clone
    /// across namespaces.
    pub fn source_namespace(&self, own: &str) -> Option<&str> {
        self.source
            .pvc
            .as_ref()
            .and_then(|p| p.namespace.as_deref())
            .filter(|ns| *ns != own)
    }

    fn validate_cross_namespace(&self, ns: &str) -> Result<(), ValidationError> {
        let field = "spec.source.pvc.namespace";
        let label_ok = !ns.is_empty()
            && ns.len() <= 63
            && ns
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if !label_ok {
            return Err(invalid(
                field,
                &format!("'{ns}' is not a valid namespace name (lower-case letters, digits and '-', at most 63)"),
            ));
        }
        if let Some(i) = self.targets.iter().position(|t| t.pvc_template.is_none()) {
            return Err(invalid(
                &format!("spec.targets[{i}]"),
                "a Transfer from a claim in another namespace makes new claims only (pvcTemplate): the source namespace fills them and hands their volumes over",
            ));
        }
        if self.relay.is_some() {
            return Err(invalid(
                "spec.relay",
                "a Transfer from a claim in another namespace reads no relay",
            ));
        }
        Ok(())
    }

    /// How many targets in all.
    pub fn target_count(&self) -> usize {
        self.targets.len() + self.pvc_templates.as_ref().map_or(0, |t| t.count as usize)
    }

    /// Whether the targets are split over mover groups (child Transfers) rather than
    /// written by one mover.
    pub fn fans_out(&self) -> bool {
        self.pvc_templates.is_some() || self.fan_out.is_some() || self.targets.len() > MAX_ONE_MOVER
    }
}

/// What becomes of created claims when their Transfer is deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ClaimRetention {
    /// Kept: a deleted Transfer (GitOps pruning, a cleanup) never takes the disks it made.
    #[default]
    Retain,
    /// Deleted with the Transfer (the claims are owned by it).
    Delete,
}

impl TransferSpec {
    /// Checks what the schema cannot: URLs, inline passwords, option combinations,
    /// duplicate targets, the digest.
    pub fn validate(&self) -> Result<(), ValidationError> {
        // The source alone may name another namespace: checked here, the rest as for any
        // endpoint.
        let mut source = self.source.clone();
        let source_namespace = source.pvc.as_mut().and_then(|p| p.namespace.take());
        source.validate("spec.source")?;
        if self.targets.is_empty() && self.pvc_templates.is_none() {
            return Err(invalid(
                "spec.targets",
                "give at least one target (or pvcTemplates)",
            ));
        }
        if self.targets.len() > MAX_TARGETS {
            return Err(invalid(
                "spec.targets",
                &format!(
                    "at most {MAX_TARGETS} targets listed per Transfer: generate claims with pvcTemplates, or split it"
                ),
            ));
        }
        if let Some(templates) = &self.pvc_templates {
            templates.validate("spec.pvcTemplates")?;
            let listed = self.targets.iter().filter_map(|t| match t.key() {
                Some(super::endpoint::TargetKey::Pvc(name)) => Some(name),
                _ => None,
            });
            let source = self
                .source
                .pvc
                .iter()
                .filter(|p| p.namespace.is_none())
                .map(|p| p.name.clone());
            if let Some(name) = listed.chain(source).find(|n| templates.generates(n)) {
                return Err(invalid(
                    "spec.pvcTemplates.namePrefix",
                    &format!("the generated claim {name} is also the source or a listed target: choose another prefix"),
                ));
            }
        }
        if let Some(fan_out) = &self.fan_out {
            fan_out.validate("spec.fanOut")?;
        }
        if let Some(relay) = &self.relay {
            relay.validate("spec.relay")?;
            if relay.from.is_some() && self.source.pvc.is_some() {
                return Err(invalid(
                    "spec.relay.from",
                    "a source claim is read from the storage, not through a relay",
                ));
            }
        }
        // A claim of the same name in another namespace is another claim.
        let source_pvc = self
            .source
            .pvc
            .as_ref()
            .filter(|p| p.namespace.is_none())
            .map(|p| p.name.as_str());
        let mut seen = Vec::with_capacity(self.targets.len());
        for (i, target) in self.targets.iter().enumerate() {
            let field = format!("spec.targets[{i}]");
            target.validate(&field)?;
            let Some(key) = target.key() else { continue };
            if let super::endpoint::TargetKey::Pvc(name) = &key {
                if Some(name.as_str()) == source_pvc {
                    return Err(invalid(
                        &field,
                        &format!(
                            "pvc/{name} is also the source: a claim cannot be copied onto itself"
                        ),
                    ));
                }
            }
            if let Some(first) = seen.iter().position(|k| k == &key) {
                return Err(invalid(
                    &field,
                    &format!(
                        "{key} is also spec.targets[{first}]: each target must be written once"
                    ),
                ));
            }
            seen.push(key);
        }
        if let Some(options) = &self.options {
            options.validate("spec.options")?;
        }
        if let Some(digest) = &self.expected_digest {
            check_digest("spec.expectedDigest", digest)?;
        }
        if let Some(ns) = &source_namespace {
            self.validate_cross_namespace(ns)?;
        }
        Ok(())
    }
}

/// The state of one target.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetStatus {
    /// The target as `pvc/<name>` or its URL (never with credentials).
    pub name: String,
    /// Where this target's copy is.
    #[serde(default)]
    pub phase: Phase,
    /// Bytes of this target processed so far.
    #[serde(default)]
    pub done_bytes: u64,
    /// The target's digest after a verified copy (`<algorithm>:<hex>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// What went wrong with this target, and what to fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Digests the copy computed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Digests {
    /// The source's digest (`<algorithm>:<hex>`), when verified or checked against
    /// `expectedDigest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Each target's digest by target name (as in `targets[].name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<BTreeMap<String, String>>,
}

/// What the operator observed of a Transfer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransferStatus {
    /// Pending, Running, Succeeded, Failed or Cancelled.
    #[serde(default)]
    pub phase: Phase,
    /// Bytes over all targets' copy (one pass over the source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// One entry per target, in `spec.targets` order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetStatus>,
    /// Digests of the source and targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digests: Option<Digests>,
    /// Ready and Running, with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When the first mover started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the Transfer reached a final phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Mover pods started so far (1 for a copy that ran through).
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
    /// What was committed, so a replacement mover resumes instead of starting over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Checkpoint>,
    /// How the targets were made: `snapshot`, `csi-clone` or `copy` (set once decided).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_strategy: Option<String>,
    /// Why a storage clone was not used where one was asked for (by `auto` or a
    /// StorageClassProfile), as CDI's `cloneFallbackReason`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_fallback_reason: Option<String>,
    /// The VolumeSnapshot the targets are restored from (strategy `snapshot`), deleted
    /// once every target is bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_snapshot: Option<String>,
    /// A clone from another namespace: the Transfer there (`namespace/name`) that fills
    /// temporary claims whose volumes are then handed over to the targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_transfer: Option<String>,
    /// The mover groups of a Transfer that fans out (each a child Transfer) and how far
    /// they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fan_out: Option<FanOutStatus>,
    /// The claim a `goldenImage` source named as current when the Transfer started: what
    /// it reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_claim: Option<String>,
    /// The version of the source the mover read, when the source names one: a registry
    /// image's manifest digest (`sha256:...`), an HTTP object's ETag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_version: Option<String>,
    /// The relay the current mover reads the source through (`nbds://...`, a group of the
    /// same fan-out), when it does; unset while it reads the source itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_relay: Option<String>,
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::crd::endpoint::PvcTemplate;

    fn spec(targets: Vec<TransferTarget>) -> TransferSpec {
        TransferSpec {
            source: Endpoint::url("s3://images/fedora.raw"),
            targets,
            options: None,
            expected_digest: None,
            mover: None,
            claim_retention: None,
            clone_strategy: None,
            pvc_templates: None,
            fan_out: None,
            relay: None,
        }
    }

    fn to(endpoint: Endpoint) -> TransferTarget {
        TransferTarget {
            endpoint,
            pvc_template: None,
        }
    }

    fn template(name: &str) -> TransferTarget {
        TransferTarget {
            endpoint: Endpoint::default(),
            pvc_template: Some(PvcTemplate {
                name: name.into(),
                storage_class_name: Some("fast".into()),
                size: Quantity("20Gi".into()),
                volume_mode: None,
                access_modes: None,
            }),
        }
    }

    #[test]
    fn a_fan_out_passes() {
        spec(vec![
            to(Endpoint::pvc("a")),
            template("b"),
            to(Endpoint::url("nbd://h/e")),
        ])
        .validate()
        .unwrap();
    }

    #[test]
    fn zero_targets_are_refused() {
        assert_eq!(
            spec(vec![]).validate().unwrap_err().to_string(),
            "spec.targets: give at least one target (or pvcTemplates)"
        );
        let many = (0..=MAX_TARGETS)
            .map(|i| template(&format!("t{i}")))
            .collect();
        assert!(spec(many)
            .validate()
            .unwrap_err()
            .message
            .contains("at most 1000"));
    }

    #[test]
    fn duplicate_targets_are_refused() {
        let e = spec(vec![to(Endpoint::pvc("a")), template("a")])
            .validate()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "spec.targets[1]: pvc/a is also spec.targets[0]: each target must be written once"
        );
        let e = spec(vec![
            to(Endpoint::url("nbd://h/e")),
            to(Endpoint::url("nbd://h/e")),
        ])
        .validate()
        .unwrap_err();
        assert_eq!(e.field, "spec.targets[1]");
        let mut s = spec(vec![to(Endpoint::pvc("golden"))]);
        s.source = Endpoint::pvc("golden");
        assert!(s
            .validate()
            .unwrap_err()
            .message
            .contains("copied onto itself"));
    }

    #[test]
    fn only_the_source_claim_may_be_in_another_namespace() {
        let mut s = spec(vec![template("golden")]);
        s.source = Endpoint::pvc("golden");
        s.source.pvc.as_mut().unwrap().namespace = Some("images".into());
        s.validate().unwrap();
        assert_eq!(s.source_namespace("vms"), Some("images"));
        assert_eq!(s.source_namespace("images"), None);
        s.source.pvc.as_mut().unwrap().namespace = Some("Images".into());
        assert_eq!(s.validate().unwrap_err().field, "spec.source.pvc.namespace");
        s.source.pvc.as_mut().unwrap().namespace = Some("images".into());
        let mut target = to(Endpoint::pvc("disk"));
        target.endpoint.pvc.as_mut().unwrap().namespace = Some("other".into());
        s.targets = vec![template("a"), target];
        let e = s.validate().unwrap_err();
        assert_eq!(e.field, "spec.targets[1].pvc.namespace");
        assert!(e.message.contains("only a Transfer's source"), "{e}");
        s.targets = vec![template("a"), to(Endpoint::pvc("disk"))];
        let e = s.validate().unwrap_err();
        assert_eq!(e.field, "spec.targets[1]");
        assert!(e.message.contains("pvcTemplate"), "{e}");
    }

    #[test]
    fn bad_digests_are_refused() {
        let mut s = spec(vec![template("a")]);
        s.expected_digest = Some(format!("sha256:{}", "a".repeat(64)));
        s.validate().unwrap();
        s.expected_digest = Some(format!("blkhash:{}", "0".repeat(64)));
        s.validate().unwrap();
        for bad in [
            format!("md5:{}", "a".repeat(64)),
            format!("sha256:{}", "A".repeat(64)),
            format!("sha256:{}", "a".repeat(63)),
            "a".repeat(64),
        ] {
            s.expected_digest = Some(bad.clone());
            let e = s.validate().unwrap_err();
            assert_eq!(e.field, "spec.expectedDigest", "{bad}");
        }
    }

    #[test]
    fn the_source_and_options_are_checked() {
        let mut s = spec(vec![template("a")]);
        s.source = Endpoint::url("iscsi://u%secret@h/iqn.x/0");
        assert_eq!(s.validate().unwrap_err().field, "spec.source.url");
        let mut s = spec(vec![template("a")]);
        s.options = Some(TransferOptions {
            workers: Some(1000),
            ..TransferOptions::default()
        });
        assert_eq!(s.validate().unwrap_err().field, "spec.options.workers");
    }

    #[test]
    fn status_serializes_progress_as_integers() {
        let status = TransferStatus {
            phase: Phase::Running,
            progress: Some(Progress {
                total_bytes: 4 << 30,
                done_bytes: 1 << 30,
                resumed_bytes: 0,
                committed_bytes: 1 << 29,
            }),
            checkpoint: Some(Checkpoint::new(4 << 30, [(0, 1 << 29)])),
            ..TransferStatus::default()
        };
        let v = serde_json::to_value(&status).unwrap();
        assert_eq!(v["phase"], "Running");
        assert_eq!(v["progress"]["totalBytes"], 4u64 << 30);
        assert_eq!(v["progress"]["doneBytes"], 1u64 << 30);
        assert_eq!(
            v["checkpoint"]["committed"],
            serde_json::json!([[0, 1u64 << 29]])
        );
        let back: TransferStatus = serde_json::from_value(v).unwrap();
        assert_eq!(back, status);
    }
}
