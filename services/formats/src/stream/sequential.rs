//! [`StreamSource`]: a compressed stream read front to back as the image it holds.
//!
//! Decompression runs ahead in its own thread (see [`super::decode`]) while the engine
//! writes what came before, so the two overlap. The source says `sequential_read`: the
//! engine reads it in offset order with one reader. A read ahead of the position skips
//! (decompresses and discards); a read behind it restarts decompression from the start,
//! which is logged because it costs a second pass.
//!
//! Its size may be unknown (a gzip stream nobody gave the size of): the source then says
//! so ([`Source::size_known`]) and the engine reads it with [`Source::read_some`] until it
//! comes back short, at the stream's end.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Caps, Error, ErrorKind, IoBuf, Result, Source, UNKNOWN_SIZE};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Mutex};

use super::decode::{self, Codec, Msg, OUTPUT_DEPTH};
use super::input::spawn_feeder;
use crate::detect::{detect, Detected};

/// A decompressed stream as a sequential [`Source`] of `size` bytes, or of a size found
/// at its end.
pub struct StreamSource {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for StreamSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamSource")
            .field("bytes", &self.shared.bytes.describe())
            .field("format", &self.shared.codec.kind)
            .field("size", &self.shared.size)
            .finish_non_exhaustive()
    }
}

struct Shared {
    bytes: Arc<dyn Source>,
    codec: Codec,
    /// None: learned at the end.
    size: Option<u64>,
    handle: Handle,
    state: Mutex<State>,
}

/// Where the decompressed stream is.
struct State {
    rx: mpsc::Receiver<Result<Msg>>,
    /// The chunk being read and how far.
    chunk: Vec<u8>,
    used: usize,
    /// Stream offset of the next byte to hand out.
    pos: u64,
    /// A read failed: the next read starts over.
    broken: bool,
    /// The stream ended after this many bytes (the decompressing thread said so).
    ended: Option<u64>,
}

/// Starts the feeder and the decompressing thread; returns the receiver of chunks.
fn start(
    bytes: &Arc<dyn Source>,
    codec: Codec,
    limit: u64,
    handle: &Handle,
) -> Result<mpsc::Receiver<Result<Msg>>> {
    let input = spawn_feeder(handle, bytes.clone());
    let (tx, rx) = mpsc::channel(OUTPUT_DEPTH);
    // The decoder is made in the thread: gzip's reads its header at once, which blocks.
    std::thread::Builder::new()
        .name(format!("ferry-un{}", codec.kind))
        .spawn(move || match codec.decoder(input) {
            Ok(decoder) => decode::produce(codec, decoder, limit, tx),
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
            }
        })
        .map_err(|e| Error::io("cannot start the decompressing thread", e))?;
    Ok(rx)
}

impl StreamSource {
    /// Opens the stream in `bytes` as an image of `size` bytes (checked against the
    /// stream as it is read; None: as long as the stream turns out to be). Fails at once
    /// when the stream does not start to decompress, or holds a qcow2 image (not
    /// supported inside a compressed stream).
    pub(crate) async fn open(
        bytes: Arc<dyn Source>,
        codec: Codec,
        size: Option<u64>,
    ) -> Result<Self> {
        let handle = Handle::current();
        let rx = start(&bytes, codec, size.unwrap_or(u64::MAX), &handle)?;
        let source = Self {
            shared: Arc::new(Shared {
                bytes,
                codec,
                size,
                handle,
                state: Mutex::new(State {
                    rx,
                    chunk: Vec::new(),
                    used: 0,
                    pos: 0,
                    broken: false,
                    ended: None,
                }),
            }),
        };
        if size != Some(0) {
            let mut state = source.shared.state.lock().await;
            source.shared.next_chunk(&mut state).await?;
            if detect(&state.chunk) == Detected::Qcow2 {
                return Err(Error::unsupported(format!(
                    "the {} stream holds a qcow2 image: qcow2 inside a compressed stream is \
                     not supported; decompress it first and copy the .qcow2 file",
                    codec.kind
                )));
            }
        }
        Ok(source)
    }
}

