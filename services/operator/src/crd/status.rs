//! Status pieces shared by the kinds: the phase, progress in bytes, conditions' types and
//! reasons, and the checkpoint that lets a replacement mover resume where the last one
//! had committed.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a Transfer or Checksum is in its life. Pending -> Running -> Succeeded | Failed |
/// Cancelled; the last three are final.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Phase {
    /// Accepted; waiting for claims, a mover slot or the mover pod to start.
    #[default]
    Pending,
    /// A mover is moving bytes (or waiting between retries of a transient error).
    Running,
    /// Finished; the digests and progress say what was done.
    Succeeded,
    /// Failed; `message` says what to fix.
    Failed,
    /// Deleted or cancelled while it ran; what was committed stays committed.
    Cancelled,
}

impl Phase {
    /// Whether the phase is final.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// Progress in bytes (integers, never percent strings).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Bytes to process (the source size), once known.
    #[serde(default)]
    pub total_bytes: u64,
    /// Bytes processed so far, including resumed and zero bytes.
    #[serde(default)]
    pub done_bytes: u64,
    /// Bytes an earlier mover had committed, skipped on resume.
    #[serde(default)]
    pub resumed_bytes: u64,
    /// Bytes committed (written and flushed) by the last checkpoint.
    #[serde(default)]
    pub committed_bytes: u64,
}

/// Condition types the operator sets.
pub mod condition {
    /// True when the resource finished successfully; False with the reason otherwise.
    pub const READY: &str = "Ready";
    /// True while a mover moves bytes.
    pub const RUNNING: &str = "Running";

    /// Reasons of the conditions (CamelCase, as Kubernetes expects).
    pub mod reason {
        /// Waiting for claims, Secrets or a mover slot.
        pub const PENDING: &str = "Pending";
        /// The claim a Transfer copies is in use by a pod that may write it.
        pub const SOURCE_IN_USE: &str = "SourceInUse";
        /// Waiting for a mover slot (cluster or node limit).
        pub const QUEUED: &str = "Queued";
        /// The API server refused the mover pod or a claim (admission: PodSecurity, a
        /// ResourceQuota, a missing service account, an SCC; or validation); looked at
        /// again after a backoff.
        pub const REFUSED: &str = "Refused";
        /// The mover pod is starting.
        pub const MOVER_STARTING: &str = "MoverStarting";
        /// The mover is moving bytes.
        pub const MOVER_RUNNING: &str = "MoverRunning";
        /// A transient error; the mover retries after a backoff.
        pub const RETRYING: &str = "Retrying";
        /// A mover pod was lost; a replacement resumes from the checkpoint.
        pub const MOVER_LOST: &str = "MoverLost";
        /// The mover pod is ready but the operator cannot reach its gRPC port.
        pub const MOVER_UNREACHABLE: &str = "MoverUnreachable";
        /// The spec cannot run as written.
        pub const INVALID_SPEC: &str = "InvalidSpec";
        /// The copy or checksum finished.
        pub const SUCCEEDED: &str = "Succeeded";
        /// A permanent error.
        pub const FAILED: &str = "Failed";
        /// The result did not match `expectedDigest`.
        pub const DIGEST_MISMATCH: &str = "DigestMismatch";
        /// Cancelled by deletion.
        pub const CANCELLED: &str = "Cancelled";
    }
}

/// Most committed ranges a checkpoint keeps in the status (the object must stay small).
pub const MAX_CHECKPOINT_RANGES: usize = 256;

/// What a copy had committed, recorded in the status so it survives the mover pod: a
/// replacement mover skips these ranges. Ranges are `[start, end)` byte offsets, sorted,
/// not overlapping, not touching.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// Image size the ranges refer to; a checkpoint of another size is not used.
    pub size: u64,
    /// Committed `[start, end)` ranges, at most 256.
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub committed: Vec<[u64; 2]>,
}

