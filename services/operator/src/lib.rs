//! ferry-operator: ferry on Kubernetes.
//!
//! **Custom resources** (group `ferry.dev`, version `v1alpha1`, namespaced, status
//! subresource), defined in [`crd`] as Rust types from which the CRDs are generated
//! (`ferry operator crds`, deploy/crds.yaml):
//! - `Transfer` (`ft`): copy a source (a URL with typed options, or a PVC) into 1..=64
//!   targets (URLs, existing PVCs, or PVCs created from a `pvcTemplate`), with the options
//!   of the gRPC API's `TransferOptions` and an optional `expectedDigest`. Status: phase,
//!   progress in bytes, per-target status, digests, Ready/Running conditions with reasons,
//!   times, attempts, mover pod and node, a message saying what to fix, and a checkpoint
//!   of committed ranges that survives the mover pod.
//! - `Checksum` (`fcs`): the digest of a URL or a PVC.
//! - `VolumeImageSource` (`vis`): the volume populator's data source; a PVC whose
//!   `dataSourceRef` names one is created holding the image.
//! - `BackupRepository` (`fbr`): a deduplicating backup repository (an S3 prefix or a
//!   directory in a claim), its credentials and encryption key by Secret reference.
//! - `Backup` (`fbk`): one backup of a claim into a repository, and a prune after it when
//!   `retain` is set; deleting it keeps the snapshot.
//! - `BackupSchedule` (`fbs`): a Backup per cron fire (from the claim or a VolumeSnapshot
//!   of it), never overlapping, pruned by `retain` ([`schedule`]).
//!
//! Credentials appear only as references to a key of a Secret in the resource's
//! namespace; every spec has a `validate()` for what the schema cannot express.
//!
//! **Movers** ([`mover`]): each Transfer or Checksum runs in a mover pod built by a pure
//! function from the resource, the resolved PVCs and the operator's defaults. The pod runs
//! `ferry serve` with the PVCs attached (Filesystem volumes mounted under
//! `/var/run/ferry/volumes/<pvc>`, Block volumes as devices at `/dev/ferry/<pvc>`), the
//! referenced Secret keys projected read-only under `/var/run/ferry/secrets`, and a
//! per-mover bearer token; the operator sends it the job over gRPC as a ferry-api request
//! (built here by pure functions, [`mover::request`] and [`mover::backup_request`]) and
//! reads progress back from the job stream ([`controller::GrpcMoverLink`]), never from
//! logs. Kubernetes picks the node; the pod runs non-root wherever the volumes
//! allow, with no privilege.
//!
//! **Reconcilers** ([`controller`]): one state machine for Transfers, Checksums and Backups (finalizer, spec
//! check, claims, mover limits, the mover pod per attempt, jobs started through the
//! [`controller::MoverLink`] trait and followed from the job stream, resume from the
//! status checkpoint after a lost mover, cancel on deletion), and [`controller::run`],
//! which builds both kube-runtime controllers.
//!
//! **Volume populator** ([`populator`]): claims naming a `VolumeImageSource` in
//! `dataSourceRef` are filled through a prime claim and a Transfer, whose volume is then
//! rebound to them; [`populator::run`] runs beside [`controller::run`].
//!
//! **Leader election** ([`leader`]): one replica at a time runs the controllers, through
//! a coordination.k8s.io Lease. **Metrics** ([`metrics`]): the operator's Prometheus
//! metrics, counted by the reconcilers and sampled from the watched stores.

#![forbid(unsafe_code)]

pub mod admission;
pub mod class_defaults;
pub mod clone;
pub mod controller;
pub mod crd;
pub mod events;
pub mod fanout;
pub mod golden;
pub mod leader;
pub mod metrics;
pub mod mover;
pub mod populator;
pub mod render;
pub mod schedule;
