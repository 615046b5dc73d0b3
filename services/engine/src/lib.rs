//! ferry-engine: the data path.
//!
//! [`copy`] moves an image from a [`Source`](ferry_core::Source) to a
//! [`Target`](ferry_core::Target): workers take work units from a shared cursor, ask
//! for extents lazily, read in pooled buffers, skip or merge zeroes, and commit out of
//! order or strictly in order, with a memory bound, a rate limit, progress, prompt
//! cancellation and checkpoints a later run can resume from. [`copy_and_verify`] is the
//! copy with a verification of the flushed target read back. [`checksum`] computes the
//! blksum-compatible block hash (or plain SHA-256) of a source on all cores.
//! The engine knows nothing of protocols: only the traits of ferry-core.

#![forbid(unsafe_code)]

mod blockcheck;
mod checksum;
mod commit;
mod copy;
mod cpu;
mod fanout;
mod geometry;
mod hashers;
mod merge;
mod options;
mod plan;
mod pool;
mod progress;
mod ranges;
mod rate;
mod readback;
mod sequencer;
mod sha256;
mod stream;
mod tap;
mod verified;
mod zero;

pub use checksum::{checksum, Digest};
pub use copy::{copy, CopyReport};
pub use fanout::{Failure, FanOut, MemberOutcome};
pub use ferry_core::WrittenRanges;
pub use geometry::read_request_size;
pub use options::{
    ChecksumOptions, CommitOrder, CopyOptions, HashAlgorithm, DEFAULT_REQUEST_SIZE,
    DEFAULT_WORKERS, DEFAULT_WORK_UNIT,
};
pub use progress::{Checkpoint, Progress, ProgressSnapshot};
pub use tokio_util::sync::CancellationToken;
pub use verified::{
    copy_and_verify, verify_read_back, verify_read_backs, Prefix, Stage, StageError, Stages,
    Verification, VerifiedCopy, Verify,
};
