//! Render's look at a resource that runs a mover (Transfer, Checksum, Backup, Restore):
//! the reconciler's steps for a resource without a mover, through the same functions: the
//! finalizer, validation, the mover limits, [`plan::attempt`], then the objects created
//! and the status written.

use std::collections::BTreeMap;

use kube::Resource as _;
use serde_json::Value;

use crate::class_defaults;
use crate::clone::plan as clone_plan;
use crate::clone::reconcile as clone_reconcile;
use crate::clone::strategy::{self, Decision};
use crate::controller::finalizer::FINALIZER;
use crate::controller::kind::{Claim, Ids, MoverKind};
use crate::controller::life::HasLife;
use crate::controller::limits::{self, Slot};
use crate::controller::plan::{self, Plan, Setup};
use crate::controller::restore::{named_snapshot, snapshot_in};
use crate::controller::users;
use crate::crd::status::condition::{reason, READY};
use crate::crd::{Backup, Phase, Restore, Transfer};
use crate::mover::layout::{CLIENT_CA_KEY, TLS_CERT_KEY, TLS_KEY_KEY, TOKEN_KEY};
use crate::schedule::build::SnapshotState;

use super::{Look, Options, RenderError, Resource, World, REDACTED};

impl Resource {
    pub(crate) fn meta_mut(&mut self) -> (&'static str, &mut kube::core::ObjectMeta) {
        match self {
            Resource::Transfer(r) => ("Transfer", r.meta_mut()),
            Resource::Checksum(r) => ("Checksum", r.meta_mut()),
            Resource::Backup(r) => ("Backup", r.meta_mut()),
            Resource::Restore(r) => ("Restore", r.meta_mut()),
        }
    }

    pub(crate) fn title(&self) -> String {
        let (kind, meta) = match self {
            Resource::Transfer(r) => ("Transfer", r.meta()),
            Resource::Checksum(r) => ("Checksum", r.meta()),
            Resource::Backup(r) => ("Backup", r.meta()),
            Resource::Restore(r) => ("Restore", r.meta()),
        };
        format!(
            "{kind} {}/{}:",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        )
    }

    pub(crate) fn to_value(&self) -> Value {
        let value = match self {
            Resource::Transfer(r) => serde_json::to_value(r.as_ref()),
            Resource::Checksum(r) => serde_json::to_value(r.as_ref()),
            Resource::Backup(r) => serde_json::to_value(strip_backup(r)),
            Resource::Restore(r) => serde_json::to_value(strip_restore(r)),
        };
        value.unwrap_or(Value::Null)
    }

    /// One look: the status (and the objects) the reconciler would write now.
    pub(crate) fn look(
        &mut self,
        world: &mut World<'_>,
        options: &Options,
    ) -> Result<(Look, String), RenderError> {
        match self {
            Resource::Transfer(r) => {
                // A goldenImage source is planned as the claim it names, templates with
                // their class's profile's modes (the spec shown stays as written).
                let written = r.spec.clone();
                let cluster = world.cluster;
                let default_class = class_defaults::default_class(cluster.classes.values());
                class_defaults::fill(r.as_mut(), |class| {
                    class_defaults::profile_among(
                        &cluster.profiles,
                        default_class.as_deref(),
                        class,
                    )
                });
                if let Some(wait) = golden_source(r.as_mut(), world) {
                    r.spec = written;
                    return Ok(wait);
                }
                let result = transfer_look(r.as_mut(), world, options);
                r.spec = written;
                result
            }
            Resource::Checksum(r) => {
                let (look, note, status) = look(r.as_mut(), world, options)?;
                r.status = status.or(r.status.take());
                Ok((look, note))
            }
            Resource::Backup(r) => {
                let key = (
                    r.metadata.namespace.clone().unwrap_or_default(),
                    r.spec.repository.clone(),
                );
                r.spec.resolved_repository = world
                    .cluster
                    .repositories
                    .get(&key)
                    .map(|repo| repo.spec.clone());
                let (look, note, status) = look(r.as_mut(), world, options)?;
                r.status = status.or(r.status.take());
                Ok((look, note))
            }
            Resource::Restore(r) => {
                let namespace = r.metadata.namespace.clone().unwrap_or_default();
                let backup = r.spec.backup.as_ref().and_then(|name| {
                    world
                        .cluster
                        .backups
                        .get(&(namespace.clone(), name.clone()))
                });
                r.spec.resolved = Some(named_snapshot(r, backup).and_then(|(repo, id)| {
                    let found = world
                        .cluster
                        .repositories
                        .get(&(namespace.clone(), repo.clone()))
                        .cloned();
                    snapshot_in(&repo, id, found)
                }));
                let (look, note, status) = look(r.as_mut(), world, options)?;
                r.status = status.or(r.status.take());
                Ok((look, note))
            }
        }
    }
}

