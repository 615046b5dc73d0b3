//! [`NfsSource`] and [`NfsTarget`]: a file on an NFS server as a ferry endpoint.
//!
//! NFSv3 over TCP with AUTH_SYS, spoken by this module's own small client (XDR in
//! `xdr.rs`, ONC RPC with many calls in flight per connection in `rpc.rs`, the NFSv3,
//! MOUNT and portmapper messages in `proto.rs`, retries in `client.rs`, export and path
//! resolution in `mount.rs`). Each handle from `connect()` has its own TCP connection.
//! READ and WRITE requests are sized to the server's FSINFO rtmax/wtmax; writes are
//! UNSTABLE and made durable by COMMIT at flush, with the write verifier checked
//! (`commit.rs`). NFSv3 cannot report holes, so the source has no extents and the engine
//! finds zero blocks in the data it reads.
//!
//! `version=4` URLs name the server's NFSv4 pseudo path and are served by
//! [`Nfs4Source`]/[`Nfs4Target`] (`v4/`): NFSv4.2 with SEEK for holes and DEALLOCATE for
//! zero ranges, or NFSv4.1 when the server has no 4.2. [`open_source`] and
//! [`open_target`] pick the version the URL asks for (NFSv3 by default).

mod client;
mod commit;
mod mount;
mod proto;
mod rpc;
mod source;
mod target;
mod v4;
mod xdr;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::spec::NfsSpec;
use ferry_core::{BlockSizes, Error, ErrorKind, Result};

pub use commit::Lost;
pub use source::NfsSource;
pub use target::NfsTarget;
pub use v4::{Nfs4Source, Nfs4Target};

use client::{ClientConfig, NfsConn, NfsError};
use proto::FileHandle;
use rpc::RpcConfig;

/// Request size when the caller chose none (clamped to the server's rsize/wsize).
/// Measured against ganesha on loopback (4 GiB, half data, 8 workers): reads 2.8-3.1 s at
/// 1 MiB against 3.2-3.4 s at 256 KiB, writes 4.4 s against 4.7-4.9 s.
pub(crate) const REQUEST_SIZE: u32 = 1024 * 1024;
/// The largest READ or WRITE ferry sends, whatever the server allows.
const MAX_TRANSFER: u32 = 16 * 1024 * 1024;

/// NFS-specific settings (the URL carries server, path, ports and credentials).
#[derive(Debug, Clone)]
pub struct NfsOptions {
    pub connect_timeout: Duration,
    /// How long one request may wait for its reply.
    pub request_timeout: Duration,
    /// How long a lost connection is re-established before requests fail.
    pub reconnect_timeout: Duration,
    /// Connect from a reserved port (below 1024), as servers exporting with `secure`
    /// require. None: when running as root, as libnfs does.
    pub privileged_port: Option<bool>,
}

impl Default for NfsOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            reconnect_timeout: Duration::from_secs(30),
            privileged_port: None,
        }
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it
    // or truncates, and the length is re-measured below.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return "ferry".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn client_config(spec: &NfsSpec, options: &NfsOptions) -> ClientConfig {
    // SAFETY: these calls cannot fail and have no preconditions.
    let (uid, gid, euid) = unsafe { (libc::getuid(), libc::getgid(), libc::geteuid()) };
    ClientConfig {
        rpc: RpcConfig {
            uid: spec.uid.unwrap_or(uid),
            gid: spec.gid.unwrap_or(gid),
            machine: hostname(),
            connect_timeout: options.connect_timeout,
            request_timeout: options.request_timeout,
            privileged_port: options.privileged_port.unwrap_or(euid == 0),
        },
        reconnect_timeout: options.reconnect_timeout,
    }
}

