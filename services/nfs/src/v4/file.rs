//! The NFSv4 file operations ferry uses: the path looked up in the pseudo file system,
//! the file OPENed (and created), and the requests on an open file.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::link::Link;
use super::ops::{self, Attrs, Fh, Ops, Reply, ReplyError, StateId, Status};
use super::session::{self, OpenState, Session};
use crate::error::{Error, Result};
use crate::rpc::Sink;
use crate::v3::proto::Verifier;
use crate::ClientConfig;

/// Path components accepted (each one LOOKUP in one COMPOUND).
pub const MAX_DEPTH: usize = 32;
/// Longest name of one path component.
pub const MAX_NAME: usize = 255;
/// Operations of the lookup COMPOUND besides one LOOKUP per directory: SEQUENCE,
/// PUTROOTFH, GETFH, GETATTR, LOOKUP, GETFH, GETATTR.
const LOOKUP_OPS: usize = 7;
/// The fewest operations per COMPOUND any server allows, for a path of one directory.
const MIN_OPS: usize = LOOKUP_OPS + 1;
/// A READ or WRITE size when the server gives none.
const DEFAULT_TRANSFER: u32 = 64 * 1024;
/// Room the COMPOUND around READ or WRITE data takes of the channel's size limit.
const COMPOUND_OVERHEAD: u32 = 4096;
/// The lease when the server does not say, and the shortest one honoured.
const DEFAULT_LEASE_SECS: u32 = 60;
const MIN_LEASE_SECS: u32 = 2;
/// The attributes of a directory asked for at open.
const DIR_ATTRS: &[u32] = &[
    ops::FATTR4_TYPE,
    ops::FATTR4_LEASE_TIME,
    ops::FATTR4_MAXREAD,
    ops::FATTR4_MAXWRITE,
];
/// The attributes of the file.
const FILE_ATTRS: &[u32] = &[ops::FATTR4_TYPE, ops::FATTR4_SIZE];

/// Where an NFSv4 file is: the server, its port (2049 when None) and the path in the
/// server's pseudo file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub host: String,
    pub port: Option<u16>,
    pub path: String,
}

/// What looking the path up found.
#[derive(Debug)]
pub struct Opened<B = Vec<u8>> {
    pub session: Arc<Session>,
    pub link: Arc<Link<B>>,
    pub dir: Fh,
    pub name: String,
    /// The file's handle and attributes when it exists.
    pub file: Option<(Fh, Attrs)>,
    /// READ and WRITE sizes: the server's, bounded by the session's channel.
    pub rsize: u32,
    pub wsize: u32,
}

/// The path's components: directories, then the file's name.
fn components(loc: &Location) -> Result<(Vec<&str>, &str)> {
    let mut parts: Vec<&str> = loc.path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.len() > MAX_DEPTH {
        return Err(Error::InvalidInput(format!(
            "the path {} has {} components; at most {MAX_DEPTH} are supported",
            loc.path,
            parts.len()
        )));
    }
    if let Some(p) = parts.iter().find(|p| p.len() > MAX_NAME || *p == &"..") {
        return Err(Error::InvalidInput(format!(
            "invalid path component '{p}' in {}",
            loc.path
        )));
    }
    let Some(name) = parts.pop() else {
        return Err(Error::InvalidInput(format!(
            "the NFS URL has no file path: use nfs://{}/export/disk.img?version=4",
            loc.host
        )));
    };
    if parts.is_empty() {
        return Err(Error::InvalidInput(format!(
            "{} names a top-level entry of the server's NFSv4 pseudo file system, which holds exports, not images: give the export's pseudo path and the image, for example nfs://{}/export/disk.img?version=4",
            loc.path, loc.host
        )));
    }
    Ok((parts, name))
}

/// A READ or WRITE size: the server's `attr`, at most `max_transfer`, within the
/// channel's limit `channel` less the COMPOUND around the data.
fn transfer(attr: Option<u64>, channel: u32, max_transfer: u32) -> u32 {
    let from_server = attr
        .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
        .filter(|v| *v > 0)
        .unwrap_or(DEFAULT_TRANSFER);
    let channel = channel
        .saturating_sub(COMPOUND_OVERHEAD)
        .max(COMPOUND_OVERHEAD);
    from_server.min(max_transfer).min(channel)
}

