//! Render's look at a Transfer that fans out, through the reconciler's functions: the
//! groups planned over the file's Nodes, CSINodes and VolumeAttachments
//! ([`crate::fanout::plan`]), the plan recorded in the status, and one child Transfer per
//! group created, which render then plans like any Transfer (its claims, token Secret,
//! NetworkPolicy and mover pod).

use crate::controller::finalizer::FINALIZER;
use crate::controller::life::HasLife;
use crate::controller::plan;
use crate::crd::Transfer;
use crate::fanout::{self, children, facts, reconcile, relay};

use super::{made_up_uid, Look, Options, Resource, World};

/// The look at `t` when it fans out (None: it does not, or not yet).
pub(crate) fn look(
    t: &mut Transfer,
    world: &mut World<'_>,
    options: &Options,
) -> Option<(Look, String)> {
    let status = t.status.clone().unwrap_or_default();
    let copies = t.spec.source.pvc.is_none() || status.clone_strategy.as_deref() == Some("copy");
    if !t.spec.fans_out()
        || !copies
        || status.phase.is_final()
        || status.mover_pod.is_some()
        || t.metadata.deletion_timestamp.is_some()
        || t.spec.validate().is_err()
    {
        return None;
    }
    if let Some(planned) = &status.fan_out {
        let note = format!(
            "{:?}: {} targets in {} mover groups: nothing new to plan",
            status.phase,
            planned.targets,
            planned.groups.len()
        );
        return Some((Look::Settled, note));
    }
    let finalizers = t.metadata.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == FINALIZER) {
        finalizers.push(FINALIZER.to_string());
    }
    let namespace = t.metadata.namespace.clone().unwrap_or_default();
    let uid = t.metadata.uid.clone().unwrap_or_default();
    let cluster = world.cluster;
    let source_shared = match &t.spec.source.pvc {
        Some(p) => world
            .claims_in(&namespace)
            .get(&p.name)
            .is_some_and(facts::shared),
        None => true,
    };
    let classes: Vec<_> = cluster.classes.values().cloned().collect();
    let placement = facts::placement(&options.settings.mover, t);
    let driver = fanout::driver(t, &classes);
    let rooms = facts::rooms(
        &cluster.nodes,
        &cluster.csinodes,
        &cluster.attachments,
        driver,
        &placement,
    );
    match fanout::plan(t, &uid, &rooms, source_shared) {
        Ok(fan_out) => {
            let parts = relay::roles(&t.spec, &fan_out, options.tls);
            let reads = relay::describe(&fan_out, &parts);
            for (group, part) in fan_out.groups.iter().zip(&parts) {
                let mut child = children::child(t, &uid, group, part.clone());
                world.create(&child);
                child.metadata.uid = Some(made_up_uid(6, world.spawned.len()));
                world.spawned.push(Resource::Transfer(Box::new(child)));
            }
            let (next, message) = reconcile::planned(t, &status, fan_out);
            t.status = Some(next);
            let note = format!("Running (copy): {message}; {reads}");
            Some((Look::Started, note))
        }
        Err(e) => {
            let next = plan::waiting(t, &status, "NoRoom", &e.to_string());
            let note = format!(
                "Pending (NoRoom): {}",
                next.life().message.unwrap_or_default()
            );
            t.status = Some(next);
            Some((Look::Waiting, note))
        }
    }
}
