//! Compressed streams made in memory by the encoders, read through `open_image` as the
//! engine reads them: in order, skipping forward, going back (a restart), in parallel for
//! frames; sizes from the xz index and zstd headers; and every way a stream can be wrong.

use std::io::Write;
use std::sync::Arc;

use ferry_core::{ErrorKind, IoBuf, Source};
use ferry_formats::{open_image, Detected, ImageInfo, OpenOptions, SourceFormat, StreamOptions};
use ferry_testkit::MemSource;

const MIB: usize = 1 << 20;

/// 5 MiB: counters, zeroes, text (compressible, not trivially).
fn image() -> Vec<u8> {
    let mut data: Vec<u8> = (0..2 * MIB as u32).map(|i| (i / 7 % 253) as u8).collect();
    data.extend(std::iter::repeat_n(0u8, 2 * MIB));
    data.extend(b"ferry ".repeat(MIB / 6 + 1).into_iter().take(MIB));
    data
}

fn gzip(d: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(d).unwrap();
    e.finish().unwrap()
}

fn xz(d: &[u8]) -> Vec<u8> {
    let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
    e.write_all(d).unwrap();
    e.finish().unwrap()
}

/// xz in blocks of `block` bytes (as `xz -T2` writes).
fn xz_blocks(d: &[u8], block: u64) -> Vec<u8> {
    let stream = liblzma::stream::MtStreamBuilder::new()
        .threads(2)
        .block_size(block)
        .preset(1)
        .encoder()
        .unwrap();
    let mut e = liblzma::write::XzEncoder::new_stream(Vec::new(), stream);
    e.write_all(d).unwrap();
    e.finish().unwrap()
}

fn zst(d: &[u8]) -> Vec<u8> {
    zstd::bulk::compress(d, 3).unwrap()
}

/// zstd as from a pipe (and as pzstd writes each frame): no content size in the header.
fn zst_piped(d: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut e = zstd::stream::write::Encoder::new(&mut out, 3).unwrap();
    e.write_all(d).unwrap();
    e.finish().unwrap();
    out
}

/// Frames of `frame` bytes each, behind pzstd's skippable size hints when `hints`,
/// recording their size when `sized`.
fn zst_frames(d: &[u8], frame: usize, hints: bool, sized: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for part in d.chunks(frame) {
        let f = if sized { zst(part) } else { zst_piped(part) };
        if hints {
            out.extend_from_slice(&0x184d_2a50u32.to_le_bytes());
            out.extend_from_slice(&4u32.to_le_bytes());
            out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        }
        out.extend_from_slice(&f);
    }
    out
}

async fn open(
    bytes: Vec<u8>,
    format: SourceFormat,
    size: Option<u64>,
    prescan: bool,
) -> ferry_core::Result<(Arc<dyn Source>, ImageInfo)> {
    let options = OpenOptions {
        format,
        stream: StreamOptions { size, prescan },
        ..OpenOptions::default()
    };
    open_image(Arc::new(MemSource::new(bytes)), &options).await
}

async fn read(image: &dyn Source, offset: usize, len: usize) -> ferry_core::Result<Vec<u8>> {
    Ok(image
        .read_at(offset as u64, IoBuf::new(len))
        .await?
        .to_vec())
}

/// Reads the whole image front to back in `request`-byte reads.
async fn read_all(image: &dyn Source, request: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let size = image.size() as usize;
    while out.len() < size {
        let n = request.min(size - out.len());
        out.extend(read(image, out.len(), n).await.unwrap());
    }
    out
}

#[tokio::test]
async fn each_format_reads_back_the_image() {
    let data = image();
    let cases = [
        (xz(&data), Detected::Xz, None),
        (zst(&data), Detected::Zstd, None),
        (gzip(&data), Detected::Gzip, Some(data.len() as u64)),
    ];
    for (bytes, kind, size) in cases {
        let compressed = bytes.len() as u64;
        let (image, info) = open(bytes, SourceFormat::Auto, size, false).await.unwrap();
        assert_eq!(info.format, kind);
        assert_eq!(info.virtual_size, data.len() as u64);
        assert_eq!(info.file_size, compressed);
        assert!(image.caps().sequential_read, "{kind}");
        assert!(read_all(image.as_ref(), 1 << 20).await == data, "{kind}");
    }
}

