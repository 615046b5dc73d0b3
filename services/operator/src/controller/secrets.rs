//! The Secret keys a resource references (S3 and iSCSI credentials, NBD TLS Secrets)
//! exist before a mover is made to mount them: otherwise the pod would hang in
//! ContainerCreating with the reason only in its events. A missing Secret or key may
//! still appear, so the resource waits (Pending, with the Secret and key named) instead
//! of failing. Only names are ever read back; values never leave the API server's answer.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use crate::crd::endpoint::DOCKER_CONFIG_KEY;
use crate::crd::{Endpoint, SecretKeyRef};

use super::context::Context;
use super::error::Error;

/// Secret name -> the keys the endpoints and `keys` reference (empty for a whole-Secret
/// reference).
pub fn referenced(
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
        if let Some(name) = e.registry.as_ref().and_then(|r| r.secret_ref.clone()) {
            wanted
                .entry(name)
                .or_default()
                .insert(DOCKER_CONFIG_KEY.to_string());
        }
    }
    wanted
}

/// The Secrets `endpoints` and `keys` reference that exist in `namespace`, with the keys
/// they hold.
pub async fn observe(
    ctx: &Context,
    namespace: &str,
    endpoints: &[&Endpoint],
    keys: &[&SecretKeyRef],
) -> Result<BTreeMap<String, BTreeSet<String>>, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let mut present = BTreeMap::new();
    for name in referenced(endpoints, keys).into_keys() {
        if let Some(secret) = api.get_opt(&name).await? {
            present.insert(name, keys_of(&secret));
        }
    }
    Ok(present)
}

/// The keys a Secret holds (never its values).
pub fn keys_of(secret: &Secret) -> BTreeSet<String> {
    secret
        .data
        .iter()
        .flat_map(|d| d.keys())
        .chain(secret.string_data.iter().flat_map(|d| d.keys()))
        .cloned()
        .collect()
}

/// What is missing, as a message saying what to create, or `None` when every referenced
/// Secret and key exists in `present` (the namespace's Secrets: name -> their keys).
pub fn missing(
    present: &BTreeMap<String, BTreeSet<String>>,
    namespace: &str,
    endpoints: &[&Endpoint],
    keys: &[&SecretKeyRef],
) -> Option<String> {
    for (name, keys) in referenced(endpoints, keys) {
        let Some(held) = present.get(&name) else {
            return Some(format!(
                "secret/{name} does not exist in namespace {namespace}: create it, or fix the secretKeyRef"
            ));
        };
        if let Some(key) = keys.iter().find(|k| !held.contains(*k)) {
            return Some(format!(
                "secret/{name} has no key '{key}': add it, or fix the secretKeyRef's key"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{NbdOptions, RegistryOptions};

    #[test]
    fn a_registry_source_needs_its_secrets_docker_config() {
        let mut registry = Endpoint::url("docker://registry.example.com/vms/fedora:41");
        registry.registry = Some(RegistryOptions {
            secret_ref: Some("pull-secret".into()),
            ..RegistryOptions::default()
        });
        let mut nbd = Endpoint::url("nbds://h/e");
        nbd.nbd = Some(NbdOptions {
            tls_secret_name: Some("certs".into()),
            ..NbdOptions::default()
        });
        let wanted = referenced(&[&registry, &nbd], &[]);
        assert_eq!(
            wanted,
            BTreeMap::from([
                ("certs".to_string(), BTreeSet::new()),
                (
                    "pull-secret".to_string(),
                    BTreeSet::from([".dockerconfigjson".to_string()])
                ),
            ])
        );
    }
}
