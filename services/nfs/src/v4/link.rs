//! [`Link`]: one handle's TCP connection, bound to the session (BIND_CONN_TO_SESSION),
//! made again when lost and bound again after a recovery replaced the session.

use std::sync::atomic::{AtomicU64, Ordering};

use super::ops::{Ops, Reply, ReplyError, NFS4_PROGRAM, NFS4_VERSION};
use super::session::{call_plain, Session};
use crate::error::{Error, Result};
use crate::rpc::{RpcConn, Sink};

/// One TCP connection of one handle, bound to the session (re-established when lost).
/// `B` is the buffer type READ data is placed into.
pub struct Link<B = Vec<u8>> {
    rpc: tokio::sync::Mutex<Option<RpcConn<B>>>,
    /// The session generation the connection is bound to.
    bound: AtomicU64,
}

impl<B> std::fmt::Debug for Link<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("bound", &self.bound.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<B: Sink> Link<B> {
    pub(super) fn with(rpc: Option<RpcConn<B>>, generation: u64) -> Self {
        Self {
            rpc: tokio::sync::Mutex::new(rpc),
            bound: AtomicU64::new(generation),
        }
    }

    /// A new connection bound to `session`.
    pub async fn connect(session: &Session) -> Result<Self> {
        let link = Self::with(None, 0);
        link.rpc(session).await?;
        Ok(link)
    }

    /// The connection, made and bound to the current session first when needed.
    pub(super) async fn rpc(&self, session: &Session) -> Result<RpcConn<B>> {
        let mut slot = self.rpc.lock().await;
        let (id, generation) = {
            let st = session.slots.lock();
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
                RpcConn::connect(
                    session.addr,
                    NFS4_PROGRAM,
                    NFS4_VERSION,
                    &session.config.rpc,
                )
                .await
                .map_err(|source| Error::Rpc {
                    op: "connect",
                    source,
                })?
            }
        };
        let mut ops = Ops::new();
        ops.bind_conn(&id);
        let body = call_plain(&rpc, session.minor, "BIND_CONN_TO_SESSION", &ops).await?;
        match Reply::parse(&body).and_then(|mut r| r.bind_conn()) {
            Ok(()) => {}
            // With SP4_NONE a server may instead bind the connection at its first
            // SEQUENCE (RFC 8881 section 2.10.3.1).
            Err(ReplyError::Status { status, .. }) if status.is_unsupported() => {}
            Err(ReplyError::Status { status, .. }) if status.is_session_loss() => {
                return Err(Error::SessionLost { status });
            }
            Err(e) => return Err(Error::reply("BIND_CONN_TO_SESSION", e)),
        }
        self.bound.store(generation, Ordering::Release);
        *slot = Some(rpc.clone());
        Ok(rpc)
    }

    /// Makes `rpc` this link's connection, bound to session `generation`.
    pub(super) async fn set(&self, rpc: RpcConn<B>, generation: u64) {
        let mut slot = self.rpc.lock().await;
        self.bound.store(generation, Ordering::Release);
        *slot = Some(rpc);
    }
}
