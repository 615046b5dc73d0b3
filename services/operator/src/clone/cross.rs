//! A clone from a claim in another namespace, as CDI does it: snapshots and CSI clones
//! stay in one namespace, so the work is done in the source's namespace by a child
//! Transfer into temporary claims, whose volumes are then handed over to the targets
//! ([`super::handover`]). Before anything is read or made there, the Transfer's creator
//! (the webhook's stamp, [`crate::admission::stamp`]) must be allowed to `get` the source
//! claim: a SubjectAccessReview asks the API server.
//!
//! The pure parts: the names, the child Transfer, the SubjectAccessReview and the
//! messages. The child is labelled with its parent's uid and cleaned up by the parent
//! (owner references cannot cross namespaces).

use std::collections::BTreeMap;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::ObjectMeta;

use crate::admission::stamp::Requester;
use crate::controller::kind::Ids;
use crate::crd::{ClaimRetention, PvcTemplate, Transfer, TransferSpec, TransferTarget};
use crate::mover::pod::labels;

/// The label of a child Transfer and its claims: the parent's uid.
pub const CLONE_OF: &str = "ferry.dev/clone-of";
/// The annotation of a child Transfer naming its parent (`namespace/name`), for people.
pub const CLONE_FOR: &str = "ferry.dev/clone-for";
/// The annotation of a child Transfer: a digest of what it was made from (the parent's
/// source claim and each target's name, class and size), to tell a changed spec.
pub const MADE_FROM: &str = "ferry.dev/clone-made-from";
/// The condition reason of a Transfer whose creator may not read the source claim.
pub const NOT_AUTHORIZED: &str = "CloneNotAuthorized";
/// The condition reason of a Transfer whose source or targets changed after its child
/// was made.
pub const SPEC_CHANGED: &str = "CloneSpecChanged";
/// The Running reason while the source namespace fills the temporary claims.
pub const CLONING: &str = "CloningInSourceNamespace";
/// The Running reason while the volumes are handed over.
pub const HANDING_OVER: &str = "HandingOver";

/// The child Transfer in the source namespace: `xns-<parent uid>`.
pub fn child_name(parent_uid: &str) -> String {
    format!("xns-{parent_uid}")
}

/// The temporary claim of the parent's target `index`: `xns-<parent uid>-<index>`.
pub fn temporary_claim(parent_uid: &str, index: usize) -> String {
    format!("xns-{parent_uid}-{index}")
}

/// The parent's targets, each a `pvcTemplate` (validation refuses any other).
pub fn templates(parent: &Transfer) -> Vec<PvcTemplate> {
    parent
        .spec
        .all_targets()
        .iter()
        .filter_map(|t| t.pvc_template.clone())
        .collect()
}

/// The child Transfer of `parent` (ids `ids`) in `source_namespace`: the same source
/// claim, strategy and options, into one temporary claim per target, owned by the child
/// (so they go with it); not the parent's mover settings.
pub fn child_transfer(parent: &Transfer, ids: &Ids, source_namespace: &str) -> Transfer {
    let mut source = parent.spec.source.clone();
    if let Some(pvc) = source.pvc.as_mut() {
        pvc.namespace = None;
    }
    let targets = templates(parent)
        .into_iter()
        .enumerate()
        .map(|(i, t)| TransferTarget {
            endpoint: Default::default(),
            pvc_template: Some(PvcTemplate {
                name: temporary_claim(&ids.uid, i),
                ..t
            }),
        })
        .collect();
    let spec = TransferSpec {
        source,
        targets,
        pvc_templates: None,
        relay: None,
        claim_retention: Some(ClaimRetention::Delete),
        // The mover's pod settings (service account, security context, node, tolerations,
        // priority) are not the creator's to choose in a namespace it may only clone from:
        // the child's mover runs with the operator's defaults there.
        mover: None,
        ..parent.spec.clone()
    };
    let mut child = Transfer::new(&child_name(&ids.uid), spec);
    child.metadata = ObjectMeta {
        name: Some(child_name(&ids.uid)),
        namespace: Some(source_namespace.to_string()),
        labels: Some(BTreeMap::from([
            (labels::MANAGED_BY.to_string(), "ferry-operator".to_string()),
            (CLONE_OF.to_string(), ids.uid.clone()),
        ])),
        annotations: Some(BTreeMap::from([
            (
                CLONE_FOR.to_string(),
                format!("{}/{}", ids.namespace, ids.name),
            ),
            (MADE_FROM.to_string(), made_from(parent, source_namespace)),
        ])),
        ..ObjectMeta::default()
    };
    child
}

