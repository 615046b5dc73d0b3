//! A claim populated from another claim (a VolumeImageSource whose source is a PVC, or a
//! GoldenImage's current claim) is made by the storage where it can be, as CDI's clone
//! populator does: the prime claim is created with a VolumeSnapshot of the source, or the
//! source claim itself, as its `dataSource`, so no mover runs and no byte goes through
//! ferry; the hand-over to the user's claim is the copy's ([`super::rebind`]). A
//! GoldenImage whose imports are kept as VolumeSnapshots (`keepAs: Snapshot`) has its
//! current snapshot restored into the prime claim.
//!
//! The strategy is the Transfer's ([`crate::clone::strategy::decide`], asked about the
//! prime claim as a `pvcTemplate` target), decided once and recorded on the user's claim
//! (annotations [`STRATEGY`], [`FALLBACK_REASON`], [`SOURCE_CLAIM`], as CDI annotates
//! `cloneType` and `cloneFallbackReason`), so that a later reconcile, or a restarted
//! operator, goes on the same way. A copy goes on as for any image.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, TypedLocalObjectReference};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::Api;
use serde_json::json;

use crate::clone::reconcile::{facts, observe_claim, observe_classes};
use crate::clone::strategy::{self, ClaimFacts, Decision};
use crate::crd::validate::{quantity_bytes, restore_request};
use crate::crd::{
    AccessMode, GoldenImage, PvcRef, PvcTemplate, Transfer, TransferTarget, VolumeImageSource,
    VolumeMode,
};
use crate::golden::Current;
use crate::schedule::build::{snapshot_state, volume_snapshot_api, SnapshotState};

use super::build::{self, ClaimIds};
use super::context::Context;
use super::error::Error;
use super::names;
use super::reconcile::RECHECK;

/// On the user's claim: how it is filled (`snapshot`, `csi-clone` or `copy`).
pub const STRATEGY: &str = "ferry.dev/clone-strategy";
/// On the user's claim: why a copy and not a storage clone.
pub const FALLBACK_REASON: &str = "ferry.dev/clone-fallback-reason";
/// On the user's claim: the claim it is cloned from (a GoldenImage's, looked up once).
pub const SOURCE_CLAIM: &str = "ferry.dev/clone-source";
/// On the user's claim: the GoldenImage's VolumeSnapshot it is restored from.
pub const SOURCE_SNAPSHOT: &str = "ferry.dev/clone-source-snapshot";
/// On the user's claim: the VolumeSnapshotClass of a snapshot clone's own snapshot (empty:
/// the driver's default class).
pub const SNAPSHOT_CLASS: &str = "ferry.dev/clone-snapshot-class";
/// On the user's claim: the uid of the claim the decision was made for.
pub const DECIDED_FOR: &str = "ferry.dev/clone-decided-for";

/// How often a clone in progress is looked at (VolumeSnapshots are not watched).
const LOOK_AGAIN: Duration = Duration::from_secs(5);

/// The VolumeSnapshot a clone of the user's claim `uid` is restored from.
pub fn snapshot_name(uid: &str) -> String {
    format!("ferry-clone-{uid}")
}

/// What the claim's annotations say was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Nothing yet.
    Undecided,
    /// A copy through a mover.
    Copy,
    /// A clone by the storage of this claim: `snapshot` or `csi-clone`.
    Clone {
        /// Through a VolumeSnapshot (else a CSI clone).
        snapshot: bool,
        /// The VolumeSnapshotClass of that snapshot (empty: the default; a CSI clone: empty).
        class: String,
        /// The source claim.
        source: String,
    },
    /// A restore of this VolumeSnapshot (a GoldenImage's import, not ferry's to delete).
    Restore {
        /// The VolumeSnapshot.
        snapshot: String,
    },
}

/// What `pvc`'s annotations record for it (nothing when they were written for another
/// claim).
pub fn recorded(pvc: &PersistentVolumeClaim) -> Recorded {
    let annotations = pvc.metadata.annotations.as_ref();
    let get = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
    if pvc.metadata.uid.is_none() || get(DECIDED_FOR) != pvc.metadata.uid.as_deref() {
        return Recorded::Undecided;
    }
    match (get(STRATEGY), get(SOURCE_CLAIM), get(SNAPSHOT_CLASS)) {
        (Some("copy"), _, _) => Recorded::Copy,
        (Some("snapshot"), None, _) => match get(SOURCE_SNAPSHOT) {
            Some(snapshot) => Recorded::Restore {
                snapshot: snapshot.to_string(),
            },
            None => Recorded::Undecided,
        },
        (Some("snapshot"), Some(source), Some(class)) => Recorded::Clone {
            snapshot: true,
            class: class.to_string(),
            source: source.to_string(),
        },
        (Some("csi-clone"), Some(source), _) => Recorded::Clone {
            snapshot: false,
            class: String::new(),
            source: source.to_string(),
        },
        _ => Recorded::Undecided,
    }
}

