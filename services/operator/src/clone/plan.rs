//! The steps of a storage clone, as pure functions of the Transfer, its decided strategy
//! and what the cluster shows: the VolumeSnapshot of the source (strategy `snapshot`),
//! each target claim with its data source, and where the Transfer stands. The reconciler
//! ([`super::reconcile`]) and `ferry operator render` build the same objects.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, TypedLocalObjectReference};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::DynamicObject;
use kube::Resource;
use serde_json::json;

use crate::controller::claims::{created_by, from_template};
use crate::controller::kind::Ids;
use crate::crd::validate::restore_request;
use crate::crd::{PvcTemplate, Transfer};
use crate::mover::pod::labels;
use crate::schedule::build::{volume_snapshot_api, SnapshotState};

use super::strategy::Decision;

/// Longest object name.
const MAX_NAME: usize = 253;

/// The VolumeSnapshot a Transfer's targets are restored from: `<transfer>-clone`.
pub fn snapshot_name(transfer: &str) -> String {
    let keep = MAX_NAME - "-clone".len();
    format!("{}-clone", &transfer[..keep.min(transfer.len())])
}

/// The VolumeSnapshot of the Transfer's source claim in `class`, owned by the Transfer
/// (so it goes with it) and labelled with its uid.
pub fn volume_snapshot(transfer: &Transfer, ids: &Ids, class: &str) -> DynamicObject {
    let source = transfer
        .spec
        .source
        .pvc
        .as_ref()
        .map(|p| p.name.clone())
        .unwrap_or_default();
    let mut object = DynamicObject::new(&snapshot_name(&ids.name), &volume_snapshot_api());
    object.metadata.namespace = Some(ids.namespace.clone());
    object.metadata.labels = Some(BTreeMap::from([
        (labels::MANAGED_BY.to_string(), "ferry-operator".to_string()),
        (labels::OWNER_UID.to_string(), ids.uid.clone()),
    ]));
    object.metadata.owner_references = transfer.controller_owner_ref(&()).map(|r| vec![r]);
    let mut spec = json!({"source": {"persistentVolumeClaimName": source}});
    if !class.is_empty() {
        spec["volumeSnapshotClassName"] = json!(class);
    }
    object.data = json!({ "spec": spec });
    object
}

/// The claim of a `pvcTemplate` target made by the storage: from the snapshot (at least
/// its `restoreSize`) or as a CSI clone of the source claim.
pub fn target_claim(
    transfer: &Transfer,
    ids: &Ids,
    template: &PvcTemplate,
    decision: &Decision,
    restore_size: Option<&Quantity>,
) -> PersistentVolumeClaim {
    let retention = transfer.spec.claim_retention.unwrap_or_default();
    let mut pvc = from_template(transfer, ids, template, retention);
    let spec = pvc.spec.get_or_insert_with(Default::default);
    spec.data_source = Some(match decision {
        Decision::Snapshot { .. } => TypedLocalObjectReference {
            api_group: Some("snapshot.storage.k8s.io".into()),
            kind: "VolumeSnapshot".into(),
            name: snapshot_name(&ids.name),
        },
        _ => TypedLocalObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".into(),
            name: transfer
                .spec
                .source
                .pvc
                .as_ref()
                .map(|p| p.name.clone())
                .unwrap_or_default(),
        },
    });
    if let Some(requests) = spec.resources.as_mut().and_then(|r| r.requests.as_mut()) {
        requests.insert(
            "storage".to_string(),
            restore_request(&template.size, restore_size),
        );
    }
    pvc
}

/// What the cluster shows of a clone in progress.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// The VolumeSnapshot (strategy `snapshot`): None when it does not exist.
    pub snapshot: Option<SnapshotState>,
    /// Each target's claim by name, when it exists.
    pub targets: BTreeMap<String, PersistentVolumeClaim>,
    /// The storage classes that bind at the first consumer (WaitForFirstConsumer).
    pub wait_for_consumer: Vec<String>,
}

/// The next step of a clone.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Create the VolumeSnapshot of the source.
    Snapshot(Box<DynamicObject>),
    /// Create these target claims.
    Claims(Vec<PersistentVolumeClaim>),
    /// Nothing to create; not done yet: the Running condition's reason and message.
    Wait {
        /// Reason.
        reason: &'static str,
        /// Message.
        message: String,
    },
    /// A claim of a target's name exists and was not made by this Transfer.
    Conflict(String),
    /// Every target is bound: the snapshot (if any) can go.
    Done(String),
}

/// Reason while the snapshot is not ready.
pub const SNAPSHOT_PENDING: &str = "SnapshotPending";
/// Reason while targets wait for a pod to use them (WaitForFirstConsumer).
pub const WAITING_FOR_FIRST_CONSUMER: &str = "WaitingForFirstConsumer";
/// Reason while the storage provisions the targets.
pub const PROVISIONING: &str = "Provisioning";

/// The next step of the Transfer's clone by `decision` (a snapshot or a CSI clone).
pub fn next(transfer: &Transfer, ids: &Ids, decision: &Decision, observed: &Observed) -> Step {
    let mut restore_size = None;
    if let Decision::Snapshot { class } = decision {
        match &observed.snapshot {
            None => return Step::Snapshot(Box::new(volume_snapshot(transfer, ids, class))),
            Some(SnapshotState::Pending(error)) => {
                let name = snapshot_name(&ids.name);
                return Step::Wait {
                    reason: SNAPSHOT_PENDING,
                    message: match error {
                        Some(e) => format!("VolumeSnapshot {name} is not ready: {e}"),
                        None => format!("waiting for VolumeSnapshot {name} to be ready"),
                    },
                };
            }
            Some(SnapshotState::Ready(size)) => restore_size = size.clone(),
        }
    }
    let all = transfer.spec.all_targets();
    let templates: Vec<&PvcTemplate> = all.iter().filter_map(|t| t.pvc_template.as_ref()).collect();
    let mut missing = Vec::new();
    let (mut unbound, mut waiting) = (Vec::new(), Vec::new());
    for t in &templates {
        match observed.targets.get(&t.name) {
            None => missing.push(target_claim(
                transfer,
                ids,
                t,
                decision,
                restore_size.as_ref(),
            )),
            Some(pvc) if !created_by(pvc, &ids.uid) => {
                return Step::Conflict(format!(
                    "pvc/{} already exists and was not created by this Transfer: choose another pvcTemplate name",
                    t.name
                ))
            }
            Some(pvc) => {
                let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
                let class = pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone());
                if bound {
                    continue;
                }
                if class.is_some_and(|c| observed.wait_for_consumer.contains(&c)) {
                    waiting.push(format!("pvc/{}", t.name));
                } else {
                    unbound.push(format!("pvc/{}", t.name));
                }
            }
        }
    }
    if !missing.is_empty() {
        return Step::Claims(missing);
    }
    let how = match decision {
        Decision::Snapshot { .. } => {
            format!("restored from VolumeSnapshot {}", snapshot_name(&ids.name))
        }
        _ => "cloned by the storage".to_string(),
    };
    if !unbound.is_empty() {
        return Step::Wait {
            reason: PROVISIONING,
            message: format!("{} being {how}", unbound.join(", ")),
        };
    }
    if !waiting.is_empty() {
        return Step::Wait {
            reason: WAITING_FOR_FIRST_CONSUMER,
            message: format!(
                "{} will be {how} when a pod uses it (WaitForFirstConsumer)",
                waiting.join(", ")
            ),
        };
    }
    Step::Done(format!("{} claims {how}", templates.len()))
}
