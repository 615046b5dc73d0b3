//! The hand-over of a temporary claim's volume (filled in the source namespace) to the
//! target claim in the Transfer's namespace, as CDI does it across namespaces: the
//! volume's reclaim policy set to Retain (its old one kept in an annotation), its
//! `claimRef` pointed at the target (no uid: the PV controller binds the claim that
//! comes), the target claim created naming the volume, the temporary claim deleted (it
//! no longer holds the volume, so the volume stays), and once the target is bound the old
//! reclaim policy put back. The volume is never copied and never free in between.
//!
//! A hand-over that does not finish (the Transfer fails, or is deleted, part-way) is
//! undone by [`release`]: the volume is labelled with the Transfer's uid at the first
//! patch, together with the claim it came from, so every volume taken can be found and
//! given back its reclaim policy and, unless a target claim holds it, its old claim (then
//! the PersistentVolume controller reclaims it as it would have the temporary claim's).
//!
//! A pure function of what the cluster shows gives the next step, so that each reconcile
//! takes one and a restarted operator goes on where it stopped. (The populator's
//! `rebind` hands a prime claim's volume over within one namespace and binds a claim the
//! user made; here the operator makes the target, so the steps differ.)

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::{json, Value};

use crate::controller::claims::{created_by, from_template};
use crate::controller::kind::Ids;
use crate::crd::{PvcTemplate, Transfer};

/// The annotation on a volume being handed over: its reclaim policy before.
pub const RECLAIM_POLICY: &str = "ferry.dev/reclaim-policy";
/// The annotation on a target claim: the temporary claim its volume came from.
pub const HANDED_FROM: &str = "ferry.dev/handed-over-from";
/// The annotation on a volume taken for a hand-over: the uid of the Transfer it is
/// handed to. Only a volume the PV controller bound to the temporary claim (by uid) is
/// ever marked, and only a marked volume is ever patched: a claim someone made naming
/// another volume takes nothing.
/// The same key is the label on a volume whose hand-over has not finished (removed with
/// the saved policy), by which [`release`]'s caller finds them.
pub const HANDED_OVER_FOR: &str = "ferry.dev/handed-over-for";
/// The annotation on a volume being handed over: the claim it was bound to before
/// (`namespace/name/uid`), to give it back to when the hand-over is undone.
pub const CLAIM_BEFORE: &str = "ferry.dev/claim-before";

/// What the cluster shows of one target's hand-over.
#[derive(Debug, Clone, Copy, Default)]
pub struct Observed<'a> {
    /// The temporary claim in the source namespace, when it exists.
    pub temporary: Option<&'a PersistentVolumeClaim>,
    /// The volume (named by the target claim, else by the temporary claim).
    pub volume: Option<&'a PersistentVolume>,
    /// The target claim, when it exists.
    pub target: Option<&'a PersistentVolumeClaim>,
}

/// The next step of one hand-over.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Merge-patch the volume `name`.
    PatchVolume {
        /// The volume.
        name: String,
        /// The merge patch.
        patch: Value,
    },
    /// Create the target claim.
    CreateTarget(Box<PersistentVolumeClaim>),
    /// Delete the temporary claim (`namespace`, `name`).
    DeleteTemporary(String, String),
    /// Nothing to do now: why.
    Wait(String),
    /// The target is bound to the volume, whose policy is back: its name.
    Done(String),
    /// A claim of the target's name exists and was not made by this Transfer.
    Conflict(String),
}

fn phase(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn volume_name(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty())
}

/// The volume name a hand-over reads: the target's, else the temporary claim's (Bound,
/// or Lost once the volume points at the target).
pub fn volume_of<'a>(
    temporary: Option<&'a PersistentVolumeClaim>,
    target: Option<&'a PersistentVolumeClaim>,
) -> Option<&'a str> {
    target
        .and_then(volume_name)
        .or_else(|| temporary.and_then(volume_name))
}

