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

pub(crate) fn runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()
}

/// Maps and reads up to [`READ_LIMIT`] bytes from the start of `image`, then from its end.
pub(crate) async fn exercise(image: &dyn Source) {
    if !image.size_known() {
        // A stream whose size shows at its end: read front to back until it ends.
        let mut offset = 0;
        while offset < READ_LIMIT {
            match image.read_some(offset, IoBuf::new(REQUEST as usize)).await {
                Ok(buf) if !buf.is_empty() => offset += buf.len() as u64,
                _ => break,
            }
        }
        return;
    }
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

/// Opens `data` as an image of `format` (extent files and backing files never opened)
/// and exercises it.
fn open_and_exercise(data: &[u8], format: SourceFormat, disk: Option<usize>) {
    let Some(rt) = runtime() else { return };
    rt.block_on(async {
        let bytes: Arc<dyn Source> = Arc::new(MemSource::new(data.to_vec()));
        let options = OpenOptions {
            format,
            backing: Backing::NameOnly,
            disk,
            ..OpenOptions::default()
        };
        if let Ok((image, _)) = open_image(bytes, &options).await {
            exercise(image.as_ref()).await;
        }
    });
}

/// An extent opener that gives every extent file the same bytes.
struct SameBytes(Vec<u8>);

#[async_trait::async_trait]
impl ferry_formats::BackingOpener for SameBytes {
    async fn open_backing(&self, _image: &str, _name: &str) -> ferry_core::Result<Arc<dyn Source>> {
        Ok(Arc::new(MemSource::new(self.0.clone())))
    }
}

/// The input as a VMDK: bit 0 of the first byte set, the rest is a text descriptor
/// (parsed, then opened with every extent file holding the descriptor's own bytes);
/// clear, the rest is a hosted sparse extent (header, footer, grain directories and
/// tables, compressed grains).
pub fn vmdk_image(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        open_and_exercise(rest, SourceFormat::Vmdk, None);
        return;
    }
    let _ = ferry_formats::vmdk::descriptor::parse(rest);
    let Some(rt) = runtime() else { return };
    rt.block_on(async {
        let bytes: Arc<dyn Source> = Arc::new(MemSource::new(rest.to_vec()));
        let options = OpenOptions {
            format: SourceFormat::Vmdk,
            extents: ferry_formats::ExtentFiles(Some(Arc::new(SameBytes(rest.to_vec())))),
            ..OpenOptions::default()
        };
        if let Ok((image, _)) = open_image(bytes, &options).await {
            exercise(image.as_ref()).await;
        }
    });
}

/// The input as a VHD (fixed: the footer at its end; dynamic: footer copy, dynamic
/// header, BAT).
pub fn vhd_image(data: &[u8]) {
    open_and_exercise(data, SourceFormat::Vhd, None);
    if data.len() >= 512 {
        let _ = ferry_formats::vhd::Footer::parse(&data[..512]);
    }
}

/// The input as a VDI (header, block map).
pub fn vdi_image(data: &[u8]) {
    open_and_exercise(data, SourceFormat::Vdi, None);
}

/// The input as an OVA (tar headers, GNU long names, pax records, the OVF, the disk
/// chosen by the first byte).
pub fn ova_image(data: &[u8]) {
    let Some((&disk, rest)) = data.split_first() else {
        return;
    };
    open_and_exercise(rest, SourceFormat::Ova, Some(usize::from(disk % 4)));
}

/// Where [`vhdx_image`] puts the input's pieces: the two headers, the two region tables,
/// then everything else from 512 KiB on.
pub const VHDX_PIECES: [(usize, usize); 4] = [
    (64 << 10, 4096),
    (128 << 10, 4096),
    (192 << 10, 4096),
    (256 << 10, 4096),
];
/// Where the rest of a [`vhdx_image`] input goes.
pub const VHDX_REST: usize = 512 << 10;

