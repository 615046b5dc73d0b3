//! Why a mover waits on a volume held by a failed node.
//!
//! When a node fails, the pods on it are deleted but the VolumeAttachments of its RWO
//! volumes stay: the attach-detach controller force-detaches them only 6 minutes after
//! the node stopped reporting (or at once when the node object is deleted or tainted
//! `node.kubernetes.io/out-of-service`, the non-graceful node shutdown), and some drivers
//! never do. A replacement mover on another node meanwhile sits in ContainerCreating with a
//! Multi-Attach event and nothing on the resource says why. So a mover scheduled but not
//! started after [`CHECK_AFTER`] has its claims' attachments looked at: one held by a node
//! that is not Ready is named in the status, with what the user can do.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::ListParams;
use kube::{Api, Client};

use super::error::Error;
use super::pods::attached_pvcs;

/// A mover that has not started this long after its creation has its volumes' attachments
/// checked (earlier, a Multi-Attach is usually a detach still under way).
pub const CHECK_AFTER: Duration = Duration::from_secs(60);

/// A check's answer is reused this long: a mover waits minutes for a failed node's
/// volumes, and its resource is looked at every few seconds meanwhile.
pub const RECHECK_AFTER: Duration = Duration::from_secs(30);

/// A claim of the mover and the volume bound to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundClaim {
    /// The claim's name.
    pub claim: String,
    /// The PersistentVolume's name.
    pub volume: String,
}

/// The message naming every claim of `claims` whose volume is attached to a node other
/// than `mover_node` that is not Ready (by `nodes`, name -> node; a node missing from it
/// is not judged), or `None`.
pub fn held_by_failed_nodes(
    mover_node: &str,
    claims: &[BoundClaim],
    attachments: &[VolumeAttachment],
    nodes: &BTreeMap<String, Node>,
) -> Option<String> {
    let mut held = Vec::new();
    for claim in claims {
        for a in attachments {
            let spec = &a.spec;
            if spec.source.persistent_volume_name.as_deref() != Some(claim.volume.as_str())
                || spec.node_name == mover_node
            {
                continue;
            }
            let Some(ready) = nodes.get(&spec.node_name).map(node_ready) else {
                continue;
            };
            if ready.0 == "True" {
                continue;
            }
            held.push(format!(
                "volume {} of claim {} is still attached to node {}, which is not ready \
                 (Ready={}{})",
                claim.volume,
                claim.claim,
                spec.node_name,
                ready.0,
                ready.1.map(|t| format!(" since {t}")).unwrap_or_default(),
            ));
        }
    }
    if held.is_empty() {
        return None;
    }
    Some(format!(
        "{}: Kubernetes detaches it 6 minutes after the node stopped reporting, or at once \
         when the node is deleted or tainted node.kubernetes.io/out-of-service=nodeshutdown:\
         NoExecute (non-graceful node shutdown); until then the mover cannot start on node \
         {mover_node}",
        held.join("; ")
    ))
}

/// The node's Ready condition status (`Unknown` when it reports none) and since when.
fn node_ready(node: &Node) -> (String, Option<String>) {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map_or(("Unknown".to_string(), None), |c| {
            (
                c.status.clone(),
                c.last_transition_time.as_ref().map(|t| t.0.to_string()),
            )
        })
}

/// Looks the mover pod's claims up and checks their attachments (see the module doc):
/// one GET per claim, one list of VolumeAttachments, one GET per node holding one.
pub async fn check(client: &Client, namespace: &str, pod: &Pod) -> Result<Option<String>, Error> {
    let Some(mover_node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return Ok(None);
    };
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let mut claims = Vec::new();
    for pvc in attached_pvcs(pod) {
        let volume = pvcs
            .get_opt(&pvc.name)
            .await?
            .and_then(|c| c.spec?.volume_name);
        if let Some(volume) = volume {
            claims.push(BoundClaim {
                claim: pvc.name,
                volume,
            });
        }
    }
    if claims.is_empty() {
        return Ok(None);
    }
    let attachments = Api::<VolumeAttachment>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let nodes_api: Api<Node> = Api::all(client.clone());
    let mut nodes = BTreeMap::new();
    for a in &attachments {
        let node = &a.spec.node_name;
        let ours = claims
            .iter()
            .any(|c| a.spec.source.persistent_volume_name.as_deref() == Some(c.volume.as_str()));
        if ours && *node != mover_node && !nodes.contains_key(node) {
            if let Some(n) = nodes_api.get_opt(node).await? {
                nodes.insert(node.clone(), n);
            }
        }
    }
    Ok(held_by_failed_nodes(
        &mover_node,
        &claims,
        &attachments,
        &nodes,
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn attachment(volume: &str, node: &str) -> VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": {"name": format!("csi-{volume}-{node}")},
            "spec": {"attacher": "rbd.csi.ceph.com", "nodeName": node,
                     "source": {"persistentVolumeName": volume}},
            "status": {"attached": true},
        }))
        .unwrap()
    }

    fn node(name: &str, ready: &str) -> (String, Node) {
        let n = serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": ready,
                "lastTransitionTime": "2026-12-05T10:00:00Z"}]},
        }))
        .unwrap();
        (name.to_string(), n)
    }

    fn claims() -> Vec<BoundClaim> {
        vec![BoundClaim {
            claim: "vm-disk".into(),
            volume: "pv-1".into(),
        }]
    }

    #[test]
    fn a_volume_held_by_a_node_that_is_not_ready_is_named_with_the_remedy() {
        let nodes = BTreeMap::from([node("node-a", "Unknown"), node("node-b", "True")]);
        let message =
            held_by_failed_nodes("node-b", &claims(), &[attachment("pv-1", "node-a")], &nodes)
                .unwrap();
        assert!(
            message.starts_with(
                "volume pv-1 of claim vm-disk is still attached to node node-a, which is not \
                 ready (Ready=Unknown since 2026-12-05T10:00:00Z): Kubernetes detaches it"
            ),
            "{message}"
        );
        assert!(
            message.contains("node.kubernetes.io/out-of-service"),
            "{message}"
        );
        assert!(
            message.ends_with("cannot start on node node-b"),
            "{message}"
        );
    }

    #[test]
    fn healthy_holders_the_movers_own_node_and_other_volumes_are_not_blamed() {
        let nodes = BTreeMap::from([node("node-a", "True"), node("node-b", "True")]);
        for attachments in [
            vec![attachment("pv-1", "node-a")],
            vec![attachment("pv-1", "node-b")],
            vec![attachment("pv-2", "node-c")],
        ] {
            assert_eq!(
                held_by_failed_nodes("node-b", &claims(), &attachments, &nodes),
                None
            );
        }
        // A node the check could not read is not judged.
        assert_eq!(
            held_by_failed_nodes(
                "node-b",
                &claims(),
                &[attachment("pv-1", "node-x")],
                &BTreeMap::new()
            ),
            None
        );
    }
}
