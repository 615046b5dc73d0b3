//! A Transfer into more targets than one node can attach: its targets split into mover
//! groups, each a child Transfer placed on one node, and the Transfer's status summed from
//! theirs.
//!
//! One mover writes every target of a plain Transfer, so all of them must attach on one
//! node: a CSI driver allows about 25 volumes per node on EBS, 16 to 64 on other clouds,
//! and a rollout of a golden image into hundreds of disks cannot fit. A Transfer with
//! `pvcTemplates` (claims generated, up to 100,000), more than 64 targets, or `fanOut`
//! is planned once ([`groups::plan`] over [`facts::rooms`]): the plan is recorded in its
//! status, then one child Transfer per group is created ([`children::child`]) and the
//! parent follows them ([`children::summarize`]); [`reconcile`] does those steps.

pub mod children;
pub mod facts;
pub mod groups;
pub mod reconcile;
pub mod relay;

use crate::crd::fan_out::MAX_GROUP;
use crate::crd::{FanOutStatus, GroupStatus, Transfer};

use self::groups::{NodeRoom, PlanError};

/// The groups of `parent` (uid `uid`) over nodes with `rooms`; `source_shared` when the
/// source claim may be attached on several nodes at once (ReadOnlyMany or ReadWriteMany):
/// otherwise every group runs on one node.
pub fn plan(
    parent: &Transfer,
    uid: &str,
    rooms: &[NodeRoom],
    source_shared: bool,
) -> Result<FanOutStatus, PlanError> {
    let spec = &parent.spec;
    let all = spec.all_targets();
    let reach: Vec<_> = all.iter().map(facts::reach).collect();
    let max = spec
        .fan_out
        .as_ref()
        .and_then(|f| f.max_targets_per_mover)
        .unwrap_or(MAX_GROUP)
        .min(MAX_GROUP);
    let source_claim = spec.source.pvc.is_some();
    let rooms: &[NodeRoom] = if source_claim && !source_shared {
        let best = rooms
            .iter()
            .enumerate()
            .max_by_key(|(i, r)| (r.free.unwrap_or(u32::MAX), std::cmp::Reverse(*i)))
            .map(|(i, _)| i);
        best.map_or(&[], |i| &rooms[i..=i])
    } else {
        rooms
    };
    let name = parent.metadata.name.as_deref().unwrap_or_default();
    let planned = groups::plan(&reach, rooms, max, source_claim)?;
    let groups: Vec<GroupStatus> = planned
        .into_iter()
        .enumerate()
        .map(|(i, g)| GroupStatus {
            name: children::child_name(name, uid, i),
            node: g.node,
            targets: groups::ranges(&g.targets),
            phase: Default::default(),
        })
        .collect();
    Ok(FanOutStatus {
        targets: groups.iter().map(GroupStatus::count).sum(),
        groups,
        ..FanOutStatus::default()
    })
}

/// The CSI driver of the targets' claims: the provisioner of the class the first claim to
/// create asks for (or the default class).
pub fn driver<'a>(
    parent: &Transfer,
    classes: &'a [k8s_openapi::api::storage::v1::StorageClass],
) -> Option<&'a str> {
    let spec = &parent.spec;
    let class_name = match &spec.pvc_templates {
        Some(t) => t.storage_class_name.clone(),
        None => spec
            .targets
            .iter()
            .find_map(|t| t.pvc_template.as_ref())
            .and_then(|t| t.storage_class_name.clone()),
    };
    facts::class(classes, class_name.as_deref()).map(|c| c.provisioner.as_str())
}
