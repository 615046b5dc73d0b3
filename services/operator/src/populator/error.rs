//! Why a populator reconcile could not finish; the controller logs it and looks at the
//! claim again after a backoff (see [`super::error_policy`]).

/// A populator step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the Kubernetes API failed.
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// The claim was not read from the API (no namespace, name or uid).
    #[error("the PersistentVolumeClaim has no namespace, name or uid")]
    NotStored,
}