/// Lays a [`vhdx_image`] input out as a VHDX file: `vhdxfile`, the four 4 KiB pieces at
/// the headers' and region tables' places (their checksums fixed when `fix` is set, so
/// mutations reach the metadata behind them), the rest at [`VHDX_REST`].
pub fn vhdx_layout(pieces: &[u8], fix: bool) -> Vec<u8> {
    let rest = pieces.get(VHDX_PIECES.len() * 4096..).unwrap_or(&[]);
    let mut file = vec![0u8; VHDX_REST + rest.len()];
    file[..8].copy_from_slice(b"vhdxfile");
    for (i, &(at, len)) in VHDX_PIECES.iter().enumerate() {
        let Some(piece) = pieces.get(i * 4096..(i * 4096 + len).min(pieces.len())) else {
            break;
        };
        file[at..at + piece.len()].copy_from_slice(piece);
        if fix {
            // A header's checksum covers 4 KiB, a region table's 64 KiB.
            let span = if i < 2 { 4096 } else { 64 << 10 };
            file[at + 4..at + 8].fill(0);
            let crc = crc32c::crc32c(&file[at..at + span]);
            file[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        }
    }
    file[VHDX_REST..].copy_from_slice(rest);
    file
}

/// The input as a VHDX: bit 0 of the first byte says whether to fix the checksums, the
/// rest is laid out by [`vhdx_layout`] (headers, region table, log check, metadata, BAT).
pub fn vhdx_image(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let file = vhdx_layout(rest, mode & 1 != 0);
    open_and_exercise(&file, SourceFormat::Vhdx, None);
    let _ = ferry_formats::vhdx::header::Metadata::parse(rest);
    let _ = ferry_formats::vhdx::header::parent_locator(rest);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seeds;

    /// Opens `input` as `format`, as the drivers lay it out, and reads it all.
    fn opens(input: &[u8], format: SourceFormat, disk: Option<usize>) -> Vec<u8> {
        let rt = runtime().unwrap();
        rt.block_on(async {
            let bytes: Arc<dyn Source> = Arc::new(MemSource::new(input.to_vec()));
            let options = OpenOptions {
                format,
                disk,
                // A differencing seed reads its parent's sectors as zeroes.
                backing: Backing::NameOnly,
                ..OpenOptions::default()
            };
            let (image, _) = open_image(bytes, &options).await.unwrap();
            let buf = image
                .read_at(0, IoBuf::new(image.size().min(1 << 16) as usize))
                .await
                .unwrap();
            buf.to_vec()
        })
    }

    /// The seeds are valid images, so mutations start deep in each reader.
    #[test]
    fn the_vm_format_seeds_open_and_read() {
        let vdi = opens(&seeds::vdi_bytes(), SourceFormat::Vdi, None);
        assert_eq!(vdi.len(), 2048);
        assert!(vdi[512..1024].iter().all(|&b| b == 0));
        for s in seeds::vhd_image() {
            assert_eq!(
                opens(&s.bytes, SourceFormat::Vhd, None).len(),
                8192,
                "{}",
                s.name
            );
        }
        let diff = opens(&seeds::vhd_differencing(), SourceFormat::Vhd, None);
        assert!(diff[..4096].iter().all(|&b| b == 0));
        assert!(diff[4096..4608].iter().all(|&b| b == 0x5a));
        assert!(diff[4608..5120].iter().all(|&b| b == 0));
        assert!(diff[5120..5632].iter().all(|&b| b == 0x5a));
        let vmdk = seeds::vmdk_image();
        let sparse = opens(&vmdk[0].bytes[1..], SourceFormat::Vmdk, None);
        assert!(sparse[..512].iter().all(|&b| b == 0x71));
        assert!(sparse[3072..3584].iter().all(|&b| b == 0x83));
        let stream = opens(&vmdk[1].bytes[1..], SourceFormat::Vmdk, None);
        assert!(stream[..512].iter().all(|&b| b == 0x5a));
        assert!(stream[2560..3072].iter().all(|&b| b == 0xa5));
        for s in seeds::ova_image() {
            let disk = Some(usize::from(s.bytes[0]));
            assert_eq!(
                opens(&s.bytes[1..], SourceFormat::Ova, disk).len(),
                if s.name == "one" { 2048 } else { 1024 }
            );
        }
        for s in seeds::vhdx_image() {
            let file = vhdx_layout(&s.bytes[1..], s.bytes[0] & 1 != 0);
            let data = opens(&file, SourceFormat::Vhdx, None);
            assert_eq!(data.len(), 1 << 16, "{}", s.name);
        }
        assert!(ferry_formats::vmdk::descriptor::parse(&vmdk[2].bytes[1..]).is_ok());
        assert!(ferry_formats::vmdk::descriptor::parse(&vmdk[3].bytes[1..]).is_ok());
    }
}