/// The SubjectAccessReview: may `requester` clone the claim `namespace/name`, that is
/// `create` `transfers/source` (ferry.dev) of that name in its namespace? A permission of
/// its own, as CDI's `datavolumes/source`: reading a claim's object (`get`, in the
/// built-in `view` role) does not give its bytes away.
pub fn access_review(requester: &Requester, namespace: &str, name: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        metadata: ObjectMeta::default(),
        spec: SubjectAccessReviewSpec {
            user: Some(requester.user.clone()),
            uid: requester.uid.clone(),
            groups: Some(requester.groups.clone()).filter(|g| !g.is_empty()),
            extra: Some(requester.extra.clone()).filter(|e| !e.is_empty()),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_string()),
                verb: Some("create".into()),
                group: Some("ferry.dev".into()),
                resource: Some("transfers".into()),
                subresource: Some("source".into()),
                name: Some(name.to_string()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        status: None,
    }
}

/// The message of a denied review: who may not read what, and how to grant it.
pub fn denied_message(user: &str, namespace: &str, name: &str, reason: Option<&str>) -> String {
    let why = reason
        .filter(|r| !r.is_empty())
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    format!(
        "user {user} may not clone persistentvolumeclaim {name} of namespace {namespace}{why}: a clone from another namespace needs `create` on `transfers/source` (API group ferry.dev) there, as CDI's clones need `datavolumes/source`. Grant it with a Role in namespace {namespace} with the rule {{apiGroups: [ferry.dev], resources: [transfers/source], resourceNames: [{name}], verbs: [create]}} and a RoleBinding of it to user {user}, then create the Transfer again"
    )
}

/// The digest of what a child is made from: the source claim (`namespace/name`) and each
/// target's name, storage class and size, in order (SHA-256, hex). Modes are left out:
/// the class defaults fill them in the operator, from profiles that may change.
pub fn made_from(parent: &Transfer, source_namespace: &str) -> String {
    use sha2::{Digest, Sha256};
    let source = parent
        .spec
        .source
        .pvc
        .as_ref()
        .map(|p| p.name.as_str())
        .unwrap_or_default();
    let targets: Vec<serde_json::Value> = templates(parent)
        .iter()
        .map(|t| serde_json::json!([t.name, t.storage_class_name, t.size]))
        .collect();
    let text = serde_json::json!([format!("{source_namespace}/{source}"), targets]).to_string();
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The child the Transfer `parent_uid` recorded in `status.cloneTransfer`
/// (`namespace/name`). Whoever may write a Transfer's status could write anything there:
/// only the name the operator gives its child ([`child_name`]) is taken.
pub fn recorded(clone_transfer: Option<&str>, parent_uid: &str) -> Option<(String, String)> {
    let (namespace, name) = clone_transfer?.split_once('/')?;
    (!namespace.is_empty() && name == child_name(parent_uid))
        .then(|| (namespace.to_string(), name.to_string()))
}

/// Why `parent`'s spec no longer is what its child (`child_namespace/child_name`, made
/// from it) was made from: its source claim now in `wanted` (None: its own namespace), or
/// another source claim or other targets than the child's record says. None when
/// unchanged (or when the child, made by an older operator, has no record).
pub fn changed(
    parent: &Transfer,
    wanted: Option<&str>,
    child_namespace: &str,
    child_name: &str,
    child: Option<&Transfer>,
) -> Option<String> {
    let what = if wanted != Some(child_namespace) {
        let now = match wanted {
            Some(ns) => format!("namespace {ns}"),
            None => "the Transfer's own namespace".to_string(),
        };
        format!("spec.source.pvc.namespace changed from {child_namespace} to {now}")
    } else {
        let record = child?.metadata.annotations.as_ref()?.get(MADE_FROM)?;
        if *record == made_from(parent, child_namespace) {
            return None;
        }
        "spec.source or the targets changed".to_string()
    };
    Some(format!(
        "{what} after the clone started: Transfer {child_namespace}/{child_name} fills the claims of the spec it was made from, so a clone from another namespace cannot change its source or targets once it started. Its child and temporary claims are deleted; create a new Transfer for the new spec"
    ))
}
