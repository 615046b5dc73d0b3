//! [`NfsTarget`]: writes an image to an NFS server over NFSv3; and what NFSv3 source and
//! target share (the opened [`File`], the open steps).
//!
//! A missing file is created (GUARDED, mode 0644) and sized with SETATTR; it then reads
//! as zeroes, so the engine skips zero ranges. An existing file must be at least as large
//! as the image. For a stream of unknown size ([`UNKNOWN_SIZE`]) the file grows with the
//! writes, and [`Target::set_end`] sets its length: the stream's for a file this open
//! created, at least its own for an existing one (as for a smaller source of known size). Writes are UNSTABLE; flush COMMITs and checks the write verifier, and a
//! COMMIT goes out in the background every 256 MiB written (`background_flush.rs`), so
//! the server writes its cache out during the copy.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::spec::NfsSpec;
use ferry_core::{Caps, Error, ErrorKind, IoBuf, Result, Target, ZeroMode, UNKNOWN_SIZE};
use ferry_nfs::v3::proto::{self, Attr, FileHandle, FsInfo};
use ferry_nfs::v3::{Location, NfsConn, Resolved};
use ferry_nfs::ClientConfig;

use super::error::{doing_error, open_error, request_error};
use super::{client_config, transfer, NfsBuf, NfsOptions, CREATE_MODE};
use crate::background_flush::{BackgroundFlush, DEFAULT_BACKGROUND_FLUSH};

/// What every open starts with: the endpoint's name and the client settings.
#[derive(Debug)]
pub(super) struct Opening {
    pub(super) describe: String,
    pub(super) config: ClientConfig,
}

/// What all handles of one opened file share.
#[derive(Debug)]
pub(super) struct File {
    pub(super) describe: String,
    addr: SocketAddr,
    config: ClientConfig,
    pub(super) fh: FileHandle,
    pub(super) size: u64,
    /// READ and WRITE sizes (FSINFO rtmax, wtmax, capped) and the preferred ones.
    pub(super) rsize: u32,
    wsize: u32,
    pub(super) rpref: u32,
    wpref: u32,
    /// UNSTABLE writes not yet committed (targets only).
    commits: ferry_nfs::Tracker,
    /// A target this open created: it reads as zeroes.
    created: bool,
    /// A WRITE's worth of zeroes, made on the first `write_zeroes`.
    zeroes: std::sync::OnceLock<Vec<u8>>,
}

impl File {
    pub(super) fn new(
        opening: Opening,
        nfs: &NfsConn<NfsBuf>,
        fh: FileHandle,
        size: u64,
        fsinfo: &FsInfo,
        created: bool,
    ) -> Self {
        let (rsize, rpref) = transfer(fsinfo.rtmax, fsinfo.rtpref);
        let (wsize, wpref) = transfer(fsinfo.wtmax, fsinfo.wtpref);
        Self {
            describe: opening.describe,
            addr: nfs.addr(),
            config: opening.config,
            fh,
            size,
            rsize,
            wsize,
            rpref,
            wpref,
            commits: Default::default(),
            created,
            zeroes: Default::default(),
        }
    }

    pub(super) fn err(&self, e: ferry_nfs::Error, op: &'static str, offset: u64) -> Error {
        request_error(e, "NFS", &self.config, self.config.reconnect_timeout)
            .at(op, offset)
            .with_endpoint(self.describe.clone())
    }

    /// A new connection for another handle.
    pub(super) async fn connect(&self) -> Result<NfsConn<NfsBuf>> {
        NfsConn::connect(self.addr, &self.config)
            .await
            .map_err(|e| {
                open_error(e, &self.config)
                    .with_operation("connect")
                    .with_endpoint(self.describe.clone())
            })
    }
}

