//! A scheduler with kube-scheduler's filters that decide where a mover can run:
//!
//! - a pod with `spec.nodeName` is not scheduled (the kubelet of that node takes it);
//! - nodes marked unschedulable, and taints (NoSchedule, NoExecute) the pod does not
//!   tolerate, exclude a node;
//! - `nodeSelector`, and required node affinity: terms ORed, each term's `matchExpressions`
//!   on node labels (In, NotIn, Exists, DoesNotExist, Gt, Lt) and `matchFields` on
//!   `metadata.name` ANDed;
//! - volumes: a missing claim, or an unbound claim of an Immediate class, keeps the pod
//!   Pending; a bound volume's node affinity must match the node; an unbound
//!   WaitForFirstConsumer claim that already has a selected node restricts the pod to it;
//! - CSI attach limits: a node's CSINode `spec.drivers[].allocatable.count` against the
//!   distinct volumes of that driver attached to it (VolumeAttachments) or used by its pods,
//!   plus the pod's new ones.
//!
//! Of the nodes left, the one running the fewest pods is chosen (then by name). The pod
//! gets `spec.nodeName` and the PodScheduled condition, its unbound WaitForFirstConsumer
//! claims the `volume.kubernetes.io/selected-node` annotation, and an Event `Scheduled`.
//! A pod no node fits gets PodScheduled False (Unschedulable) and a `FailedScheduling`
//! Event with kube-scheduler's message (`0/3 nodes are available: ...`).
//!
//! Not simulated: scoring beyond the pod count, resources (CPU, memory, pod count),
//! inter-pod affinity, topology spread, preemption, preferred affinity. RWO claims in use
//! elsewhere are not filtered (kube-scheduler does not either): the attach fails on the
//! node (see [`super::kubelet`]).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use super::binding::{class_of, waits_for_consumer, SELECTED_NODE};
use super::{events, is_terminal, pod_claims};
use crate::kube::state::{now, State};
use crate::kube::store::Key;

const COMPONENT: &str = "default-scheduler";

/// Whether a node selector requirement holds for `value` (None: the label is absent).
fn requirement(operator: &str, value: Option<&str>, values: &[String]) -> bool {
    let number = |s: &str| s.parse::<i64>().ok();
    match operator {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v > x)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(v), Some(x)) if v < x)
        }
        _ => false,
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a NodeSelectorTerm holds for a node.
fn term_matches(term: &Value, node: &Value) -> bool {
    let labels = &node["metadata"]["labels"];
    let name = node["metadata"]["name"].as_str();
    let exprs = term["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|r| {
            let key = r["key"].as_str().unwrap_or_default();
            requirement(
                r["operator"].as_str().unwrap_or_default(),
                labels[key].as_str(),
                &strings(&r["values"]),
            )
        });
    let fields = term["matchFields"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|r| {
            r["key"] == "metadata.name"
                && requirement(
                    r["operator"].as_str().unwrap_or_default(),
                    name,
                    &strings(&r["values"]),
                )
        });
    let empty = term["matchExpressions"]
        .as_array()
        .is_none_or(|a| a.is_empty())
        && term["matchFields"].as_array().is_none_or(|a| a.is_empty());
    !empty && exprs && fields
}

/// Whether a NodeSelector (terms ORed) holds; an absent selector holds.
pub fn selector_matches(selector: &Value, node: &Value) -> bool {
    match selector["nodeSelectorTerms"].as_array() {
        Some(terms) => terms.iter().any(|t| term_matches(t, node)),
        None => true,
    }
}

fn tolerated(taint: &Value, tolerations: &[Value]) -> bool {
    tolerations.iter().any(|t| {
        let key_ok = match t["key"].as_str() {
            None | Some("") => t["operator"] == "Exists",
            Some(k) => taint["key"] == k,
        };
        let value_ok = t["operator"] == "Exists"
            || t["value"].as_str().unwrap_or_default()
                == taint["value"].as_str().unwrap_or_default();
        let effect_ok = t["effect"]
            .as_str()
            .is_none_or(|e| e.is_empty() || taint["effect"] == e);
        key_ok && value_ok && effect_ok
    })
}

/// A claim of the pod as the scheduler sees it.
struct ClaimView {
    name: String,
    /// The bound volume.
    pv: Option<Value>,
    /// The class binds at first consumer.
    wffc: bool,
    /// Already given a node.
    selected: Option<String>,
    /// The CSI driver (of the volume, or the class's provisioner).
    driver: Option<String>,
}