/// A Transfer's look: a clone from another namespace, a storage clone, a fan-out, or its
/// own mover.
fn transfer_look(
    r: &mut Transfer,
    world: &mut World<'_>,
    options: &Options,
) -> Result<(Look, String), RenderError> {
    if let Some((look, note)) = super::cross::look(r, world) {
        return Ok((look, note));
    }
    if let Some((look, note)) = clone(r, world) {
        return Ok((look, note));
    }
    if let Some((look, note)) = super::fan_out::look(r, world, options) {
        return Ok((look, note));
    }
    let (look, note, status) = look(r, world, options)?;
    r.status = status.or(r.status.take());
    Ok((look, note))
}

/// A `goldenImage` source as [`crate::golden::source`] resolves it: the claim recorded
/// in the status, else the GoldenImage's current claim (recorded now); the source is then
/// that claim. None to go on planning; the look's end while the GoldenImage holds none.
fn golden_source(t: &mut Transfer, world: &mut World<'_>) -> Option<(Look, String)> {
    let golden = t.spec.source.golden_image.clone()?;
    let mut status = t.status.clone().unwrap_or_default();
    let claim = match status.source_claim.clone() {
        Some(claim) => Some(claim),
        None => {
            let namespace = t.metadata.namespace.clone().unwrap_or_default();
            let image = world
                .cluster
                .golden_images
                .get(&(namespace.clone(), golden.name.clone()));
            match image.and_then(crate::golden::current_import) {
                Some(crate::golden::Current::Claim(claim)) => Some(claim),
                // Kept as snapshots: the Transfer's own claim restored from the current one.
                Some(crate::golden::Current::Snapshot(snapshot)) => {
                    let ids = Ids {
                        namespace,
                        name: t.metadata.name.clone().unwrap_or_default(),
                        uid: t.metadata.uid.clone().unwrap_or_default(),
                    };
                    // A file holds no snapshot's restoreSize: the GoldenImage's size.
                    let restored = image.and_then(|g| {
                        crate::golden::source::restored_claim(t, &ids, g, &snapshot, None).ok()
                    });
                    restored.map(|claim| {
                        world.create_claim(&claim);
                        claim.metadata.name.unwrap_or_default()
                    })
                }
                None => None,
            }
        }
    };
    match claim {
        Some(claim) => {
            status.source_claim = Some(claim.clone());
            t.status = Some(status);
            t.spec.source = crate::golden::source::with_claim(t, &claim).spec.source;
            None
        }
        None => {
            let text = format!(
                "waiting for GoldenImage {} to hold an image: create it, or wait for its first import",
                golden.name
            );
            let next = plan::waiting(t, &status, reason::PENDING, &text);
            let note = note_of(&next);
            t.status = Some(next);
            Some((Look::Waiting, note))
        }
    }
}

