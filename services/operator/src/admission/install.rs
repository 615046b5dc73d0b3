//! The webhook's MutatingWebhookConfiguration is shipped without a caBundle (the CA is
//! made in the cluster by the first operator): each operator puts the movers' CA
//! certificate into every webhook of it at start, and puts it back when something (a
//! re-applied manifest) took it out.

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::{Api, Client};

use super::server::WebhookError;

/// The name of the operator's MutatingWebhookConfiguration (chart and deploy/).
pub const WEBHOOK_CONFIGURATION: &str = "ferry-operator";

/// Sets the caBundle of every webhook of the configuration `name` to `ca_pem`, unless it
/// already is (another replica set it). Retries a write that lost a race.
pub async fn set_ca_bundle(client: &Client, name: &str, ca_pem: &str) -> Result<(), WebhookError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let fail = |source| WebhookError::Install {
        name: name.to_string(),
        source,
    };
    for _ in 0..5 {
        let mut config = api.get(name).await.map_err(fail)?;
        let wanted = ByteString(ca_pem.as_bytes().to_vec());
        let mut changed = false;
        for hook in config.webhooks.iter_mut().flatten() {
            if hook.client_config.ca_bundle.as_ref() != Some(&wanted) {
                hook.client_config.ca_bundle = Some(wanted.clone());
                changed = true;
            }
        }
        if !changed {
            return Ok(());
        }
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(fail(e)),
        }
    }
    Ok(())
}

/// Sets the caBundle now and then every `every` (a manifest applied again may have
/// emptied it), logging what fails; runs until dropped.
pub async fn keep_ca_bundle(
    client: Client,
    name: String,
    ca_pem: String,
    every: std::time::Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = set_ca_bundle(&client, &name, &ca_pem).await {
            tracing::warn!(error = %e, "cannot keep the webhook's caBundle");
        }
    }
}
