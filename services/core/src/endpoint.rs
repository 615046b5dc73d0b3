//! The Source and Target traits: all the engine knows about an endpoint.

use std::sync::Arc;

use async_trait::async_trait;

use crate::{Caps, Error, Extent, IoBuf, Result};

/// How a target may satisfy a request to write zeroes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroMode {
    /// The range may be deallocated (a hole) as long as it reads back as zeroes.
    MayDeallocate,
    /// The range must stay allocated (NBD's NO_HOLE, fallocate's ZERO_RANGE).
    Allocate,
}

/// A readable image.
///
/// All methods take `&self` and may be called concurrently. A handle is cheap to share;
/// [`Source::connect`] gives a worker its own handle (a new connection where the protocol
/// allows several, the same one otherwise).
#[async_trait]
pub trait Source: Send + Sync + 'static {
    /// The endpoint as it may appear in logs and errors (secrets redacted).
    fn describe(&self) -> String;

    /// The image size in bytes.
    fn size(&self) -> u64;

    fn caps(&self) -> Caps;

    /// Extents covering a prefix of `offset..offset + len`, contiguous from `offset`,
    /// at least one when `len > 0`, none reaching past `offset + len`. Callers loop for
    /// the rest. The default says everything is data.
    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        Ok(if len == 0 {
            Vec::new()
        } else {
            vec![Extent::data(offset, len)]
        })
    }

    /// Fills the buffer's whole view with the bytes at `offset`, or fails.
    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf>;

    /// A handle for another worker.
    async fn connect(&self) -> Result<Arc<dyn Source>>;

    /// The version of the content, where the endpoint can tell and pin it (an HTTP ETag):
    /// a job stores it so that a resumed attempt reads the same version or fails.
    fn version(&self) -> Option<String> {
        None
    }

    /// Checks, once a copy has read everything it needed, what only the end can show:
    /// a registry layer's digest, over the bytes the copy did not need too. The engine
    /// calls it on the handle it was given before it finishes the target, so an error
    /// fails the copy (no partial success). Default: nothing to check.
    async fn finish(&self) -> Result<()> {
        Ok(())
    }

    /// Ends the session politely (for example NBD_CMD_DISC). Default: nothing to do.
    async fn close(&self) -> Result<()> {
        Ok(())
    }
}

/// A writable image.
///
/// Same concurrency contract as [`Source`]. The engine calls [`Target::finish`] once, on the
/// handle it opened, after every write of a successful copy, and [`Target::abort`] when the
/// copy fails or is cancelled.
#[async_trait]
pub trait Target: Send + Sync + 'static {
    /// The endpoint as it may appear in logs and errors (secrets redacted).
    fn describe(&self) -> String;

    /// The target size in bytes (at least the source's).
    fn size(&self) -> u64;

    fn caps(&self) -> Caps;

    /// Whether the target is known to read as zeroes everywhere (for example a file this
    /// copy just created), so zero ranges need no write at all.
    fn is_zero(&self) -> bool {
        false
    }

    /// Writes the buffer's view at `offset`.
    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf>;

    /// Makes `offset..offset + len` read as zeroes. The default writes zero buffers.
    async fn write_zeroes(&self, offset: u64, len: u64, _mode: ZeroMode) -> Result<()> {
        write_zero_buffers(self, offset, len).await
    }

    /// Makes every completed write durable.
    async fn flush(&self) -> Result<()>;

    /// A handle for another worker.
    async fn connect(&self) -> Result<Arc<dyn Target>>;

    /// Completes the image after the last write: trims preallocation, completes an upload,
    /// and flushes. The default flushes.
    async fn finish(&self) -> Result<()> {
        self.flush().await
    }

    /// Cleans up after a failed or cancelled copy (for example aborts a multipart upload).
    async fn abort(&self) -> Result<()> {
        Ok(())
    }
}

/// Writes zeroes the slow way, in requests no larger than the target allows.
pub(crate) async fn write_zero_buffers<T: Target + ?Sized>(
    target: &T,
    offset: u64,
    len: u64,
) -> Result<()> {
    const CHUNK: u64 = 1024 * 1024;
    if len == 0 {
        return Ok(());
    }
    let chunk = CHUNK
        .min(u64::from(target.caps().block.maximum.max(1)))
        .min(len);
    let chunk = usize::try_from(chunk).map_err(|_| Error::internal("zero chunk exceeds usize"))?;
    let mut buf = IoBuf::new(chunk);
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk as u64) as usize;
        buf.set_len(n);
        buf = target.write_at(offset + done, buf).await?;
        done += n as u64;
    }
    Ok(())
}