#[tokio::test]
async fn reads_skip_forward_and_restart_behind() {
    let data = image();
    let (image, _) = open(zst(&data), SourceFormat::Zstd, None, false)
        .await
        .unwrap();
    let at = |o: usize, n: usize| data[o..o + n].to_vec();
    assert_eq!(
        read(image.as_ref(), 4096, 100).await.unwrap(),
        at(4096, 100)
    );
    // Forward, across chunks: skipped.
    assert_eq!(
        read(image.as_ref(), 3 * MIB + 5, 70_000).await.unwrap(),
        at(3 * MIB + 5, 70_000)
    );
    // Behind: decompression starts over.
    assert_eq!(read(image.as_ref(), 10, 10).await.unwrap(), at(10, 10));
    // The last bytes: the stream must end there.
    let end = data.len();
    assert_eq!(
        read(image.as_ref(), end - 3, 3).await.unwrap(),
        at(end - 3, 3)
    );
    // A read past the end is refused.
    assert!(read(image.as_ref(), end - 3, 4).await.is_err());
    // Another handle shares the stream.
    let other = image.connect().await.unwrap();
    assert_eq!(read(other.as_ref(), 0, 8).await.unwrap(), at(0, 8));
}

#[tokio::test]
async fn concatenated_members_streams_and_frames() {
    let data = image();
    let (a, b) = data.split_at(3 * MIB + 1);
    let mut two_gz = gzip(a);
    two_gz.extend(gzip(b));
    let mut two_xz = xz(a);
    two_xz.extend([0u8; 8]);
    two_xz.extend(xz(b));
    let mut two_zst = zst(a);
    two_zst.extend(zst(b));
    let size = Some(data.len() as u64);
    for (bytes, size) in [(two_gz, size), (two_xz, None), (two_zst, None)] {
        let (image, info) = open(bytes, SourceFormat::Auto, size, false).await.unwrap();
        assert_eq!(info.virtual_size, data.len() as u64, "{:?}", info.format);
        assert!(
            read_all(image.as_ref(), 300_000).await == data,
            "{:?}",
            info.format
        );
    }
}

#[tokio::test]
async fn a_multi_block_xz_reads_back() {
    let data = image();
    let bytes = xz_blocks(&data, MIB as u64);
    let layout = ferry_formats::stream::xz::layout(&MemSource::new(bytes.clone()))
        .await
        .unwrap();
    assert_eq!(layout.size, data.len() as u64);
    assert_eq!((layout.streams, layout.blocks), (1, 5));
    let (image, _) = open(bytes, SourceFormat::Xz, None, false).await.unwrap();
    assert!(read_all(image.as_ref(), MIB).await == data);
}

#[tokio::test]
async fn independent_frames_are_read_in_parallel_in_any_order() {
    let data = image();
    for (hints, sized) in [(true, true), (false, true), (true, false)] {
        let bytes = zst_frames(&data, MIB, hints, sized);
        if !sized {
            // Without the prescan the frames are read front to back, the size learned
            // at the end.
            let (image, info) = open(bytes.clone(), SourceFormat::Auto, None, false)
                .await
                .unwrap();
            assert!(!info.size_known() && info.parallel_frames.is_none());
            assert!(read_stream(image.as_ref(), MIB).await == data);
        }
        let (image, info) = open(bytes, SourceFormat::Auto, None, !sized).await.unwrap();
        assert_eq!(
            info.parallel_frames,
            Some(5),
            "hints {hints}, sized {sized}"
        );
        assert!(!image.caps().sequential_read);
        assert_eq!(image.size(), data.len() as u64);
        let reads = [(4 * MIB + 7, 1000), (10, MIB + 20), (MIB - 3, 2 * MIB + 6)];
        let results = futures::future::join_all(reads.iter().map(|&(o, n)| {
            let image = image.clone();
            async move { read(image.as_ref(), o, n).await.unwrap() }
        }))
        .await;
        for (&(o, n), got) in reads.iter().zip(results) {
            assert!(
                got == data[o..o + n],
                "read {o}+{n}, hints {hints}, sized {sized}"
            );
        }
    }
}