fn check_version(spec: &NfsSpec, describe: &str) -> Result<()> {
    match spec.version {
        None | Some(3) => Ok(()),
        Some(4) => Err(Error::invalid_input(
            "NfsSource and NfsTarget speak NFSv3: a version=4 URL is opened by Nfs4Source or Nfs4Target (open_source and open_target choose by the URL)",
        )
        .with_operation("open")
        .with_endpoint(describe.to_string())),
        Some(v) => Err(Error::unsupported(format!(
            "NFS version {v} is not supported: use version=3 (the default, with the export's real path) or version=4 (NFSv4.2/4.1, with the server's pseudo path)"
        ))
        .with_operation("open")
        .with_endpoint(describe.to_string())),
    }
}

/// Opens the file `spec` names for reading, over NFSv4 when the URL says `version=4`
/// and NFSv3 otherwise.
pub async fn open_source(
    spec: &NfsSpec,
    options: &NfsOptions,
) -> Result<Arc<dyn ferry_core::Source>> {
    Ok(match spec.version {
        Some(4) => Arc::new(Nfs4Source::open(spec, options).await?),
        _ => Arc::new(NfsSource::open(spec, options).await?),
    })
}

/// Opens the file `spec` names for writing `size` bytes (created when missing), over
/// NFSv4 when the URL says `version=4` and NFSv3 otherwise.
pub async fn open_target(
    spec: &NfsSpec,
    size: u64,
    options: &NfsOptions,
) -> Result<Arc<dyn ferry_core::Target>> {
    Ok(match spec.version {
        Some(4) => Arc::new(Nfs4Target::open(spec, size, options).await?),
        _ => Arc::new(NfsTarget::open(spec, size, options).await?),
    })
}

/// What all handles of one opened file share.
#[derive(Debug)]
struct File {
    describe: String,
    addr: SocketAddr,
    config: ClientConfig,
    fh: FileHandle,
    size: u64,
    /// READ and WRITE sizes (FSINFO rtmax, wtmax, capped).
    rsize: u32,
    wsize: u32,
    rpref: u32,
    wpref: u32,
    /// UNSTABLE writes not yet committed (targets only).
    commits: commit::Tracker,
    /// A target this open created: it reads as zeroes.
    created: bool,
    /// A WRITE's worth of zeroes, made on the first `write_zeroes`.
    zeroes: std::sync::OnceLock<Vec<u8>>,
}

impl File {
    fn err(&self, e: NfsError, op: &'static str, offset: u64) -> Error {
        let kind = e.kind();
        let advice = match e.status() {
            Some(proto::NfsStat::STALE | proto::NfsStat::BADHANDLE) => {
                ": stale file handle: the file was removed or replaced on the server, or the export changed"
                    .to_string()
            }
            Some(proto::NfsStat::PERM | proto::NfsStat::ACCES) => format!(
                ": permission denied for uid {} gid {}",
                self.config.rpc.uid, self.config.rpc.gid
            ),
            _ if kind == ErrorKind::Disconnected => format!(
                " (no connection within the reconnect window of {:?})",
                self.config.reconnect_timeout
            ),
            _ => String::new(),
        };
        Error::new(kind, format!("NFS request failed{advice}"))
            .with_source(e)
            .at(op, offset)
            .with_endpoint(self.describe.clone())
    }

    fn check_range(&self, op: &'static str, offset: u64, len: u64) -> Result<()> {
        check_range(&self.describe, self.size, op, offset, len)
    }

    fn block_sizes(&self, preferred: u32, maximum: u32) -> BlockSizes {
        block_sizes(preferred, maximum)
    }

    /// A new connection for another handle.
    async fn connect(&self) -> Result<NfsConn> {
        NfsConn::connect(self.addr, &self.config)
            .await
            .map_err(|e| mount::rpc_error(e, "connect to the NFS service"))
            .map_err(|e| {
                e.with_operation("connect")
                    .with_endpoint(self.describe.clone())
            })
    }
}

