//! Mover limits, counted from the store of mover pods (no API request): at most N movers
//! in the cluster and M per node. A new mover over the cluster limit waits (Queued).
//! The node limit holds for movers whose node is known before they start: pinned by a
//! claim in use there ([`placement`]) or by a node selector naming the host; such a mover
//! waits (Queued) while its node is full. The scheduler places the others: a mover is never
//! kept off nodes by an affinity, which would strand it where only a full node can attach
//! its volume. A slot is taken under one lock ([`Context::take_slot`]) and held as a
//! reservation until the mover shows up in the store, so reconciles running at once
//! cannot take the same last slot.
//!
//! [`Context::take_slot`]: super::context::Context::take_slot
//!
//! [`placement`]: crate::mover::placement

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::mover::placement;
use crate::mover::pod::labels;

use super::settings::OperatorSettings;

/// The node label the scheduler fills in.
pub const HOSTNAME: &str = "kubernetes.io/hostname";

/// Whether a new mover may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// It may.
    Free,
    /// It must wait: why.
    Queued(String),
}

fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

/// The slot of a new mover of the resource `uid` (its own older pods do not count),
/// pinned to `node` when its node selector names one. `reserved` are the nodes (None: not
/// known) of movers of other resources created but not in the store yet.
pub fn slot(
    pods: &[Arc<Pod>],
    reserved: &[Option<&str>],
    uid: &str,
    node: Option<&str>,
    settings: &OperatorSettings,
) -> Slot {
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
    let running = others.len() + reserved.len();
    if settings.max_movers > 0 && running >= settings.max_movers {
        return Slot::Queued(format!(
            "{running} movers run, the operator's limit is {}: waiting for one to finish",
            settings.max_movers
        ));
    }
    let limit = settings.max_movers_per_node;
    let (Some(node), true) = (node, limit > 0) else {
        return Slot::Free;
    };
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &others {
        let spec = p.spec.as_ref();
        let on = spec.and_then(|s| s.node_name.as_deref().or(placement::pinned_node(s)));
        if let Some(n) = on {
            *per_node.entry(n).or_default() += 1;
        }
    }
    for n in reserved.iter().flatten() {
        *per_node.entry(n).or_default() += 1;
    }
    if per_node.get(node).copied().unwrap_or(0) >= limit {
        return Slot::Queued(format!(
            "node {node} runs {limit} movers, the operator's limit per node: waiting for one to finish"
        ));
    }
    Slot::Free
}

/// The node a mover will run on before it is scheduled: its claim's user's node, or the
/// host its node selector names.
pub fn pinned_node(pod: &Pod) -> Option<&str> {
    let spec = pod.spec.as_ref()?;
    placement::pinned_node(spec).or_else(|| {
        spec.node_selector
            .as_ref()?
            .get(HOSTNAME)
            .map(String::as_str)
    })
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
            image_pull_secrets: vec![],
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
            matches!(slot(&pods, &[], "x", None, &settings(3, 0)), Slot::Queued(m) if m.contains("limit is 3"))
        );
        // Its own pod does not count.
        assert_eq!(slot(&pods, &[], "c", None, &settings(3, 0)), Slot::Free);
        // Not pinned: the scheduler places it, whatever the nodes run.
        assert_eq!(slot(&pods, &[], "x", None, &settings(0, 2)), Slot::Free);
        assert!(
            matches!(slot(&pods, &[], "x", Some("n1"), &settings(0, 2)), Slot::Queued(m) if m.contains("node n1"))
        );
        assert_eq!(
            slot(&pods, &[], "x", Some("n2"), &settings(0, 2)),
            Slot::Free
        );
        // A pinned mover not scheduled yet counts on its node.
        let mut pinned = Pod {
            metadata: pods[2].metadata.clone(),
            spec: Some(PodSpec::default()),
            status: pods[2].status.clone(),
        };
        crate::mover::placement::pin(
            pinned.spec.as_mut().unwrap(),
            &crate::mover::InUse {
                pod: "vm".into(),
                node: "n2".into(),
                tolerations: vec![],
                writes: false,
            },
        );
        let with_pinned = vec![pods[0].clone(), Arc::new(pinned.clone())];
        assert_eq!(pinned_node(&pinned), Some("n2"));
        // Reserved slots count like movers in the store.
        assert!(
            matches!(slot(&pods[..1], &[None, Some("n3")], "x", None, &settings(3, 0)), Slot::Queued(m) if m.starts_with("3 movers run"))
        );
        assert!(
            matches!(slot(&[], &[Some("n3")], "x", Some("n3"), &settings(0, 1)), Slot::Queued(m) if m.contains("node n3"))
        );
        assert!(
            matches!(slot(&with_pinned, &[], "x", Some("n2"), &settings(0, 1)), Slot::Queued(m) if m.contains("node n2"))
        );
    }
}
