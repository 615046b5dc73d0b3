//! The client's one error type, with a small [`ErrorKind`] that says what kind of failure
//! it is and a [`Cause`] for the common ones a user can act on.
//!
//! Transport failures are [`RpcError`]s (in `rpc.rs`), malformed XDR an [`XdrError`]
//! (in `xdr.rs`); both reach callers inside an [`Error`]. Messages name what failed; the
//! advice a user sees ("set uid= in the URL", "use version=3") is worded by the caller,
//! which knows the URL, from [`Error::cause`].

use std::io;

use crate::rpc::RpcError;
use crate::v3::proto::NfsStat;
use crate::v4::ops::Status;
use crate::xdr::XdrError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure an [`Error`] is: decides retries and how a caller reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request or the path is wrong (not a directory, a bad name, too large).
    InvalidInput,
    /// The host, export, directory or file does not exist (or its handle went stale).
    NotFound,
    /// The server refused access.
    PermissionDenied,
    /// The server lacks a program, version, procedure or operation.
    Unsupported,
    /// The server reported an I/O error.
    Io,
    /// The server broke the protocol (a malformed or unexpected reply).
    Protocol,
    /// No answer in time, or the server stayed busy.
    Timeout,
    /// The connection was lost or refused, or the server lost this client's session.
    Disconnected,
    /// No space (or quota) left on the server.
    NoSpace,
}

/// The common failures a user can do something about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The file handle is stale: the file was removed or replaced, or the export changed.
    Stale,
    /// Permission denied for the credentials sent.
    AccessDenied,
    /// The export is read-only.
    ReadOnly,
    /// The export does not accept AUTH_SYS.
    WrongSecurity,
    /// The server speaks neither NFSv4.2 nor NFSv4.1.
    NoMinorVersion,
    /// The server does not serve NFSv4 at all.
    NoNfs4,
    /// The server lost this client's session or open state and it could not be recovered.
    SessionLost,
}

