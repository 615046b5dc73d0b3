//! The attach/detach controller and the kubelet of every node:
//!
//! - a pod on a node (scheduled, or given `spec.nodeName`) waits until every claim it
//!   names is Bound; each CSI volume is then attached to the node (a VolumeAttachment,
//!   `attached: true`), unless it attaches to one node at a time (not ReadWriteMany or
//!   ReadOnlyMany) and is attached to another node that still uses it: the pod stays
//!   Pending with a `FailedAttachVolume` Event "Multi-Attach error for volume ...", as on a
//!   real cluster; or the node's CSINode allows no more attachments of that driver: a
//!   `FailedAttachVolume` Event saying the node reached its limit;
//! - once attached (and after [`super::Sims::pod_start`], the time an image pull and a
//!   container start take), the pod runs: phase Running, a pod IP, its containers running and
//!   ready, conditions Initialized/ContainersReady/Ready True;
//! - it ends when the test says so ([`exit`]): Succeeded for exit code 0, else Failed,
//!   with each container terminated;
//! - a deleted pod on a node goes once "stopped" (on the next pass);
//! - volumes no pod on a node uses any more are detached (the VolumeAttachment removed).
//!
//! Not simulated: images, probes, restarts, init containers, mounts (no fsGroup or
//! permissions), resource limits, eviction, node failure.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use super::scheduler::set_condition;
use super::{events, is_terminal, pod_claims};
use crate::kube::state::{now, State};
use crate::kube::store::Key;

const ATTACHER: &str = "attachdetach-controller";
const KUBELET: &str = "kubelet";

fn single_node(pv: &Value) -> bool {
    !pv["spec"]["accessModes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m == "ReadWriteMany" || m == "ReadOnlyMany")
}

/// The volumes of a pod: (claim, volume), for the claims that are bound.
fn volumes(state: &State, namespace: &str, pod: &Value) -> Option<Vec<Value>> {
    let mut out = Vec::new();
    for claim in pod_claims(pod) {
        let pvc = state
            .store
            .get(&Key::new("", "persistentvolumeclaims", namespace, &claim))?;
        if pvc["status"]["phase"] != "Bound" {
            return None;
        }
        let pv = state.store.get(&Key::new(
            "",
            "persistentvolumes",
            "",
            pvc["spec"]["volumeName"].as_str()?,
        ))?;
        out.push(pv.clone());
    }
    Some(out)
}

fn attachments(state: &State) -> Vec<(Key, Value)> {
    state.objects("storage.k8s.io", "volumeattachments")
}

/// The pods (not ended) on `node` using the volume `pv`.
fn users_on(state: &State, node: &str, pv: &str) -> Vec<String> {
    state
        .store
        .list("", "pods", None)
        .filter(|(_, p)| p["spec"]["nodeName"] == node && !is_terminal(p))
        .filter(|(k, p)| {
            pod_claims(p).iter().any(|c| {
                state
                    .store
                    .get(&Key::new("", "persistentvolumeclaims", &k.namespace, c))
                    .is_some_and(|pvc| pvc["spec"]["volumeName"] == pv)
            })
        })
        .map(|(k, _)| k.name.clone())
        .collect()
}

/// One pass: stop deleted pods, start pods whose volumes attach, detach unused volumes.
pub fn pass(state: &mut State) {
    let to_act_on = |pod: &Value| {
        pod["spec"]["nodeName"].is_string()
            && (pod["metadata"]["deletionTimestamp"].is_string()
                || pod["status"]["phase"] == "Pending")
    };
    for (key, pod) in state.objects_where("", "pods", to_act_on) {
        let Some(node) = pod["spec"]["nodeName"].as_str().map(String::from) else {
            continue;
        };
        if pod["metadata"]["deletionTimestamp"].is_string() {
            if pod["metadata"]["finalizers"]
                .as_array()
                .is_none_or(|f| f.is_empty())
            {
                state.remove(&key);
            }
            continue;
        }
        if pod["status"]["phase"] == "Pending" {
            start(state, &key, &pod, &node);
        }
    }
    detach(state);
}

fn start(state: &mut State, key: &Key, pod: &Value, node: &str) {
    let Some(volumes) = volumes(state, &key.namespace, pod) else {
        return;
    };
    let vas = attachments(state);
    for pv in &volumes {
        let Some(driver) = pv["spec"]["csi"]["driver"].as_str() else {
            continue;
        };
        let pv_name = pv["metadata"]["name"].as_str().unwrap_or_default();
        let here = vas.iter().any(|(_, va)| {
            va["spec"]["source"]["persistentVolumeName"] == pv_name
                && va["spec"]["nodeName"] == node
        });
        if here {
            continue;
        }
        if single_node(pv) {
            let elsewhere: Vec<String> = vas
                .iter()
                .filter(|(_, va)| {
                    va["spec"]["source"]["persistentVolumeName"] == pv_name
                        && va["spec"]["nodeName"] != node
                })
                .flat_map(|(_, va)| {
                    users_on(
                        state,
                        va["spec"]["nodeName"].as_str().unwrap_or_default(),
                        pv_name,
                    )
                })
                .collect();
            if !elsewhere.is_empty() {
                let message = format!(
                    "Multi-Attach error for volume \"{pv_name}\" Volume is already used by pod(s) {}",
                    elsewhere.join(", ")
                );
                events::record(state, pod, true, "FailedAttachVolume", &message, ATTACHER);
                return;
            }
        }
        if let Some(limit) = attach_limit(state, node, driver) {
            let attached = vas
                .iter()
                .filter(|(_, va)| {
                    va["spec"]["nodeName"] == node && va["spec"]["attacher"] == driver
                })
                .count() as u64;
            if attached >= limit {
                let message = format!(
                    "AttachVolume.Attach failed for volume \"{pv_name}\" : rpc error: code = ResourceExhausted desc = node {node} has reached its limit of {limit} volumes for driver {driver}"
                );
                events::record(state, pod, true, "FailedAttachVolume", &message, ATTACHER);
                return;
            }
        }
        let name = format!("csi-{:016x}", state.next_seq());
        let va = json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": name},
            "spec": {"attacher": driver, "nodeName": node, "source": {"persistentVolumeName": pv_name}},
        });
        if let Ok(va) = state.create_object(va) {
            let mut attached = va;
            attached["status"] = json!({"attached": true});
            state.replace(
                &Key::new("storage.k8s.io", "volumeattachments", "", &name),
                attached,
            );
        }
        let message = format!("AttachVolume.Attach succeeded for volume \"{pv_name}\"");
        events::record(
            state,
            pod,
            false,
            "SuccessfulAttachVolume",
            &message,
            ATTACHER,
        );
    }
    let delay = state.sims.pod_start;
    if !delay.is_zero() {
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let began = *state
            .starting
            .entry(uid.clone())
            .or_insert_with(std::time::Instant::now);
        if began.elapsed() < delay {
            return; // still pulling the image: a later pass starts it
        }
        state.starting.remove(&uid);
    }
    run(state, key, pod, node);
}

