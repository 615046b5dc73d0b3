//! NFSv3 procedures on one connection to the NFS service, with the retries NFS clients
//! make: a lost connection is re-established and the (idempotent) call sent again until
//! the reconnect window ends, and NFS3ERR_JUKEBOX is retried after a pause.
//!
//! Only idempotent procedures go through here after open (READ, WRITE, COMMIT, GETATTR,
//! SETATTR of the size, LOOKUP); CREATE is GUARDED and its EXIST answer is handled by the
//! caller. Writes resent after a reconnect carry the new server's verifier, so the commit
//! check in `commit.rs` sees a restart.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ferry_core::{ErrorKind, IoBuf};

use super::proto::{self, Attr, FileHandle, FsInfo, NfsStat, Verifier};
use super::rpc::{RpcConfig, RpcConn, RpcError};
use super::xdr::{Decoder, XdrError};

/// Connection settings of one server.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub rpc: RpcConfig,
    /// How long a lost connection is retried before a call fails.
    pub reconnect_timeout: Duration,
}

/// Why an NFS call failed.
#[derive(Debug, thiserror::Error)]
pub enum NfsError {
    #[error("{op}: {source}")]
    Rpc {
        op: &'static str,
        #[source]
        source: RpcError,
    },
    #[error("{op}: the server replied {status}")]
    Status { op: &'static str, status: NfsStat },
    #[error("{op}: malformed reply: {message}")]
    Malformed { op: &'static str, message: String },
}

impl NfsError {
    fn malformed(op: &'static str, e: XdrError) -> Self {
        Self::Malformed { op, message: e.0 }
    }

    pub fn status(&self) -> Option<NfsStat> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The ferry error kind this failure belongs to.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Rpc { source, .. } => rpc_kind(source),
            Self::Status { status, .. } => status_kind(*status),
            Self::Malformed { .. } => ErrorKind::Protocol,
        }
    }
}

pub fn rpc_kind(e: &RpcError) -> ErrorKind {
    match e {
        RpcError::Connect { source, .. } => match ErrorKind::from_io(source) {
            ErrorKind::Io | ErrorKind::NotFound => ErrorKind::Disconnected,
            k => k,
        },
        RpcError::ConnectTimeout { .. } | RpcError::Timeout { .. } => ErrorKind::Timeout,
        RpcError::Disconnected { .. } => ErrorKind::Disconnected,
        RpcError::GarbageArgs { .. } => ErrorKind::Protocol,
        RpcError::ProgramUnavailable { .. }
        | RpcError::VersionMismatch { .. }
        | RpcError::ProcedureUnavailable { .. } => ErrorKind::Unsupported,
        RpcError::SystemError { .. } => ErrorKind::Io,
        RpcError::Auth { .. } => ErrorKind::PermissionDenied,
    }
}

pub fn status_kind(status: NfsStat) -> ErrorKind {
    match status {
        NfsStat::PERM | NfsStat::ACCES | NfsStat::ROFS => ErrorKind::PermissionDenied,
        NfsStat::NOENT | NfsStat::STALE | NfsStat::BADHANDLE => ErrorKind::NotFound,
        NfsStat::NOSPC | NfsStat::DQUOT => ErrorKind::NoSpace,
        NfsStat::INVAL | NfsStat::FBIG | NfsStat::ISDIR | NfsStat::NOTDIR => {
            ErrorKind::InvalidInput
        }
        NfsStat::NOTSUPP => ErrorKind::Unsupported,
        NfsStat::JUKEBOX => ErrorKind::Timeout,
        _ => ErrorKind::Io,
    }
}

fn retryable(e: &RpcError) -> bool {
    matches!(
        e,
        RpcError::Disconnected { .. } | RpcError::Connect { .. } | RpcError::ConnectTimeout { .. }
    )
}

/// One connection to a server's NFS service (re-established when lost).
#[derive(Debug)]
pub struct NfsConn {
    addr: SocketAddr,
    config: ClientConfig,
    conn: tokio::sync::Mutex<Option<RpcConn>>,
}

