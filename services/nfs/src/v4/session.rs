//! An NFSv4.1 session: client id (EXCHANGE_ID), session (CREATE_SESSION) and its slot
//! table, shared by every handle of one opened file; each handle's own TCP connection
//! ([`Link`]) is bound to it with BIND_CONN_TO_SESSION.
//!
//! Every request starts with SEQUENCE on a free slot. A slot's sequence id advances when
//! the server executed SEQUENCE; after a lost reply it is uncertain whether the server
//! saw the request, so the next request on that slot sends the following id and, when
//! the server answers SEQ_MISORDERED, the previous one. NFS4ERR_DELAY (and GRACE) are
//! retried after a pause; lost connections are re-established and the request sent again
//! within the reconnect window (READ, WRITE, COMMIT, SEEK, DEALLOCATE and GETATTR are
//! idempotent). The lease is renewed by every request and, when idle, by a lone SEQUENCE
//! every half lease.
//!
//! A server that forgets the session, the client id or the open state (a restart, an
//! expired lease: BADSESSION, DEADSESSION, STALE_CLIENTID, EXPIRED, a stale or bad state
//! id, reported by SEQUENCE, by an operation, or by BIND_CONN_TO_SESSION on reconnect) is
//! recovered as RFC 8881 section 8.4.2 describes, by one task while the others wait:
//! EXCHANGE_ID with the same client owner, CREATE_SESSION, the open reclaimed
//! (CLAIM_PREVIOUS) when the server is in its grace period, RECLAIM_COMPLETE, and otherwise
//! (NO_GRACE, as from a graceless server) the file opened again by its handle (CLAIM_FH),
//! all within the reconnect window. The slot table starts afresh; requests still in
//! flight on the old session settle nothing in it. Every handle's connection is bound to
//! the new session at its next request, and requests are encoded with the current open
//! state id ([`ops::compound`] writes it over the one they were built with), so the failed
//! request is simply sent again. Writes made before the restart are still checked by the
//! COMMIT verifier (the new server's differs). A recovery that fails, or finds the file
//! gone (STALE), loses the session for good: every later request fails with a clear
//! error. One request goes through at most [`MAX_RECOVERIES`] recoveries (`recovery.rs`).
//!
//! The slot table is in `slots.rs`, the handles' connections in `link.rs`, recovery in
//! `recovery.rs`; retries follow the crate's one policy (`retry.rs`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::link::Link;
use super::ops::{
    self, compound, ChannelAttrs, Fh, Ops, Reply, ReplyError, StateId, Status, NFS4_PROGRAM,
    NFS4_VERSION, NFSPROC4_COMPOUND, OP_READ, READ_PREFIX,
};
#[cfg(doc)]
use super::recovery::MAX_RECOVERIES;
use super::slots::{Release, SlotGuard, Slots, MAX_SLOTS};
use crate::error::{Error, Result};
use crate::retry::{Backoff, Retry, FIRST_DELAY, FIRST_DELAY_V4_REQUEST};
use crate::rpc::{Outcome, ReadShape, RpcConn, Sink, SinkKeeper};
use crate::v3::proto::Verifier;
use crate::ClientConfig;

/// Minor versions tried, newest first.
const MINOR_VERSIONS: [u32; 2] = [2, 1];
/// Room asked for in each request and reply beyond the largest READ or WRITE, for the
/// COMPOUND around the data.
const COMPOUND_ROOM: u32 = 64 * 1024;
/// Reply cache asked for per slot (replies of non-idempotent requests are small).
const MAX_RESPONSE_CACHED: u32 = 64 * 1024;
/// The layout of a read COMPOUND's reply, for READ data placed into the caller's buffer.
const READ_SHAPE: ReadShape = ReadShape::Compound4 {
    before: READ_PREFIX,
    read_op: OP_READ,
};

/// A COMPOUND without SEQUENCE (the operations that create, bind and destroy sessions).
pub(super) async fn call_plain<B: Sink>(
    rpc: &RpcConn<B>,
    minor: u32,
    what: &'static str,
    ops: &Ops,
) -> Result<Vec<u8>> {
    let args = compound(minor, None, ops, None);
    rpc.call(NFSPROC4_COMPOUND, &args, None, None)
        .await
        .result
        .map_err(|source| Error::Rpc { op: what, source })
}

