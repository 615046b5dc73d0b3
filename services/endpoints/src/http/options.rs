//! [`HttpOptions`]: how to reach an HTTP(S) source (authentication, headers, TLS, timeouts,
//! retries), the part of a job that is not in the URL.

use std::time::Duration;

use ferry_core::Secret;

/// Default time allowed to set up a TCP (and TLS) connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time a response may stay silent (before its headers, or between body bytes).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Default attempts per request (the first one included).
pub const DEFAULT_ATTEMPTS: u32 = 5;
/// Default delay before the first retry; it doubles per retry up to [`MAX_RETRY_DELAY`].
pub const DEFAULT_RETRY_BASE: Duration = Duration::from_millis(200);
/// Longest delay between two attempts.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// Settings of an HTTP(S) source. Secrets show as `***` in `Debug`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpOptions {
    /// Basic authentication user (with [`HttpOptions::password`]).
    pub user: Option<String>,
    pub password: Option<Secret>,
    /// `Authorization: Bearer TOKEN` (instead of basic authentication).
    pub bearer_token: Option<Secret>,
    /// Extra request headers (`name`, value). Values may be credentials: they are never
    /// printed, and like the authentication they are sent only to the URL's own origin.
    pub headers: Vec<(String, Secret)>,
    /// Extra trusted CA certificates (PEM), beside the system's.
    pub ca_pem: Option<String>,
    /// A client certificate chain (PEM) and its private key (PEM), for servers that ask
    /// for one.
    pub client_cert_pem: Option<String>,
    pub client_key_pem: Option<Secret>,
    /// Time allowed to connect (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub connect_timeout: Option<Duration>,
    /// Time a response may stay silent (default [`DEFAULT_READ_TIMEOUT`]).
    pub read_timeout: Option<Duration>,
    /// Attempts per request (default [`DEFAULT_ATTEMPTS`]; at least 1).
    pub attempts: Option<u32>,
    /// Delay before the first retry (default [`DEFAULT_RETRY_BASE`]).
    pub retry_base: Option<Duration>,
    /// The object version ([`super::Validator::token`]) a resumed job started from: the
    /// source fails to open when the object changed since.
    pub expect_version: Option<String>,
}

impl HttpOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Basic authentication.
    pub fn with_basic_auth(mut self, user: impl Into<String>, password: Secret) -> Self {
        self.user = Some(user.into());
        self.password = Some(password);
        self
    }

    /// Bearer token authentication.
    pub fn with_bearer_token(mut self, token: Secret) -> Self {
        self.bearer_token = Some(token);
        self
    }

    /// Adds a request header.
    pub fn with_header(mut self, name: impl Into<String>, value: Secret) -> Self {
        self.headers.push((name.into(), value));
        self
    }

    /// Trusts the CA certificates in `pem` (beside the system's).
    pub fn with_ca_pem(mut self, pem: impl Into<String>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Presents a client certificate.
    pub fn with_client_cert(mut self, cert_pem: impl Into<String>, key_pem: Secret) -> Self {
        self.client_cert_pem = Some(cert_pem.into());
        self.client_key_pem = Some(key_pem);
        self
    }

    /// Sets the connect and read timeouts.
    pub fn with_timeouts(mut self, connect: Duration, read: Duration) -> Self {
        self.connect_timeout = Some(connect);
        self.read_timeout = Some(read);
        self
    }

    /// Sets the attempts per request and the first retry delay.
    pub fn with_retries(mut self, attempts: u32, base: Duration) -> Self {
        self.attempts = Some(attempts);
        self.retry_base = Some(base);
        self
    }

    /// Requires the object to still be at `version` (a resumed job).
    pub fn with_expect_version(mut self, version: impl Into<String>) -> Self {
        self.expect_version = Some(version.into());
        self
    }

    pub(super) fn connect_timeout(&self) -> Duration {
        self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT)
    }

    pub(super) fn read_timeout(&self) -> Duration {
        self.read_timeout.unwrap_or(DEFAULT_READ_TIMEOUT)
    }

    pub(super) fn attempts(&self) -> u32 {
        self.attempts.unwrap_or(DEFAULT_ATTEMPTS).max(1)
    }

    pub(super) fn retry_base(&self) -> Duration {
        self.retry_base.unwrap_or(DEFAULT_RETRY_BASE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_secrets() {
        let o = HttpOptions::new()
            .with_basic_auth("alice", Secret::new("pw-hunter2"))
            .with_bearer_token(Secret::new("tok-abc"))
            .with_header("X-Api-Key", Secret::new("key-xyz"))
            .with_client_cert("CERT", Secret::new("PRIVATE-KEY-PEM"));
        let text = format!("{o:?} {o:#?}");
        for s in ["pw-hunter2", "tok-abc", "key-xyz", "PRIVATE-KEY-PEM"] {
            assert!(!text.contains(s), "{s} in {text}");
        }
        assert!(
            text.contains("alice") && text.contains("X-Api-Key"),
            "{text}"
        );
    }
}
