//! NFSv4.2 (falling back to 4.1) for URLs with `version=4`: [`Nfs4Source`] and
//! [`Nfs4Target`].
//!
//! Why a second protocol when NFSv3 works: NFSv4.2's SEEK reports holes, so a sparse
//! source is copied without reading its holes, and DEALLOCATE punches holes in a target
//! instead of sending zeroes; many servers also export only NFSv4. The messages are in
//! `ops.rs`, the client id, session, slot table and connections in `session.rs`; XDR and
//! ONC RPC (with READ data placed straight into the caller's buffer) are shared with the
//! NFSv3 client.
//!
//! Model: each opened file has its own client id and session, and one OPEN state shared
//! by all its handles; each handle ([`Source::connect`](ferry_core::Source::connect))
//! has its own TCP connection bound to that session with BIND_CONN_TO_SESSION, so the
//! handles share one slot table and one lease. The path is the server's NFSv4 pseudo
//! path, walked from PUTROOTFH with LOOKUP. Writes are UNSTABLE and made durable by
//! COMMIT at flush with the write verifier checked (the NFSv3 `commit.rs` tracker). When
//! the last handle is dropped the file is CLOSEd and the session and client id destroyed,
//! in a spawned task (best effort: the server expires them with the lease otherwise).
//! After a server restart the session and the open are recovered (see `session.rs`) and
//! requests go on with the new state id; writes that were not committed before the restart
//! make the next flush fail with the write-verifier error.

mod ops;
mod session;
mod source;
mod target;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::spec::NfsSpec;
use ferry_core::{BlockSizes, Error, ErrorKind, Result};

pub use source::Nfs4Source;
pub use target::Nfs4Target;

use super::client::ClientConfig;
use super::commit;
use ops::{Attrs, Fh, Ops, Reply, ReplyError, StateId, Status};
use session::{Link, Nfs4Error, Session};

/// Path components accepted (each one LOOKUP in one COMPOUND).
const MAX_DEPTH: usize = 32;
/// Longest name of one path component.
const MAX_NAME: usize = 255;

/// What all handles of one opened file share.
struct Shared {
    describe: String,
    config: ClientConfig,
    session: Arc<Session>,
    /// The first connection (used for lease renewal and the final clean-up).
    main: Arc<Link>,
    fh: Fh,
    stateid: StateId,
    /// A delegation the server granted although none was wanted (returned at close).
    deleg: Option<StateId>,
    size: u64,
    rsize: u32,
    wsize: u32,
    /// SEEK works (NFSv4.2 and the server implements it): the source reports extents.
    seek: bool,
    /// DEALLOCATE works (targets).
    dealloc: AtomicBool,
    commits: commit::Tracker,
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
        let stateid = self.stateid;
        let deleg = self.deleg;
        let fh = self.fh.clone();
        rt.spawn(async move {
            let mut ops = Ops::new();
            ops.putfh(&fh);
            if let Some(d) = &deleg {
                ops.delegreturn(d);
            }
            ops.close(&stateid);
            let _ = session.call(&link, "CLOSE", &ops, None, None).await;
            session.destroy(&link).await;
        });
    }
}

impl Shared {
    fn err(&self, e: Nfs4Error, op: &'static str, offset: u64) -> Error {
        let kind = e.kind();
        let advice = match e.status() {
            Some(Status::STALE | Status::BADHANDLE | Status::FHEXPIRED) => {
                ": stale file handle: the file was removed or replaced on the server, or the export changed"
                    .to_string()
            }
            Some(Status::PERM | Status::ACCESS) => format!(
                ": permission denied for uid {} gid {}",
                self.config.rpc.uid, self.config.rpc.gid
            ),
            _ if matches!(
                e,
                Nfs4Error::SessionLost { .. } | Nfs4Error::RecoveryFailed { .. }
            ) =>
            {
                ": the server lost this client's session (restarted or expired it) and it could not be recovered".to_string()
            }
            _ if kind == ErrorKind::Disconnected => format!(
                " (no connection within the reconnect window of {:?})",
                self.config.reconnect_timeout
            ),
            _ => String::new(),
        };
        Error::new(kind, format!("NFSv4 request failed{advice}"))
            .with_source(e)
            .at(op, offset)
            .with_endpoint(self.describe.clone())
    }

