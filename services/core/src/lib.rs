//! ferry-core: the vocabulary every other ferry crate speaks.
//!
//! The engine moves bytes between a [`Source`] and a [`Target`] without knowing which
//! protocol sits behind them; endpoints implement the traits; the service and the CLI
//! parse [`EndpointSpec`]s from URLs. This crate has no network or runtime dependencies
//! so that it compiles in seconds and every layer can depend on it.

#![forbid(unsafe_code)]

pub mod backoff;
mod buf;
mod caps;
mod endpoint;
mod error;
mod extent;
pub mod http_headers;
mod secret;
pub mod size;
pub mod spec;
mod written;

pub use buf::{IoBuf, IO_ALIGN};
pub use caps::{BlockSizes, Caps};
pub use endpoint::{Source, Target, ZeroMode, UNKNOWN_SIZE};
pub use error::{Context, Error, ErrorKind, Result};
pub use extent::{merge_extents, Extent, ExtentKind};
pub use secret::Secret;
pub use spec::{EndpointSpec, RegistrySpec};
pub use written::WrittenRanges;