/// The claim a VolumeImageSource's image is in, when it is one: its `pvc` (name, path), or
/// its `goldenImage` (whose current claim is looked up by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimSource {
    /// Not a claim: a copy.
    None,
    /// This claim.
    Claim(PvcRef),
    /// The current import of this GoldenImage (a claim, or a VolumeSnapshot).
    Golden(String),
}

/// What a claim is filled from, once a GoldenImage's current import is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloneFrom {
    /// A claim: cloned (or copied).
    Claim(PvcRef),
    /// A GoldenImage's VolumeSnapshot, of a claim of this class and mode: restored.
    Snapshot {
        /// The VolumeSnapshot.
        name: String,
        /// The class of the claim it was taken of.
        class: Option<String>,
        /// That claim's volume mode.
        mode: VolumeMode,
    },
}

impl CloneFrom {
    /// As the strategy sees the source: a claim of this name.
    pub fn as_pvc_ref(&self) -> PvcRef {
        match self {
            Self::Claim(source) => source.clone(),
            Self::Snapshot { name, .. } => PvcRef::named(name),
        }
    }
}

/// The claim source of `source`.
pub fn claim_source(source: &VolumeImageSource) -> ClaimSource {
    let Some(image) = source
        .spec
        .source
        .as_ref()
        .filter(|_| source.spec.backup.is_none())
    else {
        return ClaimSource::None;
    };
    match (&image.pvc, &image.golden_image) {
        (Some(pvc), _) => ClaimSource::Claim(pvc.clone()),
        (None, Some(golden)) => ClaimSource::Golden(golden.name.clone()),
        _ => ClaimSource::None,
    }
}

/// The Transfer the strategy is asked about: the image's Transfer with the source claim
/// `source` and the prime claim as a `pvcTemplate` target (the user's class, size, modes).
pub fn as_transfer(
    ids: &ClaimIds,
    vis: &VolumeImageSource,
    source: &PvcRef,
    pvc: &PersistentVolumeClaim,
) -> Transfer {
    let mut image = vis.spec.source.clone().unwrap_or_default();
    image.pvc = Some(source.clone());
    image.golden_image = None;
    let mut transfer = build::transfer(ids, vis, &image);
    transfer.spec.clone_strategy = vis.spec.clone_strategy;
    let spec = pvc.spec.clone().unwrap_or_default();
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage").cloned())
        .unwrap_or_else(|| Quantity("0".into()));
    transfer.spec.targets = vec![TransferTarget {
        pvc_template: Some(PvcTemplate {
            name: names::prime(&ids.uid),
            storage_class_name: spec.storage_class_name.clone(),
            size,
            volume_mode: Some(match spec.volume_mode.as_deref() {
                Some("Block") => VolumeMode::Block,
                _ => VolumeMode::Filesystem,
            }),
            access_modes: Some(
                spec.access_modes
                    .iter()
                    .flatten()
                    .filter_map(|m| serde_json::from_value::<AccessMode>(json!(m)).ok())
                    .collect(),
            )
            .filter(|m: &Vec<AccessMode>| !m.is_empty()),
        }),
        ..TransferTarget::default()
    }];
    transfer
}

/// The annotations recording `decision` about a clone from `from` for the claim `uid` (a
/// GoldenImage's snapshot is restored whatever storage strategy was decided).
pub fn record(
    decision: &Decision,
    from: &CloneFrom,
    uid: &str,
) -> BTreeMap<String, Option<String>> {
    let (strategy, reason) = match (decision, from) {
        (Decision::Copy { fallback }, _) => ("copy", fallback.clone()),
        (_, CloneFrom::Snapshot { .. }) => ("snapshot", None),
        (other, _) => (other.name(), None),
    };
    let (claim, snapshot) = match from {
        CloneFrom::Claim(source) => (Some(source.name.clone()), None),
        CloneFrom::Snapshot { name, .. } => (None, Some(name.clone())),
    };
    let class = match (decision, from) {
        (Decision::Snapshot { class }, CloneFrom::Claim(_)) => Some(class.clone()),
        _ => None,
    };
    BTreeMap::from([
        (STRATEGY.to_string(), Some(strategy.to_string())),
        (FALLBACK_REASON.to_string(), reason),
        (SOURCE_CLAIM.to_string(), claim),
        (SOURCE_SNAPSHOT.to_string(), snapshot),
        (SNAPSHOT_CLASS.to_string(), class),
        (DECIDED_FOR.to_string(), Some(uid.to_string())),
    ])
}

