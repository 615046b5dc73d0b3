//! Recovery after the server lost the session, the client id or the open state (RFC 8881
//! section 8.4.2), as the module docs of `session.rs` describe: one task recovers while
//! the others wait, in named steps: reconnect, EXCHANGE_ID and CREATE_SESSION, the open
//! reclaimed or opened anew, and the new state installed.

use std::sync::atomic::Ordering;

use super::link::Link;
use super::ops::{
    compound, op_name, Ops, ReplyError, Sequence, SessionId, StateId, Status, NFS4_PROGRAM,
    NFS4_VERSION, NFSPROC4_COMPOUND,
};
use super::session::{create_session, exchange_id, open_reply, reclaim_complete_reply};
use super::session::{OpenState, Session, OPEN_OWNER};
use super::slots::Slots;
use crate::error::{Error, Result};
use crate::retry::{Backoff, FIRST_DELAY};
use crate::rpc::{RpcConn, Sink};

/// Recoveries one request may go through.
pub const MAX_RECOVERIES: u32 = 3;

/// The requests of a recovery, sent on slot 0 of the new session before any other
/// request can use it.
struct SlotZero<'a, B> {
    rpc: &'a RpcConn<B>,
    minor: u32,
    session: SessionId,
    seqid: u32,
}

impl<B: Sink> SlotZero<'_, B> {
    async fn send(&mut self, ops: Ops) -> Result<Vec<u8>> {
        let sequence = Sequence {
            session: self.session,
            seqid: self.seqid,
            slot: 0,
            highest_slot: 0,
        };
        let args = compound(self.minor, Some(&sequence), &ops, None);
        self.seqid += 1;
        self.rpc
            .call(NFSPROC4_COMPOUND, &args, None, None)
            .await
            .result
            .map_err(|source| Error::Rpc {
                op: "recovery",
                source,
            })
    }
}

impl Session {
    /// Recovers after the server reported `status` (it lost the session, the client id
    /// or the open state) for a request sent on session `generation`: one task at a
    /// time, the others wait and find the session already replaced. When recovery
    /// fails, the session is lost for every later request.
    async fn recover<B: Sink>(
        &self,
        link: &Link<B>,
        generation: u64,
        status: Status,
    ) -> Result<()> {
        let _one = self.recovery.lock().await;
        if let Some(status) = self.lost() {
            return Err(Error::SessionLost { status });
        }
        if self.generation() != generation {
            return Ok(());
        }
        match self.reestablish(link, generation + 1).await {
            Ok(()) => Ok(()),
            Err(e) => {
                self.lose(status);
                Err(Error::RecoveryFailed {
                    status,
                    source: Box::new(e),
                })
            }
        }
    }

    /// [`recover`](Self::recover) for one request, at most [`MAX_RECOVERIES`] times: a
    /// server that keeps refusing the new state fails the request instead of looping.
    pub(super) async fn recover_for<B: Sink>(
        &self,
        link: &Link<B>,
        generation: u64,
        status: Status,
        recoveries: &mut u32,
    ) -> Result<()> {
        *recoveries += 1;
        if *recoveries > MAX_RECOVERIES {
            return Err(Error::SessionLost { status });
        }
        self.recover(link, generation, status).await
    }

    /// A new client id (the same owner) and session, the open recovered, within the
    /// reconnect window. `link` gets the new connection, bound by CREATE_SESSION; the
    /// other handles' connections are bound again at their next request.
    async fn reestablish<B: Sink>(&self, link: &Link<B>, generation: u64) -> Result<()> {
        let mut backoff = Backoff::new(FIRST_DELAY);
        let rpc = self.reconnect(&mut backoff).await?;
        let (clientid, sequence) = exchange_id(&rpc, self.minor, &self.verf, &self.owner).await?;
        let (id, channel) =
            create_session(&rpc, self.minor, clientid, sequence, &self.wanted).await?;
        let mut slot0 = SlotZero {
            rpc: &rpc,
            minor: self.minor,
            session: id,
            seqid: 1,
        };
        let stateid = self
            .recover_open(&mut slot0, clientid, &mut backoff)
            .await?;
        let mut slots = Slots::new(clientid, id, generation, &channel);
        slots.seq[0] = slot0.seqid;
        self.install(link, rpc.clone(), slots, stateid).await;
        Ok(())
    }

