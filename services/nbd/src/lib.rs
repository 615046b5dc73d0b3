//! ferry-nbd: an asynchronous NBD client and a read-only NBD export server (protocol only).
//!
//! Speaks the fixed newstyle handshake with NBD_OPT_GO, TLS (NBD_OPT_STARTTLS with
//! rustls), structured replies and extended headers, metadata contexts
//! (`base:allocation`, `qemu:dirty-bitmap:NAME`, `qemu:allocation-depth`), and the
//! commands READ, WRITE, WRITE_ZEROES, TRIM, FLUSH, BLOCK_STATUS and DISC, with many
//! requests in flight on one connection. It knows nothing of its callers; the
//! specification is doc/proto.md of the NetworkBlockDevice project.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ferry_nbd::Error> {
//! use ferry_nbd::{Address, Client, Config};
//! let address = Address::Tcp { host: "127.0.0.1".into(), port: 10809 };
//! let client = Client::connect(&address, &Config { export: "disk".into(), ..Config::default() }).await?;
//! let data = client.read(0, vec![0u8; 4096]).await?;
//! let status = client.block_status(0, client.size()).await?;
//! client.disconnect().await?;
//! # let _ = (data, status); Ok(()) }
//! ```
//!
//! [`server`] serves one export read-only to any number of NBD clients (nbdcopy, qemu,
//! nbdinfo) from a [`Backend`]: fixed newstyle, structured replies, `base:allocation`,
//! TLS, bounded memory.
//!
//! Every length read from the network is bounded before anything is allocated, and a
//! server that breaks the protocol gets [`Error::Protocol`] naming what it did, never a
//! panic or a hang.

#![forbid(unsafe_code)]

mod client;
mod config;
mod error;
#[cfg(test)]
mod fake_tests;
mod handshake;
pub mod proto;
mod reply;
pub mod server;
mod tls;
mod transport;
pub mod wire;

pub use client::{Buffer, Client, ZeroFlags};
pub use config::{
    Address, BlockSize, Config, ExportInfo, MetaContext, TlsConfig, DEFAULT_PORT, MAX_PAYLOAD,
};
pub use error::{Error, Result, ServerError};
pub use reply::{BlockStatus, ContextStatus, StatusExtent};
pub use server::{Backend, ExportConfig, ExportError, Listener, Server};
pub use transport::Transport;
