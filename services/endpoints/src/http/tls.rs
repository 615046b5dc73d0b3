//! The rustls configuration of an HTTPS source: the system's trusted roots plus the
//! job's CA certificates, and the job's client certificate when it has one.

use std::sync::Arc;

use ferry_core::{Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use super::HttpOptions;

fn certificates(what: &str, pem: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::invalid_input(format!("the {what} is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(Error::invalid_input(format!(
            "the {what} holds no PEM certificate"
        )));
    }
    Ok(certs)
}

/// Builds the TLS configuration for `options`.
pub(super) fn client_config(options: &HttpOptions) -> Result<ClientConfig> {
    let mut roots = RootCertStore::empty();
    // Unreadable system certificates are skipped: the job's CA may be all that is needed.
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(pem) = &options.ca_pem {
        for cert in certificates("CA certificate", pem)? {
            roots.add(cert).map_err(|e| {
                Error::invalid_input(format!("the CA certificate cannot be used: {e}"))
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::internal(format!("TLS setup: {e}")))?
        .with_root_certificates(roots);
    // ALPN is set by the connector (hyper-rustls refuses a preset one).
    let config = match (&options.client_cert_pem, &options.client_key_pem) {
        (Some(cert), Some(key)) => {
            let chain = certificates("client certificate", cert)?;
            // The parser's error never quotes the key.
            let key = PrivateKeyDer::from_pem_slice(key.expose().as_bytes())
                .map_err(|_| Error::invalid_input("the client key is not a PEM private key"))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                Error::invalid_input(format!(
                    "the client certificate and key cannot be used together: {e}"
                ))
            })?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(Error::invalid_input(
                "a client certificate needs both the certificate and its key",
            ))
        }
    };
    Ok(config)
}
