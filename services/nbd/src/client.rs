//! The connection: many requests in flight, replies matched by cookie.
//!
//! Senders share the write half behind an async mutex and write one whole request at a
//! time. One reader task owns the read half, looks each reply up by cookie in the table
//! of pending requests and reads data chunks straight into the caller's buffer, which
//! travels with the request (owned, so a cancelled caller cannot leave the reader
//! writing into freed memory). A semaphore bounds the requests in flight.
//!
//! When anything goes wrong with the connection itself (the server disconnects, breaks
//! the protocol, a request times out, a send is interrupted), the connection is failed
//! once: every pending request and every later one gets that error.

use std::any::Any;
use std::collections::HashMap;
use std::ops::DerefMut;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

use crate::config::{Address, Config, ExportInfo};
use crate::error::{Error, Result, ServerError};
use crate::handshake::handshake;
use crate::proto::*;
use crate::reply::{BlockStatus, SimpleRead, Tracker};
use crate::transport::{connect_socket, BoxRead, BoxWrite, Socket, Transport};
use crate::wire::{self, ReplyMode, Request};

/// Read buffer of the reply reader: headers come from it, large payloads bypass it.
const READ_BUFFER: usize = 128 * 1024;

/// A buffer the client can read into or write from: owned, so it can travel with the
/// request to the reader task and back (`Vec<u8>`, `Box<[u8]>`, an aligned buffer type).
pub trait Buffer: DerefMut<Target = [u8]> + Send + 'static {}
impl<T: DerefMut<Target = [u8]> + Send + 'static> Buffer for T {}

trait ErasedBuffer: Send {
    fn bytes(&mut self) -> &mut [u8];
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<B: Buffer> ErasedBuffer for B {
    fn bytes(&mut self) -> &mut [u8] {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// Flags of NBD_CMD_WRITE_ZEROES.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZeroFlags {
    /// Keep the range allocated (NBD_CMD_FLAG_NO_HOLE).
    pub no_hole: bool,
    /// Fail with NBD_ENOTSUP unless zeroing is faster than writing (NBD_CMD_FLAG_FAST_ZERO;
    /// only when [`ExportInfo::can_fast_zero`]).
    pub fast: bool,
    /// Persist before replying (NBD_CMD_FLAG_FUA).
    pub fua: bool,
}

/// The outcome the reader hands to a waiting request.
struct Done {
    buf: Option<Box<dyn ErasedBuffer>>,
    status: BlockStatus,
}

struct Entry {
    tracker: Tracker,
    buf: Option<Box<dyn ErasedBuffer>>,
    reply: oneshot::Sender<Result<Done>>,
    _slot: OwnedSemaphorePermit,
}

#[derive(Default)]
struct Table {
    entries: HashMap<u64, Entry>,
    failure: Option<Error>,
}

struct Shared {
    info: ExportInfo,
    mode: ReplyMode,
    request_timeout: Option<Duration>,
    max_in_flight: usize,
    table: Mutex<Table>,
    writer: tokio::sync::Mutex<Option<BoxWrite>>,
    reader: Mutex<Option<AbortHandle>>,
    slots: Arc<Semaphore>,
    next_cookie: AtomicU64,
    closing: AtomicBool,
}

impl Shared {
    fn failure(&self) -> Option<Error> {
        self.table.lock().failure.clone()
    }

    /// Fails the connection once: every pending request gets `err`, later ones too.
    fn fail(&self, err: Error) {
        let drained: Vec<Entry> = {
            let mut table = self.table.lock();
            if table.failure.is_some() {
                return;
            }
            table.failure = Some(err.clone());
            table.entries.drain().map(|(_, e)| e).collect()
        };
        for entry in drained {
            let _ = entry.reply.send(Err(err.clone()));
        }
        if let Some(reader) = self.reader.lock().take() {
            reader.abort();
        }
        if let Ok(mut writer) = self.writer.try_lock() {
            writer.take();
        }
        self.slots.close();
    }

    fn take(&self, cookie: u64) -> Result<Entry> {
        self.table.lock().entries.remove(&cookie).ok_or_else(|| {
            Error::protocol(format!(
                "reply for cookie {cookie:#x}, which matches no request in flight"
            ))
        })
    }

    /// Puts a partly answered request back, unless the connection failed meanwhile.
    fn put_back(&self, cookie: u64, entry: Entry) {
        let mut table = self.table.lock();
        match table.failure.clone() {
            Some(err) => {
                drop(table);
                let _ = entry.reply.send(Err(err));
            }
            None => {
                table.entries.insert(cookie, entry);
            }
        }
    }
}

/// Stops the reader and closes the socket when the last [`Client`] clone goes away.
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.disconnect_now();
        self.shared.fail(Error::Closed);
    }
}

