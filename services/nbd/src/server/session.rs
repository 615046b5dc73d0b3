//! One client's session: the option haggling of fixed newstyle negotiation (with
//! STARTTLS switching the stream to TLS), then the transmission phase.
//!
//! In transmission one task reads requests in order and hands each to a task of its own;
//! replies are written whole under a lock on the write half, in whatever order they
//! finish. Two semaphores bound the requests and the bytes in flight, so a client that
//! sends faster than the backend reads simply stops being read.

use std::io::IoSlice;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, Notify, Semaphore};
use tokio::task::JoinSet;

use super::wire::{self as swire, Malformed};
use super::{Backend, ExportError, Inner};
use crate::config::MAX_PAYLOAD;
use crate::proto::{self, *};
use crate::transport::{BoxWrite, Transport};
use crate::wire::Request;

type Result<T, E = ExportError> = std::result::Result<T, E>;

/// Most options one session may send before it is dropped (a client looping forever).
const MAX_OPTIONS: usize = 4096;
/// The id of `base:allocation`, the one metadata context served.
const BASE_ALLOCATION_ID: u32 = 1;
/// Most descriptors in one block status reply.
const MAX_DESCRIPTORS: usize = 64 * 1024;
/// A read whose range has more extents than this is sent as one data chunk.
const MAX_READ_PIECES: usize = 16;
/// Read buffer of the request reader.
const READ_BUFFER: usize = 64 * 1024;

/// What negotiation settled.
#[derive(Debug, Default)]
struct State {
    structured: bool,
    no_zeroes: bool,
    /// The export name the selected contexts were negotiated for, and whether
    /// base:allocation was among them.
    contexts: Option<(String, bool)>,
    options: usize,
}

enum Next {
    Transmission,
    StartTls,
    Abort,
}

enum Ready<S> {
    Plain(S),
    Tls(Box<tokio_rustls::server::TlsStream<S>>),
    Abort,
}

pub(crate) async fn run<B: Backend, S: Transport>(inner: Arc<Inner<B>>, stream: S) -> Result<()> {
    let mut state = State::default();
    let limit = inner.config.handshake_timeout;
    let ready = tokio::time::timeout(limit, negotiate(&inner, stream, &mut state))
        .await
        .map_err(|_| ExportError::HandshakeTimeout(limit))??;
    match ready {
        Ready::Plain(s) => transmission(inner, s, &state).await,
        Ready::Tls(s) => transmission(inner, *s, &state).await,
        Ready::Abort => Ok(()),
    }
}

async fn negotiate<B: Backend, S: Transport>(
    inner: &Inner<B>,
    mut stream: S,
    state: &mut State,
) -> Result<Ready<S>> {
    stream
        .write_all(&swire::greeting())
        .await
        .map_err(|e| ExportError::io("sending the greeting", e))?;
    let mut flags = [0u8; 4];
    stream
        .read_exact(&mut flags)
        .await
        .map_err(|e| ExportError::io("reading the client flags", e))?;
    let flags = swire::parse_client_flags(&flags).map_err(client)?;
    state.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
    match options(inner, &mut stream, false, state).await? {
        Next::Transmission => Ok(Ready::Plain(stream)),
        Next::Abort => Ok(Ready::Abort),
        Next::StartTls => {
            let Some(config) = inner.config.tls.clone() else {
                return Err(ExportError::Client("STARTTLS without TLS".into()));
            };
            let mut tls = tokio_rustls::TlsAcceptor::from(config)
                .accept(stream)
                .await
                .map_err(|e| ExportError::Tls(e.to_string()))?;
            // Whatever was negotiated in the clear does not carry over.
            state.structured = false;
            state.contexts = None;
            match options(inner, &mut tls, true, state).await? {
                Next::Transmission => Ok(Ready::Tls(Box::new(tls))),
                Next::Abort => Ok(Ready::Abort),
                Next::StartTls => Err(ExportError::Client("STARTTLS twice".into())),
            }
        }
    }
}

fn client(m: Malformed) -> ExportError {
    ExportError::Client(m.0)
}

