//! The Source and Target traits: all the engine knows about an endpoint.

use std::sync::Arc;

use async_trait::async_trait;

use crate::{Caps, Error, Extent, IoBuf, Result};

/// What [`Source::size`] answers for a source whose size shows only at its end (see
/// [`Source::size_known`]): no image is this large, so a caller that forgets to ask fails
/// loudly (a target cannot be sized to it) instead of copying nothing.
pub const UNKNOWN_SIZE: u64 = u64::MAX;

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

    /// The image size in bytes ([`UNKNOWN_SIZE`] when [`Source::size_known`] is false).
    fn size(&self) -> u64;

    /// Whether the size is known before the image is read. A stream whose length shows
    /// only at its end (a gzip stream, a zstd frame that does not record it) answers
    /// false: it is read front to back with [`Source::read_some`] until that comes back
    /// short, and its `size()` is [`UNKNOWN_SIZE`]. Such a source is always
    /// [`Caps::sequential_read`].
    fn size_known(&self) -> bool {
        true
    }

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

    /// Reads as [`Source::read_at`] does, except at the image's end: the buffer comes back
    /// with its view cut to the bytes there were (empty at or past the end). The one way
    /// to read a source whose size is not known; the default serves sources whose size is.
    async fn read_some(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let n = self.size().saturating_sub(offset).min(buf.len() as u64) as usize;
        let start = buf.view().start;
        buf.set_view(start, n);
        if n == 0 {
            return Ok(buf);
        }
        self.read_at(offset, buf).await
    }

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

    /// Whether [`Target::set_end`] sets the image's length: a regular file or an S3
    /// upload opened for a source of unknown size ([`UNKNOWN_SIZE`]). Its `size()` is then
    /// the most it can take ([`UNKNOWN_SIZE`] for a file). A target that cannot grow (a
    /// block device, an NBD export, an iSCSI LUN) holds at most `size()` bytes and keeps
    /// the bytes past a shorter image. Default: it cannot.
    fn can_grow(&self) -> bool {
        false
    }

    /// Called once, before [`Target::finish`], when a source of unknown size ended after
    /// `end` bytes, all of them written: a target that can grow takes that length (a file
    /// created for the copy is cut or extended to it). Default: nothing to do (the target
    /// keeps its size; bytes past `end` stay as they were).
    async fn set_end(&self, _end: u64) -> Result<()> {
        Ok(())
    }

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
