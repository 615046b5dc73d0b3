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
//! error. One request goes through at most [`MAX_RECOVERIES`] recoveries.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ferry_core::{ErrorKind, IoBuf};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::super::client::{rpc_kind, ClientConfig};
use super::super::proto::Verifier;
use super::super::rpc::{ReadShape, RpcConn, RpcError};
use super::ops::{
    self, compound, op_name, ChannelAttrs, Fh, Ops, Reply, ReplyError, Sequence, SessionId,
    StateId, Status, NFS4_PROGRAM, NFS4_VERSION, NFSPROC4_COMPOUND, OP_READ, READ_PREFIX,
};

/// Slots used at most, whatever the server offers.
const MAX_SLOTS: u32 = 64;
/// Recoveries one request may go through.
const MAX_RECOVERIES: u32 = 3;
/// Minor versions tried, newest first.
const MINOR_VERSIONS: [u32; 2] = [2, 1];

/// Why an NFSv4 request failed.
#[derive(Debug, thiserror::Error)]
pub enum Nfs4Error {
    #[error("{op}: {source}")]
    Rpc {
        op: &'static str,
        #[source]
        source: RpcError,
    },
    #[error("{op} failed: the server replied {status}")]
    Status {
        op: &'static str,
        /// Position of the failed operation in its COMPOUND (SEQUENCE is 0).
        index: usize,
        status: Status,
    },
    #[error("{op}: malformed reply: {message}")]
    Malformed { op: &'static str, message: String },
    #[error("the server no longer knows this client's session or open state ({status}): it restarted, or the lease expired; open the file again")]
    SessionLost { status: Status },
    #[error("the server no longer knows this client's session or open state ({status}: it restarted, or the lease expired) and recovering it failed: {source}")]
    RecoveryFailed {
        status: Status,
        #[source]
        source: Box<Nfs4Error>,
    },
}

impl Nfs4Error {
    pub fn reply(what: &'static str, e: ReplyError) -> Self {
        match e {
            ReplyError::Status { op, index, status } => Self::Status {
                op: op_name(op),
                index,
                status,
            },
            ReplyError::Malformed(message) => Self::Malformed { op: what, message },
        }
    }