/// A Transfer from a claim, as [`crate::clone::reconcile`] decides it: a storage clone is
/// planned whole (the snapshot, as ready; the target claims, as bound; Succeeded); a copy
/// records its fallback reason and goes on to the mover's look (None).
fn clone(t: &mut Transfer, world: &mut World<'_>) -> Option<(Look, String)> {
    let status = t.status.clone().unwrap_or_default();
    if t.spec.source.pvc.is_none()
        || status.clone_strategy.is_some()
        || status.phase.is_final()
        || status.mover_pod.is_some()
        || t.metadata.deletion_timestamp.is_some()
        || t.spec.validate().is_err()
    {
        return None;
    }
    let ids = Ids {
        namespace: t.metadata.namespace.clone().unwrap_or_default(),
        name: t.metadata.name.clone().unwrap_or_default(),
        uid: t.metadata.uid.clone().unwrap_or_default(),
    };
    let claims = world.claims_in(&ids.namespace);
    let source = t
        .spec
        .source
        .pvc
        .as_ref()
        .and_then(|p| claims.get(&p.name))?;
    let classes: Vec<_> = world.cluster.classes.values().cloned().collect();
    let facts = clone_reconcile::facts(
        Some(source),
        &classes,
        &world.cluster.profiles,
        &world.cluster.snapshot_classes,
    );
    let decision = strategy::decide(t, &facts);
    let mut next = status.clone();
    next.clone_strategy = Some(decision.name().to_string());
    match &decision {
        Decision::Copy { fallback } => {
            next.clone_fallback_reason = fallback.clone();
            t.status = Some(next);
            None
        }
        Decision::Refused(why) => {
            let failed = plan::failed(t, &next, reason::INVALID_SPEC, why);
            let note = note_of(&failed);
            t.status = Some(failed);
            Some((Look::Settled, note))
        }
        Decision::Snapshot { .. } | Decision::CsiClone => {
            let mut seen = clone_plan::Observed::default();
            if let Decision::Snapshot { class } = &decision {
                world.create(&clone_plan::volume_snapshot(t, &ids, class));
                next.clone_snapshot = Some(clone_plan::snapshot_name(&ids.name));
                seen.snapshot = Some(SnapshotState::Ready(None));
            }
            if let clone_plan::Step::Claims(pvcs) = clone_plan::next(t, &ids, &decision, &seen) {
                for pvc in &pvcs {
                    world.create_claim(pvc);
                }
            }
            // Render's planned claims are bound.
            seen.targets = world.claims_in(&ids.namespace);
            match clone_plan::next(t, &ids, &decision, &seen) {
                clone_plan::Step::Done(text) => {
                    next.targets = t
                        .spec
                        .targets
                        .iter()
                        .filter_map(|target| target.pvc_template.as_ref())
                        .map(|p| crate::crd::TargetStatus {
                            name: format!("pvc/{}", p.name),
                            phase: Phase::Succeeded,
                            ..Default::default()
                        })
                        .collect();
                    let done = plan::with_life(t, &next, |l| {
                        l.finish(Phase::Succeeded, reason::SUCCEEDED, Some(&text))
                    });
                    t.status = Some(done);
                    let note = format!("Succeeded ({}): {text}", decision.name());
                    Some((Look::Started, note))
                }
                clone_plan::Step::Conflict(text) => {
                    let failed = plan::failed(t, &next, reason::INVALID_SPEC, &text);
                    let note = note_of(&failed);
                    t.status = Some(failed);
                    Some((Look::Settled, note))
                }
                _ => None,
            }
        }
    }
}

/// A Backup as written back: without the never-stored lookup.
fn strip_backup(backup: &Backup) -> Backup {
    let mut b = backup.clone();
    b.spec.resolved_repository = None;
    b
}

/// A Restore as written back: without the never-stored lookup.
fn strip_restore(restore: &Restore) -> Restore {
    let mut r = restore.clone();
    r.spec.resolved = None;
    r
}