/// The file opened in this session, re-opened after the server lost it.
#[derive(Debug, Clone)]
pub struct OpenState {
    pub fh: Fh,
    pub stateid: StateId,
    /// OPEN4_SHARE_ACCESS_READ or _BOTH.
    pub access: u32,
}

/// The session all handles of one opened file share.
#[derive(Debug)]
pub struct Session {
    pub(super) addr: SocketAddr,
    pub(super) config: ClientConfig,
    /// The minor version agreed: 2, or 1 when the server has no NFSv4.2.
    pub minor: u32,
    /// The fore channel as the server granted it (at the first CREATE_SESSION).
    pub channel: ChannelAttrs,
    /// The channel asked for in CREATE_SESSION.
    pub(super) wanted: ChannelAttrs,
    /// This client's owner, the same in every EXCHANGE_ID.
    pub(super) verf: Verifier,
    pub(super) owner: Vec<u8>,
    pub(super) slots: Mutex<Slots>,
    /// The opened file, once opened: re-opened by a recovery.
    pub(super) open: Mutex<Option<OpenState>>,
    /// Held by the one task recovering the session.
    pub(super) recovery: tokio::sync::Mutex<()>,
    /// Opens recovered by reclaim (CLAIM_PREVIOUS) and by a new OPEN (CLAIM_FH).
    pub(super) reclaimed: AtomicU32,
    pub(super) reopened: AtomicU32,
    pub(super) slot_free: Notify,
    last_used: Mutex<Instant>,
    pub(super) lost: Mutex<Option<Status>>,
    renewal: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(task) = self.renewal.get_mut().take() {
            task.abort();
        }
    }
}

/// EXCHANGE_ID: the client id and the sequence id for CREATE_SESSION.
pub(super) async fn exchange_id<B: Sink>(
    rpc: &RpcConn<B>,
    minor: u32,
    verf: &Verifier,
    owner: &[u8],
) -> Result<(u64, u32)> {
    let mut ops = Ops::new();
    ops.exchange_id(verf, owner);
    let body = call_plain(rpc, minor, "EXCHANGE_ID", &ops).await?;
    Reply::parse(&body)
        .and_then(|mut r| r.exchange_id())
        .map_err(|e| Error::reply("EXCHANGE_ID", e))
}

/// CREATE_SESSION (which also binds `rpc` to the new session).
pub(super) async fn create_session<B: Sink>(
    rpc: &RpcConn<B>,
    minor: u32,
    clientid: u64,
    sequence: u32,
    wanted: &ChannelAttrs,
) -> Result<(ops::SessionId, ChannelAttrs)> {
    let mut ops = Ops::new();
    ops.create_session(clientid, sequence, wanted);
    let body = call_plain(rpc, minor, "CREATE_SESSION", &ops).await?;
    Reply::parse(&body)
        .and_then(|mut r| r.create_session())
        .map_err(|e| Error::reply("CREATE_SESSION", e))
}

/// Checks a SEQUENCE + RECLAIM_COMPLETE reply (COMPLETE_ALREADY is fine).
pub(super) fn reclaim_complete_reply(body: &[u8]) -> Result<()> {
    match Reply::parse(body).and_then(|mut r| {
        r.sequence()?;
        r.simple(ops::OP_RECLAIM_COMPLETE)
    }) {
        Ok(())
        | Err(ReplyError::Status {
            status: Status::COMPLETE_ALREADY,
            ..
        }) => Ok(()),
        Err(e) => Err(Error::reply("RECLAIM_COMPLETE", e)),
    }
}

/// The open owner of every OPEN.
pub const OPEN_OWNER: &[u8] = b"ferry";

/// A client owner unique to this open (one client id per opened file), from the
/// machine name AUTH_SYS sends.
fn client_owner(machine: &str) -> (Verifier, Vec<u8>) {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let owner = format!(
        "ferry/{machine}/{}/{}.{}/{n}",
        std::process::id(),
        now.as_secs(),
        now.subsec_nanos()
    );
    let mut verf = [0u8; 8];
    verf[..4].copy_from_slice(&(now.as_secs() as u32).to_be_bytes());
    verf[4..].copy_from_slice(&(now.subsec_nanos() ^ n).to_be_bytes());
    (verf, owner.into_bytes())
}

