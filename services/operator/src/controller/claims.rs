//! The claims a resource names, resolved against the claims that exist (a pure function:
//! [`resolve`]): an existing claim's volume mode decides how the mover attaches it, and a
//! pod using it where the mover must run ([`users`]); a `pvcTemplate` claim that does not
//! exist is to be created ([`create`]), labelled with the resource (and owned by it when its
//! retention is `Delete`). A missing claim may still appear, so it makes the resource
//! wait, not fail; a claim of a template's name that someone else created is a conflict
//! the user must resolve; a claim the API server refuses to create makes it wait, saying
//! why.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::Api;

use crate::crd::{ClaimRetention, PvcTemplate, VolumeMode};
use crate::fanout::children::PARENT_UID;
use crate::mover::pod::labels;
use crate::mover::{placement, ResolvedPvc};

use super::context::Context;
use super::error::Error;
use super::kind::{Claim, Ids, MoverKind};
use super::pods::Created;
use super::users;

/// Every claim of a resource, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The claims in spec order, with how the mover attaches each.
    pub pvcs: Vec<ResolvedPvc>,
    /// The templates' claims that do not exist yet.
    pub new_claims: Vec<PersistentVolumeClaim>,
}

/// Why a resource cannot use its claims yet.
#[derive(Debug, Clone, PartialEq)]
pub enum Unresolved {
    /// A claim does not exist (yet).
    Missing(String),
    /// A template's claim exists and belongs to something else.
    Conflict(String),
    /// Claims in use on different nodes, which one mover cannot attach together.
    Apart(String),
    /// The claim a copy reads is being written by a pod.
    Written(String),
}

pub fn mode_of(pvc: &PersistentVolumeClaim) -> VolumeMode {
    match pvc.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) {
        Some("Block") => VolumeMode::Block,
        _ => VolumeMode::Filesystem,
    }
}

/// Whether the resource of `uid` created the claim: its label says so (or, for claims of
/// `Delete` resources and of older operators, its owner reference).
pub fn created_by(pvc: &PersistentVolumeClaim, uid: &str) -> bool {
    let labelled = pvc
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::OWNER_UID))
        .is_some_and(|v| v == uid);
    labelled
        || pvc
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.uid == uid)
}

/// The fan-out `obj` is a group of (its parent's uid), if any.
fn fan_out_of<K: MoverKind>(obj: &K) -> Option<&String> {
    obj.meta().labels.as_ref()?.get(PARENT_UID)
}

/// Whether `pvc` is a claim `obj` (uid `uid`) may write as its template's: created by it,
/// or by an earlier group of the same fan-out under the same name (a group's child
/// Transfer deleted by hand and made again by its parent).
pub fn made_for<K: MoverKind>(pvc: &PersistentVolumeClaim, obj: &K, uid: &str) -> bool {
    let same_fan_out = fan_out_of(obj).is_some_and(|parent| {
        pvc.metadata.labels.as_ref().and_then(|l| l.get(PARENT_UID)) == Some(parent)
    });
    created_by(pvc, uid) || same_fan_out
}

