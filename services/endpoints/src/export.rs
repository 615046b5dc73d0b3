//! `ferry export`'s data side: any [`Source`] served read-only over NBD.
//!
//! [`SourceBackend`] adapts a source (a file, a block device, S3, HTTP(S), a decoded qcow2
//! or compressed image: whatever the opener gave) to ferry-nbd's export [`Backend`]:
//! reads of any alignment and size up to NBD's 32 MiB (split and aligned to what the
//! source accepts) into pooled buffers, its extents as `base:allocation` (zero ranges as
//! hole + zero), and multi-conn unless the source is read front to back. [`Export`] binds
//! the listening socket, names the URI clients use and serves until told to stop; the
//! binary keeps no protocol dependency of its own.

use std::path::PathBuf;
use std::sync::Arc;

use ferry_core::{Caps, Error, ErrorKind, ExtentKind, IoBuf, Result, Source};
use ferry_nbd::proto::{STATE_HOLE, STATE_ZERO};
use ferry_nbd::{
    Address, Backend, BlockSize, ExportConfig, Listener, Server, StatusExtent, MAX_PAYLOAD,
};
use parking_lot::Mutex;

/// Buffers kept for reuse at most, in bytes (reads come and go at the client's pace; a
/// fresh multi-MiB buffer per read costs its page faults every time).
const POOL_BYTES: usize = 128 * 1024 * 1024;
/// The smallest pooled buffer: smaller reads share this size class.
const SMALLEST: usize = 64 * 1024;

/// Where an export listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportListen {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl ExportListen {
    /// `HOST:PORT`, `[V6]:PORT`, `unix:PATH` or a path with a `/` (a Unix socket).
    pub fn parse(text: &str) -> Result<Self> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(Error::invalid_input("--listen unix: needs a socket path"));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        if text.starts_with('/') || text.starts_with("./") {
            return Ok(Self::Unix(PathBuf::from(text)));
        }
        let bad = || {
            Error::invalid_input(format!(
                "--listen '{text}' is not HOST:PORT, [IPV6]:PORT, unix:PATH or a socket path"
            ))
        };
        let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() || (host.contains(':') && !text.starts_with('[')) {
            return Err(bad());
        }
        Ok(Self::Tcp {
            host: host.to_string(),
            port,
        })
    }
}

/// TLS files of an export (PEM). With `client_ca`, clients must present a certificate
/// it signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// How to export a source.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    pub listen: ExportListen,
    /// The export name ("" by default; clients asking for "" get it whatever its name).
    pub name: String,
    pub description: Option<String>,
    pub tls: Option<ExportTls>,
}

/// A bound export, ready to serve: of a source ([`Export::bind`]) or of any backend
/// ([`Export::bind_backend`], the relay's).
#[derive(Debug)]
pub struct Export<B: Backend = SourceBackend> {
    server: Server<B>,
    listener: Listener,
    uri: String,
    socket: Option<PathBuf>,
}

impl Export<SourceBackend> {
    /// Binds the socket and prepares the server; nothing is served until [`Export::serve`].
    pub async fn bind(source: Arc<dyn Source>, options: &ExportOptions) -> Result<Self> {
        Self::bind_backend(SourceBackend::new(source), options).await
    }
}

impl<B: Backend> Export<B> {
    /// [`Export::bind`] of any backend.
    pub async fn bind_backend(backend: B, options: &ExportOptions) -> Result<Self> {
        let tls = match &options.tls {
            None => None,
            Some(t) => Some(
                ferry_nbd::server::server_tls_config(&t.cert, &t.key, t.client_ca.as_deref())
                    .map_err(|e| Error::invalid_input(e.to_string()))?,
            ),
        };
        let config = ExportConfig {
            name: options.name.clone(),
            description: options.description.clone(),
            tls,
            ..ExportConfig::default()
        };
        let server =
            Server::new(backend, config).map_err(|e| Error::invalid_input(e.to_string()))?;
        let address = match &options.listen {
            ExportListen::Tcp { host, port } => Address::Tcp {
                host: host.clone(),
                port: *port,
            },
            ExportListen::Unix(path) => Address::Unix(path.clone()),
        };
        let listener = Listener::bind(&address)
            .await
            .map_err(|e| Error::io(format!("cannot listen on {address}"), e))?;
        let bound = listener
            .local_address()
            .map_err(|e| Error::io(format!("the address bound for {address}"), e))?;
        let scheme = if options.tls.is_some() { "nbds" } else { "nbd" };
        let name = uri_path(&options.name);
        let (uri, socket) = match bound {
            Address::Tcp { host, port } if host.contains(':') => {
                (format!("{scheme}://[{host}]:{port}/{name}"), None)
            }
            Address::Tcp { host, port } => (format!("{scheme}://{host}:{port}/{name}"), None),
            Address::Unix(path) => (
                format!("{scheme}+unix:///{name}?socket={}", path.display()),
                Some(path),
            ),
        };
        Ok(Self {
            server,
            listener,
            uri,
            socket,
        })
    }

    /// The NBD URI clients connect to (the bound port when 0 was asked).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The server (to count its clients while it serves).
    pub fn server(&self) -> Server<B> {
        self.server.clone()
    }

