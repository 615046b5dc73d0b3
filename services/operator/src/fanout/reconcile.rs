//! The reconciler of a Transfer that fans out. One reconcile does one step:
//!
//! 1. no plan in the status: the nodes, their CSINodes and VolumeAttachments and the
//!    storage classes are listed once, the groups planned ([`super::plan`]) and recorded
//!    (phase Running, event `FanOutPlanned`); no node with room leaves it Pending
//!    (`NoRoom`) and looks again later;
//! 2. children missing: created, at most [`CREATES_PER_STEP`] per reconcile;
//! 3. otherwise the children, read from the Transfer controller's store (their changes
//!    wake the parent), summed into the status; written when a group's phase or a count
//!    changed, or the bytes moved by a hundredth of the total, so hundreds of groups
//!    reporting progress do not become a write of the parent each.
//!
//! Deleting the Transfer deletes its children (they are owned by it), and each child
//! cancels its own mover.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::api::{ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::Api;

use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::kind::{write_status, Ids};
use crate::controller::life::{now, HasLife};
use crate::controller::plan as mover_plan;
use crate::crd::status::condition::{reason, READY, RUNNING};
use crate::crd::{Phase, Transfer, TransferStatus};

use super::children::{self, PARENT_UID};
use super::{facts, relay};

/// Children created per reconcile: a rollout of thousands of groups is created in steps,
/// each a requeue, so other resources' reconciles are not held up.
pub const CREATES_PER_STEP: usize = 50;

/// How often a fan-out that waits for room looks again.
const NO_ROOM_AGAIN: Duration = Duration::from_secs(30);

/// The Running condition's reason while groups run.
pub const FANNING_OUT: &str = "FanningOut";

/// One reconcile of a Transfer that fans out (valid, with its finalizer, not final).
pub async fn reconcile(obj: Arc<Transfer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ids = Ids::of(obj.as_ref())?;
    let status = obj.status.clone().unwrap_or_default();
    let Some(planned) = status.fan_out.clone() else {
        return plan_groups(&ctx, &obj, &ids, &status).await;
    };
    let children = children_of(&ctx, &ids).await?;
    let missing: Vec<_> = planned
        .groups
        .iter()
        .filter(|g| !children.contains_key(&g.name))
        .take(CREATES_PER_STEP)
        .collect();
    if !missing.is_empty() {
        let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), &ids.namespace);
        let parts = relay::roles(&obj.spec, &planned, ctx.mover_ca().is_some());
        for group in &missing {
            let index = planned.groups.iter().position(|g| g.name == group.name);
            let part = index.and_then(|i| parts[i].clone());
            let child = children::child(&obj, &ids.uid, group, part);
            match api.create(&PostParams::default(), &child).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    let views: BTreeMap<String, &Transfer> = children
        .iter()
        .map(|(name, child)| (name.clone(), child.as_ref()))
        .collect();
    relay::end_served_out(&ctx, &views).await;
    let summary = children::summarize(&planned, &views);
    let next = summed(&obj, &status, summary);
    if worth_writing(&status, &next) {
        let ended = next.phase.is_final();
        write_status(&ctx, &ids, obj.as_ref(), &next).await?;
        if ended {
            let text = next.message.clone().unwrap_or_default();
            let warning = next.phase != Phase::Succeeded;
            let why = if warning {
                reason::FAILED
            } else {
                reason::SUCCEEDED
            };
            ctx.event(obj.as_ref(), warning, why, &text).await;
            return Ok(Action::await_change());
        }
    }
    Ok(Action::requeue(ctx.settings.resync))
}

/// The status with the children's summary: counts, progress, phase, and the end.
pub fn summed(
    obj: &Transfer,
    status: &TransferStatus,
    summary: children::Summary,
) -> TransferStatus {
    let mut next = status.clone();
    next.fan_out = Some(summary.fan_out);
    if summary.digests.is_some() {
        next.digests = summary.digests;
    }
    mover_plan::with_life(obj, &next, |l| {
        l.progress = Some(summary.progress);
        match &summary.end {
            Some((phase, message)) => {
                let why = if *phase == Phase::Succeeded {
                    reason::SUCCEEDED
                } else {
                    reason::FAILED
                };
                l.finish(*phase, why, Some(message));
            }
            None => {
                let f = next.fan_out.as_ref();
                let message = f.map_or_else(String::new, |f| {
                    format!(
                        "{} of {} mover groups running, {} done; {} of {} targets written",
                        f.groups_running,
                        f.groups.len(),
                        f.groups_succeeded,
                        f.targets_succeeded,
                        f.targets
                    )
                });
                l.phase = Phase::Running;
                l.set_condition(RUNNING, true, FANNING_OUT, &message);
                l.set_condition(READY, false, FANNING_OUT, &message);
            }
        }
    })
}