impl NfsConn {
    /// Connects now, so that a wrong port or a down server fails the open.
    pub async fn connect(addr: SocketAddr, config: &ClientConfig) -> Result<Self, RpcError> {
        let conn =
            RpcConn::connect(addr, proto::NFS_PROGRAM, proto::NFS_VERSION, &config.rpc).await?;
        Ok(Self {
            addr,
            config: config.clone(),
            conn: tokio::sync::Mutex::new(Some(conn)),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    async fn rpc(&self) -> Result<RpcConn, RpcError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        *slot = None;
        let c = RpcConn::connect(
            self.addr,
            proto::NFS_PROGRAM,
            proto::NFS_VERSION,
            &self.config.rpc,
        )
        .await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// One call, retried over new connections while the reconnect window lasts and after
    /// JUKEBOX while the request timeout lasts. Returns the reply body (status first) and
    /// the sink, which always comes back when one was given.
    async fn call(
        &self,
        op: &'static str,
        procedure: u32,
        args: &[u8],
        data: Option<&[u8]>,
        mut sink: Option<IoBuf>,
    ) -> (Result<Vec<u8>, NfsError>, Option<IoBuf>) {
        let shape = sink.as_ref().map(|b| (b.capacity(), b.view()));
        let restore = |sink: Option<IoBuf>| {
            sink.or_else(|| {
                shape.clone().map(|(cap, view)| {
                    let mut b = IoBuf::new(cap);
                    b.set_view(view.start, view.len());
                    b
                })
            })
        };
        let start = Instant::now();
        let mut delay = Duration::from_millis(50);
        loop {
            let result = match self.rpc().await {
                Ok(conn) => {
                    let out = conn.call(procedure, args, data, sink.take()).await;
                    sink = restore(out.sink);
                    out.result
                }
                Err(e) => Err(e),
            };
            let again = match &result {
                Ok(body) => {
                    body.get(..4) == Some(&NfsStat::JUKEBOX.0.to_be_bytes()[..])
                        && start.elapsed() < self.config.rpc.request_timeout
                }
                Err(e) => retryable(e) && start.elapsed() < self.config.reconnect_timeout,
            };
            if !again {
                return (result.map_err(|source| NfsError::Rpc { op, source }), sink);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    /// A call whose reply starts with an nfsstat3; returns the body after an OK status.
    async fn call_ok(
        &self,
        op: &'static str,
        procedure: u32,
        args: &[u8],
    ) -> Result<Vec<u8>, NfsError> {
        let body = self.call(op, procedure, args, None, None).await.0?;
        check_status(op, &body)?;
        Ok(body)
    }

    pub async fn getattr(&self, fh: &FileHandle) -> Result<Attr, NfsError> {
        let op = "GETATTR";
        let body = self
            .call_ok(op, proto::NFSPROC_GETATTR, proto::fh_args(fh).as_slice())
            .await?;
        Attr::decode(&mut after_status(&body)).map_err(|e| NfsError::malformed(op, e))
    }

    /// The handle and attributes of `name` in `dir`, or None when it does not exist.
    pub async fn lookup(
        &self,
        dir: &FileHandle,
        name: &str,
    ) -> Result<Option<(FileHandle, Option<Attr>)>, NfsError> {
        let op = "LOOKUP";
        let body = self
            .call(
                op,
                proto::NFSPROC_LOOKUP,
                proto::lookup_args(dir, name).as_slice(),
                None,
                None,
            )
            .await
            .0?;
        match check_status(op, &body) {
            Ok(()) => proto::lookup_ok(&mut after_status(&body))
                .map(Some)
                .map_err(|e| NfsError::malformed(op, e)),
            Err(e) if e.status() == Some(NfsStat::NOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates `name` in `dir` (GUARDED): its handle (when the server returned one), or
    /// None when it exists already.
    pub async fn create(
        &self,
        dir: &FileHandle,
        name: &str,
        mode: u32,
    ) -> Result<Option<Option<FileHandle>>, NfsError> {
        let op = "CREATE";
        let body = self
            .call(
                op,
                proto::NFSPROC_CREATE,
                proto::create_args(dir, name, mode).as_slice(),
                None,
                None,
            )
            .await
            .0?;
        match check_status(op, &body) {
            Ok(()) => proto::create_ok(&mut after_status(&body))
                .map(|(fh, _)| Some(fh))
                .map_err(|e| NfsError::malformed(op, e)),
            Err(e) if e.status() == Some(NfsStat::EXIST) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn set_size(&self, fh: &FileHandle, size: u64) -> Result<(), NfsError> {
        self.call_ok(
            "SETATTR",
            proto::NFSPROC_SETATTR,
            proto::setattr_size_args(fh, size).as_slice(),
        )
        .await
        .map(|_| ())
    }

    pub async fn fsinfo(&self, fh: &FileHandle) -> Result<FsInfo, NfsError> {
        let op = "FSINFO";
        let body = self
            .call_ok(op, proto::NFSPROC_FSINFO, proto::fh_args(fh).as_slice())
            .await?;
        proto::fsinfo_ok(&mut after_status(&body)).map_err(|e| NfsError::malformed(op, e))
    }

    /// Reads up to `buf.len()` bytes at `offset` into the start of the buffer's view:
    /// the bytes read and whether the file ends there.
    pub async fn read(
        &self,
        fh: &FileHandle,
        offset: u64,
        buf: IoBuf,
    ) -> (Result<(u32, bool), NfsError>, IoBuf) {
        let op = "READ";
        let count = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let args = proto::read_args(fh, offset, count);
        let (result, sink) = self
            .call(op, proto::NFSPROC_READ, args.as_slice(), None, Some(buf))
            .await;
        let buf = sink.unwrap_or_else(|| IoBuf::new(0));
        let result = result.and_then(|body| {
            check_status(op, &body)?;
            let mut d = after_status(&body);
            let parsed = (|| {
                proto::post_op_attr(&mut d)?;
                let count = d.u32()?;
                let eof = d.bool()?;
                Ok::<_, XdrError>((count, eof))
            })();
            parsed.map_err(|e| NfsError::malformed(op, e))
        });
        (result, buf)
    }

    /// Writes `data` at `offset`: bytes written, how stable they are, the verifier.
    pub async fn write(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
        stable: u32,
    ) -> Result<(u32, u32, Verifier), NfsError> {
        let op = "WRITE";
        let len = u32::try_from(data.len()).map_err(|_| NfsError::Malformed {
            op,
            message: format!("write of {} bytes is too large", data.len()),
        })?;
        let args = proto::write_args_head(fh, offset, len, stable);
        let body = self
            .call(op, proto::NFSPROC_WRITE, args.as_slice(), Some(data), None)
            .await
            .0?;
        check_status(op, &body)?;
        proto::write_ok(&mut after_status(&body)).map_err(|e| NfsError::malformed(op, e))
    }

    /// Commits the whole file; returns the server's verifier.
    pub async fn commit(&self, fh: &FileHandle) -> Result<Verifier, NfsError> {
        let op = "COMMIT";
        let body = self
            .call_ok(
                op,
                proto::NFSPROC_COMMIT,
                proto::commit_args(fh, 0, 0).as_slice(),
            )
            .await?;
        proto::commit_ok(&mut after_status(&body)).map_err(|e| NfsError::malformed(op, e))
    }
}

fn check_status(op: &'static str, body: &[u8]) -> Result<(), NfsError> {
    let status = Decoder::new(body)
        .u32()
        .map_err(|e| NfsError::malformed(op, e))?;
    if status == 0 {
        Ok(())
    } else {
        Err(NfsError::Status {
            op,
            status: NfsStat(status),
        })
    }
}

fn after_status(body: &[u8]) -> Decoder<'_> {
    Decoder::new(body.get(4..).unwrap_or_default())
}
