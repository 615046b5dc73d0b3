//! The image format fuzz targets: `qcow2_image` opens the input as a qcow2 file and reads
//! its map and some of its bytes; `compressed_stream` opens the input as a gz, xz or zst
//! image (the first byte picks which, and whether a size is given) and reads it. Garbage
//! must be an error, never a panic, a hang or an allocation beyond the readers' bounds.

use std::sync::Arc;

use ferry_core::{IoBuf, Source};
use ferry_formats::{open_image, open_stream, Backing, Detected, OpenOptions, SourceFormat};
use ferry_formats::{Qcow2Options, StreamOptions};
use ferry_testkit::MemSource;

/// Most guest bytes a driver reads (or maps) per input.
const READ_LIMIT: u64 = 1 << 20;
/// Bytes per read.
const REQUEST: u64 = 64 << 10;

fn runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()
}

/// Maps and reads up to [`READ_LIMIT`] bytes from the start of `image`, then from its end.
async fn exercise(image: &dyn Source) {
    let size = image.size();
    let head = size.min(READ_LIMIT / 2);
    let mut offset = 0;
    while offset < head {
        let Ok(extents) = image.extents(offset, head - offset).await else {
            break;
        };
        let Some(last) = extents.last() else { break };
        if last.end() <= offset {
            break;
        }
        offset = last.end();
    }
    let tail_start = size.saturating_sub(READ_LIMIT / 2).max(head);
    for range in [(0, head), (tail_start, size)] {
        let mut offset = range.0;
        while offset < range.1 {
            let len = REQUEST.min(range.1 - offset);
            if image
                .read_at(offset, IoBuf::new(len as usize))
                .await
                .is_err()
            {
                break;
            }
            offset += len;
        }
    }
}

/// The input as a qcow2 image file (a backing file name is recorded, never opened).
pub fn qcow2_image(data: &[u8]) {
    let Some(rt) = runtime() else { return };
    rt.block_on(async {
        let bytes: Arc<dyn Source> = Arc::new(MemSource::new(data.to_vec()));
        let options = OpenOptions {
            format: SourceFormat::Qcow2,
            qcow2: Qcow2Options {
                l2_cache_bytes: 1 << 20,
            },
            backing: Backing::NameOnly,
            ..OpenOptions::default()
        };
        if let Ok((image, _)) = open_image(bytes, &options).await {
            exercise(image.as_ref()).await;
        }
    });
}

/// The input after its first byte as a compressed image: bits 0-1 pick gz, xz or zst
/// (3: detect by magic), bit 2 gives a size of up to 1 MiB (from the next two bytes) as
/// `--source-size` would; the rest is the stream.
pub fn compressed_stream(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (size, stream) = if mode & 4 != 0 && rest.len() >= 2 {
        let size = u64::from(u16::from_le_bytes([rest[0], rest[1]])) * 16;
        (Some(size), &rest[2..])
    } else {
        (None, rest)
    };
    let kind = match mode & 3 {
        0 => Detected::Gzip,
        1 => Detected::Xz,
        2 => Detected::Zstd,
        _ => ferry_formats::detect(stream),
    };
    if !kind.is_compressed_stream() {
        return;
    }
    let Some(rt) = runtime() else { return };
    rt.block_on(async {
        let bytes: Arc<dyn Source> = Arc::new(MemSource::new(stream.to_vec()));
        let options = StreamOptions {
            size,
            prescan: false,
        };
        if let Ok((image, _)) = open_stream(bytes, kind, &options).await {
            exercise(image.as_ref()).await;
        }
    });
    // The pure parsers on the same bytes.
    let _ = ferry_formats::stream::xz::parse_index(stream);
    if stream.len() >= 12 {
        let _ = ferry_formats::stream::xz::parse_footer(&stream[stream.len() - 12..]);
    }
    let _ = ferry_formats::stream::zstd::parse_frame_header(stream);
}
