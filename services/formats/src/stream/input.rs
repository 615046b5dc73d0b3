//! The compressed bytes, read ahead from the byte source by an async task and handed to
//! the decompressing thread as a blocking [`std::io::Read`], so reading the next compressed
//! chunk overlaps decompressing the last one.

use std::io;
use std::sync::Arc;

use ferry_core::{Error, IoBuf, Result, Source};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

/// Bytes per read of the compressed source.
pub(crate) const INPUT_CHUNK: u64 = 1 << 20;
/// Compressed chunks read ahead of the decompressor.
pub(crate) const INPUT_DEPTH: usize = 4;

/// The read size for `bytes`: [`INPUT_CHUNK`] within its request limits, whole blocks.
fn chunk_size(bytes: &dyn Source) -> u64 {
    let block = bytes.caps().block;
    let minimum = u64::from(block.minimum.max(1));
    let maximum = u64::from(block.maximum.max(block.minimum).max(1));
    let chunk = INPUT_CHUNK.min(maximum);
    (chunk - chunk % minimum).max(minimum)
}

/// Starts reading `bytes` front to back on `handle`; the chunks arrive in order on the
/// receiver, which ends after the last one or after the first error.
pub(crate) fn spawn_feeder(handle: &Handle, bytes: Arc<dyn Source>) -> Input {
    let (tx, rx) = mpsc::channel(INPUT_DEPTH);
    handle.spawn(async move {
        // A byte source of unknown size (an HTTP answer without Content-Length) is read
        // until it comes back short.
        let size = bytes.size();
        let chunk = chunk_size(bytes.as_ref());
        let mut offset = 0u64;
        while offset < size {
            let len = chunk.min(size - offset) as usize;
            let read = bytes
                .read_some(offset, IoBuf::new(len))
                .await
                .map_err(|e| e.at("read compressed stream", offset));
            let (failed, got) = match &read {
                Ok(buf) => (false, buf.len()),
                Err(_) => (true, 0),
            };
            if got == 0 && !failed {
                return;
            }
            if tx.send(read).await.is_err() || failed || got < len {
                return;
            }
            offset += got as u64;
        }
    });
    Input {
        rx,
        current: None,
        pos: 0,
    }
}

/// The compressed stream as a blocking reader (for the decompressing thread only: it
/// blocks on the feeder).
#[derive(Debug)]
pub(crate) struct Input {
    rx: mpsc::Receiver<Result<IoBuf>>,
    current: Option<IoBuf>,
    pos: usize,
}

impl io::Read for Input {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            if let Some(buf) = &self.current {
                if self.pos < buf.len() {
                    let n = out.len().min(buf.len() - self.pos);
                    out[..n].copy_from_slice(&buf[self.pos..self.pos + n]);
                    self.pos += n;
                    return Ok(n);
                }
            }
            match self.rx.blocking_recv() {
                Some(Ok(buf)) => {
                    self.current = Some(buf);
                    self.pos = 0;
                }
                Some(Err(e)) => return Err(io::Error::other(e)),
                None => return Ok(0),
            }
        }
    }
}

/// The byte source's own error when `err` carries one (a read of the compressed bytes
/// failed), so its kind (a timeout, a lost connection) survives the decoder.
pub(crate) fn source_error(err: io::Error) -> std::result::Result<Error, io::Error> {
    if !err.get_ref().is_some_and(|inner| inner.is::<Error>()) {
        return Err(err);
    }
    let kind = err.kind();
    match err.into_inner() {
        Some(inner) => inner
            .downcast::<Error>()
            .map(|e| *e)
            .map_err(|other| io::Error::new(kind, other)),
        None => Err(io::Error::from(kind)),
    }
}