fn attach_limit(state: &State, node: &str, driver: &str) -> Option<u64> {
    let csinode = state
        .store
        .get(&Key::new("storage.k8s.io", "csinodes", "", node))?;
    csinode["spec"]["drivers"]
        .as_array()?
        .iter()
        .find(|d| d["name"] == driver)
        .and_then(|d| d["allocatable"]["count"].as_u64())
}

fn run(state: &mut State, key: &Key, pod: &Value, node: &str) {
    let n = state.next_seq();
    let ip = format!("10.244.{}.{}", (n / 250) % 250, n % 250 + 2);
    let host_ip = state
        .store
        .get(&Key::new("", "nodes", "", node))
        .and_then(|n| {
            n["status"]["addresses"]
                .as_array()?
                .iter()
                .find(|a| a["type"] == "InternalIP")
                .and_then(|a| a["address"].as_str().map(String::from))
        })
        .unwrap_or_else(|| "192.168.0.10".into());
    let at = now();
    let mut next = pod.clone();
    let containers: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": true,
                   "started": true, "restartCount": 0, "state": {"running": {"startedAt": at}}})
        })
        .collect();
    next["status"]["phase"] = json!("Running");
    next["status"]["podIP"] = json!(ip);
    next["status"]["podIPs"] = json!([{"ip": ip}]);
    next["status"]["hostIP"] = json!(host_ip);
    next["status"]["startTime"] = json!(at);
    next["status"]["containerStatuses"] = json!(containers);
    for t in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        set_condition(
            &mut next,
            json!({"type": t, "status": "True", "lastTransitionTime": at}),
        );
    }
    let next = state.replace(key, next);
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        let name = c["name"].as_str().unwrap_or_default();
        events::record(
            state,
            &next,
            false,
            "Started",
            &format!("Started container {name}"),
            KUBELET,
        );
    }
}

/// Ends a running or pending pod's containers with `exit_code`: Succeeded for 0, else
/// Failed (reason Error, or `reason` when given, like OOMKilled), with `message` as the
/// termination message. False when the pod does not exist.
pub fn exit(
    state: &mut State,
    key: &Key,
    exit_code: i32,
    reason: Option<&str>,
    message: Option<&str>,
) -> bool {
    let Some(pod) = state.store.get(key).cloned() else {
        return false;
    };
    let at = now();
    let why = reason.unwrap_or(if exit_code == 0 { "Completed" } else { "Error" });
    let mut next = pod.clone();
    let containers: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let mut terminated = json!({"exitCode": exit_code, "reason": why, "finishedAt": at});
            if let Some(m) = message {
                terminated["message"] = json!(m);
            }
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": false,
                   "started": false, "restartCount": 0, "state": {"terminated": terminated}})
        })
        .collect();
    next["status"]["phase"] = json!(if exit_code == 0 {
        "Succeeded"
    } else {
        "Failed"
    });
    next["status"]["containerStatuses"] = json!(containers);
    for t in ["ContainersReady", "Ready"] {
        set_condition(
            &mut next,
            json!({"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": at}),
        );
    }
    state.replace(key, next);
    true
}

fn detach(state: &mut State) {
    for (key, va) in attachments(state) {
        let node = va["spec"]["nodeName"].as_str().unwrap_or_default();
        let pv = va["spec"]["source"]["persistentVolumeName"]
            .as_str()
            .unwrap_or_default();
        if users_on(state, node, pv).is_empty() {
            state.remove(&key);
        }
    }
}

/// The nodes a volume is attached to.
pub fn attached_nodes(state: &State, pv: &str) -> BTreeSet<String> {
    attachments(state)
        .iter()
        .filter(|(_, va)| va["spec"]["source"]["persistentVolumeName"] == pv)
        .filter_map(|(_, va)| va["spec"]["nodeName"].as_str().map(String::from))
        .collect()
}
