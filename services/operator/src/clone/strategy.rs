//! How a Transfer from a claim into new claims is done: by the storage (a VolumeSnapshot
//! restored into each target, or a CSI clone of the source claim) or by a mover copying
//! bytes. A pure function of the Transfer and what the cluster says about its classes,
//! so that the reconciler and `ferry operator render` decide alike.
//!
//! The rules, after CDI's clone strategies: the strategy asked for is the Transfer's
//! `cloneStrategy`, else the target class's `StorageClassProfile`, else `auto`. `auto`
//! restores a snapshot when a VolumeSnapshotClass of the source's driver exists, and
//! copies otherwise. A storage clone needs what the storage can give: every target a
//! `pvcTemplate` of the source's volume mode, at least the source's size (a larger one
//! only in a class that allows expansion), the source's driver (a snapshot) or class (a
//! CSI clone); and nothing only bytes through ferry can do (verification, an expected
//! digest, an image file at another path, a format to convert). When it cannot be had, a
//! strategy the Transfer insists on fails it; one from `auto` or a profile falls back
//! to a copy, and the status says why (CDI's `cloneFallbackReason`).

use serde::{Deserialize, Serialize};

use crate::crd::{CloneStrategy, ImageFormat, Transfer, VolumeMode};

/// A claim as the strategy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimFacts {
    /// Its storage class (after the cluster's default for a claim that names none).
    pub class: Option<String>,
    /// Filesystem or Block.
    pub mode: VolumeMode,
    /// Its size in bytes (a bound claim's capacity, else its request).
    pub bytes: Option<u64>,
    /// Not bound, in a class that binds at the first consumer: nothing but a pod using it
    /// (a copy's mover) ever gives it a volume, so the storage cannot clone it.
    pub unbound_until_used: bool,
}

/// A StorageClass as the strategy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassFacts {
    /// The class's name.
    pub name: String,
    /// Its provisioner (the CSI driver).
    pub provisioner: String,
    /// `allowVolumeExpansion`.
    pub expands: bool,
    /// The `StorageClassProfile` of the same name: its clone strategy.
    pub profile_strategy: Option<CloneStrategy>,
    /// Whether its claims bind at their first consumer (`WaitForFirstConsumer`).
    pub binds_when_used: bool,
}

/// A VolumeSnapshotClass as the strategy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotClassFacts {
    /// The class's name.
    pub name: String,
    /// Its driver.
    pub driver: String,
    /// Annotated `snapshot.storage.kubernetes.io/is-default-class: "true"`.
    pub default: bool,
}

/// What the cluster says, for one Transfer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// The source claim.
    pub source: Option<ClaimFacts>,
    /// The storage classes.
    pub classes: Vec<ClassFacts>,
    /// The VolumeSnapshotClasses.
    pub snapshot_classes: Vec<SnapshotClassFacts>,
    /// The cluster's default storage class.
    pub default_class: Option<String>,
}

/// How the Transfer is done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// One VolumeSnapshot of the source in this class, restored into every target.
    Snapshot {
        /// The VolumeSnapshotClass.
        class: String,
    },
    /// Every target a CSI clone of the source claim.
    CsiClone,
    /// A mover copies the bytes; `fallback` says why a storage clone was not used when
    /// one was asked for (by `auto` or a profile).
    Copy {
        /// Why not a storage clone.
        fallback: Option<String>,
    },
    /// The strategy the Transfer insists on cannot be had: why.
    Refused(String),
}

impl Decision {
    /// The strategy's name in the status.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Snapshot { .. } => "snapshot",
            Self::CsiClone => "csi-clone",
            Self::Copy { .. } | Self::Refused(_) => "copy",
        }
    }
}