async fn send<S: AsyncWrite + Unpin>(s: &mut S, bytes: &[u8]) -> Result<()> {
    s.write_all(bytes)
        .await
        .map_err(|e| ExportError::io("sending an option reply", e))?;
    s.flush()
        .await
        .map_err(|e| ExportError::io("sending an option reply", e))
}

async fn reply<S: AsyncWrite + Unpin>(s: &mut S, option: u32, rep: u32, data: &[u8]) -> Result<()> {
    send(s, &swire::option_reply(option, rep, data)).await
}

/// The option loop; returns when the client enters transmission, asks for TLS or aborts.
async fn options<B: Backend, S: AsyncRead + AsyncWrite + Unpin>(
    inner: &Inner<B>,
    s: &mut S,
    tls: bool,
    state: &mut State,
) -> Result<Next> {
    let config = &inner.config;
    let tls_required = config.tls.is_some() && !tls;
    loop {
        state.options += 1;
        if state.options > MAX_OPTIONS {
            return Err(ExportError::Client(format!(
                "more than {MAX_OPTIONS} options without entering transmission"
            )));
        }
        let mut header = [0u8; 16];
        s.read_exact(&mut header)
            .await
            .map_err(|e| ExportError::io("reading an option", e))?;
        let header = swire::parse_option_header(&header).map_err(client)?;
        let mut data = vec![0u8; header.len as usize];
        s.read_exact(&mut data)
            .await
            .map_err(|e| ExportError::io("reading an option", e))?;
        let option = header.option;
        if tls_required && option != OPT_STARTTLS && option != OPT_ABORT {
            if option == OPT_EXPORT_NAME {
                return Err(ExportError::Client(
                    "NBD_OPT_EXPORT_NAME before TLS; this export requires TLS".into(),
                ));
            }
            reply(
                s,
                option,
                REP_ERR_TLS_REQD,
                b"this export requires TLS: send NBD_OPT_STARTTLS first (nbds://)",
            )
            .await?;
            continue;
        }
        let invalid = |m: &str| swire::option_reply(option, REP_ERR_INVALID, m.as_bytes());
        match option {
            OPT_ABORT => {
                // Best effort: the client may already be gone.
                let _ = reply(s, option, REP_ACK, &[]).await;
                return Ok(Next::Abort);
            }
            OPT_STARTTLS => {
                if !data.is_empty() {
                    send(s, &invalid("NBD_OPT_STARTTLS takes no data")).await?;
                } else if tls {
                    send(s, &invalid("TLS is already on")).await?;
                } else if config.tls.is_none() {
                    reply(s, option, REP_ERR_POLICY, b"this export does not offer TLS").await?;
                } else {
                    reply(s, option, REP_ACK, &[]).await?;
                    return Ok(Next::StartTls);
                }
            }
            OPT_LIST => {
                if data.is_empty() {
                    let entry = swire::server_entry(&config.name, config.description.as_deref());
                    reply(s, option, REP_SERVER, &entry).await?;
                    reply(s, option, REP_ACK, &[]).await?;
                } else {
                    send(s, &invalid("NBD_OPT_LIST takes no data")).await?;
                }
            }
            OPT_STRUCTURED_REPLY => {
                if data.is_empty() {
                    state.structured = true;
                    reply(s, option, REP_ACK, &[]).await?;
                } else {
                    send(s, &invalid("NBD_OPT_STRUCTURED_REPLY takes no data")).await?;
                }
            }
            OPT_INFO | OPT_GO => match swire::parse_go(&data) {
                Err(m) => send(s, &invalid(&m.0)).await?,
                Ok(go) if !matches_export(&config.name, &go.name) => {
                    reply(
                        s,
                        option,
                        REP_ERR_UNKNOWN,
                        unknown_export(&config.name, &go.name).as_bytes(),
                    )
                    .await?;
                }
                Ok(go) => {
                    let flags = transmission_flags(inner, state);
                    let mut out = swire::option_reply(
                        option,
                        REP_INFO,
                        &swire::info_export(inner.backend.size(), flags),
                    );
                    let b = inner.block;
                    out.extend(swire::option_reply(
                        option,
                        REP_INFO,
                        &swire::info_block_size(b.minimum, b.preferred, b.maximum),
                    ));
                    if go.infos.contains(&INFO_NAME) {
                        out.extend(swire::option_reply(
                            option,
                            REP_INFO,
                            &swire::info_text(INFO_NAME, &config.name),
                        ));
                    }
                    if let Some(d) = config
                        .description
                        .as_deref()
                        .filter(|_| go.infos.contains(&INFO_DESCRIPTION))
                    {
                        out.extend(swire::option_reply(
                            option,
                            REP_INFO,
                            &swire::info_text(INFO_DESCRIPTION, d),
                        ));
                    }
                    out.extend(swire::option_reply(option, REP_ACK, &[]));
                    send(s, &out).await?;
                    if option == OPT_GO {
                        if state
                            .contexts
                            .as_ref()
                            .is_some_and(|(name, _)| *name != go.name)
                        {
                            state.contexts = None;
                        }
                        return Ok(Next::Transmission);
                    }
                }
            },
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let set = option == OPT_SET_META_CONTEXT;
                match swire::parse_meta_context_request(&data) {
                    Err(m) => send(s, &invalid(&m.0)).await?,
                    Ok(_) if set && !state.structured => {
                        send(
                            s,
                            &invalid(
                                "NBD_OPT_SET_META_CONTEXT needs NBD_OPT_STRUCTURED_REPLY first",
                            ),
                        )
                        .await?;
                    }
                    Ok(req) if !matches_export(&config.name, &req.name) => {
                        reply(
                            s,
                            option,
                            REP_ERR_UNKNOWN,
                            unknown_export(&config.name, &req.name).as_bytes(),
                        )
                        .await?;
                    }
                    Ok(req) => {
                        let selected = if set {
                            req.queries.iter().any(|q| q == CONTEXT_BASE_ALLOCATION)
                        } else {
                            req.queries.is_empty()
                                || req
                                    .queries
                                    .iter()
                                    .any(|q| q == CONTEXT_BASE_ALLOCATION || q == "base:")
                        };
                        let mut out = Vec::new();
                        if selected {
                            out.extend(swire::option_reply(
                                option,
                                REP_META_CONTEXT,
                                &swire::meta_context_entry(
                                    BASE_ALLOCATION_ID,
                                    CONTEXT_BASE_ALLOCATION,
                                ),
                            ));
                        }
                        out.extend(swire::option_reply(option, REP_ACK, &[]));
                        send(s, &out).await?;
                        if set {
                            state.contexts = Some((req.name, selected));
                        }
                    }
                }
            }
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data).into_owned();
                if !matches_export(&config.name, &name) {
                    // This option cannot be refused politely: the session just ends.
                    return Err(ExportError::Client(unknown_export(&config.name, &name)));
                }
                // Without NBD_OPT_GO there are no structured replies or contexts.
                state.structured = false;
                state.contexts = None;
                let flags = transmission_flags(inner, state);
                send(
                    s,
                    &swire::export_name_reply(inner.backend.size(), flags, state.no_zeroes),
                )
                .await?;
                return Ok(Next::Transmission);
            }
            _ => {
                let message = format!(
                    "{} is not supported by this server",
                    proto::option_name(option)
                );
                reply(s, option, REP_ERR_UNSUP, message.as_bytes()).await?;
            }
        }
    }
}

