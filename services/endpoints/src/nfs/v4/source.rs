//! [`Nfs4Source`]: reads an image over NFSv4.2 (or 4.1), reporting holes with SEEK.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::spec::NfsSpec;
use ferry_core::{Caps, Error, ErrorKind, Extent, IoBuf, Result, Source};

use super::ops::{self, Ops, Reply, ReplyError, Status};
use super::session::{Link, Nfs4Error};
use super::{open_common, open_error, open_file, Shared};
use crate::nfs::{client_config, NfsOptions};

/// Extents reported by one [`Source::extents`] call at most (each costs one round trip).
const MAX_EXTENTS: usize = 64;

/// A file on an NFSv4 server, read with READ into the caller's buffers. Each
/// [`Source::connect`] opens another TCP connection bound to the same session.
#[derive(Debug)]
pub struct Nfs4Source {
    file: Arc<Shared>,
    link: Arc<Link>,
}

impl Nfs4Source {
    /// Opens the file `spec` names (its NFSv4 pseudo path); it must be a regular file.
    pub async fn open(spec: &NfsSpec, options: &NfsOptions) -> Result<Self> {
        let describe = ferry_core::EndpointSpec::Nfs(spec.clone()).to_string();
        let config = client_config(spec, options);
        let fail = |e: Error| e.with_operation("open").with_endpoint(describe.clone());
        let o = open_common(spec, &config, &describe).await?;
        match &o.file {
            None => {
                return Err(fail(Error::new(
                    ErrorKind::NotFound,
                    format!("no such file: {} does not exist on the server", spec.path),
                )))
            }
            Some((_, attrs)) if attrs.ftype != Some(ops::NF4REG) => {
                return Err(fail(Error::invalid_input(format!(
                    "{} is {}, not a regular file",
                    spec.path,
                    attrs.type_name()
                ))))
            }
            Some(_) => {}
        }
        let (stateid, deleg, fh, attrs) =
            open_file(&o, ops::OPEN4_SHARE_ACCESS_READ, None)
                .await
                .map_err(|e| fail(open_error(e, &format!("open {}", spec.path), &config)))?;
        let Some(size) = attrs.size else {
            return Err(fail(Error::protocol(
                "the server did not return the file's size",
            )));
        };
        // SEEK is NFSv4.2; a server may still not implement it.
        let seek = o.session.minor >= 2 && {
            let mut ops = Ops::new();
            ops.putfh(&fh).seek(&stateid, 0, ops::NFS4_CONTENT_DATA);
            let probe = super::call(&o.session, &o.link, "SEEK", &ops, None, |r| {
                r.simple(ops::OP_PUTFH)?;
                r.seek()
            })
            .await;
            match probe {
                Ok(_) => true,
                Err(e) if e.status() == Some(Status::NXIO) => true,
                Err(_) => false,
            }
        };
        let file = Arc::new(Shared {
            describe,
            config,
            session: o.session,
            main: Arc::clone(&o.link),
            fh,
            stateid,
            deleg,
            size,
            rsize: o.rsize,
            wsize: o.wsize,
            seek,
            dealloc: AtomicBool::new(false),
            commits: Default::default(),
            created: false,
            zeroes: Default::default(),
            read_bytes: AtomicU64::new(0),
        });
        Ok(Self { file, link: o.link })
    }

    /// The NFSv4 minor version in use (2, or 1 when the server has no NFSv4.2).
    pub fn minor_version(&self) -> u32 {
        self.file.session.minor
    }

    /// Times the server lost this open (a restart) and it was recovered: (reclaimed in
    /// the server's grace period, opened anew by file handle).
    pub fn recoveries(&self) -> (u32, u32) {
        self.file.session.recoveries()
    }

    /// Whether holes are found with SEEK.
    pub fn uses_seek(&self) -> bool {
        self.file.seek
    }

    /// Bytes READ from the server by all handles of this open.
    pub fn bytes_read(&self) -> u64 {
        self.file.read_bytes.load(Ordering::Relaxed)
    }

