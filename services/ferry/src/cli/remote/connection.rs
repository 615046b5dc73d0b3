//! How the clients reach a running `ferry serve`: the `--server`, token and TLS flags
//! shared by `ferry job`, `ferry schedule` and `ferry backup --server`, the channel they
//! open, and the one way a gRPC status becomes the command's error.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ferry_api::auth::BearerToken;
use ferry_core::Secret;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// How to reach a running `ferry serve` (shared by `ferry job` and `ferry schedule`).
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The server: http://HOST:PORT, or https://HOST:PORT for TLS.
    #[arg(
        long,
        env = "FERRY_SERVER",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    pub server: String,
    /// File with the bearer token (the FERRY_TOKEN variable works too).
    #[arg(long, env = "FERRY_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// PEM CA bundle to verify the server with (https).
    #[arg(long, env = "FERRY_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS.
    #[arg(
        long,
        env = "FERRY_TLS_CLIENT_CERT",
        global = true,
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM key of --tls-cert.
    #[arg(
        long,
        env = "FERRY_TLS_CLIENT_KEY",
        global = true,
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// Server name to verify the certificate against (default: the host of --server).
    #[arg(long, global = true)]
    pub tls_domain: Option<String>,
}

/// A channel to the server named in the arguments, and the bearer token to send on it.
pub async fn channel(args: &ServerArgs) -> anyhow::Result<(Channel, BearerToken)> {
    let mut endpoint = Channel::from_shared(args.server.clone())
        .with_context(|| format!("--server '{}' is not a URL", args.server))?
        .connect_timeout(Duration::from_secs(10));
    if args.server.starts_with("https://") || args.tls_ca.is_some() {
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &args.tls_ca {
            let pem = std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
            let cert =
                std::fs::read(cert).with_context(|| format!("cannot read {}", cert.display()))?;
            let key =
                std::fs::read(key).with_context(|| format!("cannot read {}", key.display()))?;
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &args.tls_domain {
            tls = tls.domain_name(domain.clone());
        }
        endpoint = endpoint.tls_config(tls).context("TLS configuration")?;
    }
    let token = match &args.token_file {
        Some(p) => Some(Secret::new(
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read the token file {}", p.display()))?
                .trim(),
        )),
        None => std::env::var("FERRY_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
            .map(Secret::new),
    };
    let channel = endpoint
        .connect()
        .await
        .with_context(|| format!("cannot connect to {}", args.server))?;
    Ok((channel, BearerToken::new(token.as_ref())?))
}

pub fn status_error(e: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{} ({:?})", e.message(), e.code())
}

/// A `--label KEY=VALUE`.
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("label '{s}' is not KEY=VALUE"))
}

/// A secret by reference, as the server reads it: an environment variable of the server
/// (`env`, first) or a file under its `--secrets-dir`; none when neither is given.
pub(crate) fn secret_ref(
    env: &Option<String>,
    file: &Option<String>,
) -> Option<ferry_api::proto::SecretRef> {
    use ferry_api::proto;
    let source = match (env, file) {
        (Some(env), _) => proto::secret_ref::Source::Env(env.clone()),
        (None, Some(file)) => proto::secret_ref::Source::File(file.clone()),
        (None, None) => return None,
    };
    Some(proto::SecretRef {
        source: Some(source),
    })
}