/// Resolves the URL and reads the server's transfer sizes: everything source and target
/// share at open.
async fn open_common(
    spec: &NfsSpec,
    options: &NfsOptions,
) -> Result<(String, ClientConfig, mount::Resolved, proto::FsInfo)> {
    let describe = ferry_core::EndpointSpec::Nfs(spec.clone()).to_string();
    check_version(spec, &describe)?;
    let config = client_config(spec, options);
    let resolved = mount::resolve(spec, &config, &describe).await?;
    let fsinfo = resolved
        .nfs
        .fsinfo(&resolved.dir)
        .await
        .map_err(|e| mount::nfs_error(e, "read the server's limits (FSINFO)", &config))
        .map_err(|e| e.with_operation("open").with_endpoint(describe.clone()))?;
    Ok((describe, config, resolved, fsinfo))
}

/// Fails a request that reaches past the end of the image (`size` bytes).
fn check_range(describe: &str, size: u64, op: &'static str, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::invalid_input(format!(
            "request of {len} bytes at offset {offset} reaches past the end of the image ({size} bytes)"
        ))
        .at(op, offset)
        .with_endpoint(describe.to_string())),
    }
}

/// Block sizes of an NFS file: any alignment, at most `maximum` (at least 4 KiB) per request.
fn block_sizes(preferred: u32, maximum: u32) -> BlockSizes {
    let maximum = maximum.max(4096);
    BlockSizes {
        minimum: 1,
        preferred: preferred.clamp(1, maximum),
        maximum,
    }
}

/// Checks the byte count of a READ reply for `asked` bytes at `at` in an image of `size`
/// bytes: more than asked is a protocol error, none at all a file that shrank.
fn check_read_count(
    describe: &str,
    size: u64,
    at: u64,
    asked: usize,
    count: usize,
    eof: bool,
) -> Result<()> {
    if count > asked {
        return Err(Error::protocol(format!(
            "the server returned {count} bytes for a read of {asked}"
        ))
        .at("read", at)
        .with_endpoint(describe.to_string()));
    }
    if count == 0 {
        return Err(Error::new(
            ErrorKind::Io,
            format!(
                "the server returned no data{} at offset {at}, before the image's end ({size} bytes): did the file shrink?",
                if eof { " (end of file)" } else { "" },
            ),
        )
        .at("read", at)
        .with_endpoint(describe.to_string()));
    }
    Ok(())
}

/// Checks the byte count of a WRITE reply for `asked` bytes.
fn check_write_count(
    describe: &str,
    op: &'static str,
    at: u64,
    asked: usize,
    count: usize,
) -> Result<()> {
    if count == 0 || count > asked {
        return Err(Error::protocol(format!(
            "the server acknowledged {count} bytes of a write of {asked}"
        ))
        .at(op, at)
        .with_endpoint(describe.to_string()));
    }
    Ok(())
}

/// WRITEs of zeroes in flight at once on one handle.
const ZERO_WRITES_IN_FLIGHT: usize = 4;

/// Writes `len` zero bytes at `offset` with `write`, in pieces of at most `zeroes.len()`
/// bytes taken from the one shared zero buffer, a few in flight: how a zero range reaches a
/// server that cannot be told to write zeroes.
async fn write_zero_chunks<'a, F, Fut>(
    offset: u64,
    len: u64,
    zeroes: &'a [u8],
    write: F,
) -> Result<()>
where
    F: Fn(u64, &'a [u8]) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    use futures::stream::{self, StreamExt, TryStreamExt};
    let chunk = zeroes.len().max(1) as u64;
    let chunks = (0..len.div_ceil(chunk)).map(|i| {
        let at = offset + i * chunk;
        (at, (offset + len - at).min(chunk) as usize)
    });
    stream::iter(chunks)
        .map(|(at, n)| write(at, &zeroes[..n]))
        .buffer_unordered(ZERO_WRITES_IN_FLIGHT)
        .try_collect::<()>()
        .await
}

fn transfer(max: u32, pref: u32) -> (u32, u32) {
    let max = if max == 0 { 64 * 1024 } else { max };
    let max = max.min(MAX_TRANSFER);
    let pref = if pref == 0 { max } else { pref.min(max) };
    (max, pref)
}

/// Shares `Arc<File>` between source and target modules.
type SharedFile = Arc<File>;
