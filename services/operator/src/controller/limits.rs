//! Mover limits, counted from the store of mover pods (no API request): at most N movers
//! in the cluster and M per node. A new mover over the cluster limit waits (Queued).
//! Kubernetes, not the operator, picks a mover's node, so the node limit is kept by
//! telling the scheduler: the new pod gets a required node affinity excluding every node
//! at its limit; only a mover pinned to a full node (`kubernetes.io/hostname` in its node
//! selector) waits as Queued. Reconciles of different resources may race for the last
//! slot; the limits are then exceeded by at most the controller's concurrency.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
};

use crate::mover::pod::labels;

use super::settings::OperatorSettings;

/// The node label the scheduler fills in.
pub const HOSTNAME: &str = "kubernetes.io/hostname";

/// Whether a new mover may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// It may, avoiding these nodes (at their limit).
    Free {
        /// Nodes at their limit.
        full_nodes: Vec<String>,
    },
    /// It must wait: why.
    Queued(String),
}

fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

/// The slot of a new mover of the resource `uid` (its own older pods do not count),
/// pinned to `node` when its node selector names one.
pub fn slot(pods: &[Arc<Pod>], uid: &str, node: Option<&str>, settings: &OperatorSettings) -> Slot {
    let others: Vec<&Pod> = pods
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| is_active(p))
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::OWNER_UID))
                .is_none_or(|owner| owner != uid)
        })
        .collect();
    if settings.max_movers > 0 && others.len() >= settings.max_movers {
        return Slot::Queued(format!(
            "{} movers run, the operator's limit is {}: waiting for one to finish",
            others.len(),
            settings.max_movers
        ));
    }
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &others {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            *per_node.entry(n).or_default() += 1;
        }
    }
    let limit = settings.max_movers_per_node;
    let full_nodes: Vec<String> = per_node
        .into_iter()
        .filter(|(_, n)| limit > 0 && *n >= limit)
        .map(|(node, _)| node.to_string())
        .collect();
    match node {
        Some(node) if full_nodes.iter().any(|n| n == node) => Slot::Queued(format!(
            "node {node} runs {limit} movers, the operator's limit per node: waiting for one to finish"
        )),
        _ => Slot::Free { full_nodes },
    }
}

/// The node a pod's selector pins it to.
pub fn pinned_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()?
        .node_selector
        .as_ref()?
        .get(HOSTNAME)
        .map(String::as_str)
}

/// Keeps the pod off the full nodes.
pub fn avoid_nodes(pod: &mut Pod, full_nodes: &[String]) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    if full_nodes.is_empty() {
        return;
    }
    let requirement = NodeSelectorRequirement {
        key: HOSTNAME.into(),
        operator: "NotIn".into(),
        values: Some(full_nodes.to_vec()),
    };
    spec.affinity = Some(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![requirement]),
                    match_fields: None,
                }],
            }),
            preferred_during_scheduling_ignored_during_execution: None,
        }),
        ..Affinity::default()
    });
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::mover::MoverDefaults;

    fn settings(max: usize, per_node: usize) -> OperatorSettings {
        let mut s = OperatorSettings::new(MoverDefaults {
            image: "ferry".into(),
            image_pull_policy: None,
            resources: None,
            node_selector: BTreeMap::new(),
            tolerations: vec![],
            priority_class_name: None,
            service_account_name: None,
        });
        s.max_movers = max;
        s.max_movers_per_node = per_node;
        s
    }

    fn pod(owner: &str, node: Option<&str>, phase: &str) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                labels: Some(BTreeMap::from([(
                    labels::OWNER_UID.to_string(),
                    owner.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(str::to_string),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            }),
        })
    }

    #[test]
    fn cluster_and_node_limits() {
        let pods = vec![
            pod("a", Some("n1"), "Running"),
            pod("b", Some("n1"), "Running"),
            pod("c", None, "Pending"),
            pod("d", Some("n2"), "Failed"),
        ];
        assert!(
            matches!(slot(&pods, "x", None, &settings(3, 0)), Slot::Queued(m) if m.contains("limit is 3"))
        );
        // Its own pod does not count.
        assert_eq!(
            slot(&pods, "c", None, &settings(3, 0)),
            Slot::Free { full_nodes: vec![] }
        );
        assert_eq!(
            slot(&pods, "x", None, &settings(0, 2)),
            Slot::Free {
                full_nodes: vec!["n1".into()]
            }
        );
        assert!(
            matches!(slot(&pods, "x", Some("n1"), &settings(0, 2)), Slot::Queued(m) if m.contains("node n1"))
        );
        assert_eq!(
            slot(&pods, "x", Some("n2"), &settings(0, 2)),
            Slot::Free {
                full_nodes: vec!["n1".into()]
            }
        );
        let mut p = Pod {
            spec: Some(PodSpec::default()),
            ..Pod::default()
        };
        avoid_nodes(&mut p, &["n1".into()]);
        let terms = p.spec.unwrap().affinity.unwrap().node_affinity.unwrap();
        let req = &terms
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms[0];
        assert_eq!(req.match_expressions.as_ref().unwrap()[0].operator, "NotIn");
    }
}
