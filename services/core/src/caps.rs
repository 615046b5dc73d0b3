//! Capabilities: what an endpoint can do, asked up front instead of probed by failure.

/// Block size constraints of an endpoint, as NBD's NBD_INFO_BLOCK_SIZE states them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    /// Requests must be aligned to and a multiple of this (1 when anything goes).
    pub minimum: u32,
    /// Requests of this alignment and size are efficient.
    pub preferred: u32,
    /// No single request may be larger than this.
    pub maximum: u32,
}

impl Default for BlockSizes {
    fn default() -> Self {
        Self {
            minimum: 1,
            preferred: 4096,
            maximum: 32 * 1024 * 1024,
        }
    }
}

/// What an endpoint supports. Optional operations always have a working default
/// implementation; capabilities tell callers which ones are efficient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// The source can report allocation (holes and zero ranges) cheaply.
    pub extents: bool,
    /// The target writes zeroes without transferring zero bytes.
    pub efficient_zero: bool,
    /// The target can discard ranges (and they read back as zeroes afterwards).
    pub trim: bool,
    /// The target accepts writes in any order (false for streams and multipart uploads
    /// that must be written in order).
    pub random_write: bool,
    /// A range already written may be written again (false for uploads that take each
    /// byte once, such as the parts of an S3 multipart upload). The engine writes every
    /// byte once; callers that rewrite (tests, repairs) ask first.
    pub rewrite: bool,
    /// What the target has written (and flushed) can be read through a new handle while the
    /// target is still being written (false for an S3 multipart upload, whose object exists
    /// only once it is finished). A verified copy then reads the target back as it goes.
    pub read_while_writing: bool,
    /// Another connection sees the same data, so workers may each have their own.
    pub multi_conn: bool,
    /// The source can only be read front to back (a decompressed stream, an HTTP server
    /// without range requests): readers take it in offset order, one request at a time.
    /// Reads may skip forward; a read behind the last one costs a restart of the stream.
    pub sequential_read: bool,
    /// Request size limits.
    pub block: BlockSizes,
    /// The read or write size this endpoint moves data best at, used when the caller
    /// chose none. Network endpoints pay a round trip per request and say so here;
    /// `None` leaves the choice to the engine's default.
    pub request_size: Option<u32>,
    /// The largest work unit a copy should cut this source into, for a source that
    /// checks its bytes in order while they are read by ranges in parallel (a registry
    /// layer hashed as it goes): small units keep concurrent readers close together, so
    /// what arrives ahead of the hashed prefix fits a bounded buffer. `None` leaves the
    /// unit to the engine.
    pub work_unit: Option<u64>,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            extents: false,
            efficient_zero: false,
            trim: false,
            random_write: true,
            rewrite: true,
            read_while_writing: true,
            multi_conn: true,
            sequential_read: false,
            block: BlockSizes::default(),
            request_size: None,
            work_unit: None,
        }
    }
}
