//! Job reports turned into status pieces, as pure functions: the checkpoint every target
//! shares, progress over all targets, and whether a failure is worth a new mover.

use ferry_core::ErrorKind;

use crate::crd::{Checkpoint, Progress};

use super::link::{JobReport, JobState};

/// The ranges committed on every target: a replacement mover may skip them for all of
/// its jobs. `None` until every job has a checkpoint of the same size.
pub fn shared_checkpoint(reports: &[JobReport]) -> Option<Checkpoint> {
    let mut checkpoints = reports.iter().map(|r| r.checkpoint.as_ref());
    let first = checkpoints.next()??.clone();
    let mut ranges: Vec<(u64, u64)> = first.committed.iter().map(|[s, e]| (*s, *e)).collect();
    for c in checkpoints {
        let c = c?;
        if c.size != first.size {
            return None;
        }
        let other: Vec<(u64, u64)> = c.committed.iter().map(|[s, e]| (*s, *e)).collect();
        ranges = intersect(&ranges, &other);
    }
    Some(Checkpoint::new(first.size, ranges))
}

/// The intersection of two sorted, non-overlapping range lists.
fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let start = a[i].0.max(b[j].0);
        let end = a[i].1.min(b[j].1);
        if start < end {
            out.push((start, end));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// Progress of one pass over the source into every target: the least any target got.
pub fn overall(reports: &[JobReport], checkpoint: Option<&Checkpoint>) -> Progress {
    let least = |f: fn(&Progress) -> u64| reports.iter().map(|r| f(&r.progress)).min();
    Progress {
        total_bytes: reports
            .iter()
            .map(|r| r.progress.total_bytes)
            .max()
            .unwrap_or(0),
        done_bytes: least(|p| p.done_bytes).unwrap_or(0),
        resumed_bytes: least(|p| p.resumed_bytes).unwrap_or(0),
        committed_bytes: checkpoint.map_or_else(
            || least(|p| p.committed_bytes).unwrap_or(0),
            Checkpoint::committed_bytes,
        ),
    }
}

/// Whether a job's error kind may pass on another try (ferry's own classification).
pub fn is_transient(kind: &str) -> bool {
    [ErrorKind::Timeout, ErrorKind::Disconnected]
        .into_iter()
        .any(|k| k.is_transient() && k.as_str() == kind)
}

/// The first job that ended without success, with its index.
pub fn first_failure(reports: &[JobReport]) -> Option<(usize, &JobReport)> {
    reports
        .iter()
        .enumerate()
        .find(|(_, r)| matches!(r.state, JobState::Failed | JobState::Cancelled))
}

/// `<kind>: <message>` of a failed job.
pub fn failure_text(report: &JobReport) -> (String, String) {
    match &report.error {
        Some(e) => (e.kind.clone(), e.message.clone()),
        None if report.state == JobState::Cancelled => (
            "cancelled".into(),
            "the job was cancelled on the mover".into(),
        ),
        None => ("internal".into(), "the job failed without an error".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(checkpoint: Option<Checkpoint>, done: u64) -> JobReport {
        JobReport {
            progress: Progress {
                total_bytes: 100,
                done_bytes: done,
                resumed_bytes: 0,
                committed_bytes: 0,
            },
            checkpoint,
            ..JobReport::new("j", JobState::Running)
        }
    }

    #[test]
    fn the_shared_checkpoint_is_what_every_target_committed() {
        let a = report(Some(Checkpoint::new(100, [(0, 40), (60, 80)])), 80);
        let b = report(Some(Checkpoint::new(100, [(10, 70)])), 70);
        let shared = shared_checkpoint(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(shared.committed, vec![[10, 40], [60, 70]]);
        let p = overall(&[a.clone(), b], Some(&shared));
        assert_eq!(
            (p.total_bytes, p.done_bytes, p.committed_bytes),
            (100, 70, 40)
        );
        assert_eq!(shared_checkpoint(&[a.clone(), report(None, 0)]), None);
        let other_size = report(Some(Checkpoint::new(50, [(0, 10)])), 0);
        assert_eq!(shared_checkpoint(&[a, other_size]), None);
    }

    #[test]
    fn only_timeouts_and_disconnects_are_transient() {
        assert!(is_transient("timeout"));
        assert!(is_transient("disconnected"));
        assert!(!is_transient("no_space"));
        assert!(!is_transient("invalid_input"));
        assert!(!is_transient("nonsense"));
    }
}
