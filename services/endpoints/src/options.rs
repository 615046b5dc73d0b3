//! Options that shape how an endpoint is opened, shared by every endpoint kind.
//!
//! One struct per direction carries the settings of every kind, so that callers (the CLI,
//! the service) hand them to [`crate::open_source`] / [`crate::open_target`] without
//! knowing which kind a URL names; each endpoint reads only its own part.

use crate::http::HttpOptions;
use crate::registry::RegistryOptions;
use ferry_s3::S3Options;

/// How file I/O goes through the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// Through the page cache (the default).
    #[default]
    PageCache,
    /// O_DIRECT with aligned buffers (`--cache none`).
    Direct,
}

/// How a target file is preallocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Preallocation {
    #[default]
    Off,
    /// fallocate the whole size up front.
    Falloc,
    /// Write zeroes over the whole size up front.
    Full,
    /// QEMU's preallocate filter: when a write crosses the preallocated end, extend it by
    /// `step` bytes (aligned to 1 MiB); trim to the real size at the end.
    Grow { step: u64 },
}

impl Preallocation {
    /// How a copy writes zeroes into a target preallocated this way: a preallocated target
    /// must stay allocated, so zeroes may not punch holes into it.
    pub fn zero_mode(self) -> ferry_core::ZeroMode {
        match self {
            Self::Falloc | Self::Full => ferry_core::ZeroMode::Allocate,
            Self::Off | Self::Grow { .. } => ferry_core::ZeroMode::MayDeallocate,
        }
    }
}

/// Options for opening a source.
#[non_exhaustive]
#[derive(Debug, Clone, Default)]
pub struct SourceOptions {
    pub cache: CacheMode,
    /// Per-job settings of `s3://` sources over the SDK's standard chain.
    pub s3: S3Options,
    /// Per-job settings of `http://` and `https://` sources.
    pub http: HttpOptions,
    /// Per-job settings of `docker://` sources.
    pub registry: RegistryOptions,
}

/// Options for opening a target.
#[non_exhaustive]
#[derive(Debug, Clone, Default)]
pub struct TargetOptions {
    pub cache: CacheMode,
    pub preallocation: Preallocation,
    /// The target is read back right after it is written (a verified copy): file targets
    /// keep written pages in the page cache (still written to disk as the copy goes)
    /// instead of dropping them, so the read-back finds them there.
    pub keep_cached: bool,
    /// Per-job settings of `s3://` targets over the SDK's standard chain.
    pub s3: S3Options,
}
