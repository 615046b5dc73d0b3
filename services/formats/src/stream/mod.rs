//! Compressed raw images (.gz, .xz, .zst) read as the image they hold.
//!
//! The image's size must be known before a copy starts (the target is sized to it).
//! Where it comes from, by format:
//! - xz: the index at the end of each stream records it; reading it costs a few small
//!   reads from the end.
//! - zstd: each frame header may record its content size (the zstd tool records it when
//!   it compresses a file; pzstd never does); the frames are walked to add them up.
//! - gzip: the trailer records it modulo 4 GiB only, which is not a size.
//!
//! When the stream does not record it, the caller may give it ([`StreamOptions::size`],
//! `--source-size`; checked against the stream as it is read) or ask for a prescan
//! ([`StreamOptions::prescan`]: one full decompression pass that counts); otherwise the
//! size is learned at the end: the source says its size is not known
//! ([`Source::size_known`]) and the engine copies or hashes it front to back until it
//! ends (into a target that grows to it, or one large enough).
//!
//! A zstd file of several independent frames whose sizes are known is read in parallel,
//! frame by frame ([`FramesSource`]): frames that record their size (`zstd` run on each
//! piece of a split image, the seekable format's frames), or pzstd's frames, which do not
//! but sit behind skippable frames giving their compressed length, once `--prescan` has
//! measured them (in parallel too). Everything else is decompressed front to back, ahead
//! of the reader, in a thread of its own ([`StreamSource`]).

pub(crate) mod decode;
pub(crate) mod input;
mod parallel;
mod sequential;
mod window;
pub mod xz;
pub mod zstd;

use std::sync::Arc;

use ferry_core::{Error, ErrorKind, Result, Source};
use tokio::runtime::Handle;

pub use decode::{OUTPUT_CHUNK, OUTPUT_DEPTH, XZ_MEMLIMIT, ZSTD_WINDOW_LOG_MAX};
pub use parallel::{FramesSource, CACHED_FRAMES, MAX_FRAME};
pub use sequential::StreamSource;

use crate::detect::Detected;
use decode::Codec;
use input::spawn_feeder;

/// How to open a compressed stream.
#[derive(Debug, Clone, Default)]
pub struct StreamOptions {
    /// The decompressed size, when the caller knows it (`--source-size`). Checked
    /// against what the stream records, and against the stream as it is read.
    pub size: Option<u64>,
    /// Count the decompressed size with a full decompression pass when the stream does
    /// not record it (`--prescan`).
    pub prescan: bool,
}

/// What opening a compressed stream found out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLayout {
    /// The decompressed size; None when it is learned only at the stream's end.
    pub size: Option<u64>,
    /// Independent pieces read in parallel (zstd frames), when the image is read so.
    pub parallel_frames: Option<u64>,
}

/// Decoder threads for a single xz stream of several blocks.
fn xz_threads() -> u32 {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4) as u32
}

/// Compares what the caller said with what the stream records.
fn agree(kind: Detected, given: Option<u64>, recorded: u64) -> Result<u64> {
    match given {
        Some(given) if given != recorded => Err(Error::invalid_input(format!(
            "--source-size {given} disagrees with the {recorded} bytes the {kind} stream records"
        ))),
        _ => Ok(recorded),
    }
}

/// Counts the stream's decompressed bytes with a full pass.
async fn prescan(bytes: &Arc<dyn Source>, codec: Codec) -> Result<u64> {
    tracing::info!(
        source = %bytes.describe(),
        format = %codec.kind,
        "prescan: decompressing the whole stream to count its size"
    );
    let input = spawn_feeder(&Handle::current(), bytes.clone());
    tokio::task::spawn_blocking(move || decode::count(codec, codec.decoder(input)?))
        .await
        .map_err(|e| Error::internal(format!("the prescan task failed: {e}")))?
}