    pub fn status(&self) -> Option<Status> {
        match self {
            Self::Status { status, .. } | Self::SessionLost { status } => Some(*status),
            Self::RecoveryFailed { status, source } => source.status().or(Some(*status)),
            _ => None,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Rpc { source, .. } => rpc_kind(source),
            Self::Status { status, .. } => status_kind(*status),
            Self::Malformed { .. } => ErrorKind::Protocol,
            Self::SessionLost { .. } => ErrorKind::Disconnected,
            Self::RecoveryFailed { source, .. } => match source.status() {
                Some(s) if !s.is_session_loss() => status_kind(s),
                _ => ErrorKind::Disconnected,
            },
        }
    }
}

pub fn status_kind(status: Status) -> ErrorKind {
    match status {
        Status::PERM | Status::ACCESS | Status::ROFS | Status::WRONGSEC => {
            ErrorKind::PermissionDenied
        }
        Status::NOENT | Status::STALE | Status::BADHANDLE | Status::FHEXPIRED => {
            ErrorKind::NotFound
        }
        Status::NOSPC | Status::DQUOT => ErrorKind::NoSpace,
        Status::INVAL
        | Status::FBIG
        | Status::ISDIR
        | Status::NOTDIR
        | Status::SYMLINK
        | Status::WRONG_TYPE
        | Status::BADTYPE
        | Status::NAMETOOLONG
        | Status::SHARE_DENIED
        | Status::OPENMODE => ErrorKind::InvalidInput,
        Status::NOTSUPP
        | Status::OP_ILLEGAL
        | Status::UNION_NOTSUPP
        | Status::MINOR_VERS_MISMATCH => ErrorKind::Unsupported,
        Status::DELAY | Status::GRACE => ErrorKind::Timeout,
        s if s.is_session_loss() => ErrorKind::Disconnected,
        _ => ErrorKind::Io,
    }
}

fn retryable(e: &RpcError) -> bool {
    matches!(
        e,
        RpcError::Disconnected { .. } | RpcError::Connect { .. } | RpcError::ConnectTimeout { .. }
    )
}

/// A COMPOUND without SEQUENCE (the operations that create, bind and destroy sessions).
async fn call_plain(
    rpc: &RpcConn,
    minor: u32,
    what: &'static str,
    ops: &Ops,
) -> Result<Vec<u8>, Nfs4Error> {
    let args = compound(minor, None, ops, None);
    rpc.call(NFSPROC4_COMPOUND, &args, None, None)
        .await
        .result
        .map_err(|source| Nfs4Error::Rpc { op: what, source })
}

#[derive(Debug)]
struct Slots {
    /// The sequence id each slot sends next.
    seq: Vec<u32>,
    /// The slot's last request may or may not have reached the server.
    uncertain: Vec<bool>,
    busy: Vec<bool>,
    /// Slots usable now (the server's target highest slot id + 1, bounded).
    limit: usize,
    /// The client id and session these slots belong to, and how many recoveries
    /// replaced them.
    clientid: u64,
    id: SessionId,
    generation: u64,
}

impl Slots {
    fn new(clientid: u64, id: SessionId, generation: u64, channel: &ChannelAttrs) -> Self {
        let n = channel.max_requests.clamp(1, MAX_SLOTS) as usize;
        Self {
            seq: vec![1; n],
            uncertain: vec![false; n],
            busy: vec![false; n],
            limit: n,
            clientid,
            id,
            generation,
        }
    }
}

/// The file opened in this session, re-opened after the server lost it.
#[derive(Debug, Clone)]
pub struct OpenState {
    pub fh: Fh,
    pub stateid: StateId,
    /// OPEN4_SHARE_ACCESS_READ or _BOTH.
    pub access: u32,
}

/// How a slot's request ended.
enum Release {
    /// SEQUENCE was not executed: the sequence id is unused.
    Unsent,
    /// No reply: the server may or may not have executed it.
    Uncertain,
    /// SEQUENCE executed; the server would like this many slots at most.
    Done { target_highest: u32 },
    /// SEQ_MISORDERED after an uncertain request: the server never saw it.
    Misordered,
}

/// A slot held for one request; released as uncertain when dropped unreleased (the
/// caller was cancelled mid-request).
struct SlotGuard<'a> {
    session: &'a Session,
    generation: u64,
    id: SessionId,
    index: usize,
    seqid: u32,
    uncertain: bool,
    highest: u32,
    released: bool,
}

impl SlotGuard<'_> {
    fn release(mut self, how: Release) -> bool {
        self.released = true;
        self.session
            .release(self.generation, self.index, self.seqid, how)
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if !self.released {
            self.session
                .release(self.generation, self.index, self.seqid, Release::Uncertain);
        }
    }
}

/// One TCP connection of one handle, bound to the session (re-established when lost).
#[derive(Debug, Default)]
pub struct Link {
    rpc: tokio::sync::Mutex<Option<RpcConn>>,
    /// The session generation the connection is bound to.
    bound: AtomicU64,
}

impl Link {
    fn with(rpc: RpcConn, generation: u64) -> Self {
        Self {
            rpc: tokio::sync::Mutex::new(Some(rpc)),
            bound: AtomicU64::new(generation),
        }
    }

    /// A new connection bound to `session`.
    pub async fn connect(session: &Session) -> Result<Self, Nfs4Error> {
        let link = Self::default();
        link.rpc(session).await?;
        Ok(link)
    }

