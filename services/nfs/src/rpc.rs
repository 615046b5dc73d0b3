//! ONC RPC (RFC 5531) over TCP with record marking: many calls in flight on one
//! connection, matched to their replies by xid, with AUTH_SYS credentials.
//!
//! Why not an existing crate: the NFSv3 clients on crates.io send one call at a time per
//! connection and copy every READ reply twice. Here a reader task owns the socket's read
//! half and places READ data straight into the caller's buffer (a [`Sink`]); WRITE data goes from
//! the caller's buffer to the socket. Every length read from the wire is bounded; a
//! malformed reply closes the connection, it never panics.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::error::{connect_kind, ErrorKind};
use crate::xdr::{padding, Decoder, Encoder};

/// Largest record accepted from the server: the largest READ ferry asks for plus headers.
pub const MAX_RECORD: usize = 64 * 1024 * 1024 + 64 * 1024;
/// Largest reply other than READ data that is buffered whole.
const MAX_SMALL_REPLY: usize = 1024 * 1024;
/// Fragments one record may have, so a stream of empty fragments cannot spin forever.
const MAX_FRAGMENTS: usize = 65_536;
/// Longest RPC verifier body (RFC 5531: 400 bytes).
const MAX_AUTH: usize = 400;
/// Longest AUTH_SYS machine name (RFC 5531).
const MAX_MACHINE_NAME: usize = 255;
/// Record marking: the fragment header's last-fragment bit; the rest is the length.
const LAST_FRAGMENT: u32 = 0x8000_0000;
/// msg_type of a call and of a reply, and the RPC version (RFC 5531).
const CALL: u32 = 0;
const REPLY: u32 = 1;
const RPC_VERSION: u32 = 2;
/// A call's header words after the record mark: xid, msg_type, rpcvers, prog, vers, proc.
const CALL_HEADER_LEN: usize = 6 * 4;
/// reply_stat and accept_stat values.
const MSG_ACCEPTED: u32 = 0;
const MSG_DENIED: u32 = 1;
const SUCCESS: u32 = 0;
/// Auth flavors.
const AUTH_NONE: u32 = 0;
const AUTH_SYS: u32 = 1;
/// Read buffer of the reply reader: headers come from it, large READ data bypasses it.
const READ_BUFFER: usize = 256 * 1024;
/// Reserved source ports tried (600..1024, as libtirpc's bindresvport), at most
/// [`RESERVED_PORT_TRIES`] of them, [`RESERVED_PORT_STRIDE`] apart from a random start.
const RESERVED_PORTS: std::ops::Range<u16> = 600..1024;
const RESERVED_PORT_TRIES: u32 = 32;
const RESERVED_PORT_STRIDE: u32 = 13;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to {addr} timed out after {after:?}")]
    ConnectTimeout { addr: SocketAddr, after: Duration },
    #[error("connection to {addr} lost: {reason}")]
    Disconnected { addr: SocketAddr, reason: String },
    #[error("no reply from {addr} within {after:?}")]
    Timeout { addr: SocketAddr, after: Duration },
    #[error("{addr} does not serve RPC program {program} version {version}")]
    ProgramUnavailable {
        addr: SocketAddr,
        program: u32,
        version: u32,
    },
    #[error("{addr} serves RPC program {program} only in versions {low} to {high}, not {version}")]
    VersionMismatch {
        addr: SocketAddr,
        program: u32,
        version: u32,
        low: u32,
        high: u32,
    },
    #[error("{addr} does not implement procedure {procedure} of RPC program {program}")]
    ProcedureUnavailable {
        addr: SocketAddr,
        program: u32,
        procedure: u32,
    },
    #[error("{addr} could not decode the arguments (GARBAGE_ARGS)")]
    GarbageArgs { addr: SocketAddr },
    #[error("{addr} reported a system error (SYSTEM_ERR)")]
    SystemError { addr: SocketAddr },
    #[error("{addr} refused the credentials: {reason}")]
    Auth { addr: SocketAddr, reason: String },
}

/// Credentials and limits of a connection.
#[derive(Debug, Clone)]
pub struct RpcConfig {
    pub uid: u32,
    pub gid: u32,
    /// The AUTH_SYS machine name (at most 255 bytes are sent).
    pub machine: String,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    /// Bind a reserved source port (below 1024) first, as servers exporting with the
    /// `secure` option require; falls back to any port.
    pub privileged_port: bool,
}

/// What a reply delivered: the reply body after the RPC header (for READ, up to the data),
/// and the caller's buffer back (holding READ data at its view's start).
#[derive(Debug)]
pub struct Outcome<B> {
    pub result: Result<Vec<u8>, RpcError>,
    pub sink: Option<B>,
}

/// A buffer READ data is placed into: owned, so it travels with the call to the
/// connection's reader task and back. The data lands at the start of the slice it derefs
/// to.
pub trait Sink: std::ops::DerefMut<Target = [u8]> + Send + 'static {
    /// What [`Sink::remake`] needs to make an equal buffer.
    type Shape: Clone + Send + Sync;
    fn shape(&self) -> Self::Shape;
    /// A buffer shaped like the one `shape` was taken from (its contents do not matter):
    /// the replacement for a buffer that went down with its connection, so the call can
    /// be retried.
    fn remake(shape: &Self::Shape) -> Self;
}