    /// Serves until `shutdown` completes, then closes every connection (and removes the
    /// Unix socket). Sessions that end in error are logged.
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()>) {
        let Self {
            server,
            listener,
            socket,
            ..
        } = self;
        server
            .serve(listener, shutdown, |e| {
                if e.is_client_gone() {
                    tracing::debug!("NBD client: {e}");
                } else {
                    tracing::warn!("NBD client: {e}");
                }
            })
            .await;
        if let Some(path) = socket {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The export name as a URI path (percent-encoding what a path cannot hold).
fn uri_path(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC)
        .to_string()
        .replace("%2F", "/")
        .replace("%2D", "-")
        .replace("%2E", ".")
        .replace("%5F", "_")
}

/// A [`Source`] as an NBD export backend.
pub struct SourceBackend {
    source: Arc<dyn Source>,
    caps: Caps,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for SourceBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceBackend")
            .field("source", &self.source.describe())
            .finish_non_exhaustive()
    }
}

impl SourceBackend {
    pub fn new(source: Arc<dyn Source>) -> Self {
        let caps = source.caps();
        Self {
            source,
            caps,
            pool: Arc::new(Pool::default()),
        }
    }
}

/// Free buffers by size class (powers of two from [`SMALLEST`]).
#[derive(Debug, Default)]
struct Pool {
    free: Mutex<(Vec<IoBuf>, usize)>,
}

impl Pool {
    fn class(len: usize) -> usize {
        len.max(SMALLEST).next_power_of_two()
    }

    fn take(&self, len: usize) -> IoBuf {
        let class = Self::class(len);
        let mut free = self.free.lock();
        if let Some(i) = free.0.iter().position(|b| b.capacity() == class) {
            let buf = free.0.swap_remove(i);
            free.1 -= class;
            return buf;
        }
        drop(free);
        IoBuf::new(class)
    }

    fn give(&self, buf: IoBuf) {
        let mut free = self.free.lock();
        if free.1 + buf.capacity() <= POOL_BYTES {
            free.1 += buf.capacity();
            free.0.push(buf);
        }
    }
}

/// A read's bytes: a view of a pooled buffer, returned to the pool when dropped.
#[derive(Debug)]
pub struct PooledBuf {
    buf: Option<IoBuf>,
    pool: Arc<Pool>,
}

impl std::ops::Deref for PooledBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.buf.as_deref().unwrap_or_default()
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.give(buf);
        }
    }
}

/// A data-path error as the I/O error the export turns into an NBD error value.
fn to_io(e: Error) -> std::io::Error {
    use std::io::ErrorKind as K;
    let kind = match e.kind() {
        ErrorKind::PermissionDenied => K::PermissionDenied,
        ErrorKind::InvalidInput => K::InvalidInput,
        ErrorKind::NoSpace => K::StorageFull,
        ErrorKind::Unsupported => K::Unsupported,
        _ => K::Other,
    };
    std::io::Error::new(kind, e.to_string())
}

impl Backend for SourceBackend {
    type Buf = PooledBuf;

    fn size(&self) -> u64 {
        self.source.size()
    }

    fn block_size(&self) -> BlockSize {
        // Reads of any alignment and size work (see read); the preferred size is the
        // source's.
        BlockSize {
            minimum: 1,
            preferred: self.caps.block.preferred.clamp(512, MAX_PAYLOAD),
            maximum: MAX_PAYLOAD,
        }
    }

    fn multi_conn(&self) -> bool {
        !self.caps.sequential_read
    }

    fn can_extents(&self) -> bool {
        self.caps.extents
    }

    async fn read(&self, offset: u64, len: usize) -> std::io::Result<PooledBuf> {
        let size = self.source.size();
        let align = u64::from(self.caps.block.minimum.max(1));
        let start = offset - offset % align;
        let end = (offset + len as u64).div_ceil(align) * align;
        let end = end.min(size.max(offset + len as u64));
        let total = (end - start) as usize;
        let piece = (self.caps.block.maximum.max(1) as usize).max(align as usize);
        let piece = piece - piece % align as usize;
        let mut buf = self.pool.take(total);
        let mut done = 0usize;
        while done < total {
            let n = piece.min(total - done);
            buf.set_view(done, n);
            buf = self
                .source
                .read_at(start + done as u64, buf)
                .await
                .map_err(to_io)?;
            done += n;
        }
        buf.set_view((offset - start) as usize, len);
        Ok(PooledBuf {
            buf: Some(buf),
            pool: self.pool.clone(),
        })
    }

    async fn extents(&self, offset: u64, len: u64) -> std::io::Result<Vec<StatusExtent>> {
        let extents = self.source.extents(offset, len).await.map_err(to_io)?;
        Ok(extents
            .into_iter()
            .map(|e| StatusExtent {
                offset: e.offset,
                len: e.len,
                flags: match e.kind {
                    ExtentKind::Zero => STATE_HOLE | STATE_ZERO,
                    _ => 0,
                },
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(
            ExportListen::parse("127.0.0.1:10809").unwrap(),
            ExportListen::Tcp {
                host: "127.0.0.1".into(),
                port: 10809
            }
        );
        assert_eq!(
            ExportListen::parse("[::1]:0").unwrap(),
            ExportListen::Tcp {
                host: "::1".into(),
                port: 0
            }
        );
        assert_eq!(
            ExportListen::parse("unix:/run/x.sock").unwrap(),
            ExportListen::Unix("/run/x.sock".into())
        );
        assert_eq!(
            ExportListen::parse("/run/x.sock").unwrap(),
            ExportListen::Unix("/run/x.sock".into())
        );
        for bad in ["", "host", ":10809", "host:99999", "::1:80", "unix:"] {
            let e = ExportListen::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn export_names_in_uris() {
        assert_eq!(uri_path(""), "");
        assert_eq!(uri_path("disk-1.raw"), "disk-1.raw");
        assert_eq!(uri_path("a b/c"), "a%20b/c");
    }
}