    async fn rpc(&self, session: &Session) -> Result<RpcConn, Nfs4Error> {
        let mut slot = self.rpc.lock().await;
        let (id, generation) = {
            let st = session.lock_slots();
            (st.id, st.generation)
        };
        let alive = slot.as_ref().filter(|c| !c.is_closed()).cloned();
        let rpc = match alive {
            // Bound to the current session.
            Some(c) if self.bound.load(Ordering::Acquire) == generation => return Ok(c),
            // Alive, but bound to a session a recovery replaced: bind it again.
            Some(c) => c,
            None => {
                *slot = None;
                let what = "connect";
                RpcConn::connect(
                    session.addr,
                    NFS4_PROGRAM,
                    NFS4_VERSION,
                    &session.config.rpc,
                )
                .await
                .map_err(|source| Nfs4Error::Rpc { op: what, source })?
            }
        };
        let mut ops = Ops::new();
        ops.bind_conn(&id);
        let body = call_plain(&rpc, session.minor, "BIND_CONN_TO_SESSION", &ops).await?;
        let bound = Reply::parse(&body).and_then(|mut r| r.bind_conn());
        match bound {
            Ok(()) => {}
            // With SP4_NONE a server may instead bind the connection at its first
            // SEQUENCE (RFC 8881 section 2.10.3.1).
            Err(ReplyError::Status { status, .. }) if status.is_unsupported() => {}
            Err(ReplyError::Status { status, .. }) if status.is_session_loss() => {
                return Err(Nfs4Error::SessionLost { status });
            }
            Err(e) => return Err(Nfs4Error::reply("BIND_CONN_TO_SESSION", e)),
        }
        self.bound.store(generation, Ordering::Release);
        *slot = Some(rpc.clone());
        Ok(rpc)
    }

    /// Makes `rpc` this link's connection, bound to session `generation`.
    async fn set(&self, rpc: RpcConn, generation: u64) {
        let mut slot = self.rpc.lock().await;
        self.bound.store(generation, Ordering::Release);
        *slot = Some(rpc);
    }
}

