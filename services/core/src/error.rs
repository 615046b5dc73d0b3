//! The one error type of the data path: a small stable kind plus context.
//!
//! The kind decides retries, the gRPC status code and the metric label; the context
//! (endpoint, operation, offset) and message tell a human what went wrong and where.

use std::error::Error as StdError;
use std::fmt;

/// Stable classification of an error. Adding a variant is an API change.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request itself is wrong (bad URL, bad option, target too small).
    InvalidInput,
    /// The thing named does not exist (file, export, bucket, key).
    NotFound,
    /// Access was refused (permissions, credentials, outside allowed roots).
    PermissionDenied,
    /// The endpoint or operation is not supported (yet).
    Unsupported,
    /// An I/O error from the operating system or reported by a server.
    Io,
    /// The peer broke the protocol (malformed or unexpected reply).
    Protocol,
    /// The peer did not answer in time.
    Timeout,
    /// The connection was lost or refused; often worth a retry.
    Disconnected,
    /// No space left on the target.
    NoSpace,
    /// The operation was cancelled by the caller.
    Cancelled,
    /// Data did not verify (checksum mismatch).
    Corrupt,
    /// A bug in ferry: something that should not happen did.
    Internal,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 12] = [
        Self::InvalidInput,
        Self::NotFound,
        Self::PermissionDenied,
        Self::Unsupported,
        Self::Io,
        Self::Protocol,
        Self::Timeout,
        Self::Disconnected,
        Self::NoSpace,
        Self::Cancelled,
        Self::Corrupt,
        Self::Internal,
    ];

    /// The kind of a stable name ([`ErrorKind::as_str`]), as records and replies carry it.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// A short stable name, used as a metric label and in JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidInput => "invalid_input",
            Self::NotFound => "not_found",
            Self::PermissionDenied => "permission_denied",
            Self::Unsupported => "unsupported",
            Self::Io => "io",
            Self::Protocol => "protocol",
            Self::Timeout => "timeout",
            Self::Disconnected => "disconnected",
            Self::NoSpace => "no_space",
            Self::Cancelled => "cancelled",
            Self::Corrupt => "corrupt",
            Self::Internal => "internal",
        }
    }

    /// Whether retrying the same operation later may succeed.
    pub fn is_transient(self) -> bool {
        matches!(self, Self::Timeout | Self::Disconnected)
    }

    /// Classifies an OS error.
    pub fn from_io(err: &std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        match err.kind() {
            K::NotFound => Self::NotFound,
            K::PermissionDenied => Self::PermissionDenied,
            K::TimedOut => Self::Timeout,
            K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::BrokenPipe
            | K::NotConnected
            | K::UnexpectedEof => Self::Disconnected,
            K::InvalidInput => Self::InvalidInput,
            K::Unsupported => Self::Unsupported,
            K::StorageFull => Self::NoSpace,
            _ if err.raw_os_error() == Some(28) => Self::NoSpace,
            _ => Self::Io,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an error happened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// The endpoint, as a redacted URL or path.
    pub endpoint: Option<String>,
    /// The operation (read, write, write_zeroes, flush, extents, open, ...).
    pub operation: Option<&'static str>,
    /// The byte offset of the request, where there was one.
    pub offset: Option<u64>,
}

/// An error of the data path.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    context: Context,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            context: Context::default(),
            source: None,
        }
    }

    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }

    pub fn protocol(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Protocol, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    pub fn cancelled() -> Self {
        Self::new(ErrorKind::Cancelled, "cancelled")
    }

    /// An OS error, classified by [`ErrorKind::from_io`], with a message saying what was attempted.
    pub fn io(message: impl Into<String>, err: std::io::Error) -> Self {
        Self::new(ErrorKind::from_io(&err), message).with_source(err)
    }

    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.context.endpoint.get_or_insert_with(|| endpoint.into());
        self
    }

    pub fn with_operation(mut self, operation: &'static str) -> Self {
        self.context.operation.get_or_insert(operation);
        self
    }

    pub fn with_offset(mut self, offset: u64) -> Self {
        self.context.offset.get_or_insert(offset);
        self
    }

    /// Sets operation and offset at once, the usual context of a failed request.
    pub fn at(self, operation: &'static str, offset: u64) -> Self {
        self.with_operation(operation).with_offset(offset)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn context(&self) -> &Context {
        &self.context
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Context {
            endpoint,
            operation,
            offset,
        } = &self.context;
        match (operation, offset) {
            (Some(op), Some(off)) => write!(f, "{op} at offset {off}")?,
            (Some(op), None) => write!(f, "{op}")?,
            (None, Some(off)) => write!(f, "at offset {off}")?,
            (None, None) => {}
        }
        if let Some(ep) = endpoint {
            if operation.is_some() || offset.is_some() {
                f.write_str(" ")?;
            }
            write!(f, "on {ep}")?;
        }
        if operation.is_some() || offset.is_some() || endpoint.is_some() {
            f.write_str(": ")?;
        }
        f.write_str(&self.message)?;
        if let Some(src) = &self.source {
            write!(f, ": {src}")?;
        }
        Ok(())
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_found_by_its_name() {
        for kind in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(ErrorKind::from_name("sometimes"), None);
    }

    #[test]
    fn display_names_operation_offset_endpoint_and_cause() {
        let err = Error::io("pwrite failed", std::io::Error::from_raw_os_error(5))
            .at("write", 4096)
            .with_endpoint("/tmp/x.img");
        let text = err.to_string();
        assert!(
            text.starts_with("write at offset 4096 on /tmp/x.img: pwrite failed: "),
            "{text}"
        );
        assert!(text.contains("Input/output error"), "{text}");
        assert_eq!(err.kind(), ErrorKind::Io);
    }

    #[test]
    fn first_context_wins() {
        let err = Error::protocol("bad reply").at("read", 1).at("write", 2);
        assert_eq!(err.context().operation, Some("read"));
        assert_eq!(err.context().offset, Some(1));
    }

    #[test]
    fn classifies_os_errors() {
        assert_eq!(
            ErrorKind::from_io(&std::io::Error::from_raw_os_error(28)),
            ErrorKind::NoSpace
        );
        assert_eq!(
            ErrorKind::from_io(&std::io::Error::from(std::io::ErrorKind::NotFound)),
            ErrorKind::NotFound
        );
        assert!(ErrorKind::Disconnected.is_transient());
        assert!(!ErrorKind::NotFound.is_transient());
    }
}