/// Whether `next` is worth a write: anything but the bytes changed, or the bytes by at
/// least a hundredth of the total.
pub fn worth_writing(before: &TransferStatus, next: &TransferStatus) -> bool {
    let bytes = |s: &TransferStatus| s.progress.unwrap_or_default();
    let (a, b) = (bytes(before), bytes(next));
    let mut same_but_bytes = next.clone();
    same_but_bytes.progress = before.progress;
    if !crate::controller::life::same_status(before, &same_but_bytes) {
        return true;
    }
    let step = (b.total_bytes / 100).max(1);
    b.done_bytes.abs_diff(a.done_bytes) >= step || a.total_bytes != b.total_bytes
}

/// The status that records `fan_out`, Running, and its message ("N targets in G mover
/// groups over K nodes").
pub fn planned(
    obj: &Transfer,
    status: &TransferStatus,
    fan_out: crate::crd::FanOutStatus,
) -> (TransferStatus, String) {
    let nodes: std::collections::BTreeSet<&str> = fan_out
        .groups
        .iter()
        .filter_map(|g| g.node.as_deref())
        .collect();
    let message = format!(
        "{} targets in {} mover groups over {} nodes",
        fan_out.targets,
        fan_out.groups.len(),
        nodes.len()
    );
    let mut next = status.clone();
    next.fan_out = Some(fan_out);
    next.clone_strategy.get_or_insert_with(|| "copy".into());
    let next = mover_plan::with_life(obj, &next, |l| {
        l.phase = Phase::Running;
        l.message = None;
        l.start_time.get_or_insert_with(now);
        l.set_condition(RUNNING, true, FANNING_OUT, &message);
        l.set_condition(READY, false, FANNING_OUT, &message);
    });
    (next, message)
}

/// Plans the groups once and records the plan.
async fn plan_groups(
    ctx: &Context,
    obj: &Transfer,
    ids: &Ids,
    status: &TransferStatus,
) -> Result<Action, Error> {
    let client = ctx.client.clone();
    let list = ListParams::default();
    let nodes = Api::<Node>::all(client.clone()).list(&list).await?.items;
    let csinodes = Api::<CSINode>::all(client.clone()).list(&list).await?.items;
    let attachments = Api::<VolumeAttachment>::all(client.clone())
        .list(&list)
        .await?
        .items;
    let classes = Api::<StorageClass>::all(client.clone())
        .list(&list)
        .await?
        .items;
    let source_shared = match &obj.spec.source.pvc {
        Some(p) => Api::<PersistentVolumeClaim>::namespaced(client, &ids.namespace)
            .get_opt(&p.name)
            .await?
            .is_some_and(|c| facts::shared(&c)),
        None => true,
    };
    let placement = facts::placement(&ctx.settings.mover, obj);
    let driver = super::driver(obj, &classes);
    let rooms = facts::rooms(&nodes, &csinodes, &attachments, driver, &placement);
    match super::plan(obj, &ids.uid, &rooms, source_shared) {
        Ok(fan_out) => {
            let parts = relay::roles(&obj.spec, &fan_out, ctx.mover_ca().is_some());
            let reads = relay::describe(&fan_out, &parts);
            let (next, message) = planned(obj, status, fan_out);
            write_status(ctx, ids, obj, &next).await?;
            let text = format!("{message}; {reads}");
            ctx.event(obj, false, "FanOutPlanned", &text).await;
            Ok(Action::requeue(Duration::ZERO))
        }
        Err(e) => {
            let next = mover_plan::waiting(obj, status, "NoRoom", &e.to_string());
            if next.life() != status.life() {
                write_status(ctx, ids, obj, &next).await?;
            }
            Ok(Action::requeue(NO_ROOM_AGAIN))
        }
    }
}

/// The children of the Transfer, from the controller's store (or listed, where no store
/// was set).
async fn children_of(ctx: &Context, ids: &Ids) -> Result<BTreeMap<String, Arc<Transfer>>, Error> {
    let mine = |t: &Transfer| {
        t.metadata.namespace.as_deref() == Some(ids.namespace.as_str())
            && t.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(PARENT_UID))
                .is_some_and(|u| u == &ids.uid)
    };
    let found: Vec<Arc<Transfer>> = match ctx.transfers() {
        Some(store) => store.state().into_iter().filter(|t| mine(t)).collect(),
        None => {
            let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), &ids.namespace);
            let selector = format!("{PARENT_UID}={}", ids.uid);
            api.list(&ListParams::default().labels(&selector))
                .await?
                .items
                .into_iter()
                .map(Arc::new)
                .collect()
        }
    };
    Ok(found
        .into_iter()
        .filter_map(|t| Some((t.metadata.name.clone()?, t)))
        .collect())
}
