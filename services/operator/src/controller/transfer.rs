//! The Transfer kind as the reconciler sees it: one job for all its targets in one mover
//! pod (one pass over the source), resuming from the checkpoint in the status, with
//! `expectedDigest` checked by having the mover verify with the expected digest's
//! algorithm. Each target's status comes from the job's per-target outcomes: a failed
//! target is Failed while the others succeed; after a transient failure the next mover
//! writes only the targets not done yet.

use std::collections::BTreeMap;

use ferry_core::spec::redact_userinfo;
use k8s_openapi::api::core::v1::Pod;

use crate::crd::status::condition::reason;
use crate::crd::{
    Endpoint, HashAlgorithm, Phase, TargetStatus, Transfer, TransferStatus, ValidationError,
};
use crate::mover::{transfer_pod, transfer_request, wire, MoverError, MoverPodInput, ResolvedPvc};

use super::kind::{Claim, MoverKind, Outcome};
use super::link::{JobFailure, JobReport, JobRequest, JobState};
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
                Some(template) => Some(Claim::Template(
                    template,
                    self.spec.claim_retention.unwrap_or_default(),
                )),
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

    fn reads_whole_image(&self, name: &str) -> Option<bool> {
        let source = self.spec.source.pvc.as_ref()?;
        Some(source.name == name)
    }

    fn placed_on(&self) -> Option<&str> {
        self.spec.mover.as_ref()?.node_name.as_deref()
    }

    fn jobs(
        &self,
        status: &TransferStatus,
        pvcs: &[ResolvedPvc],
    ) -> Result<Vec<JobRequest>, MoverError> {
        // A checkpoint does not name an HTTP object's version nor a registry image's
        // digest: a replacement mover copies such a source from the start rather than mix
        // two versions of the image.
        let source = &self.spec.source;
        let resume_from = status
            .checkpoint
            .clone()
            .filter(|c| !c.committed.is_empty())
            .filter(|_| !source.is_http() && !source.is_registry());
        let mut request =
            transfer_request(self, pvcs, &pending(self, status), resume_from.as_ref())?;
        if let Some(algorithm) = expected_algorithm(self) {
            let options = request.options.get_or_insert_with(Default::default);
            options.verify = true;
            options.verify_algorithm = wire::hash_algorithm(algorithm) as i32;
        }
        Ok(vec![JobRequest::Transfer(Box::new(request))])
    }

    fn observe(&self, status: &mut TransferStatus, reports: &[JobReport]) {
        let views = views(self, status, reports);
        // A target dropped while the copy went on lacks ranges the checkpoint holds: a
        // retry that writes it starts from the beginning.
        let resumable = views
            .iter()
            .filter(|v| v.state != JobState::Succeeded)
            .all(|v| v.resumable);
        if !resumable {
            status.checkpoint = None;
        } else if let Some(checkpoint) = shared_checkpoint(reports) {
            status.checkpoint = Some(checkpoint);
        }
        status.progress = Some(overall(reports, status.checkpoint.as_ref()));
        if let Some(version) = reports.iter().find_map(|r| r.source_version.clone()) {
            status.source_version = Some(version);
        }
        let count = self.spec.targets.len();
        let previous = std::mem::take(&mut status.targets);
        status.targets = (0..count)
            .map(|i| match views.iter().find(|v| v.index == i) {
                Some(v) => TargetStatus {
                    name: target_name(self, i),
                    phase: phase_of(v.state),
                    done_bytes: v.done_bytes,
                    digest: v.digest.clone(),
                    message: v
                        .error
                        .as_ref()
                        .map(|e| format!("{}: {}", e.kind, e.message)),
                },
                None => previous
                    .get(i)
                    .filter(|_| previous.len() == count)
                    .cloned()
                    .unwrap_or_else(|| TargetStatus {
                        name: target_name(self, i),
                        phase: Phase::Pending,
                        done_bytes: 0,
                        digest: None,
                        message: None,
                    }),
            })
            .collect();
    }

    fn checkpoint_changed(before: &TransferStatus, after: &TransferStatus) -> bool {
        before.checkpoint != after.checkpoint
    }

    fn outcome(&self, status: &TransferStatus, reports: &[JobReport]) -> Outcome {
        let failed: Vec<(usize, String, String)> = views(self, status, reports)
            .into_iter()
            .filter(|v| matches!(v.state, JobState::Failed | JobState::Cancelled))
            .map(|v| {
                let (kind, message) = match v.error {
                    Some(e) => (e.kind, e.message),
                    None if v.state == JobState::Cancelled => (
                        "cancelled".to_string(),
                        "the job was cancelled on the mover".to_string(),
                    ),
                    None => (
                        "internal".to_string(),
                        "the target failed without an error".to_string(),
                    ),
                };
                (v.index, kind, message)
            })
            .collect();
        if let Some(outcome) = self.failed(&failed, status) {
            return outcome;
        }
        if let Some((i, failed)) = first_failure(reports) {
            // A job that failed without saying which target: all of them.
            let (kind, message) = failure_text(failed);
            let message = format!("{}: {kind}: {message}", target_name(self, i));
            return Outcome::of_failure(is_transient(&kind), message);
        }
        let Some(expected) = self.spec.expected_digest.as_deref() else {
            return Outcome::Succeeded;
        };
        let source = reports.iter().find_map(|r| r.source_digest.as_deref());
        for (i, t) in status.targets.iter().enumerate() {
            let digest = t.digest.as_deref().or(source);
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
        let targets: BTreeMap<String, String> = status
            .targets
            .iter()
            .filter_map(|t| Some((t.name.clone(), t.digest.clone()?)))
            .collect();
        let source = reports
            .iter()
            .find_map(|r| r.source_digest.clone())
            .or_else(|| status.digests.as_ref().and_then(|d| d.source.clone()));
        if source.is_some() || !targets.is_empty() {
            status.digests = Some(crate::crd::Digests {
                source,
                targets: (!targets.is_empty()).then_some(targets),
            });
        }
    }
}

