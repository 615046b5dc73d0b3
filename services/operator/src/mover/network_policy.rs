//! The NetworkPolicy that lets the operator, and only the operator, reach a mover.
//!
//! NetworkPolicies add up: once any policy selects a pod for ingress (a namespace's
//! default-deny, as many clusters install in every user namespace), only what some policy
//! allows gets through, and the operator's gRPC link to the mover would hang on connect
//! while the pod looks healthy. So each mover comes with a policy of its own, allowing
//! TCP to the mover's gRPC port from the operator's pods in the operator's namespace and
//! from nothing else. It selects only movers of its resource, is named after the mover
//! pod and goes with it. Egress is not restricted: a mover must reach its endpoints.
//!
//! A mover that serves a fan-out's relay also admits, on the relay's port, the other
//! movers of the same fan-out (same namespace, labelled with the fan-out's uid): they
//! read the image from it, over mutual TLS with their own certificates.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::layout::{GRPC_PORT, RELAY_PORT};
use super::pod::{labels, RELAY_PORT_NAME};
use crate::fanout::children::PARENT_UID;

/// The label every namespace carries with its own name (set by the API server).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The label the operator's pods carry (deploy/operator and the chart), whatever the
/// other labels a chart release gives them.
pub fn operator_pod_labels() -> BTreeMap<String, String> {
    BTreeMap::from([("ferry.dev/role".to_string(), "operator".to_string())])
}

/// The policy for `pod` (a mover pod as the pod builder made it): same name, namespace,
/// labels and owner; ingress to the gRPC port from the operator's pods in
/// `operator_namespace` only.
pub fn mover_network_policy(pod: &Pod, operator_namespace: &str) -> NetworkPolicy {
    let pod_labels = pod.metadata.labels.clone().unwrap_or_default();
    let selected: BTreeMap<String, String> = pod_labels
        .iter()
        .filter(|(k, _)| [labels::NAME, labels::COMPONENT, labels::OWNER_UID].contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let operator = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_string(),
                operator_namespace.to_string(),
            )])),
            ..LabelSelector::default()
        }),
        pod_selector: Some(LabelSelector {
            match_labels: Some(operator_pod_labels()),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    };
    let tcp = |port: i32| NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".to_string()),
        ..NetworkPolicyPort::default()
    };
    let mut ingress = vec![NetworkPolicyIngressRule {
        from: Some(vec![operator]),
        ports: Some(vec![tcp(GRPC_PORT)]),
    }];
    if let (true, Some(fan_out)) = (serves_relay(pod), pod_labels.get(PARENT_UID)) {
        let movers = BTreeMap::from([
            (labels::COMPONENT.to_string(), "mover".to_string()),
            (PARENT_UID.to_string(), fan_out.clone()),
        ]);
        ingress.push(NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                pod_selector: Some(LabelSelector {
                    match_labels: Some(movers),
                    ..LabelSelector::default()
                }),
                ..NetworkPolicyPeer::default()
            }]),
            ports: Some(vec![tcp(RELAY_PORT)]),
        });
    }
    NetworkPolicy {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: Some(pod_labels),
            owner_references: pod.metadata.owner_references.clone(),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selected),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(ingress),
            egress: None,
        }),
    }
}

/// Whether the pod's mover serves a relay (it has the relay's port).
fn serves_relay(pod: &Pod) -> bool {
    pod.spec.iter().flat_map(|s| &s.containers).any(|c| {
        c.ports
            .iter()
            .flatten()
            .any(|p| p.name.as_deref() == Some(RELAY_PORT_NAME))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_policy_admits_only_the_operator_to_the_grpc_port() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "import-mover-1", "namespace": "vms",
                "labels": {
                    "app.kubernetes.io/name": "ferry",
                    "app.kubernetes.io/component": "mover",
                    "app.kubernetes.io/managed-by": "ferry-operator",
                    "ferry.dev/owner-kind": "Transfer",
                    "ferry.dev/owner-uid": "u-1",
                    "velero.io/exclude-from-backup": "true",
                },
                "ownerReferences": [{"apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
                    "name": "import", "uid": "u-1", "controller": true,
                    "blockOwnerDeletion": true}],
            },
        }))
        .unwrap();
        let policy = serde_json::to_value(mover_network_policy(&pod, "ferry-system")).unwrap();
        assert_eq!(
            policy,
            json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {
                    "name": "import-mover-1", "namespace": "vms",
                    "labels": pod.metadata.labels,
                    "ownerReferences": pod.metadata.owner_references,
                },
                "spec": {
                    "podSelector": {"matchLabels": {
                        "app.kubernetes.io/name": "ferry",
                        "app.kubernetes.io/component": "mover",
                        "ferry.dev/owner-uid": "u-1",
                    }},
                    "policyTypes": ["Ingress"],
                    "ingress": [{
                        "from": [{
                            "namespaceSelector": {"matchLabels": {
                                "kubernetes.io/metadata.name": "ferry-system"}},
                            "podSelector": {"matchLabels": {"ferry.dev/role": "operator"}},
                        }],
                        "ports": [{"port": 50051, "protocol": "TCP"}],
                    }],
                },
            })
        );
    }

    #[test]
    fn a_relaying_mover_also_admits_its_fan_outs_movers_to_the_relay_port() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "fleet-g0-ft-1", "namespace": "vms",
                "labels": {
                    "app.kubernetes.io/name": "ferry",
                    "app.kubernetes.io/component": "mover",
                    "ferry.dev/owner-uid": "g-0",
                    "ferry.dev/fan-out-of": "p-1",
                },
            },
            "spec": {"containers": [{"name": "mover", "ports": [
                {"name": "grpc", "containerPort": 50051},
                {"name": "nbd-relay", "containerPort": 10810},
            ]}]},
        }))
        .unwrap();
        let policy = serde_json::to_value(mover_network_policy(&pod, "ferry-system")).unwrap();
        assert_eq!(
            policy["spec"]["ingress"][1],
            json!({
                "from": [{"podSelector": {"matchLabels": {
                    "app.kubernetes.io/component": "mover",
                    "ferry.dev/fan-out-of": "p-1",
                }}}],
                "ports": [{"port": 10810, "protocol": "TCP"}],
            })
        );
        assert_eq!(policy["spec"]["ingress"].as_array().unwrap().len(), 2);
        // A group that only reads the relay opens nothing more.
        let mut reader = pod.clone();
        reader.spec.as_mut().unwrap().containers[0]
            .ports
            .as_mut()
            .unwrap()
            .pop();
        let policy = serde_json::to_value(mover_network_policy(&reader, "ferry-system")).unwrap();
        assert_eq!(policy["spec"]["ingress"].as_array().unwrap().len(), 1);
    }
}