impl Sink for Vec<u8> {
    type Shape = usize;
    fn shape(&self) -> usize {
        self.len()
    }
    fn remake(len: &usize) -> Self {
        vec![0; *len]
    }
}

/// Keeps a call's sink across retries: the sink comes back with every outcome, or is
/// remade when its connection failed while holding it.
pub(crate) struct SinkKeeper<B: Sink>(Option<B::Shape>);

impl<B: Sink> SinkKeeper<B> {
    pub(crate) fn new(sink: Option<&B>) -> Self {
        Self(sink.map(B::shape))
    }

    pub(crate) fn restore(&self, sink: Option<B>) -> Option<B> {
        sink.or_else(|| self.0.as_ref().map(B::remake))
    }
}

impl RpcError {
    /// The connection is gone (or never came): the call may be sent again on a new one.
    pub fn is_connection_loss(&self) -> bool {
        matches!(
            self,
            Self::Disconnected { .. } | Self::Connect { .. } | Self::ConnectTimeout { .. }
        )
    }

    /// The server lacks program version `version` (it answered PROG_UNAVAIL or
    /// PROG_MISMATCH to a call of that version).
    pub fn is_missing_version(&self, version: u32) -> bool {
        matches!(
            self,
            Self::ProgramUnavailable { version: v, .. } | Self::VersionMismatch { version: v, .. }
                if *v == version
        )
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Connect { source, .. } => connect_kind(source),
            Self::ConnectTimeout { .. } | Self::Timeout { .. } => ErrorKind::Timeout,
            Self::Disconnected { .. } => ErrorKind::Disconnected,
            Self::GarbageArgs { .. } => ErrorKind::Protocol,
            Self::ProgramUnavailable { .. }
            | Self::VersionMismatch { .. }
            | Self::ProcedureUnavailable { .. } => ErrorKind::Unsupported,
            Self::SystemError { .. } => ErrorKind::Io,
            Self::Auth { .. } => ErrorKind::PermissionDenied,
        }
    }
}

struct Pending<B> {
    tx: oneshot::Sender<Outcome<B>>,
    sink: Option<B>,
    shape: ReadShape,
}

/// How a reply that carries READ data into a sink is laid out before the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadShape {
    /// An NFSv3 READ3res.
    Read3,
    /// An NFSv4 COMPOUND4res whose results are `before` (each an opcode and the length
    /// of its successful result after the status word) and then `read_op`'s READ4resok
    /// (eof, data). A failed operation ends the reply, which is then buffered whole.
    Compound4 {
        before: &'static [(u32, usize)],
        read_op: u32,
    },
}

struct State<B> {
    pending: HashMap<u32, Pending<B>>,
    closed: Option<String>,
}

impl<B> Default for State<B> {
    fn default() -> Self {
        Self {
            pending: HashMap::new(),
            closed: None,
        }
    }
}

struct Shared<B> {
    addr: SocketAddr,
    state: Mutex<State<B>>,
}

impl<B> Shared<B> {
    fn lock(&self) -> parking_lot::MutexGuard<'_, State<B>> {
        self.state.lock()
    }

    /// Marks the connection dead and fails every call in flight.
    fn close(&self, reason: &str) {
        let pending = {
            let mut st = self.lock();
            st.closed.get_or_insert_with(|| reason.to_string());
            std::mem::take(&mut st.pending)
        };
        for (_, p) in pending {
            let _ = p.tx.send(Outcome {
                result: Err(RpcError::Disconnected {
                    addr: self.addr,
                    reason: reason.to_string(),
                }),
                sink: p.sink,
            });
        }
    }
}

/// One TCP connection to one RPC program. Cheap to clone; the socket closes when the last
/// clone is dropped. `B` is the buffer type READ data is placed into.
pub struct RpcConn<B = Vec<u8>> {
    inner: Arc<Inner<B>>,
}

impl<B> Clone for RpcConn<B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<B> std::fmt::Debug for RpcConn<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcConn")
            .field("addr", &self.inner.shared.addr)
            .field("program", &self.inner.program)
            .finish_non_exhaustive()
    }
}

struct Inner<B> {
    shared: Arc<Shared<B>>,
    writer: tokio::sync::Mutex<Option<OwnedWriteHalf>>,
    program: u32,
    version: u32,
    xid: AtomicU32,
    /// Encoded credential and verifier, the same for every call.
    auth: Vec<u8>,
    request_timeout: Duration,
    reader: JoinHandle<()>,
}

impl<B> Inner<B> {
    /// The record mark, call header, credentials and `args` of call `xid`, whose
    /// `data_len` bytes of data (and their padding) follow on the wire.
    fn call_head(&self, xid: u32, procedure: u32, args: &[u8], data_len: usize) -> Vec<u8> {
        let body_len =
            CALL_HEADER_LEN + self.auth.len() + args.len() + data_len + padding(data_len);
        let mut head = Encoder::with_capacity(4 + body_len - data_len);
        head.u32(LAST_FRAGMENT | body_len as u32);
        head.u32(xid)
            .u32(CALL)
            .u32(RPC_VERSION)
            .u32(self.program)
            .u32(self.version)
            .u32(procedure);
        let mut head = head.into_vec();
        head.extend_from_slice(&self.auth);
        head.extend_from_slice(args);
        head
    }
}

