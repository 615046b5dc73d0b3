//! The claims a resource names: each existing claim looked up (its volume mode decides
//! how the mover attaches it), each `pvcTemplate` claim created, owned by the resource.
//! A missing claim may still appear, so it makes the resource wait, not fail; a claim of
//! a template's name that someone else created is a conflict the user must resolve.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::Api;

use crate::crd::{PvcTemplate, VolumeMode};
use crate::mover::ResolvedPvc;

use super::context::Context;
use super::error::Error;
use super::kind::{Claim, Ids, MoverKind};

/// The claims of a resource, or why it cannot use them yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claims {
    /// Every claim, resolved.
    Ready(Vec<ResolvedPvc>),
    /// A claim does not exist (yet).
    Missing(String),
    /// A template's claim exists and belongs to something else.
    Conflict(String),
}

fn mode_of(pvc: &PersistentVolumeClaim) -> VolumeMode {
    match pvc.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) {
        Some("Block") => VolumeMode::Block,
        _ => VolumeMode::Filesystem,
    }
}

fn owned_by(pvc: &PersistentVolumeClaim, uid: &str) -> bool {
    pvc.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.uid == uid)
}

/// The claim a template describes, owned by the resource.
pub fn from_template<K: MoverKind>(obj: &K, ids: &Ids, t: &PvcTemplate) -> PersistentVolumeClaim {
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
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "ferry-operator".to_string(),
            )])),
            owner_references: obj.controller_owner_ref(&()).map(|r| vec![r]),
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
    for claim in obj.claims() {
        match claim {
            Claim::Existing(name) => match api.get_opt(name).await? {
                Some(pvc) => resolved.push(ResolvedPvc::new(name, mode_of(&pvc))),
                None => {
                    return Ok(Claims::Missing(format!(
                        "pvc/{name} does not exist in namespace {}: create it, or fix the name in the spec",
                        ids.namespace
                    )))
                }
            },
            Claim::Template(t) => match api.get_opt(&t.name).await? {
                Some(pvc) if owned_by(&pvc, &ids.uid) => {
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
                    let pvc = from_template(obj, ids, t);
                    match api.create(&PostParams::default(), &pvc).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(e)) if e.code == 409 => {}
                        Err(e) => return Err(e.into()),
                    }
                    ctx.event(obj, false, "ClaimCreated", &format!("created pvc/{}", t.name))
                        .await;
                    resolved.push(ResolvedPvc::new(&t.name, t.mode()));
                }
            },
        }
    }
    Ok(Claims::Ready(resolved))
}
