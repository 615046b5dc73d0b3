//! NFSv3 procedures on one connection to the NFS service, with the retries NFS clients
//! make: a lost connection is re-established and the (idempotent) call sent again until
//! the reconnect window ends, and NFS3ERR_JUKEBOX is retried after a pause.
//!
//! Only idempotent procedures go through here after open (READ, WRITE, COMMIT, GETATTR,
//! SETATTR of the size, LOOKUP); CREATE is GUARDED and its EXIST answer is handled by the
//! caller. Writes resent after a reconnect carry the new server's verifier, so the commit
//! check in `commit.rs` sees a restart.

use std::net::SocketAddr;

use super::proto::{self, Attr, FileHandle, FsInfo, NfsStat, Verifier};
use crate::error::{Error, ErrorKind, Result};
use crate::retry::{Retry, FIRST_DELAY};
use crate::rpc::{RpcConn, Sink, SinkKeeper};
use crate::xdr::{Decoder, XdrError};
use crate::ClientConfig;

impl NfsStat {
    /// The kind of failure this status is.
    pub fn kind(self) -> ErrorKind {
        match self {
            Self::PERM | Self::ACCES | Self::ROFS => ErrorKind::PermissionDenied,
            Self::NOENT | Self::STALE | Self::BADHANDLE => ErrorKind::NotFound,
            Self::NOSPC | Self::DQUOT => ErrorKind::NoSpace,
            Self::INVAL | Self::FBIG | Self::ISDIR | Self::NOTDIR => ErrorKind::InvalidInput,
            Self::NOTSUPP => ErrorKind::Unsupported,
            Self::JUKEBOX => ErrorKind::Timeout,
            _ => ErrorKind::Io,
        }
    }
}

/// One connection to a server's NFS service (re-established when lost).
/// `B` is the buffer type READ data is placed into.
#[derive(Debug)]
pub struct NfsConn<B = Vec<u8>> {
    addr: SocketAddr,
    config: ClientConfig,
    conn: tokio::sync::Mutex<Option<RpcConn<B>>>,
}