impl<B> Drop for Inner<B> {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn auth_sys(config: &RpcConfig) -> Vec<u8> {
    let machine = config.machine.as_bytes();
    let machine = &machine[..machine.len().min(MAX_MACHINE_NAME)];
    let mut body = Encoder::new();
    body.u32(0) // stamp
        .opaque(machine)
        .u32(config.uid)
        .u32(config.gid)
        .u32(0); // no supplementary groups
    let mut e = Encoder::new();
    e.u32(AUTH_SYS).opaque(body.as_slice());
    e.u32(AUTH_NONE).u32(0); // the verifier
    e.into_vec()
}

fn initial_xid() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    nanos ^ std::process::id().rotate_left(16)
}

async fn connect_tcp(addr: SocketAddr, privileged: bool) -> std::io::Result<TcpStream> {
    if privileged {
        let span = u32::from(RESERVED_PORTS.end - RESERVED_PORTS.start);
        let start = initial_xid() % span;
        for i in 0..RESERVED_PORT_TRIES {
            let port = RESERVED_PORTS.start + ((start + i * RESERVED_PORT_STRIDE) % span) as u16;
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            let local = SocketAddr::new(
                if addr.is_ipv4() {
                    std::net::Ipv4Addr::UNSPECIFIED.into()
                } else {
                    std::net::Ipv6Addr::UNSPECIFIED.into()
                },
                port,
            );
            if socket.bind(local).is_err() {
                continue;
            }
            match socket.connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::AddrInUse | std::io::ErrorKind::AddrNotAvailable
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }
    TcpStream::connect(addr).await
}

impl<B: Sink> RpcConn<B> {
    /// Connects to `addr` for `program`/`version`.
    pub async fn connect(
        addr: SocketAddr,
        program: u32,
        version: u32,
        config: &RpcConfig,
    ) -> Result<Self, RpcError> {
        let stream = tokio::time::timeout(
            config.connect_timeout,
            connect_tcp(addr, config.privileged_port),
        )
        .await
        .map_err(|_| RpcError::ConnectTimeout {
            addr,
            after: config.connect_timeout,
        })?
        .map_err(|source| RpcError::Connect { addr, source })?;
        stream.set_nodelay(true).ok();
        let (rd, wr) = stream.into_split();
        let shared = Arc::new(Shared {
            addr,
            state: Mutex::new(State::default()),
        });
        let reader = tokio::spawn(read_loop(Arc::clone(&shared), rd));
        Ok(Self {
            inner: Arc::new(Inner {
                shared,
                writer: tokio::sync::Mutex::new(Some(wr)),
                program,
                version,
                xid: AtomicU32::new(initial_xid()),
                auth: auth_sys(config),
                request_timeout: config.request_timeout,
                reader,
            }),
        })
    }

    /// Whether the connection has failed (calls on it fail at once).
    pub fn is_closed(&self) -> bool {
        self.inner.shared.lock().closed.is_some()
    }

    /// Calls `procedure` with encoded `args`, followed on the wire by `data` as the
    /// variable-length opaque the args' last word announced (WRITE). With a `sink`, the
    /// reply is an NFSv3 READ reply whose data lands at the start of the sink's view.
    pub async fn call(
        &self,
        procedure: u32,
        args: &[u8],
        data: Option<&[u8]>,
        sink: Option<B>,
    ) -> Outcome<B> {
        self.call_shaped(procedure, args, data, sink, ReadShape::Read3)
            .await
    }

    /// [`RpcConn::call`] where a sink's reply has the layout `shape`.
    pub async fn call_shaped(
        &self,
        procedure: u32,
        args: &[u8],
        data: Option<&[u8]>,
        sink: Option<B>,
        shape: ReadShape,
    ) -> Outcome<B> {
        let inner = &*self.inner;
        let addr = inner.shared.addr;
        let xid = inner.xid.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut st = inner.shared.lock();
            if let Some(reason) = &st.closed {
                return Outcome {
                    result: Err(RpcError::Disconnected {
                        addr,
                        reason: reason.clone(),
                    }),
                    sink,
                };
            }
            st.pending.insert(xid, Pending { tx, sink, shape });
        }
        let guard = PendingGuard {
            shared: &inner.shared,
            xid,
        };
        let head = inner.call_head(xid, procedure, args, data.map_or(0, <[u8]>::len));
        let exchange = async {
            {
                let mut writer = inner.writer.lock().await;
                let mut sending = SendGuard {
                    shared: &inner.shared,
                    writer: &mut writer,
                    done: false,
                };
                // A failed send closes the connection, which answers this call (with
                // its buffer) like every other one in flight.
                sending.send(&head, data).await;
            }
            rx.await.map_err(|_| ())
        };
        match tokio::time::timeout(inner.request_timeout, exchange).await {
            Ok(Ok(mut outcome)) => {
                std::mem::forget(guard);
                name_call(&mut outcome.result, inner.program, inner.version, procedure);
                outcome
            }
            Ok(Err(())) => {
                // In a statement of its own: a lock guard living on into `take_sink`
                // would deadlock on the same mutex.
                let closed = inner.shared.lock().closed.clone();
                Outcome {
                    result: Err(RpcError::Disconnected {
                        addr,
                        reason: closed.unwrap_or_else(|| "the connection closed".to_string()),
                    }),
                    sink: guard.take_sink(),
                }
            }
            Err(_) => Outcome {
                result: Err(RpcError::Timeout {
                    addr,
                    after: inner.request_timeout,
                }),
                sink: guard.take_sink(),
            },
        }
    }
}

