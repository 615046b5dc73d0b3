//! [`NfsTarget`]: writes an image to an NFS server.
//!
//! A missing file is created (GUARDED, mode 0644) and sized with SETATTR; it then reads
//! as zeroes, so the engine skips zero ranges. An existing file must be at least as large
//! as the image. Writes are UNSTABLE; flush COMMITs and checks the write verifier
//! (`commit.rs`), and a COMMIT goes out in the background every 256 MiB written
//! (`background_flush.rs`), so the server writes its cache out during the copy.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::spec::NfsSpec;
use ferry_core::{Caps, Error, ErrorKind, IoBuf, Result, Target, ZeroMode};

use crate::background_flush::{BackgroundFlush, DEFAULT_BACKGROUND_FLUSH};

use super::client::NfsConn;
use super::{mount, open_common, proto, transfer, File, NfsOptions, SharedFile};

/// A file on an NFS server, written over NFSv3. Each [`Target::connect`] opens another TCP
/// connection; all handles share one record of uncommitted writes, so a flush on any of
/// them commits (and checks) the writes of all.
#[derive(Debug)]
pub struct NfsTarget {
    file: SharedFile,
    nfs: Arc<NfsConn>,
    /// COMMITs as the copy goes, shared by every handle.
    background: Arc<BackgroundFlush>,
}

impl NfsTarget {
    /// Opens the file `spec` names for writing `size` bytes, creating it when missing.
    pub async fn open(spec: &NfsSpec, size: u64, options: &NfsOptions) -> Result<Self> {
        let (describe, config, resolved, fsinfo) = open_common(spec, options).await?;
        let fail = |e: Error| e.with_operation("open").with_endpoint(describe.clone());
        let nfs = resolved.nfs;
        if fsinfo.maxfilesize > 0 && size > fsinfo.maxfilesize {
            return Err(fail(Error::invalid_input(format!(
                "the image ({size} bytes) is larger than the server's largest file ({} bytes)",
                fsinfo.maxfilesize
            ))));
        }
        let lookup = || async {
            match nfs.lookup(&resolved.dir, &resolved.name).await {
                Ok(Some((fh, Some(attr)))) => Ok((fh, attr)),
                Ok(Some((fh, None))) => match nfs.getattr(&fh).await {
                    Ok(attr) => Ok((fh, attr)),
                    Err(e) => Err(mount::nfs_error(e, "get the file's attributes", &config)),
                },
                Ok(None) => Err(Error::new(
                    ErrorKind::NotFound,
                    format!("{} vanished while it was being opened", spec.path),
                )),
                Err(e) => Err(mount::nfs_error(
                    e,
                    &format!("look up {}", spec.path),
                    &config,
                )),
            }
        };
        let (new, existing) = match resolved.file {
            Some(found) => (None, Some(found)),
            None => match nfs.create(&resolved.dir, &resolved.name, 0o644).await {
                Ok(Some(Some(fh))) => (Some(fh), None),
                // Created, but the server returned no handle.
                Ok(Some(None)) => (Some(lookup().await.map_err(fail)?.0), None),
                // Someone else created it meanwhile: it is an existing file.
                Ok(None) => (None, Some(lookup().await.map_err(fail)?)),
                Err(e) => {
                    return Err(fail(mount::nfs_error(
                        e,
                        &format!("create {}", spec.path),
                        &config,
                    )))
                }
            },
        };
        let (fh, file_size, is_new) = match (new, existing) {
            (Some(fh), _) => {
                nfs.set_size(&fh, size).await.map_err(|e| {
                    fail(mount::nfs_error(
                        e,
                        &format!("set the new file's size to {size} bytes"),
                        &config,
                    ))
                })?;
                (fh, size, true)
            }
            (None, Some((fh, attr))) => {
                if attr.ftype != proto::NF3REG {
                    return Err(fail(Error::invalid_input(format!(
                        "{} is {}, not a regular file",
                        spec.path,
                        attr.type_name()
                    ))));
                }
                if attr.size < size {
                    return Err(fail(Error::invalid_input(format!(
                        "the existing target {} is {} bytes, smaller than the image ({size} bytes): remove it or grow it first",
                        spec.path, attr.size
                    ))));
                }
                (fh, attr.size, false)
            }
            (None, None) => return Err(fail(Error::internal("no handle for the target"))),
        };
        let (rsize, rpref) = transfer(fsinfo.rtmax, fsinfo.rtpref);
        let (wsize, wpref) = transfer(fsinfo.wtmax, fsinfo.wtpref);
        let file = Arc::new(File {
            describe,
            addr: nfs.addr(),
            config,
            fh,
            size: file_size,
            rsize,
            wsize,
            rpref,
            wpref,
            commits: Default::default(),
            created: is_new,
            zeroes: Default::default(),
        });
        Ok(Self {
            file,
            nfs: Arc::new(nfs),
            background: Arc::new(BackgroundFlush::new(DEFAULT_BACKGROUND_FLUSH)),
        })
    }

