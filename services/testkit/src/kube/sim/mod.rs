//! Simulated cluster controllers a test switches on, each a pass over the stand-in's
//! objects that writes what the real component would write, Events included:
//!
//! - [`binding`]: the PersistentVolume controller and a CSI provisioner (PVC binding,
//!   Immediate or WaitForFirstConsumer, the pvc-protection finalizer, reclaiming volumes
//!   of deleted claims);
//! - [`scheduler`]: kube-scheduler's filters that matter to movers (nodeName, node
//!   selector, required node affinity, taints, volume node affinity, CSI attach limits)
//!   and the selected-node annotation of WaitForFirstConsumer claims;
//! - [`kubelet`]: the attach/detach controller (VolumeAttachments, Multi-Attach of
//!   single-node volumes) and the kubelet (a pod whose volumes are attached runs and is
//!   Ready with an IP; it ends when the test says so; a deleted pod goes once stopped).
//!
//! [`settle`] runs the switched-on passes until none changes anything. The cluster runs
//! it after every write (from a background task, so a client sees its write answered
//! before the controllers react, as on a real cluster).

pub mod binding;
pub mod events;
pub mod kubelet;
pub mod scheduler;

use serde_json::Value;

use super::state::State;
use super::store::Key;

/// Which simulated controllers run.
#[derive(Debug, Default, Clone)]
pub struct Sims {
    /// PVC binding and provisioning.
    pub binding: bool,
    /// The scheduler.
    pub scheduler: bool,
    /// Attach/detach and the kubelet.
    pub kubelet: bool,
    /// How long a kubelet takes to start a pod once its volumes are attached (pulling
    /// the image, starting the container); zero: at once.
    pub pod_start: std::time::Duration,
}

impl Sims {
    /// Whether deleting this object must wait for a kubelet to stop it: a pod on a node,
    /// not ended, while the kubelet runs.
    pub fn pod_needs_kubelet_stop(&self, key: &Key, object: &Value) -> bool {
        self.kubelet
            && key.group.is_empty()
            && key.resource == "pods"
            && object["spec"]["nodeName"].is_string()
            && !is_terminal(object)
    }

    /// Whether any runs.
    pub fn any(&self) -> bool {
        self.binding || self.scheduler || self.kubelet
    }
}

/// A pod that ended.
pub fn is_terminal(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

/// The claims a pod's volumes name.
pub fn pod_claims(pod: &Value) -> Vec<String> {
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            v["persistentVolumeClaim"]["claimName"]
                .as_str()
                .map(String::from)
        })
        .collect()
}

/// Runs the switched-on controllers until nothing changes (at most a bounded number of
/// rounds); returns whether anything did.
pub fn settle(state: &mut State) -> bool {
    let mut any = false;
    for _ in 0..32 {
        let before = state.store.rv();
        let sims = state.sims.clone();
        if sims.binding {
            binding::pass(state);
        }
        if sims.scheduler {
            scheduler::pass(state);
        }
        if sims.kubelet {
            kubelet::pass(state);
        }
        if state.store.rv() == before {
            break;
        }
        any = true;
    }
    any
}
