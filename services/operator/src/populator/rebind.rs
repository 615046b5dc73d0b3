//! The hand-over of a filled volume, as lib-volume-populator does it: the prime claim's
//! volume gets the user's claim in its `claimRef`, the PV controller binds the user's
//! claim to it, and the prime claim (now Lost) and the Transfer (or Restore) are deleted. The volume
//! is never copied again and never unclaimed in between.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource};
use serde_json::json;

use crate::crd::{Restore, Transfer};

use super::build::{self, ClaimIds};
use super::context::Context;
use super::error::Error;
use super::names;
use super::reconcile::RECHECK;

fn phase(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn volume(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty())
}

/// Points the prime claim's volume at the user's claim, once the prime claim is Bound.
pub async fn rebind(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
    prime: &PersistentVolumeClaim,
    source_name: &str,
) -> Result<Action, Error> {
    let Some(name) = volume(prime).filter(|_| phase(prime) == Some("Bound")) else {
        // The prime claim's watch wakes the claim when it binds.
        return Ok(Action::await_change());
    };
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let Some(pv) = api.get_opt(name).await? else {
        return Ok(Action::requeue(RECHECK));
    };
    let holder = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let holder_uid = holder.and_then(|r| r.uid.as_deref());
    if holder_uid == Some(ids.uid.as_str()) {
        // Already handed over: the PV controller binds the claim, which wakes it.
        return Ok(Action::await_change());
    }
    if holder_uid != prime.meta().uid.as_deref() {
        let holder = holder
            .map(|r| {
                format!(
                    "{}/{}",
                    r.namespace.as_deref().unwrap_or("-"),
                    r.name.as_deref().unwrap_or("-")
                )
            })
            .unwrap_or_else(|| "nothing".into());
        let note = format!(
            "volume {name} of pvc/{} is claimed by {holder}, not by the prime claim: it is not handed over",
            names::prime(&ids.uid)
        );
        ctx.event(pvc, true, "VolumeTaken", &note).await;
        return Ok(Action::await_change());
    }
    let patch = json!({
        "metadata": {"annotations": {names::POPULATED_FROM: format!("{}/{source_name}", ids.namespace)}},
        "spec": {"claimRef": {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "namespace": ids.namespace, "name": ids.name, "uid": ids.uid,
            "resourceVersion": pvc.metadata.resource_version,
        }},
    });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let note = format!("volume {name} holds the image: handed over to this claim");
    ctx.event(pvc, false, "Rebinding", &note).await;
    Ok(Action::await_change())
}

/// Deletes `name` through `api`; whether it was there.
async fn delete<K>(api: &Api<K>, name: &str) -> Result<bool, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Cleans up after a claim that has a volume: once it is Bound (to the prime claim's
/// volume), the prime claim and the Transfer go. A claim with nothing left costs no
/// request (both are read from the stores).
pub async fn finish(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    ids: &ClaimIds,
) -> Result<Action, Error> {
    if phase(pvc) != Some("Bound") {
        return Ok(Action::await_change());
    }
    let prime_name = names::prime(&ids.uid);
    if let Some(prime) = ctx.claim(&ids.namespace, &prime_name) {
        let bound_to_prime = volume(&prime).is_some() && volume(&prime) == volume(pvc);
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(ctx.client.clone(), &ids.namespace);
        if delete(&claims, &prime_name).await? && bound_to_prime {
            let note = format!(
                "populated: bound to volume {}; prime claim pvc/{prime_name} deleted",
                volume(pvc).unwrap_or_default()
            );
            ctx.event(pvc, false, "Populated", &note).await;
        }
    }
    let transfer_name = names::transfer(&ids.name);
    if let Some(transfer) = ctx.transfer(&ids.namespace, &transfer_name) {
        if build::owned_by(transfer.as_ref(), &ids.uid) {
            let transfers: Api<Transfer> = Api::namespaced(ctx.client.clone(), &ids.namespace);
            delete(&transfers, &transfer_name).await?;
        }
    }
    if let Some(restore) = ctx.restore(&ids.namespace, &transfer_name) {
        if build::owned_by(restore.as_ref(), &ids.uid) {
            let restores: Api<Restore> = Api::namespaced(ctx.client.clone(), &ids.namespace);
            delete(&restores, &transfer_name).await?;
        }
    }
    ctx.forget(&ids.uid);
    Ok(Action::await_change())
}
