//! [`Nfs4Target`]: writes an image over NFSv4.2 (or 4.1).
//!
//! A missing file is created by OPEN (GUARDED, mode 0644) and sized with SETATTR; it then
//! reads as zeroes, so the engine skips zero ranges. An existing file must be at least as
//! large as the image. Writes are UNSTABLE; flush COMMITs and checks the write verifier
//! with the NFSv3 tracker, and a COMMIT goes out in the background every 256 MiB written
//! (`background_flush.rs`), as for NFSv3. Zero ranges are DEALLOCATEd (holes that read as zeroes) when
//! the server supports it, else written as zero buffers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::spec::NfsSpec;
use ferry_core::{Caps, Error, IoBuf, Result, Target, ZeroMode};

use super::ops::{self, Ops, Status};
use super::session::Link;
use super::{open_common, open_error, open_file, Shared};
use crate::background_flush::{BackgroundFlush, DEFAULT_BACKGROUND_FLUSH};
use crate::nfs::{client_config, NfsOptions};

/// Mode of a file the target creates.
const CREATE_MODE: u32 = 0o644;

/// A file on an NFSv4 server, written over NFSv4. Each [`Target::connect`] opens another
/// TCP connection bound to the same session; all handles share one record of uncommitted
/// writes, so a flush on any of them commits (and checks) the writes of all.
#[derive(Debug)]
pub struct Nfs4Target {
    file: Arc<Shared>,
    link: Arc<Link>,
    /// COMMITs as the copy goes, shared by every handle.
    background: Arc<BackgroundFlush>,
}

impl Nfs4Target {
    /// Opens the file `spec` names (its NFSv4 pseudo path) for writing `size` bytes,
    /// creating it when missing.
    pub async fn open(spec: &NfsSpec, size: u64, options: &NfsOptions) -> Result<Self> {
        let describe = ferry_core::EndpointSpec::Nfs(spec.clone()).to_string();
        let config = client_config(spec, options);
        let fail = |e: Error| e.with_operation("open").with_endpoint(describe.clone());
        let o = open_common(spec, &config, &describe).await?;
        let access = ops::OPEN4_SHARE_ACCESS_BOTH;
        let opening = |create| open_file(&o, access, create);
        let opened = match &o.file {
            Some(_) => opening(None).await,
            None => match opening(Some(CREATE_MODE)).await {
                // Someone else created it meanwhile: it is an existing file.
                Err(e) if e.status() == Some(Status::EXIST) => opening(None).await,
                Ok(created) => {
                    let (stateid, deleg, fh, _) = created;
                    let mut ops = Ops::new();
                    ops.putfh(&fh).setattr_size(&stateid, size);
                    super::call(&o.session, &o.link, "SETATTR", &ops, None, |r| {
                        r.simple(ops::OP_PUTFH)?;
                        r.setattr()
                    })
                    .await
                    .map_err(|e| {
                        fail(open_error(
                            e,
                            &format!("set the new file's size to {size} bytes"),
                            &config,
                        ))
                    })?;
                    let attrs = ops::Attrs {
                        ftype: Some(ops::NF4REG),
                        size: Some(size),
                        ..Default::default()
                    };
                    return Self::finish_open(
                        o,
                        describe,
                        config,
                        (stateid, deleg, fh, attrs),
                        true,
                    )
                    .await;
                }
                Err(e) => Err(e),
            },
        };
        let opened = opened.map_err(|e| {
            fail(open_error(
                e,
                &format!("open {} for writing", spec.path),
                &config,
            ))
        })?;
        let attrs = opened.3;
        if attrs.ftype != Some(ops::NF4REG) {
            return Err(fail(Error::invalid_input(format!(
                "{} is {}, not a regular file",
                spec.path,
                attrs.type_name()
            ))));
        }
        let existing = attrs.size.unwrap_or(0);
        if existing < size {
            return Err(fail(Error::invalid_input(format!(
                "the existing target {} is {existing} bytes, smaller than the image ({size} bytes): remove it or grow it first",
                spec.path
            ))));
        }
        Self::finish_open(o, describe, config, opened, false).await
    }

