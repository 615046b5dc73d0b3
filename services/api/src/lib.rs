//! ferry-api: ferry's public gRPC API, package `ferry.v1` (proto/ferry/v1), as one crate that
//! the job service, the `ferry` command line and the Kubernetes operator all build on, so a
//! message has one Rust type everywhere and is never mirrored by hand.
//!
//! - [`proto`]: the generated messages, with the client stubs behind the `client` feature
//!   and the server traits behind `server`; the service names and the descriptor set that
//!   reflection serves.
//! - [`auth`]: the bearer token a client sends.
//! - [`options`]: the one mapping between wire enums and the engine's, endpoints' and
//!   formats' option types (commit order, cache mode, preallocation, hash algorithm,
//!   image format). Command-line parsing is not here: the API links no clap.

#![forbid(unsafe_code)]

pub mod auth;
pub mod names;
pub mod options;
pub mod proto;