/// Decides how `transfer` is done. Only a Transfer whose source is a claim can be cloned;
/// for any other the answer is a copy, without a fallback reason.
pub fn decide(transfer: &Transfer, facts: &Facts) -> Decision {
    let spec = &transfer.spec;
    let Some(source_ref) = &spec.source.pvc else {
        return Decision::Copy { fallback: None };
    };
    let Some(source) = &facts.source else {
        // The claim is not there yet; the copy path waits for it and says so.
        return Decision::Copy { fallback: None };
    };
    let source_class = source.class.as_deref().and_then(|c| class(facts, c));
    let all = spec.all_targets();
    let target_class = all
        .iter()
        .find_map(|t| t.pvc_template.as_ref())
        .and_then(|t| t.storage_class_name.clone().or(facts.default_class.clone()))
        .and_then(|c| class(facts, &c));
    let insisted = spec.clone_strategy.filter(|s| *s != CloneStrategy::Auto);
    let asked = insisted
        .or(target_class.and_then(|c| c.profile_strategy))
        .unwrap_or(CloneStrategy::Auto);
    let fall_back = |why: String| match insisted {
        Some(s) => Decision::Refused(format!(
            "cloneStrategy {} cannot be used: {why}; use cloneStrategy auto or copy",
            s.as_str()
        )),
        None => Decision::Copy {
            fallback: Some(why),
        },
    };
    if asked == CloneStrategy::Copy {
        return Decision::Copy { fallback: None };
    }
    let needs_bytes = if spec.options.as_ref().and_then(|o| o.verify) == Some(true) {
        Some("verify asks for a copy through ferry".to_string())
    } else if spec.expected_digest.is_some() {
        Some("expectedDigest asks for a copy through ferry".to_string())
    } else if source_ref.path.is_some() && source.mode == VolumeMode::Filesystem {
        Some("the source's image is at a path of its own; a clone copies the whole volume".into())
    } else if !matches!(
        spec.source.format,
        None | Some(ImageFormat::Auto | ImageFormat::Raw)
    ) {
        Some("the source's format is converted to raw, which only a copy does".into())
    } else {
        None
    };
    if let Some(why) = needs_bytes {
        return fall_back(why);
    }
    if source.unbound_until_used {
        return fall_back(
            "the source claim is not bound and its class binds at the first consumer: only a copy's mover gives it a volume".into(),
        );
    }
    let Some(source_class) = source_class else {
        return fall_back(match &source.class {
            Some(c) => format!("the source's storage class {c} does not exist"),
            None => "the source claim has no storage class".to_string(),
        });
    };
    for target in all.iter() {
        let Some(t) = &target.pvc_template else {
            return fall_back(format!(
                "target {} is not a pvcTemplate: only a new claim can be a clone",
                target.key().map_or_else(String::new, |k| k.to_string())
            ));
        };
        if t.mode() != source.mode {
            return fall_back(format!(
                "pvc/{} is {} and the source {}: a clone keeps the volume mode",
                t.name,
                t.mode().as_str(),
                source.mode.as_str()
            ));
        }
        let class_name = t.storage_class_name.clone().or(facts.default_class.clone());
        let Some(class) = class_name.as_deref().and_then(|c| class(facts, c)) else {
            return fall_back(format!(
                "pvc/{}'s storage class {} does not exist",
                t.name,
                class_name.as_deref().unwrap_or("(the default: none)")
            ));
        };
        if class.binds_when_used && for_another_namespace(transfer) {
            // CDI binds such a claim with a throw-away pod on the node of the target's
            // consumer, which a populator knows; a Transfer's targets have no consumer
            // yet, and a volume bound to a node chosen here would tie the VM to it.
            return fall_back(format!(
                "pvc/{}'s storage class {} binds at its first consumer (WaitForFirstConsumer): a storage clone for another namespace is made in temporary claims that no pod uses, so it would never be provisioned; a copy's mover is their consumer",
                t.name, class.name
            ));
        }
        if class.provisioner != source_class.provisioner {
            return fall_back(format!(
                "pvc/{} is of driver {} and the source of {}: storage clones stay with one driver",
                t.name, class.provisioner, source_class.provisioner
            ));
        }
        let size =
            crate::crd::validate::quantity_bytes(&t.size).map(|b| b.min(u64::MAX as u128) as u64);
        match (size, source.bytes) {
            (Some(t_bytes), Some(s_bytes)) if t_bytes < s_bytes => {
                return fall_back(format!(
                    "pvc/{} ({t_bytes} bytes) is smaller than the source ({s_bytes} bytes)",
                    t.name
                ))
            }
            (Some(t_bytes), Some(s_bytes)) if t_bytes > s_bytes && !class.expands => {
                return fall_back(format!(
                    "pvc/{} is larger than the source and storage class {} does not allow volume expansion",
                    t.name, class.name
                ))
            }
            _ => {}
        }
        if asked == CloneStrategy::CsiClone && class.name != source_class.name {
            return fall_back(format!(
                "pvc/{} is of storage class {} and the source of {}: a CSI clone stays in one class",
                t.name, class.name, source_class.name
            ));
        }
    }
    if asked == CloneStrategy::CsiClone {
        return Decision::CsiClone;
    }
    match snapshot_class(facts, &source_class.provisioner) {
        Some(class) => Decision::Snapshot { class },
        None => fall_back(format!(
            "no VolumeSnapshotClass of driver {}",
            source_class.provisioner
        )),
    }
}

/// Whether `transfer` is the child of a clone from another namespace
/// ([`super::cross::child_transfer`]): it fills temporary claims to be handed over.
fn for_another_namespace(transfer: &Transfer) -> bool {
    transfer
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(super::cross::CLONE_OF))
}

fn class<'a>(facts: &'a Facts, name: &str) -> Option<&'a ClassFacts> {
    facts.classes.iter().find(|c| c.name == name)
}

/// The VolumeSnapshotClass of `driver`: the one marked default, else the first by name.
fn snapshot_class(facts: &Facts, driver: &str) -> Option<String> {
    let mut of_driver: Vec<&SnapshotClassFacts> = facts
        .snapshot_classes
        .iter()
        .filter(|c| c.driver == driver)
        .collect();
    of_driver.sort_by(|a, b| b.default.cmp(&a.default).then(a.name.cmp(&b.name)));
    of_driver.first().map(|c| c.name.clone())
}
