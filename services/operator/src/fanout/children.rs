//! The child Transfers of a Transfer that fans out, and the Transfer's status summed from
//! theirs, as pure functions.
//!
//! Each group is a child Transfer: the parent's source, options, digest and mover settings,
//! the group's targets listed, its mover placed on the group's node, and strategy `copy`
//! (the parent decided). So a group is reconciled, retried, resumed and cancelled exactly
//! as any Transfer, and its per-target states live in its own status; the parent keeps
//! only the groups' phases and counts.

use std::collections::BTreeMap;

use kube::api::ObjectMeta;
use kube::Resource;

use crate::crd::status::Progress;
use crate::crd::{
    CloneStrategy, Digests, FanOutStatus, GroupRelay, GroupStatus, MoverSettings, Phase, Transfer,
    TransferSpec, TransferTarget,
};
use crate::mover::pod::labels;

/// The label naming a child's parent Transfer by uid.
pub const PARENT_UID: &str = "ferry.dev/fan-out-of";

/// Longest object name.
const MAX_NAME: usize = 253;

/// The child Transfer of group `index` of `parent` (uid `uid`): `<parent>-g<index>`.
pub fn child_name(parent: &str, uid: &str, index: usize) -> String {
    crate::controller::names::bounded(parent, uid, &format!("-g{index}"), MAX_NAME)
}

/// Target `index` of `spec`: the listed ones first, then the generated ones.
pub fn target_at(spec: &TransferSpec, index: u32) -> Option<TransferTarget> {
    let i = index as usize;
    if let Some(t) = spec.targets.get(i) {
        return Some(t.clone());
    }
    let templates = spec.pvc_templates.as_ref()?;
    let generated = u32::try_from(i - spec.targets.len()).ok()?;
    (generated < templates.count).then(|| templates.target(generated))
}

/// The child Transfer of `group`, with its part in the fan-out's relay.
pub fn child(
    parent: &Transfer,
    uid: &str,
    group: &GroupStatus,
    relay: Option<GroupRelay>,
) -> Transfer {
    let spec = &parent.spec;
    let mut mover: MoverSettings = spec.mover.clone().unwrap_or_default();
    mover.node_name = group.node.clone();
    let targets = group.indices().filter_map(|i| target_at(spec, i)).collect();
    Transfer {
        metadata: ObjectMeta {
            name: Some(group.name.clone()),
            namespace: parent.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (labels::MANAGED_BY.to_string(), "ferry-operator".to_string()),
                (PARENT_UID.to_string(), uid.to_string()),
            ])),
            owner_references: parent.controller_owner_ref(&()).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: TransferSpec {
            source: spec.source.clone(),
            targets,
            options: spec.options.clone(),
            expected_digest: spec.expected_digest.clone(),
            mover: Some(mover),
            claim_retention: spec.claim_retention,
            clone_strategy: Some(CloneStrategy::Copy),
            pvc_templates: None,
            fan_out: None,
            relay,
        },
        status: None,
    }
}

/// The parent's fan-out status and progress from its children (by name; a child not
/// there yet is Pending), and the final phase with its message once every group ended.
#[derive(Debug)]
pub struct Summary {
    /// The groups with their phases, and the counts.
    pub fan_out: FanOutStatus,
    /// Every group's bytes added up.
    pub progress: Progress,
    /// The source's digest, when every group that computed one agrees.
    pub digests: Option<Digests>,
    /// Succeeded, or Failed with the reason, once every group ended; None before.
    pub end: Option<(Phase, String)>,
}