    fn check_range(&self, op: &'static str, offset: u64, len: u64) -> Result<()> {
        super::check_range(&self.describe, self.size, op, offset, len)
    }

    fn block_sizes(&self, maximum: u32) -> BlockSizes {
        super::block_sizes(maximum, maximum)
    }

    /// A new connection for another handle, bound to the session.
    async fn connect(&self) -> Result<Link> {
        Link::connect(&self.session).await.map_err(|e| {
            open_error(
                e,
                "connect another handle to the NFSv4 session",
                &self.config,
            )
            .with_operation("connect")
            .with_endpoint(self.describe.clone())
        })
    }

    /// One COMPOUND on `link`, decoded by `decode` after its SEQUENCE.
    async fn call<T>(
        &self,
        link: &Link,
        what: &'static str,
        ops: &Ops,
        data: Option<&[u8]>,
        decode: impl FnOnce(&mut Reply<'_>) -> std::result::Result<T, ReplyError>,
    ) -> std::result::Result<T, Nfs4Error> {
        call(&self.session, link, what, ops, data, decode).await
    }
}

async fn call<T>(
    session: &Session,
    link: &Link,
    what: &'static str,
    ops: &Ops,
    data: Option<&[u8]>,
    decode: impl FnOnce(&mut Reply<'_>) -> std::result::Result<T, ReplyError>,
) -> std::result::Result<T, Nfs4Error> {
    let body = session.call(link, what, ops, data, None).await.0?;
    Reply::parse(&body)
        .and_then(|mut r| {
            r.sequence()?;
            decode(&mut r)
        })
        .map_err(|e| Nfs4Error::reply(what, e))
}

/// An NFSv4 failure while opening, with what was being done and advice.
fn open_error(e: Nfs4Error, doing: &str, config: &ClientConfig) -> Error {
    let advice = match e.status() {
        Some(Status::PERM | Status::ACCESS) => format!(
            " (permission denied for uid {} gid {}: set uid= and gid= in the URL or fix the file's permissions)",
            config.rpc.uid, config.rpc.gid
        ),
        Some(Status::STALE | Status::BADHANDLE | Status::FHEXPIRED) => {
            " (stale file handle: the file was removed or replaced on the server, or the export changed)".into()
        }
        Some(Status::ROFS) => " (the export is read-only)".into(),
        Some(Status::WRONGSEC) => {
            " (the export does not allow AUTH_SYS: ferry speaks only AUTH_SYS)".into()
        }
        Some(Status::MINOR_VERS_MISMATCH) => {
            " (the server speaks neither NFSv4.2 nor NFSv4.1; use version=3)".into()
        }
        _ => match &e {
            Nfs4Error::Rpc {
                source: super::rpc::RpcError::ProgramUnavailable { .. }
                | super::rpc::RpcError::VersionMismatch { .. },
                ..
            } => " (the server does not speak NFSv4; use version=3)".into(),
            _ => String::new(),
        },
    };
    Error::new(e.kind(), format!("cannot {doing}{advice}")).with_source(e)
}

/// The path's components: directories, then the file's name.
fn components(spec: &NfsSpec) -> Result<(Vec<&str>, &str)> {
    let mut parts: Vec<&str> = spec.path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.len() > MAX_DEPTH {
        return Err(Error::invalid_input(format!(
            "the path {} has {} components; at most {MAX_DEPTH} are supported",
            spec.path,
            parts.len()
        )));
    }
    if let Some(p) = parts.iter().find(|p| p.len() > MAX_NAME || *p == &"..") {
        return Err(Error::invalid_input(format!(
            "invalid path component '{p}' in {}",
            spec.path
        )));
    }
    let Some(name) = parts.pop() else {
        return Err(Error::invalid_input(format!(
            "the NFS URL has no file path: use nfs://{}/export/disk.img?version=4",
            spec.host
        )));
    };
    if parts.is_empty() {
        return Err(Error::invalid_input(format!(
            "{} names a top-level entry of the server's NFSv4 pseudo file system, which holds exports, not images: give the export's pseudo path and the image, for example nfs://{}/export/disk.img?version=4",
            spec.path, spec.host
        )));
    }
    Ok((parts, name))
}

/// What opening found.
struct Opened {
    session: Arc<Session>,
    link: Arc<Link>,
    dir: Fh,
    name: String,
    /// The file's handle and attributes when it exists.
    file: Option<(Fh, Attrs)>,
    rsize: u32,
    wsize: u32,
}

/// The attributes of a directory asked for at open.
const DIR_ATTRS: &[u32] = &[
    ops::FATTR4_TYPE,
    ops::FATTR4_LEASE_TIME,
    ops::FATTR4_MAXREAD,
    ops::FATTR4_MAXWRITE,
];
/// The attributes of the image.
const FILE_ATTRS: &[u32] = &[ops::FATTR4_TYPE, ops::FATTR4_SIZE];

fn transfer(attr: Option<u64>, channel: u32) -> u32 {
    let from_server = attr
        .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
        .filter(|v| *v > 0)
        .unwrap_or(64 * 1024);
    // The channel's size limit covers the COMPOUND around the data.
    let channel = channel.saturating_sub(4096).max(4096);
    from_server.min(super::MAX_TRANSFER).min(channel)
}

async fn resolve_addr(spec: &NfsSpec, config: &ClientConfig) -> Result<SocketAddr> {
    let ip = super::mount::lookup_host(&spec.host, config).await?;
    Ok(SocketAddr::new(
        ip,
        spec.nfsport.or(spec.port).unwrap_or(ops::NFS4_PORT),
    ))
}

/// Connects, creates the session and looks the path up.
async fn open_common(spec: &NfsSpec, config: &ClientConfig, describe: &str) -> Result<Opened> {
    let fail = |e: Error| e.with_operation("open").with_endpoint(describe.to_string());
    let (dirs, name) = components(spec).map_err(fail)?;
    let addr = resolve_addr(spec, config).await.map_err(fail)?;
    let (session, link) = Session::establish(addr, config, super::MAX_TRANSFER)
        .await
        .map_err(|e| {
            fail(open_error(
                e,
                &format!("start an NFSv4 session with {addr}"),
                config,
            ))
        })?;
    let max_ops = session.channel.max_ops as usize;
    if dirs.len() + 7 > max_ops.max(8) {
        return Err(fail(Error::unsupported(format!(
            "the path {} is too deep for one request: the server allows {max_ops} operations per request",
            spec.path
        ))));
    }
    let mut ops = Ops::new();
    ops.putrootfh();
    for d in &dirs {
        ops.lookup(d);
    }
    ops.getfh()
        .getattr(DIR_ATTRS)
        .lookup(name)
        .getfh()
        .getattr(FILE_ATTRS);
    let body = session
        .call(&link, "LOOKUP", &ops, None, None)
        .await
        .0
        .map_err(|e| fail(open_error(e, &format!("look up {}", spec.path), config)))?;
    let mut r = Reply::parse(&body).map_err(|e| fail(reply_error(e, "LOOKUP", spec, config)))?;
    let walk = (|| {
        r.sequence()?;
        r.simple(ops::OP_PUTROOTFH)?;
        for _ in &dirs {
            r.simple(ops::OP_LOOKUP)?;
        }
        let dir = r.getfh()?;
        let dir_attrs = r.getattr()?;
        Ok((dir, dir_attrs))
    })();
    let (dir, dir_attrs) = match walk {
        Ok(found) => found,
        Err(ReplyError::Status {
            op: ops::OP_LOOKUP,
            index,
            status,
        }) => {
            // SEQUENCE and PUTROOTFH come first: LOOKUP number index - 2 failed.
            let failed = index.saturating_sub(2).min(dirs.len().saturating_sub(1));
            let walked = format!("/{}", dirs[..=failed].join("/"));
            let e = if status == Status::NOENT {
                Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "directory {walked} does not exist on the server (NFSv4 URLs use the server's pseudo paths: the export's Pseudo path, then the image, for example nfs://{}/export/disk.img?version=4)",
                        spec.host
                    ),
                )
            } else if status == Status::NOTDIR {
                Error::invalid_input(format!("{walked} is not a directory"))
            } else {
                open_error(
                    Nfs4Error::Status {
                        op: "LOOKUP",
                        index,
                        status,
                    },
                    &format!("look up {walked}"),
                    config,
                )
            };
            return Err(fail(e));
        }
        Err(e) => return Err(fail(reply_error(e, "LOOKUP", spec, config))),
    };
    if dir_attrs.ftype != Some(ops::NF4DIR) {
        return Err(fail(Error::invalid_input(format!(
            "/{} is {}, not a directory",
            dirs.join("/"),
            dir_attrs.type_name()
        ))));
    }
    let file = match (|| {
        r.simple(ops::OP_LOOKUP)?;
        let fh = r.getfh()?;
        let attrs = r.getattr()?;
        Ok((fh, attrs))
    })() {
        Ok(found) => Some(found),
        Err(ReplyError::Status {
            op: ops::OP_LOOKUP,
            status: Status::NOENT,
            ..
        }) => None,
        Err(e) => return Err(fail(reply_error(e, "LOOKUP", spec, config))),
    };
    let lease = Duration::from_secs(u64::from(dir_attrs.lease_time.unwrap_or(60).max(2)));
    session.start_renewal(Arc::clone(&link), lease);
    let rsize = transfer(dir_attrs.maxread, session.channel.max_response);
    let wsize = transfer(dir_attrs.maxwrite, session.channel.max_request);
    Ok(Opened {
        session,
        link,
        dir,
        name: name.to_string(),
        file,
        rsize,
        wsize,
    })
}