/// The annotations of nothing decided: decided again on the next look.
pub fn undecided() -> BTreeMap<String, Option<String>> {
    [
        STRATEGY,
        FALLBACK_REASON,
        SOURCE_CLAIM,
        SOURCE_SNAPSHOT,
        SNAPSHOT_CLASS,
        DECIDED_FOR,
    ]
    .into_iter()
    .map(|k| (k.to_string(), None))
    .collect()
}

/// The VolumeSnapshot of `source` a clone of the user's claim is restored from, owned by
/// the user's claim and labelled as the populator's objects are.
pub fn volume_snapshot(ids: &ClaimIds, source: &str, class: &str) -> DynamicObject {
    let mut object = DynamicObject::new(&snapshot_name(&ids.uid), &volume_snapshot_api());
    object.metadata.namespace = Some(ids.namespace.clone());
    object.metadata.labels = Some(names::labels(&ids.uid));
    object.metadata.owner_references = Some(vec![ids.owner()]);
    let mut spec = json!({"source": {"persistentVolumeClaimName": source}});
    if !class.is_empty() {
        spec["volumeSnapshotClassName"] = json!(class);
    }
    object.data = json!({ "spec": spec });
    object
}

/// The prime claim of a clone: the user's claim's class, modes and size (at least the
/// snapshot's `restoreSize`), no filesystem overhead (the volume is the source's, file
/// system included), with the snapshot or the source claim as its data source.
pub fn prime_claim(
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    node: Option<&str>,
    clone: &Recorded,
    restore_size: Option<&Quantity>,
) -> PersistentVolumeClaim {
    let mut prime = build::prime_claim_sized(pvc, ids, node, None);
    let spec = prime.spec.get_or_insert_with(Default::default);
    if let Recorded::Restore { snapshot } = clone {
        spec.data_source = Some(TypedLocalObjectReference {
            api_group: Some("snapshot.storage.k8s.io".into()),
            kind: "VolumeSnapshot".into(),
            name: snapshot.clone(),
        });
    }
    if let Recorded::Clone {
        snapshot, source, ..
    } = clone
    {
        spec.data_source = Some(if *snapshot {
            TypedLocalObjectReference {
                api_group: Some("snapshot.storage.k8s.io".into()),
                kind: "VolumeSnapshot".into(),
                name: snapshot_name(&ids.uid),
            }
        } else {
            TypedLocalObjectReference {
                api_group: None,
                kind: "PersistentVolumeClaim".into(),
                name: source.clone(),
            }
        });
    }
    let requests = spec.resources.as_mut().and_then(|r| r.requests.as_mut());
    if let Some(asked) = requests.and_then(|r| r.get_mut("storage")) {
        *asked = restore_request(asked, restore_size);
    }
    prime
}

