//! NFSv4.1 and 4.2 (RFC 8881, RFC 7862).
//!
//! Why a second protocol when NFSv3 works: NFSv4.2's SEEK reports holes, so a sparse
//! file is read without reading its holes, and DEALLOCATE punches holes instead of
//! writing zeroes; many servers also export only NFSv4. The messages are in `ops.rs`;
//! the client id, session and its slot table in `session.rs` and `slots.rs`; each
//! handle's connection in `link.rs`; recovery after a server restart in `recovery.rs`;
//! the file operations ferry uses (path lookup, OPEN, READ, WRITE, COMMIT, SEEK,
//! DEALLOCATE, CLOSE) in `file.rs`. XDR and ONC RPC (with READ data placed straight into
//! the caller's buffer) are shared with the NFSv3 client.
//!
//! Model: each opened file has its own client id and session, and one OPEN state shared
//! by all its handles; each handle has its own TCP connection ([`Link`]) bound to that
//! session with BIND_CONN_TO_SESSION, so the handles share one slot table and one lease.
//! The path is the server's NFSv4 pseudo path, walked from PUTROOTFH with LOOKUP.

mod file;
pub mod link;
pub mod ops;
mod recovery;
pub mod session;
mod slots;

pub use file::{call, open_file, open_path, Location, OpenFile, Opened, MAX_DEPTH, MAX_NAME};
pub use link::Link;
pub use ops::{Attrs, Fh, Reply, ReplyError, StateId, Status};
pub use recovery::MAX_RECOVERIES;
pub use session::Session;

use crate::error::Error;

impl Error {
    /// The error a COMPOUND reply to `what` makes: the failed operation's status, or a
    /// malformed reply.
    pub fn reply(what: &'static str, e: ReplyError) -> Self {
        match e {
            ReplyError::Status { op, index, status } => Self::Nfs4 {
                op: ops::op_name(op),
                index,
                status,
            },
            ReplyError::Malformed(message) => Self::Malformed { op: what, message },
        }
    }
}
