//! HTTP failures as ferry errors: which status or transport failure means what, and
//! which of them are worth another attempt.

use std::error::Error as StdError;

use ferry_core::{Error, ErrorKind};
use http::StatusCode;

/// A failed attempt: the error, and whether another attempt may succeed.
#[derive(Debug)]
pub(super) struct Failure {
    pub error: Error,
    pub transient: bool,
}

impl Failure {
    pub fn fatal(error: Error) -> Self {
        Self {
            error,
            transient: false,
        }
    }

    pub fn transient(error: Error) -> Self {
        Self {
            error,
            transient: true,
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        let transient = error.kind().is_transient();
        Self { error, transient }
    }
}

pub(super) type Attempt<T> = std::result::Result<T, Failure>;

/// An answer that is not what was asked for. `url` is already redacted.
pub(super) fn status(code: StatusCode, url: &str) -> Failure {
    let reason = code.canonical_reason().unwrap_or("");
    let n = code.as_u16();
    match n {
        404 | 410 => Failure::fatal(Error::new(
            ErrorKind::NotFound,
            format!("no object at {url} (HTTP {n} {reason})"),
        )),
        401 | 403 | 407 => Failure::fatal(Error::new(
            ErrorKind::PermissionDenied,
            format!("the server refused the credentials (HTTP {n} {reason}): check the user and password, token or headers"),
        )),
        408 | 429 | 502 | 503 | 504 => Failure::transient(Error::new(
            ErrorKind::Disconnected,
            format!("the server is unavailable (HTTP {n} {reason})"),
        )),
        501 | 505 => Failure::fatal(Error::new(
            ErrorKind::Unsupported,
            format!("the server cannot answer this request (HTTP {n} {reason}): it does not support GET with ranges over HTTP/1.1"),
        )),
        500..=599 => Failure::transient(Error::new(
            ErrorKind::Io,
            format!("the server failed (HTTP {n} {reason})"),
        )),
        _ => Failure::fatal(Error::new(
            ErrorKind::Protocol,
            format!("unexpected answer HTTP {n} {reason}"),
        )),
    }
}

/// Whether a TLS error sits anywhere in the chain (an untrusted certificate, a failed
/// handshake), and its text.
fn tls_cause(err: &(dyn StdError + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(t) = e.downcast_ref::<rustls::Error>() {
            return Some(t.to_string());
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(t) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(t.to_string());
            }
        }
        cur = e.source();
    }
    None
}

/// The causes of an error, joined, for a message.
fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut cur = err.source();
    while let Some(e) = cur {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = e.source();
    }
    parts.join(": ")
}

/// A request that got no answer: TLS trouble is final (retrying will not make the
/// certificate trusted), connection trouble is transient.
pub(super) fn transport(err: hyper_util::client::legacy::Error, host: &str) -> Failure {
    // The connector boxes its errors, so the rustls error is not always reachable by type:
    // its text says it too.
    let text = chain(&err);
    let tls = tls_cause(&err).or_else(|| {
        [
            "peer certificate",
            "certificate verify",
            "tls handshake",
            "received fatal alert",
        ]
        .iter()
        .any(|m| text.to_ascii_lowercase().contains(m))
        .then(|| text.clone())
    });
    if let Some(tls) = tls {
        return Failure::fatal(Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "TLS with {host} failed: {tls} (a private CA is given with FERRY_HTTP_CA_FILE, or the job's HTTP options)"
            ),
        ));
    }
    let what = if err.is_connect() {
        format!("cannot connect to {host}")
    } else {
        format!("the request to {host} failed")
    };
    Failure::transient(Error::new(
        ErrorKind::Disconnected,
        format!("{what}: {text}"),
    ))
}

/// A body that broke off.
pub(super) fn body(err: hyper::Error, done: usize, len: usize) -> Failure {
    Failure::transient(Error::new(
        ErrorKind::Disconnected,
        format!(
            "the response body broke off after {done} of {len} bytes: {}",
            chain(&err)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: u16) -> Failure {
        status(StatusCode::from_u16(code).unwrap(), "http://host/disk.img")
    }

    #[test]
    fn only_answers_that_may_change_are_retried() {
        for code in [408, 429, 500, 502, 503, 504, 507] {
            assert!(answer(code).transient, "{code}");
        }
        for code in [401, 403, 404, 410, 416, 501, 505] {
            assert!(!answer(code).transient, "{code}");
        }
        assert_eq!(answer(404).error.kind(), ErrorKind::NotFound);
        assert_eq!(answer(501).error.kind(), ErrorKind::Unsupported);
    }
}