impl Transfer {
    /// How failed targets end the Transfer: a retry of those targets when every failure
    /// is transient, Failed otherwise, naming how many failed and which, and where the
    /// image is. None when no target failed.
    fn failed(
        &self,
        failed: &[(usize, String, String)],
        status: &TransferStatus,
    ) -> Option<Outcome> {
        if failed.is_empty() {
            return None;
        }
        let which: Vec<String> = failed
            .iter()
            .map(|(i, kind, message)| format!("{}: {kind}: {message}", target_name(self, *i)))
            .collect();
        let count = self.spec.targets.len();
        let message = if count == 1 {
            which.join("; ")
        } else {
            let holding: Vec<&str> = status
                .targets
                .iter()
                .filter(|t| t.phase == Phase::Succeeded)
                .map(|t| t.name.as_str())
                .collect();
            let held = if holding.is_empty() {
                "no target holds the image".to_string()
            } else {
                format!("the image is on {}", holding.join(", "))
            };
            format!(
                "{} of {count} targets failed: {}; {held}",
                failed.len(),
                which.join("; ")
            )
        };
        Some(Outcome::of_failure(
            failed.iter().all(|(_, kind, _)| is_transient(kind)),
            message,
        ))
    }
}

/// The targets a new job writes: those not done yet (all of them at first).
fn pending(transfer: &Transfer, status: &TransferStatus) -> Vec<usize> {
    let count = transfer.spec.targets.len();
    let done =
        |i: usize| status.targets.len() == count && status.targets[i].phase == Phase::Succeeded;
    let pending: Vec<usize> = (0..count).filter(|&i| !done(i)).collect();
    if pending.is_empty() {
        (0..count).collect()
    } else {
        pending
    }
}

/// One target as the latest reports show it.
struct View {
    index: usize,
    state: JobState,
    done_bytes: u64,
    digest: Option<String>,
    error: Option<JobFailure>,
    resumable: bool,
}

/// Each target the reports speak of. A report without per-target outcomes stands for
/// every target not done yet, with the job's own state.
fn views(transfer: &Transfer, status: &TransferStatus, reports: &[JobReport]) -> Vec<View> {
    let mut views = Vec::new();
    for r in reports {
        if r.targets.is_empty() {
            views.extend(pending(transfer, status).into_iter().map(|index| View {
                index,
                state: r.state,
                done_bytes: r.progress.done_bytes,
                digest: r.target_digest.clone(),
                error: r.error.clone(),
                resumable: true,
            }));
        } else {
            views.extend(r.targets.iter().map(|t| View {
                index: t.index,
                state: t.state,
                done_bytes: t.done_bytes,
                digest: t.digest.clone(),
                error: t.error.clone(),
                resumable: t.resumable,
            }));
        }
    }
    views
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::status::Checkpoint;

    fn transfer(source: &str) -> Transfer {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
            "metadata": {"name": "import", "namespace": "ns", "uid": "uid-1"},
            "spec": {"source": {"url": source}, "targets": [{"url": "nbd://host/export"}]},
        }))
        .unwrap()
    }

    fn resume_from(t: &Transfer) -> Option<ferry_api::proto::Checkpoint> {
        let status = TransferStatus {
            checkpoint: Some(Checkpoint::new(4 << 20, [(0, 1 << 20)])),
            ..TransferStatus::default()
        };
        match t.jobs(&status, &[]).unwrap().pop() {
            Some(JobRequest::Transfer(request)) => request.resume_from,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_replacement_mover_resumes_except_from_an_http_source_or_a_registry_image() {
        assert!(resume_from(&transfer("s3://bucket/disk.img")).is_some());
        assert_eq!(resume_from(&transfer("https://host/disk.img?sig=x")), None);
        assert_eq!(resume_from(&transfer("HTTP://host/disk.img")), None);
        assert_eq!(
            resume_from(&transfer("docker://quay.io/containerdisks/fedora:41")),
            None
        );
    }

    #[test]
    fn the_version_the_mover_read_is_recorded() {
        let t = transfer("docker://quay.io/containerdisks/fedora:41");
        let mut status = TransferStatus::default();
        let mut report = JobReport::new("j1", JobState::Running);
        t.observe(&mut status, std::slice::from_ref(&report));
        assert_eq!(status.source_version, None);
        report.source_version = Some("sha256:0f".into());
        t.observe(&mut status, std::slice::from_ref(&report));
        assert_eq!(status.source_version.as_deref(), Some("sha256:0f"));
    }
}