/// Sums the children's statuses into the parent's.
pub fn summarize(planned: &FanOutStatus, children: &BTreeMap<String, &Transfer>) -> Summary {
    let mut fan_out = planned.clone();
    fan_out.targets = planned.groups.iter().map(GroupStatus::count).sum();
    fan_out.targets_succeeded = 0;
    fan_out.targets_failed = 0;
    fan_out.groups_running = 0;
    fan_out.groups_succeeded = 0;
    fan_out.groups_failed = 0;
    let mut progress = Progress::default();
    let mut sources = Vec::new();
    let mut failures = Vec::new();
    for group in &mut fan_out.groups {
        let status = children.get(&group.name).and_then(|c| c.status.as_ref());
        group.phase = status.map_or(Phase::Pending, |s| s.phase);
        let Some(status) = status else { continue };
        match group.phase {
            Phase::Running => fan_out.groups_running += 1,
            Phase::Succeeded => fan_out.groups_succeeded += 1,
            Phase::Failed | Phase::Cancelled => {
                fan_out.groups_failed += 1;
                failures.push(format!(
                    "{}: {}",
                    group.name,
                    status.message.as_deref().unwrap_or("failed")
                ));
            }
            Phase::Pending => {}
        }
        if group.phase == Phase::Succeeded {
            fan_out.targets_succeeded += group.count();
        } else {
            for t in &status.targets {
                match t.phase {
                    Phase::Succeeded => fan_out.targets_succeeded += 1,
                    Phase::Failed | Phase::Cancelled => fan_out.targets_failed += 1,
                    _ => {}
                }
            }
        }
        if let Some(p) = status.progress {
            progress.total_bytes += p.total_bytes;
            progress.done_bytes += p.done_bytes;
            progress.resumed_bytes += p.resumed_bytes;
            progress.committed_bytes += p.committed_bytes;
        }
        if let Some(d) = status.digests.as_ref().and_then(|d| d.source.clone()) {
            sources.push(d);
        }
    }
    sources.sort();
    sources.dedup();
    let groups = fan_out.groups.len();
    let ended = fan_out.groups_succeeded + fan_out.groups_failed;
    let end = if sources.len() > 1 {
        Some((
            Phase::Failed,
            format!(
                "the groups read different images ({}): the source changed during the rollout; delete the targets and run it again",
                sources.join(", ")
            ),
        ))
    } else if ended as usize == groups && !failures.is_empty() {
        let shown: Vec<&str> = failures.iter().take(5).map(String::as_str).collect();
        let more = failures.len().saturating_sub(shown.len());
        Some((
            Phase::Failed,
            format!(
                "{} of {groups} mover groups failed ({} of {} targets written): {}{}",
                failures.len(),
                fan_out.targets_succeeded,
                fan_out.targets,
                shown.join("; "),
                if more > 0 {
                    format!("; and {more} more")
                } else {
                    String::new()
                }
            ),
        ))
    } else if ended as usize == groups {
        Some((
            Phase::Succeeded,
            format!(
                "{} targets written by {groups} mover groups",
                fan_out.targets
            ),
        ))
    } else {
        None
    };
    let digests = (sources.len() == 1).then(|| Digests {
        source: sources.pop(),
        targets: None,
    });
    Summary {
        fan_out,
        progress,
        digests,
        end,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parent() -> Transfer {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "fleet", "namespace": "vms", "uid": "p-1"},
            "spec": {
                "source": {"url": "https://images.example.com/golden.img"},
                "targets": [{"url": "nbd://backup.example.com/golden"}],
                "pvcTemplates": {"namePrefix": "vm-", "count": 5, "size": "10Gi"},
            },
        }))
        .unwrap()
    }

    fn planned() -> FanOutStatus {
        FanOutStatus {
            groups: vec![
                GroupStatus {
                    name: "fleet-g0".into(),
                    node: Some("a".into()),
                    targets: vec![[0, 3]],
                    phase: Phase::Pending,
                },
                GroupStatus {
                    name: "fleet-g1".into(),
                    node: Some("b".into()),
                    targets: vec![[3, 6]],
                    phase: Phase::Pending,
                },
            ],
            ..FanOutStatus::default()
        }
    }

    fn child_in(phase: &str, message: Option<&str>, source: Option<&str>) -> Transfer {
        let mut status = json!({"phase": phase});
        if let Some(m) = message {
            status["message"] = json!(m);
        }
        if let Some(d) = source {
            status["digests"] = json!({"source": d});
        }
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "c", "namespace": "vms"},
            "spec": {"source": {"url": "https://x/y"}, "targets": [{"url": "nbd://h/e"}]},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn listed_targets_come_first_then_the_generated_ones() {
        let p = parent();
        assert_eq!(
            target_at(&p.spec, 0).unwrap().endpoint.url.as_deref(),
            Some("nbd://backup.example.com/golden")
        );
        let generated = target_at(&p.spec, 1).unwrap().pvc_template.unwrap();
        assert_eq!(generated.name, "vm-0");
        assert_eq!(
            target_at(&p.spec, 5).unwrap().pvc_template.unwrap().name,
            "vm-4"
        );
        assert!(target_at(&p.spec, 6).is_none());
        let child = child(&p, "p-1", &planned().groups[1], None);
        let names: Vec<String> = child
            .spec
            .targets
            .iter()
            .map(|t| t.pvc_template.as_ref().unwrap().name.clone())
            .collect();
        assert_eq!(names, ["vm-2", "vm-3", "vm-4"]);
        assert_eq!(child.spec.mover.unwrap().node_name.as_deref(), Some("b"));
        let long = "x".repeat(260);
        let a = child_name(&long, "0b0e5e1c-1111", 12);
        assert!(a.len() <= 253 && a.ends_with("-0b0e5e1c-g12"), "{a}");
    }

    #[test]
    fn the_rollout_fails_once_every_group_ended_and_one_failed_naming_it() {
        let failed = child_in("Failed", Some("pvc/vm-4: no space"), None);
        let done = child_in("Succeeded", None, None);
        let running = child_in("Running", None, None);
        let mut children = BTreeMap::from([
            ("fleet-g0".to_string(), &done),
            ("fleet-g1".to_string(), &running),
        ]);
        assert!(summarize(&planned(), &children).end.is_none());
        children.insert("fleet-g1".into(), &failed);
        let s = summarize(&planned(), &children);
        assert_eq!(
            s.end,
            Some((
                Phase::Failed,
                "1 of 2 mover groups failed (3 of 6 targets written): fleet-g1: pvc/vm-4: no space"
                    .to_string()
            ))
        );
        assert_eq!(s.fan_out.groups_failed, 1);
        assert_eq!(s.fan_out.groups[1].phase, Phase::Failed);
    }

    #[test]
    fn groups_that_read_different_images_fail_the_rollout() {
        let a = child_in("Succeeded", None, Some("sha256:aa"));
        let b = child_in("Running", None, Some("sha256:bb"));
        let children = BTreeMap::from([("fleet-g0".to_string(), &a), ("fleet-g1".to_string(), &b)]);
        let s = summarize(&planned(), &children);
        let (phase, message) = s.end.unwrap();
        assert_eq!(phase, Phase::Failed);
        assert!(message.contains("sha256:aa, sha256:bb"), "{message}");
        assert!(
            message.contains("the source changed during the rollout"),
            "{message}"
        );
    }
}