/// What the populator does for a claim whose image is in a claim: None when it is
/// copied (the caller goes on as for any image); else the action after this step.
pub async fn populate(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    vis: &VolumeImageSource,
    source_name: &str,
) -> Result<Option<Action>, Error> {
    let clone = match recorded(pvc) {
        Recorded::Copy => return Ok(None),
        // Filled by a copy before clones were decided (an operator of an earlier version).
        Recorded::Undecided if ctx.claim(&ids.namespace, &names::prime(&ids.uid)).is_some() => {
            return Ok(None)
        }
        Recorded::Undecided => match decide(ctx, pvc, ids, vis).await? {
            Some(done) => return Ok(done),
            None => return Ok(Some(Action::await_change())),
        },
        clone => clone,
    };
    let prime_name = names::prime(&ids.uid);
    if let Some(prime) = ctx.claim(&ids.namespace, &prime_name) {
        let bound = prime.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        if bound && matches!(clone, Recorded::Clone { snapshot: true, .. }) {
            // The volume is provisioned: the snapshot is no longer needed.
            forget_snapshot(ctx, ids).await?;
        }
        return super::rebind::rebind(ctx, pvc, ids, &prime, source_name)
            .await
            .map(Some);
    }
    let ready = match &clone {
        Recorded::Clone {
            snapshot: true,
            class,
            source,
        } => own_snapshot(ctx, pvc, ids, class, source).await?,
        Recorded::Restore { snapshot } => golden_snapshot(ctx, pvc, ids, snapshot).await?,
        _ => Ok(None),
    };
    let restore_size = match ready {
        Ok(size) => size,
        Err(action) => return Ok(Some(action)),
    };
    let node = match super::reconcile::prime_placement(ctx, pvc).await? {
        Ok(node) => node,
        Err(action) => return Ok(Some(action)),
    };
    if let Recorded::Clone {
        snapshot: false,
        source,
        ..
    } = &clone
    {
        // Decided maybe long before a first consumer placed the claim: the source may be
        // gone (a GoldenImage's pruned import).
        if !claim_exists(ctx, &ids.namespace, source).await? {
            let note = format!("pvc/{source}, the clone's source, is gone: deciding again");
            return undo(ctx, pvc, ids, &note).await.map(Some);
        }
    }
    let prime = prime_claim(pvc, ids, node.as_deref(), &clone, restore_size.as_ref());
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    match api.create(&PostParams::default(), &prime).await {
        Ok(_) => {
            let how = match &clone {
                Recorded::Clone { snapshot: true, .. } => {
                    format!("restored from VolumeSnapshot {}", snapshot_name(&ids.uid))
                }
                Recorded::Clone { source, .. } => format!("a CSI clone of pvc/{source}"),
                Recorded::Restore { snapshot } => {
                    format!("restored from the GoldenImage's VolumeSnapshot {snapshot}")
                }
                _ => String::new(),
            };
            let place = node.map(|n| format!(" on node {n}")).unwrap_or_default();
            let note = format!("created prime claim pvc/{prime_name}{place}, {how}");
            ctx.event(pvc, false, "PrimeCreated", &note).await;
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    // The prime claim's watch wakes the claim when it binds.
    Ok(Some(Action::await_change()))
}

/// The clone's own VolumeSnapshot of `source` in the VolumeSnapshotClass `class`: its
/// restore size once ready, else the action while it is made or not ready (the decision
/// undone when the source is gone before the snapshot is made).
async fn own_snapshot(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    class: &str,
    source: &str,
) -> Result<Result<Option<Quantity>, Action>, Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ids.namespace, &volume_snapshot_api());
    let name = snapshot_name(&ids.uid);
    match api.get_opt(&name).await?.map(|s| snapshot_state(&s)) {
        None => {
            if !claim_exists(ctx, &ids.namespace, source).await? {
                let note = format!("pvc/{source}, the clone's source, is gone: deciding again");
                return undo(ctx, pvc, ids, &note).await.map(Err);
            }
            match api
                .create(&PostParams::default(), &volume_snapshot(ids, source, class))
                .await
            {
                Ok(_) => {
                    let note = format!("created VolumeSnapshot {name} of pvc/{source} to clone");
                    ctx.event(pvc, false, "SnapshotCreated", &note).await;
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
            Ok(Err(Action::requeue(LOOK_AGAIN)))
        }
        Some(state) => Ok(ready_or_wait(ctx, pvc, &name, state).await),
    }
}

/// Whether the claim `name` of `namespace` exists and is not being deleted (asked, not
/// the store's view: it was seen when the decision was made).
async fn claim_exists(ctx: &Context, namespace: &str, name: &str) -> Result<bool, Error> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let claim = api.get_opt(name).await?;
    Ok(claim.is_some_and(|c| c.metadata.deletion_timestamp.is_none()))
}

/// Undoes the recorded decision, its source gone (`note` says which): the annotations'
/// change wakes the claim, which is decided again.
async fn undo(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    note: &str,
) -> Result<Action, Error> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let patch = json!({"metadata": {"annotations": undecided()}});
    claims
        .patch(&ids.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    ctx.event(pvc, true, "SourceGone", note).await;
    Ok(Action::await_change())
}

/// The GoldenImage's VolumeSnapshot `name`: its restore size once ready, else the action
/// while it is not; gone (pruned by its GoldenImage before the prime claim was made), the
/// decision is undone and made again with the GoldenImage's current import.
async fn golden_snapshot(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    name: &str,
) -> Result<Result<Option<Quantity>, Action>, Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ids.namespace, &volume_snapshot_api());
    match api.get_opt(name).await?.map(|s| snapshot_state(&s)) {
        None => {
            let note = format!(
                "the GoldenImage's VolumeSnapshot {name} is gone: restoring its current import instead"
            );
            undo(ctx, pvc, ids, &note).await.map(Err)
        }
        Some(state) => Ok(ready_or_wait(ctx, pvc, name, state).await),
    }
}

