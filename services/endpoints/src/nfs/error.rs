//! ferry-nfs errors as ferry errors: the one place that words the advice users see
//! (uid/gid, stale handles, read-only exports, NFS versions, lost sessions).

use std::time::Duration;

use ferry_core::{Error, ErrorKind};
use ferry_nfs::{Cause, ClientConfig};

/// The ferry error kind of a ferry-nfs error kind.
pub(super) fn kind(kind: ferry_nfs::ErrorKind) -> ErrorKind {
    use ferry_nfs::ErrorKind as K;
    match kind {
        K::InvalidInput => ErrorKind::InvalidInput,
        K::NotFound => ErrorKind::NotFound,
        K::PermissionDenied => ErrorKind::PermissionDenied,
        K::Unsupported => ErrorKind::Unsupported,
        K::Io => ErrorKind::Io,
        K::Protocol => ErrorKind::Protocol,
        K::Timeout => ErrorKind::Timeout,
        K::Disconnected => ErrorKind::Disconnected,
        K::NoSpace => ErrorKind::NoSpace,
    }
}

/// Advice for a failure while opening, in parentheses after "cannot ...".
fn open_advice(e: &ferry_nfs::Error, config: &ClientConfig) -> String {
    match e.cause() {
        Some(Cause::AccessDenied) => format!(
            " (permission denied for uid {} gid {}: set uid= and gid= in the URL or fix the file's permissions)",
            config.rpc.uid, config.rpc.gid
        ),
        Some(Cause::Stale) => {
            " (stale file handle: the file was removed or replaced on the server, or the export changed)".into()
        }
        Some(Cause::ReadOnly) => " (the export is read-only)".into(),
        Some(Cause::WrongSecurity) => {
            " (the export does not allow AUTH_SYS: ferry speaks only AUTH_SYS)".into()
        }
        Some(Cause::NoMinorVersion) => {
            " (the server speaks neither NFSv4.2 nor NFSv4.1; use version=3)".into()
        }
        Some(Cause::NoNfs4) => " (the server does not speak NFSv4; use version=3)".into(),
        Some(Cause::SessionLost) | None => String::new(),
    }
}

/// A failure while opening, as a ferry error (without context: callers add it).
pub(super) fn open_error(e: ferry_nfs::Error, config: &ClientConfig) -> Error {
    use ferry_nfs::Error as E;
    let k = kind(e.kind());
    match e {
        E::Open { doing, source } => {
            let advice = open_advice(&source, config);
            Error::new(k, format!("cannot {doing}{advice}")).with_source(*source)
        }
        E::Transport { doing, source } => {
            Error::new(k, format!("cannot {doing}")).with_source(source)
        }
        E::Resolve { message, source } => Error::io(message, source),
        E::NotFound(m)
        | E::InvalidInput(m)
        | E::Unsupported(m)
        | E::PermissionDenied(m)
        | E::Protocol(m)
        | E::Timeout(m) => Error::new(k, m),
        other => Error::new(k, other.to_string()),
    }
}

/// [`open_error`] of a request made while opening: "cannot {doing}" with advice.
pub(super) fn doing_error(e: ferry_nfs::Error, doing: &str, config: &ClientConfig) -> Error {
    open_error(
        ferry_nfs::Error::Open {
            doing: doing.to_string(),
            source: Box::new(e),
        },
        config,
    )
}

/// A failed request of an open file: "{protocol} request failed", advice, the cause.
pub(super) fn request_error(
    e: ferry_nfs::Error,
    protocol: &str,
    config: &ClientConfig,
    reconnect: Duration,
) -> Error {
    let k = kind(e.kind());
    let advice = match e.cause() {
        Some(Cause::Stale) => {
            ": stale file handle: the file was removed or replaced on the server, or the export changed"
                .to_string()
        }
        Some(Cause::AccessDenied) => format!(
            ": permission denied for uid {} gid {}",
            config.rpc.uid, config.rpc.gid
        ),
        Some(Cause::SessionLost) => {
            ": the server lost this client's session (restarted or expired it) and it could not be recovered".to_string()
        }
        _ if k == ErrorKind::Disconnected => {
            format!(" (no connection within the reconnect window of {reconnect:?})")
        }
        _ => String::new(),
    };
    Error::new(k, format!("{protocol} request failed{advice}")).with_source(e)
}
