//! The Transfer kind as the reconciler sees it: one job per target in one mover pod,
//! resuming from the checkpoint in the status, with `expectedDigest` checked by having
//! the mover verify with the expected digest's algorithm.

use std::collections::BTreeMap;

use ferry_core::spec::redact_userinfo;
use k8s_openapi::api::core::v1::Pod;

use crate::crd::status::condition::reason;
use crate::crd::{
    Endpoint, HashAlgorithm, Phase, TargetStatus, Transfer, TransferStatus, ValidationError,
};
use crate::mover::{transfer_pod, transfer_requests, MoverError, MoverPodInput, ResolvedPvc};

use super::kind::{Claim, MoverKind, Outcome};
use super::link::{JobReport, JobRequest, JobState};
use super::progress::{failure_text, first_failure, is_transient, overall, shared_checkpoint};

/// The target's name in the status: `pvc/<name>` or its URL without user information.
fn target_name(transfer: &Transfer, index: usize) -> String {
    transfer
        .spec
        .targets
        .get(index)
        .and_then(|t| t.key())
        .map_or_else(
            || format!("target {index}"),
            |k| redact_userinfo(&k.to_string()),
        )
}

fn phase_of(state: JobState) -> Phase {
    match state {
        JobState::Queued => Phase::Pending,
        JobState::Running => Phase::Running,
        JobState::Succeeded => Phase::Succeeded,
        JobState::Failed => Phase::Failed,
        JobState::Cancelled => Phase::Cancelled,
    }
}

/// The algorithm of `expectedDigest`, when given.
fn expected_algorithm(transfer: &Transfer) -> Option<HashAlgorithm> {
    let digest = transfer.spec.expected_digest.as_deref()?;
    match digest.split_once(':')?.0 {
        "sha256" => Some(HashAlgorithm::Sha256),
        _ => Some(HashAlgorithm::Blkhash),
    }
}

impl MoverKind for Transfer {
    type Status = TransferStatus;
    const KIND: &'static str = "Transfer";
    const SHORT: &'static str = "ft";

    fn status(&self) -> Option<&TransferStatus> {
        self.status.as_ref()
    }

    fn validate(&self) -> Result<(), ValidationError> {
        self.spec.validate()
    }

    fn claims(&self) -> Vec<Claim<'_>> {
        let source = self
            .spec
            .source
            .pvc
            .iter()
            .map(|p| Claim::Existing(&p.name));
        let targets = self
            .spec
            .targets
            .iter()
            .filter_map(|t| match &t.pvc_template {
                Some(template) => Some(Claim::Template(template)),
                None => t.endpoint.pvc.as_ref().map(|p| Claim::Existing(&p.name)),
            });
        source.chain(targets).collect()
    }

    fn endpoints(&self) -> Vec<&Endpoint> {
        let targets = self.spec.targets.iter().map(|t| &t.endpoint);
        std::iter::once(&self.spec.source).chain(targets).collect()
    }

    fn mover_pod(&self, input: &MoverPodInput<'_>) -> Result<Pod, MoverError> {
        transfer_pod(self, input)
    }

    fn jobs(
        &self,
        status: &TransferStatus,
        pvcs: &[ResolvedPvc],
    ) -> Result<Vec<JobRequest>, MoverError> {
        let resume_from = status
            .checkpoint
            .clone()
            .filter(|c| !c.committed.is_empty());
        let verify_with = expected_algorithm(self);
        Ok(transfer_requests(self, pvcs)?
            .into_iter()
            .map(|mut request| {
                if let Some(algorithm) = verify_with {
                    request.options.verify = true;
                    request.options.verify_algorithm = algorithm;
                }
                JobRequest::Transfer {
                    request: Box::new(request),
                    resume_from: resume_from.clone(),
                }
            })
            .collect())
    }

    fn observe(&self, status: &mut TransferStatus, reports: &[JobReport]) {
        if let Some(checkpoint) = shared_checkpoint(reports) {
            status.checkpoint = Some(checkpoint);
        }
        status.progress = Some(overall(reports, status.checkpoint.as_ref()));
        status.targets = reports
            .iter()
            .enumerate()
            .map(|(i, r)| TargetStatus {
                name: target_name(self, i),
                phase: phase_of(r.state),
                done_bytes: r.progress.done_bytes,
                digest: r.target_digest.clone(),
                message: r
                    .error
                    .as_ref()
                    .map(|e| format!("{}: {}", e.kind, e.message)),
            })
            .collect();
    }

    fn checkpoint_changed(before: &TransferStatus, after: &TransferStatus) -> bool {
        before.checkpoint != after.checkpoint
    }

    fn outcome(&self, reports: &[JobReport]) -> Outcome {
        if let Some((i, failed)) = first_failure(reports) {
            let (kind, message) = failure_text(failed);
            let message = format!("{}: {kind}: {message}", target_name(self, i));
            return if is_transient(&kind) {
                Outcome::Retry { message }
            } else {
                Outcome::Failed {
                    reason: reason::FAILED,
                    message,
                }
            };
        }
        let Some(expected) = self.spec.expected_digest.as_deref() else {
            return Outcome::Succeeded;
        };
        for (i, r) in reports.iter().enumerate() {
            let digest = r.target_digest.as_deref().or(r.source_digest.as_deref());
            if digest != Some(expected) {
                return Outcome::Failed {
                    reason: reason::DIGEST_MISMATCH,
                    message: format!(
                        "{} has digest {}, expected {expected}: the source is not the image you expected, or the expected digest is wrong",
                        target_name(self, i),
                        digest.unwrap_or("(none)")
                    ),
                };
            }
        }
        Outcome::Succeeded
    }

    fn succeed(&self, status: &mut TransferStatus, reports: &[JobReport]) {
        let targets: BTreeMap<String, String> = reports
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((target_name(self, i), r.target_digest.clone()?)))
            .collect();
        let source = reports.iter().find_map(|r| r.source_digest.clone());
        if source.is_some() || !targets.is_empty() {
            status.digests = Some(crate::crd::Digests {
                source,
                targets: (!targets.is_empty()).then_some(targets),
            });
        }
    }
}