/// One pass: every pod without a node, tried against every node.
pub fn pass(state: &mut State) {
    let mut nodes: Vec<Value> = state
        .objects("", "nodes")
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    nodes.sort_by(|a, b| {
        a["metadata"]["name"]
            .as_str()
            .cmp(&b["metadata"]["name"].as_str())
    });
    let unscheduled = |pod: &Value| {
        !pod["spec"]["nodeName"].is_string()
            && !pod["metadata"]["deletionTimestamp"].is_string()
            && !is_terminal(pod)
            && pod["spec"]["schedulerName"]
                .as_str()
                .is_none_or(|s| s == COMPONENT)
    };
    for (key, pod) in state.objects_where("", "pods", unscheduled) {
        schedule(state, &key, &pod, &nodes);
    }
}

fn claims_of(state: &State, namespace: &str, pod: &Value) -> Result<Vec<ClaimView>, String> {
    let mut out = Vec::new();
    for name in pod_claims(pod) {
        let Some(pvc) = state
            .store
            .get(&Key::new("", "persistentvolumeclaims", namespace, &name))
        else {
            return Err(format!("persistentvolumeclaim \"{name}\" not found"));
        };
        if pvc["metadata"]["deletionTimestamp"].is_string() {
            return Err(format!("persistentvolumeclaim \"{name}\" is being deleted"));
        }
        let pv = pvc["spec"]["volumeName"]
            .as_str()
            .filter(|_| pvc["status"]["phase"] == "Bound")
            .and_then(|v| {
                state
                    .store
                    .get(&Key::new("", "persistentvolumes", "", v))
                    .cloned()
            });
        let class = class_of(state, pvc);
        let wffc = class.as_ref().is_some_and(waits_for_consumer);
        if pv.is_none() && !wffc {
            return Err("pod has unbound immediate PersistentVolumeClaims".into());
        }
        let driver = pv
            .as_ref()
            .and_then(|pv| pv["spec"]["csi"]["driver"].as_str().map(String::from))
            .or_else(|| {
                class
                    .as_ref()
                    .and_then(|c| c["provisioner"].as_str().map(String::from))
            });
        out.push(ClaimView {
            name,
            pv,
            wffc,
            selected: pvc["metadata"]["annotations"][SELECTED_NODE]
                .as_str()
                .map(String::from),
            driver,
        });
    }
    Ok(out)
}

/// The volumes (by driver) counted against a node's attach limit: attached to it, or used
/// by its pods that have not ended.
fn volumes_on(state: &State, node: &str) -> BTreeSet<(String, String)> {
    let mut used = BTreeSet::new();
    for (_, va) in state
        .store
        .list("storage.k8s.io", "volumeattachments", None)
    {
        if va["spec"]["nodeName"] == node {
            if let (Some(d), Some(pv)) = (
                va["spec"]["attacher"].as_str(),
                va["spec"]["source"]["persistentVolumeName"].as_str(),
            ) {
                used.insert((d.to_string(), pv.to_string()));
            }
        }
    }
    for (_, pod) in state.store.list("", "pods", None) {
        if pod["spec"]["nodeName"] != node || is_terminal(pod) {
            continue;
        }
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        for claim in pod_claims(pod) {
            let Some(pvc) = state
                .store
                .get(&Key::new("", "persistentvolumeclaims", ns, &claim))
            else {
                continue;
            };
            let Some(pv_name) = pvc["spec"]["volumeName"].as_str() else {
                continue;
            };
            if let Some(pv) = state
                .store
                .get(&Key::new("", "persistentvolumes", "", pv_name))
            {
                if let Some(d) = pv["spec"]["csi"]["driver"].as_str() {
                    used.insert((d.to_string(), pv_name.to_string()));
                }
            }
        }
    }
    used
}