    /// A new connection, retried while the reconnect window lasts.
    async fn reconnect<B: Sink>(&self, backoff: &mut Backoff) -> Result<RpcConn<B>> {
        loop {
            match RpcConn::connect(self.addr, NFS4_PROGRAM, NFS4_VERSION, &self.config.rpc).await {
                Ok(rpc) => return Ok(rpc),
                Err(source)
                    if source.is_connection_loss()
                        && backoff.wait_within(self.config.reconnect_timeout).await => {}
                Err(source) => {
                    return Err(Error::Rpc {
                        op: "connect",
                        source,
                    })
                }
            }
        }
    }

    /// The open on the new session: reclaimed (CLAIM_PREVIOUS) in the server's grace
    /// period, else, after RECLAIM_COMPLETE, opened anew by its handle (CLAIM_FH). None
    /// when no file was open.
    async fn recover_open<B: Sink>(
        &self,
        slot0: &mut SlotZero<'_, B>,
        clientid: u64,
        backoff: &mut Backoff,
    ) -> Result<Option<StateId>> {
        let open = self.open_state();
        let reclaimed = match &open {
            Some(open) => self.reclaim(slot0, clientid, open).await?,
            None => None,
        };
        let mut ops = Ops::new();
        ops.reclaim_complete();
        reclaim_complete_reply(&slot0.send(ops).await?)?;
        match (&open, reclaimed) {
            (Some(open), None) => Ok(Some(self.reopen(slot0, clientid, open, backoff).await?)),
            (_, reclaimed) => Ok(reclaimed),
        }
    }

    /// Reclaims the open in the server's grace period: None when the server has none
    /// (NO_GRACE) or cannot reclaim it; an error when the file is gone or the new
    /// session already failed.
    async fn reclaim<B: Sink>(
        &self,
        slot0: &mut SlotZero<'_, B>,
        clientid: u64,
        open: &OpenState,
    ) -> Result<Option<StateId>> {
        let mut ops = Ops::new();
        ops.putfh(&open.fh)
            .open_previous(clientid, OPEN_OWNER, open.access);
        match open_reply(&slot0.send(ops).await?) {
            Ok((id, _deleg)) => {
                self.reclaimed.fetch_add(1, Ordering::Relaxed);
                Ok(Some(id))
            }
            Err(ReplyError::Status { op, index, status })
                if index == 0
                    || matches!(
                        status,
                        Status::STALE | Status::BADHANDLE | Status::FHEXPIRED
                    ) =>
            {
                Err(Error::Nfs4 {
                    op: op_name(op),
                    index,
                    status,
                })
            }
            Err(_) => Ok(None),
        }
    }

    /// Opens the file again by its handle, waiting out a grace period (in which a
    /// server allows only reclaims) within the reconnect window.
    async fn reopen<B: Sink>(
        &self,
        slot0: &mut SlotZero<'_, B>,
        clientid: u64,
        open: &OpenState,
        backoff: &mut Backoff,
    ) -> Result<StateId> {
        loop {
            let mut ops = Ops::new();
            ops.putfh(&open.fh)
                .open_fh(clientid, OPEN_OWNER, open.access);
            match open_reply(&slot0.send(ops).await?) {
                Ok((id, _deleg)) => {
                    self.reopened.fetch_add(1, Ordering::Relaxed);
                    return Ok(id);
                }
                Err(ReplyError::Status {
                    status: Status::GRACE | Status::DELAY,
                    ..
                }) if backoff.wait_within(self.config.reconnect_timeout).await => {}
                Err(e) => return Err(Error::reply("OPEN", e)),
            }
        }
    }

    /// Makes the new session current: the new open state id first (a request on the
    /// new session must not carry the old one, which would start another recovery), the
    /// slot table, then `link`'s connection; waiting requests go on.
    async fn install<B: Sink>(
        &self,
        link: &Link<B>,
        rpc: RpcConn<B>,
        slots: Slots,
        stateid: Option<StateId>,
    ) {
        if let (Some(stateid), Some(open)) = (stateid, self.open.lock().as_mut()) {
            open.stateid = stateid;
        }
        let generation = slots.generation;
        *self.slots.lock() = slots;
        *self.lost.lock() = None;
        link.set(rpc, generation).await;
        self.slot_free.notify_waiters();
    }
}
