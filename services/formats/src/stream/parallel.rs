//! [`FramesSource`]: a .zst file of independent frames whose sizes are known (recorded in
//! their headers, or measured by a parallel prescan, [`measure`]), read at any offset: a
//! read decompresses the frames it covers (each in a blocking thread, whole, into exactly
//! its size) and keeps the latest few, so the engine's workers decompress different frames
//! at once. Not sequential.
//!
//! Memory: at most [`CACHED_FRAMES`] decompressed frames are kept (frames larger than
//! [`MAX_FRAME`] are not read this way), plus the ones being copied from.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Caps, Error, ErrorKind, IoBuf, Result, Source};
use tokio::sync::OnceCell;

use super::zstd::Frame;
use crate::qcow2::read_bytes;

/// Largest frame decompressed whole (pzstd writes frames of 4 times the window: 8 MiB
/// at its default level, 32 MiB at level 19).
pub const MAX_FRAME: u64 = 32 << 20;
/// Decompressed frames kept: two for each of the engine's default eight workers.
pub const CACHED_FRAMES: usize = 16;

/// One frame's place in the image.
#[derive(Debug, Clone, Copy)]
struct Placed {
    frame: Frame,
    start: u64,
    len: u64,
}

type Cell = Arc<OnceCell<Arc<Vec<u8>>>>;

/// The latest frames, most recent last.
#[derive(Default)]
struct Cache {
    cells: HashMap<usize, Cell>,
    order: VecDeque<usize>,
}

struct Shared {
    bytes: Arc<dyn Source>,
    frames: Vec<Placed>,
    size: u64,
    cache: parking_lot::Mutex<Cache>,
}

/// A multi-frame zstd image read frame by frame, in parallel.
pub struct FramesSource {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FramesSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FramesSource")
            .field("bytes", &self.shared.bytes.describe())
            .field("frames", &self.shared.frames.len())
            .field("size", &self.shared.size)
            .finish_non_exhaustive()
    }
}

impl FramesSource {
    /// The image in `frames` of `bytes`, frame `i` holding `sizes[i]` bytes (recorded in
    /// its header, or measured by [`measure`]), when no frame is larger than
    /// [`MAX_FRAME`]; None otherwise.
    pub fn new(bytes: Arc<dyn Source>, frames: &[Frame], sizes: &[u64]) -> Option<Self> {
        if frames.len() != sizes.len() {
            return None;
        }
        let mut placed = Vec::with_capacity(frames.len());
        let mut start = 0u64;
        for (&frame, &len) in frames.iter().zip(sizes) {
            if len > MAX_FRAME {
                return None;
            }
            placed.push(Placed { frame, start, len });
            start = start.checked_add(len)?;
        }
        Some(Self {
            shared: Arc::new(Shared {
                bytes,
                frames: placed,
                size: start,
                cache: parking_lot::Mutex::new(Cache::default()),
            }),
        })
    }

    /// How many frames the image has.
    pub fn frames(&self) -> usize {
        self.shared.frames.len()
    }
}

impl Shared {
    /// The cell of frame `index`, made most recent; older frames beyond the cache's size
    /// are dropped (readers still holding one keep it until they are done).
    fn cell(&self, index: usize) -> Cell {
        let mut cache = self.cache.lock();
        if let Some(cell) = cache.cells.get(&index).cloned() {
            cache.order.retain(|&i| i != index);
            cache.order.push_back(index);
            return cell;
        }
        let cell: Cell = Arc::default();
        cache.cells.insert(index, cell.clone());
        cache.order.push_back(index);
        while cache.order.len() > CACHED_FRAMES {
            if let Some(old) = cache.order.pop_front() {
                cache.cells.remove(&old);
            }
        }
        cell
    }

    async fn frame(&self, index: usize) -> Result<Arc<Vec<u8>>> {
        let cell = self.cell(index);
        let placed = self.frames[index];
        let bytes = self.bytes.clone();
        cell.get_or_try_init(|| async move {
            let input = read_bytes(bytes.as_ref(), placed.frame.offset, placed.frame.len).await?;
            let input = input.to_vec();
            let len = placed.len as usize;
            let output = tokio::task::spawn_blocking(move || decompress_frame(&input, len))
                .await
                .map_err(|e| Error::internal(format!("a decompressing task failed: {e}")))??;
            Ok::<_, Error>(Arc::new(output))
        })
        .await
        .cloned()
        .map_err(|e| e.at("decompress frame", placed.start))
    }