    /// SEEK for data and for a hole from `offset` in one request: the next data's offset
    /// (None: no data up to the end of the file) and, when `offset` holds data, where it
    /// ends.
    async fn seek(&self, offset: u64) -> std::result::Result<(Option<u64>, u64), Nfs4Error> {
        let f = &*self.file;
        let mut ops = Ops::new();
        ops.putfh(&f.fh)
            .seek(&f.stateid, offset, ops::NFS4_CONTENT_DATA)
            .seek(&f.stateid, offset, ops::NFS4_CONTENT_HOLE);
        let result = f
            .call(&self.link, "SEEK", &ops, None, |r| {
                r.simple(ops::OP_PUTFH)?;
                Ok((r.seek()?, r.seek()?))
            })
            .await;
        match result {
            // sr_eof on the data search: no data found before the end of the file (RFC
            // 7862 15.11), unless the hole search says `offset` itself holds data.
            Ok(((true, _), (_, hole))) if hole <= offset => Ok((None, f.size)),
            Ok(((true, _), (_, hole))) => Ok((Some(offset), hole)),
            // sr_eof on the hole search: the hole is the end of the file.
            Ok(((false, data), (true, _))) => Ok((Some(data), f.size)),
            Ok(((false, data), (false, hole))) => Ok((Some(data), hole)),
            Err(e) if e.status() == Some(Status::NXIO) => Ok((None, f.size)),
            Err(e) => Err(e),
        }
    }
}

fn read_reply(body: &[u8]) -> std::result::Result<(bool, u32), ReplyError> {
    let mut r = Reply::parse(body)?;
    r.sequence()?;
    r.simple(ops::OP_PUTFH)?;
    r.read_into_sink()
}

#[async_trait]
impl Source for Nfs4Source {
    fn describe(&self) -> String {
        self.file.describe.clone()
    }

    fn size(&self) -> u64 {
        self.file.size
    }

    fn caps(&self) -> Caps {
        Caps {
            extents: self.file.seek,
            efficient_zero: false,
            trim: false,
            random_write: true,
            multi_conn: true,
            block: self.file.block_sizes(self.file.rsize),
            request_size: Some(super::super::REQUEST_SIZE),
        }
    }

    /// With SEEK: data and hole extents as the server's file system has them (holes are
    /// [`ferry_core::ExtentKind::Zero`]). Without: one data extent.
    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let f = &*self.file;
        if len == 0 {
            return Ok(Vec::new());
        }
        f.check_range("extents", offset, len)?;
        if !f.seek {
            return Ok(vec![Extent::data(offset, len)]);
        }
        let end = offset + len;
        let mut out = Vec::new();
        let mut pos = offset;
        while pos < end && out.len() < MAX_EXTENTS {
            let (data, hole) = self.seek(pos).await.map_err(|e| f.err(e, "extents", pos))?;
            let bad = |what: String| {
                Error::protocol(format!("SEEK from {pos}: {what}"))
                    .at("extents", pos)
                    .with_endpoint(f.describe.clone())
            };
            let next = match data {
                None => end,
                Some(d) if d < pos => return Err(bad(format!("data reported at {d}"))),
                Some(d) => d.min(end),
            };
            if next > pos {
                out.push(Extent::zero(pos, next - pos));
                pos = next;
                continue;
            }
            // pos holds data; it runs to the next hole (the file's end at the latest).
            if hole <= pos {
                return Err(bad(format!("data at {pos} but a hole at {hole}")));
            }
            let stop = hole.min(end);
            out.push(Extent::data(pos, stop - pos));
            pos = stop;
        }
        Ok(ferry_core::merge_extents(out))
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let f = &*self.file;
        let len = buf.len();
        f.check_range("read", offset, len as u64)?;
        let view = buf.view();
        let mut done = 0usize;
        while done < len {
            let n = (len - done).min(f.rsize as usize);
            buf.set_view(view.start + done, n);
            let at = offset + done as u64;
            let mut ops = Ops::new();
            ops.putfh(&f.fh).read(&f.stateid, at, n as u32);
            let (result, back) = f
                .session
                .call(&self.link, "READ", &ops, None, Some(buf))
                .await;
            buf = back.unwrap_or_else(|| IoBuf::new(0));
            let (eof, count) = result
                .and_then(|body| read_reply(&body).map_err(|e| Nfs4Error::reply("READ", e)))
                .map_err(|e| f.err(e, "read", at))?;
            let count = count as usize;
            super::super::check_read_count(&f.describe, f.size, at, n, count, eof)?;
            f.read_bytes.fetch_add(count as u64, Ordering::Relaxed);
            done += count;
        }
        buf.set_view(view.start, view.len());
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        let link = self.file.connect().await?;
        Ok(Arc::new(Self {
            file: Arc::clone(&self.file),
            link: Arc::new(link),
        }))
    }
}
