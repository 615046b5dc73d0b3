//! ferry-testkit: test support shared by every ferry crate's tests, and never shipped in
//! a product crate (`publish = false`, a dev-dependency only).
//!
//! - [`MemSource`] and [`RecordingTarget`]: in-memory endpoints. The source reports
//!   extents like a sparse file and records its reads; the target records every write and
//!   zero run, tracks what a flush made durable, and injects faults and delays. Engine
//!   tests compare what a copy did exactly, as nbdcopy's tests do.
//! - [`conformance`]: one suite of rules every endpoint's [`Source`](ferry_core::Source)
//!   and [`Target`](ferry_core::Target) must follow, run against each real endpoint
//!   (tests/tests/conformance.rs), with [`BackedFixture`] to open targets and read them
//!   back.
//! - [`files`]: scratch directories that keep holes, sparse images, loop devices.
//! - [`CountingSource`]: counts the bytes read through a real source (backup tests).
//! - [`promql`]: the metric names a Grafana dashboard's queries use (dashboard tests).
//! - [`pod_security`]: the Pod Security Standard `restricted` as a check of a pod's JSON
//!   (the operator's pods).
//! - `kube` (feature `kube`): a stateful stand-in for the Kubernetes API server, a
//!   `kube::Client` over it, RBAC from manifest files, and simulated controllers (PVC
//!   binding, a scheduler, attach/detach and a kubelet). Only the operator's tests turn the
//!   feature on, so the other crates' tests do not build kube.
//! - `snapshot_metadata` (feature `snapshot-metadata`): a stand-in of the CSI
//!   SnapshotMetadata sidecar over TLS, answering from real snapshot files, with faults.
//!
//! It depends on ferry-core only, so the engine and the endpoints can use it as a
//! dev-dependency without a cycle. Its checks panic, as test assertions do.

pub mod conformance;
mod counting;
pub mod files;
mod fixture;
mod gauge;
#[cfg(feature = "kube")]
pub mod kube;
pub mod pod_security;
pub mod promql;
#[cfg(feature = "snapshot-metadata")]
pub mod snapshot_metadata;
mod source;
mod target;

pub use counting::CountingSource;
pub use fixture::{BackedFixture, Opening};
pub use gauge::Gauge;
pub use source::{MemSource, SourceStats};
pub use target::{Op, RecordingTarget, TargetLog, GARBAGE};

use ferry_core::{Error, Result};

/// Refuses `[offset, offset + len)` unless it lies within `size` bytes.
fn check_range(what: &'static str, offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::invalid_input(format!(
            "{len} bytes at {offset} reach past the end of a {size}-byte image"
        ))
        .at(what, offset)),
    }
}