/// The reply to SEQUENCE, PUTFH, OPEN: the open's state id and delegation.
pub(super) fn open_reply(body: &[u8]) -> ops::ReplyResult<(StateId, Option<StateId>)> {
    Reply::parse(body).and_then(|mut r| {
        r.sequence()?;
        r.simple(ops::OP_PUTFH)?;
        r.open()
    })
}

/// What to do after one attempt of a request.
enum Next {
    Done(Vec<u8>),
    Again,
}

/// One request's way through [`Session::call`]: what it sends, and its retries and
/// recoveries so far.
struct Request<'a, B: Sink> {
    session: &'a Session,
    link: &'a Link<B>,
    what: &'static str,
    ops: &'a Ops,
    data: Option<&'a [u8]>,
    keeper: SinkKeeper<B>,
    retry: Retry,
    recoveries: u32,
}

impl<B: Sink> Request<'_, B> {
    /// One attempt: a bound connection, a slot, the COMPOUND sent and its reply settled.
    async fn attempt(&mut self, sink: &mut Option<B>) -> Result<Next> {
        if let Some(status) = self.session.lost() {
            return Err(Error::SessionLost { status });
        }
        let Some(rpc) = self.connection().await? else {
            return Ok(Next::Again);
        };
        let slot = self.session.acquire().await;
        let out = self.send(&rpc, &slot, sink.take()).await;
        *sink = self.keeper.restore(out.sink);
        match out.result {
            Ok(body) => self.settle(slot, body).await,
            Err(source) => {
                slot.release(Release::Uncertain);
                if self.retry.after_rpc_error(&source).await {
                    return Ok(Next::Again);
                }
                Err(Error::Rpc {
                    op: self.what,
                    source,
                })
            }
        }
    }

    /// The link's connection, bound to the current session; None when it must be tried
    /// again (after a pause or a recovery).
    async fn connection(&mut self) -> Result<Option<RpcConn<B>>> {
        let generation = self.session.generation();
        match self.link.rpc(self.session).await {
            Ok(rpc) => Ok(Some(rpc)),
            Err(Error::SessionLost { status }) => {
                self.recover(generation, status).await?;
                Ok(None)
            }
            Err(Error::Rpc { op, source }) => {
                if self.retry.after_rpc_error(&source).await {
                    return Ok(None);
                }
                Err(Error::Rpc { op, source })
            }
            Err(e) => Err(e),
        }
    }

    /// SEQUENCE on `slot` and the operations, with the current open state id.
    async fn send(&self, rpc: &RpcConn<B>, slot: &SlotGuard<'_>, sink: Option<B>) -> Outcome<B> {
        let stateid = self.session.stateid();
        let args = compound(
            self.session.minor,
            Some(&slot.sequence()),
            self.ops,
            stateid.as_ref(),
        );
        rpc.call_shaped(NFSPROC4_COMPOUND, &args, self.data, sink, READ_SHAPE)
            .await
    }

    /// Settles the slot by the reply's SEQUENCE, then retries a busy server and
    /// recovers a lost session; otherwise the reply is the caller's.
    async fn settle(&mut self, slot: SlotGuard<'_>, body: Vec<u8>) -> Result<Next> {
        let generation = slot.generation;
        let status = match Reply::parse(&body).and_then(|mut r| Ok((r.sequence()?, r.status))) {
            Ok((seq, status)) => {
                slot.release(Release::Done {
                    target_highest: seq.target_highest_slot,
                });
                // SEQ4_STATUS_EXPIRED or _REVOKED: the open state is gone; the next
                // request using it fails with EXPIRED or a bad state id, and recovers.
                self.session.touch();
                status
            }
            Err(ReplyError::Status { status, .. }) => {
                return self.sequence_failed(slot, status).await
            }
            Err(e) => {
                slot.release(Release::Uncertain);
                return Err(Error::reply(self.what, e));
            }
        };
        if is_busy(status) && self.retry.after_busy().await {
            return Ok(Next::Again);
        }
        if status.is_session_loss() {
            self.recover(generation, status).await?;
            return Ok(Next::Again);
        }
        Ok(Next::Done(body))
    }

    /// SEQUENCE itself failed with `status`: a misordered uncertain slot is repaired and
    /// the request sent again; a lost session is recovered; a busy server waited for.
    async fn sequence_failed(&mut self, slot: SlotGuard<'_>, status: Status) -> Result<Next> {
        let generation = slot.generation;
        if status == Status::SEQ_MISORDERED && slot.uncertain {
            if slot.release(Release::Misordered) {
                return Ok(Next::Again);
            }
        } else {
            slot.release(Release::Unsent);
        }
        if status.is_session_loss() {
            self.recover(generation, status).await?;
            return Ok(Next::Again);
        }
        if is_busy(status) && self.retry.after_busy().await {
            return Ok(Next::Again);
        }
        Err(Error::Nfs4 {
            op: "SEQUENCE",
            index: 0,
            status,
        })
    }

    async fn recover(&mut self, generation: u64, status: Status) -> Result<()> {
        self.session
            .recover_for(self.link, generation, status, &mut self.recoveries)
            .await
    }
}

