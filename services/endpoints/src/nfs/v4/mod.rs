//! [`Nfs4Source`] and [`Nfs4Target`]: NFSv4.2 (falling back to 4.1) for URLs with
//! `version=4`, over ferry-nfs's NFSv4 client (sessions, slots, lease renewal and
//! recovery after a server restart live there).
//!
//! Each opened file has its own client id and session and one OPEN state shared by all
//! its handles; each handle ([`Source::connect`](ferry_core::Source::connect)) has its
//! own connection bound to that session. Writes are UNSTABLE and made durable by COMMIT
//! at flush with the write verifier checked. When the last handle is dropped the file is
//! CLOSEd and the session and client id destroyed, in a spawned task (best effort: the
//! server expires them with the lease otherwise).

mod source;
mod target;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use ferry_core::spec::NfsSpec;
use ferry_core::{Error, Result};
use ferry_nfs::v4::{self, Link, OpenFile, Opened, Session, StateId};
use ferry_nfs::ClientConfig;

pub use source::Nfs4Source;
pub use target::Nfs4Target;

use super::error::{open_error, request_error};
use super::{NfsBuf, MAX_TRANSFER};

/// What all handles of one opened file share.
struct Shared {
    describe: String,
    config: ClientConfig,
    session: Arc<Session>,
    /// The first connection (used for lease renewal and the final clean-up).
    main: Arc<Link<NfsBuf>>,
    file: OpenFile,
    /// A delegation the server granted although none was wanted (returned at close).
    deleg: Option<StateId>,
    size: u64,
    rsize: u32,
    wsize: u32,
    /// SEEK works (NFSv4.2 and the server implements it): the source reports extents.
    seek: bool,
    /// DEALLOCATE works (targets).
    dealloc: AtomicBool,
    commits: ferry_nfs::Tracker,
    /// A target this open created: it reads as zeroes.
    created: bool,
    zeroes: std::sync::OnceLock<Vec<u8>>,
    /// Bytes READ from the server by all handles.
    read_bytes: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nfs4File")
            .field("describe", &self.describe)
            .field("minor", &self.session.minor)
            .field("size", &self.size)
            .field("rsize", &self.rsize)
            .field("wsize", &self.wsize)
            .field("seek", &self.seek)
            .finish_non_exhaustive()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let session = Arc::clone(&self.session);
        let link = Arc::clone(&self.main);
        let file = self.file.clone();
        let deleg = self.deleg;
        rt.spawn(async move { file.close(&session, &link, deleg).await });
    }
}

impl Shared {
    /// What [`Nfs4Source::open`] and [`Nfs4Target::open`] found, as shared state.
    fn new(o: Opened<NfsBuf>, opening: Opening, opened: Open, size: u64) -> Self {
        Self {
            describe: opening.describe,
            config: opening.config,
            session: o.session,
            main: o.link,
            file: opened.file,
            deleg: opened.deleg,
            size,
            rsize: o.rsize,
            wsize: o.wsize,
            seek: opened.seek,
            dealloc: AtomicBool::new(opened.dealloc),
            commits: Default::default(),
            created: opened.created,
            zeroes: Default::default(),
            read_bytes: AtomicU64::new(0),
        }
    }

    fn err(&self, e: ferry_nfs::Error, op: &'static str, offset: u64) -> Error {
        request_error(e, "NFSv4", &self.config, self.config.reconnect_timeout)
            .at(op, offset)
            .with_endpoint(self.describe.clone())
    }

    fn check_range(&self, op: &'static str, offset: u64, len: u64) -> Result<()> {
        super::check_range(&self.describe, self.size, op, offset, len)
    }

    /// A new connection for another handle, bound to the session.
    async fn connect(&self) -> Result<Link<NfsBuf>> {
        Link::connect(&self.session).await.map_err(|e| {
            super::error::doing_error(
                e,
                "connect another handle to the NFSv4 session",
                &self.config,
            )
            .with_operation("connect")
            .with_endpoint(self.describe.clone())
        })
    }
}

/// The endpoint's name and client settings, made first at every open.
struct Opening {
    describe: String,
    config: ClientConfig,
}

impl Opening {
    fn new(spec: &NfsSpec, options: &super::NfsOptions) -> Self {
        Self {
            describe: super::describe(spec),
            config: super::client_config(spec, options),
        }
    }

    /// An open failure with its context.
    fn fail(&self, e: Error) -> Error {
        e.with_operation("open")
            .with_endpoint(self.describe.clone())
    }

    /// Connects, creates the session and looks the path up.
    async fn lookup(&self, spec: &NfsSpec) -> Result<Opened<NfsBuf>> {
        let location = v4::Location {
            host: spec.host.clone(),
            port: spec.nfsport.or(spec.port),
            path: spec.path.clone(),
        };
        v4::open_path(&location, &self.config, MAX_TRANSFER)
            .await
            .map_err(|e| self.fail(open_error(e, &self.config)))
    }
}

/// The file as OPEN left it, and what the probes after it found.
struct Open {
    file: OpenFile,
    deleg: Option<StateId>,
    created: bool,
    seek: bool,
    dealloc: bool,
}
