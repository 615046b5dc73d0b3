//! Copy and checksum options as the custom resources spell them. They follow the gRPC
//! API's `TransferOptions` and `ChecksumOptions` (proto/ferry/v1/jobs.proto) field by
//! field, and each value maps to the wire once ([`crate::mover::wire`]); a field left out
//! means the engine's default, as a zero value does on the wire.
//! Sizes are integers in bytes, bounded as `ferry copy` bounds its flags.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::validate::{invalid, ValidationError};

/// Largest request size (64 MiB), as `ferry copy --request-size`.
pub const MAX_REQUEST_SIZE: u64 = 64 << 20;
/// Most parallel workers of a copy, as the gRPC API.
pub const MAX_WORKERS: u32 = 256;

/// Which order a copy commits writes in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CommitOrder {
    /// Out of order when the target allows random writes, in order otherwise.
    #[default]
    Auto,
    /// Write in offset order (reads still run ahead in parallel).
    InOrder,
    /// Write as reads complete.
    OutOfOrder,
}

/// How a file target is preallocated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Preallocation {
    /// No preallocation. Spelled `None` in the resource: YAML 1.1 readers (kubectl)
    /// would read an unquoted `Off` as the boolean false.
    #[default]
    #[serde(rename = "None")]
    Off,
    /// fallocate the whole size up front.
    Falloc,
    /// Write zeroes over the whole size up front.
    Full,
    /// Extend the file in steps of `preallocationStep` as writes cross its end.
    Grow,
}

/// The format of a source image.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// Detected by magic bytes, as qemu-img does.
    #[default]
    Auto,
    /// The bytes as they are, whatever they look like.
    Raw,
    /// A qcow2 image.
    Qcow2,
    /// A raw image compressed with gzip.
    Gz,
    /// A raw image compressed with xz.
    Xz,
    /// A raw image compressed with zstd.
    Zst,
}

/// How file I/O goes through the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CacheMode {
    /// Through the page cache.
    #[default]
    PageCache,
    /// O_DIRECT, bypassing the page cache.
    Direct,
}

/// Which digest a checksum or a verify computes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HashAlgorithm {
    /// The blksum-compatible block hash.
    #[default]
    Blkhash,
    /// Plain SHA-256 of the image bytes, as sha256sum prints it.
    Sha256,
}

impl HashAlgorithm {
    /// The name used in digests (`blkhash:...`, `sha256:...`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Blkhash => "blkhash",
            Self::Sha256 => "sha256",
        }
    }
}

/// Copy options (`TransferOptions` of the gRPC API).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransferOptions {
    /// Parallel workers (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub workers: Option<u32>,
    /// Bytes per read/write request (default: what the endpoints prefer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 67108864))]
    pub request_size: Option<u64>,
    /// Commit order (default Auto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<CommitOrder>,
    /// Zero-detection granularity in bytes: 0 keeps everything allocated, else a power of
    /// two up to 64 MiB (default 4096).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 67108864))]
    pub sparse_size: Option<u64>,
    /// The targets are known to read as zeroes: zero ranges are not written at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_is_zero: Option<bool>,
    /// Preallocation of file targets (default None).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preallocation: Option<Preallocation>,
    /// Step in bytes of Grow preallocation (default 64 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub preallocation_step: Option<u64>,
    /// Cache mode of file endpoints (default PageCache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheMode>,
    /// Rate limit in bytes per second (default unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub rate_limit: Option<u64>,
    /// After the copy, checksum source and target and fail when they differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<bool>,
    /// Digest used by verify (default blkhash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_algorithm: Option<HashAlgorithm>,
}

fn check_workers(field: &str, workers: Option<u32>) -> Result<(), ValidationError> {
    match workers {
        Some(w) if w == 0 || w > MAX_WORKERS => Err(invalid(
            field,
            &format!("workers must be between 1 and {MAX_WORKERS}"),
        )),
        _ => Ok(()),
    }
}

fn check_request_size(field: &str, size: Option<u64>) -> Result<(), ValidationError> {
    match size {
        Some(s) if s == 0 || s > MAX_REQUEST_SIZE => Err(invalid(
            field,
            "requestSize must be between 1 byte and 64 MiB (67108864)",
        )),
        _ => Ok(()),
    }
}