impl<B: Sink> NfsConn<B> {
    /// Connects now, so that a wrong port or a down server fails the open.
    pub async fn connect(addr: SocketAddr, config: &ClientConfig) -> Result<Self> {
        let conn = RpcConn::connect(addr, proto::NFS_PROGRAM, proto::NFS_VERSION, &config.rpc)
            .await
            .map_err(|source| Error::Transport {
                doing: "connect to the NFS service".into(),
                source,
            })?;
        Ok(Self {
            addr,
            config: config.clone(),
            conn: tokio::sync::Mutex::new(Some(conn)),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    async fn rpc(&self) -> Result<RpcConn<B>, crate::rpc::RpcError> {
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

    /// One call, retried as `retry.rs` says (JUKEBOX is the busy answer). Returns the
    /// reply body (status first) and the sink, which always comes back when one was given.
    async fn call(
        &self,
        op: &'static str,
        procedure: u32,
        args: &[u8],
        data: Option<&[u8]>,
        mut sink: Option<B>,
    ) -> (Result<Vec<u8>>, Option<B>) {
        let keeper = SinkKeeper::new(sink.as_ref());
        let mut retry = Retry::new(
            FIRST_DELAY,
            self.config.reconnect_timeout,
            self.config.rpc.request_timeout,
        );
        loop {
            let result = match self.rpc().await {
                Ok(conn) => {
                    let out = conn.call(procedure, args, data, sink.take()).await;
                    sink = keeper.restore(out.sink);
                    out.result
                }
                Err(e) => Err(e),
            };
            let again = match &result {
                Ok(body) if is_jukebox(body) => retry.after_busy().await,
                Ok(_) => false,
                Err(e) => retry.after_rpc_error(e).await,
            };
            if !again {
                return (result.map_err(|source| Error::Rpc { op, source }), sink);
            }
        }
    }

    /// A call whose reply starts with an nfsstat3; returns the body after an OK status.
    async fn call_ok(&self, op: &'static str, procedure: u32, args: &[u8]) -> Result<Vec<u8>> {
        let body = self.call(op, procedure, args, None, None).await.0?;
        check_status(op, &body)?;
        Ok(body)
    }

    pub async fn getattr(&self, fh: &FileHandle) -> Result<Attr> {
        let op = "GETATTR";
        let body = self
            .call_ok(op, proto::NFSPROC_GETATTR, proto::fh_args(fh).as_slice())
            .await?;
        Attr::decode(&mut after_status(&body)).map_err(|e| Error::malformed(op, e))
    }

    /// The handle and attributes of `name` in `dir`, or None when it does not exist.
    pub async fn lookup(
        &self,
        dir: &FileHandle,
        name: &str,
    ) -> Result<Option<(FileHandle, Option<Attr>)>> {
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
                .map_err(|e| Error::malformed(op, e)),
            Err(e) if e.nfs3_status() == Some(NfsStat::NOENT) => Ok(None),
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
    ) -> Result<Option<Option<FileHandle>>> {
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
                .map_err(|e| Error::malformed(op, e)),
            Err(e) if e.nfs3_status() == Some(NfsStat::EXIST) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn set_size(&self, fh: &FileHandle, size: u64) -> Result<()> {
        self.call_ok(
            "SETATTR",
            proto::NFSPROC_SETATTR,
            proto::setattr_size_args(fh, size).as_slice(),
        )
        .await
        .map(|_| ())
    }

    pub async fn fsinfo(&self, fh: &FileHandle) -> Result<FsInfo> {
        let op = "FSINFO";
        let body = self
            .call_ok(op, proto::NFSPROC_FSINFO, proto::fh_args(fh).as_slice())
            .await?;
        proto::fsinfo_ok(&mut after_status(&body)).map_err(|e| Error::malformed(op, e))
    }

    /// Reads up to `buf.len()` bytes at `offset` into the start of the buffer's view:
    /// the bytes read and whether the file ends there.
    pub async fn read(
        &self,
        fh: &FileHandle,
        offset: u64,
        buf: B,
    ) -> (Result<(u32, bool)>, Option<B>) {
        let op = "READ";
        let count = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let args = proto::read_args(fh, offset, count);
        let (result, sink) = self
            .call(op, proto::NFSPROC_READ, args.as_slice(), None, Some(buf))
            .await;
        let result = result.and_then(|body| {
            check_status(op, &body)?;
            let mut d = after_status(&body);
            let parsed = (|| {
                proto::post_op_attr(&mut d)?;
                let count = d.u32()?;
                let eof = d.bool()?;
                Ok::<_, XdrError>((count, eof))
            })();
            parsed.map_err(|e| Error::malformed(op, e))
        });
        (result, sink)
    }

    /// Writes `data` at `offset`: bytes written, how stable they are, the verifier.
    pub async fn write(
        &self,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
        stable: u32,
    ) -> Result<(u32, u32, Verifier)> {
        let op = "WRITE";
        let len = u32::try_from(data.len()).map_err(|_| {
            Error::InvalidInput(format!("write of {} bytes is too large", data.len()))
        })?;
        let args = proto::write_args_head(fh, offset, len, stable);
        let body = self
            .call(op, proto::NFSPROC_WRITE, args.as_slice(), Some(data), None)
            .await
            .0?;
        check_status(op, &body)?;
        proto::write_ok(&mut after_status(&body)).map_err(|e| Error::malformed(op, e))
    }

    /// Commits the whole file; returns the server's verifier.
    pub async fn commit(&self, fh: &FileHandle) -> Result<Verifier> {
        let op = "COMMIT";
        let body = self
            .call_ok(
                op,
                proto::NFSPROC_COMMIT,
                proto::commit_args(fh, 0, 0).as_slice(),
            )
            .await?;
        proto::commit_ok(&mut after_status(&body)).map_err(|e| Error::malformed(op, e))
    }
}

/// Whether a reply says NFS3ERR_JUKEBOX: the server is busy, try again later.
fn is_jukebox(body: &[u8]) -> bool {
    body.get(..4) == Some(&NfsStat::JUKEBOX.0.to_be_bytes()[..])
}

fn check_status(op: &'static str, body: &[u8]) -> Result<()> {
    let status = Decoder::new(body)
        .u32()
        .map_err(|e| Error::malformed(op, e))?;
    if status == 0 {
        Ok(())
    } else {
        Err(Error::Nfs3 {
            op,
            status: NfsStat(status),
        })
    }
}

fn after_status(body: &[u8]) -> Decoder<'_> {
    Decoder::new(body.get(4..).unwrap_or_default())
}