/// A snapshot's restore size when it is ready, else the action while it is not (its
/// error said when the snapshot controller reports one).
async fn ready_or_wait(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    name: &str,
    state: SnapshotState,
) -> Result<Option<Quantity>, Action> {
    match state {
        SnapshotState::Ready(size) => Ok(size),
        SnapshotState::Pending(error) => {
            if let Some(error) = error {
                let note = format!("VolumeSnapshot {name} is not ready: {error}");
                ctx.event(pvc, true, "SnapshotPending", &note).await;
            }
            Err(Action::requeue(LOOK_AGAIN))
        }
    }
}

/// Decides and records the strategy: Some(action) when the claim waits or is refused
/// (Some(None): recorded a copy, go on copying now), None when recorded (the annotation's
/// change wakes the claim).
async fn decide(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    vis: &VolumeImageSource,
) -> Result<Option<Option<Action>>, Error> {
    let from = match claim_source(vis) {
        ClaimSource::None => return Ok(Some(None)),
        ClaimSource::Claim(source) => CloneFrom::Claim(source),
        ClaimSource::Golden(name) => {
            let api: Api<GoldenImage> = Api::namespaced(ctx.client.clone(), &ids.namespace);
            let golden = api.get_opt(&name).await?;
            let current = golden.as_ref().and_then(crate::golden::current_import);
            match (golden, current) {
                (_, Some(Current::Claim(claim))) => CloneFrom::Claim(PvcRef::named(&claim)),
                (Some(golden), Some(Current::Snapshot(snapshot))) => {
                    let mut claim = golden.spec.claim;
                    ctx.class_defaults.fill_import_claim(&mut claim);
                    CloneFrom::Snapshot {
                        name: snapshot,
                        class: claim.storage_class_name,
                        mode: claim.volume_mode.unwrap_or(VolumeMode::Filesystem),
                    }
                }
                _ => {
                    let note = format!(
                        "waiting for GoldenImage {name} to hold an image: create it, or wait for its first import"
                    );
                    ctx.event(pvc, false, "Pending", &note).await;
                    return Ok(Some(Some(Action::requeue(RECHECK))));
                }
            }
        }
    };
    let facts = match &from {
        CloneFrom::Claim(source) => {
            let facts = observe_claim(&ctx.client, &ids.namespace, &source.name).await?;
            if facts.source.is_none() {
                let note = format!(
                    "waiting for pvc/{} in namespace {}, the image's claim",
                    source.name, ids.namespace
                );
                ctx.event(pvc, false, "Pending", &note).await;
                return Ok(Some(Some(Action::requeue(RECHECK))));
            }
            facts
        }
        CloneFrom::Snapshot { name, class, mode } => {
            let api: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), &ids.namespace, &volume_snapshot_api());
            let bytes = match api.get_opt(name).await?.map(|s| snapshot_state(&s)) {
                Some(SnapshotState::Ready(size)) => size.as_ref().and_then(quantity_bytes),
                Some(SnapshotState::Pending(_)) => None,
                None => {
                    // Recorded, it would be found gone and undone at once: wait instead.
                    let golden = match claim_source(vis) {
                        ClaimSource::Golden(golden) => golden,
                        _ => String::new(),
                    };
                    let note = format!(
                        "waiting for GoldenImage {golden}: its current VolumeSnapshot {name} is gone (deleted by hand?); its next poll imports it again"
                    );
                    ctx.event(pvc, true, "SourceGone", &note).await;
                    return Ok(Some(Some(Action::requeue(RECHECK))));
                }
            };
            let (classes, profiles, snapshot_classes) = observe_classes(&ctx.client).await?;
            let mut facts = facts(None, &classes, &profiles, &snapshot_classes);
            facts.source = Some(ClaimFacts {
                unbound_until_used: false,
                class: class.clone().or(facts.default_class.clone()),
                mode: *mode,
                bytes: bytes.map(|b| b.min(u64::MAX as u128) as u64),
            });
            facts
        }
    };
    let decision = strategy::decide(&as_transfer(ids, vis, &from.as_pvc_ref(), pvc), &facts);
    if let Decision::Refused(why) = &decision {
        ctx.event(pvc, true, "InvalidSource", why).await;
        // The VolumeImageSource's watch wakes the claim when it is changed.
        return Ok(Some(Some(Action::await_change())));
    }
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let patch = json!({"metadata": {"annotations": record(&decision, &from, &ids.uid)}});
    api.patch(&ids.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let note = match (&decision, &from) {
        (
            Decision::Copy {
                fallback: Some(why),
            },
            _,
        ) => Some((
            "CloneFallback",
            format!("copying: no storage clone ({why})"),
        )),
        (Decision::Snapshot { .. } | Decision::CsiClone, CloneFrom::Claim(source)) => Some((
            "CloneStrategy",
            format!(
                "cloning pvc/{} by the storage ({})",
                source.name,
                decision.name()
            ),
        )),
        (Decision::Snapshot { .. } | Decision::CsiClone, CloneFrom::Snapshot { name, .. }) => {
            Some((
                "CloneStrategy",
                format!("restoring the GoldenImage's VolumeSnapshot {name} by the storage"),
            ))
        }
        _ => None,
    };
    if let Some((reason, note)) = note {
        ctx.event(pvc, false, reason, &note).await;
    }
    Ok(None)
}

