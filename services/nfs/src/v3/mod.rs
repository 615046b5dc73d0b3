//! NFSv3 (RFC 1813) with MOUNT v3 and the portmapper: the messages (`proto.rs`), the
//! client of one connection with its retries (`client.rs`), and the way from a path to
//! a file handle (`mount.rs`).

pub mod client;
pub mod mount;
pub mod proto;

pub use client::NfsConn;
pub use mount::{lookup_host, resolve, Location, Resolved};