fn reply_error(e: ReplyError, what: &'static str, spec: &NfsSpec, config: &ClientConfig) -> Error {
    open_error(
        Nfs4Error::reply(what, e),
        &format!("look up {}", spec.path),
        config,
    )
}

/// OPENs `name` in `dir`; returns the open and delegation state ids, the handle and the
/// attributes. `create`: the mode of a file to create (GUARDED).
async fn open_file(
    o: &Opened,
    access: u32,
    create: Option<u32>,
) -> std::result::Result<(StateId, Option<StateId>, Fh, Attrs), Nfs4Error> {
    let mut ops = Ops::new();
    ops.putfh(&o.dir)
        .open(
            o.session.clientid(),
            session::OPEN_OWNER,
            access,
            &o.name,
            create,
        )
        .getfh()
        .getattr(FILE_ATTRS);
    let opened = call(&o.session, &o.link, "OPEN", &ops, None, |r| {
        r.simple(ops::OP_PUTFH)?;
        let (stateid, deleg) = r.open()?;
        let fh = r.getfh()?;
        let attrs = r.getattr()?;
        Ok((stateid, deleg, fh, attrs))
    })
    .await?;
    o.session.set_open(session::OpenState {
        fh: opened.2.clone(),
        stateid: opened.0,
        access,
    });
    Ok(opened)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(path: &str) -> NfsSpec {
        NfsSpec {
            host: "h".into(),
            port: None,
            path: path.into(),
            version: Some(4),
            nfsport: None,
            mountport: None,
            uid: None,
            gid: None,
        }
    }

    #[test]
    fn paths_split_into_directories_and_a_name() {
        let s = spec("/export/dir/a.img");
        let (dirs, name) = components(&s).unwrap();
        assert_eq!((dirs, name), (vec!["export", "dir"], "a.img"));
        let err = components(&spec("/a.img")).unwrap_err();
        assert!(err.message().contains("pseudo path"), "{err}");
        assert!(components(&spec("/export/../x")).is_err());
        let deep = format!("/{}", vec!["d"; 40].join("/"));
        assert!(components(&spec(&deep)).is_err());
    }

    #[test]
    fn transfer_sizes_are_bounded() {
        assert_eq!(transfer(Some(1 << 20), 2 << 20), 1 << 20);
        assert_eq!(
            transfer(Some(1 << 40), u32::MAX),
            super::super::MAX_TRANSFER
        );
        assert_eq!(transfer(None, u32::MAX), 64 * 1024);
        assert_eq!(transfer(Some(1 << 20), 256 * 1024), 256 * 1024 - 4096);
        assert_eq!(transfer(Some(0), 0), 4096);
    }
}
