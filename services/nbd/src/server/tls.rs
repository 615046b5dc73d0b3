//! TLS for the export: a rustls server configuration from PEM files (a certificate chain,
//! its key, and optionally a CA whose client certificates alone are accepted).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use super::ExportError;
use crate::tls::{load_certs, provider};

fn config_error(e: impl std::fmt::Display) -> ExportError {
    ExportError::Config(format!("TLS: {e}"))
}

/// The server side of NBD_OPT_STARTTLS: `cert` (PEM chain) and `key` (PEM private key);
/// with `client_ca`, clients must present a certificate that CA signed.
pub fn server_tls_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, ExportError> {
    let provider = provider();
    let chain = load_certs(cert).map_err(config_error)?;
    // The key's text is never shown: only the file name and what was wrong.
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        ExportError::Config(format!(
            "TLS: cannot read a private key from {}: {e}",
            key.display()
        ))
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(config_error)?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in load_certs(ca).map_err(config_error)? {
                roots.add(c).map_err(|e| {
                    ExportError::Config(format!("TLS: bad CA certificate in {}: {e}", ca.display()))
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(config_error)?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(chain, key).map_err(|e| {
        ExportError::Config(format!("TLS: the certificate and key do not fit: {e}"))
    })?;
    Ok(Arc::new(config))
}