/// The server asks to be asked again later.
fn is_busy(status: Status) -> bool {
    matches!(status, Status::DELAY | Status::GRACE)
}

impl Session {
    /// [`Session::establish_once`], again over a new connection when the connection is
    /// lost on the way (within the reconnect window, as every other request): a server
    /// that has only just started can reset the first connections it accepts. A refused
    /// or timed-out connect fails at once, so a wrong port is reported without delay.
    pub async fn establish<B: Sink>(
        addr: SocketAddr,
        config: &ClientConfig,
        max_transfer: u32,
    ) -> Result<(Arc<Self>, Arc<Link<B>>)> {
        let mut backoff = Backoff::new(FIRST_DELAY);
        loop {
            let result = Self::establish_once(addr, config, max_transfer).await;
            let lost = matches!(
                &result,
                Err(Error::Rpc {
                    source: crate::rpc::RpcError::Disconnected { .. },
                    ..
                })
            );
            if !lost || !backoff.wait_within(config.reconnect_timeout).await {
                return result;
            }
        }
    }

    /// Connects, agrees on a minor version (4.2, else 4.1), creates the client id and
    /// the session, and declares reclaims complete. Returns the session and its first
    /// connection.
    async fn establish_once<B: Sink>(
        addr: SocketAddr,
        config: &ClientConfig,
        max_transfer: u32,
    ) -> Result<(Arc<Self>, Arc<Link<B>>)> {
        let rpc = RpcConn::connect(addr, NFS4_PROGRAM, NFS4_VERSION, &config.rpc)
            .await
            .map_err(|source| Error::Rpc {
                op: "connect",
                source,
            })?;
        let (verf, owner) = client_owner(&config.rpc.machine);
        let (minor, (clientid, sequence)) = agree_minor(&rpc, &verf, &owner).await?;
        let room = max_transfer.saturating_add(COMPOUND_ROOM);
        let wanted = ChannelAttrs {
            header_pad: 0,
            max_request: room,
            max_response: room,
            max_response_cached: MAX_RESPONSE_CACHED,
            max_ops: ops::MAX_RESULTS as u32,
            max_requests: MAX_SLOTS,
        };
        let (id, channel) = create_session(&rpc, minor, clientid, sequence, &wanted).await?;
        let session = Arc::new(Self {
            addr,
            config: config.clone(),
            minor,
            channel,
            wanted,
            verf,
            owner,
            slots: Mutex::new(Slots::new(clientid, id, 0, &channel)),
            open: Mutex::new(None),
            recovery: tokio::sync::Mutex::new(()),
            reclaimed: AtomicU32::new(0),
            reopened: AtomicU32::new(0),
            slot_free: Notify::new(),
            last_used: Mutex::new(Instant::now()),
            lost: Mutex::new(None),
            renewal: Mutex::new(None),
        });
        let link = Arc::new(Link::with(Some(rpc), 0));
        let mut ops = Ops::new();
        ops.reclaim_complete();
        let body = session
            .call(&link, "RECLAIM_COMPLETE", &ops, None, None)
            .await
            .0?;
        reclaim_complete_reply(&body)?;
        Ok((session, link))
    }

