//! The Secret keys a resource references (S3 and iSCSI credentials, NBD TLS Secrets)
//! exist before a mover is made to mount them: otherwise the pod would hang in
//! ContainerCreating with the reason only in its events. A missing Secret or key may
//! still appear, so the resource waits (Pending, with the Secret and key named) instead
//! of failing. Only names are ever read back; values never leave the API server's answer.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use crate::crd::{Endpoint, SecretKeyRef};

use super::context::Context;
use super::error::Error;
use super::kind::Ids;

/// Secret name -> the keys the endpoints and `keys` reference (empty for a whole-Secret
/// reference).
fn referenced(
    endpoints: &[&Endpoint],
    keys: &[&SecretKeyRef],
) -> BTreeMap<String, BTreeSet<String>> {
    let mut wanted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in keys {
        wanted
            .entry(r.name.clone())
            .or_default()
            .insert(r.key.clone());
    }
    for e in endpoints {
        for r in e.secret_refs() {
            wanted
                .entry(r.name.clone())
                .or_default()
                .insert(r.key.clone());
        }
        if let Some(name) = e.nbd.as_ref().and_then(|n| n.tls_secret_name.clone()) {
            wanted.entry(name).or_default();
        }
    }
    wanted
}

/// What is missing, as a message saying what to create, or `None` when every referenced
/// Secret and key exists.
pub async fn missing(
    ctx: &Context,
    ids: &Ids,
    endpoints: &[&Endpoint],
    keys: &[&SecretKeyRef],
) -> Result<Option<String>, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ids.namespace);
    for (name, keys) in referenced(endpoints, keys) {
        let Some(secret) = api.get_opt(&name).await? else {
            return Ok(Some(format!(
                "secret/{name} does not exist in namespace {}: create it, or fix the secretKeyRef",
                ids.namespace
            )));
        };
        let present: BTreeSet<&String> = secret
            .data
            .iter()
            .flat_map(|d| d.keys())
            .chain(secret.string_data.iter().flat_map(|d| d.keys()))
            .collect();
        if let Some(key) = keys.iter().find(|k| !present.contains(k)) {
            return Ok(Some(format!(
                "secret/{name} has no key '{key}': add it, or fix the secretKeyRef's key"
            )));
        }
    }
    Ok(None)
}
