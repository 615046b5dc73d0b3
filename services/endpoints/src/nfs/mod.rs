//! [`NfsSource`], [`NfsTarget`], [`Nfs4Source`] and [`Nfs4Target`]: a file on an NFS
//! server as a ferry endpoint. This module is the adapter; the protocol (XDR, ONC RPC,
//! MOUNT, NFSv3, NFSv4.1/4.2 sessions and recovery) is the `ferry-nfs` crate.
//!
//! NFSv3 (the default) resolves the URL's real path through MOUNT and LOOKUPs; each
//! handle from `connect()` has its own TCP connection. READ and WRITE requests are sized
//! to the server's limits; writes are UNSTABLE and made durable by COMMIT at flush, with
//! the write verifier checked (ferry-nfs's commit tracker). NFSv3 cannot report holes, so
//! the source has no extents and the engine finds zero blocks in the data it reads.
//!
//! `version=4` URLs name the server's NFSv4 pseudo path and are served by
//! [`Nfs4Source`]/[`Nfs4Target`] (`v4/`): NFSv4.2 with SEEK for holes and DEALLOCATE for
//! zero ranges, or NFSv4.1 when the server has no 4.2. [`open_source`] and
//! [`open_target`] pick the version the URL asks for. Error advice for both versions is
//! worded in `error.rs`.

mod error;
mod source;
mod target;
mod v4;

use std::ops::{Deref, DerefMut, Range};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::spec::NfsSpec;
use ferry_core::{BlockSizes, Caps, Error, ErrorKind, IoBuf, Result};
use ferry_nfs::{ClientConfig, RpcConfig, Sink};

pub use ferry_nfs::Lost;
pub use source::NfsSource;
pub use target::NfsTarget;
pub use v4::{Nfs4Source, Nfs4Target};

/// Request size when the caller chose none (clamped to the server's rsize/wsize).
/// Measured against ganesha on loopback (4 GiB, half data, 8 workers): reads 2.8-3.1 s at
/// 1 MiB against 3.2-3.4 s at 256 KiB, writes 4.4 s against 4.7-4.9 s.
pub(crate) const REQUEST_SIZE: u32 = 1024 * 1024;
/// The largest READ or WRITE ferry sends, whatever the server allows.
const MAX_TRANSFER: u32 = 16 * 1024 * 1024;
/// The smallest largest request ferry reports for a file.
const MIN_MAX_REQUEST: u32 = 4096;
/// READ and WRITE size of an NFSv3 server that names none.
const DEFAULT_TRANSFER: u32 = 64 * 1024;
/// WRITEs of zeroes in flight at once on one handle.
const ZERO_WRITES_IN_FLIGHT: usize = 4;
/// Mode of a file a target creates.
const CREATE_MODE: u32 = 0o644;

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

/// An [`IoBuf`] as the buffer ferry-nfs places READ data into: the data lands at the
/// start of its view. Wrapping moves the buffer, it copies nothing.
#[derive(Debug)]
struct NfsBuf(IoBuf);

impl Deref for NfsBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl DerefMut for NfsBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl Sink for NfsBuf {
    type Shape = (usize, Range<usize>);

    fn shape(&self) -> Self::Shape {
        (self.0.capacity(), self.0.view())
    }

    fn remake((capacity, view): &Self::Shape) -> Self {
        let mut b = IoBuf::new(*capacity);
        b.set_view(view.start, view.len());
        Self(b)
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

fn describe(spec: &NfsSpec) -> String {
    ferry_core::EndpointSpec::Nfs(spec.clone()).to_string()
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

/// The capabilities of an NFS file (both versions): any alignment, at most `maximum`
/// (at least 4 KiB) per request, several connections.
fn caps(preferred: u32, maximum: u32, extents: bool, zero: bool) -> Caps {
    let maximum = maximum.max(MIN_MAX_REQUEST);
    Caps {
        extents,
        efficient_zero: zero,
        trim: zero,
        random_write: true,
        rewrite: true,
        read_while_writing: true,
        multi_conn: true,
        sequential_read: false,
        block: BlockSizes {
            minimum: 1,
            preferred: preferred.clamp(1, maximum),
            maximum,
        },
        request_size: Some(REQUEST_SIZE),
        work_unit: None,
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

/// Reads `buf`'s view from `offset` in READs of at most `rsize` bytes, each sent by
/// `read` (at, buffer viewing the piece) and answering (eof, bytes read), the buffer
/// coming back each time: the read loop of both versions.
async fn read_pieces<F, Fut>(
    describe: &str,
    size: u64,
    rsize: u32,
    offset: u64,
    mut buf: IoBuf,
    mut read: F,
) -> Result<IoBuf>
where
    F: FnMut(u64, NfsBuf) -> Fut,
    Fut: std::future::Future<Output = (Result<(bool, u32)>, Option<NfsBuf>)>,
{
    let len = buf.len();
    check_range(describe, size, "read", offset, len as u64)?;
    let view = buf.view();
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(rsize as usize);
        buf.set_view(view.start + done, n);
        let at = offset + done as u64;
        let (result, back) = read(at, NfsBuf(buf)).await;
        // The sink comes back from every call; a missing one is an empty buffer.
        buf = back.map_or_else(|| IoBuf::new(0), |b| b.0);
        let (eof, count) = result?;
        let count = count as usize;
        check_read_count(describe, size, at, n, count, eof)?;
        done += count;
    }
    buf.set_view(view.start, view.len());
    Ok(buf)
}

/// One flush of `commits`: nothing when no write is uncommitted, else `send` (the
/// COMMIT, answering the server's verifier) and the verifier check. A loss, seen now or
/// before, fails the flush of `describe` as Disconnected.
async fn commit<F, Fut>(commits: &ferry_nfs::Tracker, describe: &str, send: F) -> Result<()>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<ferry_nfs::Verifier>>,
{
    commits
        .commit(send, |lost| {
            Error::new(ErrorKind::Disconnected, lost.to_string())
                .with_operation("flush")
                .with_endpoint(describe.to_string())
        })
        .await
}

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

/// Writes `data` at `offset` in WRITEs of at most `wsize` bytes, each sent by `write`
/// (answering bytes written, how stable, the verifier); UNSTABLE ones are recorded in
/// `commits`: the write loop of both versions.
async fn write_pieces<'a, F, Fut>(
    describe: &str,
    commits: &ferry_nfs::Tracker,
    wsize: u32,
    op: &'static str,
    offset: u64,
    data: &'a [u8],
    write: F,
) -> Result<()>
where
    F: Fn(u64, &'a [u8]) -> Fut,
    Fut: std::future::Future<Output = Result<(u32, bool, ferry_nfs::Verifier)>>,
{
    let mut done = 0usize;
    while done < data.len() {
        let n = (data.len() - done).min(wsize as usize);
        let at = offset + done as u64;
        let (count, stable, verf) = write(at, &data[done..done + n]).await?;
        let count = count as usize;
        check_write_count(describe, op, at, n, count)?;
        if !stable {
            commits.record(at, count as u64, verf);
        }
        done += count;
    }
    Ok(())
}

/// An NFSv3 server's READ or WRITE sizes: (largest, preferred), bounded.
fn transfer(max: u32, pref: u32) -> (u32, u32) {
    let max = if max == 0 { DEFAULT_TRANSFER } else { max };
    let max = max.min(MAX_TRANSFER);
    let pref = if pref == 0 { max } else { pref.min(max) };
    (max, pref)
}
