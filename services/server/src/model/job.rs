//! Job records: the one shape of a job that the manager keeps in memory, the store
//! persists (as JSON, so a record stays readable and can gain fields), and the API
//! converts to `ferry.v1.Job`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use ferry_engine::Checkpoint;
use serde::{Deserialize, Serialize};

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    Transfer,
    Checksum,
    Backup,
    Restore,
    RepositoryVerify,
    Prune,
    Gc,
    Sync,
}

impl JobKind {
    /// A stable name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transfer => "transfer",
            Self::Checksum => "checksum",
            Self::Backup => "backup",
            Self::Restore => "restore",
            Self::RepositoryVerify => "repository_verify",
            Self::Prune => "prune",
            Self::Gc => "gc",
            Self::Sync => "sync",
        }
    }
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 5] = [
        Self::Queued,
        Self::Running,
        Self::Succeeded,
        Self::Failed,
        Self::Cancelled,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }

    /// A stable name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// An endpoint after validation: a confined, canonical file path or a URL without secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolvedEndpoint {
    File(PathBuf),
    Url(String),
}

/// What validation worked out about a request, kept so a restart runs exactly what was
/// accepted (the canonical paths, not whatever the names point to later).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPlan {
    pub source: ResolvedEndpoint,
    pub target: Option<ResolvedEndpoint>,
    /// The identity of the target for the one-writer rule.
    pub target_key: Option<String>,
    /// Endpoint hosts for the per-host limit.
    pub hosts: Vec<String>,
    /// Endpoint kinds (file, nbd, ...) for metric labels.
    pub source_kind: String,
    pub target_kind: Option<String>,
    /// The targets after the first of a fan-out, in request order (records written
    /// before fan-outs existed have none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_targets: Vec<PlannedTarget>,
    /// Backup jobs: the repository (a canonical directory or an s3:// URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<ResolvedEndpoint>,
}

/// A target of a fan-out after the first, as validation resolved it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedTarget {
    pub resolved: ResolvedEndpoint,
    /// Its identity for the one-writer rule.
    pub key: String,
    /// Its endpoint kind, for metric labels.
    pub kind: String,
}

impl JobPlan {
    /// The identities of every target the job writes, the first target first.
    pub fn target_keys(&self) -> Vec<String> {
        self.target_key
            .iter()
            .cloned()
            .chain(self.more_targets.iter().map(|t| t.key.clone()))
            .collect()
    }

    /// Whether the job writes this target.
    pub fn writes(&self, key: &str) -> bool {
        self.target_key.as_deref() == Some(key) || self.more_targets.iter().any(|t| t.key == key)
    }
}

/// Where one target of a transfer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetState {
    Running,
    Succeeded,
    Failed,
}

/// One target of a transfer: `Job.targets` on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetRecord {
    /// The URL or path as requested, without user information.
    pub target: String,
    pub state: TargetState,
    pub error: Option<ErrorRecord>,
    pub digest: Option<DigestRecord>,
    pub done: u64,
    /// It holds every range of the job's checkpoint (a resumed copy may write it).
    pub resumable: bool,
}

impl TargetRecord {
    /// A target not written yet.
    pub fn new(target: String) -> Self {
        Self {
            target,
            state: TargetState::Running,
            error: None,
            digest: None,
            done: 0,
            resumable: true,
        }
    }

    /// Whether a (resumed) attempt writes it.
    pub fn is_live(&self) -> bool {
        self.state != TargetState::Failed
    }
}

/// Progress as last observed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgressRecord {
    pub total: u64,
    pub done: u64,
    pub data: u64,
    pub zero: u64,
    pub resumed: u64,
    pub committed: u64,
    pub bytes_per_second: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestRecord {
    /// "blkhash" or "sha256".
    pub algorithm: String,
    pub hex: String,
}

/// What a job did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultRecord {
    Transfer {
        size: u64,
        data_bytes: u64,
        zero_bytes: u64,
        seconds: f64,
        source_digest: Option<DigestRecord>,
        target_digest: Option<DigestRecord>,
        resumed_bytes: u64,
    },
    Checksum {
        digest: DigestRecord,
        size: u64,
        seconds: f64,
    },
    /// The backup jobs' results are the wire messages, prost-encoded as the requests are
    /// (BackupResult, RestoreResult, RepositoryVerifyResult, PruneResult, GcResult,
    /// SyncResult).
    Backup {
        #[serde(with = "hex_bytes")]
        result: Vec<u8>,
    },
    Restore {
        #[serde(with = "hex_bytes")]
        result: Vec<u8>,
    },
    RepositoryVerify {
        #[serde(with = "hex_bytes")]
        result: Vec<u8>,
    },
    Prune {
        #[serde(with = "hex_bytes")]
        result: Vec<u8>,
    },
    Gc {
        #[serde(with = "hex_bytes")]
        result: Vec<u8>,
    },
    Sync {
        #[serde(with = "hex_bytes")]
        result: Vec<u8>,
    },
}

/// Why a job failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorRecord {
    pub kind: String,
    pub message: String,
}

/// A job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    /// Acceptance order: FIFO within a priority, list order, page tokens.
    pub seq: u64,
    pub kind: JobKind,
    pub state: JobState,
    pub idempotency_key: String,
    /// SHA-256 of the encoded request: the same key with another request is a conflict.
    pub fingerprint: String,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
    pub created_ms: u64,
    pub started_ms: Option<u64>,
    pub ended_ms: Option<u64>,
    /// The accepted request, prost-encoded (StartTransferRequest or StartChecksumRequest).
    #[serde(with = "hex_bytes")]
    pub request: Vec<u8>,
    pub plan: JobPlan,
    pub attempt: u32,
    pub progress: ProgressRecord,
    pub result: Option<ResultRecord>,
    pub error: Option<ErrorRecord>,
    pub message: String,
    /// The latest checkpoint of a transfer as `Job.checkpoint` shows it (bounded; the
    /// full one the job resumes from is kept beside the record). Records written before
    /// this field existed have none.
    #[serde(default)]
    pub checkpoint: Option<Checkpoint>,
    /// Transfers: each target and how it is doing, in request order (records written
    /// before this field existed have none; the job's state then stands for its target).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetRecord>,
    /// The version of the source the first attempt read (an HTTP source's ETag or
    /// Last-Modified): later attempts and a resumption after a restart must read the same
    /// one, or fail instead of mixing two versions in one target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_version: Option<String>,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Lower-case hex encoding for byte fields in JSON records.
pub mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn encode(bytes: &[u8]) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(bytes.len() * 2);
        for b in bytes {
            out.push(DIGITS[usize::from(b >> 4)] as char);
            out.push(DIGITS[usize::from(b & 15)] as char);
        }
        out
    }

    pub fn decode(text: &str) -> Option<Vec<u8>> {
        if !text.len().is_multiple_of(2) {
            return None;
        }
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
            .collect()
    }

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        decode(&text).ok_or_else(|| serde::de::Error::custom("invalid hex"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let bytes = vec![0u8, 1, 0xab, 0xff];
        assert_eq!(hex_bytes::encode(&bytes), "0001abff");
        assert_eq!(hex_bytes::decode("0001abff"), Some(bytes));
        assert_eq!(hex_bytes::decode("abc"), None);
        assert_eq!(hex_bytes::decode("zz"), None);
    }

    #[test]
    fn terminal_states() {
        let terminal: Vec<_> = JobState::ALL
            .iter()
            .filter(|s| s.is_terminal())
            .map(|s| s.as_str())
            .collect();
        assert_eq!(terminal, ["succeeded", "failed", "cancelled"]);
    }
}