/// Deletes the clone's VolumeSnapshot once the prime claim is Bound (it is owned by the
/// user's claim, so it would go with it; it is not kept that long).
async fn forget_snapshot(ctx: &Context, ids: &ClaimIds) -> Result<(), Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ids.namespace, &volume_snapshot_api());
    match api
        .delete(&snapshot_name(&ids.uid), &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user_claim(annotations: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "disk", "namespace": "vms", "uid": "u-1",
                         "annotations": annotations},
            "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                "volumeMode": "Filesystem", "resources": {"requests": {"storage": "20Gi"}},
                "dataSourceRef": {"apiGroup": "ferry.dev", "kind": "VolumeImageSource",
                                  "name": "golden"},
            },
        }))
        .unwrap()
    }

    fn vis(source: serde_json::Value) -> VolumeImageSource {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "VolumeImageSource",
            "metadata": {"name": "golden", "namespace": "vms"},
            "spec": {"source": source},
        }))
        .unwrap()
    }

    #[test]
    fn the_recorded_strategy_is_read_back_from_the_annotations() {
        let decision = Decision::Snapshot {
            class: "snaps".into(),
        };
        let base = CloneFrom::Claim(PvcRef::named("base"));
        let written = record(&decision, &base, "u-1");
        let annotations: BTreeMap<String, String> = written
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        let pvc = user_claim(json!(annotations));
        assert_eq!(
            recorded(&pvc),
            Recorded::Clone {
                snapshot: true,
                class: "snaps".into(),
                source: "base".into()
            }
        );
        // Written for another claim (its manifest copied): nothing recorded for this one.
        let mut copied = pvc.clone();
        copied.metadata.uid = Some("u-2".into());
        assert_eq!(recorded(&copied), Recorded::Undecided);
        let copy = record(
            &Decision::Copy {
                fallback: Some("no VolumeSnapshotClass of driver x".into()),
            },
            &base,
            "u-1",
        );
        assert_eq!(
            serde_json::to_value(&copy).unwrap(),
            json!({STRATEGY: "copy", SOURCE_CLAIM: "base", SOURCE_SNAPSHOT: null,
                   SNAPSHOT_CLASS: null, DECIDED_FOR: "u-1",
                   FALLBACK_REASON: "no VolumeSnapshotClass of driver x"})
        );
        let csi: BTreeMap<String, String> = record(&Decision::CsiClone, &base, "u-1")
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        assert_eq!(
            recorded(&user_claim(json!(csi))),
            Recorded::Clone {
                snapshot: false,
                class: String::new(),
                source: "base".into()
            }
        );
        let golden = CloneFrom::Snapshot {
            name: "fedora-41".into(),
            class: None,
            mode: VolumeMode::Block,
        };
        let restore: BTreeMap<String, String> = record(&Decision::CsiClone, &golden, "u-1")
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        assert_eq!(
            recorded(&user_claim(json!(restore))),
            Recorded::Restore {
                snapshot: "fedora-41".into()
            }
        );
        let undone: BTreeMap<String, String> = undecided()
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        assert!(undone.is_empty());
        assert_eq!(
            recorded(&user_claim(json!({STRATEGY: "copy", DECIDED_FOR: "u-1"}))),
            Recorded::Copy
        );
        assert_eq!(recorded(&user_claim(json!({}))), Recorded::Undecided);
        // A clone strategy without its source is not a decision; nor a snapshot clone
        // without its snapshot class; nor a record without the claim it was made for.
        assert_eq!(
            recorded(&user_claim(
                json!({STRATEGY: "csi-clone", DECIDED_FOR: "u-1"})
            )),
            Recorded::Undecided
        );
        assert_eq!(
            recorded(&user_claim(
                json!({STRATEGY: "snapshot", SOURCE_CLAIM: "base", DECIDED_FOR: "u-1"})
            )),
            Recorded::Undecided
        );
        assert_eq!(
            recorded(&user_claim(json!({STRATEGY: "copy"}))),
            Recorded::Undecided
        );
    }

    #[test]
    fn the_strategy_is_asked_about_the_prime_claim_as_a_template() {
        let pvc = user_claim(json!({}));
        let ids = ClaimIds::of(&pvc).unwrap();
        let source = vis(json!({"pvc": {"name": "base"}}));
        let ClaimSource::Claim(pvc_ref) = claim_source(&source) else {
            panic!("a claim source")
        };
        let t = as_transfer(&ids, &source, &pvc_ref, &pvc);
        assert_eq!(
            serde_json::to_value(&t.spec.source).unwrap(),
            json!({"pvc": {"name": "base"}})
        );
        assert_eq!(
            serde_json::to_value(&t.spec.targets).unwrap(),
            json!([{"pvcTemplate": {"name": "ferry-prime-u-1", "storageClassName": "fast",
                                    "size": "20Gi", "volumeMode": "Filesystem",
                                    "accessModes": ["ReadWriteOnce"]}}])
        );
        assert_eq!(
            claim_source(&vis(json!({"goldenImage": {"name": "fedora"}}))),
            ClaimSource::Golden("fedora".into())
        );
        assert_eq!(
            claim_source(&vis(json!({"url": "https://h/i.raw"}))),
            ClaimSource::None
        );
    }

    #[test]
    fn a_clones_prime_claim_has_its_data_source_and_no_overhead() {
        let pvc = user_claim(json!({}));
        let ids = ClaimIds::of(&pvc).unwrap();
        let by_snapshot = Recorded::Clone {
            snapshot: true,
            class: "snaps".into(),
            source: "base".into(),
        };
        let larger = Quantity("21Gi".into());
        let prime = serde_json::to_value(prime_claim(
            &pvc,
            &ids,
            Some("n1"),
            &by_snapshot,
            Some(&larger),
        ))
        .unwrap();
        assert_eq!(
            prime["spec"],
            json!({"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                   "volumeMode": "Filesystem", "resources": {"requests": {"storage": "21Gi"}},
                   "dataSource": {"apiGroup": "snapshot.storage.k8s.io",
                                  "kind": "VolumeSnapshot", "name": "ferry-clone-u-1"}})
        );
        assert_eq!(
            prime["metadata"]["annotations"],
            json!({"volume.kubernetes.io/selected-node": "n1"})
        );
        let by_csi = Recorded::Clone {
            snapshot: false,
            class: String::new(),
            source: "base".into(),
        };
        let smaller = Quantity("10Gi".into());
        let prime =
            serde_json::to_value(prime_claim(&pvc, &ids, None, &by_csi, Some(&smaller))).unwrap();
        assert_eq!(
            prime["spec"]["dataSource"],
            json!({"kind": "PersistentVolumeClaim", "name": "base"})
        );
        assert_eq!(prime["spec"]["resources"]["requests"]["storage"], "20Gi");
        let snapshot = serde_json::to_value(volume_snapshot(&ids, "base", "snaps")).unwrap();
        assert_eq!(snapshot["metadata"]["name"], "ferry-clone-u-1");
        assert_eq!(
            snapshot["spec"],
            json!({"source": {"persistentVolumeClaimName": "base"},
                   "volumeSnapshotClassName": "snaps"})
        );
        assert_eq!(snapshot["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(
            snapshot["metadata"]["labels"]["ferry.dev/populated-claim"],
            "u-1"
        );
    }
}
