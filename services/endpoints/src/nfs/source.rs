//! [`NfsSource`]: reads an image from an NFS server over NFSv3.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::spec::NfsSpec;
use ferry_core::{Caps, Error, ErrorKind, IoBuf, Result, Source};
use ferry_nfs::v3::{proto, NfsConn};

use super::target::{open_common, File};
use super::{NfsBuf, NfsOptions};

/// A file on an NFS server, read over NFSv3. Each [`Source::connect`] opens another
/// TCP connection.
#[derive(Debug)]
pub struct NfsSource {
    file: Arc<File>,
    nfs: NfsConn<NfsBuf>,
}

impl NfsSource {
    /// Opens the file `spec` names; it must exist and be a regular file.
    pub async fn open(spec: &NfsSpec, options: &NfsOptions) -> Result<Self> {
        let (opened, resolved, fsinfo) = open_common(spec, options).await?;
        let fail = |e: Error| {
            e.with_operation("open")
                .with_endpoint(opened.describe.clone())
        };
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
        let file = Arc::new(File::new(
            opened,
            &resolved.nfs,
            fh,
            attr.size,
            &fsinfo,
            false,
        ));
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
        super::caps(self.file.rpref, self.file.rsize, false, false)
    }

    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let f = &*self.file;
        super::read_pieces(
            &f.describe,
            f.size,
            f.rsize,
            offset,
            buf,
            |at, piece| async move {
                let (result, back) = self.nfs.read(&f.fh, at, piece).await;
                let result = result
                    .map(|(count, eof)| (eof, count))
                    .map_err(|e| f.err(e, "read", at));
                (result, back)
            },
        )
        .await
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        let nfs = self.file.connect().await?;
        Ok(Arc::new(Self {
            file: Arc::clone(&self.file),
            nfs,
        }))
    }
}