/// The claim a template describes, labelled with the resource's uid (and its fan-out's,
/// for a group); owned by the
/// resource (so deleted with it) only when its retention is `Delete`.
pub fn from_template<K: MoverKind>(
    obj: &K,
    ids: &Ids,
    t: &PvcTemplate,
    retention: ClaimRetention,
) -> PersistentVolumeClaim {
    let access_modes = t
        .access_modes
        .as_ref()
        .map(|modes| {
            modes
                .iter()
                .map(|m| {
                    serde_json::to_value(m)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_else(|| vec!["ReadWriteOnce".to_string()]);
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(t.name.clone()),
            namespace: Some(ids.namespace.clone()),
            labels: Some(
                [
                    (labels::MANAGED_BY.to_string(), "ferry-operator".to_string()),
                    (labels::OWNER_UID.to_string(), ids.uid.clone()),
                ]
                .into_iter()
                .chain(fan_out_of(obj).map(|p| (PARENT_UID.to_string(), p.clone())))
                .collect(),
            ),
            owner_references: match retention {
                ClaimRetention::Delete => obj.controller_owner_ref(&()).map(|r| vec![r]),
                ClaimRetention::Retain => None,
            },
            // Provisioned for the mover's node (what the scheduler would set for a
            // WaitForFirstConsumer claim; a topology-bound Immediate class honours it too).
            annotations: obj.placed_on().map(|node| {
                BTreeMap::from([(
                    crate::populator::names::SELECTED_NODE.to_string(),
                    node.to_string(),
                )])
            }),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(access_modes),
            storage_class_name: t.storage_class_name.clone(),
            volume_mode: Some(t.mode().as_str().to_string()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), t.size.clone())])),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// Every claim of `obj` resolved against the claims that exist in its namespace
/// (`existing`, by name) and the namespace's `pods` (the users of claims that attach to
/// one node), with the templates' claims to create.
pub fn resolve<K: MoverKind>(
    obj: &K,
    ids: &Ids,
    existing: &BTreeMap<String, PersistentVolumeClaim>,
    pods: &[Pod],
) -> Result<Resolved, Unresolved> {
    let mut pvcs = Vec::new();
    let mut new_claims = Vec::new();
    for claim in obj.claims() {
        match claim {
            Claim::Existing(name) => match existing.get(name) {
                Some(pvc) => {
                    let mut resolved = ResolvedPvc::new(name, mode_of(pvc));
                    if users::single_node(pvc) {
                        resolved.in_use = users::user_of(name, pods, &ids.uid);
                    }
                    let written = resolved.in_use.as_ref().filter(|u| u.writes);
                    if let (Some(user), Some(true)) = (written, obj.reads_whole_image(name)) {
                        return Err(Unresolved::Written(format!(
                            "pvc/{name} is in use by pod {}, which may write it: a copy would read an image being written; stop the pod (or clone it by snapshot: cloneStrategy snapshot)",
                            user.pod
                        )));
                    }
                    pvcs.push(resolved);
                }
                None => {
                    return Err(Unresolved::Missing(format!(
                        "pvc/{name} does not exist in namespace {}: create it, or fix the name in the spec",
                        ids.namespace
                    )))
                }
            },
            Claim::Template(t, retention) => match existing.get(&t.name) {
                Some(pvc) if made_for(pvc, obj, &ids.uid) => {
                    pvcs.push(ResolvedPvc::new(&t.name, mode_of(pvc)));
                }
                Some(_) => {
                    return Err(Unresolved::Conflict(format!(
                        "pvc/{} already exists and was not created by this {}: choose another pvcTemplate name, or name the claim with pvc to write into it",
                        t.name,
                        K::KIND
                    )))
                }
                None => {
                    new_claims.push(from_template(obj, ids, t, retention));
                    pvcs.push(ResolvedPvc::new(&t.name, t.mode()));
                }
            },
        }
    }
    if let Err(message) = placement::pinning_use(&pvcs) {
        return Err(Unresolved::Apart(message));
    }
    Ok(Resolved { pvcs, new_claims })
}

/// Creates a template's claim (one that exists under its name counts as created); a
/// refusal by admission or validation is returned with the server's message.
pub async fn create(ctx: &Context, pvc: &PersistentVolumeClaim) -> Result<Created, Error> {
    let namespace = pvc.metadata.namespace.as_deref().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    match api.create(&PostParams::default(), pvc).await {
        Ok(_) => Ok(Created::Yes),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Created::Yes),
        Err(kube::Error::Api(e)) if refused(e.code) => Ok(Created::Refused(e.message)),
        Err(e) => Err(e.into()),
    }
}

/// Whether an API status code is a refusal that waiting alone does not cure: admission
/// (PodSecurity, a ResourceQuota, a missing service account, an OpenShift SCC: 403) or
/// validation (422).
pub fn refused(code: u16) -> bool {
    code == 403 || code == 422
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::crd::Transfer;

    fn group(uid: &str) -> Transfer {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "fleet-g1", "namespace": "vms", "uid": uid,
                         "labels": {"ferry.dev/fan-out-of": "p-1"}},
            "spec": {"source": {"url": "https://x/y"},
                     "targets": [{"pvcTemplate": {"name": "vm-4", "size": "1Gi"}}]},
        }))
        .unwrap()
    }

    fn resolved(t: &Transfer, existing: &[PersistentVolumeClaim]) -> Result<Resolved, Unresolved> {
        let ids = Ids::of(t).unwrap();
        let existing = existing
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap(), c.clone()))
            .collect();
        resolve(t, &ids, &existing, &[])
    }

    #[test]
    fn a_group_made_again_writes_the_claims_its_predecessor_created() {
        let first = group("uid-old");
        let made = resolved(&first, &[]).unwrap().new_claims;
        assert_eq!(made.len(), 1);
        let labels = made[0].metadata.labels.clone().unwrap();
        assert_eq!(labels[PARENT_UID], "p-1");
        assert_eq!(labels[labels::OWNER_UID], "uid-old");
        // The child deleted by hand and made again by its parent: a new uid, same fan-out.
        let again = resolved(&group("uid-new"), &made).unwrap();
        assert!(again.new_claims.is_empty());
        assert_eq!(again.pvcs[0].name, "vm-4");
        // A group of another fan-out, or a claim someone else made, is a conflict.
        let mut other = group("uid-other");
        other
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(PARENT_UID.into(), "p-2".into());
        assert!(matches!(
            resolved(&other, &made),
            Err(Unresolved::Conflict(_))
        ));
        let mut foreign = made[0].clone();
        foreign.metadata.labels = None;
        assert!(matches!(
            resolved(&group("uid-new"), &[foreign]),
            Err(Unresolved::Conflict(_))
        ));
    }
}
