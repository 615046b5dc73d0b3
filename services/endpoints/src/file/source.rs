//! [`FileSource`]: a file or block device read as an image.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Caps, Error, Extent, IoBuf, Result, Source};

use super::exec::Executor;
use super::handle::FileHandle;
use super::{extents, node};
use crate::SourceOptions;

/// A regular file or block device opened for reading.
#[derive(Debug)]
pub struct FileSource {
    handle: Arc<FileHandle>,
    exec: Executor,
}

impl FileSource {
    /// Opens `path` for reading.
    pub async fn open(path: &Path, options: &SourceOptions) -> Result<Self> {
        let path = path.to_path_buf();
        let options = options.clone();
        tokio::task::spawn_blocking(move || Self::open_blocking(&path, &options))
            .await
            .map_err(|e| Error::internal(format!("open task failed: {e}")))?
    }

    /// [`FileSource::open`] for callers outside an async context: it blocks.
    pub fn open_blocking(path: &Path, options: &SourceOptions) -> Result<Self> {
        let handle = node::open_source(path, options.cache)?;
        let exec = Executor::for_handle(handle.direct.is_some());
        Ok(Self {
            handle: Arc::new(handle),
            exec,
        })
    }
}

#[async_trait]
impl Source for FileSource {
    fn describe(&self) -> String {
        self.handle.describe.clone()
    }

    fn size(&self) -> u64 {
        self.handle.size
    }

    fn caps(&self) -> Caps {
        self.handle.caps()
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.handle.check_range("extents", offset, len)?;
        let h = Arc::clone(&self.handle);
        self.exec
            .run(move || {
                extents::extents(&h, offset, len)
                    .map_err(|e| h.error("extents", offset, "lseek SEEK_DATA/SEEK_HOLE failed", e))
            })
            .await
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        self.handle.check_range("read", offset, buf.len() as u64)?;
        let h = Arc::clone(&self.handle);
        self.exec
            .run(move || {
                h.read(offset, &mut buf)
                    .map_err(|e| h.error("read", offset, "read failed", e))?;
                Ok(buf)
            })
            .await
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Self {
            handle: Arc::clone(&self.handle),
            exec: Executor::for_handle(self.handle.direct.is_some()),
        }))
    }
}