/// Fills in the program, version and procedure of an error the reader could not know.
fn name_call(result: &mut Result<Vec<u8>, RpcError>, prog: u32, vers: u32, procedure: u32) {
    match result {
        Err(RpcError::ProgramUnavailable {
            program, version, ..
        })
        | Err(RpcError::VersionMismatch {
            program, version, ..
        }) => {
            *program = prog;
            *version = vers;
        }
        Err(RpcError::ProcedureUnavailable {
            program,
            procedure: p,
            ..
        }) => {
            *program = prog;
            *p = procedure;
        }
        _ => {}
    }
}

/// Removes a call's entry when the caller stops waiting (timeout or cancellation).
struct PendingGuard<'a, B> {
    shared: &'a Shared<B>,
    xid: u32,
}

impl<B> PendingGuard<'_, B> {
    fn take_sink(self) -> Option<B> {
        let sink = self
            .shared
            .lock()
            .pending
            .remove(&self.xid)
            .and_then(|p| p.sink);
        std::mem::forget(self);
        sink
    }
}

impl<B> Drop for PendingGuard<'_, B> {
    fn drop(&mut self) {
        self.shared.lock().pending.remove(&self.xid);
    }
}

/// Closes the connection when a call is abandoned half sent: the stream would be corrupt.
struct SendGuard<'a, 'w, B> {
    shared: &'a Shared<B>,
    writer: &'w mut Option<OwnedWriteHalf>,
    done: bool,
}

impl<B> SendGuard<'_, '_, B> {
    async fn send(&mut self, head: &[u8], data: Option<&[u8]>) {
        let Some(w) = self.writer.as_mut() else {
            self.done = true;
            self.shared
                .close("a request was abandoned while being sent");
            return;
        };
        let result = async {
            w.write_all(head).await?;
            if let Some(data) = data {
                w.write_all(data).await?;
                w.write_all(&[0u8; 3][..padding(data.len())]).await?;
            }
            Ok::<_, std::io::Error>(())
        }
        .await;
        self.done = true;
        if let Err(e) = result {
            self.shared.close(&format!("send failed: {e}"));
        }
    }
}

impl<B> Drop for SendGuard<'_, '_, B> {
    fn drop(&mut self) {
        if !self.done {
            *self.writer = None;
            self.shared
                .close("a request was abandoned while being sent");
        }
    }
}

/// One record (RFC 5531 record marking), read across its fragments.
struct Record<'a, R> {
    r: &'a mut R,
    left: usize,
    last: bool,
    total: usize,
    fragments: usize,
}

#[derive(Debug)]
enum ReadError {
    Io(std::io::Error),
    Format(String),
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

impl<'a, R: AsyncRead + Unpin> Record<'a, R> {
    async fn start(r: &'a mut R) -> Result<Self, ReadError> {
        let mut rec = Self {
            r,
            left: 0,
            last: false,
            total: 0,
            fragments: 0,
        };
        rec.next_fragment().await?;
        Ok(rec)
    }

    async fn next_fragment(&mut self) -> Result<(), ReadError> {
        let header = self.r.read_u32().await?;
        self.fragments += 1;
        self.last = header & LAST_FRAGMENT != 0;
        self.left = (header & !LAST_FRAGMENT) as usize;
        self.total += self.left;
        if self.total > MAX_RECORD {
            return Err(ReadError::Format(format!(
                "reply record longer than {MAX_RECORD} bytes"
            )));
        }
        if self.fragments > MAX_FRAGMENTS {
            return Err(ReadError::Format(format!(
                "reply record in more than {MAX_FRAGMENTS} fragments"
            )));
        }
        Ok(())
    }

    /// Fills `buf` or fails when the record ends first.
    async fn read_exact(&mut self, mut buf: &mut [u8]) -> Result<(), ReadError> {
        while !buf.is_empty() {
            if self.left == 0 {
                if self.last {
                    return Err(ReadError::Format("reply ended early".into()));
                }
                self.next_fragment().await?;
                continue;
            }
            let n = self.left.min(buf.len());
            self.r.read_exact(&mut buf[..n]).await?;
            self.left -= n;
            buf = &mut buf[n..];
        }
        Ok(())
    }

    async fn u32(&mut self) -> Result<u32, ReadError> {
        let mut b = [0u8; 4];
        self.read_exact(&mut b).await?;
        Ok(u32::from_be_bytes(b))
    }

    /// Appends the rest of the record to `out`, at most `max` bytes in all.
    async fn read_rest(&mut self, out: &mut Vec<u8>, max: usize) -> Result<(), ReadError> {
        loop {
            if self.left > 0 {
                if out.len() + self.left > max {
                    return Err(ReadError::Format(format!("reply longer than {max} bytes")));
                }
                let start = out.len();
                out.resize(start + self.left, 0);
                self.r.read_exact(&mut out[start..]).await?;
                self.left = 0;
            }
            if self.last {
                return Ok(());
            }
            self.next_fragment().await?;
        }
    }

