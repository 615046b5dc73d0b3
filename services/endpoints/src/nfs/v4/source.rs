//! [`Nfs4Source`]: reads an image over NFSv4.2 (or 4.1), reporting holes with SEEK.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::spec::NfsSpec;
use ferry_core::{Caps, Error, ErrorKind, Extent, IoBuf, Result, Source};
use ferry_nfs::v4::ops::{self, Status};
use ferry_nfs::v4::{Link, OpenFile, Opened, Session};

use super::{Open, Opening, Shared};
use crate::nfs::error::doing_error;
use crate::nfs::{NfsBuf, NfsOptions};

/// Extents reported by one [`Source::extents`] call at most (each costs one round trip).
const MAX_EXTENTS: usize = 64;

/// A file on an NFSv4 server, read with READ into the caller's buffers. Each
/// [`Source::connect`] opens another TCP connection bound to the same session.
#[derive(Debug)]
pub struct Nfs4Source {
    file: Arc<Shared>,
    link: Arc<Link<NfsBuf>>,
}

impl Nfs4Source {
    /// Opens the file `spec` names (its NFSv4 pseudo path); it must be a regular file.
    pub async fn open(spec: &NfsSpec, options: &NfsOptions) -> Result<Self> {
        let opening = Opening::new(spec, options);
        let o = opening.lookup(spec).await?;
        match &o.file {
            None => {
                return Err(opening.fail(Error::new(
                    ErrorKind::NotFound,
                    format!("no such file: {} does not exist on the server", spec.path),
                )))
            }
            Some((_, attrs)) if attrs.ftype != Some(ops::NF4REG) => {
                return Err(opening.fail(Error::invalid_input(format!(
                    "{} is {}, not a regular file",
                    spec.path,
                    attrs.type_name()
                ))))
            }
            Some(_) => {}
        }
        let (file, deleg, attrs) = ferry_nfs::v4::open_file(&o, ops::OPEN4_SHARE_ACCESS_READ, None)
            .await
            .map_err(|e| {
                opening.fail(doing_error(
                    e,
                    &format!("open {}", spec.path),
                    &opening.config,
                ))
            })?;
        let Some(size) = attrs.size else {
            return Err(opening.fail(Error::protocol("the server did not return the file's size")));
        };
        let seek = seek_works(&o, &file).await;
        let opened = Open {
            file,
            deleg,
            created: false,
            seek,
            dealloc: false,
        };
        let link = Arc::clone(&o.link);
        let file = Arc::new(Shared::new(o, opening, opened, size));
        Ok(Self { file, link })
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
    async fn seek(&self, offset: u64) -> ferry_nfs::Result<(Option<u64>, u64)> {
        let f = &*self.file;
        let what = [ops::NFS4_CONTENT_DATA, ops::NFS4_CONTENT_HOLE];
        match f.file.seek(&f.session, &self.link, offset, what).await {
            // sr_eof on the data search: no data found before the end of the file (RFC
            // 7862 15.11), unless the hole search says `offset` itself holds data.
            Ok([(true, _), (_, hole)]) if hole <= offset => Ok((None, f.size)),
            Ok([(true, _), (_, hole)]) => Ok((Some(offset), hole)),
            // sr_eof on the hole search: the hole is the end of the file.
            Ok([(false, data), (true, _)]) => Ok((Some(data), f.size)),
            Ok([(false, data), (false, hole)]) => Ok((Some(data), hole)),
            Err(e) if e.nfs4_status() == Some(Status::NXIO) => Ok((None, f.size)),
            Err(e) => Err(e),
        }
    }
}

/// Whether SEEK works: it is NFSv4.2, and a server may still not implement it.
async fn seek_works(o: &Opened<NfsBuf>, file: &OpenFile) -> bool {
    if o.session.minor < 2 {
        return false;
    }
    let probe = file
        .seek(&o.session, &o.link, 0, [ops::NFS4_CONTENT_DATA])
        .await;
    match probe {
        Ok(_) => true,
        Err(e) => e.nfs4_status() == Some(Status::NXIO),
    }
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
        let f = &self.file;
        crate::nfs::caps(f.rsize, f.rsize, f.seek, false)
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

    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let f = &*self.file;
        let session: &Session = &f.session;
        crate::nfs::read_pieces(
            &f.describe,
            f.size,
            f.rsize,
            offset,
            buf,
            |at, piece| async move {
                let (result, back) = f.file.read(session, &self.link, at, piece).await;
                if let Ok((_, count)) = &result {
                    f.read_bytes.fetch_add(u64::from(*count), Ordering::Relaxed);
                }
                (result.map_err(|e| f.err(e, "read", at)), back)
            },
        )
        .await
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        let link = self.file.connect().await?;
        Ok(Arc::new(Self {
            file: Arc::clone(&self.file),
            link: Arc::new(link),
        }))
    }
}
