//! Job templates: the start request a schedule runs, checked when the schedule is created
//! or changed, stored encoded, and turned into one run's request (with the run's
//! idempotency key and the schedule's labels) that goes through the same validation as
//! the start calls. A new job kind is one more variant here.

use ferry_core::{Error, Result};
use prost::Message;

use crate::convert::validation::MAX_LABELS;
use crate::convert::{Accepted, Validator};
use crate::model::schedule::TemplateRecord;
use ferry_api::proto;

/// The label every run's job carries with its schedule's name.
pub const SCHEDULE_LABEL: &str = "ferry.schedule";
/// The label every run's job carries with its schedule's id.
pub const SCHEDULE_ID_LABEL: &str = "ferry.schedule_id";

/// A decoded template.
// One per schedule, held whole: boxing the larger request would only add an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Template {
    Transfer(proto::StartTransferRequest),
    Checksum(proto::StartChecksumRequest),
    Backup(proto::StartBackupRequest),
    RepositoryVerify(proto::StartRepositoryVerifyRequest),
    Prune(proto::StartPruneRequest),
    Gc(proto::StartGcRequest),
    Sync(proto::StartSyncRequest),
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::invalid_input(msg)
}

impl Template {
    /// The template of a request; errors name what is missing or not allowed.
    pub fn from_proto(t: Option<&proto::JobTemplate>) -> Result<Self> {
        use proto::job_template::Request;
        let request = t.and_then(|t| t.request.as_ref()).ok_or_else(|| {
            invalid(
                "template is missing: give a transfer, checksum, backup, repository_verify, \
                 prune, gc or sync request",
            )
        })?;
        let template = match request {
            Request::Transfer(r) => Self::Transfer(r.clone()),
            Request::Checksum(r) => Self::Checksum(r.clone()),
            Request::Backup(r) => Self::Backup(r.clone()),
            Request::RepositoryVerify(r) => Self::RepositoryVerify(r.clone()),
            Request::Prune(r) => Self::Prune(r.clone()),
            Request::Gc(r) => Self::Gc(r.clone()),
            Request::Sync(r) => Self::Sync(r.clone()),
        };
        template.check()?;
        Ok(template)
    }

    /// The template a schedule stored.
    pub fn from_record(r: &TemplateRecord) -> Result<Self> {
        fn decode<M: Message + Default>(request: &[u8]) -> Result<M> {
            M::decode(request).map_err(|e| {
                Error::internal(format!("the stored job template does not decode: {e}"))
            })
        }
        Ok(match r {
            TemplateRecord::Transfer { request } => Self::Transfer(decode(request)?),
            TemplateRecord::Checksum { request } => Self::Checksum(decode(request)?),
            TemplateRecord::Backup { request } => Self::Backup(decode(request)?),
            TemplateRecord::RepositoryVerify { request } => {
                Self::RepositoryVerify(decode(request)?)
            }
            TemplateRecord::Prune { request } => Self::Prune(decode(request)?),
            TemplateRecord::Gc { request } => Self::Gc(decode(request)?),
            TemplateRecord::Sync { request } => Self::Sync(decode(request)?),
        })
    }

    pub fn to_record(&self) -> TemplateRecord {
        match self {
            Self::Transfer(r) => TemplateRecord::Transfer {
                request: r.encode_to_vec(),
            },
            Self::Checksum(r) => TemplateRecord::Checksum {
                request: r.encode_to_vec(),
            },
            Self::Backup(r) => TemplateRecord::Backup {
                request: r.encode_to_vec(),
            },
            Self::RepositoryVerify(r) => TemplateRecord::RepositoryVerify {
                request: r.encode_to_vec(),
            },
            Self::Prune(r) => TemplateRecord::Prune {
                request: r.encode_to_vec(),
            },
            Self::Gc(r) => TemplateRecord::Gc {
                request: r.encode_to_vec(),
            },
            Self::Sync(r) => TemplateRecord::Sync {
                request: r.encode_to_vec(),
            },
        }
    }