    async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        offset
            .checked_add(buf.len() as u64)
            .filter(|&end| end <= self.size)
            .ok_or_else(|| {
                Error::invalid_input(format!(
                    "read of {} bytes at {offset} is beyond the image's end {}",
                    buf.len(),
                    self.size
                ))
            })?;
        let mut done = 0usize;
        let mut index = self.frames.partition_point(|p| p.start + p.len <= offset);
        while done < buf.len() {
            let placed = *self
                .frames
                .get(index)
                .ok_or_else(|| Error::internal("a read past the last frame"))?;
            let pos = offset + done as u64;
            let data = self.frame(index).await?;
            let from = (pos - placed.start) as usize;
            let n = (data.len() - from).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&data[from..from + n]);
            done += n;
            index += 1;
        }
        Ok(())
    }
}

/// The decompressed size of each frame, measured by decompressing the frames in
/// parallel (one blocking task per core) without keeping their output: the prescan of
/// frames that do not record their size (pzstd writes them so). None when a frame is
/// larger than [`MAX_FRAME`] either way (then the frames are not read in parallel).
pub async fn measure(bytes: &Arc<dyn Source>, frames: &[Frame]) -> Result<Option<Vec<u64>>> {
    if frames.iter().any(|f| f.len > MAX_FRAME) {
        return Ok(None);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut sizes = Vec::with_capacity(frames.len());
    for batch in frames.chunks(threads) {
        let mut tasks = Vec::with_capacity(batch.len());
        for frame in batch {
            let input = read_bytes(bytes.as_ref(), frame.offset, frame.len)
                .await?
                .to_vec();
            tasks.push(tokio::task::spawn_blocking(move || count_frame(&input)));
        }
        for task in tasks {
            let size = task
                .await
                .map_err(|e| Error::internal(format!("a measuring task failed: {e}")))??;
            match size {
                Some(size) => sizes.push(size),
                None => return Ok(None),
            }
        }
    }
    Ok(Some(sizes))
}

/// The decompressed size of one frame, or None past [`MAX_FRAME`].
fn count_frame(input: &[u8]) -> Result<Option<u64>> {
    use std::io::Read;
    let corrupt = |e: std::io::Error| {
        Error::new(ErrorKind::Corrupt, "a zstd frame does not decompress").with_source(e)
    };
    let mut decoder = zstd::stream::read::Decoder::with_buffer(input)
        .map_err(corrupt)?
        .single_frame();
    decoder
        .window_log_max(super::decode::ZSTD_WINDOW_LOG_MAX)
        .map_err(corrupt)?;
    let mut scratch = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        match decoder.read(&mut scratch) {
            Ok(0) => return Ok(Some(total)),
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(corrupt(e)),
        }
        if total > MAX_FRAME {
            return Ok(None);
        }
    }
}

/// Decompresses one whole frame into exactly `len` bytes.
pub(crate) fn decompress_frame(input: &[u8], len: usize) -> Result<Vec<u8>> {
    let mut output = vec![0u8; len];
    let n = zstd::bulk::decompress_to_buffer(input, &mut output[..]).map_err(|e| {
        Error::new(
            ErrorKind::Corrupt,
            format!("a zstd frame does not decompress to the {len} bytes its header records"),
        )
        .with_source(e)
    })?;
    if n != len {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("a zstd frame decompresses to {n} bytes, not the {len} its header records"),
        ));
    }
    Ok(output)
}

#[async_trait]
impl Source for FramesSource {
    fn describe(&self) -> String {
        self.shared.bytes.describe()
    }

    fn size(&self) -> u64 {
        self.shared.size
    }

    fn caps(&self) -> Caps {
        Caps::default()
    }

    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        self.shared
            .read(offset, &mut buf)
            .await
            .map_err(|e| e.at("decompress", offset).with_endpoint(self.describe()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_decompresses_to_exactly_its_size() {
        let data = vec![9u8; 100_000];
        let frame = zstd::bulk::compress(&data, 3).unwrap();
        assert_eq!(decompress_frame(&frame, 100_000).unwrap(), data);
        assert!(decompress_frame(&frame, 99_999).is_err());
        assert!(decompress_frame(&frame, 100_001).is_err());
        assert!(decompress_frame(&frame[..frame.len() - 1], 100_000).is_err());
        assert!(decompress_frame(b"garbage", 10).is_err());
    }
}