impl Shared {
    /// A best-effort soft disconnect without waiting: when nothing is in flight and the
    /// socket takes the NBD_CMD_DISC header at once, send it; otherwise the connection
    /// simply closes (a hard disconnect, which servers handle as well).
    fn disconnect_now(&self) {
        {
            let table = self.table.lock();
            if table.failure.is_some() || !table.entries.is_empty() {
                return;
            }
        }
        let Ok(mut writer) = self.writer.try_lock() else {
            return;
        };
        let Some(w) = writer.as_mut() else {
            return;
        };
        let req = Request {
            flags: 0,
            command: CMD_DISC,
            cookie: self.next_cookie.fetch_add(1, Ordering::Relaxed),
            offset: 0,
            len: 0,
        };
        let (header, n) = wire::encode_request(&req, self.mode == ReplyMode::Extended);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut w = std::pin::Pin::new(w.as_mut());
        if let std::task::Poll::Ready(Ok(written)) = w.as_mut().poll_write(&mut cx, &header[..n]) {
            if written == n {
                let _ = w.as_mut().poll_flush(&mut cx);
                let _ = w.as_mut().poll_shutdown(&mut cx);
            }
        }
        self.closing.store(true, Ordering::SeqCst);
    }
}

/// An NBD connection in the transmission phase. Cheap to clone; all clones share the
/// connection, and every method may be called concurrently.
#[derive(Clone)]
pub struct Client {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("export", &self.shared().info.name)
            .field("size", &self.shared().info.size)
            .field("mode", &self.shared().mode)
            .finish()
    }
}

/// Writes a header and an optional payload, vectored when the stream can.
async fn send<W: AsyncWrite + Unpin + ?Sized>(
    w: &mut W,
    header: &[u8],
    payload: &[u8],
) -> std::io::Result<()> {
    let (mut h, mut p) = (header, payload);
    while !h.is_empty() {
        let n = w
            .write_vectored(&[std::io::IoSlice::new(h), std::io::IoSlice::new(p)])
            .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        if n < h.len() {
            h = &h[n..];
        } else {
            p = &p[n - h.len()..];
            h = &[];
        }
    }
    if !p.is_empty() {
        w.write_all(p).await?;
    }
    w.flush().await
}

/// Fails the connection if a send is abandoned half way (its future dropped), since
/// the stream would then be out of step with the protocol.
struct SendGuard<'a> {
    shared: &'a Shared,
    armed: bool,
}

impl Drop for SendGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.fail(Error::protocol(
                "a request was abandoned while being sent; the connection is out of step and was closed",
            ));
        }
    }
}

impl Client {
    /// Connects to `address` and negotiates `config` within its connect timeout.
    pub async fn connect(address: &Address, config: &Config) -> Result<Client> {
        let host = match address {
            Address::Tcp { host, .. } => Some(host.as_str()),
            Address::Unix(_) => None,
        };
        let work = async {
            match connect_socket(address).await? {
                Socket::Tcp(s) => Self::negotiate(s, config, host).await,
                Socket::Unix(s) => Self::negotiate(s, config, host).await,
            }
        };
        tokio::time::timeout(config.connect_timeout, work)
            .await
            .unwrap_or(Err(Error::Timeout {
                what: "connecting and negotiating",
                after: config.connect_timeout,
            }))
    }

    /// Negotiates over an already connected stream (TLS uses `localhost` as the server
    /// name unless the configuration names one).
    pub async fn handshake<S: Transport>(stream: S, config: &Config) -> Result<Client> {
        tokio::time::timeout(
            config.connect_timeout,
            Self::negotiate(stream, config, None),
        )
        .await
        .unwrap_or(Err(Error::Timeout {
            what: "negotiating",
            after: config.connect_timeout,
        }))
    }

