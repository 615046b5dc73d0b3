//! Movers: the pods that move the bytes of a Transfer, a Checksum, a Backup or a Restore.
//!
//! A mover is one pod running `ferry serve` with the resource's claims attached; the
//! operator sends it the job over gRPC as a ferry-api request ([`request`],
//! [`backup_request`]; endpoints by [`endpoint`], option values by [`wire`]) and follows
//! the job stream for progress, so nothing is read from logs. Building the pod and its
//! requests are pure functions of the resource, the resolved claims and the operator's
//! defaults ([`pod`]), so the reconciler only decides *when* to create one.

pub mod backup_request;
pub mod endpoint;
pub mod layout;
pub mod network_policy;
pub mod placement;
pub mod pod;
pub mod request;
pub mod resources;
pub mod tls;
pub mod wire;

use k8s_openapi::api::core::v1::Toleration;

use crate::crd::{ValidationError, VolumeMode};

pub use pod::{backup_pod, checksum_pod, restore_pod, transfer_pod, MoverDefaults, MoverPodInput};
pub use request::{checksum_request, transfer_request};
pub use resources::MoverResources;

/// A claim the reconciler looked up (or will create from a template), with the volume
/// mode that decides how the mover attaches it.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedPvc {
    /// The claim's name.
    pub name: String,
    /// Filesystem (mounted; the image is a file) or Block (a device; the image itself).
    pub mode: VolumeMode,
    /// The pod using the claim, when it is in use and attaches to one node at a time: the
    /// mover must run on that pod's node.
    pub in_use: Option<InUse>,
}

impl ResolvedPvc {
    /// A resolved claim no pod uses.
    pub fn new(name: impl Into<String>, mode: VolumeMode) -> Self {
        Self {
            name: name.into(),
            mode,
            in_use: None,
        }
    }
}

/// A pod using a claim that attaches to one node at a time.
#[derive(Debug, Clone, PartialEq)]
pub struct InUse {
    /// The pod's name.
    pub pod: String,
    /// Its node.
    pub node: String,
    /// Its tolerations, which a mover on the same node needs as well.
    pub tolerations: Vec<Toleration>,
    /// Whether it mounts the claim writable (it is not one of ferry's movers).
    pub writes: bool,
}

/// Why a mover pod or request cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoverError {
    /// The spec cannot run as written.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The resource has no namespace, name or uid yet (it was not read from the API).
    #[error("the {0} has no namespace, name or uid: build movers only for stored resources")]
    NotStored(&'static str),
    /// Claims in use on different nodes: no one mover can attach them all.
    #[error("{0}")]
    Apart(String),
    /// A claim the spec names was not resolved by the caller.
    #[error(
        "pvc/{0} was not resolved: look the claim up (or create it) before building the mover"
    )]
    UnresolvedPvc(String),
}

/// The resolved claim named `name`.
pub fn find_pvc<'a>(pvcs: &'a [ResolvedPvc], name: &str) -> Result<&'a ResolvedPvc, MoverError> {
    pvcs.iter()
        .find(|p| p.name == name)
        .ok_or_else(|| MoverError::UnresolvedPvc(name.to_string()))
}
