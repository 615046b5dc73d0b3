//! The decompressing thread: a decoder per format (gzip members, xz streams, zstd frames,
//! each concatenated as the command line tools concatenate them) over the compressed
//! [`Input`], cutting its output into chunks for a bounded channel.
//!
//! Memory is bounded by construction: [`OUTPUT_DEPTH`] chunks of [`OUTPUT_CHUNK`] bytes
//! wait in the channel, one is being filled, and the decoders' own state is capped (a
//! zstd window of at most 2^[`ZSTD_WINDOW_LOG_MAX`] bytes, xz at [`XZ_MEMLIMIT`]), so a
//! decompression bomb costs time, never memory. The output is also capped at the size the
//! image was given: a stream that holds more is corrupt.

use std::io::{self, Read};

use ferry_core::{Error, ErrorKind, Result};
use tokio::sync::mpsc;

use super::input::{source_error, Input};
use crate::detect::Detected;

/// Bytes per decompressed chunk.
pub const OUTPUT_CHUNK: usize = 1 << 20;
/// Decompressed chunks waiting for the reader.
pub const OUTPUT_DEPTH: usize = 16;
/// Largest zstd window accepted (128 MiB, the zstd tool's own default limit; frames made
/// with `--long=31` need a larger one and are refused).
pub const ZSTD_WINDOW_LOG_MAX: u32 = 27;
/// Most memory the xz decoder may use (xz -9 needs 65 MiB in one thread).
pub const XZ_MEMLIMIT: u64 = 256 << 20;
/// Memory up to which the xz decoder uses several threads (each holds a block).
pub const XZ_MEMLIMIT_THREADING: u64 = 256 << 20;

/// What the decompressing thread sends.
#[derive(Debug)]
pub(crate) enum Msg {
    /// The next decompressed bytes.
    Data(Vec<u8>),
    /// The stream ended after this many bytes.
    End(u64),
}

/// How to decode one stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Codec {
    pub kind: Detected,
    /// Decoder threads for xz (1: single-threaded, which also reads concatenated streams;
    /// more: liblzma's threaded decoder, for one stream of several blocks).
    pub xz_threads: u32,
}

impl Codec {
    /// A decoder reading `input`.
    pub(crate) fn decoder(self, input: Input) -> Result<Box<dyn Read + Send>> {
        let failed =
            |e: io::Error| Error::internal(format!("cannot start the {} decoder: {e}", self.kind));
        Ok(match self.kind {
            Detected::Gzip => Box::new(flate2::read::MultiGzDecoder::new(input)),
            Detected::Zstd => {
                let mut d = zstd::stream::read::Decoder::new(input).map_err(failed)?;
                d.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(failed)?;
                Box::new(d)
            }
            Detected::Xz => {
                use liblzma::stream::{MtStreamBuilder, Stream, CONCATENATED};
                let stream = if self.xz_threads > 1 {
                    MtStreamBuilder::new()
                        .threads(self.xz_threads)
                        .memlimit_threading(XZ_MEMLIMIT_THREADING)
                        .memlimit_stop(XZ_MEMLIMIT)
                        .decoder()
                } else {
                    Stream::new_stream_decoder(XZ_MEMLIMIT, CONCATENATED)
                }
                .map_err(|e| failed(io::Error::other(e)))?;
                Box::new(liblzma::read::XzDecoder::new_stream(input, stream))
            }
            other => {
                return Err(Error::internal(format!(
                    "{other} is not a compressed stream"
                )))
            }
        })
    }

    /// The error for a decoder failure `after` decompressed bytes: the byte source's own
    /// error when reading it failed, else the stream is corrupt (or needs more memory
    /// than allowed).
    pub(crate) fn error(self, err: io::Error, after: u64) -> Error {
        let err = match source_error(err) {
            Ok(source) => return source,
            Err(e) => e,
        };
        let text = err.to_string();
        let hint = if text.contains("memory")
            || text.contains("Memory")
            || text.contains("Frame requires too much")
        {
            match self.kind {
                Detected::Zstd => " (the frame's window is larger than the 128 MiB allowed)",
                Detected::Xz => " (decoding it needs more than the 256 MiB allowed)",
                _ => "",
            }
        } else if err.kind() == io::ErrorKind::UnexpectedEof
            || text.contains("incomplete")
            || text.contains("premature")
        {
            " (the stream is truncated)"
        } else {
            ""
        };
        Error::new(
            ErrorKind::Corrupt,
            format!(
                "the {} stream does not decompress after {after} bytes{hint}",
                self.kind
            ),
        )
        .with_source(err)
    }
}

/// Fills `buf` from `decoder` as far as the stream goes; returns the bytes read.
fn fill(decoder: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match decoder.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The decompressing thread's body: sends the stream in chunks, then [`Msg::End`]; stops
/// at the first error (sent), when the stream exceeds `limit` bytes (an error), or when
/// the reader has gone.
pub(crate) fn produce(
    codec: Codec,
    mut decoder: Box<dyn Read + Send>,
    limit: u64,
    tx: mpsc::Sender<Result<Msg>>,
) {
    let mut total = 0u64;
    loop {
        let mut buf = vec![0u8; OUTPUT_CHUNK];
        let n = match fill(decoder.as_mut(), &mut buf) {
            Ok(n) => n,
            Err(e) => {
                let _ = tx.blocking_send(Err(codec.error(e, total)));
                return;
            }
        };
        if n == 0 {
            let _ = tx.blocking_send(Ok(Msg::End(total)));
            return;
        }
        buf.truncate(n);
        total += n as u64;
        if total > limit {
            let _ = tx.blocking_send(Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the {} stream holds more than {limit} bytes, the size the image was \
                     given",
                    codec.kind
                ),
            )));
            return;
        }
        if tx.blocking_send(Ok(Msg::Data(buf))).is_err() {
            return;
        }
    }
}

/// Decompresses the whole stream to count its bytes (the prescan), in the calling
/// (blocking) thread.
pub(crate) fn count(codec: Codec, mut decoder: Box<dyn Read + Send>) -> Result<u64> {
    let mut buf = vec![0u8; OUTPUT_CHUNK];
    let mut total = 0u64;
    loop {
        match fill(decoder.as_mut(), &mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(e) => return Err(codec.error(e, total)),
        }
    }
}
