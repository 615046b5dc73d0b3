//! [`TarStream`]: a layer's tar, decompressed front to back in its own thread (the
//! decoders of [`crate::stream`]), read at increasing offsets, with the last
//! [`LOOK_BEHIND`] bytes kept so that a reader may step back a little (qcow2's opener
//! reads its header twice; the engine's planner may read an L2 table just ahead of the
//! data before it). A read further behind fails: the layer is never decompressed twice
//! and nothing is written to scratch space.

use std::collections::VecDeque;
use std::io::Read;
use std::sync::Arc;

use ferry_core::{Error, ErrorKind, Result, Source};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::detect::Detected;
use crate::stream::decode::{self, Codec, Msg, OUTPUT_DEPTH};
use crate::stream::input::spawn_feeder;

/// Decompressed bytes kept behind the furthest read.
pub const LOOK_BEHIND: u64 = 32 << 20;
/// Most bytes a layer may decompress to (16 TiB): past it the layer is refused.
pub const MAX_LAYER: u64 = 16 << 40;

/// The decompressed tar of a layer.
pub(crate) struct TarStream {
    rx: mpsc::Receiver<Result<Msg>>,
    /// Chunks received and kept, with the offset of each one's first byte.
    kept: VecDeque<(u64, Vec<u8>)>,
    kept_bytes: u64,
    /// Offset just past the last byte received.
    end: u64,
    /// The decompressed stream ended (its total length).
    ended: Option<u64>,
    kind: Detected,
}

impl std::fmt::Debug for TarStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TarStream")
            .field("kind", &self.kind)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl TarStream {
    /// Starts decompressing `bytes` (`kind`: gzip, zstd, or raw for a plain tar).
    pub(crate) fn start(bytes: &Arc<dyn Source>, kind: Detected) -> Result<Self> {
        let input = spawn_feeder(&Handle::current(), bytes.clone());
        let (tx, rx) = mpsc::channel(OUTPUT_DEPTH);
        let codec = Codec {
            kind,
            xz_threads: 1,
        };
        std::thread::Builder::new()
            .name("ferry-layer".into())
            .spawn(move || {
                let decoder: Result<Box<dyn Read + Send>> = match kind {
                    Detected::Raw => Ok(Box::new(input)),
                    _ => codec.decoder(input),
                };
                match decoder {
                    Ok(d) => decode::produce(codec, d, MAX_LAYER, tx),
                    Err(e) => {
                        let _ = tx.blocking_send(Err(e));
                    }
                }
            })
            .map_err(|e| Error::io("cannot start the decompressing thread", e))?;
        Ok(Self {
            rx,
            kept: VecDeque::new(),
            kept_bytes: 0,
            end: 0,
            ended: None,
            kind,
        })
    }

    /// Offset just past the last byte decompressed so far.
    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// The stream's total length once it ended.
    pub(crate) fn ended(&self) -> Option<u64> {
        self.ended
    }

    /// Takes the next chunk; false at the end of the stream.
    pub(crate) async fn pull(&mut self) -> Result<bool> {
        if self.ended.is_some() {
            return Ok(false);
        }
        match self.rx.recv().await {
            Some(Ok(Msg::Data(chunk))) => {
                let len = chunk.len() as u64;
                self.kept.push_back((self.end, chunk));
                self.kept_bytes += len;
                self.end += len;
                Ok(true)
            }
            Some(Ok(Msg::End(total))) => {
                self.ended = Some(total);
                Ok(false)
            }
            Some(Err(e)) => Err(e),
            None => Err(Error::internal("the decompressing thread stopped")),
        }
    }

    /// Drops kept chunks that end before `keep_from - LOOK_BEHIND`.
    fn trim(&mut self, keep_from: u64) {
        let floor = keep_from.saturating_sub(LOOK_BEHIND);
        while let Some((start, chunk)) = self.kept.front() {
            if start + chunk.len() as u64 > floor || self.kept.len() == 1 {
                break;
            }
            self.kept_bytes -= chunk.len() as u64;
            self.kept.pop_front();
        }
    }

    /// Fills `buf` with the decompressed bytes at `offset`.
    pub(crate) async fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let want_end = offset
            .checked_add(buf.len() as u64)
            .ok_or_else(|| Error::invalid_input("a read past 2^64"))?;
        let first_kept = self.kept.front().map_or(self.end, |(s, _)| *s);
        if offset < first_kept {
            return Err(Error::unsupported(format!(
                "a read at offset {offset} of the layer's tar is {} bytes behind what was \
                 decompressed ({}), more than the {} MiB kept: the image's metadata comes after \
                 the data it maps (a qcow2 written out of order). Ferry reads a compressed layer \
                 once, without scratch space: rewrite the image in order with `qemu-img convert \
                 -O qcow2`, or push the layer uncompressed (it is then read by ranges)",
                self.end - offset,
                self.end,
                LOOK_BEHIND >> 20
            )));
        }
        while self.end < want_end {
            if !self.pull().await? {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "the layer's tar ends after {} bytes, inside an entry that says it \
                         reaches {want_end} (the layer is truncated, or a tar header lies \
                         about its size)",
                        self.end
                    ),
                ));
            }
            self.trim(offset);
        }
        let mut done = 0usize;
        for (start, chunk) in &self.kept {
            let chunk_end = start + chunk.len() as u64;
            let at = offset + done as u64;
            if chunk_end <= at || done == buf.len() {
                continue;
            }
            let from = (at - start) as usize;
            let n = (chunk.len() - from).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&chunk[from..from + n]);
            done += n;
        }
        self.trim(offset);
        if done != buf.len() {
            return Err(Error::internal(
                "the layer's kept chunks do not cover a read",
            ));
        }
        Ok(())
    }
}