impl Shared {
    /// Takes the next chunk from the decompressing thread. At the end of a stream of
    /// unknown size the chunk stays empty and `state.ended` says where it ended.
    async fn next_chunk(&self, state: &mut State) -> Result<()> {
        if state.ended.is_some() {
            return Ok(());
        }
        match state.rx.recv().await {
            Some(Ok(Msg::Data(chunk))) => {
                state.chunk = chunk;
                state.used = 0;
                Ok(())
            }
            Some(Ok(Msg::End(total))) if self.size.is_none() => {
                state.chunk = Vec::new();
                state.used = 0;
                state.ended = Some(total);
                Ok(())
            }
            Some(Ok(Msg::End(total))) => Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the {} stream ends after {total} bytes, before the image's size {} \
                     (truncated, or the size given is wrong)",
                    self.codec.kind,
                    self.size.unwrap_or_default()
                ),
            )),
            Some(Err(e)) => Err(e),
            None => Err(Error::internal("the decompressing thread stopped")),
        }
    }

    /// Starts decompression over from the beginning of the stream.
    fn restart(&self, state: &mut State, offset: u64) -> Result<()> {
        if !state.broken {
            tracing::warn!(
                source = %self.bytes.describe(),
                offset,
                position = state.pos,
                "a read behind the decompressed position restarts decompression from the start"
            );
        }
        state.rx = start(
            &self.bytes,
            self.codec,
            self.size.unwrap_or(u64::MAX),
            &self.handle,
        )?;
        state.chunk = Vec::new();
        state.used = 0;
        state.pos = 0;
        state.broken = false;
        state.ended = None;
        Ok(())
    }

    /// Moves to `offset`, discarding what lies before it (or to the end of a stream of
    /// unknown size, if it ends first).
    async fn skip_to(&self, state: &mut State, offset: u64) -> Result<()> {
        while state.pos < offset {
            if state.used == state.chunk.len() {
                self.next_chunk(state).await?;
                if state.ended.is_some() {
                    return Ok(());
                }
            }
            let n = (state.chunk.len() - state.used).min((offset - state.pos) as usize);
            state.used += n;
            state.pos += n as u64;
        }
        Ok(())
    }

    /// Fills `buf` from the position; returns the bytes filled (fewer only at the end
    /// of a stream of unknown size).
    async fn fill(&self, state: &mut State, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            if state.used == state.chunk.len() {
                self.next_chunk(state).await?;
                if state.ended.is_some() {
                    break;
                }
            }
            let n = (state.chunk.len() - state.used).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&state.chunk[state.used..state.used + n]);
            state.used += n;
            state.pos += n as u64;
            done += n;
        }
        Ok(done)
    }

    /// At the image's end: the stream must end too.
    async fn expect_end(&self, state: &mut State, size: u64) -> Result<()> {
        let longer = || {
            Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the {} stream holds more than the image's size {size} (the size given \
                     is wrong)",
                    self.codec.kind
                ),
            )
        };
        if state.used < state.chunk.len() {
            return Err(longer());
        }
        match state.rx.recv().await {
            Some(Ok(Msg::End(total))) if total == size => Ok(()),
            Some(Ok(_)) => Err(longer()),
            Some(Err(e)) => Err(e),
            None => Err(Error::internal("the decompressing thread stopped")),
        }
    }

    /// Reads at `offset`; returns the bytes read: all of `buf`, or fewer at the end of
    /// a stream of unknown size.
    async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let end = offset.checked_add(buf.len() as u64);
        let end = match (self.size, end) {
            (Some(size), Some(end)) if end <= size => Some(end),
            (None, Some(_)) => None,
            _ => {
                return Err(Error::invalid_input(format!(
                    "read of {} bytes at {offset} is beyond the image's end {}",
                    buf.len(),
                    self.size.map_or("(unknown)".to_string(), |s| s.to_string())
                )))
            }
        };
        let mut state = self.state.lock().await;
        if state.broken || offset < state.pos {
            self.restart(&mut state, offset)?;
        }
        let result = async {
            self.skip_to(&mut state, offset).await?;
            if state.pos < offset {
                return Ok(0);
            }
            let n = self.fill(&mut state, buf).await?;
            if let (Some(size), Some(end)) = (self.size, end) {
                if end == size && !buf.is_empty() {
                    self.expect_end(&mut state, size).await?;
                }
            }
            Ok::<usize, Error>(n)
        }
        .await;
        if result.is_err() {
            state.broken = true;
        }
        result
    }
}

#[async_trait]
impl Source for StreamSource {
    fn describe(&self) -> String {
        self.shared.bytes.describe()
    }

    fn size(&self) -> u64 {
        self.shared.size.unwrap_or(UNKNOWN_SIZE)
    }

    fn size_known(&self) -> bool {
        self.shared.size.is_some()
    }

    fn caps(&self) -> Caps {
        Caps {
            sequential_read: true,
            ..Caps::default()
        }
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let want = buf.len();
        let n = self
            .shared
            .read(offset, &mut buf)
            .await
            .map_err(|e| e.at("decompress", offset).with_endpoint(self.describe()))?;
        if n < want {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the {} stream ends at {} bytes, before the {want} bytes asked for",
                    self.shared.codec.kind,
                    offset + n as u64
                ),
            )
            .at("decompress", offset)
            .with_endpoint(self.describe()));
        }
        Ok(buf)
    }

    async fn read_some(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        let n = self
            .shared
            .read(offset, &mut buf)
            .await
            .map_err(|e| e.at("decompress", offset).with_endpoint(self.describe()))?;
        let start = buf.view().start;
        buf.set_view(start, n);
        Ok(buf)
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Self {
            shared: self.shared.clone(),
        }))
    }

    async fn close(&self) -> Result<()> {
        self.shared.bytes.close().await
    }
}
