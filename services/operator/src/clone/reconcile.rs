//! A Transfer made by the storage: the strategy decided once from what the cluster says
//! ([`observe`], [`super::strategy::decide`]) and recorded in the status; then, for a
//! snapshot or a CSI clone, the steps of [`super::plan::next`] carried out one per
//! reconcile, until every target claim is bound and the snapshot deleted. A copy, and
//! everything a Transfer shares with the other kinds (the finalizer, deletion, a final
//! phase, an invalid spec), goes to the mover reconciler.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::Api;

use crate::controller::claims::{self, mode_of};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::finalizer;
use crate::controller::kind::{write_status, Ids};
use crate::controller::pods::Created;
use crate::controller::reconcile::update;
use crate::controller::{plan as mover_plan, reconcile};
use crate::crd::status::condition::{reason, RUNNING};
use crate::crd::validate::quantity_bytes;
use crate::crd::{Phase, StorageClassProfile, TargetStatus, Transfer, TransferStatus};
use crate::schedule::build::{snapshot_state, volume_snapshot_api};

use super::plan::{self, Observed, Step};
use super::strategy::{self, ClaimFacts, ClassFacts, Decision, Facts, SnapshotClassFacts};

/// How often a clone in progress is looked at (the Transfer does not watch claims or
/// snapshots).
const LOOK_AGAIN: Duration = Duration::from_secs(5);

/// The annotation that marks a VolumeSnapshotClass its driver's default.
const DEFAULT_SNAPSHOT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";

/// A Transfer as the reconciler should see it once a resolver of its source (a
/// GoldenImage's claim, a fan-out group's relay) has looked at it.
#[derive(Debug)]
pub enum Resolved {
    /// Reconcile this.
    Ready(Arc<Transfer>),
    /// Done for now.
    Done(Action),
}

/// One reconcile of a Transfer.
pub async fn reconcile_transfer(obj: Arc<Transfer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let obj = ctx.class_defaults.fill_transfer(obj);
    let obj = match crate::golden::source::resolve(obj, &ctx).await? {
        Resolved::Ready(obj) => obj,
        Resolved::Done(action) => return Ok(action),
    };
    let obj = match crate::fanout::relay::resolve(obj, &ctx).await? {
        Resolved::Ready(obj) => obj,
        Resolved::Done(action) => return Ok(action),
    };
    let status = obj.status.clone().unwrap_or_default();
    let common = obj.metadata.deletion_timestamp.is_some()
        || !finalizer::has(obj.as_ref())
        || status.phase.is_final()
        || obj.spec.validate().is_err();
    let namespace = obj.metadata.namespace.clone().unwrap_or_default();
    // A Transfer that made a child in another namespace stays a clone across namespaces
    // by that record, whatever its spec says now.
    let recorded = obj
        .metadata
        .uid
        .as_deref()
        .and_then(|uid| super::cross::recorded(status.clone_transfer.as_deref(), uid));
    let wanted = obj.spec.source_namespace(&namespace).map(String::from);
    if recorded.is_some() || wanted.is_some() {
        if !common {
            return super::cross_reconcile::reconcile(obj, ctx).await;
        }
        // Deleted or done: the hand-overs that did not finish are undone and the child in
        // the source namespace goes (owner references cannot cross namespaces), then the
        // rest as for any Transfer.
        let uid = obj.metadata.uid.as_deref();
        let child_at = uid.and_then(|uid| {
            recorded.or_else(|| wanted.map(|ns| (ns, super::cross::child_name(uid))))
        });
        if let (Some(uid), Some((child_namespace, child_name))) = (uid, child_at) {
            let deleting =
                obj.metadata.deletion_timestamp.is_some() && finalizer::has(obj.as_ref());
            // A final Transfer costs a request only while its child is still there.
            let child =
                kube::runtime::reflector::ObjectRef::new(&child_name).within(&child_namespace);
            let child_left =
                status.phase.is_final() && ctx.transfers().is_some_and(|s| s.get(&child).is_some());
            if deleting || child_left {
                super::cross_reconcile::release_volumes(&ctx, &namespace, uid).await?;
                super::cross_reconcile::delete_child(&ctx, &child_namespace, &child_name, uid)
                    .await?;
            }
        }
        return reconcile(obj, ctx).await;
    }
    let copies = obj.spec.source.pvc.is_none() || status.clone_strategy.as_deref() == Some("copy");
    if !common && obj.spec.fans_out() && copies && status.mover_pod.is_none() {
        return crate::fanout::reconcile::reconcile(obj, ctx).await;
    }
    let shared = common
        || obj.spec.source.pvc.is_none()
        || status.clone_strategy.as_deref() == Some("copy")
        || status.mover_pod.is_some();
    if shared {
        return reconcile(obj, ctx).await;
    }
    let ids = Ids::of(obj.as_ref())?;
    // The classes are read to decide, once; a decided clone's looks read only its own
    // snapshot and claims (the snapshot's class is looked up again only to remake it).
    let decision = match status.clone_strategy.as_deref() {
        None => {
            let facts = observe(&ctx, &obj, &ids).await?;
            if facts.source.is_none() {
                return reconcile(obj, ctx).await;
            }
            strategy::decide(&obj, &facts)
        }
        Some("csi-clone") => Decision::CsiClone,
        Some(_) => Decision::Snapshot {
            class: String::new(),
        },
    };
    match decision {
        Decision::Copy { fallback } => {
            let mut next = status.clone();
            next.clone_strategy = Some("copy".into());
            next.clone_fallback_reason = fallback.clone();
            write_status(&ctx, &ids, obj.as_ref(), &next).await?;
            if let Some(why) = fallback {
                let text = format!("copying: no storage clone ({why})");
                ctx.event(obj.as_ref(), false, "CloneFallback", &text).await;
            }
            Ok(Action::requeue(Duration::ZERO))
        }
        Decision::Refused(why) => {
            let next = mover_plan::failed(obj.as_ref(), &status, reason::INVALID_SPEC, &why);
            write_status(&ctx, &ids, obj.as_ref(), &next).await?;
            ctx.event(obj.as_ref(), true, reason::INVALID_SPEC, &why)
                .await;
            Ok(Action::await_change())
        }
        decision => clone_step(&ctx, &obj, &ids, &status, &decision).await,
    }
}