    /// Reads and drops the rest of the record.
    async fn discard(&mut self) -> Result<(), ReadError> {
        let mut scratch = [0u8; 8192];
        loop {
            while self.left > 0 {
                let n = self.left.min(scratch.len());
                self.r.read_exact(&mut scratch[..n]).await?;
                self.left -= n;
            }
            if self.last {
                return Ok(());
            }
            self.next_fragment().await?;
        }
    }
}

/// Reads replies until the connection fails, handing each to its caller.
async fn read_loop<B: Sink>(shared: Arc<Shared<B>>, rd: OwnedReadHalf) {
    let mut rd = BufReader::with_capacity(READ_BUFFER, rd);
    let reason = loop {
        if let Err(e) = read_one(&shared, &mut rd).await {
            break e.reason();
        }
    };
    shared.close(&reason);
}

impl ReadError {
    /// Why the connection closes.
    fn reason(self) -> String {
        match self {
            Self::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                "the server closed the connection".to_string()
            }
            Self::Io(e) => format!("receive failed: {e}"),
            Self::Format(m) => format!("malformed reply: {m}"),
        }
    }
}

/// Decodes one reply as a connection's reader does, from `wire` (the record, fragment
/// headers included): its xid and what the caller would get, READ data placed into
/// `sink` as `shape` lays it out. Err: why the reader would close the connection over
/// it (a malformed, oversized or incomplete reply). Every length is bounded as on a
/// connection; for tests and fuzzing.
pub fn decode_reply<B: Sink>(
    wire: &[u8],
    sink: Option<B>,
    shape: ReadShape,
) -> Result<(u32, Outcome<B>), String> {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let addr = SocketAddr::from(([0, 0, 0, 0], 0));
    let mut rd = wire;
    let decode = async {
        let (mut rec, xid) = reply_header(&mut rd).await?;
        let (result, sink) = read_reply(addr, &mut rec, sink, shape).await?;
        rec.discard().await?;
        Ok::<_, ReadError>((xid, Outcome { result, sink }))
    };
    let mut decode = std::pin::pin!(decode);
    // Reading a slice never waits: one poll runs the decoder to its end.
    match decode
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(result) => result.map_err(ReadError::reason),
        Poll::Pending => Err("the reply is incomplete".to_string()),
    }
}

/// Starts a record and reads its xid and message type, which must be a reply's.
async fn reply_header<R: AsyncRead + Unpin>(rd: &mut R) -> Result<(Record<'_, R>, u32), ReadError> {
    let mut rec = Record::start(rd).await?;
    let xid = rec.u32().await?;
    let mtype = rec.u32().await?;
    if mtype != REPLY {
        return Err(ReadError::Format(format!(
            "message type {mtype} where a reply was expected"
        )));
    }
    Ok((rec, xid))
}

async fn read_one<B: Sink, R: AsyncRead + Unpin>(
    shared: &Shared<B>,
    rd: &mut R,
) -> Result<(), ReadError> {
    let (mut rec, xid) = reply_header(rd).await?;
    let pending = shared.lock().pending.remove(&xid);
    let Some(Pending { tx, sink, shape }) = pending else {
        // A reply nobody waits for any more (its caller timed out).
        return rec.discard().await;
    };
    let (result, sink) = read_reply(shared.addr, &mut rec, sink, shape).await?;
    rec.discard().await?;
    let _ = tx.send(Outcome { result, sink });
    Ok(())
}

/// Reads a reply's body. Errors the caller should see are in the inner result; the outer
/// one is for a stream that cannot go on.
async fn read_reply<B: Sink, R: AsyncRead + Unpin>(
    addr: SocketAddr,
    rec: &mut Record<'_, R>,
    mut sink: Option<B>,
    shape: ReadShape,
) -> Result<(Result<Vec<u8>, RpcError>, Option<B>), ReadError> {
    let reply_stat = rec.u32().await?;
    if reply_stat == MSG_DENIED {
        let err = match rec.u32().await? {
            0 => {
                let low = rec.u32().await?;
                let high = rec.u32().await?;
                RpcError::Auth {
                    addr,
                    reason: format!("RPC version mismatch (server speaks {low} to {high})"),
                }
            }
            1 => RpcError::Auth {
                addr,
                reason: auth_stat_name(rec.u32().await?),
            },
            other => {
                return Err(ReadError::Format(format!("unknown reject status {other}")));
            }
        };
        return Ok((Err(err), sink));
    }
    if reply_stat != MSG_ACCEPTED {
        return Err(ReadError::Format(format!(
            "unknown reply status {reply_stat}"
        )));
    }
    let _flavor = rec.u32().await?;
    let len = rec.u32().await? as usize;
    if len > MAX_AUTH {
        return Err(ReadError::Format(format!(
            "verifier of {len} bytes exceeds {MAX_AUTH}"
        )));
    }
    let mut verf = [0u8; MAX_AUTH + 3];
    rec.read_exact(&mut verf[..len + padding(len)]).await?;
    let accept = rec.u32().await?;
    let err = match accept {
        SUCCESS => {
            let mut body = Vec::new();
            match sink.as_mut() {
                Some(buf) => match shape {
                    ReadShape::Read3 => read_data_reply(rec, &mut body, buf).await?,
                    ReadShape::Compound4 { before, read_op } => {
                        read_compound_data_reply(rec, &mut body, buf, before, read_op).await?
                    }
                },
                None => rec.read_rest(&mut body, MAX_SMALL_REPLY).await?,
            }
            return Ok((Ok(body), sink));
        }
        1 => RpcError::ProgramUnavailable {
            addr,
            program: 0,
            version: 0,
        },
        2 => RpcError::VersionMismatch {
            addr,
            program: 0,
            version: 0,
            low: rec.u32().await?,
            high: rec.u32().await?,
        },
        3 => RpcError::ProcedureUnavailable {
            addr,
            program: 0,
            procedure: 0,
        },
        4 => RpcError::GarbageArgs { addr },
        5 => RpcError::SystemError { addr },
        other => return Err(ReadError::Format(format!("unknown accept status {other}"))),
    };
    Ok((Err(err), sink))
}

