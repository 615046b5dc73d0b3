//! The operator's integration tests (reconciler scenarios against a mocked API server,
//! CRDs, manifests), one module per area, built as one test binary.

mod support;

mod backup;
mod clone;
mod crds;
mod fan_out;
mod golden;
mod leader;
mod manifests;
mod metrics;
mod mover_ca;
mod populator;
mod populator_clone;
mod reconcile;