/// Why `node` cannot take the pod, as kube-scheduler counts it ("node(s) ...").
fn unfit(state: &State, pod: &Value, node: &Value, claims: &[ClaimView]) -> Option<String> {
    let name = node["metadata"]["name"].as_str().unwrap_or_default();
    if node["spec"]["unschedulable"] == true {
        return Some("node(s) were unschedulable".into());
    }
    let tolerations = pod["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for taint in node["spec"]["taints"].as_array().into_iter().flatten() {
        let effect = taint["effect"].as_str().unwrap_or_default();
        if (effect == "NoSchedule" || effect == "NoExecute") && !tolerated(taint, &tolerations) {
            let key = taint["key"].as_str().unwrap_or_default();
            let value = taint["value"]
                .as_str()
                .map(|v| format!(": {v}"))
                .unwrap_or_default();
            return Some(format!("node(s) had untolerated taint {{{key}{value}}}"));
        }
    }
    let labels = &node["metadata"]["labels"];
    let selector_ok = pod["spec"]["nodeSelector"]
        .as_object()
        .is_none_or(|sel| sel.iter().all(|(k, v)| labels[k] == *v));
    let affinity =
        &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    if !selector_ok || !selector_matches(affinity, node) {
        return Some("node(s) didn't match Pod's node affinity/selector".into());
    }
    for c in claims {
        let conflict = match &c.pv {
            Some(pv) => (!selector_matches(&pv["spec"]["nodeAffinity"]["required"], node))
                .then_some("node(s) had volume node affinity conflict"),
            None => (c.wffc && c.selected.as_deref().is_some_and(|s| s != name))
                .then_some("node(s) didn't find available persistent volumes to bind"),
        };
        if let Some(why) = conflict {
            return Some(why.into());
        }
    }
    let csinode = state
        .store
        .get(&Key::new("storage.k8s.io", "csinodes", "", name));
    if let Some(csinode) = csinode {
        let used = volumes_on(state, name);
        for d in csinode["spec"]["drivers"].as_array().into_iter().flatten() {
            let Some(limit) = d["allocatable"]["count"].as_u64() else {
                continue;
            };
            let driver = d["name"].as_str().unwrap_or_default();
            let mut total: BTreeSet<String> = used
                .iter()
                .filter(|(dr, _)| dr == driver)
                .map(|(_, v)| v.clone())
                .collect();
            for c in claims
                .iter()
                .filter(|c| c.driver.as_deref() == Some(driver))
            {
                let id =
                    c.pv.as_ref()
                        .and_then(|pv| pv["metadata"]["name"].as_str().map(String::from))
                        .unwrap_or_else(|| format!("new:{}", c.name));
                total.insert(id);
            }
            if total.len() as u64 > limit {
                return Some("node(s) exceed max volume count".into());
            }
        }
    }
    None
}

fn schedule(state: &mut State, key: &Key, pod: &Value, nodes: &[Value]) {
    let claims = match claims_of(state, &key.namespace, pod) {
        Ok(c) => c,
        Err(why) => {
            let message = format!("0/{} nodes are available: {why}. preemption: 0/{} nodes are available: {} Preemption is not helpful for scheduling.", nodes.len(), nodes.len(), nodes.len());
            return unschedulable(state, key, pod, &message);
        }
    };
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut fits = Vec::new();
    for node in nodes {
        match unfit(state, pod, node, &claims) {
            Some(why) => *reasons.entry(why).or_default() += 1,
            None => fits.push(node),
        }
    }
    let pods_on = |n: &str| {
        state
            .store
            .list("", "pods", None)
            .filter(|(_, p)| p["spec"]["nodeName"] == n && !is_terminal(p))
            .count()
    };
    let chosen = fits
        .iter()
        .map(|n| {
            n["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .min_by_key(|n| (pods_on(n), n.clone()));
    let Some(node) = chosen else {
        let mut parts: Vec<String> = reasons
            .iter()
            .map(|(why, n)| format!("{n} {why}"))
            .collect();
        parts.sort();
        let message = format!(
            "0/{} nodes are available: {}. preemption: 0/{} nodes are available: {} Preemption is not helpful for scheduling.",
            nodes.len(),
            parts.join(", "),
            nodes.len(),
            nodes.len()
        );
        return unschedulable(state, key, pod, &message);
    };
    for c in claims
        .iter()
        .filter(|c| c.pv.is_none() && c.wffc && c.selected.is_none())
    {
        let claim_key = Key::new("", "persistentvolumeclaims", &key.namespace, &c.name);
        if let Some(mut pvc) = state.store.get(&claim_key).cloned() {
            if !pvc["metadata"]["annotations"].is_object() {
                pvc["metadata"]["annotations"] = json!({});
            }
            pvc["metadata"]["annotations"][SELECTED_NODE] = json!(node);
            state.replace(&claim_key, pvc);
        }
    }
    let mut bound = pod.clone();
    bound["spec"]["nodeName"] = json!(node);
    set_condition(
        &mut bound,
        json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}),
    );
    let bound = state.replace(key, bound);
    let message = format!(
        "Successfully assigned {}/{} to {node}",
        key.namespace, key.name
    );
    events::record(state, &bound, false, "Scheduled", &message, COMPONENT);
}

fn unschedulable(state: &mut State, key: &Key, pod: &Value, message: &str) {
    let already = pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "PodScheduled" && c["message"] == message);
    if already {
        return;
    }
    let mut next = pod.clone();
    set_condition(
        &mut next,
        json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
               "message": message, "lastTransitionTime": now()}),
    );
    let next = state.replace(key, next);
    events::record(state, &next, true, "FailedScheduling", message, COMPONENT);
}

/// Sets (or replaces by type) a pod condition.
pub fn set_condition(pod: &mut Value, condition: Value) {
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    let conditions = &mut pod["status"]["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let list = conditions.as_array_mut().expect("just made an array");
    list.retain(|c| c["type"] != condition["type"]);
    list.push(condition);
}
