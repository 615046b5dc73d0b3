//! Who uses a claim: the pod a mover must share a node with when the claim attaches to one
//! node at a time. Found as VolSync's `AffinityFromVolume` finds it: the pods of the
//! namespace whose volumes name the claim, a Running one first, else a Pending one already
//! on a node. Only Bound claims that many nodes cannot attach at once (not ReadWriteMany or
//! ReadOnlyMany) are looked for, and the resource's own earlier movers do not count (they
//! are being replaced); other movers do, since a second reader of a ReadWriteOnce claim
//! can only read it on the same node.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use crate::mover::pod::labels;
use crate::mover::InUse;

/// Whether a mover using `pvc` may have to run where its users run: it is Bound and
/// attaches to one node at a time.
pub fn single_node(pvc: &PersistentVolumeClaim) -> bool {
    let Some(status) = pvc.status.as_ref() else {
        return false;
    };
    let bound = status.phase.as_deref() == Some("Bound");
    let many = status
        .access_modes
        .iter()
        .flatten()
        .any(|m| m == "ReadWriteMany" || m == "ReadOnlyMany");
    bound && !many
}

/// The pod using claim `claim` among `pods`, other than the movers of the resource
/// `owner_uid`.
pub fn user_of(claim: &str, pods: &[Pod], owner_uid: &str) -> Option<InUse> {
    let candidates = pods.iter().filter(|pod| {
        let own_mover = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::OWNER_UID))
            .is_some_and(|uid| uid == owner_uid);
        !own_mover && uses(pod, claim)
    });
    let mut pending = None;
    for pod in candidates {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            continue;
        };
        match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Running") => return Some(in_use(pod, node, claim)),
            Some("Pending") if pending.is_none() => pending = Some(in_use(pod, node, claim)),
            _ => {}
        }
    }
    pending
}

fn uses(pod: &Pod, claim: &str) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .any(|c| c.claim_name == claim)
}

/// Whether `pod` may write `claim`: it mounts it without `readOnly` and is not a mover
/// (movers open their sources read-only).
fn writes(pod: &Pod, claim: &str) -> bool {
    let mover = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::MANAGED_BY))
        .is_some_and(|m| m == "ferry-operator");
    let writable = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .any(|c| c.claim_name == claim && c.read_only != Some(true));
    writable && !mover
}

fn in_use(pod: &Pod, node: &str, claim: &str) -> InUse {
    InUse {
        writes: writes(pod, claim),
        pod: pod.metadata.name.clone().unwrap_or_default(),
        node: node.to_string(),
        tolerations: pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pvc(status: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "disk"}, "status": status})).unwrap()
    }

    fn pod(name: &str, phase: &str, node: Option<&str>, claim: &str, owner: Option<&str>) -> Pod {
        let mut p = json!({
            "metadata": {"name": name},
            "spec": {"containers": [], "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}],
                     "tolerations": [{"key": "vm", "operator": "Exists"}]},
            "status": {"phase": phase}
        });
        if let Some(node) = node {
            p["spec"]["nodeName"] = json!(node);
        }
        if let Some(owner) = owner {
            p["metadata"]["labels"] = json!({"ferry.dev/owner-uid": owner});
        }
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn only_bound_single_node_claims_are_looked_for() {
        assert!(single_node(&pvc(
            json!({"phase": "Bound", "accessModes": ["ReadWriteOnce"]})
        )));
        assert!(single_node(&pvc(
            json!({"phase": "Bound", "accessModes": ["ReadWriteOncePod"]})
        )));
        assert!(!single_node(&pvc(
            json!({"phase": "Bound", "accessModes": ["ReadWriteMany"]})
        )));
        assert!(!single_node(&pvc(
            json!({"phase": "Bound", "accessModes": ["ReadOnlyMany"]})
        )));
        assert!(!single_node(&pvc(json!({"phase": "Pending"}))));
        assert!(!single_node(&pvc(json!(null))));
    }

    #[test]
    fn a_running_user_wins_then_a_scheduled_pending_one() {
        let pods = [
            pod("done", "Succeeded", Some("n0"), "disk", None),
            pod("unscheduled", "Pending", None, "disk", None),
            pod("starting", "Pending", Some("n1"), "disk", None),
            pod("other-claim", "Running", Some("n9"), "other", None),
            pod("old-mover", "Running", Some("n8"), "disk", Some("uid-1")),
            pod("vm", "Running", Some("n2"), "disk", None),
        ];
        let found = user_of("disk", &pods, "uid-1").unwrap();
        assert_eq!((found.pod.as_str(), found.node.as_str()), ("vm", "n2"));
        assert_eq!(found.tolerations.len(), 1);
        let found = user_of("disk", &pods[..3], "uid-1").unwrap();
        assert_eq!(
            (found.pod.as_str(), found.node.as_str()),
            ("starting", "n1")
        );
        assert_eq!(user_of("disk", &pods[3..5], "uid-1"), None);
        // Another resource's mover is a user like any other.
        let found = user_of("disk", &pods[4..5], "uid-2").unwrap();
        assert_eq!(found.node, "n8");
    }
}