    pub fn to_proto(&self) -> proto::JobTemplate {
        use proto::job_template::Request;
        proto::JobTemplate {
            request: Some(match self {
                Self::Transfer(r) => Request::Transfer(r.clone()),
                Self::Checksum(r) => Request::Checksum(r.clone()),
                Self::Backup(r) => Request::Backup(r.clone()),
                Self::RepositoryVerify(r) => Request::RepositoryVerify(r.clone()),
                Self::Prune(r) => Request::Prune(r.clone()),
                Self::Gc(r) => Request::Gc(r.clone()),
                Self::Sync(r) => Request::Sync(r.clone()),
            }),
        }
    }

    fn key_and_labels(&self) -> (&str, &std::collections::BTreeMap<String, String>) {
        match self {
            Self::Transfer(r) => (&r.idempotency_key, &r.labels),
            Self::Checksum(r) => (&r.idempotency_key, &r.labels),
            Self::Backup(r) => (&r.idempotency_key, &r.labels),
            Self::RepositoryVerify(r) => (&r.idempotency_key, &r.labels),
            Self::Prune(r) => (&r.idempotency_key, &r.labels),
            Self::Gc(r) => (&r.idempotency_key, &r.labels),
            Self::Sync(r) => (&r.idempotency_key, &r.labels),
        }
    }

    /// What a template may not hold, beyond what validating a start request checks.
    fn check(&self) -> Result<()> {
        let (key, labels) = self.key_and_labels();
        if !key.is_empty() {
            return Err(invalid(
                "template.idempotency_key must be empty: the server gives each run a key \
                 derived from the schedule and the fire time",
            ));
        }
        if let Self::Transfer(r) = self {
            if r.resume_from.is_some() {
                return Err(invalid(
                    "template.resume_from must be unset: each run copies the whole source",
                ));
            }
        }
        if labels.len() > MAX_LABELS - 2 {
            return Err(invalid(format!(
                "template has {} labels: at most {} (each run adds {SCHEDULE_LABEL} and \
                 {SCHEDULE_ID_LABEL})",
                labels.len(),
                MAX_LABELS - 2
            )));
        }
        if let Some(k) = labels
            .keys()
            .find(|k| *k == SCHEDULE_LABEL || *k == SCHEDULE_ID_LABEL)
        {
            return Err(invalid(format!(
                "template label '{k}' is set by the server on each run: choose another key"
            )));
        }
        Ok(())
    }

