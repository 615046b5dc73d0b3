//! Small reads at any offset of the compressed bytes, served from a read-ahead window,
//! for walking headers (zstd frames) and trailers (the xz index) without one request per
//! field.

use ferry_core::{Error, ErrorKind, IoBuf, Result, Source};

use crate::qcow2::read_bytes;

/// Bytes read at once when a walk needs bytes outside the window.
pub(crate) const WINDOW: u64 = 1 << 20;

/// A read-ahead window over a byte source.
pub(crate) struct Window<'a> {
    bytes: &'a dyn Source,
    start: u64,
    buf: Option<IoBuf>,
    /// Reads of the byte source so far.
    pub reads: u64,
}

impl<'a> Window<'a> {
    pub(crate) fn new(bytes: &'a dyn Source) -> Self {
        Self {
            bytes,
            start: 0,
            buf: None,
            reads: 0,
        }
    }

    pub(crate) fn size(&self) -> u64 {
        self.bytes.size()
    }

    /// The `len` bytes at `offset` (which must lie within the source), reading a window
    /// from `offset` (or ending at `offset + len` when `backwards`) when they are not
    /// in the current one.
    pub(crate) async fn get(&mut self, offset: u64, len: usize, backwards: bool) -> Result<&[u8]> {
        let end = offset
            .checked_add(len as u64)
            .filter(|&end| end <= self.bytes.size())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!("a header at {offset} reaches past the end of the stream"),
                )
            })?;
        let covered = self
            .buf
            .as_ref()
            .is_some_and(|b| offset >= self.start && end <= self.start + b.len() as u64);
        if !covered {
            let want = WINDOW.max(len as u64);
            let (start, stop) = if backwards {
                (end.saturating_sub(want), end)
            } else {
                (offset, offset.saturating_add(want).min(self.bytes.size()))
            };
            self.buf = Some(read_bytes(self.bytes, start, stop - start).await?);
            self.start = start;
            self.reads += 1;
        }
        let buf = self
            .buf
            .as_ref()
            .ok_or_else(|| Error::internal("the window is empty"))?;
        let from = (offset - self.start) as usize;
        Ok(&buf[from..from + len])
    }
}
