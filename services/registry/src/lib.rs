//! ferry-registry: a client of the OCI distribution API (the docker registry protocol),
//! enough to read a containerDisk: resolve a tag to a manifest digest, walk an image
//! index to one platform's manifest, and read a layer blob as a stream or by ranges.
//!
//! It knows nothing of ferry. Authentication follows the registry's challenge
//! (anonymous, basic, or the bearer-token flow of `WWW-Authenticate: Bearer realm=...`)
//! with credentials from a docker `config.json` ([`auth::DockerConfig`]). Everything read
//! from the network is bounded: manifests ([`manifest::MAX_MANIFEST`]), token replies
//! ([`auth::MAX_TOKEN_REPLY`]), the number of layers and index entries; the manifest's
//! digest is checked against the bytes received, and [`digest::Verifier`] checks a blob's
//! bytes as they stream ([`ordered::OrderedVerifier`] as ranges of it arrive in any order).

#![forbid(unsafe_code)]

pub mod auth;
mod client;
pub mod digest;
mod error;
pub mod manifest;
pub mod ordered;

pub use auth::{Credentials, DockerConfig};
pub use client::{BlobBody, Client, ClientOptions, Resolved};
pub use digest::{Digest, Verifier};
pub use error::{Error, ErrorKind, Result};
pub use manifest::{Compression, Layer, Platform};
pub use ordered::OrderedVerifier;