    async fn finish_open(
        o: super::Opened,
        describe: String,
        config: super::super::client::ClientConfig,
        opened: (ops::StateId, Option<ops::StateId>, ops::Fh, ops::Attrs),
        created: bool,
    ) -> Result<Self> {
        let (stateid, deleg, fh, attrs) = opened;
        let size = attrs.size.unwrap_or(0);
        // DEALLOCATE is NFSv4.2; probe it past the end of the file, where a hole changes
        // nothing.
        let dealloc = o.session.minor >= 2 && {
            let mut ops = Ops::new();
            ops.putfh(&fh).deallocate(&stateid, size, 4096);
            super::call(&o.session, &o.link, "DEALLOCATE", &ops, None, |r| {
                r.simple(ops::OP_PUTFH)?;
                r.simple(ops::OP_DEALLOCATE)
            })
            .await
            .is_ok()
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
            seek: false,
            dealloc: AtomicBool::new(dealloc),
            commits: Default::default(),
            created,
            zeroes: Default::default(),
            read_bytes: AtomicU64::new(0),
        });
        Ok(Self {
            file,
            link: o.link,
            background: Arc::new(BackgroundFlush::new(DEFAULT_BACKGROUND_FLUSH)),
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
    async fn commit(f: &Shared, link: &Link) -> Result<()> {
        f.commits
            .commit(&f.describe, || async {
                let mut ops = Ops::new();
                ops.putfh(&f.fh).commit(0, 0);
                f.call(link, "COMMIT", &ops, None, |r| {
                    r.simple(ops::OP_PUTFH)?;
                    r.commit()
                })
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
        let mut done = 0usize;
        while done < data.len() {
            let n = (data.len() - done).min(f.wsize as usize);
            let at = offset + done as u64;
            let mut ops = Ops::new();
            ops.putfh(&f.fh)
                .write_head(&f.stateid, at, ops::UNSTABLE4, n as u32);
            let (count, committed, verf) = f
                .call(
                    &self.link,
                    "WRITE",
                    &ops,
                    Some(&data[done..done + n]),
                    |r| {
                        r.simple(ops::OP_PUTFH)?;
                        r.write()
                    },
                )
                .await
                .map_err(|e| f.err(e, op, at))?;
            let count = count as usize;
            super::super::check_write_count(&f.describe, op, at, n, count)?;
            if committed != ops::FILE_SYNC4 {
                f.commits.record(at, count as u64, verf);
            }
            done += count;
        }
        Ok(())
    }

    async fn write_zero_buffers(&self, offset: u64, len: u64) -> Result<()> {
        let f = &*self.file;
        let zeroes = f.zeroes.get_or_init(|| vec![0u8; f.wsize as usize]);
        super::super::write_zero_chunks(offset, len, zeroes, |at, z| {
            self.write_all(at, z, "write_zeroes")
        })
        .await
    }
}

#[async_trait]
impl Target for Nfs4Target {
    fn describe(&self) -> String {
        self.file.describe.clone()
    }

    fn size(&self) -> u64 {
        self.file.size
    }

    fn caps(&self) -> Caps {
        let dealloc = self.deallocates();
        Caps {
            extents: false,
            efficient_zero: dealloc,
            trim: dealloc,
            random_write: true,
            multi_conn: true,
            block: self.file.block_sizes(self.file.wsize),
            request_size: Some(super::super::REQUEST_SIZE),
        }
    }

    fn is_zero(&self) -> bool {
        self.file.created
    }

    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        self.file.check_range("write", offset, buf.len() as u64)?;
        self.write_all(offset, &buf, "write").await?;
        self.wrote(buf.len() as u64);
        Ok(buf)
    }

    /// DEALLOCATE when allowed and supported (the range becomes a hole that reads as
    /// zeroes); zero buffers otherwise.
    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        let f = &*self.file;
        f.check_range("write_zeroes", offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if mode == ZeroMode::MayDeallocate && self.deallocates() {
            let mut ops = Ops::new();
            ops.putfh(&f.fh).deallocate(&f.stateid, offset, len);
            let result = f
                .call(&self.link, "DEALLOCATE", &ops, None, |r| {
                    r.simple(ops::OP_PUTFH)?;
                    r.simple(ops::OP_DEALLOCATE)
                })
                .await;
            match result {
                Ok(()) => return Ok(()),
                Err(e) if e.status().is_some_and(Status::is_unsupported) => {
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
        }))
    }
}