fn matches_export(name: &str, asked: &str) -> bool {
    asked == name || asked.is_empty()
}

fn unknown_export(name: &str, asked: &str) -> String {
    let asked: String = asked.chars().take(256).collect();
    format!("no export named '{asked}'; this server has '{name}'")
}

fn transmission_flags<B: Backend>(inner: &Inner<B>, state: &State) -> u16 {
    let mut flags = FLAG_HAS_FLAGS | FLAG_READ_ONLY | FLAG_SEND_FLUSH;
    if inner.backend.multi_conn() {
        flags |= FLAG_CAN_MULTI_CONN;
    }
    if state.structured {
        flags |= FLAG_SEND_DF;
    }
    flags
}

// ---------------------------------------------------------------------------------------
// Transmission

/// What every request task of one connection shares.
struct Conn<B> {
    inner: Arc<Inner<B>>,
    writer: Mutex<Option<BoxWrite>>,
    structured: bool,
    base_allocation: bool,
    /// Set by a task whose reply could not be written: the connection is over.
    failed: Notify,
    failure: parking_lot::Mutex<Option<ExportError>>,
}

impl<B> Conn<B> {
    fn fail(&self, e: ExportError) {
        let mut failure = self.failure.lock();
        if failure.is_none() {
            *failure = Some(e);
        }
        self.failed.notify_one();
    }