    /// UNSTABLE writes not yet covered by a successful flush (for tests).
    pub fn uncommitted_writes(&self) -> usize {
        self.file.commits.pending()
    }

    /// COMMITs the file when writes are uncommitted, and checks they survived.
    async fn commit(file: &File, nfs: &NfsConn) -> Result<()> {
        file.commits
            .commit(&file.describe, || async {
                nfs.commit(&file.fh)
                    .await
                    .map_err(|e| file.err(e, "flush", 0))
            })
            .await
    }

    /// Writes `data` at `offset` in WRITEs of at most wsize bytes.
    async fn write_all(&self, offset: u64, data: &[u8], op: &'static str) -> Result<()> {
        let f = &*self.file;
        let mut done = 0usize;
        while done < data.len() {
            let n = (data.len() - done).min(f.wsize as usize);
            let at = offset + done as u64;
            let (count, committed, verf) = self
                .nfs
                .write(&f.fh, at, &data[done..done + n], proto::UNSTABLE)
                .await
                .map_err(|e| f.err(e, op, at))?;
            let count = count as usize;
            super::check_write_count(&f.describe, op, at, n, count)?;
            if committed != proto::FILE_SYNC {
                f.commits.record(at, count as u64, verf);
            }
            done += count;
        }
        Ok(())
    }
}

#[async_trait]
impl Target for NfsTarget {
    fn describe(&self) -> String {
        self.file.describe.clone()
    }

    fn size(&self) -> u64 {
        self.file.size
    }

    fn caps(&self) -> Caps {
        Caps {
            extents: false,
            efficient_zero: false,
            trim: false,
            random_write: true,
            multi_conn: true,
            block: self.file.block_sizes(self.file.wpref, self.file.wsize),
            request_size: Some(super::REQUEST_SIZE),
        }
    }

    fn is_zero(&self) -> bool {
        self.file.created
    }

    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        self.file.check_range("write", offset, buf.len() as u64)?;
        self.write_all(offset, &buf, "write").await?;
        self.background.wrote(buf.len() as u64, || {
            let (file, nfs) = (Arc::clone(&self.file), Arc::clone(&self.nfs));
            async move { Self::commit(&file, &nfs).await }
        });
        Ok(buf)
    }

    /// NFSv3 has no way to write zeroes without sending them: zero buffers are written.
    async fn write_zeroes(&self, offset: u64, len: u64, _mode: ZeroMode) -> Result<()> {
        let f = &*self.file;
        f.check_range("write_zeroes", offset, len)?;
        let zeroes = f.zeroes.get_or_init(|| vec![0u8; f.wsize as usize]);
        super::write_zero_chunks(offset, len, zeroes, |at, z| {
            self.write_all(at, z, "write_zeroes")
        })
        .await?;
        self.background.wrote(len, || {
            let (file, nfs) = (Arc::clone(&self.file), Arc::clone(&self.nfs));
            async move { Self::commit(&file, &nfs).await }
        });
        Ok(())
    }

    /// Waits for a background COMMIT, then COMMITs what is left and checks it survived.
    async fn flush(&self) -> Result<()> {
        self.background.settle().await?;
        Self::commit(&self.file, &self.nfs).await
    }

    async fn connect(&self) -> Result<Arc<dyn Target>> {
        let nfs = self.file.connect().await?;
        Ok(Arc::new(Self {
            file: Arc::clone(&self.file),
            nfs: Arc::new(nfs),
            background: Arc::clone(&self.background),
        }))
    }
}
