//! What can go wrong asking the SnapshotMetadata service, each case naming what was
//! wrong. Text that came from the server is redacted of the token and cut short before
//! it is kept here.

/// A result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why the service's ranges could not be had (or trusted).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration cannot work (not an https:// URL, a bad CA certificate, ...).
    #[error("invalid SnapshotMetadata configuration: {0}")]
    Config(String),
    /// No TLS connection could be made.
    #[error("the SnapshotMetadata service at {endpoint} is unreachable: {reason}")]
    Unreachable { endpoint: String, reason: String },
    /// The service did not accept the token (unknown, expired, or for another audience).
    #[error(
        "the SnapshotMetadata service did not authenticate the token (unauthenticated): {message}"
    )]
    Unauthenticated { message: String },
    /// The token's identity may not read the snapshots of this namespace.
    #[error("the SnapshotMetadata service refused access (permission denied): {message}")]
    PermissionDenied { message: String },
    /// The service does not know a snapshot, or the base snapshot id.
    #[error("the SnapshotMetadata service does not know the snapshot ({code}): {message}")]
    UnknownSnapshot { code: String, message: String },
    /// Any other gRPC failure that resuming cannot mend.
    #[error("the SnapshotMetadata service failed ({code}): {message}")]
    Rpc { code: String, message: String },
    /// The stream broke more often than the resumptions allowed.
    #[error(
        "the SnapshotMetadata stream broke {attempts} times (last at offset {offset}): {last}"
    )]
    Interrupted {
        attempts: u32,
        offset: u64,
        last: String,
    },
    /// The service sent nothing for too long, or took too long overall.
    #[error("the SnapshotMetadata service timed out: {0}")]
    Timeout(String),
    /// A reply broke the protocol's rules: it is not trusted at all.
    #[error("the SnapshotMetadata service sent an invalid reply: {0}")]
    InvalidReply(#[from] crate::validate::Invalid),
}

impl Error {
    /// A short stable name of the case, for reports (`unauthenticated`, `invalid reply`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Config(_) => "invalid configuration",
            Self::Unreachable { .. } => "unreachable",
            Self::Unauthenticated { .. } => "unauthenticated",
            Self::PermissionDenied { .. } => "permission denied",
            Self::UnknownSnapshot { .. } => "unknown snapshot",
            Self::Rpc { .. } => "failed",
            Self::Interrupted { .. } => "interrupted",
            Self::Timeout(_) => "timeout",
            Self::InvalidReply(_) => "invalid reply",
        }
    }
}