    /// Writes `parts` as one reply, under the write lock.
    async fn write(&self, parts: &[&[u8]]) {
        let mut writer = self.writer.lock().await;
        let Some(w) = writer.as_mut() else {
            return;
        };
        let result = async {
            write_all_vectored(w, parts).await?;
            w.flush().await
        }
        .await;
        if let Err(e) = result {
            writer.take();
            drop(writer);
            self.fail(ExportError::io("sending a reply", e));
        }
    }

    /// An error reply: a structured error chunk (with a message) or a simple reply.
    async fn error(&self, cookie: u64, errno: u32, message: &str) {
        if self.structured {
            let chunk = swire::error_chunk(cookie, REPLY_FLAG_DONE, errno, message);
            self.write(&[&chunk]).await;
        } else {
            self.write(&[&swire::simple_reply(cookie, errno)]).await;
        }
    }

    async fn ok(&self, cookie: u64) {
        if self.structured {
            self.write(&[&swire::none_chunk(cookie, REPLY_FLAG_DONE)])
                .await;
        } else {
            self.write(&[&swire::simple_reply(cookie, 0)]).await;
        }
    }
}

async fn write_all_vectored(w: &mut BoxWrite, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| IoSlice::new(p))
        .collect();
    let mut bufs = &mut slices[..];
    while !bufs.is_empty() {
        let n = w.write_vectored(bufs).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// The NBD error value for a backend error.
fn errno_of(e: &std::io::Error) -> u32 {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::PermissionDenied => EPERM,
        K::InvalidInput => EINVAL,
        K::OutOfMemory => ENOMEM,
        K::StorageFull => ENOSPC,
        K::Unsupported => ENOTSUP,
        _ => EIO,
    }
}

