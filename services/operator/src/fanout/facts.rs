//! What the group plan depends on, read from cluster objects by pure functions (the
//! reconciler lists the objects, `ferry operator render` takes them from its file): each
//! node's room for the targets' CSI driver (CSINode `allocatable.count` minus the
//! VolumeAttachments of that driver on the node), which nodes a mover may run on (Ready,
//! schedulable, its taints tolerated, the mover's node selector matched), and where each
//! target can be written from.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Toleration};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};

use crate::crd::{TargetKey, Transfer, TransferTarget};
use crate::mover::MoverDefaults;

use super::groups::{NodeRoom, Reach};

/// The annotation that marks a StorageClass the cluster's default.
pub const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";

/// Where a mover may run: its node selector and tolerations.
#[derive(Debug, Clone, Default)]
pub struct MoverPlacement {
    /// Labels a node must carry.
    pub node_selector: BTreeMap<String, String>,
    /// Taints the mover tolerates.
    pub tolerations: Vec<Toleration>,
}

/// Where a Transfer's movers may run: the operator's defaults with the Transfer's own.
pub fn placement(defaults: &MoverDefaults, transfer: &Transfer) -> MoverPlacement {
    let own = transfer.spec.mover.clone().unwrap_or_default();
    let mut node_selector = defaults.node_selector.clone();
    node_selector.extend(own.node_selector.unwrap_or_default());
    let mut tolerations = defaults.tolerations.clone();
    tolerations.extend(own.tolerations.unwrap_or_default());
    MoverPlacement {
        node_selector,
        tolerations,
    }
}

/// The room on every node a mover may run on, for volumes of `driver` (None: the targets
/// attach no CSI volume of a known driver, so only the mover's own limit counts).
pub fn rooms(
    nodes: &[Node],
    csinodes: &[CSINode],
    attachments: &[VolumeAttachment],
    driver: Option<&str>,
    placement: &MoverPlacement,
) -> Vec<NodeRoom> {
    let mut attached: BTreeMap<&str, u32> = BTreeMap::new();
    if let Some(driver) = driver {
        for a in attachments.iter().filter(|a| a.spec.attacher == driver) {
            *attached.entry(a.spec.node_name.as_str()).or_default() += 1;
        }
    }
    let limit = |node: &str| -> Option<u32> {
        let driver = driver?;
        let csinode = csinodes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(node))?;
        let count = csinode
            .spec
            .drivers
            .iter()
            .find(|d| d.name == driver)?
            .allocatable
            .as_ref()?
            .count?;
        Some(u32::try_from(count).unwrap_or(0))
    };
    nodes
        .iter()
        .filter(|n| usable(n, placement))
        .filter_map(|n| {
            let name = n.metadata.name.clone()?;
            let free = limit(&name)
                .map(|l| l.saturating_sub(attached.get(name.as_str()).copied().unwrap_or(0)));
            Some(NodeRoom { name, free })
        })
        .collect()
}

/// Whether a mover may run on `node`: Ready, not cordoned, every NoSchedule/NoExecute
/// taint tolerated, the node selector matched.
pub fn usable(node: &Node, placement: &MoverPlacement) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if placement
        .node_selector
        .iter()
        .any(|(k, v)| labels.get(k) != Some(v))
    {
        return false;
    }
    let spec = node.spec.clone().unwrap_or_default();
    if spec.unschedulable == Some(true) {
        return false;
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    if !ready {
        return false;
    }
    spec.taints.unwrap_or_default().iter().all(|taint| {
        taint.effect == "PreferNoSchedule"
            || placement.tolerations.iter().any(|t| {
                let key = t.key.as_deref().is_none_or(|k| k == taint.key);
                let value = t.operator.as_deref() == Some("Exists")
                    || t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("");
                let effect = t
                    .effect
                    .as_deref()
                    .is_none_or(|e| e.is_empty() || e == taint.effect);
                key && value
                    && effect
                    && (t.key.is_some() || t.operator.as_deref() == Some("Exists"))
            })
    })
}

/// Whether a claim may be attached on several nodes at once (ReadOnlyMany or
/// ReadWriteMany).
pub fn shared(claim: &PersistentVolumeClaim) -> bool {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.as_ref())
        .is_some_and(|m| {
            m.iter()
                .any(|m| m == "ReadOnlyMany" || m == "ReadWriteMany")
        })
}

