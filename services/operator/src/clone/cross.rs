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
/// The condition reason of a Transfer whose creator may not read the source claim.
pub const NOT_AUTHORIZED: &str = "CloneNotAuthorized";
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
        annotations: Some(BTreeMap::from([(
            CLONE_FOR.to_string(),
            format!("{}/{}", ids.namespace, ids.name),
        )])),
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
