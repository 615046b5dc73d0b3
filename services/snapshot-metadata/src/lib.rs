//! A client of the Kubernetes CSI SnapshotMetadata service (KEP-3314, changed-block
//! tracking): which ranges of a volume snapshot hold data (`GetMetadataAllocated`), and
//! which changed between two snapshots of one volume (`GetMetadataDelta`).
//!
//! The service is the external-snapshot-metadata sidecar in front of a CSI driver (ceph-csi
//! RBD, vSphere, csi-driver-host-path). Its `SnapshotMetadataService` object gives the
//! address, the CA certificate and the audience; the caller sends a ServiceAccount token
//! minted for that audience in every request's `security_token`, over TLS.
//!
//! A backup trusts these ranges to skip reading everything else, so nothing the service
//! says is believed before it is checked ([`validate`]): extents must be strictly
//! increasing, must not overlap, must lie within the volume's capacity and be non-empty,
//! and their number (after adjacent ones are joined) is bounded. An interrupted stream is
//! resumed from the end of the last extent received (`starting_offset`), a bounded number
//! of times. The token never appears in an error, a log line or a `Debug` output.
//!
//! This crate knows nothing of ferry: it could be published alone.

#![forbid(unsafe_code)]

mod client;
mod error;
mod token;
pub mod validate;

/// The types and stubs generated from the upstream `proto/schema.proto` (package
/// `snapshotmetadata`).
#[allow(missing_debug_implementations, clippy::all)]
pub mod proto {
    tonic::include_proto!("snapshotmetadata");
}

pub use client::{Client, ClientConfig, DEFAULT_MAX_EXTENTS, DEFAULT_RESUMES};
pub use error::{Error, Result};
pub use token::SecurityToken;
pub use validate::{BlockStyle, Ranges};
