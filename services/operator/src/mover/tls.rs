//! The operator is the certificate authority of its movers' mutual TLS.
//!
//! A bearer token alone proves the operator to a mover, but not the mover to the operator,
//! and it crosses the pod network in the clear. So every mover serves gRPC over TLS with a
//! certificate of its own, and accepts only clients whose certificate this CA signed: the
//! operator's. The CA's key lives in one Secret in the operator's namespace (created by
//! the first operator that needs it, see `controller::mover_ca`); each mover's key and
//! certificate are made when its pod is, for that pod's name alone, and live in the
//! mover's own Secret, which goes with the mover.
//!
//! A mover's certificate names `<pod>.<namespace>.mover.ferry.dev` (the operator dials a
//! pod IP, and checks that name instead: an IP is not known before the pod runs), is valid
//! for [`MOVER_VALIDITY`], for serving and, toward another mover's relay (a fan-out), for
//! client authentication; the operator's client certificate for [`CLIENT_VALIDITY`] and
//! for client authentication only. Nothing here does I/O.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// How long a mover's certificate is valid: longer than any copy is expected to run (the
/// mover keeps its connections; a reconnection after this fails and the mover is
/// replaced, resuming from its checkpoint).
pub const MOVER_VALIDITY: Duration = Duration::days(30);
/// How long the operator's client certificate is valid; it is made again at half that.
pub const CLIENT_VALIDITY: Duration = Duration::days(2);
/// How long the CA is valid.
pub const CA_VALIDITY: Duration = Duration::days(3650);
/// Certificates start this much in the past: nodes' clocks differ.
const CLOCK_SKEW: Duration = Duration::minutes(5);

/// The common name of the CA; also what the issuer of every certificate says.
const CA_NAME: &str = "ferry operator mover CA";
/// The common name of the operator's client certificate.
pub const CLIENT_NAME: &str = "ferry-operator";

/// A certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (never logged: `Debug` hides it).
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// What can go wrong making a certificate.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA's key in its Secret cannot be read.
    #[error("the movers' CA key cannot be read: {0}")]
    BadCaKey(String),
    /// A key or certificate could not be made.
    #[error("cannot make a certificate: {0}")]
    Make(#[from] rcgen::Error),
}

/// The movers' certificate authority.
pub struct MoverCa {
    cert_pem: String,
    key: KeyPair,
}

impl std::fmt::Debug for MoverCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoverCa")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// The parameters every CA certificate is made with: an [`Issuer`] is rebuilt from them
/// and the key alone (its name and key identifier depend on nothing else).
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, CA_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// The DNS name a mover's certificate is for, and the name the operator checks.
pub fn mover_server_name(pod: &str, namespace: &str) -> String {
    format!("{pod}.{namespace}.mover.ferry.dev")
}

impl MoverCa {
    /// A new CA, valid from now for [`CA_VALIDITY`].
    pub fn generate() -> Result<Self, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = ca_params();
        let now = OffsetDateTime::now_utc();
        params.not_before = now - CLOCK_SKEW;
        params.not_after = now + CA_VALIDITY;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            key,
        })
    }

    /// The CA stored in its Secret.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| TlsError::BadCaKey(e.to_string()))?;
        Ok(Self {
            cert_pem: cert_pem.to_string(),
            key,
        })
    }

    /// The CA's certificate (what movers trust for clients and the operator for servers).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key, for its Secret only.
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// The certificate of the mover pod `pod` in `namespace`: it serves gRPC (and a
    /// fan-out's relay) with it, and a fan-out group authenticates with it to the relay it
    /// reads. A client certificate alone does not open another mover's job service: that
    /// also takes the other mover's own bearer token.
    pub fn issue_mover(&self, pod: &str, namespace: &str) -> Result<Issued, TlsError> {
        let mut params = CertificateParams::new(vec![mover_server_name(pod, namespace)])?;
        params
            .distinguished_name
            .push(DnType::CommonName, mover_server_name(pod, namespace));
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.issue(params, MOVER_VALIDITY)
    }

    /// A serving certificate for these DNS names (the operator's admission webhook,
    /// which the API server reaches through a Service), valid for `validity`.
    pub fn issue_server(&self, names: Vec<String>, validity: Duration) -> Result<Issued, TlsError> {
        let mut params = CertificateParams::new(names.clone())?;
        if let Some(first) = names.first() {
            params.distinguished_name.push(DnType::CommonName, first);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params, validity)
    }

    /// The operator's client certificate.
    pub fn issue_client(&self) -> Result<Issued, TlsError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, CLIENT_NAME);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params, CLIENT_VALIDITY)
    }

    fn issue(&self, mut params: CertificateParams, validity: Duration) -> Result<Issued, TlsError> {
        let now = OffsetDateTime::now_utc();
        params.not_before = now - CLOCK_SKEW;
        params.not_after = now + validity;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let issuer = Issuer::new(ca_params(), &self.key);
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_read_back_from_its_secret_signs_like_the_original() {
        let ca = MoverCa::generate().unwrap();
        let again = MoverCa::from_pem(ca.cert_pem(), &ca.key_pem()).unwrap();
        assert_eq!(again.cert_pem(), ca.cert_pem());
        assert_eq!(again.key_pem(), ca.key_pem());
        let issued = again.issue_mover("copy-ft-1", "vms").unwrap();
        assert!(issued.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(issued.key_pem.contains("PRIVATE KEY"));
        assert!(!format!("{issued:?}").contains("PRIVATE KEY"));
        assert!(!format!("{again:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn a_bad_ca_key_is_an_error_naming_the_ca() {
        let e = MoverCa::from_pem("x", "not a key").unwrap_err();
        assert!(e.to_string().contains("movers' CA key"), "{e}");
    }

    #[test]
    fn mover_names_are_per_pod_and_namespace() {
        assert_eq!(
            mover_server_name("copy-ft-1", "vms"),
            "copy-ft-1.vms.mover.ferry.dev"
        );
    }
}
