//! The client's error type.
//!
//! Errors are `Clone` because one broken connection fails every request in flight with
//! the same cause, and later requests must still say why the connection is gone.

use std::sync::Arc;
use std::time::Duration;

use crate::proto;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error reported by the server for one request (an NBD error value and, with
/// structured replies, a message and the offset where it happened).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// The NBD error value (NBD_EIO, NBD_ENOSPC, ...).
    pub errno: u32,
    /// The server's human-readable message, if it sent one.
    pub message: Option<String>,
    /// The offset the server named (NBD_REPLY_TYPE_ERROR_OFFSET).
    pub offset: Option<u64>,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "server error {} ({})",
            proto::errno_name(self.errno),
            self.errno
        )?;
        if let Some(offset) = self.offset {
            write!(f, " at offset {offset}")?;
        }
        if let Some(message) = self.message.as_deref().filter(|m| !m.is_empty()) {
            write!(f, ": {message}")?;
        }
        Ok(())
    }
}

/// Everything that can go wrong talking to an NBD server.
#[non_exhaustive]
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The connection could not be made (refused, no such host or socket).
    #[error("cannot connect to {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The socket failed while the connection was up.
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The server closed the connection.
    #[error("server closed the connection {0}")]
    Disconnected(String),
    /// The server broke the protocol; the connection is dropped.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server answered a request with an error.
    #[error("{0}")]
    Server(ServerError),
    /// The export does not exist on the server.
    #[error("no such export '{export}'; {}", describe_exports(.available))]
    ExportNotFound {
        export: String,
        /// What NBD_OPT_LIST returned, if the server lists its exports.
        available: Option<Vec<String>>,
    },
    /// The server refused an option during the handshake.
    #[error("server refused {} with {}{}", proto::option_name(*.option), proto::reply_name(*.reply), fmt_message(.message))]
    OptionRefused {
        option: u32,
        reply: u32,
        message: Option<String>,
    },
    /// The server needs TLS and the client was not asked to use it.
    #[error("the server requires TLS: connect with nbds:// (and tls-certificates=DIR){}", fmt_message(.0))]
    TlsRequired(Option<String>),
    /// TLS was required but failed (server cannot do TLS, bad certificate, ...).
    #[error("TLS: {0}")]
    Tls(String),
    /// The TLS configuration (certificates, keys) is unusable.
    #[error("TLS configuration: {0}")]
    TlsConfig(String),
    /// No answer in time.
    #[error("{what} timed out after {after:?}")]
    Timeout { what: &'static str, after: Duration },
    /// The request breaks a rule the server announced (alignment, size, read-only) or
    /// the client's own configuration.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The server does not offer what was asked (for example NBD_CMD_FLUSH).
    #[error("not supported by the server: {0}")]
    Unsupported(String),
    /// The connection was closed by this client.
    #[error("connection closed by the client")]
    Closed,
}

fn fmt_message(message: &Option<String>) -> String {
    match message.as_deref() {
        Some(m) if !m.is_empty() => format!(": {m}"),
        _ => String::new(),
    }
}

fn describe_exports(available: &Option<Vec<String>>) -> String {
    match available {
        None => "the server does not list its exports".to_string(),
        Some(list) if list.is_empty() => "the server lists no exports".to_string(),
        Some(list) => {
            const SHOWN: usize = 20;
            let mut names: Vec<String> =
                list.iter().take(SHOWN).map(|n| format!("'{n}'")).collect();
            if list.len() > SHOWN {
                names.push(format!("and {} more", list.len() - SHOWN));
            }
            format!("the server has: {}", names.join(", "))
        }
    }
}

impl Error {
    pub(crate) fn io(context: &'static str, err: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        match err.kind() {
            K::UnexpectedEof | K::ConnectionReset | K::BrokenPipe | K::ConnectionAborted => {
                Self::Disconnected(format!("({context}: {err})"))
            }
            _ => Self::Io {
                context,
                source: Arc::new(err),
            },
        }
    }

    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        Self::Protocol(message.into())
    }

    /// The server's error, if this is one.
    pub fn server_error(&self) -> Option<&ServerError> {
        match self {
            Self::Server(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_went_wrong() {
        let e = Error::ExportNotFound {
            export: "nope".into(),
            available: Some(vec!["a".into(), "b".into()]),
        };
        assert_eq!(
            e.to_string(),
            "no such export 'nope'; the server has: 'a', 'b'"
        );
        let e = Error::Server(ServerError {
            errno: proto::EIO,
            message: Some("disk on fire".into()),
            offset: Some(4096),
        });
        assert_eq!(
            e.to_string(),
            "server error EIO (5) at offset 4096: disk on fire"
        );
        let e = Error::OptionRefused {
            option: proto::OPT_GO,
            reply: proto::REP_ERR_POLICY,
            message: None,
        };
        assert_eq!(
            e.to_string(),
            "server refused NBD_OPT_GO with NBD_REP_ERR_POLICY"
        );
        let e = Error::io(
            "reading reply",
            std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
        );
        assert!(matches!(e, Error::Disconnected(_)), "{e:?}");
    }
}
