//! ferry-nfs: an async NFS client, protocol only (no ferry dependency); ferry's NFS
//! endpoints (`ferry_endpoints::nfs`) are a thin adapter over it.
//!
//! - `xdr.rs`: XDR encoding and bounded decoding.
//! - `rpc.rs`: ONC RPC over TCP, many calls in flight per connection, READ data placed
//!   straight into the caller's buffer ([`rpc::Sink`]).
//! - `retry.rs`: the one retry policy (reconnect window, busy server, capped backoff).
//! - `v3/`: NFSv3, MOUNT and the portmapper.
//! - `v4/`: NFSv4.1/4.2 COMPOUNDs, the session with its slot table, lease renewal and
//!   recovery after a server restart, and the file operations ferry uses.
//! - `commit.rs`: which UNSTABLE writes a COMMIT covered, checked by write verifier.
//!
//! Every length read from the network is bounded; malformed replies are errors, never
//! panics. The decoders are public so that they can be fuzzed: [`xdr::Decoder`],
//! [`rpc::decode_reply`], [`v3::proto`]'s reply decoders and [`v4::ops::Reply`].

#![forbid(unsafe_code)]

pub mod commit;
pub mod error;
pub mod retry;
pub mod rpc;
pub mod v3;
pub mod v4;
pub mod xdr;

use std::time::Duration;

pub use commit::{Lost, Tracker};
pub use error::{Cause, Error, ErrorKind, Result};
pub use rpc::{RpcConfig, RpcError, Sink};
pub use v3::proto::Verifier;

/// Connection settings of one server.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub rpc: RpcConfig,
    /// How long a lost connection is retried before a call fails.
    pub reconnect_timeout: Duration,
}