impl Checkpoint {
    /// A checkpoint of `size` bytes from committed ranges in any order: empty and
    /// out-of-image parts are dropped, the rest sorted and merged. When more than
    /// [`MAX_CHECKPOINT_RANGES`] remain, the smallest ranges are dropped until the limit
    /// holds: a dropped range is only copied again on resume, so the checkpoint stays
    /// correct (it never claims bytes that were not committed) and loses the least work.
    pub fn new(size: u64, ranges: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut ranges: Vec<(u64, u64)> = ranges
            .into_iter()
            .map(|(start, end)| (start, end.min(size)))
            .filter(|(start, end)| start < end)
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        if merged.len() > MAX_CHECKPOINT_RANGES {
            let mut by_length: Vec<usize> = (0..merged.len()).collect();
            // Longest first; equal lengths keep the earlier range.
            by_length.sort_by_key(|&i| (std::cmp::Reverse(merged[i].1 - merged[i].0), i));
            let mut keep: Vec<usize> = by_length[..MAX_CHECKPOINT_RANGES].to_vec();
            keep.sort_unstable();
            merged = keep.into_iter().map(|i| merged[i]).collect();
        }
        Self {
            size,
            committed: merged.into_iter().map(|(s, e)| [s, e]).collect(),
        }
    }

    /// Bytes the checkpoint records as committed.
    pub fn committed_bytes(&self) -> u64 {
        self.committed
            .iter()
            .map(|[s, e]| e.saturating_sub(*s))
            .sum()
    }

    /// The ranges as a resume may use them: only when the image size matches, and only
    /// well-formed ranges inside the image (a status edited by hand cannot make a resume
    /// skip bytes outside the image or read a range backwards).
    pub fn ranges_for(&self, size: u64) -> Vec<(u64, u64)> {
        if self.size != size {
            return Vec::new();
        }
        Self::new(size, self.committed.iter().map(|[s, e]| (*s, *e)))
            .committed
            .into_iter()
            .map(|[s, e]| (s, e))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_sorts_merges_and_clips() {
        let c = Checkpoint::new(
            100,
            [(50, 60), (0, 10), (10, 20), (55, 70), (90, 150), (5, 5)],
        );
        assert_eq!(c.committed, vec![[0, 20], [50, 70], [90, 100]]);
        assert_eq!(c.committed_bytes(), 50);
    }

    #[test]
    fn checkpoint_keeps_the_longest_ranges_when_too_many() {
        // 300 ranges: range i is [i*100, i*100 + 1 + i % 7), never touching.
        let ranges: Vec<(u64, u64)> = (0..300u64)
            .map(|i| (i * 100, i * 100 + 1 + i % 7))
            .collect();
        let c = Checkpoint::new(1 << 20, ranges.clone());
        assert_eq!(c.committed.len(), MAX_CHECKPOINT_RANGES);
        // Every kept range was committed (a subset of the input), in order.
        for pair in c.committed.windows(2) {
            assert!(pair[0][1] < pair[1][0]);
        }
        for [s, e] in &c.committed {
            assert!(ranges.contains(&(*s, *e)));
        }
        // The dropped ones are the shortest: the shortest kept is at least the longest dropped.
        let kept_min = c.committed.iter().map(|[s, e]| e - s).min().unwrap();
        let dropped_max = ranges
            .iter()
            .filter(|(s, e)| !c.committed.contains(&[*s, *e]))
            .map(|(s, e)| e - s)
            .max()
            .unwrap();
        assert!(kept_min >= dropped_max, "{kept_min} < {dropped_max}");
    }

    #[test]
    fn checkpoint_of_another_size_is_not_used() {
        let c = Checkpoint {
            size: 100,
            committed: vec![[0, 10], [30, 20], [90, 200]],
        };
        assert_eq!(c.ranges_for(200), vec![]);
        assert_eq!(c.ranges_for(100), vec![(0, 10), (90, 100)]);
    }

    #[test]
    fn final_phases() {
        assert!(!Phase::Pending.is_final());
        assert!(!Phase::Running.is_final());
        assert!(Phase::Succeeded.is_final());
        assert!(Phase::Failed.is_final());
        assert!(Phase::Cancelled.is_final());
    }
}