    async fn negotiate<S: Transport>(
        stream: S,
        config: &Config,
        host: Option<&str>,
    ) -> Result<Client> {
        let (negotiated, read, write) = handshake(stream, config, host).await?;
        let max_in_flight = config.max_in_flight.max(1);
        let shared = Arc::new(Shared {
            info: negotiated.info,
            mode: negotiated.mode,
            request_timeout: config.request_timeout,
            max_in_flight,
            table: Mutex::new(Table::default()),
            writer: tokio::sync::Mutex::new(Some(write)),
            reader: Mutex::new(None),
            slots: Arc::new(Semaphore::new(max_in_flight)),
            next_cookie: AtomicU64::new(1),
            closing: AtomicBool::new(false),
        });
        let task = tokio::spawn(reader_loop(shared.clone(), read));
        *shared.reader.lock() = Some(task.abort_handle());
        Ok(Client {
            handle: Arc::new(Handle { shared }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.handle.shared
    }

    /// What the handshake learned: size, flags, block sizes, contexts.
    pub fn info(&self) -> &ExportInfo {
        &self.shared().info
    }

    pub fn size(&self) -> u64 {
        self.info().size
    }

    /// The error that ended the connection, if it has ended.
    pub fn failure(&self) -> Option<Error> {
        self.shared().failure()
    }

    fn check_range(&self, what: &str, offset: u64, len: u64) -> Result<()> {
        let info = self.info();
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > info.size) {
            return Err(Error::InvalidRequest(format!(
                "{what} of {len} bytes at offset {offset} reaches past the end of the {}-byte export",
                info.size
            )));
        }
        let min = u64::from(info.block_size.minimum);
        let end = offset + len;
        if !offset.is_multiple_of(min) || (!len.is_multiple_of(min) && end != info.size) {
            return Err(Error::InvalidRequest(format!(
                "{what} of {len} bytes at offset {offset} is not aligned to the server's minimum block size {min}"
            )));
        }
        Ok(())
    }

    fn check_payload(&self, what: &str, len: usize) -> Result<()> {
        let max = self.info().block_size.maximum as usize;
        if len > max {
            return Err(Error::InvalidRequest(format!(
                "{what} of {len} bytes exceeds the maximum payload of {max} bytes"
            )));
        }
        Ok(())
    }

    fn check_effect_len(&self, what: &str, len: u64) -> Result<()> {
        if !self.info().extended_headers && len > u64::from(u32::MAX) {
            return Err(Error::InvalidRequest(format!(
                "{what} of {len} bytes needs extended headers, which the server did not offer"
            )));
        }
        Ok(())
    }

    fn check_writable(&self, what: &str) -> Result<()> {
        if self.info().read_only() {
            return Err(Error::InvalidRequest(format!(
                "{what} on a read-only export"
            )));
        }
        Ok(())
    }

    fn fua_flag(&self, fua: bool) -> Result<u16> {
        match (fua, self.info().can_fua()) {
            (false, _) => Ok(0),
            (true, true) => Ok(CMD_FLAG_FUA),
            (true, false) => Err(Error::Unsupported("FUA (NBD_FLAG_SEND_FUA)".into())),
        }
    }

    /// Reads `buf.len()` bytes at `offset` into `buf` and returns it.
    ///
    /// The range must be aligned to the minimum block size and at most the maximum
    /// payload; holes are filled with zeroes.
    pub async fn read<B: Buffer>(&self, offset: u64, buf: B) -> Result<B> {
        let len = buf.len();
        if len == 0 {
            return Ok(buf);
        }
        self.check_range("read", offset, len as u64)?;
        self.check_payload("read", len)?;
        let done = self
            .submit(CMD_READ, 0, offset, len as u64, None, Some(Box::new(buf)))
            .await?;
        let any = done
            .buf
            .ok_or_else(|| Error::protocol("internal: read completed without its buffer"))?
            .into_any();
        any.downcast::<B>()
            .map(|b| *b)
            .map_err(|_| Error::protocol("internal: read buffer changed type"))
    }

    /// Writes `buf` at `offset` and returns the buffer.
    pub async fn write<B: Buffer>(&self, offset: u64, buf: B, fua: bool) -> Result<B> {
        let len = buf.len();
        if len == 0 {
            return Ok(buf);
        }
        self.check_writable("write")?;
        self.check_range("write", offset, len as u64)?;
        self.check_payload("write", len)?;
        let flags = self.fua_flag(fua)?;
        self.submit(CMD_WRITE, flags, offset, len as u64, Some(&buf), None)
            .await?;
        Ok(buf)
    }

    /// Makes `offset..offset + len` read as zeroes without sending them.
    pub async fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.check_writable("write zeroes")?;
        if !self.info().can_zero() {
            return Err(Error::Unsupported(
                "NBD_CMD_WRITE_ZEROES (NBD_FLAG_SEND_WRITE_ZEROES)".into(),
            ));
        }
        if flags.fast && !self.info().can_fast_zero() {
            return Err(Error::Unsupported(
                "fast zeroes (NBD_FLAG_SEND_FAST_ZERO)".into(),
            ));
        }
        self.check_range("write zeroes", offset, len)?;
        self.check_effect_len("write zeroes", len)?;
        let mut f = self.fua_flag(flags.fua)?;
        if flags.no_hole {
            f |= CMD_FLAG_NO_HOLE;
        }
        if flags.fast {
            f |= CMD_FLAG_FAST_ZERO;
        }
        self.submit(CMD_WRITE_ZEROES, f, offset, len, None, None)
            .await
            .map(|_| ())
    }

    /// Tells the server the range is no longer needed (it may read back as anything
    /// until written again).
    pub async fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.check_writable("trim")?;
        if !self.info().can_trim() {
            return Err(Error::Unsupported(
                "NBD_CMD_TRIM (NBD_FLAG_SEND_TRIM)".into(),
            ));
        }
        self.check_range("trim", offset, len)?;
        self.check_effect_len("trim", len)?;
        let flags = self.fua_flag(fua)?;
        self.submit(CMD_TRIM, flags, offset, len, None, None)
            .await
            .map(|_| ())
    }