/// A READ3res: status, post_op_attr, count, eof and the data's length go to `body`; the
/// data goes to the start of `buf`'s view.
async fn read_data_reply<R: AsyncRead + Unpin>(
    rec: &mut Record<'_, R>,
    body: &mut Vec<u8>,
    buf: &mut [u8],
) -> Result<(), ReadError> {
    let status = rec.u32().await?;
    body.extend_from_slice(&status.to_be_bytes());
    if status != 0 {
        return rec.read_rest(body, MAX_SMALL_REPLY).await;
    }
    let follows = rec.u32().await?;
    body.extend_from_slice(&follows.to_be_bytes());
    if follows == 1 {
        let mut attr = [0u8; crate::v3::proto::FATTR3_LEN];
        rec.read_exact(&mut attr).await?;
        body.extend_from_slice(&attr);
    }
    // count, eof, and the data's length word.
    let mut tail = [0u8; 3 * 4];
    rec.read_exact(&mut tail).await?;
    body.extend_from_slice(&tail);
    let mut d = Decoder::new(&tail);
    let count = d.u32().map_err(|e| ReadError::Format(e.0))? as usize;
    let _eof = d.u32().map_err(|e| ReadError::Format(e.0))?;
    let len = d.u32().map_err(|e| ReadError::Format(e.0))? as usize;
    if len != count || len > buf.len() {
        return Err(ReadError::Format(format!(
            "READ reply carries {len} bytes (count {count}) for a request of {}",
            buf.len()
        )));
    }
    rec.read_exact(&mut buf[..len]).await?;
    let mut pad = [0u8; 3];
    rec.read_exact(&mut pad[..padding(len)]).await
}

/// Longest COMPOUND tag accepted (NFS4_OPAQUE_LIMIT).
const MAX_TAG: usize = 1024;

/// A COMPOUND4res ending in a READ: everything up to the data's length word goes to
/// `body`, the data to the start of `buf`'s view. A reply that is not shaped as expected
/// (an operation failed, or other operations) is buffered whole for the caller to decode.
async fn read_compound_data_reply<R: AsyncRead + Unpin>(
    rec: &mut Record<'_, R>,
    body: &mut Vec<u8>,
    buf: &mut [u8],
    before: &[(u32, usize)],
    read_op: u32,
) -> Result<(), ReadError> {
    async fn word<R: AsyncRead + Unpin>(
        rec: &mut Record<'_, R>,
        body: &mut Vec<u8>,
    ) -> Result<u32, ReadError> {
        let v = rec.u32().await?;
        body.extend_from_slice(&v.to_be_bytes());
        Ok(v)
    }
    let status = word(rec, body).await?;
    let tag_len = word(rec, body).await? as usize;
    if tag_len > MAX_TAG {
        return Err(ReadError::Format(format!(
            "COMPOUND tag of {tag_len} bytes exceeds {MAX_TAG}"
        )));
    }
    let mut tag = [0u8; MAX_TAG + 3];
    let tag = &mut tag[..tag_len + padding(tag_len)];
    rec.read_exact(tag).await?;
    body.extend_from_slice(tag);
    let count = word(rec, body).await? as usize;
    if status != 0 || count != before.len() + 1 {
        return rec.read_rest(body, MAX_SMALL_REPLY).await;
    }
    for &(op, len) in before {
        if word(rec, body).await? != op || word(rec, body).await? != 0 {
            return rec.read_rest(body, MAX_SMALL_REPLY).await;
        }
        if len > MAX_SMALL_REPLY - body.len() {
            return Err(ReadError::Format(format!(
                "result of operation {op} announced as {len} bytes"
            )));
        }
        let start = body.len();
        body.resize(start + len, 0);
        rec.read_exact(&mut body[start..]).await?;
    }
    if word(rec, body).await? != read_op || word(rec, body).await? != 0 {
        return rec.read_rest(body, MAX_SMALL_REPLY).await;
    }
    let _eof = word(rec, body).await?;
    let len = word(rec, body).await? as usize;
    if len > buf.len() {
        return Err(ReadError::Format(format!(
            "READ reply carries {len} bytes for a request of {}",
            buf.len()
        )));
    }
    rec.read_exact(&mut buf[..len]).await?;
    let mut pad = [0u8; 3];
    rec.read_exact(&mut pad[..padding(len)]).await
}

