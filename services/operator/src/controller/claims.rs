//! The claims a resource names: each existing claim looked up (its volume mode decides
//! how the mover attaches it, and a pod using it where the mover must run: [`users`]),
//! each `pvcTemplate` claim created, labelled with the resource (and owned by it when its
//! retention is `Delete`). A missing claim may still appear, so it makes the resource
//! wait, not fail; a claim of a template's name that someone else created is a conflict
//! the user must resolve; a claim the API server refuses to create makes it wait, saying
//! why.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, PostParams};
use kube::Api;

use crate::crd::{ClaimRetention, PvcTemplate, VolumeMode};
use crate::mover::pod::labels;
use crate::mover::{placement, ResolvedPvc};

use super::context::Context;
use super::error::Error;
use super::kind::{Claim, Ids, MoverKind};
use super::users;

/// The claims of a resource, or why it cannot use them yet.
#[derive(Debug, Clone, PartialEq)]
pub enum Claims {
    /// Every claim, resolved.
    Ready(Vec<ResolvedPvc>),
    /// A claim does not exist (yet).
    Missing(String),
    /// A template's claim exists and belongs to something else.
    Conflict(String),
    /// The API server refused to create a template's claim (a ResourceQuota, a
    /// StorageClass that does not exist, an invalid size): the resource waits, saying so.
    Refused(String),
    /// Claims in use on different nodes, which one mover cannot attach together.
    Apart(String),
}

fn mode_of(pvc: &PersistentVolumeClaim) -> VolumeMode {
    match pvc.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) {
        Some("Block") => VolumeMode::Block,
        _ => VolumeMode::Filesystem,
    }
}

/// Whether the resource of `uid` created the claim: its label says so (or, for claims of
/// `Delete` resources and of older operators, its owner reference).
fn created_by(pvc: &PersistentVolumeClaim, uid: &str) -> bool {
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

/// The claim a template describes, labelled with the resource's uid; owned by the
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
            labels: Some(BTreeMap::from([
                (labels::MANAGED_BY.to_string(), "ferry-operator".to_string()),
                (labels::OWNER_UID.to_string(), ids.uid.clone()),
            ])),
            owner_references: match retention {
                ClaimRetention::Delete => obj.controller_owner_ref(&()).map(|r| vec![r]),
                ClaimRetention::Retain => None,
            },
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

/// Looks up (or creates) every claim of the resource.
pub async fn resolve<K: MoverKind>(ctx: &Context, obj: &K, ids: &Ids) -> Result<Claims, Error> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    let mut resolved = Vec::new();
    let mut single_node = Vec::new();
    for claim in obj.claims() {
        match claim {
            Claim::Existing(name) => match api.get_opt(name).await? {
                Some(pvc) => {
                    if users::single_node(&pvc) {
                        single_node.push(resolved.len());
                    }
                    resolved.push(ResolvedPvc::new(name, mode_of(&pvc)));
                }
                None => {
                    return Ok(Claims::Missing(format!(
                        "pvc/{name} does not exist in namespace {}: create it, or fix the name in the spec",
                        ids.namespace
                    )))
                }
            },
            Claim::Template(t, retention) => match api.get_opt(&t.name).await? {
                Some(pvc) if created_by(&pvc, &ids.uid) => {
                    resolved.push(ResolvedPvc::new(&t.name, mode_of(&pvc)));
                }
                Some(_) => {
                    return Ok(Claims::Conflict(format!(
                        "pvc/{} already exists and was not created by this {}: choose another pvcTemplate name, or name the claim with pvc to write into it",
                        t.name,
                        K::KIND
                    )))
                }
                None => {
                    let pvc = from_template(obj, ids, t, retention);
                    match api.create(&PostParams::default(), &pvc).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(e)) if e.code == 409 => {}
                        Err(kube::Error::Api(e)) if refused(e.code) => {
                            return Ok(Claims::Refused(format!(
                                "the API server refused to create pvc/{}: {}",
                                t.name, e.message
                            )))
                        }
                        Err(e) => return Err(e.into()),
                    }
                    ctx.event(obj, false, "ClaimCreated", &format!("created pvc/{}", t.name))
                        .await;
                    resolved.push(ResolvedPvc::new(&t.name, t.mode()));
                }
            },
        }
    }
    if !single_node.is_empty() {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ids.namespace);
        let pods = pods.list(&ListParams::default()).await?.items;
        for i in single_node {
            resolved[i].in_use = users::user_of(&resolved[i].name, &pods, &ids.uid);
        }
        if let Err(message) = placement::pinning_use(&resolved) {
            return Ok(Claims::Apart(message));
        }
    }
    Ok(Claims::Ready(resolved))
}

/// Whether an API status code is a refusal that waiting alone does not cure: admission
/// (PodSecurity, a ResourceQuota, a missing service account, an OpenShift SCC: 403) or
/// validation (422).
pub fn refused(code: u16) -> bool {
    code == 403 || code == 422
}