/// Opens the `kind` stream held in `bytes` as the image it holds.
pub async fn open_stream(
    bytes: Arc<dyn Source>,
    kind: Detected,
    options: &StreamOptions,
) -> Result<(Arc<dyn Source>, StreamLayout)> {
    let seekable = !bytes.caps().sequential_read;
    let mut codec = Codec {
        kind,
        xz_threads: 1,
    };
    let size = match kind {
        Detected::Xz if seekable => Some(xz_size(bytes.as_ref(), options, &mut codec).await?),
        Detected::Zstd if seekable && options.size.is_none() => {
            match open_zstd(&bytes, codec, options).await? {
                ZstdRead::Frames(source, layout) => return Ok((source, layout)),
                ZstdRead::FrontToBack(size) => size,
            }
        }
        _ => unrecorded_size(&bytes, codec, options).await?,
    };
    if size.is_none() {
        tracing::debug!(
            source = %bytes.describe(),
            format = %kind,
            "the decompressed size is not known: it is learned at the stream's end"
        );
    }
    let source = StreamSource::open(bytes, codec, size).await?;
    Ok((
        Arc::new(source),
        StreamLayout {
            size,
            parallel_frames: None,
        },
    ))
}

/// The size an xz index records; a single stream of several blocks gets the threaded
/// decoder.
async fn xz_size(bytes: &dyn Source, options: &StreamOptions, codec: &mut Codec) -> Result<u64> {
    let layout = xz::layout(bytes).await?;
    if layout.streams == 1 && layout.blocks > 1 {
        codec.xz_threads = xz_threads();
    }
    agree(codec.kind, options.size, layout.size)
}

/// How a zstd file is read.
enum ZstdRead {
    /// Frame by frame, in parallel.
    Frames(Arc<dyn Source>, StreamLayout),
    /// Front to back, of this size (None: learned at the end).
    FrontToBack(Option<u64>),
}

/// Opens a zstd file frame by frame when its frames' sizes are known, or learns the size
/// to read it front to back.
async fn open_zstd(
    bytes: &Arc<dyn Source>,
    codec: Codec,
    options: &StreamOptions,
) -> Result<ZstdRead> {
    let frames = zstd::frames(bytes.as_ref()).await?;
    let Some(sizes) = zstd_frame_sizes(bytes, &frames, options).await? else {
        let size = if options.prescan {
            Some(prescan(bytes, codec).await?)
        } else {
            None
        };
        return Ok(ZstdRead::FrontToBack(size));
    };
    if frames.len() > 1 {
        if let Some(source) = FramesSource::new(bytes.clone(), &frames, &sizes) {
            let layout = StreamLayout {
                size: Some(source.size()),
                parallel_frames: Some(source.frames() as u64),
            };
            return Ok(ZstdRead::Frames(Arc::new(source), layout));
        }
    }
    let size = sizes
        .into_iter()
        .try_fold(0u64, u64::checked_add)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Corrupt,
                "zstd: the frames' content sizes overflow",
            )
        })?;
    Ok(ZstdRead::FrontToBack(Some(size)))
}

/// The content size of each zstd frame: recorded in the frame headers, or measured in
/// parallel with a prescan. `None`: a single frame to prescan, or frames read front to
/// back whose total is learned at the end.
async fn zstd_frame_sizes(
    bytes: &Arc<dyn Source>,
    frames: &[zstd::Frame],
    options: &StreamOptions,
) -> Result<Option<Vec<u64>>> {
    let recorded: Option<Vec<u64>> = frames.iter().map(|f| f.content_size).collect();
    match recorded {
        Some(sizes) => Ok(Some(sizes)),
        None if options.prescan && frames.len() > 1 => {
            tracing::info!(
                source = %bytes.describe(),
                frames = frames.len(),
                "prescan: measuring the zstd frames in parallel"
            );
            parallel::measure(bytes, frames).await
        }
        None => Ok(None),
    }
}

/// The size of a stream read front to back whose size is not read from the stream: the
/// caller's, a prescan's, or None: learned at the end.
async fn unrecorded_size(
    bytes: &Arc<dyn Source>,
    codec: Codec,
    options: &StreamOptions,
) -> Result<Option<u64>> {
    match options.size {
        Some(size) => Ok(Some(size)),
        None if options.prescan => Ok(Some(prescan(bytes, codec).await?)),
        None => Ok(None),
    }
}
