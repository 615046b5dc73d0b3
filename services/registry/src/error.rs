//! The client's error: a kind the caller maps to its own (ferry's endpoint adapter maps
//! it to `ferry_core::ErrorKind`) and a message that never holds a secret.

/// What went wrong, in the terms a caller decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The reference or a setting is wrong.
    InvalidInput,
    /// No such repository, tag, manifest or blob.
    NotFound,
    /// The registry refused the credentials (or there were none), or TLS failed.
    Denied,
    /// The registry answered something the protocol does not allow.
    Protocol,
    /// Bytes that do not match their digest, or a blob shorter than its descriptor.
    Corrupt,
    /// The image is of a kind this client does not read.
    Unsupported,
    /// The connection failed or broke off; another attempt may work.
    Disconnected,
    /// The registry did not answer in time.
    Timeout,
    /// The registry failed (5xx).
    Server,
}

/// A registry error.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Protocol, message)
    }

    pub(crate) fn corrupt(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Corrupt, message)
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    /// Whether another attempt may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Disconnected | ErrorKind::Timeout | ErrorKind::Server
        )
    }
}
