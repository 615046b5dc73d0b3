//! Who asked for a clone from another namespace, as the API server told the admission
//! webhook, kept on the Transfer in one annotation and signed by the operator, so that
//! the reconciler can later ask a SubjectAccessReview for that user and trust the answer.
//!
//! The annotation holds the requester (user, uid, groups, extra) bound to the Transfer
//! (`namespace/name`) and to its source claim (`namespace/name`), with an HMAC-SHA256 over
//! all of it. The key is derived from the movers' CA key (the operator's one secret,
//! kept in its namespace): anyone who could write a valid stamp could also sign movers'
//! certificates. A user who writes the annotation by hand gets it replaced by the webhook
//! and, if the webhook is bypassed, refused by the reconciler. Nothing here does I/O.

use std::collections::BTreeMap;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The annotation that holds the stamp.
pub const REQUESTER: &str = "ferry.dev/requester";

/// Domain separation of the key derived from the CA key.
const KEY_CONTEXT: &[u8] = b"ferry.dev/requester stamp key v1\n";

/// The user the API server authenticated for a request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requester {
    /// The user name.
    pub user: String,
    /// The user's uid, when the authenticator gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The user's groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Extra attributes (scopes, a service account's pod name, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What is signed: the requester, the Transfer and its source claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// Who asked.
    #[serde(flatten)]
    pub requester: Requester,
    /// The Transfer, `namespace/name`.
    pub transfer: String,
    /// Its source claim, `namespace/name`.
    pub source: String,
}

/// The annotation's value: the claim and its signature (hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Signed {
    #[serde(flatten)]
    claim: Claim,
    signature: String,
}

/// Why a stamp is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StampError {
    /// There is none.
    #[error("the Transfer has no {REQUESTER} annotation: it was not created through the operator's admission webhook (is the MutatingWebhookConfiguration ferry-operator installed?)")]
    Missing,
    /// It does not parse.
    #[error("the {REQUESTER} annotation cannot be read: {0}")]
    Malformed(String),
    /// Its signature is not the operator's.
    #[error("the {REQUESTER} annotation is not signed by this operator: it was written by hand or by another installation")]
    Forged,
    /// It was made for another Transfer or another source.
    #[error("the {REQUESTER} annotation was made for Transfer {stamped_transfer} from {stamped_source}, not for {transfer} from {source_claim}")]
    Mismatch {
        /// The Transfer it names.
        stamped_transfer: String,
        /// The source it names.
        stamped_source: String,
        /// This Transfer.
        transfer: String,
        /// This source.
        source_claim: String,
    },
}

/// The key that signs stamps.
#[derive(Clone)]
pub struct StampKey([u8; 32]);

impl std::fmt::Debug for StampKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StampKey(<redacted>)")
    }
}

impl StampKey {
    /// The key derived from the movers' CA key (PEM).
    pub fn from_ca_key(ca_key_pem: &str) -> Self {
        let mut h = Sha256::new();
        h.update(KEY_CONTEXT);
        h.update(ca_key_pem.as_bytes());
        Self(h.finalize().into())
    }

    fn mac(&self, claim: &Claim) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .expect("HMAC takes a key of any length");
        // serde_json writes the fields in declaration order and a BTreeMap sorted: the
        // same claim is always the same bytes.
        mac.update(&serde_json::to_vec(claim).expect("a claim serializes"));
        mac
    }

    /// The annotation's value for `claim`.
    pub fn sign(&self, claim: Claim) -> String {
        let signature = hex::encode(self.mac(&claim).finalize().into_bytes());
        serde_json::to_string(&Signed { claim, signature }).expect("a stamp serializes")
    }

    /// The requester of a stamp, when it is this operator's and made for `transfer` and
    /// `source` (both `namespace/name`).
    pub fn verify(
        &self,
        value: Option<&str>,
        transfer: &str,
        source: &str,
    ) -> Result<Requester, StampError> {
        let value = value.ok_or(StampError::Missing)?;
        let signed: Signed =
            serde_json::from_str(value).map_err(|e| StampError::Malformed(e.to_string()))?;
        let signature = hex::decode(&signed.signature).map_err(|_| StampError::Forged)?;
        self.mac(&signed.claim)
            .verify_slice(&signature)
            .map_err(|_| StampError::Forged)?;
        if signed.claim.transfer != transfer || signed.claim.source != source {
            return Err(StampError::Mismatch {
                stamped_transfer: signed.claim.transfer,
                stamped_source: signed.claim.source,
                transfer: transfer.to_string(),
                source_claim: source.to_string(),
            });
        }
        Ok(signed.claim.requester)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> Claim {
        Claim {
            requester: Requester {
                user: "alice".into(),
                uid: Some("u-1".into()),
                groups: vec!["devs".into(), "system:authenticated".into()],
                extra: BTreeMap::from([("scopes".into(), vec!["a".into()])]),
            },
            transfer: "vms/disk".into(),
            source: "images/golden".into(),
        }
    }

    #[test]
    fn a_stamp_is_exact_json_and_verifies_only_for_its_transfer_and_source() {
        let key =
            StampKey::from_ca_key("-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n");
        let value = key.sign(claim());
        let json: serde_json::Value = serde_json::from_str(&value).unwrap();
        let signature = json["signature"].as_str().unwrap().to_string();
        assert_eq!(signature.len(), 64);
        assert_eq!(
            json,
            serde_json::json!({
                "user": "alice", "uid": "u-1", "groups": ["devs", "system:authenticated"],
                "extra": {"scopes": ["a"]}, "transfer": "vms/disk", "source": "images/golden",
                "signature": signature,
            })
        );
        assert_eq!(
            key.verify(Some(&value), "vms/disk", "images/golden"),
            Ok(claim().requester)
        );
        assert!(matches!(
            key.verify(Some(&value), "vms/other", "images/golden"),
            Err(StampError::Mismatch { .. })
        ));
        assert!(matches!(
            key.verify(Some(&value), "vms/disk", "images/other"),
            Err(StampError::Mismatch { .. })
        ));
        assert_eq!(
            key.verify(None, "vms/disk", "images/golden"),
            Err(StampError::Missing)
        );
        // Another key (another installation), or a changed field, is a forgery.
        let other = StampKey::from_ca_key("another key");
        assert_eq!(
            other.verify(Some(&value), "vms/disk", "images/golden"),
            Err(StampError::Forged)
        );
        let edited = value.replace("\"alice\"", "\"admin\"");
        assert_eq!(
            key.verify(Some(&edited), "vms/disk", "images/golden"),
            Err(StampError::Forged)
        );
        assert!(matches!(
            key.verify(Some("{not json"), "vms/disk", "images/golden"),
            Err(StampError::Malformed(_))
        ));
    }
}
