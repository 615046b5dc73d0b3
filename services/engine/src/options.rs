//! What a caller can ask of the copy and checksum engines, with measured defaults.
//!
//! The defaults are the numbers docs/BENCHMARKS.md justifies; every other module reads
//! its limits from here so one place says how the engine behaves out of the box.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use ferry_core::{Error, Result, ZeroMode};

use crate::progress::Checkpoint;

/// Default number of copy workers.
pub const DEFAULT_WORKERS: usize = 8;
/// Default read request size for endpoints that state no preference of their own
/// ([`ferry_core::Caps::request_size`]). Measured file to file (4 GiB, half data, 8 workers): 256 KiB
/// took about half the time and CPU of 1 MiB, because a request's buffer is still in the
/// CPU cache when it is written; 128 and 512 KiB were close (see docs/BENCHMARKS.md).
pub const DEFAULT_REQUEST_SIZE: usize = 256 * 1024;
/// Default work unit: how much of the image a worker takes from the cursor at a time.
/// 64 MiB matched or beat 16 MiB (more extent calls) and 256 MiB (fewer units to balance).
pub const DEFAULT_WORK_UNIT: u64 = 64 * 1024 * 1024;
/// Default zero-detection granularity.
pub const DEFAULT_SPARSE_SIZE: usize = 4096;
/// Requests each copy worker keeps in flight when `max_in_flight_bytes` is not given...
pub const DEFAULT_REQUESTS_PER_WORKER: usize = 4;
/// ...unless that would hold more than this many bytes per worker (large requests, as
/// object stores prefer, need fewer of them in flight to keep the link busy).
pub const DEFAULT_BYTES_PER_WORKER: usize = 16 * 1024 * 1024;
/// Default interval between checkpoints (target flush plus published committed ranges).
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(10);

/// In which order the copy commits writes to the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitOrder {
    /// Out of order when the target takes random writes, in order otherwise.
    #[default]
    Auto,
    /// Strictly in offset order (reads still run ahead in parallel).
    InOrder,
    /// As reads complete.
    OutOfOrder,
}

/// How a copy runs.
#[derive(Debug, Clone)]
pub struct CopyOptions {
    /// Concurrent workers, each taking work units from a shared cursor.
    pub workers: usize,
    /// Size of each read request (clamped to the endpoints' block-size limits); `None`
    /// takes the larger of the endpoints' own [`Caps::request_size`] and
    /// [`DEFAULT_REQUEST_SIZE`].
    ///
    /// [`Caps::request_size`]: ferry_core::Caps::request_size
    pub request_size: Option<usize>,
    /// Size of the work units the workers take.
    pub work_unit: u64,
    pub order: CommitOrder,
    /// Zero-detection granularity; 0 keeps everything allocated (zeroes are written
    /// as allocated zeroes and never skipped).
    pub sparse_size: usize,
    /// The target reads as zeroes already, so zero ranges need no write (also assumed
    /// when the target says so itself).
    pub target_is_zero: bool,
    /// How zero runs are written. With [`ZeroMode::Allocate`] zero ranges are always
    /// written, even to a target known to be zero.
    pub zero_mode: ZeroMode,
    /// Bytes read per second, at most.
    pub rate_limit: Option<u64>,
    /// Bound on the bytes held in read buffers; `None` derives it from the worker count
    /// and request size.
    pub max_in_flight_bytes: Option<usize>,
    /// How often the target is flushed and the checkpoint advanced; zero checkpoints
    /// only at the end.
    pub checkpoint_interval: Duration,
    /// Ranges a previous run committed, skipped by this one.
    pub resume: Option<Checkpoint>,
}

impl Default for CopyOptions {
    fn default() -> Self {
        Self {
            workers: DEFAULT_WORKERS,
            request_size: None,
            work_unit: DEFAULT_WORK_UNIT,
            order: CommitOrder::Auto,
            sparse_size: DEFAULT_SPARSE_SIZE,
            target_is_zero: false,
            zero_mode: ZeroMode::MayDeallocate,
            rate_limit: None,
            max_in_flight_bytes: None,
            checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
            resume: None,
        }
    }
}

impl CopyOptions {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.workers == 0 {
            return Err(Error::invalid_input("workers must be at least 1"));
        }
        if self.request_size == Some(0) {
            return Err(Error::invalid_input("request size must be at least 1 byte"));
        }
        if self.work_unit == 0 {
            return Err(Error::invalid_input("work unit must be at least 1 byte"));
        }
        if self.rate_limit == Some(0) {
            return Err(Error::invalid_input(
                "rate limit must be at least 1 byte per second",
            ));
        }
        if self.max_in_flight_bytes == Some(0) {
            return Err(Error::invalid_input(
                "max in-flight bytes must be at least 1 byte",
            ));
        }
        Ok(())
    }
}

/// Which digest [`crate::checksum`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashAlgorithm {
    /// The blksum-compatible block hash (SHA-256 over 64 KiB blocks).
    #[default]
    Blkhash,
    /// Plain SHA-256 of the image stream, equal to `sha256sum`.
    Sha256,
}

impl HashAlgorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Blkhash => "blkhash",
            Self::Sha256 => "sha256",
        }
    }
}

impl fmt::Display for HashAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HashAlgorithm {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "blkhash" => Ok(Self::Blkhash),
            "sha256" => Ok(Self::Sha256),
            _ => Err(Error::invalid_input(format!(
                "unknown checksum algorithm '{s}': expected blkhash or sha256"
            ))),
        }
    }
}

/// Default read size of the checksum engine (a multiple of the 64 KiB hash block).
pub const DEFAULT_CHECKSUM_REQUEST_SIZE: usize = 4 * 1024 * 1024;
/// Default concurrent reads of the checksum engine.
pub const DEFAULT_CHECKSUM_WORKERS: usize = 8;

/// How a checksum runs.
#[derive(Debug, Clone)]
pub struct ChecksumOptions {
    pub algorithm: HashAlgorithm,
    /// Reads in flight at once.
    pub workers: usize,
    /// Size of each read (rounded up to whole 64 KiB blocks).
    pub request_size: usize,
    /// Threads hashing at once (default: every core).
    pub threads: usize,
}

impl Default for ChecksumOptions {
    fn default() -> Self {
        Self {
            algorithm: HashAlgorithm::Blkhash,
            workers: DEFAULT_CHECKSUM_WORKERS,
            request_size: DEFAULT_CHECKSUM_REQUEST_SIZE,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        }
    }
}

impl ChecksumOptions {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.workers == 0 {
            return Err(Error::invalid_input("workers must be at least 1"));
        }
        if self.threads == 0 {
            return Err(Error::invalid_input("threads must be at least 1"));
        }
        if self.request_size == 0 {
            return Err(Error::invalid_input("request size must be at least 1 byte"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_names_round_trip() {
        for a in [HashAlgorithm::Blkhash, HashAlgorithm::Sha256] {
            assert_eq!(a.to_string().parse::<HashAlgorithm>().unwrap(), a);
        }
        assert_eq!(
            "SHA256".parse::<HashAlgorithm>().unwrap(),
            HashAlgorithm::Sha256
        );
        let err = "md5".parse::<HashAlgorithm>().unwrap_err();
        assert!(err.to_string().contains("blkhash or sha256"), "{err}");
    }

    #[test]
    fn rejects_zero_limits() {
        let bad = CopyOptions {
            workers: 0,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        let bad = CopyOptions {
            rate_limit: Some(0),
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        assert!(CopyOptions::default().validate().is_ok());
        assert!(ChecksumOptions::default().validate().is_ok());
    }
}