    /// The request of one run, validated as its start call validates it.
    pub fn accept(
        &self,
        validator: &Validator,
        key: &str,
        schedule_name: &str,
        schedule_id: &str,
    ) -> Result<Accepted> {
        let label = |labels: &mut std::collections::BTreeMap<String, String>| {
            labels.insert(SCHEDULE_LABEL.into(), schedule_name.into());
            labels.insert(SCHEDULE_ID_LABEL.into(), schedule_id.into());
        };
        match self {
            Self::Transfer(r) => {
                let mut r = r.clone();
                r.idempotency_key = key.to_string();
                label(&mut r.labels);
                validator.transfer(&r)
            }
            Self::Checksum(r) => {
                let mut r = r.clone();
                r.idempotency_key = key.to_string();
                label(&mut r.labels);
                validator.checksum(&r)
            }
            Self::Backup(r) => {
                let mut r = r.clone();
                r.idempotency_key = key.to_string();
                label(&mut r.labels);
                validator.backup(&r)
            }
            Self::RepositoryVerify(r) => {
                let mut r = r.clone();
                r.idempotency_key = key.to_string();
                label(&mut r.labels);
                validator.repository_verify(&r)
            }
            Self::Prune(r) => {
                let mut r = r.clone();
                r.idempotency_key = key.to_string();
                label(&mut r.labels);
                validator.prune(&r)
            }
            Self::Gc(r) => {
                let mut r = r.clone();
                r.idempotency_key = key.to_string();
                label(&mut r.labels);
                validator.gc(&r)
            }
            Self::Sync(r) => {
                let mut r = r.clone();
                r.idempotency_key = key.to_string();
                label(&mut r.labels);
                validator.sync(&r)
            }
        }
        .map_err(|e| Error::new(e.kind(), format!("template: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::job::JobKind;
    use crate::secrets::SecretResolver;
    use crate::security::AllowRoots;

    fn endpoint(path: &std::path::Path) -> Option<proto::Endpoint> {
        Some(proto::Endpoint {
            url: path.display().to_string(),
            ..Default::default()
        })
    }

    fn transfer(dir: &std::path::Path) -> proto::StartTransferRequest {
        std::fs::write(dir.join("a.img"), [1u8; 4096]).unwrap();
        proto::StartTransferRequest {
            source: endpoint(&dir.join("a.img")),
            target: endpoint(&dir.join("b.img")),
            ..Default::default()
        }
    }

    fn template(r: proto::StartTransferRequest) -> proto::JobTemplate {
        proto::JobTemplate {
            request: Some(proto::job_template::Request::Transfer(r)),
        }
    }

    #[test]
    fn what_a_template_may_not_hold() {
        let dir = tempfile::tempdir().unwrap();
        let e = Template::from_proto(None).unwrap_err();
        assert!(e.to_string().contains("template is missing"), "{e}");
        let mut r = transfer(dir.path());
        r.idempotency_key = "k".into();
        let e = Template::from_proto(Some(&template(r))).unwrap_err();
        assert!(e.to_string().contains("idempotency_key"), "{e}");
        let mut r = transfer(dir.path());
        r.resume_from = Some(proto::Checkpoint::default());
        let e = Template::from_proto(Some(&template(r))).unwrap_err();
        assert!(e.to_string().contains("resume_from"), "{e}");
        let mut r = transfer(dir.path());
        r.labels.insert(SCHEDULE_LABEL.into(), "x".into());
        let e = Template::from_proto(Some(&template(r))).unwrap_err();
        assert!(e.to_string().contains("set by the server"), "{e}");
    }

    #[test]
    fn a_run_gets_its_key_and_the_schedule_labels_and_is_validated() {
        let dir = tempfile::tempdir().unwrap();
        let validator = Validator {
            roots: AllowRoots::new(&[dir.path().to_path_buf()]).unwrap(),
            secrets: SecretResolver::new(None),
        };
        let mut r = transfer(dir.path());
        r.labels.insert("team".into(), "x".into());
        let t = Template::from_proto(Some(&template(r))).unwrap();
        assert_eq!(Template::from_record(&t.to_record()).unwrap(), t);
        assert_eq!(t.to_record().kind(), JobKind::Transfer);
        let accepted = t
            .accept(&validator, "schedule/s1/1000", "nightly", "s1")
            .unwrap();
        assert_eq!(accepted.idempotency_key, "schedule/s1/1000");
        assert_eq!(accepted.labels[SCHEDULE_LABEL], "nightly");
        assert_eq!(accepted.labels[SCHEDULE_ID_LABEL], "s1");
        assert_eq!(accepted.labels["team"], "x");
        // The same fire gives the same request: a resubmission finds the job.
        let again = t
            .accept(&validator, "schedule/s1/1000", "nightly", "s1")
            .unwrap();
        assert_eq!(again.fingerprint, accepted.fingerprint);

        let mut outside = transfer(dir.path());
        outside.source = endpoint(std::path::Path::new("/etc/passwd"));
        let t = Template::from_proto(Some(&template(outside))).unwrap();
        let e = t.accept(&validator, "k", "n", "i").unwrap_err();
        assert_eq!(e.kind(), ferry_core::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().starts_with("template: "), "{e}");
    }
}