    /// Makes every write the server has answered durable.
    pub async fn flush(&self) -> Result<()> {
        if !self.info().can_flush() {
            return Err(Error::Unsupported(
                "NBD_CMD_FLUSH (NBD_FLAG_SEND_FLUSH)".into(),
            ));
        }
        self.submit(CMD_FLUSH, 0, 0, 0, None, None)
            .await
            .map(|_| ())
    }

    /// The status of `offset..offset + len` in every selected metadata context. The
    /// server may describe only a prefix of the range; callers loop for the rest.
    pub async fn block_status(&self, offset: u64, len: u64) -> Result<BlockStatus> {
        if self.info().contexts.is_empty() {
            return Err(Error::Unsupported(
                "block status: no metadata context was selected".into(),
            ));
        }
        if len == 0 {
            return Ok(BlockStatus::default());
        }
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > self.size()) {
            return Err(Error::InvalidRequest(format!(
                "block status of {len} bytes at offset {offset} reaches past the end of the {}-byte export",
                self.size()
            )));
        }
        let len = if self.info().extended_headers {
            len
        } else {
            // The compact header has 32 bits; keep the request aligned.
            let min = u64::from(self.info().block_size.minimum);
            let cap = u64::from(u32::MAX) - u64::from(u32::MAX) % min;
            len.min(cap)
        };
        Ok(self
            .submit(CMD_BLOCK_STATUS, 0, offset, len, None, None)
            .await?
            .status)
    }

    /// Waits for requests in flight, then sends NBD_CMD_DISC (a soft disconnect) and
    /// closes the connection. Later requests fail with [`Error::Closed`].
    pub async fn disconnect(&self) -> Result<()> {
        let shared = self.shared();
        if let Some(err) = shared.failure() {
            return match err {
                Error::Closed => Ok(()),
                err => Err(err),
            };
        }
        let wait = shared.slots.acquire_many(shared.max_in_flight as u32);
        let _all = match shared.request_timeout {
            Some(t) => tokio::time::timeout(t, wait).await.ok(),
            None => Some(wait.await),
        };
        shared.closing.store(true, Ordering::SeqCst);
        let req = Request {
            flags: 0,
            command: CMD_DISC,
            cookie: shared.next_cookie.fetch_add(1, Ordering::Relaxed),
            offset: 0,
            len: 0,
        };
        let (header, n) = wire::encode_request(&req, shared.mode == ReplyMode::Extended);
        let sent = {
            let mut writer = shared.writer.lock().await;
            match writer.as_mut() {
                Some(w) => {
                    let r = send(w, &header[..n], &[]).await;
                    if let Some(mut w) = writer.take() {
                        let _ = w.shutdown().await;
                    }
                    r
                }
                None => Ok(()),
            }
        };
        shared.fail(Error::Closed);
        sent.map_err(|e| Error::io("sending NBD_CMD_DISC", e))
    }

    async fn submit(
        &self,
        command: u16,
        flags: u16,
        offset: u64,
        len: u64,
        payload: Option<&[u8]>,
        buf: Option<Box<dyn ErasedBuffer>>,
    ) -> Result<Done> {
        let shared = self.shared();
        let work = self.submit_inner(command, flags, offset, len, payload, buf);
        let result = match shared.request_timeout {
            None => work.await,
            Some(after) => match tokio::time::timeout(after, work).await {
                Ok(r) => r,
                Err(_) => {
                    let err = Error::Timeout {
                        what: command_name(command),
                        after,
                    };
                    shared.fail(err.clone());
                    Err(err)
                }
            },
        };
        result.and_then(|done| done)
    }

    async fn submit_inner(
        &self,
        command: u16,
        flags: u16,
        offset: u64,
        len: u64,
        payload: Option<&[u8]>,
        buf: Option<Box<dyn ErasedBuffer>>,
    ) -> Result<Result<Done>> {
        let shared = self.shared();
        let slot = match shared.slots.clone().acquire_owned().await {
            Ok(slot) => slot,
            Err(_) => return Err(shared.failure().unwrap_or(Error::Closed)),
        };
        let cookie = shared.next_cookie.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut table = shared.table.lock();
            if let Some(err) = table.failure.clone() {
                return Err(err);
            }
            table.entries.insert(
                cookie,
                Entry {
                    tracker: Tracker::new(command, offset, len),
                    buf,
                    reply: tx,
                    _slot: slot,
                },
            );
        }
        let req = Request {
            flags,
            command,
            cookie,
            offset,
            len,
        };
        let (header, n) = wire::encode_request(&req, shared.mode == ReplyMode::Extended);
        {
            let mut writer = shared.writer.lock().await;
            let Some(w) = writer.as_mut() else {
                shared.table.lock().entries.remove(&cookie);
                return Err(shared.failure().unwrap_or(Error::Closed));
            };
            let mut guard = SendGuard {
                shared,
                armed: true,
            };
            let sent = send(w, &header[..n], payload.unwrap_or(&[])).await;
            guard.armed = false;
            if let Err(e) = sent {
                drop(writer);
                let err = Error::io("sending a request", e);
                shared.fail(err.clone());
                return Err(err);
            }
            if shared.failure().is_some() {
                writer.take();
            }
        }
        match rx.await {
            Ok(result) => Ok(result),
            Err(_) => Err(shared.failure().unwrap_or(Error::Closed)),
        }
    }
}

