//! [`Nfs4Target`]: writes an image over NFSv4.2 (or 4.1).
//!
//! A missing file is created by OPEN (GUARDED, mode 0644) and sized with SETATTR; it then
//! reads as zeroes, so the engine skips zero ranges. An existing file must be at least as
//! large as the image. For a stream of unknown size ([`UNKNOWN_SIZE`]) the file grows with
//! the writes: a new file starts empty, an existing one of any size is taken, and
//! [`Target::set_end`] sets the length when the stream ends (a file this copy created is
//! cut to exactly it, an existing one is never shrunk), as for NFSv3. Writes are UNSTABLE; flush COMMITs and checks the write verifier,
//! and a COMMIT goes out in the background every 256 MiB written (`background_flush.rs`),
//! as for NFSv3. Zero ranges are DEALLOCATEd (holes that read as zeroes) when the server
//! supports it, else written as zero buffers.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::spec::NfsSpec;
use ferry_core::{Caps, Error, IoBuf, Result, Target, ZeroMode, UNKNOWN_SIZE};
use ferry_nfs::v4::ops::{self, Attrs, Status};
use ferry_nfs::v4::{Link, OpenFile, Opened, StateId};

use super::{Open, Opening, Shared};
use crate::background_flush::{BackgroundFlush, DEFAULT_BACKGROUND_FLUSH};
use crate::nfs::error::doing_error;
use crate::nfs::{NfsBuf, NfsOptions, CREATE_MODE};

/// Bytes the DEALLOCATE probe asks for, past the end of the file.
const DEALLOCATE_PROBE: u64 = 4096;

/// A file on an NFSv4 server, written over NFSv4. Each [`Target::connect`] opens another
/// TCP connection bound to the same session; all handles share one record of uncommitted
/// writes, so a flush on any of them commits (and checks) the writes of all.
#[derive(Debug)]
pub struct Nfs4Target {
    file: Arc<Shared>,
    link: Arc<Link<NfsBuf>>,
    /// COMMITs as the copy goes, shared by every handle.
    background: Arc<BackgroundFlush>,
    /// Opened for a stream of unknown size: writes may reach past the file's size.
    grows: bool,
}

impl Nfs4Target {
    /// Opens the file `spec` names (its NFSv4 pseudo path) for writing `size` bytes,
    /// creating it when missing.
    pub async fn open(spec: &NfsSpec, size: u64, options: &NfsOptions) -> Result<Self> {
        let opening = Opening::new(spec, options);
        let o = opening.lookup(spec).await?;
        let (file, deleg, attrs, created) = open_or_create(&o, &opening, spec, size)
            .await
            .map_err(|e| opening.fail(e))?;
        if !created {
            check_existing(spec, &attrs, size).map_err(|e| opening.fail(e))?;
        }
        let size_wanted = size;
        let size = attrs.size.unwrap_or(0);
        let dealloc = deallocate_works(&o, &file, size).await;
        let opened = Open {
            file,
            deleg,
            created,
            seek: false,
            dealloc,
        };
        let link = Arc::clone(&o.link);
        Ok(Self {
            file: Arc::new(Shared::new(o, opening, opened, size)),
            link,
            background: Arc::new(BackgroundFlush::new(DEFAULT_BACKGROUND_FLUSH)),
            grows: size_wanted == UNKNOWN_SIZE,
        })
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

    /// Whether zero ranges are DEALLOCATEd rather than written.
    pub fn deallocates(&self) -> bool {
        self.file.dealloc.load(Ordering::Relaxed)
    }

    /// UNSTABLE writes not yet covered by a successful flush (for tests).
    pub fn uncommitted_writes(&self) -> usize {
        self.file.commits.pending()
    }

    /// COMMITs the file when writes are uncommitted, and checks they survived.
    async fn commit(f: &Shared, link: &Link<NfsBuf>) -> Result<()> {
        crate::nfs::commit(&f.commits, &f.describe, || async {
            f.file
                .commit(&f.session, link)
                .await
                .map_err(|e| f.err(e, "flush", 0))
        })
        .await
    }

    /// Counts `len` bytes written toward the next background COMMIT.
    fn wrote(&self, len: u64) {
        self.background.wrote(len, || {
            let (file, link) = (Arc::clone(&self.file), Arc::clone(&self.link));
            async move { Self::commit(&file, &link).await }
        });
    }

    /// Writes `data` at `offset` in WRITEs of at most wsize bytes.
    async fn write_all(&self, offset: u64, data: &[u8], op: &'static str) -> Result<()> {
        let f = &*self.file;
        crate::nfs::write_pieces(
            &f.describe,
            &f.commits,
            f.wsize,
            op,
            offset,
            data,
            |at, piece| async move {
                let (count, committed, verf) = f
                    .file
                    .write(&f.session, &self.link, at, piece)
                    .await
                    .map_err(|e| f.err(e, op, at))?;
                Ok((count, committed == ops::FILE_SYNC4, verf))
            },
        )
        .await
    }

    async fn write_zero_buffers(&self, offset: u64, len: u64) -> Result<()> {
        let f = &*self.file;
        let zeroes = f.zeroes.get_or_init(|| vec![0u8; f.wsize as usize]);
        crate::nfs::write_zero_chunks(offset, len, zeroes, |at, z| {
            self.write_all(at, z, "write_zeroes")
        })
        .await
    }
}

/// OPENs the existing file, or creates it (then sized to `size`): the file, a
/// delegation, its attributes, and whether this open created it.
async fn open_or_create(
    o: &Opened<NfsBuf>,
    opening: &Opening,
    spec: &NfsSpec,
    size: u64,
) -> Result<(OpenFile, Option<StateId>, Attrs, bool)> {
    let access = ops::OPEN4_SHARE_ACCESS_BOTH;
    let config = &opening.config;
    let opening_error = |e| doing_error(e, &format!("open {} for writing", spec.path), config);
    if o.file.is_some() {
        let (file, deleg, attrs) = ferry_nfs::v4::open_file(o, access, None)
            .await
            .map_err(opening_error)?;
        return Ok((file, deleg, attrs, false));
    }
    // A stream of unknown size: the new file stays empty until set_end.
    let size = if size == UNKNOWN_SIZE { 0 } else { size };
    match ferry_nfs::v4::open_file(o, access, Some(CREATE_MODE)).await {
        Ok((file, deleg, _)) => {
            file.set_size(&o.session, &o.link, size)
                .await
                .map_err(|e| {
                    doing_error(
                        e,
                        &format!("set the new file's size to {size} bytes"),
                        config,
                    )
                })?;
            let attrs = Attrs {
                ftype: Some(ops::NF4REG),
                size: Some(size),
                ..Default::default()
            };
            Ok((file, deleg, attrs, true))
        }
        // Someone else created it meanwhile: it is an existing file.
        Err(e) if e.nfs4_status() == Some(Status::EXIST) => {
            let (file, deleg, attrs) = ferry_nfs::v4::open_file(o, access, None)
                .await
                .map_err(opening_error)?;
            Ok((file, deleg, attrs, false))
        }
        Err(e) => Err(opening_error(e)),
    }
}

/// An existing target must be a regular file of at least `size` bytes.
fn check_existing(spec: &NfsSpec, attrs: &Attrs, size: u64) -> Result<()> {
    if attrs.ftype != Some(ops::NF4REG) {
        return Err(Error::invalid_input(format!(
            "{} is {}, not a regular file",
            spec.path,
            attrs.type_name()
        )));
    }
    let existing = attrs.size.unwrap_or(0);
    if size != UNKNOWN_SIZE && existing < size {
        return Err(Error::invalid_input(format!(
            "the existing target {} is {existing} bytes, smaller than the image ({size} bytes): remove it or grow it first",
            spec.path
        )));
    }
    Ok(())
}

/// Whether DEALLOCATE works: it is NFSv4.2; probed past the end of the file, where a
/// hole changes nothing.
async fn deallocate_works(o: &Opened<NfsBuf>, file: &OpenFile, size: u64) -> bool {
    o.session.minor >= 2
        && file
            .deallocate(&o.session, &o.link, size, DEALLOCATE_PROBE)
            .await
            .is_ok()
}

#[async_trait]
impl Target for Nfs4Target {
    fn describe(&self) -> String {
        self.file.describe.clone()
    }

