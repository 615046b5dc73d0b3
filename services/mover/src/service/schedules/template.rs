//! Job templates: the start request a schedule runs, checked when the schedule is created
//! or changed, stored encoded, and turned into one run's request (with the run's
//! idempotency key and the schedule's labels) that goes through the same validation as
//! StartTransfer and StartChecksum. A new job kind is one more variant here.

use ferry_core::{Error, Result};
use prost::Message;

use super::model::TemplateRecord;
use crate::service::convert::validation::MAX_LABELS;
use crate::service::convert::{Accepted, Validator};
use crate::service::proto;

/// The label every run's job carries with its schedule's name.
pub const SCHEDULE_LABEL: &str = "ferry.schedule";
/// The label every run's job carries with its schedule's id.
pub const SCHEDULE_ID_LABEL: &str = "ferry.schedule_id";

/// A decoded template.
#[derive(Debug, Clone, PartialEq)]
pub enum Template {
    Transfer(proto::StartTransferRequest),
    Checksum(proto::StartChecksumRequest),
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::invalid_input(msg)
}

impl Template {
    /// The template of a request; errors name what is missing or not allowed.
    pub fn from_proto(t: Option<&proto::JobTemplate>) -> Result<Self> {
        let request = t.and_then(|t| t.request.as_ref()).ok_or_else(|| {
            invalid("template is missing: give a transfer or a checksum request")
        })?;
        let template = match request {
            proto::job_template::Request::Transfer(r) => Self::Transfer(r.clone()),
            proto::job_template::Request::Checksum(r) => Self::Checksum(r.clone()),
        };
        template.check()?;
        Ok(template)
    }

    /// The template a schedule stored.
    pub fn from_record(r: &TemplateRecord) -> Result<Self> {
        let undecodable = |e: prost::DecodeError| {
            Error::internal(format!("the stored job template does not decode: {e}"))
        };
        Ok(match r {
            TemplateRecord::Transfer { request } => Self::Transfer(
                proto::StartTransferRequest::decode(request.as_slice()).map_err(undecodable)?,
            ),
            TemplateRecord::Checksum { request } => Self::Checksum(
                proto::StartChecksumRequest::decode(request.as_slice()).map_err(undecodable)?,
            ),
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
        }
    }

    pub fn to_proto(&self) -> proto::JobTemplate {
        proto::JobTemplate {
            request: Some(match self {
                Self::Transfer(r) => proto::job_template::Request::Transfer(r.clone()),
                Self::Checksum(r) => proto::job_template::Request::Checksum(r.clone()),
            }),
        }
    }

    fn key_and_labels(&self) -> (&str, &std::collections::BTreeMap<String, String>) {
        match self {
            Self::Transfer(r) => (&r.idempotency_key, &r.labels),
            Self::Checksum(r) => (&r.idempotency_key, &r.labels),
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

    /// The request of one run, validated as StartTransfer or StartChecksum validates it.
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
        }
        .map_err(|e| Error::new(e.kind(), format!("template: {}", e.message())))
    }
}
