//! ferry-endpoints: one module per endpoint kind, and [`open_source`] / [`open_target`]
//! that turn an [`EndpointSpec`] into a [`Source`] or [`Target`].

mod background_flush;
mod open;
mod options;

pub mod export;
pub mod file;
pub mod http;
pub mod iscsi;
pub mod nbd;
pub mod nfs;
pub mod registry;
pub mod relay;
pub mod s3;

pub use open::{open_source, open_target};
pub use options::{CacheMode, Preallocation, SourceOptions, TargetOptions};

pub use ferry_core::{EndpointSpec, Source, Target};
