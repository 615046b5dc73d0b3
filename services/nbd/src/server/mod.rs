//! An NBD export server: one read-only export, served to any number of clients one after
//! another and at once.
//!
//! The server speaks fixed newstyle negotiation (NBD_OPT_LIST, NBD_OPT_INFO, NBD_OPT_GO,
//! NBD_OPT_EXPORT_NAME, NBD_OPT_STRUCTURED_REPLY, NBD_OPT_LIST/SET_META_CONTEXT with
//! `base:allocation`, NBD_OPT_STARTTLS), then answers READ (with OFFSET_HOLE chunks for
//! zero ranges when structured replies are on), BLOCK_STATUS, FLUSH and DISC, and refuses
//! WRITE, TRIM and WRITE_ZEROES with EPERM. What it serves comes from a [`Backend`]; the
//! crate knows nothing of where the bytes live.
//!
//! Memory is bounded whatever the clients send: option data is read only up to
//! [`wire::MAX_OPTION_DATA`], requests larger than [`MAX_PAYLOAD`] are refused without
//! reading them, and each connection has at most [`ExportConfig::max_in_flight`] requests
//! and [`ExportConfig::max_in_flight_bytes`] bytes of reads in flight. A client that
//! breaks the protocol loses its connection; the others go on.

mod session;
mod tls;
pub mod wire;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::config::{Address, BlockSize, MAX_PAYLOAD};
use crate::reply::StatusExtent;
use crate::transport::Transport;

pub use tls::server_tls_config;

/// What an export serves. Every method may be called concurrently, from many
/// connections.
pub trait Backend: Send + Sync + 'static {
    /// The buffer a read returns (owned, so it can go to the socket without a copy).
    type Buf: Deref<Target = [u8]> + Send + 'static;

    /// The export size in bytes.
    fn size(&self) -> u64;

    /// Block sizes to advertise; the maximum is capped at [`MAX_PAYLOAD`]. Reads of any
    /// alignment up to the maximum must still work (clients that do not ask for block
    /// sizes may send them).
    fn block_size(&self) -> BlockSize {
        BlockSize::default()
    }

    /// Whether several connections may read at once to advantage (NBD_FLAG_CAN_MULTI_CONN:
    /// every connection sees the same bytes). False for a source read front to back.
    fn multi_conn(&self) -> bool {
        true
    }

    /// Reads exactly `len` bytes at `offset` (inside the export).
    fn read(
        &self,
        offset: u64,
        len: usize,
    ) -> impl Future<Output = std::io::Result<Self::Buf>> + Send;

    /// Allocation of a prefix of `offset..offset + len`: contiguous extents from `offset`,
    /// at least one when `len > 0`, flags [`crate::proto::STATE_HOLE`] and
    /// [`crate::proto::STATE_ZERO`]. The default reports everything as data.
    fn extents(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = std::io::Result<Vec<StatusExtent>>> + Send {
        async move {
            Ok(vec![StatusExtent {
                offset,
                len,
                flags: 0,
            }])
        }
    }

    /// Whether [`Backend::extents`] knows anything (then reads of zero ranges are
    /// answered with holes, without reading).
    fn can_extents(&self) -> bool {
        false
    }

    /// Whether [`Backend::extents`] at `offset` answers now. A backend that learns its
    /// allocation as it goes (a relay serving an image while it is written) says false
    /// where it would wait: block status then ends its reply before `offset` instead of
    /// waiting to describe more of the range (the client asks again).
    fn extents_ready(&self, _offset: u64) -> bool {
        true
    }
}

/// How an export is served.
#[derive(Clone)]
pub struct ExportConfig {
    /// The export's name ("" by default). A client asking for "" gets this export too.
    pub name: String,
    /// Shown by NBD_OPT_LIST and NBD_INFO_DESCRIPTION.
    pub description: Option<String>,
    /// Serve TLS, and require it: options other than NBD_OPT_STARTTLS are refused
    /// before it.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Requests in flight on one connection at most (reading stops until one finishes).
    pub max_in_flight: usize,
    /// Bytes of reads in flight on one connection at most (at least [`MAX_PAYLOAD`]).
    pub max_in_flight_bytes: usize,
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// Time a client has from connecting to the end of negotiation.
    pub handshake_timeout: Duration,
}

impl Default for ExportConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            description: None,
            tls: None,
            max_in_flight: 64,
            max_in_flight_bytes: 64 * 1024 * 1024,
            max_connections: 256,
            handshake_timeout: Duration::from_secs(30),
        }
    }
}

impl std::fmt::Debug for ExportConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportConfig")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("tls", &self.tls.is_some())
            .field("max_in_flight", &self.max_in_flight)
            .field("max_in_flight_bytes", &self.max_in_flight_bytes)
            .field("max_connections", &self.max_connections)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish()
    }
}

/// Why a client's session ended badly, or why the server could not be set up.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The socket failed.
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The client hung up in the middle of a message.
    #[error("the client closed the connection {0}")]
    ClientGone(&'static str),
    /// The client broke the protocol; its connection was closed.
    #[error("the client broke the protocol: {0}")]
    Client(String),
    /// The client did not finish negotiating in time.
    #[error("the client did not finish negotiating within {0:?}")]
    HandshakeTimeout(Duration),
    /// The TLS handshake with the client failed.
    #[error("TLS with the client failed: {0}")]
    Tls(String),
    /// The export's configuration is unusable (certificates, keys, name).
    #[error("{0}")]
    Config(String),
}