/// Resolves the URL and reads the server's transfer sizes: everything source and target
/// share at open.
pub(super) async fn open_common(
    spec: &NfsSpec,
    options: &NfsOptions,
) -> Result<(Opening, Resolved<NfsBuf>, FsInfo)> {
    let describe = super::describe(spec);
    super::check_version(spec, &describe)?;
    let config = client_config(spec, options);
    let fail = |e: Error| e.with_operation("open").with_endpoint(describe.clone());
    let location = Location {
        host: spec.host.clone(),
        path: spec.path.clone(),
        nfs_port: spec.nfsport.or(spec.port),
        mount_port: spec.mountport,
    };
    let resolved = ferry_nfs::v3::resolve(&location, &config)
        .await
        .map_err(|e| fail(open_error(e, &config)))?;
    let fsinfo = resolved
        .nfs
        .fsinfo(&resolved.dir)
        .await
        .map_err(|e| fail(doing_error(e, "read the server's limits (FSINFO)", &config)))?;
    Ok((Opening { describe, config }, resolved, fsinfo))
}

/// A file a target opens: its handle, size, and whether this open created it.
struct Found {
    fh: FileHandle,
    size: u64,
    created: bool,
}

/// A file on an NFS server, written over NFSv3. Each [`Target::connect`] opens another TCP
/// connection; all handles share one record of uncommitted writes, so a flush on any of
/// them commits (and checks) the writes of all.
#[derive(Debug)]
pub struct NfsTarget {
    file: Arc<File>,
    nfs: Arc<NfsConn<NfsBuf>>,
    /// COMMITs as the copy goes, shared by every handle.
    background: Arc<BackgroundFlush>,
    /// Opened for a stream of unknown size: writes may reach past the file's size.
    grows: bool,
}

impl NfsTarget {
    /// Opens the file `spec` names for writing `size` bytes, creating it when missing.
    pub async fn open(spec: &NfsSpec, size: u64, options: &NfsOptions) -> Result<Self> {
        let (opening, resolved, fsinfo) = open_common(spec, options).await?;
        let describe = opening.describe.clone();
        let fail = |e: Error| e.with_operation("open").with_endpoint(describe.clone());
        if size != UNKNOWN_SIZE && fsinfo.maxfilesize > 0 && size > fsinfo.maxfilesize {
            return Err(fail(Error::invalid_input(format!(
                "the image ({size} bytes) is larger than the server's largest file ({} bytes)",
                fsinfo.maxfilesize
            ))));
        }
        let found = Self::find_or_create(spec, size, &resolved, &opening.config)
            .await
            .map_err(fail)?;
        let file = File::new(
            opening,
            &resolved.nfs,
            found.fh,
            found.size,
            &fsinfo,
            found.created,
        );
        Ok(Self {
            file: Arc::new(file),
            nfs: Arc::new(resolved.nfs),
            background: Arc::new(BackgroundFlush::new(DEFAULT_BACKGROUND_FLUSH)),
            grows: size == UNKNOWN_SIZE,
        })
    }

    /// The existing file, checked to be a regular file of at least `size` bytes, or a
    /// new one of `size` bytes.
    async fn find_or_create(
        spec: &NfsSpec,
        size: u64,
        resolved: &Resolved<NfsBuf>,
        config: &ClientConfig,
    ) -> Result<Found> {
        let nfs = &resolved.nfs;
        let existing = match &resolved.file {
            Some(found) => found.clone(),
            None => match nfs.create(&resolved.dir, &resolved.name, CREATE_MODE).await {
                Ok(Some(fh)) => {
                    // Created; a server may return no handle.
                    let fh = match fh {
                        Some(fh) => fh,
                        None => Self::lookup(spec, resolved, config).await?.0,
                    };
                    // A stream of unknown size: the file stays empty until set_end.
                    let size = if size == UNKNOWN_SIZE { 0 } else { size };
                    nfs.set_size(&fh, size).await.map_err(|e| {
                        doing_error(
                            e,
                            &format!("set the new file's size to {size} bytes"),
                            config,
                        )
                    })?;
                    return Ok(Found {
                        fh,
                        size,
                        created: true,
                    });
                }
                // Someone else created it meanwhile: it is an existing file.
                Ok(None) => Self::lookup(spec, resolved, config).await?,
                Err(e) => return Err(doing_error(e, &format!("create {}", spec.path), config)),
            },
        };
        let (fh, attr) = existing;
        if attr.ftype != proto::NF3REG {
            return Err(Error::invalid_input(format!(
                "{} is {}, not a regular file",
                spec.path,
                attr.type_name()
            )));
        }
        if size != UNKNOWN_SIZE && attr.size < size {
            return Err(Error::invalid_input(format!(
                "the existing target {} is {} bytes, smaller than the image ({size} bytes): remove it or grow it first",
                spec.path, attr.size
            )));
        }
        Ok(Found {
            fh,
            size: attr.size,
            created: false,
        })
    }

