//! The mutating webhook's answer to one AdmissionReview, as a pure function of the
//! request's JSON: a Transfer whose source claim is in another namespace is stamped
//! ([`super::stamp`]) with the user who created it, or who changed its source; any other
//! update keeps the stamp the object had (the operator's own finalizer patches, a label
//! change, a user trying to put their own value in). An update that changes the source
//! or the targets once the clone started (`status.cloneTransfer`) is refused, also when
//! it moves the source into the Transfer's own namespace. Everything else is allowed as
//! it is.

use base64::Engine;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview, Operation};
use serde_json::{json, Value};

use super::stamp::{Claim, Requester, StampKey, REQUESTER};

/// The path the webhook is served at.
pub const PATH: &str = "/mutate-transfer";

/// The AdmissionReview (JSON) answering `body` (an AdmissionReview of a request).
pub fn answer(body: &[u8], key: &StampKey) -> Value {
    let response = match serde_json::from_slice::<AdmissionReview<DynamicObject>>(body) {
        Ok(AdmissionReview {
            request: Some(request),
            ..
        }) => respond(&request, key),
        Ok(_) => refused("", "the AdmissionReview has no request"),
        Err(e) => refused("", &format!("the AdmissionReview cannot be read: {e}")),
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

fn refused(uid: &str, message: &str) -> Value {
    json!({"uid": uid, "allowed": false, "status": {"code": 400, "message": message}})
}

fn annotation(object: &DynamicObject) -> Option<&String> {
    object.metadata.annotations.as_ref()?.get(REQUESTER)
}

/// The response to one request.
pub fn respond(request: &AdmissionRequest<DynamicObject>, key: &StampKey) -> Value {
    let uid = request.uid.as_str();
    let allowed = json!({"uid": uid, "allowed": true});
    let is_transfer = request.kind.group == "ferry.dev" && request.kind.kind == "Transfer";
    let (Some(object), true) = (&request.object, is_transfer) else {
        return allowed;
    };
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return allowed;
    }
    if let Some(refusal) = started_and_changed(request) {
        return json!({"uid": uid, "allowed": false, "status": {"code": 422, "message": refusal}});
    }
    let namespace = request
        .namespace
        .clone()
        .or_else(|| object.metadata.namespace.clone())
        .unwrap_or_default();
    let source = &object.data["spec"]["source"];
    let Some(source_namespace) = source["pvc"]["namespace"]
        .as_str()
        .filter(|ns| *ns != namespace)
    else {
        // Not a clone across namespaces: nothing to say.
        return allowed;
    };
    let current = annotation(object);
    let old = request.old_object.as_ref();
    let source_kept = request.operation == Operation::Update
        && old.is_some_and(|o| o.data["spec"]["source"] == *source);
    let wanted = if source_kept {
        old.and_then(annotation).cloned()
    } else {
        let name = if request.name.is_empty() {
            object.metadata.name.clone().unwrap_or_default()
        } else {
            request.name.clone()
        };
        if name.is_empty() {
            return json!({"uid": uid, "allowed": false, "status": {"code": 422, "message":
                "a Transfer from a claim in another namespace needs a metadata.name (not generateName): the operator's record of who created it names the Transfer"}});
        }
        let info = &request.user_info;
        Some(key.sign(Claim {
            requester: Requester {
                user: info.username.clone().unwrap_or_default(),
                uid: info.uid.clone(),
                groups: info.groups.clone().unwrap_or_default(),
                extra: info.extra.clone().unwrap_or_default().into_iter().collect(),
            },
            transfer: format!("{namespace}/{name}"),
            source: format!(
                "{source_namespace}/{}",
                source["pvc"]["name"].as_str().unwrap_or_default()
            ),
        }))
    };
    if wanted.as_ref() == current {
        return allowed;
    }
    let escaped = REQUESTER.replace('~', "~0").replace('/', "~1");
    let patch = match wanted {
        None => json!([{"op": "remove", "path": format!("/metadata/annotations/{escaped}")}]),
        Some(value) if object.metadata.annotations.is_none() => {
            json!([{"op": "add", "path": "/metadata/annotations", "value": {REQUESTER: value}}])
        }
        Some(value) => {
            json!([{"op": "add", "path": format!("/metadata/annotations/{escaped}"), "value": value}])
        }
    };
    let encoded = base64::engine::general_purpose::STANDARD.encode(patch.to_string());
    json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": encoded})
}

/// An UPDATE that changes the source or the targets of a Transfer whose clone from
/// another namespace started (the old object records its child in
/// `status.cloneTransfer`): why it is refused. The operator fails such a Transfer too
/// (whatever reaches it); refused here, the user learns it at once.
fn started_and_changed(request: &AdmissionRequest<DynamicObject>) -> Option<String> {
    if request.operation != Operation::Update {
        return None;
    }
    let (old, new) = (request.old_object.as_ref()?, request.object.as_ref()?);
    let child = old.data["status"]["cloneTransfer"]
        .as_str()
        .filter(|c| !c.is_empty())?;
    let changed: Vec<String> = ["source", "targets", "pvcTemplates"]
        .into_iter()
        .filter(|f| old.data["spec"][f] != new.data["spec"][f])
        .map(|f| format!("spec.{f}"))
        .collect();
    if changed.is_empty() {
        return None;
    }
    Some(format!(
        "{} of a Transfer from a claim in another namespace cannot change once its clone started (its child Transfer {child} fills the claims of the spec it was made from): create a new Transfer instead",
        changed.join(" and ")
    ))
}