impl ExportError {
    pub(crate) fn io(context: &'static str, err: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        match err.kind() {
            K::UnexpectedEof | K::ConnectionReset | K::BrokenPipe | K::ConnectionAborted => {
                Self::ClientGone(context)
            }
            _ => Self::Io {
                context,
                source: err,
            },
        }
    }

    /// Whether this is only a client going away (worth a debug line, not a warning).
    pub fn is_client_gone(&self) -> bool {
        matches!(self, Self::ClientGone(_))
    }
}

/// A bound socket to serve on.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// Binds `address` (a Unix socket path must not exist yet).
    pub async fn bind(address: &Address) -> std::io::Result<Self> {
        match address {
            Address::Tcp { host, port } => {
                Ok(Self::Tcp(TcpListener::bind((host.as_str(), *port)).await?))
            }
            Address::Unix(path) => Ok(Self::Unix(UnixListener::bind(path)?)),
        }
    }

    /// The address actually bound (the port chosen for port 0).
    pub fn local_address(&self) -> std::io::Result<Address> {
        match self {
            Self::Tcp(l) => {
                let a = l.local_addr()?;
                Ok(Address::Tcp {
                    host: a.ip().to_string(),
                    port: a.port(),
                })
            }
            Self::Unix(l) => {
                let a = l.local_addr()?;
                let path = a.as_pathname().ok_or_else(|| {
                    std::io::Error::other("the Unix socket is not bound to a path")
                })?;
                Ok(Address::Unix(path.to_path_buf()))
            }
        }
    }
}

pub(crate) struct Inner<B> {
    pub backend: B,
    pub config: ExportConfig,
    pub block: BlockSize,
    /// Connections being served now.
    pub active: AtomicUsize,
}

/// Counts a connection while it is served.
struct Active<'a>(&'a AtomicUsize);

impl<'a> Active<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An export server. Cheap to clone; clones serve the same export.
pub struct Server<B> {
    inner: Arc<Inner<B>>,
}

impl<B> std::fmt::Debug for Server<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("config", &self.inner.config)
            .field("block", &self.inner.block)
            .finish_non_exhaustive()
    }
}

impl<B> Clone for Server<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<B: Backend> Server<B> {
    /// A server of `backend` under `config`; fails on a name the protocol cannot carry.
    pub fn new(backend: B, mut config: ExportConfig) -> Result<Self, ExportError> {
        for (what, text) in [
            ("export name", Some(config.name.as_str())),
            ("export description", config.description.as_deref()),
        ] {
            if text.is_some_and(|t| t.len() > crate::proto::MAX_STRING) {
                return Err(ExportError::Config(format!(
                    "the {what} is longer than the {} bytes NBD allows",
                    crate::proto::MAX_STRING
                )));
            }
        }
        config.max_in_flight = config.max_in_flight.max(1);
        config.max_in_flight_bytes = config.max_in_flight_bytes.max(MAX_PAYLOAD as usize);
        config.max_connections = config.max_connections.max(1);
        let advertised = backend.block_size();
        let minimum = advertised.minimum.clamp(1, 65536);
        let minimum = if minimum.is_power_of_two() {
            minimum
        } else {
            1
        };
        let maximum = advertised.maximum.clamp(minimum, MAX_PAYLOAD);
        let maximum = maximum - maximum % minimum;
        let preferred = advertised.preferred.clamp(minimum, maximum);
        let preferred = if preferred.is_power_of_two() {
            preferred
        } else {
            minimum.max(4096).min(maximum)
        };
        let block = BlockSize {
            minimum,
            preferred,
            maximum,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                backend,
                config,
                block,
                active: AtomicUsize::new(0),
            }),
        })
    }

    /// The backend served.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// Serves one client on `stream` until it disconnects. A clean end (NBD_OPT_ABORT,
    /// NBD_CMD_DISC, or a hang-up between requests) is `Ok`.
    pub async fn serve_connection<S: Transport>(&self, stream: S) -> Result<(), ExportError> {
        let _active = Active::enter(&self.inner.active);
        session::run(self.inner.clone(), stream).await
    }

    /// Clients connected now (a relay serves until the last one has gone).
    pub fn connections(&self) -> usize {
        self.inner.active.load(Ordering::SeqCst)
    }

    /// Accepts clients on `listener` until `shutdown` completes, then closes every
    /// connection. Each session's error goes to `on_error`.
    pub async fn serve(
        &self,
        listener: Listener,
        shutdown: impl Future<Output = ()>,
        on_error: impl Fn(ExportError) + Send + Sync + 'static,
    ) {
        let on_error = Arc::new(on_error);
        let slots = Arc::new(Semaphore::new(self.inner.config.max_connections));
        let mut sessions = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            while sessions.try_join_next().is_some() {}
            let slot = tokio::select! {
                () = &mut shutdown => break,
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break,
                },
            };
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = accept(&listener) => accepted,
            };
            let server = self.clone();
            let on_error = on_error.clone();
            match accepted {
                Ok(Accepted::Tcp(stream)) => {
                    sessions.spawn(async move {
                        let _slot = slot;
                        let _ = stream.set_nodelay(true);
                        if let Err(e) = server.serve_connection(stream).await {
                            on_error(e);
                        }
                    });
                }
                Ok(Accepted::Unix(stream)) => {
                    sessions.spawn(async move {
                        let _slot = slot;
                        if let Err(e) = server.serve_connection(stream).await {
                            on_error(e);
                        }
                    });
                }
                Err(e) => {
                    on_error(ExportError::Io {
                        context: "accepting a connection",
                        source: e,
                    });
                    // Out of file descriptors or similar: give the system a moment.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        sessions.shutdown().await;
    }
}

enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn accept(listener: &Listener) -> std::io::Result<Accepted> {
    match listener {
        Listener::Tcp(l) => Ok(Accepted::Tcp(l.accept().await?.0)),
        Listener::Unix(l) => Ok(Accepted::Unix(l.accept().await?.0)),
    }
}
