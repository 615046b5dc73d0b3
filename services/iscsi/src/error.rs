//! The initiator's one error type: what went wrong, named so a user can act on it.

use std::io;

use crate::scsi::Sense;

/// Errors of the iSCSI initiator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot connect to {address}: {source}")]
    Connect { address: String, source: io::Error },
    #[error("I/O error {context}: {source}")]
    Io {
        context: &'static str,
        source: io::Error,
    },
    #[error("the target closed the connection ({0})")]
    Disconnected(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("login failed: {0}")]
    Login(String),
    #[error("authentication failed: {0}")]
    AuthFailed(String),
    #[error("target not found: {0}")]
    TargetNotFound(String),
    #[error("SCSI command failed: {0}")]
    CheckCondition(Sense),
    #[error("SCSI command failed with status {name} (0x{status:02x})")]
    Status { status: u8, name: &'static str },
    #[error("the target could not execute the command (iSCSI response 0x{0:02x})")]
    TargetFailure(u8),
    #[error("the target rejected a PDU (reason 0x{0:02x})")]
    Rejected(u8),
    #[error("{operation} timed out after {seconds} s")]
    Timeout {
        operation: &'static str,
        seconds: u64,
    },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("the session is closed")]
    Closed,
}

impl Error {
    pub(crate) fn io(context: &'static str, source: io::Error) -> Self {
        if matches!(
            source.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionAborted
        ) {
            Self::Disconnected(format!("{context}: {source}"))
        } else {
            Self::Io { context, source }
        }
    }

    /// The sense data of a CHECK CONDITION, if this is one.
    pub fn sense(&self) -> Option<&Sense> {
        match self {
            Self::CheckCondition(s) => Some(s),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