    fn size(&self) -> u64 {
        if self.grows {
            UNKNOWN_SIZE
        } else {
            self.file.size
        }
    }

    fn caps(&self) -> Caps {
        let f = &self.file;
        crate::nfs::caps(f.wsize, f.wsize, false, self.deallocates())
    }

    fn is_zero(&self) -> bool {
        self.file.created
    }

    fn can_grow(&self) -> bool {
        self.grows
    }

    async fn set_end(&self, end: u64) -> Result<()> {
        if !self.grows {
            return Ok(());
        }
        let f = &*self.file;
        let len = if f.created { end } else { end.max(f.size) };
        f.file
            .set_size(&f.session, &self.link, len)
            .await
            .map_err(|e| {
                doing_error(
                    e,
                    &format!("set the file's length to {len} bytes"),
                    &f.config,
                )
                .with_operation("set_end")
                .with_endpoint(f.describe.clone())
            })
    }

    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        if !self.grows {
            self.file.check_range("write", offset, buf.len() as u64)?;
        }
        self.write_all(offset, &buf, "write").await?;
        self.wrote(buf.len() as u64);
        Ok(buf)
    }

    /// DEALLOCATE when allowed and supported (the range becomes a hole that reads as
    /// zeroes); zero buffers otherwise.
    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        let f = &*self.file;
        if !self.grows {
            f.check_range("write_zeroes", offset, len)?;
        }
        if len == 0 {
            return Ok(());
        }
        if mode == ZeroMode::MayDeallocate && self.deallocates() {
            match f.file.deallocate(&f.session, &self.link, offset, len).await {
                Ok(()) => return Ok(()),
                Err(e) if e.nfs4_status().is_some_and(Status::is_unsupported) => {
                    f.dealloc.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(f.err(e, "write_zeroes", offset)),
            }
        }
        self.write_zero_buffers(offset, len).await?;
        self.wrote(len);
        Ok(())
    }

    /// Waits for a background COMMIT, then COMMITs what is left and checks it survived.
    async fn flush(&self) -> Result<()> {
        self.background.settle().await?;
        Self::commit(&self.file, &self.link).await
    }

    async fn connect(&self) -> Result<Arc<dyn Target>> {
        let link = self.file.connect().await?;
        Ok(Arc::new(Self {
            file: Arc::clone(&self.file),
            link: Arc::new(link),
            background: Arc::clone(&self.background),
            grows: self.grows,
        }))
    }
}