/// One look at `obj`, as the reconciler's steps for a resource without a mover: the
/// finalizer, validation, the cluster's mover limit, the plan, the node's limit. Returns
/// the status to write (None: unchanged) and the summary note.
fn look<K: MoverKind>(
    obj: &mut K,
    world: &mut World<'_>,
    options: &Options,
) -> Result<(Look, String, Option<K::Status>), RenderError> {
    let meta = obj.meta_mut();
    let ids = Ids {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
    };
    if meta.deletion_timestamp.is_some() {
        return Ok((Look::Settled, "being deleted: nothing to plan".into(), None));
    }
    let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == FINALIZER) {
        finalizers.push(FINALIZER.to_string());
    }
    let status = obj.status().cloned().unwrap_or_default();
    let life = status.life();
    if life.phase.is_final() {
        return Ok((
            Look::Settled,
            format!("{:?}: nothing to plan", life.phase),
            None,
        ));
    }
    if let Some(pod) = &life.mover_pod {
        let note = format!(
            "{:?}: mover pod {pod} exists already: nothing new to plan",
            life.phase
        );
        return Ok((Look::Settled, note, None));
    }
    if let Err(e) = obj.validate() {
        let message = format!("{e}: fix the spec and create the {} again", K::KIND);
        let next = plan::failed(obj, &status, reason::INVALID_SPEC, &message);
        return Ok((Look::Settled, note_of(&next), Some(next)));
    }
    let settings = &options.settings;
    let slot = |world: &World<'_>, node: Option<&str>| {
        limits::slot(&world.movers, &[], &ids.uid, node, settings)
    };
    if let Slot::Queued(message) = slot(world, None) {
        let next = plan::waiting(obj, &status, reason::QUEUED, &message);
        return Ok((Look::Waiting, note_of(&next), Some(next)));
    }
    // As the reconciler reads them: the claims the resource names, and the namespace's
    // pods only when one of them attaches to one node at a time.
    let named: Vec<(String, bool)> = obj
        .claims()
        .iter()
        .map(|c| match c {
            Claim::Existing(name) => (name.to_string(), true),
            Claim::Template(t, _) => (t.name.clone(), false),
        })
        .collect();
    let claims = world.claims_named(&ids.namespace, named.iter().map(|(n, _)| n.as_str()));
    let single_node = named
        .iter()
        .any(|(n, existing)| *existing && claims.get(n).is_some_and(users::single_node));
    let observed = plan::Observed {
        claims,
        pods: if single_node {
            world.pods_in(&ids.namespace)
        } else {
            Vec::new()
        },
        secrets: world.cluster.secrets_in(&ids.namespace),
        assigns_ids: world.cluster.assigning_ids.contains(&ids.namespace),
    };
    let setup = Setup {
        settings,
        tls: options.tls,
    };
    let failed = |source| RenderError::Plan {
        kind: K::KIND,
        namespace: ids.namespace.clone(),
        name: ids.name.clone(),
        source: Box::new(source),
    };
    let attempt = match plan::attempt(obj, &ids, &status, &observed, setup).map_err(failed)? {
        Plan::Wait { reason, message } => {
            let next = plan::waiting(obj, &status, reason, &message);
            return Ok((Look::Waiting, note_of(&next), Some(next)));
        }
        Plan::Fail { reason, message } => {
            let next = plan::failed(obj, &status, reason, &message);
            return Ok((Look::Settled, note_of(&next), Some(next)));
        }
        Plan::Start(attempt) => attempt,
    };
    if let Slot::Queued(message) = slot(world, limits::pinned_node(&attempt.pod)) {
        let next = plan::waiting(obj, &status, reason::QUEUED, &message);
        return Ok((Look::Waiting, note_of(&next), Some(next)));
    }
    for pvc in &attempt.new_claims {
        world.create_claim(pvc);
    }
    let mut data = BTreeMap::from([(TOKEN_KEY.to_string(), REDACTED.to_string())]);
    if options.tls {
        for key in [TLS_CERT_KEY, TLS_KEY_KEY, CLIENT_CA_KEY] {
            data.insert(key.to_string(), REDACTED.to_string());
        }
    }
    world.create(&plan::token_secret(obj, &ids, &attempt.token_secret, data));
    if let Some(policy) = &attempt.network_policy {
        world.create(policy);
    }
    let running = world.run_mover(&attempt.pod);
    let (next, _) = plan::starting(obj, &status, &attempt);
    let (next, message) = plan::running(obj, &next, &running);
    let note = format!("Running: {message} (render starts no job)");
    Ok((Look::Started, note, Some(next)))
}

/// The summary note of a status: its phase, and the reason and message of its Ready
/// condition.
fn note_of<S: HasLife>(status: &S) -> String {
    let life = status.life();
    let phase = match life.phase {
        Phase::Pending => "Pending",
        Phase::Failed => "Failed",
        other => return format!("{other:?}"),
    };
    let (why, message) = life
        .condition(READY)
        .map(|c| (c.reason.clone(), c.message.clone()))
        .unwrap_or_default();
    format!("{phase} ({why}): {message}")
}