    /// Sends SEQUENCE followed by `ops` (and `data` after them, for a final WRITE), with
    /// the retries described in the module docs. With a `sink`, the reply is a read
    /// compound (SEQUENCE, PUTFH, READ) whose data lands at the start of the sink; the
    /// sink always comes back when one was given. Returns the whole reply body,
    /// SEQUENCE included, with SEQUENCE known to have succeeded.
    pub async fn call<B: Sink>(
        &self,
        link: &Link<B>,
        what: &'static str,
        ops: &Ops,
        data: Option<&[u8]>,
        mut sink: Option<B>,
    ) -> (Result<Vec<u8>>, Option<B>) {
        let mut request = Request {
            session: self,
            link,
            what,
            ops,
            data,
            keeper: SinkKeeper::new(sink.as_ref()),
            retry: Retry::new(
                FIRST_DELAY_V4_REQUEST,
                self.config.reconnect_timeout,
                self.config.rpc.request_timeout,
            ),
            recoveries: 0,
        };
        loop {
            match request.attempt(&mut sink).await {
                Ok(Next::Done(body)) => return (Ok(body), sink),
                Ok(Next::Again) => {}
                Err(e) => return (Err(e), sink),
            }
        }
    }

    /// Renews the lease with a lone SEQUENCE every half lease while no other request
    /// does, over `link`, for as long as the session lives.
    pub fn start_renewal<B: Sink>(self: &Arc<Self>, link: Arc<Link<B>>, lease: Duration) {
        let half = (lease / 2).max(Duration::from_secs(1));
        let weak: Weak<Self> = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(half / 2).await;
                let Some(session) = weak.upgrade() else { break };
                if session.idle() >= half {
                    let _ = session
                        .call(&link, "SEQUENCE", &Ops::new(), None, None)
                        .await;
                }
            }
        });
        *self.renewal.lock() = Some(task);
    }

    fn idle(&self) -> Duration {
        self.last_used.lock().elapsed()
    }

    fn touch(&self) {
        *self.last_used.lock() = Instant::now();
    }

    pub(super) fn lose(&self, status: Status) {
        self.lost.lock().get_or_insert(status);
    }

    pub(super) fn lost(&self) -> Option<Status> {
        *self.lost.lock()
    }

    /// Opens recovered after the server lost them: (reclaimed in its grace period, opened
    /// anew by file handle).
    pub fn recoveries(&self) -> (u32, u32) {
        (
            self.reclaimed.load(Ordering::Relaxed),
            self.reopened.load(Ordering::Relaxed),
        )
    }

    /// The current client id (a recovery replaces it).
    pub fn clientid(&self) -> u64 {
        self.slots.lock().clientid
    }

    pub(super) fn generation(&self) -> u64 {
        self.slots.lock().generation
    }

    /// Records the file opened in this session, for a recovery to open it again.
    pub fn set_open(&self, open: OpenState) {
        *self.open.lock() = Some(open);
    }

    pub(super) fn open_state(&self) -> Option<OpenState> {
        self.open.lock().clone()
    }

    /// The open state id requests are sent with.
    fn stateid(&self) -> Option<StateId> {
        self.open.lock().as_ref().map(|o| o.stateid)
    }

    /// Ends the session and the client id (best effort; the server forgets them when the
    /// lease expires anyway).
    pub async fn destroy<B: Sink>(&self, link: &Link<B>) {
        let Ok(rpc) = link.rpc(self).await else {
            return;
        };
        let (clientid, id) = {
            let st = self.slots.lock();
            (st.clientid, st.id)
        };
        let mut ops = Ops::new();
        ops.destroy_session(&id);
        if call_plain(&rpc, self.minor, "DESTROY_SESSION", &ops)
            .await
            .is_err()
        {
            return;
        }
        let mut ops = Ops::new();
        ops.destroy_clientid(clientid);
        let _ = call_plain(&rpc, self.minor, "DESTROY_CLIENTID", &ops).await;
    }
}

/// EXCHANGE_ID at the newest minor version the server speaks: that version, the client
/// id and the sequence id for CREATE_SESSION.
async fn agree_minor<B: Sink>(
    rpc: &RpcConn<B>,
    verf: &Verifier,
    owner: &[u8],
) -> Result<(u32, (u64, u32))> {
    for minor in MINOR_VERSIONS {
        match exchange_id(rpc, minor, verf, owner).await {
            Ok(ids) => return Ok((minor, ids)),
            Err(Error::Nfs4 {
                status: Status::MINOR_VERS_MISMATCH,
                ..
            }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Nfs4 {
        op: "EXCHANGE_ID",
        index: 0,
        status: Status::MINOR_VERS_MISMATCH,
    })
}