    /// The handle and attributes of the target's name, which must exist.
    async fn lookup(
        spec: &NfsSpec,
        resolved: &Resolved<NfsBuf>,
        config: &ClientConfig,
    ) -> Result<(FileHandle, Attr)> {
        let nfs = &resolved.nfs;
        match nfs.lookup(&resolved.dir, &resolved.name).await {
            Ok(Some((fh, Some(attr)))) => Ok((fh, attr)),
            Ok(Some((fh, None))) => match nfs.getattr(&fh).await {
                Ok(attr) => Ok((fh, attr)),
                Err(e) => Err(doing_error(e, "get the file's attributes", config)),
            },
            Ok(None) => Err(Error::new(
                ErrorKind::NotFound,
                format!("{} vanished while it was being opened", spec.path),
            )),
            Err(e) => Err(doing_error(e, &format!("look up {}", spec.path), config)),
        }
    }

    /// UNSTABLE writes not yet covered by a successful flush (for tests).
    pub fn uncommitted_writes(&self) -> usize {
        self.file.commits.pending()
    }

    /// COMMITs the file when writes are uncommitted, and checks they survived.
    async fn commit(file: &File, nfs: &NfsConn<NfsBuf>) -> Result<()> {
        super::commit(&file.commits, &file.describe, || async {
            nfs.commit(&file.fh)
                .await
                .map_err(|e| file.err(e, "flush", 0))
        })
        .await
    }

    /// Counts `len` bytes written toward the next background COMMIT.
    fn wrote(&self, len: u64) {
        self.background.wrote(len, || {
            let (file, nfs) = (Arc::clone(&self.file), Arc::clone(&self.nfs));
            async move { Self::commit(&file, &nfs).await }
        });
    }

    /// Writes `data` at `offset` in WRITEs of at most wsize bytes.
    async fn write_all(&self, offset: u64, data: &[u8], op: &'static str) -> Result<()> {
        let f = &*self.file;
        super::write_pieces(
            &f.describe,
            &f.commits,
            f.wsize,
            op,
            offset,
            data,
            |at, piece| async move {
                let (count, committed, verf) = self
                    .nfs
                    .write(&f.fh, at, piece, proto::UNSTABLE)
                    .await
                    .map_err(|e| f.err(e, op, at))?;
                Ok((count, committed == proto::FILE_SYNC, verf))
            },
        )
        .await
    }
}

#[async_trait]
impl Target for NfsTarget {
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
        super::caps(self.file.wpref, self.file.wsize, false, false)
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
        self.nfs.set_size(&f.fh, len).await.map_err(|e| {
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
        let f = &*self.file;
        if !self.grows {
            super::check_range(&f.describe, f.size, "write", offset, buf.len() as u64)?;
        }
        self.write_all(offset, &buf, "write").await?;
        self.wrote(buf.len() as u64);
        Ok(buf)
    }

    /// NFSv3 has no way to write zeroes without sending them: zero buffers are written.
    async fn write_zeroes(&self, offset: u64, len: u64, _mode: ZeroMode) -> Result<()> {
        let f = &*self.file;
        if !self.grows {
            super::check_range(&f.describe, f.size, "write_zeroes", offset, len)?;
        }
        let zeroes = f.zeroes.get_or_init(|| vec![0u8; f.wsize as usize]);
        super::write_zero_chunks(offset, len, zeroes, |at, z| {
            self.write_all(at, z, "write_zeroes")
        })
        .await?;
        self.wrote(len);
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
            grows: self.grows,
        }))
    }
}
