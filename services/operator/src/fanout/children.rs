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
    CloneStrategy, Digests, FanOutStatus, GroupStatus, MoverSettings, Phase, Transfer,
    TransferSpec, TransferTarget,
};
use crate::mover::pod::labels;

/// The label naming a child's parent Transfer by uid.
pub const PARENT_UID: &str = "ferry.dev/fan-out-of";

/// Longest object name.
const MAX_NAME: usize = 253;

/// The child Transfer of group `index` of `parent` (uid `uid`): `<parent>-g<index>`.
pub fn child_name(parent: &str, uid: &str, index: usize) -> String {
    let suffix = format!("-g{index}");
    if parent.len() + suffix.len() <= MAX_NAME {
        return format!("{parent}{suffix}");
    }
    let uid: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    let keep = MAX_NAME - suffix.len() - uid.len() - 1;
    format!(
        "{}-{uid}{suffix}",
        parent[..keep].trim_end_matches(['-', '.'])
    )
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

/// The child Transfer of `group`.
pub fn child(parent: &Transfer, uid: &str, group: &GroupStatus) -> Transfer {
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
