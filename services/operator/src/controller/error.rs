//! Why a reconcile step could not finish; the controller logs it and retries the
//! resource after a backoff (see [`super::error_policy`]).

use crate::mover::MoverError;

use super::link::LinkError;

/// A reconcile step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the Kubernetes API failed.
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// The mover pod or a job request could not be built.
    #[error(transparent)]
    Mover(#[from] MoverError),
    /// The mover could not be asked.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The resource was not read from the API (no namespace, name or uid).
    #[error("the {0} has no namespace, name or uid")]
    NotStored(&'static str),
    /// A certificate of the movers' mutual TLS could not be made or read.
    #[error(transparent)]
    Tls(#[from] crate::mover::tls::TlsError),
    /// The movers' CA Secret is unusable.
    #[error("secret {0} (the movers' CA) lacks ca.crt or ca.key: delete it so the operator makes a new CA")]
    BadCa(String),
    /// The mover's token Secret has no token.
    #[error("secret {0} has no token: delete it so the operator writes a new one")]
    NoToken(String),
}

/// What the API server (or the way to it) said of a refused request, for a status or an
/// event: `403 message` for the server's own Status, the error's text otherwise.
pub fn api_text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} {}", status.code, status.message),
        other => other.to_string(),
    }
}
