//! The movers' CA ([`crate::mover::tls`]) lives in one Secret in the operator's
//! namespace: the first operator replica to start makes it, the others (and every later
//! start) read it, so movers made by one leader are trusted by the next.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::mover::pod::labels;
use crate::mover::tls::MoverCa;

use super::error::Error;

/// The name of the CA's Secret.
pub const CA_SECRET: &str = "ferry-mover-ca";
const CERT_KEY: &str = "ca.crt";
const KEY_KEY: &str = "ca.key";

/// The CA from its Secret in `namespace`, made and stored first if there is none.
pub async fn load_or_create(client: &Client, namespace: &str) -> Result<MoverCa, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    if let Some(secret) = api.get_opt(CA_SECRET).await? {
        return read(&secret);
    }
    let ca = MoverCa::generate()?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(CA_SECRET.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                labels::MANAGED_BY.to_string(),
                "ferry-operator".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        immutable: Some(true),
        string_data: Some(BTreeMap::from([
            (CERT_KEY.to_string(), ca.cert_pem().to_string()),
            (KEY_KEY.to_string(), ca.key_pem()),
        ])),
        ..Secret::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(ca),
        // Another replica made it first: use theirs.
        Err(kube::Error::Api(e)) if e.code == 409 => read(&api.get(CA_SECRET).await?),
        Err(e) => Err(e.into()),
    }
}

fn read(secret: &Secret) -> Result<MoverCa, Error> {
    let value = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .ok_or_else(|| Error::BadCa(CA_SECRET.to_string()))
    };
    Ok(MoverCa::from_pem(&value(CERT_KEY)?, &value(KEY_KEY)?)?)
}