/// The session all handles of one opened file share.
#[derive(Debug)]
pub struct Session {
    addr: SocketAddr,
    config: ClientConfig,
    /// The minor version agreed: 2, or 1 when the server has no NFSv4.2.
    pub minor: u32,
    /// The fore channel as the server granted it (at the first CREATE_SESSION).
    pub channel: ChannelAttrs,
    /// The channel asked for in CREATE_SESSION.
    wanted: ChannelAttrs,
    /// This client's owner, the same in every EXCHANGE_ID.
    verf: Verifier,
    owner: Vec<u8>,
    slots: Mutex<Slots>,
    /// The opened file, once opened: re-opened by a recovery.
    open: Mutex<Option<OpenState>>,
    /// Held by the one task recovering the session.
    recovery: tokio::sync::Mutex<()>,
    /// Opens recovered by reclaim (CLAIM_PREVIOUS) and by a new OPEN (CLAIM_FH).
    reclaimed: AtomicU32,
    reopened: AtomicU32,
    slot_free: Notify,
    last_used: Mutex<Instant>,
    lost: Mutex<Option<Status>>,
    renewal: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(task) = self
            .renewal
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

/// EXCHANGE_ID: the client id and the sequence id for CREATE_SESSION.
async fn exchange_id(
    rpc: &RpcConn,
    minor: u32,
    verf: &Verifier,
    owner: &[u8],
) -> Result<(u64, u32), Nfs4Error> {
    let mut ops = Ops::new();
    ops.exchange_id(verf, owner);
    let body = call_plain(rpc, minor, "EXCHANGE_ID", &ops).await?;
    Reply::parse(&body)
        .and_then(|mut r| r.exchange_id())
        .map_err(|e| Nfs4Error::reply("EXCHANGE_ID", e))
}

/// CREATE_SESSION (which also binds `rpc` to the new session).
async fn create_session(
    rpc: &RpcConn,
    minor: u32,
    clientid: u64,
    sequence: u32,
    wanted: &ChannelAttrs,
) -> Result<(SessionId, ChannelAttrs), Nfs4Error> {
    let mut ops = Ops::new();
    ops.create_session(clientid, sequence, wanted);
    let body = call_plain(rpc, minor, "CREATE_SESSION", &ops).await?;
    Reply::parse(&body)
        .and_then(|mut r| r.create_session())
        .map_err(|e| Nfs4Error::reply("CREATE_SESSION", e))
}

/// Checks a SEQUENCE + RECLAIM_COMPLETE reply (COMPLETE_ALREADY is fine).
fn reclaim_complete_reply(body: &[u8]) -> Result<(), Nfs4Error> {
    match Reply::parse(body).and_then(|mut r| {
        r.sequence()?;
        r.simple(ops::OP_RECLAIM_COMPLETE)
    }) {
        Ok(())
        | Err(ReplyError::Status {
            status: Status::COMPLETE_ALREADY,
            ..
        }) => Ok(()),
        Err(e) => Err(Nfs4Error::reply("RECLAIM_COMPLETE", e)),
    }
}

/// The open owner of every OPEN.
pub const OPEN_OWNER: &[u8] = b"ferry";

/// A client owner unique to this open: one client id per opened file.
fn client_owner() -> (Verifier, Vec<u8>) {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let owner = format!(
        "ferry/{}/{}/{}.{}/{n}",
        super::super::hostname(),
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
fn open_reply(body: &[u8]) -> ops::ReplyResult<(StateId, Option<StateId>)> {
    Reply::parse(body).and_then(|mut r| {
        r.sequence()?;
        r.simple(ops::OP_PUTFH)?;
        r.open()
    })
}

impl Session {
    /// [`Session::establish_once`], again over a new connection when the connection is
    /// lost on the way (within the reconnect window, as every other request): a server
    /// that has only just started can reset the first connections it accepts. A refused
    /// or timed-out connect fails at once, so a wrong port is reported without delay.
    pub async fn establish(
        addr: SocketAddr,
        config: &ClientConfig,
        max_transfer: u32,
    ) -> Result<(Arc<Self>, Arc<Link>), Nfs4Error> {
        let start = Instant::now();
        let mut delay = Duration::from_millis(50);
        loop {
            let result = Self::establish_once(addr, config, max_transfer).await;
            let lost = matches!(
                &result,
                Err(Nfs4Error::Rpc {
                    source: RpcError::Disconnected { .. },
                    ..
                })
            );
            if !lost || start.elapsed() >= config.reconnect_timeout {
                return result;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    /// Connects, agrees on a minor version (4.2, else 4.1), creates the client id and
    /// the session, and declares reclaims complete. Returns the session and its first
    /// connection.
    async fn establish_once(
        addr: SocketAddr,
        config: &ClientConfig,
        max_transfer: u32,
    ) -> Result<(Arc<Self>, Arc<Link>), Nfs4Error> {
        let rpc = RpcConn::connect(addr, NFS4_PROGRAM, NFS4_VERSION, &config.rpc)
            .await
            .map_err(|source| Nfs4Error::Rpc {
                op: "connect",
                source,
            })?;
        let (verf, owner) = client_owner();
        let mut agreed = None;
        for minor in MINOR_VERSIONS {
            match exchange_id(&rpc, minor, &verf, &owner).await {
                Ok(ids) => {
                    agreed = Some((minor, ids));
                    break;
                }
                Err(Nfs4Error::Status {
                    status: Status::MINOR_VERS_MISMATCH,
                    ..
                }) => continue,
                Err(e) => return Err(e),
            }
        }
        let Some((minor, (clientid, sequence))) = agreed else {
            return Err(Nfs4Error::Status {
                op: "EXCHANGE_ID",
                index: 0,
                status: Status::MINOR_VERS_MISMATCH,
            });
        };
        // Room for the largest READ or WRITE plus its COMPOUND around it.
        let room = max_transfer.saturating_add(64 * 1024);
        let wanted = ChannelAttrs {
            header_pad: 0,
            max_request: room,
            max_response: room,
            max_response_cached: 64 * 1024,
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
        let link = Arc::new(Link::with(rpc, 0));
        let mut ops = Ops::new();
        ops.reclaim_complete();
        let body = session
            .call(&link, "RECLAIM_COMPLETE", &ops, None, None)
            .await
            .0?;
        reclaim_complete_reply(&body)?;
        Ok((session, link))
    }

    /// Renews the lease with a lone SEQUENCE every half lease while no other request
    /// does, over `link`, for as long as the session lives.
    pub fn start_renewal(self: &Arc<Self>, link: Arc<Link>, lease: Duration) {
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
        *self.renewal.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
    }

    fn idle(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn lose(&self, status: Status) {
        self.lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(status);
    }

    fn lost(&self) -> Option<Status> {
        *self.lost.lock().unwrap_or_else(|e| e.into_inner())
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
        self.lock_slots().clientid
    }

    fn generation(&self) -> u64 {
        self.lock_slots().generation
    }

    /// Records the file opened in this session, for a recovery to open it again.
    pub fn set_open(&self, open: OpenState) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = Some(open);
    }

    fn open_state(&self) -> Option<OpenState> {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The open state id requests are sent with.
    fn stateid(&self) -> Option<StateId> {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|o| o.stateid)
    }

    /// Recovers after the server reported `status` (it lost the session, the client id
    /// or the open state) for a request sent on session `generation`: one task at a
    /// time, the others wait and find the session already replaced. When recovery
    /// fails, the session is lost for every later request.
    async fn recover(&self, link: &Link, generation: u64, status: Status) -> Result<(), Nfs4Error> {
        let _one = self.recovery.lock().await;
        if let Some(status) = self.lost() {
            return Err(Nfs4Error::SessionLost { status });
        }
        if self.generation() != generation {
            return Ok(());
        }
        match self.reestablish(link, generation + 1).await {
            Ok(()) => Ok(()),
            Err(e) => {
                self.lose(status);
                Err(Nfs4Error::RecoveryFailed {
                    status,
                    source: Box::new(e),
                })
            }
        }
    }

    /// [`recover`](Self::recover) for one request, at most [`MAX_RECOVERIES`] times: a
    /// server that keeps refusing the new state fails the request instead of looping.
    async fn recover_for(
        &self,
        link: &Link,
        generation: u64,
        status: Status,
        recoveries: &mut u32,
    ) -> Result<(), Nfs4Error> {
        *recoveries += 1;
        if *recoveries > MAX_RECOVERIES {
            return Err(Nfs4Error::SessionLost { status });
        }
        self.recover(link, generation, status).await
    }

    /// RFC 8881 section 8.4.2: a new client id (the same owner) and session, the open
    /// reclaimed (CLAIM_PREVIOUS) or, after RECLAIM_COMPLETE, opened again by its handle
    /// (CLAIM_FH) for a new open state id, within the reconnect window. `link` gets the new connection, bound
    /// by CREATE_SESSION; the other handles' connections are bound again at their next
    /// request.
    async fn reestablish(&self, link: &Link, generation: u64) -> Result<(), Nfs4Error> {
        let start = Instant::now();
        let window = self.config.reconnect_timeout;
        let mut delay = Duration::from_millis(50);
        let rpc = loop {
            match RpcConn::connect(self.addr, NFS4_PROGRAM, NFS4_VERSION, &self.config.rpc).await {
                Ok(rpc) => break rpc,
                Err(source) if retryable(&source) && start.elapsed() < window => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                Err(source) => {
                    return Err(Nfs4Error::Rpc {
                        op: "connect",
                        source,
                    })
                }
            }
        };
        let (clientid, sequence) = exchange_id(&rpc, self.minor, &self.verf, &self.owner).await?;
        let (id, channel) =
            create_session(&rpc, self.minor, clientid, sequence, &self.wanted).await?;
        // Sent on slot 0 of the new session, before any other request can use it.
        let mut seqid = 1u32;
        let mut send = |ops: Ops| {
            let args = compound(
                self.minor,
                Some(&Sequence {
                    session: id,
                    seqid,
                    slot: 0,
                    highest_slot: 0,
                }),
                &ops,
                None,
            );
            seqid += 1;
            let rpc = rpc.clone();
            async move {
                rpc.call(NFSPROC4_COMPOUND, &args, None, None)
                    .await
                    .result
                    .map_err(|source| Nfs4Error::Rpc {
                        op: "recovery",
                        source,
                    })
            }
        };
        let open = self.open_state();
        let mut stateid = None;
        if let Some(open) = &open {
            // In the server's grace period the open is reclaimed; a server without one
            // (NO_GRACE), or that cannot reclaim it, gets a new OPEN below.
            let mut ops = Ops::new();
            ops.putfh(&open.fh)
                .open_previous(clientid, OPEN_OWNER, open.access);
            let body = send(ops).await?;
            match open_reply(&body) {
                Ok((id, _deleg)) => {
                    stateid = Some(id);
                    self.reclaimed.fetch_add(1, Ordering::Relaxed);
                }
                // The file is gone, or the new session already failed.
                Err(ReplyError::Status { op, index, status })
                    if index == 0
                        || matches!(
                            status,
                            Status::STALE | Status::BADHANDLE | Status::FHEXPIRED
                        ) =>
                {
                    return Err(Nfs4Error::Status {
                        op: op_name(op),
                        index,
                        status,
                    })
                }
                Err(_) => {}
            }
        }
        let mut ops = Ops::new();
        ops.reclaim_complete();
        reclaim_complete_reply(&send(ops).await?)?;
        if let (Some(open), None) = (&open, stateid) {
            let mut delay = Duration::from_millis(50);
            loop {
                let mut ops = Ops::new();
                ops.putfh(&open.fh)
                    .open_fh(clientid, OPEN_OWNER, open.access);
                let body = send(ops).await?;
                match open_reply(&body) {
                    Ok((id, _deleg)) => {
                        stateid = Some(id);
                        self.reopened.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    // A server in its grace period allows only reclaims: wait it out.
                    Err(ReplyError::Status {
                        status: Status::GRACE | Status::DELAY,
                        ..
                    }) if start.elapsed() < window => {
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(1));
                    }
                    Err(e) => return Err(Nfs4Error::reply("OPEN", e)),
                }
            }
        }
        // The new state id first: a request on the new session must not carry the old
        // one (which would start another recovery).
        if let (Some(stateid), Some(open)) = (
            stateid,
            self.open.lock().unwrap_or_else(|e| e.into_inner()).as_mut(),
        ) {
            open.stateid = stateid;
        }
        let next_seqid = seqid;
        {
            let mut st = self.lock_slots();
            *st = Slots::new(clientid, id, generation, &channel);
            st.seq[0] = next_seqid;
        }
        *self.lost.lock().unwrap_or_else(|e| e.into_inner()) = None;
        link.set(rpc, generation).await;
        self.slot_free.notify_waiters();
        Ok(())
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn acquire(&self) -> SlotGuard<'_> {
        loop {
            {
                let mut st = self.lock_slots();
                let limit = st.limit;
                if let Some(index) = st.busy[..limit].iter().position(|b| !b) {
                    st.busy[index] = true;
                    let highest = st.busy.iter().rposition(|b| *b).unwrap_or(index) as u32;
                    return SlotGuard {
                        session: self,
                        generation: st.generation,
                        id: st.id,
                        index,
                        seqid: st.seq[index],
                        uncertain: st.uncertain[index],
                        highest,
                        released: false,
                    };
                }
            }
            self.slot_free.notified().await;
        }
    }

    /// Frees a slot; false when a SEQ_MISORDERED could not be repaired.
    fn release(&self, generation: u64, index: usize, seqid: u32, how: Release) -> bool {
        let repaired = {
            let mut st = self.lock_slots();
            if st.generation != generation {
                // A slot of a session a recovery replaced: nothing to update.
                drop(st);
                self.slot_free.notify_one();
                return true;
            }
            st.busy[index] = false;
            match how {
                Release::Unsent => true,
                Release::Uncertain => {
                    st.seq[index] = seqid.wrapping_add(1);
                    st.uncertain[index] = true;
                    true
                }
                Release::Done { target_highest } => {
                    st.seq[index] = seqid.wrapping_add(1);
                    st.uncertain[index] = false;
                    let n = st.seq.len();
                    st.limit = (target_highest as usize).saturating_add(1).clamp(1, n);
                    true
                }
                Release::Misordered => {
                    if st.uncertain[index] {
                        st.seq[index] = seqid.wrapping_sub(1);
                        st.uncertain[index] = false;
                        true
                    } else {
                        false
                    }
                }
            }
        };
        self.slot_free.notify_one();
        repaired
    }

    /// Sends SEQUENCE followed by `ops` (and `data` after them, for a final WRITE), with
    /// the retries described in the module docs. With a `sink`, the reply is a read
    /// compound (SEQUENCE, PUTFH, READ) whose data lands at the start of the sink's view;
    /// the sink always comes back when one was given. Returns the whole reply body,
    /// SEQUENCE included, with SEQUENCE known to have succeeded.
    pub async fn call(
        &self,
        link: &Link,
        what: &'static str,
        ops: &Ops,
        data: Option<&[u8]>,
        mut sink: Option<IoBuf>,
    ) -> (Result<Vec<u8>, Nfs4Error>, Option<IoBuf>) {
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
        let mut delay = Duration::from_millis(20);
        let config = &self.config;
        let fail = |e: Nfs4Error, sink: Option<IoBuf>| (Err(e), sink);
        let mut recoveries = 0;
        loop {
            if let Some(status) = self.lost() {
                return fail(Nfs4Error::SessionLost { status }, sink);
            }
            let generation = self.generation();
            let rpc = match link.rpc(self).await {
                Ok(rpc) => rpc,
                Err(Nfs4Error::SessionLost { status }) => {
                    match self
                        .recover_for(link, generation, status, &mut recoveries)
                        .await
                    {
                        Ok(()) => continue,
                        Err(e) => return fail(e, sink),
                    }
                }
                Err(Nfs4Error::Rpc { source, .. })
                    if retryable(&source) && start.elapsed() < config.reconnect_timeout =>
                {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                    continue;
                }
                Err(e) => return fail(e, sink),
            };
            let slot = self.acquire().await;
            let slot_generation = slot.generation;
            let stateid = self.stateid();
            let args = compound(
                self.minor,
                Some(&Sequence {
                    session: slot.id,
                    seqid: slot.seqid,
                    slot: slot.index as u32,
                    highest_slot: slot.highest,
                }),
                ops,
                stateid.as_ref(),
            );
            let read_shape = ReadShape::Compound4 {
                before: READ_PREFIX,
                read_op: OP_READ,
            };
            let out = rpc
                .call_shaped(NFSPROC4_COMPOUND, &args, data, sink.take(), read_shape)
                .await;
            sink = restore(out.sink);
            let body = match out.result {
                Ok(body) => body,
                Err(e) => {
                    slot.release(Release::Uncertain);
                    if retryable(&e) && start.elapsed() < config.reconnect_timeout {
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(1));
                        continue;
                    }
                    return fail(
                        Nfs4Error::Rpc {
                            op: what,
                            source: e,
                        },
                        sink,
                    );
                }
            };
            let parsed = Reply::parse(&body).and_then(|mut r| Ok((r.sequence()?, r.status)));
            let status = match parsed {
                Ok((seq, status)) => {
                    slot.release(Release::Done {
                        target_highest: seq.target_highest_slot,
                    });
                    // SEQ4_STATUS_EXPIRED or _REVOKED: the open state is gone; the next
                    // request using it fails with EXPIRED or a bad state id, and recovers.
                    self.touch();
                    status
                }
                Err(ReplyError::Status { status, .. }) => {
                    if status == Status::SEQ_MISORDERED && slot.uncertain {
                        if slot.release(Release::Misordered) {
                            continue;
                        }
                    } else {
                        slot.release(Release::Unsent);
                    }
                    if status.is_session_loss() {
                        match self
                            .recover_for(link, slot_generation, status, &mut recoveries)
                            .await
                        {
                            Ok(()) => continue,
                            Err(e) => return fail(e, sink),
                        }
                    }
                    if matches!(status, Status::DELAY | Status::GRACE)
                        && start.elapsed() < config.rpc.request_timeout
                    {
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(1));
                        continue;
                    }
                    return fail(
                        Nfs4Error::Status {
                            op: "SEQUENCE",
                            index: 0,
                            status,
                        },
                        sink,
                    );
                }
                Err(e) => {
                    slot.release(Release::Uncertain);
                    return fail(Nfs4Error::reply(what, e), sink);
                }
            };
            if matches!(status, Status::DELAY | Status::GRACE)
                && start.elapsed() < config.rpc.request_timeout
            {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
                continue;
            }
            if status.is_session_loss() {
                match self
                    .recover_for(link, slot_generation, status, &mut recoveries)
                    .await
                {
                    Ok(()) => continue,
                    Err(e) => return fail(e, sink),
                }
            }
            return (Ok(body), sink);
        }
    }

    /// Ends the session and the client id (best effort; the server forgets them when the
    /// lease expires anyway).
    pub async fn destroy(&self, link: &Link) {
        let Ok(rpc) = link.rpc(self).await else {
            return;
        };
        let (clientid, id) = {
            let st = self.lock_slots();
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
