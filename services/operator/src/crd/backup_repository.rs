//! The `BackupRepository` kind: where the backups of a namespace's volumes are kept (a
//! prefix of an S3 bucket, or a directory inside a claim), with its credentials and
//! encryption key given only as Secret key references. `Backup` and `BackupSchedule` name
//! it; its status says whether the operator can use it as written.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::endpoint::{Endpoint, PvcRef, S3Options, SecretKeyRef};
use super::validate::{
    check_pvc_name, check_relative_path, check_secret_ref, invalid, ValidationError,
};

/// A backup repository.
// kube's printcolumn(...) entries repeat their keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "BackupRepository",
    namespaced,
    status = "BackupRepositoryStatus",
    shortname = "fbr",
    category = "ferry",
    doc = "A deduplicating backup repository (an S3 prefix or a directory in a PVC) that Backups and BackupSchedules write to",
    printcolumn(name = "URL", type_ = "string", json_path = ".spec.url"),
    printcolumn(name = "PVC", type_ = "string", json_path = ".spec.pvc.name"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Encrypted", type_ = "boolean", json_path = ".status.encrypted"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BackupRepositorySpec {
    /// `s3://bucket/prefix`: the repository's objects are kept below the prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub url: Option<String>,
    /// Options of the `s3://` URL (endpoint, region, credentials by Secret reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Options>,
    /// A claim in this namespace whose Filesystem volume holds the repository, in the
    /// directory `path` (default: the volume's root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcRef>,
    /// Encrypt the repository (AES-256-GCM): the key's passphrase is the first line of
    /// this Secret key. Keep a copy of it elsewhere: without it no backup can be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
    /// Create the repository on the first backup when it does not exist yet (default
    /// false: a missing repository fails the backup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialize: Option<bool>,
}

/// The encryption of a repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Encryption {
    /// The Secret key holding the passphrase.
    pub key_secret_ref: SecretKeyRef,
}

impl BackupRepositorySpec {
    /// Checks what the schema cannot (the URL, the S3 options, the path, the key).
    pub fn validate(&self) -> Result<(), ValidationError> {
        match (&self.url, &self.pvc) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(invalid("spec", "give exactly one of url or pvc"))
            }
            (Some(url), None) => {
                if !url.starts_with("s3://") {
                    return Err(invalid(
                        "spec.url",
                        "a repository URL is s3://bucket/prefix; for a directory in a volume give pvc",
                    ));
                }
                self.endpoint().validate("spec")?;
            }
            (None, Some(pvc)) => {
                if self.s3.is_some() {
                    return Err(invalid(
                        "spec.s3",
                        "s3 options go with an s3:// url, not with a pvc",
                    ));
                }
                check_pvc_name("spec.pvc.name", &pvc.name)?;
                if let Some(path) = &pvc.path {
                    check_relative_path("spec.pvc.path", path)?;
                }
            }
        }
        if let Some(e) = &self.encryption {
            check_secret_ref("spec.encryption.keySecretRef", &e.key_secret_ref)?;
        }
        Ok(())
    }

    /// The repository as an endpoint (its URL with the S3 options, or its claim), for the
    /// Secrets it references and the volume the mover attaches.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            url: self.url.clone(),
            s3: self.s3.clone(),
            pvc: self.pvc.clone(),
            ..Endpoint::default()
        }
    }

    /// Every Secret key the repository refers to: the S3 credentials, then the key.
    pub fn secret_refs(&self) -> Vec<&SecretKeyRef> {
        self.s3
            .iter()
            .flat_map(S3Options::secret_refs)
            .chain(self.key())
            .collect()
    }

    /// The key's Secret reference, when encrypted.
    pub fn key(&self) -> Option<&SecretKeyRef> {
        self.encryption.as_ref().map(|e| &e.key_secret_ref)
    }
}

/// The named repository, looked up by the operator: an error naming `field` when it
/// does not exist or is not valid.
pub(crate) fn named_repository<'a>(
    field: &str,
    name: &str,
    resolved: Option<&'a BackupRepositorySpec>,
) -> Result<&'a BackupRepositorySpec, ValidationError> {
    let repo = resolved.ok_or_else(|| {
        invalid(
            field,
            &format!(
                "BackupRepository '{name}' does not exist in this namespace: create it, or fix the name"
            ),
        )
    })?;
    repo.validate().map_err(|e| {
        invalid(
            field,
            &format!("BackupRepository '{name}' is not valid: {e}"),
        )
    })?;
    Ok(repo)
}

/// What the operator observed of a repository.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupRepositoryStatus {
    /// Ready: True when the spec is valid and every Secret key it references exists
    /// (reason Valid), False with the reason (InvalidSpec, SecretMissing) otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Whether the repository is encrypted.
    #[serde(default)]
    pub encrypted: bool,
    /// What is wrong, when not Ready (never a secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3() -> BackupRepositorySpec {
        BackupRepositorySpec {
            url: Some("s3://backups/site-a".into()),
            s3: Some(S3Options {
                access_key_id: Some(SecretKeyRef {
                    name: "s3".into(),
                    key: "id".into(),
                }),
                secret_access_key: Some(SecretKeyRef {
                    name: "s3".into(),
                    key: "secret".into(),
                }),
                ..S3Options::default()
            }),
            pvc: None,
            encryption: Some(Encryption {
                key_secret_ref: SecretKeyRef {
                    name: "backup-key".into(),
                    key: "passphrase".into(),
                },
            }),
            initialize: Some(true),
        }
    }

    #[test]
    fn validates_url_pvc_and_key() {
        s3().validate().unwrap();
        let mut r = s3();
        r.url = Some("nfs://h/export".into());
        assert_eq!(r.validate().unwrap_err().field, "spec.url");
        let mut r = s3();
        r.url = Some("s3://user:pw@backups/a".into());
        let e = r.validate().unwrap_err();
        assert!(!e.to_string().contains("pw@"), "{e}");
        let mut r = s3();
        r.pvc = Some(PvcRef {
            name: "repo".into(),
            path: None,
            namespace: None,
        });
        assert_eq!(r.validate().unwrap_err().field, "spec");
        r.url = None;
        assert_eq!(r.validate().unwrap_err().field, "spec.s3");
        r.s3 = None;
        r.validate().unwrap();
        r.pvc = Some(PvcRef {
            name: "repo".into(),
            path: Some("../x".into()),
            namespace: None,
        });
        assert_eq!(r.validate().unwrap_err().field, "spec.pvc.path");
        let mut r = s3();
        r.encryption = Some(Encryption {
            key_secret_ref: SecretKeyRef {
                name: "k".into(),
                key: "a/b".into(),
            },
        });
        assert_eq!(
            r.validate().unwrap_err().field,
            "spec.encryption.keySecretRef.key"
        );
    }
}
