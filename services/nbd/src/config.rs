//! What a caller asks for (address, export, contexts, TLS, timeouts) and what the
//! handshake learned about the export.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::proto::{self, *};

/// The IANA port of NBD.
pub const DEFAULT_PORT: u16 = 10809;

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Self::Tcp { host, port } => write!(f, "{host}:{port}"),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// TLS settings, in the layout libnbd and QEMU use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// Directory with `ca-cert.pem` and, for client authentication, `client-cert.pem`
    /// and `client-key.pem`. None: libnbd's default directories
    /// (`$XDG_CONFIG_HOME/pki/libnbd`, `$HOME/.pki/libnbd`, `/etc/pki/libnbd`).
    pub certificates: Option<PathBuf>,
    /// Verify the server's certificate (turn off only for testing).
    pub verify_peer: bool,
    /// The name to verify the certificate against; default: the TCP host, or
    /// `localhost` for Unix sockets.
    pub hostname: Option<String>,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            certificates: None,
            verify_peer: true,
            hostname: None,
        }
    }
}

/// How to open an export.
#[derive(Debug, Clone)]
pub struct Config {
    /// The export name ("" is the default export).
    pub export: String,
    /// Metadata contexts to select, e.g. `base:allocation`, `qemu:allocation-depth`,
    /// `qemu:dirty-bitmap:NAME`. Contexts the server does not offer are simply absent
    /// from [`ExportInfo::contexts`].
    pub meta_contexts: Vec<String>,
    /// Require TLS (NBD_OPT_STARTTLS) with these settings.
    pub tls: Option<TlsConfig>,
    /// Ask for extended headers (64-bit lengths) when the server offers them.
    pub extended_headers: bool,
    /// Ask for structured replies (sparse reads, error messages, block status).
    pub structured_replies: bool,
    /// Time allowed for connecting and the whole handshake.
    pub connect_timeout: Duration,
    /// Time allowed for one request; on expiry the connection is dropped because the
    /// server's state is unknown. None: wait forever.
    pub request_timeout: Option<Duration>,
    /// Requests in flight on one connection at most.
    pub max_in_flight: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            export: String::new(),
            meta_contexts: vec![CONTEXT_BASE_ALLOCATION.to_string()],
            tls: None,
            extended_headers: true,
            structured_replies: true,
            connect_timeout: Duration::from_secs(30),
            request_timeout: Some(Duration::from_secs(120)),
            max_in_flight: 64,
        }
    }
}

/// Block size constraints (NBD_INFO_BLOCK_SIZE, or the protocol's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSize {
    /// Offsets and lengths must be multiples of this.
    pub minimum: u32,
    /// Requests of this alignment and size are efficient.
    pub preferred: u32,
    /// The largest READ/WRITE payload (capped by the client at [`MAX_PAYLOAD`]).
    pub maximum: u32,
}

/// The client never sends or expects payloads larger than this (32 MiB, the size every
/// server must accept), whatever the server advertises.
pub const MAX_PAYLOAD: u32 = 32 * 1024 * 1024;

impl Default for BlockSize {
    fn default() -> Self {
        Self {
            minimum: 1,
            preferred: 4096,
            maximum: MAX_PAYLOAD,
        }
    }
}

/// A selected metadata context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContext {
    pub id: u32,
    pub name: String,
}

/// What the handshake learned about the export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// The export name the client asked for.
    pub name: String,
    /// The server's canonical name (NBD_INFO_NAME), when it sent one.
    pub canonical_name: Option<String>,
    pub description: Option<String>,
    pub size: u64,
    /// Transmission flags.
    pub flags: u16,
    pub block_size: BlockSize,
    /// Whether the server sent NBD_INFO_BLOCK_SIZE.
    pub block_size_advertised: bool,
    pub structured_replies: bool,
    pub extended_headers: bool,
    pub tls: bool,
    pub contexts: Vec<MetaContext>,
}

impl ExportInfo {
    fn flag(&self, f: u16) -> bool {
        self.flags & f != 0
    }
    pub fn read_only(&self) -> bool {
        self.flag(FLAG_READ_ONLY)
    }
    pub fn can_flush(&self) -> bool {
        self.flag(FLAG_SEND_FLUSH)
    }
    pub fn can_fua(&self) -> bool {
        self.flag(FLAG_SEND_FUA)
    }
    pub fn can_trim(&self) -> bool {
        self.flag(FLAG_SEND_TRIM)
    }
    pub fn can_zero(&self) -> bool {
        self.flag(FLAG_SEND_WRITE_ZEROES)
    }
    pub fn can_fast_zero(&self) -> bool {
        self.flag(FLAG_SEND_FAST_ZERO) && self.can_zero()
    }
    pub fn can_multi_conn(&self) -> bool {
        self.flag(FLAG_CAN_MULTI_CONN)
    }
    pub fn can_cache(&self) -> bool {
        self.flag(FLAG_SEND_CACHE)
    }
    pub fn rotational(&self) -> bool {
        self.flag(FLAG_ROTATIONAL)
    }
    /// The id of a selected context, by name.
    pub fn context(&self, name: &str) -> Option<u32> {
        self.contexts.iter().find(|c| c.name == name).map(|c| c.id)
    }
    pub fn has_context(&self, name: &str) -> bool {
        self.context(name).is_some()
    }
    /// Whether `base:allocation` was selected, so block status reports holes and zeroes.
    pub fn can_extents(&self) -> bool {
        self.has_context(proto::CONTEXT_BASE_ALLOCATION)
    }
}
