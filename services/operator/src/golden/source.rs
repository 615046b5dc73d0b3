//! `source: {goldenImage: {name}}`: a Transfer reads the claim its GoldenImage names as
//! current, looked up once, when the Transfer starts, and recorded in its status
//! (`sourceClaim`), so a newer import during the copy changes nothing. From then on the
//! Transfer is reconciled as one whose source is that claim (a storage clone where the
//! storage can, a copy otherwise). A GoldenImage that keeps its imports as VolumeSnapshots
//! names a snapshot: the Transfer restores it into a claim of its own
//! (`<transfer>-golden`, owned by it, as large as the snapshot's `restoreSize` at least),
//! waits until that is bound (unless its class binds at the first consumer) and records it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DynamicObject, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource};
use serde_json::json;

use crate::clone::reconcile::Resolved;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::kind::{write_status, Ids};
use crate::controller::plan as mover_plan;
use crate::crd::status::condition::reason;
use crate::crd::validate::restore_request;
use crate::crd::{Endpoint, GoldenImage, PvcRef, Transfer, VolumeMode};
use crate::mover::pod::labels;
use crate::schedule::build::{snapshot_state, volume_snapshot_api, SnapshotState};

use super::Current;

/// How often a Transfer waiting for its GoldenImage's first import, or for the claim
/// restored from its snapshot, looks again.
const WAIT: Duration = Duration::from_secs(10);

/// `obj` with its source the claim `claim` (the source's format and path kept).
pub fn with_claim(obj: &Transfer, claim: &str) -> Transfer {
    let mut t = obj.clone();
    let golden = std::mem::take(&mut t.spec.source);
    t.spec.source = Endpoint {
        pvc: Some(PvcRef {
            name: claim.to_string(),
            path: None,
            namespace: None,
        }),
        format: golden.format,
        allow_backing: golden.allow_backing,
        ..Endpoint::default()
    };
    t
}

/// Resolves a GoldenImage source: the recorded claim, or the GoldenImage's current one
/// (recorded now), or a wait with the reason.
pub async fn resolve(obj: Arc<Transfer>, ctx: &Context) -> Result<Resolved, Error> {
    let Some(golden) = obj.spec.source.golden_image.clone() else {
        return Ok(Resolved::Ready(obj));
    };
    let status = obj.status.clone().unwrap_or_default();
    if let Some(claim) = &status.source_claim {
        return Ok(Resolved::Ready(Arc::new(with_claim(&obj, claim))));
    }
    if obj.metadata.deletion_timestamp.is_some()
        || status.phase.is_final()
        || obj.spec.validate().is_err()
    {
        return Ok(Resolved::Ready(obj));
    }
    let ids = Ids::of(obj.as_ref())?;
    let api: Api<GoldenImage> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let image = api.get_opt(&golden.name).await?;
    let current = image.as_ref().and_then(super::current_import);
    let (claim, text) = match (&image, current) {
        (_, Some(Current::Claim(claim))) => (Some(claim), String::new()),
        (Some(image), Some(Current::Snapshot(snapshot))) => {
            restore(obj.as_ref(), &ids, image, &snapshot, ctx).await?
        }
        _ => (
            None,
            format!(
                "waiting for GoldenImage {} to hold an image: create it, or wait for its first import",
                golden.name
            ),
        ),
    };
    let mut next = match &claim {
        Some(claim) => {
            let mut next = status.clone();
            next.source_claim = Some(claim.clone());
            next
        }
        None => mover_plan::waiting(obj.as_ref(), &status, reason::PENDING, &text),
    };
    next.observed_generation = obj.metadata.generation;
    if !crate::controller::life::same_status(&status, &next) {
        write_status(ctx, &ids, obj.as_ref(), &next).await?;
    }
    Ok(Resolved::Done(if claim.is_some() {
        Action::requeue(Duration::ZERO)
    } else {
        Action::requeue(WAIT)
    }))
}

/// The claim a Transfer from a snapshot-kept GoldenImage reads: `<transfer>-golden`.
pub fn restored_claim_name(transfer: &str) -> String {
    let keep = 253 - "-golden".len();
    format!("{}-golden", &transfer[..transfer.len().min(keep)])
}

/// The label naming, by uid, the Transfer a restored claim was made for (not the label of
/// the claims a Transfer creates as targets: this one is its source).
pub const RESTORED_FOR: &str = "ferry.dev/golden-image-source-of";

/// The claim restored from the GoldenImage's snapshot `snapshot` for `transfer`: shaped
/// as the GoldenImage's import claims (class, volume and access modes; their size, or the
/// snapshot's `restoreSize` when that is larger), owned by the Transfer (it goes with it).
pub fn restored_claim(
    transfer: &Transfer,
    ids: &Ids,
    golden: &GoldenImage,
    snapshot: &str,
    restore_size: Option<&Quantity>,
) -> Result<PersistentVolumeClaim, Error> {
    let spec = &golden.spec.claim;
    let access_modes = match &spec.access_modes {
        Some(modes) => serde_json::to_value(modes).unwrap_or_default(),
        None => json!(["ReadWriteOnce"]),
    };
    let mut claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": restored_claim_name(&ids.name),
            "namespace": ids.namespace,
            "labels": {labels::MANAGED_BY: "ferry-operator", RESTORED_FOR: ids.uid},
            "ownerReferences": transfer.controller_owner_ref(&()).map(|r| vec![r]),
        },
        "spec": {
            "accessModes": access_modes,
            "volumeMode": spec.volume_mode.unwrap_or(VolumeMode::Filesystem),
            "resources": {"requests": {"storage": restore_request(&spec.size, restore_size)}},
            "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                           "name": snapshot},
        },
    });
    if let Some(class) = &spec.storage_class_name {
        claim["spec"]["storageClassName"] = json!(class);
    }
    serde_json::from_value(claim).map_err(|e| Error::Kube(kube::Error::SerdeError(e)))
}