async fn transmission<B: Backend, S: Transport>(
    inner: Arc<Inner<B>>,
    stream: S,
    state: &State,
) -> Result<()> {
    let (read_half, write) = stream.into_halves();
    let mut reader = BufReader::with_capacity(READ_BUFFER, read_half);
    let max_in_flight = inner.config.max_in_flight;
    let max_bytes = inner.config.max_in_flight_bytes.min(u32::MAX as usize >> 3);
    let conn = Arc::new(Conn {
        inner,
        writer: Mutex::new(Some(write)),
        structured: state.structured,
        base_allocation: state.contexts.as_ref().is_some_and(|c| c.1),
        failed: Notify::new(),
        failure: parking_lot::Mutex::new(None),
    });
    let requests = Arc::new(Semaphore::new(max_in_flight));
    let bytes = Arc::new(Semaphore::new(max_bytes));
    let mut tasks: JoinSet<()> = JoinSet::new();
    let outcome = loop {
        while tasks.try_join_next().is_some() {}
        let mut raw = [0u8; 28];
        let got = tokio::select! {
            () = conn.failed.notified() => break Err(None),
            got = read_header(&mut reader, &mut raw) => got,
        };
        match got {
            Ok(true) => {}
            // A hang-up between requests ends the session like NBD_CMD_DISC.
            Ok(false) => break Ok(()),
            Err(e) => break Err(Some(e)),
        }
        let req = match swire::parse_request(&raw) {
            Ok(req) => req,
            Err(m) => break Err(Some(client(m))),
        };
        let Ok(slot) = requests.clone().acquire_owned().await else {
            break Ok(());
        };
        let c = conn.clone();
        match req.command {
            CMD_DISC => break Ok(()),
            CMD_READ => {
                let Some(problem) = check_range(&c, &req) else {
                    let want = (req.len as usize).min(max_bytes) as u32;
                    let Ok(budget) = bytes.clone().acquire_many_owned(want).await else {
                        break Ok(());
                    };
                    tasks.spawn(async move {
                        read(&c, &req).await;
                        drop((slot, budget));
                    });
                    continue;
                };
                tasks.spawn(async move {
                    c.error(req.cookie, EINVAL, &problem).await;
                    drop(slot);
                });
            }
            CMD_WRITE => {
                if req.len > u64::from(MAX_PAYLOAD) {
                    break Err(Some(ExportError::Client(format!(
                        "NBD_CMD_WRITE of {} bytes, more than the {MAX_PAYLOAD} the protocol allows",
                        req.len
                    ))));
                }
                // The payload is read and dropped, a bounded buffer at a time.
                let mut payload = (&mut reader).take(req.len);
                match tokio::io::copy(&mut payload, &mut tokio::io::sink()).await {
                    Ok(n) if n == req.len => {}
                    Ok(_) => {
                        break Err(Some(ExportError::ClientGone(
                            "in the middle of a write payload",
                        )))
                    }
                    Err(e) => break Err(Some(ExportError::io("reading a write payload", e))),
                }
                tasks.spawn(async move {
                    c.error(req.cookie, EPERM, "the export is read-only").await;
                    drop(slot);
                });
            }
            CMD_TRIM | CMD_WRITE_ZEROES => {
                tasks.spawn(async move {
                    c.error(req.cookie, EPERM, "the export is read-only").await;
                    drop(slot);
                });
            }
            CMD_FLUSH => {
                tasks.spawn(async move {
                    c.ok(req.cookie).await;
                    drop(slot);
                });
            }
            CMD_BLOCK_STATUS => {
                let problem = if !c.base_allocation {
                    Some("no metadata context was selected (NBD_OPT_SET_META_CONTEXT base:allocation)".to_string())
                } else {
                    check_range(&c, &req)
                };
                tasks.spawn(async move {
                    match problem {
                        Some(p) => c.error(req.cookie, EINVAL, &p).await,
                        None => block_status(&c, &req).await,
                    }
                    drop(slot);
                });
            }
            other => {
                tasks.spawn(async move {
                    let m = format!(
                        "{} ({other}) is not supported by this server",
                        proto::command_name(other)
                    );
                    c.error(req.cookie, EINVAL, &m).await;
                    drop(slot);
                });
            }
        }
    };
    match outcome {
        Ok(()) => {
            // Answer what is in flight, then close.
            while tasks.join_next().await.is_some() {}
            if let Some(mut w) = conn.writer.lock().await.take() {
                let _ = w.shutdown().await;
            }
            match conn.failure.lock().take() {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
        Err(e) => {
            tasks.shutdown().await;
            let stored = conn.failure.lock().take();
            Err(e
                .or(stored)
                .unwrap_or(ExportError::ClientGone("while a reply was sent")))
        }
    }
}

/// Reads a request header; false on a clean end of stream before its first byte.
async fn read_header<R: AsyncRead + Unpin>(r: &mut R, raw: &mut [u8; 28]) -> Result<bool> {
    let first = r
        .read(&mut raw[..])
        .await
        .map_err(|e| ExportError::io("reading a request", e))?;
    if first == 0 {
        return Ok(false);
    }
    r.read_exact(&mut raw[first..])
        .await
        .map_err(|e| ExportError::io("in the middle of a request", e))?;
    Ok(true)
}

/// Why a READ or BLOCK_STATUS range is refused, if it is.
fn check_range<B: Backend>(c: &Conn<B>, req: &Request) -> Option<String> {
    let name = proto::command_name(req.command);
    let size = c.inner.backend.size();
    if req.len == 0 {
        return Some(format!("{name} of length 0"));
    }
    if req.command == CMD_READ && req.len > u64::from(MAX_PAYLOAD) {
        return Some(format!(
            "{name} of {} bytes is larger than the {MAX_PAYLOAD} this server allows",
            req.len
        ));
    }
    match req.offset.checked_add(req.len) {
        Some(end) if end <= size => None,
        _ => Some(format!(
            "{name} of {} bytes at offset {} reaches past the end of the {size}-byte export",
            req.len, req.offset
        )),
    }
}

/// A piece of a read: a hole or data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    offset: u64,
    len: u64,
    zero: bool,
}

/// Splits a read into holes and data by the backend's extents (one data piece when the
/// extents are unknown, fragmented or inconsistent).
async fn pieces<B: Backend>(c: &Conn<B>, req: &Request) -> Vec<Piece> {
    let whole = vec![Piece {
        offset: req.offset,
        len: req.len,
        zero: false,
    }];
    let backend = &c.inner.backend;
    if !c.structured || !backend.can_extents() || req.flags & CMD_FLAG_DF != 0 {
        return whole;
    }
    let end = req.offset + req.len;
    let mut out: Vec<Piece> = Vec::new();
    let mut at = req.offset;
    while at < end {
        let Ok(extents) = backend.extents(at, end - at).await else {
            return whole;
        };
        if extents.is_empty() {
            break;
        }
        for e in extents {
            if e.offset != at || e.len == 0 || e.len > end - at {
                return whole;
            }
            let zero = e.flags & STATE_ZERO != 0;
            match out.last_mut() {
                Some(last) if last.zero == zero => last.len += e.len,
                _ => out.push(Piece {
                    offset: at,
                    len: e.len,
                    zero,
                }),
            }
            at += e.len;
            if out.len() > MAX_READ_PIECES {
                return whole;
            }
        }
    }
    if at < end {
        out.push(Piece {
            offset: at,
            len: end - at,
            zero: false,
        });
    }
    out
}

async fn read<B: Backend>(c: &Conn<B>, req: &Request) {
    let pieces = pieces(c, req).await;
    let last = pieces.len() - 1;
    for (i, p) in pieces.iter().enumerate() {
        let done = if i == last { REPLY_FLAG_DONE } else { 0 };
        if p.zero {
            c.write(&[&swire::hole_chunk(req.cookie, done, p.offset, p.len as u32)])
                .await;
            continue;
        }
        match c.inner.backend.read(p.offset, p.len as usize).await {
            Ok(buf) if buf.len() as u64 == p.len => {
                if c.structured {
                    let header = swire::data_chunk_header(req.cookie, done, p.offset, p.len as u32);
                    c.write(&[&header, &buf]).await;
                } else {
                    c.write(&[&swire::simple_reply(req.cookie, 0), &buf]).await;
                }
            }
            Ok(buf) => {
                let m = format!(
                    "the source returned {} bytes for a read of {}",
                    buf.len(),
                    p.len
                );
                c.error(req.cookie, EIO, &m).await;
                return;
            }
            Err(e) => {
                c.error(
                    req.cookie,
                    errno_of(&e),
                    &format!("read at offset {}: {e}", p.offset),
                )
                .await;
                return;
            }
        }
    }
}

async fn block_status<B: Backend>(c: &Conn<B>, req: &Request) {
    let end = req.offset + req.len;
    let one = req.flags & CMD_FLAG_REQ_ONE != 0;
    let mut descriptors: Vec<(u32, u32)> = Vec::new();
    let mut at = req.offset;
    'outer: while at < end && descriptors.len() < MAX_DESCRIPTORS {
        if !descriptors.is_empty() && !c.inner.backend.extents_ready(at) {
            break;
        }
        let extents = match c.inner.backend.extents(at, end - at).await {
            Ok(e) => e,
            Err(e) => {
                let m = format!("block status at offset {at}: {e}");
                c.error(req.cookie, errno_of(&e), &m).await;
                return;
            }
        };
        if extents.is_empty() {
            break;
        }
        for e in extents {
            // A backend that breaks its contract ends the reply where it went wrong.
            if e.offset != at || e.len == 0 || e.len > end - at {
                break 'outer;
            }
            // The lengths fit: the request's length is 32 bits.
            let flags = (e.flags & (STATE_HOLE | STATE_ZERO)) as u32;
            match descriptors.last_mut() {
                Some(last) if last.1 == flags => last.0 += e.len as u32,
                _ => descriptors.push((e.len as u32, flags)),
            }
            at += e.len;
            if one || descriptors.len() >= MAX_DESCRIPTORS {
                break 'outer;
            }
        }
    }
    if descriptors.is_empty() {
        c.error(
            req.cookie,
            EIO,
            "the source reported no allocation for this range",
        )
        .await;
        return;
    }
    if one {
        descriptors.truncate(1);
    }
    let chunk = swire::block_status_chunk(
        req.cookie,
        REPLY_FLAG_DONE,
        BASE_ALLOCATION_ID,
        &descriptors,
    );
    c.write(&[&chunk]).await;
}