fn auth_stat_name(stat: u32) -> String {
    match stat {
        1 => "AUTH_BADCRED (bad credentials)".into(),
        2 => "AUTH_REJECTEDCRED (the client must begin a new session)".into(),
        3 => "AUTH_BADVERF".into(),
        4 => "AUTH_REJECTEDVERF".into(),
        5 => "AUTH_TOOWEAK (the server requires stronger authentication than AUTH_SYS, or a reserved source port)".into(),
        6 => "AUTH_INVALIDRESP".into(),
        7 => "AUTH_FAILED".into(),
        other => format!("authentication error {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// A sink viewing part of a larger buffer, as the buffers of ferry's engine do.
    #[derive(Debug)]
    struct View {
        storage: Vec<u8>,
        start: usize,
        len: usize,
    }

    impl View {
        fn new(capacity: usize) -> Self {
            Self {
                storage: vec![0; capacity],
                start: 0,
                len: capacity,
            }
        }

        fn set_view(&mut self, start: usize, len: usize) {
            (self.start, self.len) = (start, len);
        }
    }

    impl std::ops::Deref for View {
        type Target = [u8];
        fn deref(&self) -> &[u8] {
            &self.storage[self.start..self.start + self.len]
        }
    }

    impl std::ops::DerefMut for View {
        fn deref_mut(&mut self) -> &mut [u8] {
            &mut self.storage[self.start..self.start + self.len]
        }
    }

    impl Sink for View {
        type Shape = (usize, usize, usize);
        fn shape(&self) -> Self::Shape {
            (self.storage.len(), self.start, self.len)
        }
        fn remake(&(capacity, start, len): &Self::Shape) -> Self {
            let mut v = Self::new(capacity);
            v.set_view(start, len);
            v
        }
    }

    fn config() -> RpcConfig {
        RpcConfig {
            uid: 1,
            gid: 2,
            machine: "test".into(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_millis(500),
            privileged_port: false,
        }
    }

    /// Reads one call record and returns (xid, whole record).
    async fn read_call(s: &mut TcpStream) -> (u32, Vec<u8>) {
        let h = s.read_u32().await.unwrap();
        let mut rec = vec![0u8; (h & !LAST_FRAGMENT) as usize];
        s.read_exact(&mut rec).await.unwrap();
        let xid = u32::from_be_bytes([rec[0], rec[1], rec[2], rec[3]]);
        (xid, rec)
    }

    fn reply(xid: u32, body: &[u8], split: bool) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u32(xid).u32(1).u32(0).u32(0).u32(0).u32(0);
        let mut msg = e.into_vec();
        msg.extend_from_slice(body);
        let mut out = Vec::new();
        if split {
            let (a, b) = msg.split_at(10);
            out.extend_from_slice(&(a.len() as u32).to_be_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(&(LAST_FRAGMENT | b.len() as u32).to_be_bytes());
            out.extend_from_slice(b);
        } else {
            out.extend_from_slice(&(LAST_FRAGMENT | msg.len() as u32).to_be_bytes());
            out.extend_from_slice(&msg);
        }
        out
    }

    #[tokio::test]
    async fn replies_out_of_order_and_fragmented_reach_their_callers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let (x1, c1) = read_call(&mut s).await;
            let (x2, _) = read_call(&mut s).await;
            // The credential is AUTH_SYS (flavor 1).
            assert_eq!(&c1[24..28], &1u32.to_be_bytes());
            s.write_all(&reply(x2, &[0, 0, 0, 2], true)).await.unwrap();
            s.write_all(&reply(x1, &[0, 0, 0, 1], false)).await.unwrap();
            let (x3, _) = read_call(&mut s).await;
            // A READ reply: status OK, no attributes, count 5, eof, data.
            let mut e = Encoder::new();
            e.u32(0).bool(false).u32(5).bool(true).opaque(b"hello");
            s.write_all(&reply(x3, e.as_slice(), true)).await.unwrap();
            s
        });
        let conn = RpcConn::<View>::connect(addr, 7, 1, &config())
            .await
            .unwrap();
        let (a, b) = tokio::join!(conn.call(1, &[], None, None), conn.call(2, &[], None, None));
        assert_eq!(a.result.unwrap(), [0, 0, 0, 1]);
        assert_eq!(b.result.unwrap(), [0, 0, 0, 2]);
        let mut buf = View::new(16);
        buf.set_view(4, 8);
        let out = conn.call(6, &[], None, Some(buf)).await;
        let body = out.result.unwrap();
        assert_eq!(body.len(), 20);
        let buf = out.sink.unwrap();
        assert_eq!(&buf[..5], b"hello");
        let _s = server.await.unwrap();
    }

    const SHAPE: ReadShape = ReadShape::Compound4 {
        before: &[(53, 8), (22, 0)],
        read_op: 25,
    };

    /// A COMPOUND4res: status, empty tag, count, then `results` as given.
    fn compound_reply(status: u32, count: u32, results: &[u8]) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u32(status).opaque(b"").u32(count);
        let mut v = e.into_vec();
        v.extend_from_slice(results);
        v
    }

    #[tokio::test]
    async fn compound_read_data_lands_in_the_sink_and_failures_are_buffered() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            // SEQUENCE (8 bytes of result here), PUTFH, READ of 5 bytes.
            let (x, _) = read_call(&mut s).await;
            let mut e = Encoder::new();
            e.u32(53).u32(0).u64(7).u32(22).u32(0);
            e.u32(25).u32(0).bool(true).opaque(b"hello");
            let body = compound_reply(0, 3, e.as_slice());
            s.write_all(&reply(x, &body, true)).await.unwrap();
            // PUTFH failed: the reply is buffered whole, the sink untouched.
            let (x, _) = read_call(&mut s).await;
            let mut e = Encoder::new();
            e.u32(53).u32(0).u64(7).u32(22).u32(70);
            let body = compound_reply(70, 2, e.as_slice());
            s.write_all(&reply(x, &body, false)).await.unwrap();
            // More data than the sink holds: the connection is closed.
            let (x, _) = read_call(&mut s).await;
            let mut e = Encoder::new();
            e.u32(53).u32(0).u64(7).u32(22).u32(0);
            e.u32(25).u32(0).bool(false).opaque(&[1u8; 64]);
            let body = compound_reply(0, 3, e.as_slice());
            s.write_all(&reply(x, &body, false)).await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
        });
        let conn = RpcConn::<View>::connect(addr, 100_003, 4, &config())
            .await
            .unwrap();
        let mut buf = View::new(16);
        buf.set_view(2, 8);
        let out = conn.call_shaped(1, &[], None, Some(buf), SHAPE).await;
        let body = out.result.unwrap();
        let mut d = Decoder::new(&body);
        assert_eq!(d.u32().unwrap(), 0);
        d.opaque(8, "tag").unwrap();
        assert_eq!(d.u32().unwrap(), 3);
        d.skip(4 * 4 + 8).unwrap();
        assert_eq!((d.u32().unwrap(), d.u32().unwrap()), (25, 0));
        assert!(d.bool().unwrap());
        assert_eq!(d.u32().unwrap(), 5, "the data's length, without the data");
        assert_eq!(d.remaining(), 0);
        assert_eq!(&out.sink.unwrap()[..5], b"hello");

        let out = conn
            .call_shaped(1, &[], None, Some(View::new(8)), SHAPE)
            .await;
        let body = out.result.unwrap();
        assert_eq!(&body[..4], &70u32.to_be_bytes());
        assert_eq!(body.len(), 12 + 8 + 8 + 8);
        assert!(out.sink.is_some());

        let out = conn
            .call_shaped(1, &[], None, Some(View::new(8)), SHAPE)
            .await;
        match out.result {
            Err(RpcError::Disconnected { reason, .. }) => {
                assert!(reason.contains("READ reply carries 64 bytes"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        // The buffer went down with the connection; callers make a new one to retry.
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_silent_server_times_out_and_a_closed_one_disconnects() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            read_call(&mut s).await;
            read_call(&mut s).await;
            drop(s);
        });
        let conn = RpcConn::<View>::connect(addr, 7, 1, &config())
            .await
            .unwrap();
        let out = conn.call(1, &[], None, Some(View::new(8))).await;
        assert!(
            matches!(out.result, Err(RpcError::Timeout { .. })),
            "{out:?}"
        );
        assert!(out.sink.is_some(), "the buffer comes back after a timeout");
        let out = conn.call(1, &[], None, None).await;
        assert!(
            matches!(out.result, Err(RpcError::Disconnected { .. })),
            "{out:?}"
        );
        server.await.unwrap();
        assert!(conn.is_closed());
    }

    /// A server dropping the connection while a large WRITE is being sent: the send
    /// fails, and the call must come back with its error (it once deadlocked here, on the
    /// connection state's mutex, which the error path locked twice).
    #[test]
    fn a_connection_lost_while_sending_fails_the_call() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let out = rt.block_on(async {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                tokio::spawn(async move {
                    let (mut s, _) = listener.accept().await.unwrap();
                    let mut head = [0u8; 4];
                    s.read_exact(&mut head).await.unwrap();
                    // Closed with data unread: the kernel resets the connection.
                    drop(s);
                });
                let conn = RpcConn::<View>::connect(addr, 7, 1, &config())
                    .await
                    .unwrap();
                let data = vec![7u8; 32 << 20];
                conn.call(7, &[0, 0, 0, 1], Some(&data), Some(View::new(8)))
                    .await
            });
            let _ = done_tx.send(out);
        });
        let out = done_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the call must return, not hang");
        assert!(
            matches!(out.result, Err(RpcError::Disconnected { .. })),
            "{out:?}"
        );
        assert!(
            out.sink.is_some(),
            "the buffer comes back after a failed send"
        );
    }

    #[tokio::test]
    async fn an_oversized_record_closes_the_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            read_call(&mut s).await;
            s.write_all(&0xffff_ffffu32.to_be_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
        });
        let conn = RpcConn::<View>::connect(addr, 7, 1, &config())
            .await
            .unwrap();
        let out = conn.call(1, &[], None, None).await;
        match out.result {
            Err(RpcError::Disconnected { reason, .. }) => {
                assert!(reason.contains("longer than"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
}