fn open_error(e: Error, doing: String) -> Error {
    Error::Open {
        doing,
        source: Box::new(e),
    }
}

/// Connects, creates the session (READ and WRITE of at most `max_transfer` bytes), looks
/// the path up and starts renewing the lease.
pub async fn open_path<B: Sink>(
    loc: &Location,
    config: &ClientConfig,
    max_transfer: u32,
) -> Result<Opened<B>> {
    let (dirs, name) = components(loc)?;
    let ip = crate::v3::lookup_host(&loc.host, config).await?;
    let addr = SocketAddr::new(ip, loc.port.unwrap_or(ops::NFS4_PORT));
    let (session, link) = Session::establish(addr, config, max_transfer)
        .await
        .map_err(|e| open_error(e, format!("start an NFSv4 session with {addr}")))?;
    let max_ops = session.channel.max_ops as usize;
    if dirs.len() + LOOKUP_OPS > max_ops.max(MIN_OPS) {
        return Err(Error::Unsupported(format!(
            "the path {} is too deep for one request: the server allows {max_ops} operations per request",
            loc.path
        )));
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
    let looked_up = || format!("look up {}", loc.path);
    let body = session
        .call(&link, "LOOKUP", &ops, None, None)
        .await
        .0
        .map_err(|e| open_error(e, looked_up()))?;
    let reply_error = |e| open_error(Error::reply("LOOKUP", e), looked_up());
    let mut r = Reply::parse(&body).map_err(reply_error)?;
    let (dir, dir_attrs) = walk(&mut r, &dirs, &loc.host).map_err(|e| match e {
        Walk::Failed(e) => e,
        Walk::Reply(e) => reply_error(e),
    })?;
    let file = match (|| {
        r.simple(ops::OP_LOOKUP)?;
        Ok((r.getfh()?, r.getattr()?))
    })() {
        Ok(found) => Some(found),
        Err(ReplyError::Status {
            op: ops::OP_LOOKUP,
            status: Status::NOENT,
            ..
        }) => None,
        Err(e) => return Err(reply_error(e)),
    };
    let lease_secs = dir_attrs
        .lease_time
        .unwrap_or(DEFAULT_LEASE_SECS)
        .max(MIN_LEASE_SECS);
    session.start_renewal(
        Arc::clone(&link),
        Duration::from_secs(u64::from(lease_secs)),
    );
    let rsize = transfer(
        dir_attrs.maxread,
        session.channel.max_response,
        max_transfer,
    );
    let wsize = transfer(
        dir_attrs.maxwrite,
        session.channel.max_request,
        max_transfer,
    );
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

/// Why the walk down the directories failed.
enum Walk {
    /// A directory is missing or not one: the error says which.
    Failed(Error),
    Reply(ReplyError),
}

impl From<ReplyError> for Walk {
    fn from(e: ReplyError) -> Self {
        Self::Reply(e)
    }
}

/// Reads the lookup reply up to the directory holding the file: its handle and
/// attributes, checked to be a directory.
fn walk(r: &mut Reply<'_>, dirs: &[&str], host: &str) -> std::result::Result<(Fh, Attrs), Walk> {
    let walked = (|| {
        r.sequence()?;
        r.simple(ops::OP_PUTROOTFH)?;
        for _ in dirs {
            r.simple(ops::OP_LOOKUP)?;
        }
        Ok((r.getfh()?, r.getattr()?))
    })();
    let (dir, attrs) = match walked {
        Ok(found) => found,
        Err(ReplyError::Status {
            op: ops::OP_LOOKUP,
            index,
            status,
        }) => return Err(Walk::Failed(lookup_failed(dirs, host, index, status))),
        Err(e) => return Err(e.into()),
    };
    if attrs.ftype != Some(ops::NF4DIR) {
        return Err(Walk::Failed(Error::InvalidInput(format!(
            "/{} is {}, not a directory",
            dirs.join("/"),
            attrs.type_name()
        ))));
    }
    Ok((dir, attrs))
}

/// The error of a LOOKUP of a directory, the `index`-th operation of the COMPOUND.
fn lookup_failed(dirs: &[&str], host: &str, index: usize, status: Status) -> Error {
    // SEQUENCE and PUTROOTFH come first: LOOKUP number index - 2 failed.
    let failed = index.saturating_sub(2).min(dirs.len().saturating_sub(1));
    let walked = format!("/{}", dirs[..=failed].join("/"));
    if status == Status::NOENT {
        Error::NotFound(format!(
            "directory {walked} does not exist on the server (NFSv4 URLs use the server's pseudo paths: the export's Pseudo path, then the image, for example nfs://{host}/export/disk.img?version=4)"
        ))
    } else if status == Status::NOTDIR {
        Error::InvalidInput(format!("{walked} is not a directory"))
    } else {
        open_error(
            Error::Nfs4 {
                op: "LOOKUP",
                index,
                status,
            },
            format!("look up {walked}"),
        )
    }
}

/// One COMPOUND on `link`, decoded by `decode` after its SEQUENCE.
pub async fn call<T, B: Sink>(
    session: &Session,
    link: &Link<B>,
    what: &'static str,
    ops: &Ops,
    data: Option<&[u8]>,
    decode: impl FnOnce(&mut Reply<'_>) -> std::result::Result<T, ReplyError>,
) -> Result<T> {
    let body = session.call(link, what, ops, data, None).await.0?;
    Reply::parse(&body)
        .and_then(|mut r| {
            r.sequence()?;
            decode(&mut r)
        })
        .map_err(|e| Error::reply(what, e))
}

/// OPENs `o.name` in `o.dir` with `access` (OPEN4_SHARE_ACCESS_READ or _BOTH), creating
/// it with mode `create` (GUARDED: EXIST when it is there) when given. The session
/// records the open, for a recovery to open it again.
pub async fn open_file<B: Sink>(
    o: &Opened<B>,
    access: u32,
    create: Option<u32>,
) -> Result<(OpenFile, Option<StateId>, Attrs)> {
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
    let (stateid, deleg, fh, attrs) = call(&o.session, &o.link, "OPEN", &ops, None, |r| {
        r.simple(ops::OP_PUTFH)?;
        let (stateid, deleg) = r.open()?;
        Ok((stateid, deleg, r.getfh()?, r.getattr()?))
    })
    .await?;
    o.session.set_open(OpenState {
        fh: fh.clone(),
        stateid,
        access,
    });
    Ok((OpenFile { fh, stateid }, deleg, attrs))
}

/// An open file as its requests name it: the handle and the open state id (the
/// session sends the current one when a recovery replaced it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenFile {
    pub fh: Fh,
    pub stateid: StateId,
}

impl OpenFile {
    /// A COMPOUND starting with PUTFH of the file.
    fn ops(&self) -> Ops {
        let mut ops = Ops::new();
        ops.putfh(&self.fh);
        ops
    }

    /// READs `buf.len()` bytes at `offset` into `buf`: (end of file, bytes read). The
    /// buffer always comes back.
    pub async fn read<B: Sink>(
        &self,
        session: &Session,
        link: &Link<B>,
        offset: u64,
        buf: B,
    ) -> (Result<(bool, u32)>, Option<B>) {
        let count = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let mut ops = self.ops();
        ops.read(&self.stateid, offset, count);
        let (result, buf) = session.call(link, "READ", &ops, None, Some(buf)).await;
        let result = result.and_then(|body| read_reply(&body).map_err(|e| Error::reply("READ", e)));
        (result, buf)
    }

    /// An UNSTABLE WRITE of `data` at `offset`: bytes written, how stable, the verifier.
    pub async fn write<B: Sink>(
        &self,
        session: &Session,
        link: &Link<B>,
        offset: u64,
        data: &[u8],
    ) -> Result<(u32, u32, Verifier)> {
        let len = u32::try_from(data.len()).map_err(|_| {
            Error::InvalidInput(format!("write of {} bytes is too large", data.len()))
        })?;
        let mut ops = self.ops();
        ops.write_head(&self.stateid, offset, ops::UNSTABLE4, len);
        call(session, link, "WRITE", &ops, Some(data), |r| {
            r.simple(ops::OP_PUTFH)?;
            r.write()
        })
        .await
    }

    /// COMMITs the whole file: the server's write verifier.
    pub async fn commit<B: Sink>(&self, session: &Session, link: &Link<B>) -> Result<Verifier> {
        let mut ops = self.ops();
        ops.commit(0, 0);
        call(session, link, "COMMIT", &ops, None, |r| {
            r.simple(ops::OP_PUTFH)?;
            r.commit()
        })
        .await
    }

    /// SEEKs from `offset` for each of `what` (NFS4_CONTENT_DATA or _HOLE), in one
    /// request: (end of file reached, offset found) for each.
    pub async fn seek<B: Sink, const N: usize>(
        &self,
        session: &Session,
        link: &Link<B>,
        offset: u64,
        what: [u32; N],
    ) -> Result<[(bool, u64); N]> {
        let mut ops = self.ops();
        for w in what {
            ops.seek(&self.stateid, offset, w);
        }
        call(session, link, "SEEK", &ops, None, |r| {
            r.simple(ops::OP_PUTFH)?;
            let mut found = [(false, 0); N];
            for f in &mut found {
                *f = r.seek()?;
            }
            Ok(found)
        })
        .await
    }

    /// DEALLOCATEs `len` bytes at `offset`: they become a hole that reads as zeroes.
    pub async fn deallocate<B: Sink>(
        &self,
        session: &Session,
        link: &Link<B>,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        let mut ops = self.ops();
        ops.deallocate(&self.stateid, offset, len);
        call(session, link, "DEALLOCATE", &ops, None, |r| {
            r.simple(ops::OP_PUTFH)?;
            r.simple(ops::OP_DEALLOCATE)
        })
        .await
    }

    /// Sets the file's size (SETATTR).
    pub async fn set_size<B: Sink>(
        &self,
        session: &Session,
        link: &Link<B>,
        size: u64,
    ) -> Result<()> {
        let mut ops = self.ops();
        ops.setattr_size(&self.stateid, size);
        call(session, link, "SETATTR", &ops, None, |r| {
            r.simple(ops::OP_PUTFH)?;
            r.setattr()
        })
        .await
    }

    /// Returns `deleg` (a delegation the server granted anyway), CLOSEs the file and
    /// ends the session (best effort: the server expires them with the lease otherwise).
    pub async fn close<B: Sink>(&self, session: &Session, link: &Link<B>, deleg: Option<StateId>) {
        let mut ops = self.ops();
        if let Some(d) = &deleg {
            ops.delegreturn(d);
        }
        ops.close(&self.stateid);
        let _ = session.call(link, "CLOSE", &ops, None, None).await;
        session.destroy(link).await;
    }
}

/// The reply to SEQUENCE, PUTFH, READ delivered with a sink: (eof, bytes).
fn read_reply(body: &[u8]) -> std::result::Result<(bool, u32), ReplyError> {
    let mut r = Reply::parse(body)?;
    r.sequence()?;
    r.simple(ops::OP_PUTFH)?;
    r.read_into_sink()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(path: &str) -> Location {
        Location {
            host: "h".into(),
            port: None,
            path: path.into(),
        }
    }

    #[test]
    fn paths_split_into_directories_and_a_name() {
        let s = loc("/export/dir/a.img");
        let (dirs, name) = components(&s).unwrap();
        assert_eq!((dirs, name), (vec!["export", "dir"], "a.img"));
        let err = components(&loc("/a.img")).unwrap_err();
        assert!(err.to_string().contains("pseudo path"), "{err}");
        assert!(components(&loc("/export/../x")).is_err());
        let deep = format!("/{}", vec!["d"; 40].join("/"));
        assert!(components(&loc(&deep)).is_err());
    }

    #[test]
    fn transfer_sizes_are_bounded() {
        const MAX: u32 = 16 << 20;
        assert_eq!(transfer(Some(1 << 20), 2 << 20, MAX), 1 << 20);
        assert_eq!(transfer(Some(1 << 40), u32::MAX, MAX), MAX);
        assert_eq!(transfer(None, u32::MAX, MAX), 64 * 1024);
        assert_eq!(transfer(Some(1 << 20), 256 * 1024, MAX), 256 * 1024 - 4096);
        assert_eq!(transfer(Some(0), 0, MAX), 4096);
    }
}
