//! Between the wire and the domain: [`validation`] checks requests into what a job needs
//! (checked endpoints, confined paths, bounded metadata), [`options`] turns their options
//! into the typed [`JobSpec`] a job runs with, [`backup`] does both for the backup jobs
//! and [`sync`] for syncs between repositories,
//! [`checkpoint`] checks and bounds checkpoints, and [`output`] turns job records into
//! `ferry.v1.Job`.

pub mod backup;
pub mod checkpoint;
pub mod options;
pub mod output;
pub mod sync;
pub mod validation;

pub use options::{
    open_spec, shown_url, ChecksumSpec, EndpointAccess, EndpointSettings, ImageSpec, JobSpec,
    TransferSpec,
};
pub use output::{job_to_proto, kind_from_proto, state_from_proto};
pub use validation::{Accepted, Validator};

#[cfg(test)]
mod tests;
