//! The PersistentVolume controller with a CSI provisioner behind every StorageClass:
//!
//! - a claim of an `Immediate` class is provisioned at once: a PersistentVolume
//!   `pvc-<claim uid>` of the requested size, modes and the class's provisioner as its
//!   CSI driver, bound both ways (`spec.volumeName`, `claimRef`, phase Bound);
//! - a claim of a `WaitForFirstConsumer` class waits (Event `WaitForFirstConsumer`) until
//!   it carries `volume.kubernetes.io/selected-node` (the scheduler sets it for the first
//!   pod using it, a populator may set it itself); its volume is then provisioned with a
//!   node affinity to that node, as topology-constrained drivers (local-path, LVM) do;
//! - a claim naming a volume (`spec.volumeName`) binds to it when it is free;
//! - a claim whose `dataSourceRef` names a kind other than a claim or a VolumeSnapshot is
//!   left alone: a volume populator provisions it;
//! - a claim with no class and no default class, or naming a missing class, waits with
//!   the Event a real cluster writes (`FailedBinding`, `ProvisioningFailed`);
//! - the pvc-protection finalizer (added when a claim is created, while this controller
//!   runs) is removed once the claim is deleted and no pod that has not ended uses it;
//! - the volume of a deleted claim is deleted (`reclaimPolicy: Delete`, the default) or
//!   Released (`Retain`); so is a volume whose `claimRef` is set to a claim (by uid) that
//!   is gone, and a Released volume whose policy is changed to Delete is deleted; a
//!   volume reserved for a claim by name only (no uid in its `claimRef`) waits for that
//!   claim, as the PersistentVolume controller's pre-bound volumes do.
//!
//! Not simulated: capacity, resizing, snapshots and clones as data sources (bound like an
//! empty claim), access-mode checks against the driver.

use serde_json::{json, Value};

use super::events;
use super::{is_terminal, pod_claims};
use crate::kube::state::State;
use crate::kube::store::Key;

/// The annotation the scheduler sets on a WaitForFirstConsumer claim.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The finalizer that keeps a claim in use from going.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The annotation of the default StorageClass.
pub const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
/// The node label a provisioned volume's node affinity names.
pub const HOSTNAME: &str = "kubernetes.io/hostname";

const COMPONENT: &str = "persistentvolume-controller";

/// The StorageClass a claim uses (its own, or the default).
pub fn class_of(state: &State, pvc: &Value) -> Option<Value> {
    match pvc["spec"]["storageClassName"].as_str() {
        Some("") => None,
        Some(name) => state
            .store
            .get(&Key::new("storage.k8s.io", "storageclasses", "", name))
            .cloned(),
        None => state
            .store
            .list("storage.k8s.io", "storageclasses", None)
            .map(|(_, c)| c)
            .find(|c| c["metadata"]["annotations"][DEFAULT_CLASS] == "true")
            .cloned(),
    }
}

/// Whether a class binds when the first pod is scheduled.
pub fn waits_for_consumer(class: &Value) -> bool {
    class["volumeBindingMode"] == "WaitForFirstConsumer"
}

fn populated_by_someone_else(pvc: &Value) -> bool {
    let source = &pvc["spec"]["dataSourceRef"];
    if !source.is_object() {
        return false;
    }
    let group = source["apiGroup"].as_str().unwrap_or_default();
    let kind = source["kind"].as_str().unwrap_or_default();
    !matches!(
        (group, kind),
        ("", "PersistentVolumeClaim") | ("snapshot.storage.k8s.io", "VolumeSnapshot")
    )
}

/// One pass over claims and volumes.
pub fn pass(state: &mut State) {
    let unsettled = |pvc: &Value| {
        pvc["metadata"]["deletionTimestamp"].is_string() || pvc["status"]["phase"] != "Bound"
    };
    for (key, pvc) in state.objects_where("", "persistentvolumeclaims", unsettled) {
        if pvc["metadata"]["deletionTimestamp"].is_string() {
            release_protection(state, &key, &pvc);
            continue;
        }
        if pvc["status"]["phase"] == "Bound" {
            continue;
        }
        bind(state, &key, &pvc);
    }
    reclaim(state);
}

fn release_protection(state: &mut State, key: &Key, pvc: &Value) {
    let name = key.name.as_str();
    let used = state
        .store
        .list("", "pods", Some(&key.namespace))
        .any(|(_, p)| !is_terminal(p) && pod_claims(p).iter().any(|c| c == name));
    if used {
        return;
    }
    let mut next = pvc.clone();
    if let Some(f) = next["metadata"]["finalizers"].as_array_mut() {
        f.retain(|f| f != PVC_PROTECTION);
    }
    state.replace(key, next);
}