async fn reader_loop(shared: Arc<Shared>, read: BoxRead) {
    let mut r = BufReader::with_capacity(READ_BUFFER, read);
    let err = loop {
        if let Err(e) = read_reply(&shared, &mut r).await {
            break e;
        }
    };
    let err = if shared.closing.load(Ordering::SeqCst) {
        Error::Closed
    } else {
        err
    };
    shared.fail(err);
}

fn eof_mid_reply(e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            Error::Disconnected("in the middle of a reply".to_string())
        }
        _ => Error::io("reading a reply", e),
    }
}

/// Reads one reply message (a simple reply or one chunk) and applies it.
async fn read_reply(shared: &Shared, r: &mut BufReader<BoxRead>) -> Result<()> {
    let mut magic = [0u8; 4];
    if let Err(e) = r.read_exact(&mut magic).await {
        return Err(match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                let waiting = shared.table.lock().entries.len();
                Error::Disconnected(if waiting == 0 {
                    "while no request was in flight".to_string()
                } else {
                    format!("while {waiting} requests were waiting for replies")
                })
            }
            _ => Error::io("reading a reply", e),
        });
    }
    let magic = u32::from_be_bytes(magic);
    let rest_len = wire::reply_header_rest(magic, shared.mode)?;
    let mut rest = [0u8; 28];
    r.read_exact(&mut rest[..rest_len])
        .await
        .map_err(eof_mid_reply)?;
    let header = wire::parse_reply_header(magic, &rest[..rest_len])?;
    let cookie = header.cookie();
    let mut entry = shared.take(cookie)?;
    match apply(shared, &mut entry, header, r).await {
        Ok(false) => {
            shared.put_back(cookie, entry);
            Ok(())
        }
        Ok(true) => {
            let outcome = entry.tracker.finish(&shared.info.contexts);
            match outcome {
                Ok(Ok(status)) => {
                    let _ = entry.reply.send(Ok(Done {
                        buf: entry.buf,
                        status,
                    }));
                    Ok(())
                }
                Ok(Err(server)) => {
                    let _ = entry.reply.send(Err(Error::Server(server)));
                    Ok(())
                }
                Err(e) => {
                    let _ = entry.reply.send(Err(e.clone()));
                    Err(e)
                }
            }
        }
        Err(e) => {
            let _ = entry.reply.send(Err(e.clone()));
            Err(e)
        }
    }
}