/// The uid of the Transfer `claim` was restored for (its [`RESTORED_FOR`] label).
fn restored_for(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(RESTORED_FOR))
        .map(String::as_str)
}

/// Restores the GoldenImage's current snapshot into the Transfer's own claim, once: the
/// claim when it is Bound (or its class binds at the first consumer: the copy's mover
/// binds it), else None and what the Transfer waits for.
async fn restore(
    obj: &Transfer,
    ids: &Ids,
    golden: &GoldenImage,
    snapshot: &str,
    ctx: &Context,
) -> Result<(Option<String>, String), Error> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let name = restored_claim_name(&ids.name);
    let claim = match claims.get_opt(&name).await? {
        Some(claim) if restored_for(&claim) == Some(ids.uid.as_str()) => claim,
        // A claim of that name that was not restored for this Transfer is never read.
        Some(_) => {
            return Ok((
                None,
                format!(
                    "pvc/{name} exists and was not restored for this Transfer from GoldenImage {}: rename or delete it (the Transfer restores the GoldenImage's snapshot into a claim of that name)",
                    golden.metadata.name.clone().unwrap_or_default()
                ),
            ))
        }
        None => {
            let snapshots: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), &ids.namespace, &volume_snapshot_api());
            let restore_size = match snapshots.get_opt(snapshot).await? {
                Some(s) => match snapshot_state(&s) {
                    SnapshotState::Ready(size) => size,
                    SnapshotState::Pending(_) => None,
                },
                None => {
                    return Ok((
                        None,
                        format!(
                            "GoldenImage {}'s VolumeSnapshot {snapshot} is gone: waiting for the GoldenImage's next import",
                            golden.metadata.name.clone().unwrap_or_default()
                        ),
                    ))
                }
            };
            let mut golden = golden.clone();
            ctx.class_defaults.fill_import_claim(&mut golden.spec.claim);
            let pvc = restored_claim(obj, ids, &golden, snapshot, restore_size.as_ref())?;
            match claims.create(&PostParams::default(), &pvc).await {
                Ok(created) => created,
                Err(kube::Error::Api(e)) if e.code == 409 => return Ok((None, String::new())),
                Err(e) => return Err(e.into()),
            }
        }
    };
    let from = claim
        .spec
        .as_ref()
        .and_then(|s| s.data_source.as_ref())
        .map(|d| d.name.clone())
        .unwrap_or_else(|| snapshot.to_string());
    let phase = claim.status.as_ref().and_then(|s| s.phase.clone());
    if phase.as_deref() == Some("Bound") {
        return Ok((Some(name), String::new()));
    }
    // A class that binds at the first consumer binds it when the copy's mover mounts it.
    if let Some(class) = claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
    {
        let classes: Api<StorageClass> = Api::all(ctx.client.clone());
        let wffc = classes
            .get_opt(&class)
            .await?
            .and_then(|c| c.volume_binding_mode)
            .is_some_and(|m| m == "WaitForFirstConsumer");
        if wffc {
            return Ok((Some(name), String::new()));
        }
    }
    Ok((
        None,
        format!(
            "restoring GoldenImage {}'s VolumeSnapshot {from} into pvc/{name}: waiting for it to be bound",
            golden.metadata.name.clone().unwrap_or_default()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_claim_is_as_large_as_the_snapshot_at_least() {
        let transfer: Transfer = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "vm-1", "namespace": "vms", "uid": "t-1"},
            "spec": {"source": {"goldenImage": {"name": "fedora"}},
                     "targets": [{"pvcTemplate": {"name": "vm-1-disk", "size": "10Gi"}}]},
        }))
        .unwrap();
        let golden: GoldenImage = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "GoldenImage",
            "metadata": {"name": "fedora", "namespace": "vms", "uid": "gi-1"},
            "spec": {"source": {"url": "https://images.example.com/fedora.qcow2"},
                     "trigger": {"schedule": "@daily"}, "keepAs": "Snapshot",
                     "claim": {"size": "10Gi", "storageClassName": "rbd", "volumeMode": "Block"}},
        }))
        .unwrap();
        let ids = Ids::of(&transfer).unwrap();
        let spec = |restore: Option<&str>| {
            let size = restore.map(|r| Quantity(r.into()));
            let claim = restored_claim(&transfer, &ids, &golden, "fedora-1", size.as_ref());
            serde_json::to_value(claim.unwrap().spec).unwrap()
        };
        let expected = |storage: &str| {
            json!({"accessModes": ["ReadWriteOnce"], "volumeMode": "Block",
                   "storageClassName": "rbd", "resources": {"requests": {"storage": storage}},
                   "dataSource": {"apiGroup": "snapshot.storage.k8s.io",
                                  "kind": "VolumeSnapshot", "name": "fedora-1"}})
        };
        // A driver that rounded the 10Gi volume up to 10.5Gi: the claim asks for that.
        assert_eq!(spec(Some("10752Mi")), expected("10752Mi"));
        assert_eq!(spec(Some("11000000000")), expected("11000000000"));
        // A smaller or equal restoreSize, or none: the GoldenImage's size.
        assert_eq!(spec(Some("10Gi")), expected("10Gi"));
        assert_eq!(spec(Some("5Gi")), expected("10Gi"));
        assert_eq!(spec(None), expected("10Gi"));
    }
}