fn bind(state: &mut State, key: &Key, pvc: &Value) {
    if let Some(volume) = pvc["spec"]["volumeName"].as_str() {
        let pv_key = Key::new("", "persistentvolumes", "", volume);
        if let Some(pv) = state.store.get(&pv_key).cloned() {
            let free = !pv["spec"]["claimRef"].is_object()
                || pv["spec"]["claimRef"]["uid"] == pvc["metadata"]["uid"]
                || (pv["spec"]["claimRef"]["name"] == key.name.as_str()
                    && pv["spec"]["claimRef"]["namespace"] == key.namespace.as_str());
            if free {
                bind_both(state, key, pvc, &pv_key, pv);
            }
        }
        return;
    }
    if populated_by_someone_else(pvc) {
        return;
    }
    let Some(class) = class_of(state, pvc) else {
        let why = match pvc["spec"]["storageClassName"].as_str() {
            Some(name) if !name.is_empty() => (
                "ProvisioningFailed",
                format!("storageclass.storage.k8s.io \"{name}\" not found"),
            ),
            _ => (
                "FailedBinding",
                "no persistent volumes available for this claim and no storage class is set"
                    .to_string(),
            ),
        };
        events::record(state, pvc, true, why.0, &why.1, COMPONENT);
        return;
    };
    let node = pvc["metadata"]["annotations"][SELECTED_NODE]
        .as_str()
        .map(String::from);
    if waits_for_consumer(&class) && node.is_none() {
        events::record(
            state,
            pvc,
            false,
            "WaitForFirstConsumer",
            "waiting for first consumer to be created before binding",
            COMPONENT,
        );
        return;
    }
    let node = if waits_for_consumer(&class) {
        node
    } else {
        None
    };
    let driver = class["provisioner"]
        .as_str()
        .unwrap_or("csi.example.com")
        .to_string();
    let uid = pvc["metadata"]["uid"].as_str().unwrap_or_default();
    let pv_name = format!("pvc-{uid}");
    let mut pv = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "annotations": {"pv.kubernetes.io/provisioned-by": driver},
                     "finalizers": ["kubernetes.io/pv-protection"]},
        "spec": {
            "capacity": {"storage": pvc["spec"]["resources"]["requests"]["storage"].as_str().unwrap_or("1Gi")},
            "accessModes": pvc["spec"]["accessModes"].clone(),
            "volumeMode": pvc["spec"]["volumeMode"].as_str().unwrap_or("Filesystem"),
            "persistentVolumeReclaimPolicy": class["reclaimPolicy"].as_str().unwrap_or("Delete"),
            "storageClassName": class["metadata"]["name"],
            "csi": {"driver": driver, "volumeHandle": uid},
        },
    });
    if let Some(node) = &node {
        pv["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": HOSTNAME, "operator": "In", "values": [node]}]}]}});
    }
    let pv_key = Key::new("", "persistentvolumes", "", &pv_name);
    let pv = match state.store.get(&pv_key) {
        Some(existing) => existing.clone(),
        None => match state.create_object(pv) {
            Ok(pv) => pv,
            Err(_) => return,
        },
    };
    events::record(
        state,
        pvc,
        false,
        "ProvisioningSucceeded",
        &format!("Successfully provisioned volume {pv_name}"),
        &driver,
    );
    bind_both(state, key, pvc, &pv_key, pv);
}

fn bind_both(state: &mut State, key: &Key, pvc: &Value, pv_key: &Key, mut pv: Value) {
    pv["spec"]["claimRef"] = json!({
        "kind": "PersistentVolumeClaim", "apiVersion": "v1",
        "namespace": key.namespace, "name": key.name, "uid": pvc["metadata"]["uid"],
    });
    pv["status"] = json!({"phase": "Bound"});
    let pv = state.replace(pv_key, pv);
    let mut next = pvc.clone();
    next["spec"]["volumeName"] = pv["metadata"]["name"].clone();
    let annotations = &mut next["metadata"]["annotations"];
    if !annotations.is_object() {
        *annotations = json!({});
    }
    annotations["pv.kubernetes.io/bind-completed"] = json!("yes");
    annotations["pv.kubernetes.io/bound-by-controller"] = json!("yes");
    next["status"] = json!({
        "phase": "Bound",
        "accessModes": pv["spec"]["accessModes"],
        "capacity": pv["spec"]["capacity"],
    });
    state.replace(key, next);
}

fn reclaim(state: &mut State) {
    // Every volume when a claim went; else only the volumes written since the last look.
    let written = state.store.take_volumes_written();
    let removed = state.store.removed("persistentvolumeclaims");
    let keys: Vec<Key> = if removed != state.claims_removed_seen {
        state.claims_removed_seen = removed;
        state
            .store
            .list("", "persistentvolumes", None)
            .map(|(k, _)| k.clone())
            .collect()
    } else {
        written.into_iter().collect()
    };
    for key in keys {
        let Some(pv) = state.store.get(&key) else {
            continue;
        };
        if pv["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let released = pv["status"]["phase"] == "Released";
        if !released && !claim_gone(state, pv) {
            continue;
        }
        if pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain" {
            if !released {
                let mut next = pv.clone();
                next["status"] = json!({"phase": "Released"});
                state.replace(&key, next);
            }
        } else {
            let mut gone = pv.clone();
            gone["metadata"]["finalizers"] = json!([]);
            gone["metadata"]["deletionTimestamp"] = json!(crate::kube::state::now());
            state.replace(&key, gone);
        }
    }
}

/// Whether a bound volume's claim (named with its uid) is gone, or is another claim of
/// that name now.
fn claim_gone(state: &State, pv: &Value) -> bool {
    let claim = &pv["spec"]["claimRef"];
    let Some(uid) = claim["uid"].as_str().filter(|u| !u.is_empty()) else {
        return false;
    };
    let claim_key = Key::new(
        "",
        "persistentvolumeclaims",
        claim["namespace"].as_str().unwrap_or_default(),
        claim["name"].as_str().unwrap_or_default(),
    );
    !state
        .store
        .get(&claim_key)
        .is_some_and(|c| c["metadata"]["uid"] == uid)
}
