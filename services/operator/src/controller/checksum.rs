//! The Checksum kind as the reconciler sees it: one checksum job of its source; the
//! job's source digest is the result.

use k8s_openapi::api::core::v1::Pod;

use crate::crd::{Checksum, ChecksumStatus, Endpoint, ValidationError};
use crate::mover::{checksum_pod, checksum_request, MoverError, MoverPodInput, ResolvedPvc};

use super::kind::{Claim, MoverKind, Outcome};
use super::link::{JobReport, JobRequest};
use super::progress::{failure_text, first_failure, is_transient, overall};

impl MoverKind for Checksum {
    type Status = ChecksumStatus;
    const KIND: &'static str = "Checksum";
    const SHORT: &'static str = "fcs";

    fn status(&self) -> Option<&ChecksumStatus> {
        self.status.as_ref()
    }

    fn validate(&self) -> Result<(), ValidationError> {
        self.spec.validate()
    }

    fn claims(&self) -> Vec<Claim<'_>> {
        self.spec
            .source
            .pvc
            .iter()
            .map(|p| Claim::Existing(&p.name))
            .collect()
    }

    fn endpoints(&self) -> Vec<&Endpoint> {
        vec![&self.spec.source]
    }

    fn mover_pod(&self, input: &MoverPodInput<'_>) -> Result<Pod, MoverError> {
        checksum_pod(self, input)
    }

    fn jobs(
        &self,
        _status: &ChecksumStatus,
        pvcs: &[ResolvedPvc],
    ) -> Result<Vec<JobRequest>, MoverError> {
        Ok(vec![JobRequest::Checksum(Box::new(checksum_request(
            self, pvcs,
        )?))])
    }

    fn observe(&self, status: &mut ChecksumStatus, reports: &[JobReport]) {
        status.progress = Some(overall(reports, None));
    }

    fn checkpoint_changed(_before: &ChecksumStatus, _after: &ChecksumStatus) -> bool {
        false
    }

    fn outcome(&self, _status: &ChecksumStatus, reports: &[JobReport]) -> Outcome {
        match first_failure(reports) {
            Some((_, failed)) => {
                let (kind, message) = failure_text(failed);
                let message = format!("{kind}: {message}");
                Outcome::of_failure(is_transient(&kind), message)
            }
            None => Outcome::Succeeded,
        }
    }

    fn succeed(&self, status: &mut ChecksumStatus, reports: &[JobReport]) {
        status.digest = reports.iter().find_map(|r| r.source_digest.clone());
    }
}