/// The target claim: the template's, naming `volume`.
pub fn target_claim(
    parent: &Transfer,
    ids: &Ids,
    template: &PvcTemplate,
    volume: &str,
    from: &str,
) -> PersistentVolumeClaim {
    let retention = parent.spec.claim_retention.unwrap_or_default();
    let mut pvc = from_template(parent, ids, template, retention);
    pvc.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(HANDED_FROM.to_string(), from.to_string());
    if let Some(spec) = pvc.spec.as_mut() {
        spec.volume_name = Some(volume.to_string());
    }
    pvc
}

/// The next step of handing the temporary claim `source_namespace/temporary` over to the
/// target `template` of `parent`.
pub fn next(
    parent: &Transfer,
    ids: &Ids,
    template: &PvcTemplate,
    source_namespace: &str,
    temporary: &str,
    observed: &Observed,
) -> Step {
    if let Some(target) = observed.target {
        if !created_by(target, &ids.uid) {
            return Step::Conflict(format!(
                "pvc/{} already exists and was not created by this Transfer: choose another pvcTemplate name",
                template.name
            ));
        }
    }
    let Some(pv) = observed.volume else {
        return Step::Wait(match observed.target {
            Some(_) => format!("pvc/{} waits for its volume", template.name),
            None => format!("pvc/{temporary} in namespace {source_namespace} is not bound yet"),
        });
    };
    let name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.clone().unwrap_or_default();
    let annotations = pv.metadata.annotations.as_ref();
    let saved = annotations.and_then(|a| a.get(RECLAIM_POLICY)).cloned();
    let marked = annotations
        .and_then(|a| a.get(HANDED_OVER_FOR))
        .is_some_and(|uid| *uid == ids.uid);
    if !marked {
        let temporary_claim = observed.temporary;
        if temporary_claim.is_some_and(|t| phase(t) != Some("Bound")) {
            return Step::Wait(format!(
                "pvc/{temporary} in namespace {source_namespace} is not bound yet"
            ));
        }
        let held = temporary_claim
            .and_then(|t| t.metadata.uid.as_deref())
            .is_some_and(|uid| {
                spec.claim_ref.as_ref().is_some_and(|r| {
                    r.uid.as_deref() == Some(uid)
                        && r.namespace.as_deref() == Some(source_namespace)
                        && r.name.as_deref() == Some(temporary)
                })
            });
        if !held {
            return Step::Conflict(format!(
                "volume {name} is not the volume of pvc/{temporary} in namespace {source_namespace}: it is not handed over"
            ));
        }
    }
    let bound = observed
        .target
        .is_some_and(|t| phase(t) == Some("Bound") && volume_name(t) == Some(name.as_str()));
    if bound && saved.is_none() {
        return Step::Done(name);
    }
    if saved.is_none() {
        let policy = spec
            .persistent_volume_reclaim_policy
            .clone()
            .unwrap_or_else(|| "Delete".into());
        let mut annotations = json!({RECLAIM_POLICY: policy, HANDED_OVER_FOR: ids.uid});
        if let Some(before) = spec.claim_ref.as_ref().and_then(claim_key) {
            annotations[CLAIM_BEFORE] = json!(before);
        }
        return Step::PatchVolume {
            name,
            patch: json!({
                "metadata": {"annotations": annotations, "labels": {HANDED_OVER_FOR: ids.uid}},
                "spec": {"persistentVolumeReclaimPolicy": "Retain"},
            }),
        };
    }
    let claimed = spec.claim_ref.as_ref().is_some_and(|r| {
        r.namespace.as_deref() == Some(ids.namespace.as_str())
            && r.name.as_deref() == Some(template.name.as_str())
    });
    if !claimed {
        return Step::PatchVolume {
            name,
            patch: json!({"spec": {"claimRef": {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": ids.namespace, "name": template.name,
                "uid": null, "resourceVersion": null,
            }}}),
        };
    }
    if observed.target.is_none() {
        let from = format!("{source_namespace}/{temporary}");
        return Step::CreateTarget(Box::new(target_claim(parent, ids, template, &name, &from)));
    }
    if observed.temporary.is_some() {
        return Step::DeleteTemporary(source_namespace.to_string(), temporary.to_string());
    }
    if !bound {
        return Step::Wait(format!("pvc/{} is binding to volume {name}", template.name));
    }
    Step::PatchVolume {
        name,
        patch: json!({
            "metadata": {"annotations": {RECLAIM_POLICY: null, CLAIM_BEFORE: null},
                         "labels": {HANDED_OVER_FOR: null}},
            "spec": {"persistentVolumeReclaimPolicy": saved},
        }),
    }
}