/// One step of a clone by the storage.
async fn clone_step(
    ctx: &Context,
    obj: &Transfer,
    ids: &Ids,
    status: &TransferStatus,
    decision: &Decision,
) -> Result<Action, Error> {
    let observed = observe_clone(ctx, obj, ids, decision).await?;
    let mut step = plan::next(obj, ids, decision, &observed);
    if let (Step::Snapshot(_), Decision::Snapshot { class }) = (&step, decision) {
        if class.is_empty() {
            // A decided snapshot that is gone before the targets were made: made again in
            // the class a decision names now (the cluster's default when none does).
            let facts = observe(ctx, obj, ids).await?;
            let class = match strategy::decide(obj, &facts) {
                Decision::Snapshot { class } => class,
                _ => String::new(),
            };
            step = Step::Snapshot(Box::new(plan::volume_snapshot(obj, ids, &class)));
        }
    }
    let mut next = status.clone();
    next.clone_strategy = Some(decision.name().to_string());
    if let Decision::Snapshot { .. } = decision {
        next.clone_snapshot = Some(plan::snapshot_name(&ids.name));
    }
    let targets: Vec<String> = obj
        .spec
        .all_targets()
        .iter()
        .filter_map(|t| t.pvc_template.as_ref().map(|p| p.name.clone()))
        .collect();
    let (phase, why, message) = match step {
        Step::Snapshot(snapshot) => {
            let api: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), &ids.namespace, &volume_snapshot_api());
            match api.create(&PostParams::default(), snapshot.as_ref()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(kube::Error::Api(e)) if claims::refused(e.code) => {
                    let text = format!(
                        "the API server refused to create the VolumeSnapshot: {}",
                        e.message
                    );
                    let waiting = mover_plan::waiting(obj, status, reason::REFUSED, &text);
                    update(ctx, ids, obj, status, &waiting).await?;
                    return Ok(Action::requeue(LOOK_AGAIN));
                }
                Err(e) => return Err(e.into()),
            }
            let name = plan::snapshot_name(&ids.name);
            let text = format!("created VolumeSnapshot {name} of the source");
            ctx.event(obj, false, "SnapshotCreated", &text).await;
            (Phase::Running, plan::SNAPSHOT_PENDING, text)
        }
        Step::Claims(pvcs) => {
            for pvc in &pvcs {
                let name = pvc.metadata.name.as_deref().unwrap_or_default();
                if let Created::Refused(why) = claims::create(ctx, pvc).await? {
                    let text = format!("the API server refused to create pvc/{name}: {why}");
                    let waiting = mover_plan::waiting(obj, status, reason::REFUSED, &text);
                    update(ctx, ids, obj, status, &waiting).await?;
                    return Ok(Action::requeue(LOOK_AGAIN));
                }
                ctx.event(obj, false, "ClaimCreated", &format!("created pvc/{name}"))
                    .await;
            }
            (
                Phase::Running,
                plan::PROVISIONING,
                format!("created {} claims", pvcs.len()),
            )
        }
        Step::Wait { reason, message } => (Phase::Running, reason, message),
        Step::Conflict(text) => {
            let failed = mover_plan::failed(obj, &next, reason::INVALID_SPEC, &text);
            update(ctx, ids, obj, status, &failed).await?;
            ctx.event(obj, true, reason::INVALID_SPEC, &text).await;
            return Ok(Action::await_change());
        }
        Step::Done(text) => {
            if let Decision::Snapshot { .. } = decision {
                let api: Api<DynamicObject> = Api::namespaced_with(
                    ctx.client.clone(),
                    &ids.namespace,
                    &volume_snapshot_api(),
                );
                match api
                    .delete(&plan::snapshot_name(&ids.name), &DeleteParams::default())
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            next.targets = target_statuses(&targets, Phase::Succeeded);
            let done = mover_plan::with_life(obj, &next, |l| {
                l.start_time
                    .get_or_insert_with(crate::controller::life::now);
                l.finish(Phase::Succeeded, reason::SUCCEEDED, Some(&text));
            });
            if update(ctx, ids, obj, status, &done).await?.is_some() {
                ctx.event(obj, false, reason::SUCCEEDED, &text).await;
            }
            ctx.forget(&ids.uid);
            return Ok(Action::await_change());
        }
    };
    next.targets = target_statuses(&targets, Phase::Running);
    let running = mover_plan::with_life(obj, &next, |l| {
        l.phase = phase;
        l.start_time
            .get_or_insert_with(crate::controller::life::now);
        l.message = None;
        l.set_condition(RUNNING, true, why, &message);
    });
    update(ctx, ids, obj, status, &running).await?;
    Ok(Action::requeue(LOOK_AGAIN))
}