/// The class a claim of `name` (None: the cluster's default) gets.
pub fn class<'a>(classes: &'a [StorageClass], name: Option<&str>) -> Option<&'a StorageClass> {
    match name {
        Some(name) => classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name)),
        None => classes.iter().find(|c| {
            c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT_CLASS))
                .is_some_and(|v| v == "true")
        }),
    }
}

/// Where `target` can be written from: a claim to create goes to any node (it is
/// provisioned for the node of its group), an existing claim where its volume is (the
/// scheduler decides; claims in use are pinned by the mover itself), a URL nowhere.
pub fn reach(target: &TransferTarget) -> Reach {
    if target.pvc_template.is_some() {
        return Reach::AnyNode;
    }
    match target.key() {
        Some(TargetKey::Pvc(_)) => Reach::Segment("existing".into()),
        _ => Reach::Detached,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(name: &str, extra: serde_json::Value) -> Node {
        let mut v = json!({
            "metadata": {"name": name, "labels": {"pool": "disk"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        });
        if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            for (k, x) in extra {
                v.insert(k.clone(), x.clone());
            }
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn room_is_the_limit_minus_attached_volumes_of_the_driver() {
        let nodes = [
            node("a", json!({})),
            node("b", json!({})),
            node("c", json!({})),
        ];
        let csinodes: Vec<CSINode> = serde_json::from_value(json!([
            {"metadata": {"name": "a"}, "spec": {"drivers": [
                {"name": "ebs.csi.aws.com", "nodeID": "i-1", "allocatable": {"count": 25}}]}},
            {"metadata": {"name": "b"}, "spec": {"drivers": [
                {"name": "ebs.csi.aws.com", "nodeID": "i-2", "allocatable": {"count": 25}}]}},
        ]))
        .unwrap();
        let attachments: Vec<VolumeAttachment> = serde_json::from_value(json!([
            {"metadata": {"name": "v1"}, "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "a",
                "source": {"persistentVolumeName": "pv1"}}},
            {"metadata": {"name": "v2"}, "spec": {"attacher": "ebs.csi.aws.com", "nodeName": "a",
                "source": {"persistentVolumeName": "pv2"}}},
            {"metadata": {"name": "v3"}, "spec": {"attacher": "other", "nodeName": "b",
                "source": {"persistentVolumeName": "pv3"}}},
        ]))
        .unwrap();
        let r = rooms(
            &nodes,
            &csinodes,
            &attachments,
            Some("ebs.csi.aws.com"),
            &MoverPlacement::default(),
        );
        assert_eq!(
            r,
            [
                NodeRoom {
                    name: "a".into(),
                    free: Some(23)
                },
                NodeRoom {
                    name: "b".into(),
                    free: Some(25)
                },
                NodeRoom {
                    name: "c".into(),
                    free: None
                },
            ]
        );
    }

    #[test]
    fn cordoned_not_ready_tainted_or_unselected_nodes_take_no_mover() {
        let placement = MoverPlacement {
            node_selector: BTreeMap::from([("pool".into(), "disk".into())]),
            tolerations: serde_json::from_value(
                json!([{"key": "dedicated", "operator": "Exists"}]),
            )
            .unwrap(),
        };
        let ok = node("ok", json!({}));
        let cordoned = node("c", json!({"spec": {"unschedulable": true}}));
        let down = node(
            "d",
            json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}),
        );
        let tainted = node(
            "t",
            json!({"spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]}}),
        );
        let tolerated = node(
            "tt",
            json!({"spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]}}),
        );
        let soft = node(
            "s",
            json!({"spec": {"taints": [{"key": "gpu", "effect": "PreferNoSchedule"}]}}),
        );
        let mut other: Node = node("o", json!({}));
        other.metadata.labels = None;
        assert!(usable(&ok, &placement));
        assert!(!usable(&cordoned, &placement));
        assert!(!usable(&down, &placement));
        assert!(!usable(&tainted, &placement));
        assert!(usable(&tolerated, &placement));
        assert!(usable(&soft, &placement));
        assert!(!usable(&other, &placement));
    }
}