/// Applies one message to its request; returns whether the reply is complete.
async fn apply(
    shared: &Shared,
    entry: &mut Entry,
    header: wire::ReplyHeader,
    r: &mut BufReader<BoxRead>,
) -> Result<bool> {
    match header {
        wire::ReplyHeader::Simple { error, .. } => {
            if entry.tracker.on_simple(error, shared.mode)? == SimpleRead::Data {
                let buf = entry
                    .buf
                    .as_mut()
                    .ok_or_else(|| Error::protocol("internal: read without a buffer"))?;
                r.read_exact(buf.bytes()).await.map_err(eof_mid_reply)?;
                let (offset, len) = (entry.tracker.offset(), entry.tracker.len());
                entry.tracker.on_data(offset, len)?;
            }
            Ok(true)
        }
        wire::ReplyHeader::Chunk {
            flags,
            kind,
            offset,
            len,
            ..
        } => {
            if let Some(offset) = offset {
                entry.tracker.check_header_offset(offset)?;
            }
            entry.tracker.check_chunk(kind, len, flags, shared.mode)?;
            match kind {
                REPLY_TYPE_NONE => {}
                REPLY_TYPE_OFFSET_DATA => {
                    let mut at = [0u8; 8];
                    r.read_exact(&mut at).await.map_err(eof_mid_reply)?;
                    let range = entry
                        .tracker
                        .on_data(wire::parse_data_offset(&at), len - 8)?;
                    let buf = entry
                        .buf
                        .as_mut()
                        .ok_or_else(|| Error::protocol("internal: read without a buffer"))?;
                    r.read_exact(&mut buf.bytes()[range])
                        .await
                        .map_err(eof_mid_reply)?;
                }
                REPLY_TYPE_OFFSET_HOLE => {
                    let mut raw = [0u8; 12];
                    r.read_exact(&mut raw).await.map_err(eof_mid_reply)?;
                    let (at, hole) = wire::parse_hole(&raw)?;
                    let range = entry.tracker.on_hole(at, hole)?;
                    if let Some(buf) = entry.buf.as_mut() {
                        buf.bytes()[range].fill(0);
                    }
                }
                REPLY_TYPE_BLOCK_STATUS | REPLY_TYPE_BLOCK_STATUS_EXT => {
                    let payload = read_payload(r, len).await?;
                    let (id, descriptors) = wire::parse_block_status(kind, &payload)?;
                    entry
                        .tracker
                        .on_status(id, &descriptors, &shared.info.contexts)?;
                }
                _ => {
                    // check_chunk admits only error chunks here.
                    let payload = read_payload(r, len).await?;
                    let err: ServerError = wire::parse_error_chunk(kind, &payload)?;
                    entry.tracker.on_error(err)?;
                }
            }
            Ok(flags & REPLY_FLAG_DONE != 0)
        }
    }
}

/// Reads a payload whose length [`Tracker::check_chunk`] has already bounded.
async fn read_payload(r: &mut BufReader<BoxRead>, len: u64) -> Result<Vec<u8>> {
    let len = usize::try_from(len).map_err(|_| Error::protocol("chunk length overflows"))?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await.map_err(eof_mid_reply)?;
    Ok(payload)
}