fn target_statuses(names: &[String], phase: Phase) -> Vec<TargetStatus> {
    names
        .iter()
        .map(|n| TargetStatus {
            name: format!("pvc/{n}"),
            phase,
            ..TargetStatus::default()
        })
        .collect()
}

/// What the cluster says about the Transfer's classes: its source claim, every storage
/// class with its profile, the VolumeSnapshotClasses.
pub async fn observe(ctx: &Context, obj: &Transfer, ids: &Ids) -> Result<Facts, Error> {
    match &obj.spec.source.pvc {
        Some(source) => Ok(observe_claim(&ctx.client, &ids.namespace, &source.name).await?),
        None => Ok(Facts::default()),
    }
}

/// What the cluster says for a clone of the claim `namespace/name`: the claim, every
/// storage class with its profile, the VolumeSnapshotClasses (the Transfer reconciler's
/// and the populator's one reading).
pub async fn observe_claim(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Facts, kube::Error> {
    let (classes, profiles, snapshot_classes) = observe_classes(client).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let source = pvcs.get_opt(name).await?;
    Ok(facts(
        source.as_ref(),
        &classes,
        &profiles,
        &snapshot_classes,
    ))
}

/// Every storage class, StorageClassProfile and VolumeSnapshotClass (none of the last
/// on a cluster without the snapshot CRDs).
pub async fn observe_classes(
    client: &kube::Client,
) -> Result<
    (
        Vec<StorageClass>,
        Vec<StorageClassProfile>,
        Vec<DynamicObject>,
    ),
    kube::Error,
> {
    let classes: Api<StorageClass> = Api::all(client.clone());
    let classes = classes.list(&ListParams::default()).await?.items;
    let profiles: Api<StorageClassProfile> = Api::all(client.clone());
    let profiles = profiles.list(&ListParams::default()).await?.items;
    let snapshot_classes: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "snapshot.storage.k8s.io",
                "v1",
                "VolumeSnapshotClass",
            ),
            "volumesnapshotclasses",
        ),
    );
    let snapshot_classes = match snapshot_classes.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // A cluster without the snapshot CRDs has no snapshot classes.
        Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok((classes, profiles, snapshot_classes))
}

