//! What `ferry copy` prints when it succeeds: a human line, or with `--json` one JSON
//! object for scripts (field names are part of the CLI's interface).

use std::time::Duration;

use ferry_core::size::format_size;
use ferry_engine::{CopyReport, Digest};
use serde::Serialize;

/// The `--json` summary of a successful copy.
#[derive(Debug, Clone, Serialize)]
pub struct CopySummary {
    pub source: String,
    pub target: String,
    /// Image size in bytes.
    pub size: u64,
    /// Bytes read from the source and written as data.
    pub bytes_copied: u64,
    /// Bytes found to be zero (holes, zero extents and zero blocks), not written as data.
    pub zero_bytes: u64,
    /// Wall time of the copy, target flush included (not the verification).
    pub seconds: f64,
    /// Image bytes per second (`size / seconds`).
    pub throughput_bytes_per_second: f64,
    /// The source's size was not known before the copy (a compressed stream that does not
    /// record it): `size` is the length it turned out to have.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub size_learned: bool,
    /// With `size_learned`, into a target that cannot grow and is larger than the stream:
    /// the target's size (its bytes past `size` were left as they were).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_size: Option<u64>,
    /// Present with `--verify`: the block hashes of source and target (equal, or the
    /// command would have failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digests: Option<Digests>,
    /// With several targets: those that do not hold the image, and why (`target` then
    /// names only those that do).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_targets: Vec<FailedTarget>,
}

/// A target of a fan-out copy that does not hold the image.
#[derive(Debug, Clone, Serialize)]
pub struct FailedTarget {
    pub target: String,
    pub error: String,
}

/// Digests of both sides after a verified copy.
#[derive(Debug, Clone, Serialize)]
pub struct Digests {
    pub algorithm: String,
    pub source: String,
    pub target: String,
    pub seconds: f64,
}

impl CopySummary {
    pub fn new(source: String, target: String, report: &CopyReport) -> Self {
        let seconds = report.elapsed.as_secs_f64();
        Self {
            source,
            target,
            size: report.size,
            bytes_copied: report.data_bytes,
            zero_bytes: report.zero_bytes,
            seconds,
            throughput_bytes_per_second: rate(report.size, report.elapsed),
            size_learned: report.size_learned,
            target_size: None,
            digests: None,
            failed_targets: Vec::new(),
        }
    }

    /// Notes the size of a target that cannot grow, when a stream of unknown size ended
    /// before it.
    pub fn with_fixed_target(mut self, target_size: Option<u64>) -> Self {
        self.target_size = target_size.filter(|&t| self.size_learned && t > self.size);
        self
    }

    pub fn with_digests(mut self, source: &Digest, target: &Digest, elapsed: Duration) -> Self {
        self.digests = Some(Digests {
            algorithm: source.algorithm.to_string(),
            source: source.hex(),
            target: target.hex(),
            seconds: elapsed.as_secs_f64(),
        });
        self
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The human form: one line, plus one for the verification.
    pub fn to_text(&self) -> String {
        let mut text = format!(
            "copied {} from {} to {} in {:.2} s ({}/s): {} data, {} zero",
            format_size(self.size),
            self.source,
            self.target,
            self.seconds,
            format_size(self.throughput_bytes_per_second as u64),
            format_size(self.bytes_copied),
            format_size(self.zero_bytes),
        );
        if self.size_learned {
            text.push_str(&format!(
                "\nthe source's size was learned at its end: {} bytes",
                self.size
            ));
            if let Some(t) = self.target_size {
                text.push_str(&format!(
                    "; the target's other {} bytes (of {t}) were left as they were",
                    t - self.size
                ));
            }
        }
        if let Some(d) = &self.digests {
            text.push_str(&format!(
                "\nverified in {:.2} s: {} {}",
                d.seconds, d.algorithm, d.target
            ));
        }
        text
    }
}

/// Bytes per second, 0 for an instant.
pub fn rate(bytes: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        bytes as f64 / secs
    } else {
        0.0
    }
}