/// Everything that can go wrong talking to an NFS server.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The call `op` got no usable reply.
    #[error("{op}: {source}")]
    Rpc {
        op: &'static str,
        #[source]
        source: RpcError,
    },
    /// An RPC failure while finding the file, with what was being done.
    #[error("cannot {doing}")]
    Transport {
        doing: String,
        #[source]
        source: RpcError,
    },
    /// An NFSv3 (or MOUNT) procedure failed with `status`.
    #[error("{op}: the server replied {status}")]
    Nfs3 { op: &'static str, status: NfsStat },
    /// Operation `op` of an NFSv4 COMPOUND failed with `status`.
    #[error("{op} failed: the server replied {status}")]
    Nfs4 {
        op: &'static str,
        /// Position of the failed operation in its COMPOUND (SEQUENCE is 0).
        index: usize,
        status: Status,
    },
    /// The reply to `op` does not decode.
    #[error("{op}: malformed reply: {message}")]
    Malformed { op: &'static str, message: String },
    #[error("the server no longer knows this client's session or open state ({status}): it restarted, or the lease expired; open the file again")]
    SessionLost { status: Status },
    #[error("the server no longer knows this client's session or open state ({status}: it restarted, or the lease expired) and recovering it failed: {source}")]
    RecoveryFailed {
        status: Status,
        #[source]
        source: Box<Error>,
    },
    /// A request made while finding the file failed: what was being done, and why.
    #[error("cannot {doing}")]
    Open {
        doing: String,
        #[source]
        source: Box<Error>,
    },
    /// The host name does not resolve.
    #[error("{message}")]
    Resolve {
        message: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    InvalidInput(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    Protocol(String),
    #[error("{0}")]
    Timeout(String),
}

impl Error {
    pub(crate) fn malformed(op: &'static str, e: XdrError) -> Self {
        Self::Malformed { op, message: e.0 }
    }

    /// The NFSv3 status the server replied, if this is one.
    pub fn nfs3_status(&self) -> Option<NfsStat> {
        match self {
            Self::Nfs3 { status, .. } => Some(*status),
            Self::Open { source, .. } => source.nfs3_status(),
            _ => None,
        }
    }

    /// The NFSv4 status behind this failure, if there is one.
    pub fn nfs4_status(&self) -> Option<Status> {
        match self {
            Self::Nfs4 { status, .. } | Self::SessionLost { status } => Some(*status),
            Self::RecoveryFailed { status, source } => source.nfs4_status().or(Some(*status)),
            Self::Open { source, .. } => source.nfs4_status(),
            _ => None,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Rpc { source, .. } | Self::Transport { source, .. } => source.kind(),
            Self::Nfs3 { status, .. } => status.kind(),
            Self::Nfs4 { status, .. } => status.kind(),
            Self::Malformed { .. } | Self::Protocol(_) => ErrorKind::Protocol,
            Self::SessionLost { .. } => ErrorKind::Disconnected,
            Self::RecoveryFailed { source, .. } => match source.nfs4_status() {
                Some(s) if !s.is_session_loss() => s.kind(),
                _ => ErrorKind::Disconnected,
            },
            Self::Open { source, .. } => source.kind(),
            Self::Resolve { source, .. } => io_kind(source),
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::InvalidInput(_) => ErrorKind::InvalidInput,
            Self::Unsupported(_) => ErrorKind::Unsupported,
            Self::PermissionDenied(_) => ErrorKind::PermissionDenied,
            Self::Timeout(_) => ErrorKind::Timeout,
        }
    }

    /// The common failure this is, for advice: by status first, then by what failed.
    pub fn cause(&self) -> Option<Cause> {
        if let Some(s) = self.nfs3_status() {
            return match s {
                NfsStat::STALE | NfsStat::BADHANDLE => Some(Cause::Stale),
                NfsStat::PERM | NfsStat::ACCES => Some(Cause::AccessDenied),
                NfsStat::ROFS => Some(Cause::ReadOnly),
                _ => None,
            };
        }
        let by_status = match self.nfs4_status() {
            Some(Status::STALE | Status::BADHANDLE | Status::FHEXPIRED) => Some(Cause::Stale),
            Some(Status::PERM | Status::ACCESS) => Some(Cause::AccessDenied),
            Some(Status::ROFS) => Some(Cause::ReadOnly),
            Some(Status::WRONGSEC) => Some(Cause::WrongSecurity),
            Some(Status::MINOR_VERS_MISMATCH) => Some(Cause::NoMinorVersion),
            _ => None,
        };
        by_status.or_else(|| match self {
            Self::SessionLost { .. } | Self::RecoveryFailed { .. } => Some(Cause::SessionLost),
            Self::Rpc { source, .. } | Self::Transport { source, .. }
                if source.is_missing_version(crate::v4::ops::NFS4_VERSION) =>
            {
                Some(Cause::NoNfs4)
            }
            Self::Open { source, .. } => source.cause(),
            _ => None,
        })
    }
}

/// The kind of an OS error.
pub(crate) fn io_kind(e: &io::Error) -> ErrorKind {
    use io::ErrorKind as K;
    match e.kind() {
        K::NotFound => ErrorKind::NotFound,
        K::PermissionDenied => ErrorKind::PermissionDenied,
        K::TimedOut => ErrorKind::Timeout,
        K::ConnectionRefused
        | K::ConnectionReset
        | K::ConnectionAborted
        | K::BrokenPipe
        | K::NotConnected
        | K::UnexpectedEof => ErrorKind::Disconnected,
        K::InvalidInput => ErrorKind::InvalidInput,
        K::Unsupported => ErrorKind::Unsupported,
        K::StorageFull => ErrorKind::NoSpace,
        _ if e.raw_os_error() == Some(ENOSPC) => ErrorKind::NoSpace,
        _ => ErrorKind::Io,
    }
}

/// ENOSPC on Linux, for errors std does not classify as StorageFull.
const ENOSPC: i32 = 28;

/// The kind of a failed connect: a peer that cannot be reached is Disconnected.
pub(crate) fn connect_kind(e: &io::Error) -> ErrorKind {
    match io_kind(e) {
        ErrorKind::Io | ErrorKind::NotFound => ErrorKind::Disconnected,
        k => k,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_causes_follow_the_status() {
        let e = Error::Nfs3 {
            op: "READ",
            status: NfsStat::STALE,
        };
        assert_eq!(
            (e.kind(), e.cause()),
            (ErrorKind::NotFound, Some(Cause::Stale))
        );
        let e = Error::Open {
            doing: "look up /x".into(),
            source: Box::new(Error::Nfs4 {
                op: "LOOKUP",
                index: 2,
                status: Status::WRONGSEC,
            }),
        };
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert_eq!(e.cause(), Some(Cause::WrongSecurity));
        assert_eq!(e.to_string(), "cannot look up /x");
        let e = Error::RecoveryFailed {
            status: Status::BADSESSION,
            source: Box::new(Error::Nfs4 {
                op: "OPEN",
                index: 1,
                status: Status::STALE,
            }),
        };
        assert_eq!(
            (e.kind(), e.cause()),
            (ErrorKind::NotFound, Some(Cause::Stale))
        );
        let e = Error::SessionLost {
            status: Status::BADSESSION,
        };
        assert_eq!(
            (e.kind(), e.cause()),
            (ErrorKind::Disconnected, Some(Cause::SessionLost))
        );
    }

    #[test]
    fn a_missing_nfs4_program_is_its_own_cause() {
        let addr = "127.0.0.1:2049".parse().unwrap();
        let e = Error::Rpc {
            op: "EXCHANGE_ID",
            source: RpcError::ProgramUnavailable {
                addr,
                program: 100_003,
                version: 4,
            },
        };
        assert_eq!(
            (e.kind(), e.cause()),
            (ErrorKind::Unsupported, Some(Cause::NoNfs4))
        );
        let e = Error::Rpc {
            op: "READ",
            source: RpcError::ProgramUnavailable {
                addr,
                program: 100_003,
                version: 3,
            },
        };
        assert_eq!(
            e.cause(),
            None,
            "NFSv3 missing is not advice to use version=3"
        );
    }
}
