//! Building the AWS SDK client: the SDK's standard configuration chain, a rustls (ring)
//! HTTP client, and the per-job overrides of [`S3Options`].

use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::Client;
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

use crate::S3Options;

/// The region used when nothing configures one: S3-compatible stores usually accept it.
const FALLBACK_REGION: &str = "us-east-1";
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for a response to start once a request is sent. Generous, because
/// some stores assemble the whole object before answering CompleteMultipartUpload.
const READ_TIMEOUT: Duration = Duration::from_secs(300);

/// A client for one job. Cheap to clone: every clone shares the connection pool.
pub(crate) async fn build(options: &S3Options) -> Client {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(http);
    if let Some(region) = &options.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(url) = &options.endpoint_url {
        loader = loader.endpoint_url(url.clone());
    }
    if let (Some(key_id), Some(secret)) = (&options.access_key_id, &options.secret_access_key) {
        loader = loader.credentials_provider(Credentials::new(
            key_id.expose(),
            secret.expose(),
            options
                .session_token
                .as_ref()
                .map(|t| t.expose().to_string()),
            None,
            "ferry-job",
        ));
    }
    let sdk = loader.load().await;

    let configured = sdk
        .timeout_config()
        .cloned()
        .unwrap_or_else(|| TimeoutConfig::builder().build());
    let mut timeouts = configured.to_builder();
    if configured.connect_timeout().is_none() {
        timeouts = timeouts.connect_timeout(CONNECT_TIMEOUT);
    }
    if configured.read_timeout().is_none() {
        timeouts = timeouts.read_timeout(READ_TIMEOUT);
    }

    let mut config = aws_sdk_s3::config::Builder::from(&sdk).timeout_config(timeouts.build());
    if sdk.region().is_none() {
        config = config.region(Region::new(FALLBACK_REGION));
    }
    if let Some(path_style) = options.force_path_style {
        config = config.force_path_style(path_style);
    }
    Client::from_conf(config.build())
}

/// The number of attempts the SDK makes for one request, reused for retries of body
/// streams that break after the response started.
pub fn max_attempts(client: &Client) -> u32 {
    client
        .config()
        .retry_config()
        .map(|r| r.max_attempts())
        .unwrap_or(3)
        .max(1)
}