/// `namespace/name/uid` of a claim reference with all three.
fn claim_key(r: &k8s_openapi::api::core::v1::ObjectReference) -> Option<String> {
    let part = |p: &Option<String>| p.clone().filter(|p| !p.is_empty());
    Some(format!(
        "{}/{}/{}",
        part(&r.namespace)?,
        part(&r.name)?,
        part(&r.uid)?
    ))
}

/// The merge patch that undoes an unfinished hand-over of `pv` (labelled
/// [`HANDED_OVER_FOR`]) when its Transfer fails or is deleted; `claimant` is the claim
/// its `claimRef` names, when that exists.
///
/// - Its saved reclaim policy is put back and the marks go, always.
/// - A claim that holds it (the `claimRef`'s uid is the claim's: the temporary claim
///   before it was pointed away, or a target that bound to it) keeps it: the volume
///   follows that claim (a bound target's volume is the user's).
/// - Otherwise (pointed at a target that does not exist, or did not bind yet, and so has
///   no uid in the reference) it goes back to the claim it came from, by that claim's
///   uid: the temporary claim holds it again while it exists, and once it is gone the
///   PersistentVolume controller releases the volume and reclaims it by its policy, as it
///   would have without the hand-over. Cleared instead, it would be Available to any
///   claim of its class in any namespace (with the source's data on it); left pointing
///   at a name with no uid, it would wait for that claim forever.
pub fn release(pv: &PersistentVolume, claimant: Option<&PersistentVolumeClaim>) -> Value {
    let annotations = pv.metadata.annotations.as_ref();
    let saved = annotations.and_then(|a| a.get(RECLAIM_POLICY));
    let mut patch = json!({"metadata": {
        "annotations": {RECLAIM_POLICY: null, CLAIM_BEFORE: null},
        "labels": {HANDED_OVER_FOR: null},
    }});
    if let Some(policy) = saved {
        patch["spec"]["persistentVolumeReclaimPolicy"] = json!(policy);
    }
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let held = claim_ref.is_some_and(|r| {
        r.uid.as_deref().is_some_and(|uid| !uid.is_empty())
            && claimant.is_some_and(|c| c.metadata.uid == r.uid)
    });
    let before = annotations
        .and_then(|a| a.get(CLAIM_BEFORE))
        .and_then(|b| {
            let mut parts = b.splitn(3, '/');
            Some((parts.next()?, parts.next()?, parts.next()?))
        })
        .filter(|(ns, name, uid)| !ns.is_empty() && !name.is_empty() && !uid.is_empty());
    let names_before = claim_ref.is_some_and(|r| {
        before.is_some_and(|(ns, name, _)| {
            r.namespace.as_deref() == Some(ns) && r.name.as_deref() == Some(name)
        })
    });
    if let (false, false, Some((namespace, name, uid))) = (held, names_before, before) {
        patch["spec"]["claimRef"] = json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "namespace": namespace, "name": name, "uid": uid, "resourceVersion": null,
        });
    }
    patch
}

/// Whether `pvc` is a target claim this hand-over made (for the Transfer `uid`) that
/// never bound: once its volume is given back it can never bind, so it goes too.
pub fn unbound_target(pvc: &PersistentVolumeClaim, uid: &str) -> bool {
    created_by(pvc, uid)
        && pvc
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(HANDED_FROM))
        && phase(pvc) != Some("Bound")
}
