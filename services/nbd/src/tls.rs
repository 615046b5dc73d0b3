//! TLS for NBD_OPT_STARTTLS: a rustls client configuration built from an X.509
//! certificate directory in the layout libnbd and QEMU use (`ca-cert.pem`, and
//! optionally `client-cert.pem` + `client-key.pem`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::config::TlsConfig;
use crate::error::{Error, Result};

const CA_CERT: &str = "ca-cert.pem";
const CLIENT_CERT: &str = "client-cert.pem";
const CLIENT_KEY: &str = "client-key.pem";

/// libnbd's default certificate directories, in order.
fn default_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(xdg) = std::env::var_os("XDG_CONFIG_HOME") {
        dirs.push(PathBuf::from(xdg).join("pki/libnbd"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".pki/libnbd"));
    }
    dirs.push(PathBuf::from("/etc/pki/libnbd"));
    dirs
}

fn certificate_dir(tls: &TlsConfig) -> Option<PathBuf> {
    match &tls.certificates {
        Some(dir) => Some(dir.clone()),
        None => default_dirs()
            .into_iter()
            .find(|d| d.join(CA_CERT).exists() || d.join(CLIENT_CERT).exists()),
    }
}

pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Error::TlsConfig(format!("cannot read {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::TlsConfig(format!(
            "{} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the rustls configuration for `tls`.
pub fn client_config(tls: &TlsConfig) -> Result<Arc<ClientConfig>> {
    let dir = certificate_dir(tls);
    if let Some(dir) = &dir {
        if !dir.is_dir() {
            return Err(Error::TlsConfig(format!(
                "tls-certificates directory {} does not exist",
                dir.display()
            )));
        }
    }
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::TlsConfig(e.to_string()))?;
    let builder = if tls.verify_peer {
        let ca = dir.as_ref().map(|d| d.join(CA_CERT)).filter(|p| p.exists());
        let Some(ca) = ca else {
            return Err(Error::TlsConfig(format!(
                "no {CA_CERT} to verify the server with: give tls-certificates=DIR holding {CA_CERT} (looked in {})",
                dir.map(|d| d.display().to_string()).unwrap_or_else(|| default_dirs()
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "))
            )));
        };
        let mut roots = RootCertStore::empty();
        for cert in load_certs(&ca)? {
            roots.add(cert).map_err(|e| {
                Error::TlsConfig(format!("bad CA certificate in {}: {e}", ca.display()))
            })?;
        }
        builder.with_root_certificates(roots)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerifier(provider)))
    };
    let cert = dir.as_ref().map(|d| d.join(CLIENT_CERT));
    let key = dir.as_ref().map(|d| d.join(CLIENT_KEY));
    let config = match (cert, key) {
        (Some(cert), Some(key)) if cert.exists() && key.exists() => {
            let chain = load_certs(&cert)?;
            let key = PrivateKeyDer::from_pem_file(&key)
                .map_err(|e| Error::TlsConfig(format!("cannot read {}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| Error::TlsConfig(format!("client certificate: {e}")))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The server name to verify, from the configured hostname or the address.
pub fn server_name(tls: &TlsConfig, host: Option<&str>) -> Result<ServerName<'static>> {
    let name = tls
        .hostname
        .as_deref()
        .or(host)
        .unwrap_or("localhost")
        .to_string();
    ServerName::try_from(name.clone())
        .map_err(|_| Error::TlsConfig(format!("'{name}' is not a valid TLS server name")))
}

/// Accepts any server certificate (tls-verify-peer=false) but still checks that the
/// handshake is signed by the key in it.
#[derive(Debug)]
struct NoVerifier(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerifier {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_ca_is_a_clear_config_error() {
        let dir = std::env::temp_dir().join(format!("ferry-nbd-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = client_config(&TlsConfig {
            certificates: Some(dir.clone()),
            ..TlsConfig::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("ca-cert.pem"), "{err}");
        // Without verification no CA is needed.
        client_config(&TlsConfig {
            certificates: Some(dir.clone()),
            verify_peer: false,
            hostname: None,
        })
        .unwrap();
        let err = client_config(&TlsConfig {
            certificates: Some(dir.join("nope")),
            ..TlsConfig::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn server_names() {
        let tls = TlsConfig::default();
        assert!(matches!(
            server_name(&tls, Some("127.0.0.1")).unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name(&tls, None).unwrap(),
            ServerName::DnsName(_)
        ));
    }
}