impl TransferOptions {
    /// Checks the options at `field` (for example `spec.options`).
    pub fn validate(&self, field: &str) -> Result<(), ValidationError> {
        check_workers(&format!("{field}.workers"), self.workers)?;
        check_request_size(&format!("{field}.requestSize"), self.request_size)?;
        if let Some(s) = self.sparse_size {
            if s != 0 && (!s.is_power_of_two() || s > MAX_REQUEST_SIZE) {
                return Err(invalid(
                    &format!("{field}.sparseSize"),
                    "sparseSize must be 0 or a power of two up to 64 MiB (like 512, 4096, 65536)",
                ));
            }
        }
        if self.preallocation_step.is_some() && self.preallocation != Some(Preallocation::Grow) {
            return Err(invalid(
                &format!("{field}.preallocationStep"),
                "preallocationStep applies only to preallocation: Grow",
            ));
        }
        if self.preallocation_step == Some(0) {
            return Err(invalid(
                &format!("{field}.preallocationStep"),
                "preallocationStep must be at least 1 byte",
            ));
        }
        if self.rate_limit == Some(0) {
            return Err(invalid(
                &format!("{field}.rateLimit"),
                "rateLimit must be at least 1 byte per second (leave it out for no limit)",
            ));
        }
        if self.verify_algorithm.is_some() && self.verify != Some(true) {
            return Err(invalid(
                &format!("{field}.verifyAlgorithm"),
                "verifyAlgorithm needs verify: true",
            ));
        }
        Ok(())
    }
}

/// Checksum options (`ChecksumOptions` of the gRPC API).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChecksumOptions {
    /// Digest to compute (default blkhash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<HashAlgorithm>,
    /// Parallel readers (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub workers: Option<u32>,
    /// Bytes per read request (default: what the endpoint prefers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 67108864))]
    pub request_size: Option<u64>,
    /// Hashing threads (default: all cores of the mover).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub threads: Option<u32>,
    /// Cache mode of file sources (default PageCache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheMode>,
}

impl ChecksumOptions {
    /// Checks the options at `field`.
    pub fn validate(&self, field: &str) -> Result<(), ValidationError> {
        check_workers(&format!("{field}.workers"), self.workers)?;
        check_request_size(&format!("{field}.requestSize"), self.request_size)?;
        if self.threads.is_some_and(|t| t == 0 || t > 1024) {
            return Err(invalid(
                &format!("{field}.threads"),
                "threads must be between 1 and 1024",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(o: &TransferOptions) -> String {
        o.validate("spec.options").unwrap_err().to_string()
    }

    #[test]
    fn defaults_pass() {
        TransferOptions::default().validate("o").unwrap();
        ChecksumOptions::default().validate("o").unwrap();
    }

    #[test]
    fn bounds_are_checked() {
        let o = TransferOptions {
            workers: Some(0),
            ..TransferOptions::default()
        };
        assert_eq!(
            err(&o),
            "spec.options.workers: workers must be between 1 and 256"
        );
        let o = TransferOptions {
            request_size: Some(MAX_REQUEST_SIZE + 1),
            ..TransferOptions::default()
        };
        assert!(err(&o).starts_with("spec.options.requestSize:"));
        let o = TransferOptions {
            sparse_size: Some(3000),
            ..TransferOptions::default()
        };
        assert!(err(&o).starts_with("spec.options.sparseSize:"));
        let o = TransferOptions {
            sparse_size: Some(0),
            rate_limit: Some(0),
            ..TransferOptions::default()
        };
        assert!(err(&o).starts_with("spec.options.rateLimit:"));
        let c = ChecksumOptions {
            threads: Some(0),
            ..ChecksumOptions::default()
        };
        assert!(c.validate("o").is_err());
    }

    #[test]
    fn dependent_options_need_their_switch() {
        let o = TransferOptions {
            preallocation_step: Some(1 << 20),
            ..TransferOptions::default()
        };
        assert!(err(&o).contains("preallocation: Grow"));
        let o = TransferOptions {
            preallocation: Some(Preallocation::Grow),
            preallocation_step: Some(1 << 20),
            verify: Some(true),
            verify_algorithm: Some(HashAlgorithm::Sha256),
            ..TransferOptions::default()
        };
        o.validate("o").unwrap();
        let o = TransferOptions {
            verify_algorithm: Some(HashAlgorithm::Sha256),
            ..TransferOptions::default()
        };
        assert!(err(&o).contains("needs verify: true"));
    }

    #[test]
    fn enums_use_the_documented_spelling() {
        let o: TransferOptions = serde_json::from_value(serde_json::json!({
            "order": "OutOfOrder", "preallocation": "Grow", "cache": "Direct",
            "verify": true, "verifyAlgorithm": "sha256", "requestSize": 1048576
        }))
        .unwrap();
        assert_eq!(o.order, Some(CommitOrder::OutOfOrder));
        assert_eq!(o.cache, Some(CacheMode::Direct));
        assert_eq!(o.verify_algorithm, Some(HashAlgorithm::Sha256));
        assert_eq!(o.request_size, Some(1 << 20));
    }
}
