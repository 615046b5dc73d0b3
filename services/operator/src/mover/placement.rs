//! Where a mover must run: on the node of the pod that uses one of its claims, when that
//! claim attaches to one node at a time (VolSync pins its movers the same way). Left to the
//! scheduler, such a mover would often land elsewhere and wait on a Multi-Attach error.
//! The node is named by its `metadata.name` field, as DaemonSets name theirs, so no node
//! label is needed; the using pod's tolerations are copied, so the taints that admit it
//! admit the mover too.

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec,
};

use super::{InUse, ResolvedPvc};

/// The node field a pinned mover's affinity matches.
pub const NODE_NAME_FIELD: &str = "metadata.name";

/// The use that pins the mover (None: no claim is in use). Claims in use on two different
/// nodes cannot be attached by one mover: the error says which.
pub fn pinning_use(pvcs: &[ResolvedPvc]) -> Result<Option<&InUse>, String> {
    let mut used = pvcs
        .iter()
        .filter_map(|p| p.in_use.as_ref().map(|u| (p.name.as_str(), u)));
    let Some((first_claim, first)) = used.next() else {
        return Ok(None);
    };
    match used.find(|(_, u)| u.node != first.node) {
        Some((claim, other)) => Err(format!(
            "pvc/{first_claim} is in use by pod {} on node {} and pvc/{claim} by pod {} on node {}: one mover cannot attach both; stop one of the pods",
            first.pod, first.node, other.pod, other.node
        )),
        None => Ok(Some(first)),
    }
}

/// Pins the pod to the node of `used`, with its tolerations added.
pub fn pin(spec: &mut PodSpec, used: &InUse) {
    pin_to(spec, &used.node);
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for t in &used.tolerations {
        if !tolerations.contains(t) {
            tolerations.push(t.clone());
        }
    }
}

/// Pins the pod to `node`.
pub fn pin_to(spec: &mut PodSpec, node: &str) {
    let requirement = NodeSelectorRequirement {
        key: NODE_NAME_FIELD.into(),
        operator: "In".into(),
        values: Some(vec![node.to_string()]),
    };
    spec.affinity = Some(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![requirement]),
                }],
            }),
            preferred_during_scheduling_ignored_during_execution: None,
        }),
        ..Affinity::default()
    });
}

/// The node a pod is pinned to by [`pin`].
pub fn pinned_node(spec: &PodSpec) -> Option<&str> {
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|r| r.key == NODE_NAME_FIELD && r.operator == "In")
        .and_then(|r| r.values.as_ref()?.first())
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Toleration;
    use serde_json::json;

    use super::*;
    use crate::crd::VolumeMode;

    fn used(claim: &str, pod: &str, node: &str) -> ResolvedPvc {
        let mut p = ResolvedPvc::new(claim, VolumeMode::Block);
        p.in_use = Some(InUse {
            writes: true,
            pod: pod.into(),
            node: node.into(),
            tolerations: vec![Toleration {
                key: Some("dedicated".into()),
                operator: Some("Exists".into()),
                ..Toleration::default()
            }],
        });
        p
    }

    #[test]
    fn a_claim_in_use_pins_the_mover_to_its_node_with_its_tolerations() {
        let pvcs = [
            ResolvedPvc::new("out", VolumeMode::Filesystem),
            used("vm-disk", "virt-launcher-vm1", "node-b"),
        ];
        let used = pinning_use(&pvcs).unwrap().unwrap();
        let mut spec = PodSpec::default();
        pin(&mut spec, used);
        pin(&mut spec, used);
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            json!({
                "containers": [],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["node-b"]}
                    ]}]
                }}},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}]
            })
        );
        assert_eq!(pinned_node(&spec), Some("node-b"));
    }

    #[test]
    fn no_claim_in_use_pins_nothing_and_two_nodes_are_refused() {
        assert_eq!(
            pinning_use(&[ResolvedPvc::new("a", VolumeMode::Block)]),
            Ok(None)
        );
        let same = [used("a", "p1", "n1"), used("b", "p2", "n1")];
        assert_eq!(pinning_use(&same).unwrap().unwrap().node, "n1");
        let apart = [used("a", "p1", "n1"), used("b", "p2", "n2")];
        assert_eq!(
            pinning_use(&apart).unwrap_err(),
            "pvc/a is in use by pod p1 on node n1 and pvc/b by pod p2 on node n2: one mover cannot attach both; stop one of the pods"
        );
    }
}