/// The facts from the objects read (pure, so that render builds them alike).
pub fn facts(
    source: Option<&PersistentVolumeClaim>,
    classes: &[StorageClass],
    profiles: &[StorageClassProfile],
    snapshot_classes: &[DynamicObject],
) -> Facts {
    let default_class = classes
        .iter()
        .find(|c| annotated(&c.metadata.annotations, crate::fanout::facts::DEFAULT_CLASS))
        .and_then(|c| c.metadata.name.clone());
    let source = source.map(|pvc| {
        let spec = pvc.spec.clone().unwrap_or_default();
        let capacity = pvc
            .status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage"))
            .and_then(quantity_bytes);
        let request = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .and_then(quantity_bytes);
        let class = spec.storage_class_name.clone().or(default_class.clone());
        let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let binds_when_used = classes
            .iter()
            .find(|c| c.metadata.name.is_some() && c.metadata.name == class)
            .and_then(|c| c.volume_binding_mode.as_deref())
            == Some("WaitForFirstConsumer");
        ClaimFacts {
            class,
            mode: mode_of(pvc),
            bytes: capacity.or(request).map(|b| b.min(u64::MAX as u128) as u64),
            unbound_until_used: !bound && binds_when_used,
        }
    });
    Facts {
        source,
        classes: classes
            .iter()
            .map(|c| {
                let name = c.metadata.name.clone().unwrap_or_default();
                ClassFacts {
                    profile_strategy: profiles
                        .iter()
                        .find(|p| p.metadata.name.as_deref() == Some(&name))
                        .and_then(|p| p.spec.clone_strategy),
                    name,
                    provisioner: c.provisioner.clone(),
                    expands: c.allow_volume_expansion == Some(true),
                    binds_when_used: c.volume_binding_mode.as_deref()
                        == Some("WaitForFirstConsumer"),
                }
            })
            .collect(),
        snapshot_classes: snapshot_classes
            .iter()
            .map(|c| SnapshotClassFacts {
                name: c.metadata.name.clone().unwrap_or_default(),
                driver: c.data["driver"].as_str().unwrap_or_default().to_string(),
                default: annotated(&c.metadata.annotations, DEFAULT_SNAPSHOT_CLASS),
            })
            .collect(),
        default_class,
    }
}

fn annotated(annotations: &Option<BTreeMap<String, String>>, key: &str) -> bool {
    annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .is_some_and(|v| v == "true")
}

/// The snapshot and target claims of a clone in progress.
async fn observe_clone(
    ctx: &Context,
    obj: &Transfer,
    ids: &Ids,
    decision: &Decision,
) -> Result<Observed, Error> {
    let mut observed = Observed::default();
    if let Decision::Snapshot { .. } = decision {
        let api: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), &ids.namespace, &volume_snapshot_api());
        observed.snapshot = api
            .get_opt(&plan::snapshot_name(&ids.name))
            .await?
            .map(|s| snapshot_state(&s));
    }
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    for t in obj
        .spec
        .all_targets()
        .iter()
        .filter_map(|t| t.pvc_template.as_ref())
    {
        if let Some(pvc) = pvcs.get_opt(&t.name).await? {
            let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            let class = pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone());
            if let Some(class) = class.filter(|_| !bound) {
                if !observed.wait_for_consumer.contains(&class) {
                    let wffc = classes
                        .get_opt(&class)
                        .await?
                        .and_then(|c| c.volume_binding_mode)
                        .is_some_and(|m| m == "WaitForFirstConsumer");
                    if wffc {
                        observed.wait_for_consumer.push(class);
                    }
                }
            }
            observed.targets.insert(t.name.clone(), pvc);
        }
    }
    Ok(observed)
}
