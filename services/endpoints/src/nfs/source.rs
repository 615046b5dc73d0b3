//! [`NfsSource`]: reads an image from an NFS server.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::spec::NfsSpec;
use ferry_core::{Caps, Error, ErrorKind, IoBuf, Result, Source};

use super::client::NfsConn;
use super::{open_common, proto, transfer, File, NfsOptions, SharedFile};

/// A file on an NFS server, read over NFSv3. Each [`Source::connect`] opens another
/// TCP connection.
#[derive(Debug)]
pub struct NfsSource {
    file: SharedFile,
    nfs: NfsConn,
}

impl NfsSource {
    /// Opens the file `spec` names; it must exist and be a regular file.
    pub async fn open(spec: &NfsSpec, options: &NfsOptions) -> Result<Self> {
        let (describe, config, resolved, fsinfo) = open_common(spec, options).await?;
        let fail = |e: Error| e.with_operation("open").with_endpoint(describe.clone());
        let Some((fh, attr)) = resolved.file else {
            return Err(fail(Error::new(
                ErrorKind::NotFound,
                format!(
                    "no such file: {} does not exist on the server (export {})",
                    spec.path, resolved.export
                ),
            )));
        };
        if attr.ftype != proto::NF3REG {
            return Err(fail(Error::invalid_input(format!(
                "{} is {}, not a regular file",
                spec.path,
                attr.type_name()
            ))));
        }
        let (rsize, rpref) = transfer(fsinfo.rtmax, fsinfo.rtpref);
        let (wsize, wpref) = transfer(fsinfo.wtmax, fsinfo.wtpref);
        let file = Arc::new(File {
            describe,
            addr: resolved.nfs.addr(),
            config,
            fh,
            size: attr.size,
            rsize,
            wsize,
            rpref,
            wpref,
            commits: Default::default(),
            created: false,
            zeroes: Default::default(),
        });
        Ok(Self {
            file,
            nfs: resolved.nfs,
        })
    }
}

#[async_trait]
impl Source for NfsSource {
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
            block: self.file.block_sizes(self.file.rpref, self.file.rsize),
            request_size: Some(super::REQUEST_SIZE),
        }
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
            let (result, back) = self.nfs.read(&f.fh, at, buf).await;
            buf = back;
            let (count, eof) = result.map_err(|e| f.err(e, "read", at))?;
            let count = count as usize;
            super::check_read_count(&f.describe, f.size, at, n, count, eof)?;
            done += count;
        }
        buf.set_view(view.start, view.len());
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        let nfs = self.file.connect().await?;
        Ok(Arc::new(Self {
            file: Arc::clone(&self.file),
            nfs,
        }))
    }
}