/// Reads a source of unknown size front to back with `read_some` until it comes back
/// short.
async fn read_stream(image: &dyn Source, request: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let buf = image
            .read_some(out.len() as u64, IoBuf::new(request))
            .await
            .unwrap();
        out.extend_from_slice(&buf);
        if buf.len() < request {
            return out;
        }
    }
}

#[tokio::test]
async fn unrecorded_sizes_are_learned_at_the_end_or_given_and_checked() {
    let data = image();
    let (image, info) = open(gzip(&data), SourceFormat::Auto, None, false)
        .await
        .unwrap();
    assert!(!info.size_known() && !image.size_known());
    assert_eq!(image.size(), ferry_core::UNKNOWN_SIZE);
    assert!(read_stream(image.as_ref(), MIB).await == data);
    // A read past the end of a stream of unknown size is short, then empty.
    let tail = image
        .read_some(data.len() as u64 - 10, IoBuf::new(4096))
        .await
        .unwrap();
    assert_eq!(tail.len(), 10);
    let err = image
        .read_at(data.len() as u64 - 10, IoBuf::new(4096))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    let (image, info) = open(gzip(&data), SourceFormat::Auto, None, true)
        .await
        .unwrap();
    assert_eq!(info.virtual_size, data.len() as u64);
    assert!(image.size_known());
    assert!(read_all(image.as_ref(), MIB).await == data);
    // zstd from a pipe records no size.
    let piped = zst_piped(&data);
    let (image, info) = open(piped.clone(), SourceFormat::Auto, None, false)
        .await
        .unwrap();
    assert!(!info.size_known());
    assert!(read_stream(image.as_ref(), 100_000).await == data);
    let (image, _) = open(piped, SourceFormat::Auto, Some(data.len() as u64), false)
        .await
        .unwrap();
    assert!(read_all(image.as_ref(), MIB).await == data);
    // A size that disagrees with the index.
    let err = open(xz(&data), SourceFormat::Auto, Some(7), false)
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("disagrees"), "{err}");
}

#[tokio::test]
async fn a_bomb_is_bounded_by_the_size_given() {
    // 256 MiB of zeroes in a few KiB of gzip, given as 1 MiB.
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; MIB];
    for _ in 0..256 {
        e.write_all(&zeros).unwrap();
    }
    let bomb = e.finish().unwrap();
    assert!(bomb.len() < 400_000);
    let (image, _) = open(bomb, SourceFormat::Gzip, Some(MIB as u64), false)
        .await
        .unwrap();
    let err = read(image.as_ref(), 0, MIB).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(err.to_string().contains("more than"), "{err}");
}

#[tokio::test]
async fn broken_streams_are_errors() {
    let data = image();
    // Truncated zstd, its size given: fails when the data runs out.
    let bytes = zst(&data);
    let cut = bytes[..bytes.len() / 2].to_vec();
    let result = match open(cut, SourceFormat::Zstd, Some(data.len() as u64), false).await {
        Ok((image, _)) => read(image.as_ref(), 0, data.len()).await.map(|_| ()),
        Err(e) => Err(e),
    };
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    // xz with a damaged index; with damaged data.
    let bytes = xz(&data);
    let mut bad_index = bytes.clone();
    let n = bad_index.len();
    bad_index[n - 20] ^= 1;
    assert!(open(bad_index, SourceFormat::Xz, None, false)
        .await
        .is_err());
    let mut bad_data = bytes.clone();
    bad_data[100] ^= 0x40;
    let result = match open(bad_data, SourceFormat::Xz, None, false).await {
        Ok((image, _)) => read(image.as_ref(), 0, data.len()).await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Corrupt);
    // Garbage after a zstd frame.
    let mut trailing = zst(&data);
    trailing.extend(b"garbage!");
    assert!(open(trailing, SourceFormat::Zstd, None, false)
        .await
        .is_err());
    // A forced format that is not the stream's.
    let err = open(zst(&data), SourceFormat::Gzip, Some(1), false)
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("not gz"), "{err}");
    // qcow2 inside a stream.
    let mut qcow2 = b"QFI\xfb\0\0\0\x03".to_vec();
    qcow2.resize(MIB, 0);
    let err = open(gzip(&qcow2), SourceFormat::Auto, Some(MIB as u64), false)
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("qcow2 inside"), "{err}");
}
