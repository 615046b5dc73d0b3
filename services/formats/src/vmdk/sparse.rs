//! A VMDK hosted sparse extent (`KDMV`): monolithicSparse, twoGbMaxExtentSparse's pieces
//! and streamOptimized.
//!
//! The header names a grain size (usually 64 KiB), a grain directory (GD) of sector
//! numbers of grain tables (GTs), and each GT holds one sector number per grain: 0 for a
//! grain never written, 1 for a grain marked zero, anything else where the grain is. The
//! GD is loaded at open (bounded); GTs go through a byte-bounded LRU cache. When the
//! header says a redundant GD is kept (qemu and VMware keep one for monolithicSparse),
//! each GT is checked against its redundant copy as it is loaded, and a difference fails
//! as `corrupt` rather than guessing which copy is right.
//!
//! A streamOptimized extent has compressed grains (each prefixed by its LBA and length)
//! and puts its GD at the end, described by a footer three sectors before the end of the
//! file; it is read through those tables, so any grain can be read in any order.

use std::cell::RefCell;
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Error, Result, Source};

use crate::mapped::{
    corrupt, le32, le64, read_meta, read_meta_into, BlockMap, MappedSource, Place,
};
use crate::qcow2::cache::L2Cache;

/// `KDMV`, little-endian.
pub const MAGIC: u32 = 0x564d_444b;
/// The header's gdOffset when the GD is described by the footer.
const GD_AT_END: u64 = u64::MAX;
const FLAG_RGD: u32 = 1 << 1;
const FLAG_COMPRESSED: u32 = 1 << 16;
const FLAG_MARKERS: u32 = 1 << 17;
const MARKER_EOS: u32 = 0;
const MARKER_FOOTER: u32 = 3;
/// Largest grain accepted (sectors): 32 MiB.
const MAX_GRAIN_SECTORS: u64 = 1 << 16;
/// Largest GD loaded.
pub const MAX_GD_BYTES: u64 = 64 << 20;
/// Bytes of GTs kept in memory per extent.
const GT_CACHE_BYTES: usize = 16 << 20;

/// A validated sparse extent header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparseHeader {
    pub version: u32,
    pub flags: u32,
    /// Guest size in sectors.
    pub capacity: u64,
    /// Grain size in sectors.
    pub grain_sectors: u64,
    pub descriptor_offset: u64,
    pub descriptor_size: u64,
    pub gtes_per_gt: u32,
    pub rgd_offset: u64,
    pub gd_offset: u64,
    pub compress_algorithm: u16,
}

impl SparseHeader {
    /// Parses and bounds the 512-byte header in `b` (magic included).
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < 512 || le32(b, 0) != MAGIC {
            return Err(corrupt(
                "not a VMDK sparse extent: the KDMV magic is missing",
            ));
        }
        let h = Self {
            version: le32(b, 4),
            flags: le32(b, 8),
            capacity: le64(b, 12),
            grain_sectors: le64(b, 20),
            descriptor_offset: le64(b, 28),
            descriptor_size: le64(b, 36),
            gtes_per_gt: le32(b, 44),
            rgd_offset: le64(b, 48),
            gd_offset: le64(b, 56),
            compress_algorithm: u16::from_le_bytes([b[77], b[78]]),
        };
        if !(1..=3).contains(&h.version) {
            return Err(Error::unsupported(format!(
                "VMDK sparse extent version {} is not supported",
                h.version
            )));
        }
        if h.grain_sectors == 0 || h.grain_sectors > MAX_GRAIN_SECTORS {
            return Err(corrupt(format!(
                "VMDK grain size {} sectors is not supported",
                h.grain_sectors
            )));
        }
        if h.gtes_per_gt == 0 || h.gtes_per_gt > 65536 {
            return Err(corrupt(format!(
                "VMDK grain tables of {} entries are not supported",
                h.gtes_per_gt
            )));
        }
        if h.capacity > (u64::MAX >> 10) {
            return Err(corrupt(format!(
                "VMDK capacity {} sectors overflows",
                h.capacity
            )));
        }
        if h.compressed() && h.compress_algorithm != 1 {
            return Err(Error::unsupported(format!(
                "VMDK compression algorithm {} is not supported (only deflate)",
                h.compress_algorithm
            )));
        }
        Ok(h)
    }

    pub fn compressed(&self) -> bool {
        self.flags & FLAG_COMPRESSED != 0
    }

    fn markers(&self) -> bool {
        self.flags & FLAG_MARKERS != 0
    }

    fn grain_bytes(&self) -> u64 {
        self.grain_sectors * 512
    }

    /// Guest bytes one GT maps.
    fn gt_coverage(&self) -> u64 {
        self.grain_bytes() * u64::from(self.gtes_per_gt)
    }

    /// Entries of the GD.
    fn gd_entries(&self) -> u64 {
        (self.capacity * 512).div_ceil(self.gt_coverage())
    }
}

/// Reads the header of the sparse extent in `file`, following a streamOptimized
/// extent's footer when the header defers to it.
pub async fn read_header(file: &dyn Source) -> Result<SparseHeader> {
    let head = read_meta(file, 0, 512, "VMDK sparse header").await?;
    let header = SparseHeader::parse(&head)?;
    if header.gd_offset != GD_AT_END {
        return Ok(header);
    }
    let size = file.size();
    if size < 1536 + 512 {
        return Err(corrupt(
            "the streamOptimized VMDK has no footer: the file is truncated",
        ));
    }
    let tail = read_meta(file, size - 1536, 1536, "VMDK footer").await?;
    if le32(&tail, 12) != MARKER_FOOTER || le32(&tail, 1024 + 12) != MARKER_EOS {
        return Err(corrupt(
            "the streamOptimized VMDK does not end with a footer and an end-of-stream \
             marker: the file is truncated, or was written without grain tables (not \
             supported)",
        ));
    }
    let footer = SparseHeader::parse(&tail[512..1024])?;
    if footer.gd_offset == GD_AT_END {
        return Err(corrupt(
            "the VMDK footer does not say where the grain directory is",
        ));
    }
    Ok(footer)
}

#[derive(Debug)]
struct SparseMap {
    header: SparseHeader,
    gd: Vec<u32>,
    rgd: Option<Vec<u32>>,
    cache: L2Cache,
    window: GrainWindow,
}

/// Bytes of a streamOptimized extent read at once for the compressed grains ahead.
const READ_AHEAD: u64 = 1 << 20;

/// The last read-ahead window of compressed grains, per thread (the engine's workers read
/// different parts of the image at once), tagged with the map it belongs to.
#[derive(Debug)]
struct GrainWindow {
    id: u64,
}

type Window = Option<(u64, u64, ferry_core::IoBuf)>;

thread_local! {
    static WINDOW: RefCell<Window> = const { RefCell::new(None) };
}

impl GrainWindow {
    fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Inflates the grain at file `offset` from this thread's window when the window
    /// holds its marker and all its bytes, and its length is plausible (at most
    /// `max_size`; otherwise the caller reads it and fails).
    fn inflate_cached(&self, offset: u64, max_size: u64, out: &mut [u8]) -> Option<Result<()>> {
        WINDOW.with(|w| {
            let w = w.borrow();
            let (id, start, bytes) = w.as_ref()?;
            let end = *start + bytes.len() as u64;
            if *id != self.id || offset < *start || offset + 12 > end {
                return None;
            }
            let at = (offset - start) as usize;
            let size = u64::from(le32(bytes, at + 8));
            let grain_end = offset.checked_add(12 + size)?;
            if size == 0 || size > max_size || grain_end > end {
                return None;
            }
            Some(inflate_grain(&bytes[at + 12..at + 12 + size as usize], out))
        })
    }

    fn keep(&self, start: u64, bytes: ferry_core::IoBuf) {
        WINDOW.with(|w| *w.borrow_mut() = Some((self.id, start, bytes)));
    }

    /// This thread's window buffer, taken to read the next window into (whichever map
    /// it served).
    fn spare() -> Option<ferry_core::IoBuf> {
        WINDOW.with(|w| w.borrow_mut().take().map(|(_, _, bytes)| bytes))
    }
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(4).map(|c| le32(c, 0)).collect()
}

impl SparseMap {
    async fn load_gd(file: &dyn Source, header: &SparseHeader, offset: u64) -> Result<Vec<u32>> {
        let bytes = header.gd_entries() * 4;
        if bytes > MAX_GD_BYTES {
            return Err(Error::unsupported(format!(
                "the VMDK grain directory is {bytes} bytes, more than the {MAX_GD_BYTES} read"
            )));
        }
        let at = offset
            .checked_mul(512)
            .ok_or_else(|| corrupt("the VMDK grain directory offset overflows"))?;
        Ok(words(
            &read_meta(file, at, bytes, "VMDK grain directory").await?,
        ))
    }

    async fn load_gt(file: &dyn Source, header: &SparseHeader, sector: u32) -> Result<Vec<u64>> {
        let bytes = u64::from(header.gtes_per_gt) * 4;
        let raw = read_meta(file, u64::from(sector) * 512, bytes, "VMDK grain table").await?;
        Ok(raw.chunks_exact(4).map(|c| u64::from(le32(c, 0))).collect())
    }

    async fn table(&self, file: &dyn Source, gd_index: usize) -> Result<Option<Arc<Vec<u64>>>> {
        let sector = self.gd.get(gd_index).copied().unwrap_or(0);
        let redundant = self
            .rgd
            .as_ref()
            .map(|r| r.get(gd_index).copied().unwrap_or(0));
        if let Some(r) = redundant {
            if (r == 0) != (sector == 0) {
                return Err(corrupt(format!(
                    "VMDK grain directory entry {gd_index} ({sector}) and its redundant copy \
                     ({r}) disagree"
                )));
            }
        }
        if sector == 0 {
            return Ok(None);
        }
        if let Some(table) = self.cache.get(u64::from(sector)) {
            return Ok(Some(table));
        }
        let table = Self::load_gt(file, &self.header, sector).await?;
        if let Some(r) = redundant {
            if Self::load_gt(file, &self.header, r).await? != table {
                return Err(corrupt(format!(
                    "VMDK grain table {gd_index} and its redundant copy disagree: the image \
                     is damaged"
                )));
            }
        }
        let table = Arc::new(table);
        self.cache.insert(u64::from(sector), table.clone());
        Ok(Some(table))
    }
}

#[async_trait]
impl BlockMap for SparseMap {
    fn block_size(&self) -> u64 {
        self.header.grain_bytes()
    }

    async fn lookup(&self, file: &dyn Source, index: u64) -> Result<Place> {
        let per = u64::from(self.header.gtes_per_gt);
        let Some(table) = self.table(file, (index / per) as usize).await? else {
            return Ok(Place::Zero);
        };
        let entry = table[(index % per) as usize];
        Ok(match entry {
            0 | 1 => Place::Zero,
            sector if self.header.compressed() => Place::Compressed(sector * 512),
            sector => Place::Data(sector * 512),
        })
    }

    async fn decompress(&self, file: &dyn Source, offset: u64, out: &mut [u8]) -> Result<()> {
        let grain = self.header.grain_bytes();
        let avail = file.size().saturating_sub(offset);
        let past_end = |size: u64| {
            corrupt(format!(
                "the compressed VMDK grain at file offset {offset} ({size} bytes) is past the \
                 end of the image file or larger than two grains"
            ))
        };
        if !self.header.markers() {
            // No length recorded: read as much as a grain can take (qemu's bound).
            let len = (2 * grain).min(avail);
            if len == 0 {
                return Err(past_end(0));
            }
            let bytes = read_meta(file, offset, len, "compressed VMDK grain").await?;
            return inflate_grain(&bytes, out);
        }
        // Deflate expands incompressible data by a few bytes per 64 KiB: a grain and a
        // sector covers nearly every grain in one read; a longer one is read again.
        let first = (grain + 512 + 12).min(avail);
        if first <= 12 {
            return Err(past_end(0));
        }
        // Grains follow each other in the file: one read of the window ahead serves the
        // next ones this thread inflates.
        if let Some(done) = self.window.inflate_cached(offset, 2 * grain, out) {
            return done;
        }
        let ahead = first.max(READ_AHEAD).min(avail);
        let spare = GrainWindow::spare();
        let window = read_meta_into(file, offset, ahead, "compressed VMDK grain", spare).await?;
        let size = u64::from(le32(&window, 8));
        if size == 0 || size > 2 * grain || size + 12 > avail {
            return Err(past_end(size));
        }
        if size + 12 > ahead {
            let bytes = read_meta(file, offset, size + 12, "compressed VMDK grain").await?;
            return inflate_grain(&bytes[12..12 + size as usize], out);
        }
        let result = inflate_grain(&window[12..12 + size as usize], out);
        self.window.keep(offset, window);
        result
    }
}

thread_local! {
    static INFLATE: RefCell<Option<flate2::Decompress>> = const { RefCell::new(None) };
}

/// Inflates one zlib-wrapped grain into `out`, which it must fill exactly (a longer
/// stream stops there: no decompression bomb).
pub fn inflate_grain(input: &[u8], out: &mut [u8]) -> Result<()> {
    INFLATE.with(|cell| {
        let mut cell = cell.borrow_mut();
        let stream = cell.get_or_insert_with(|| flate2::Decompress::new(true));
        stream.reset(true);
        loop {
            let before = stream.total_out();
            let status = stream
                .decompress(
                    &input[stream.total_in() as usize..],
                    &mut out[stream.total_out() as usize..],
                    flate2::FlushDecompress::Finish,
                )
                .map_err(|e| corrupt("a compressed VMDK grain does not inflate").with_source(e))?;
            let done = stream.total_out() as usize;
            if done == out.len() {
                return Ok(());
            }
            if status == flate2::Status::StreamEnd || stream.total_out() == before {
                return Err(corrupt(format!(
                    "a compressed VMDK grain inflates to {done} bytes, not {}",
                    out.len()
                )));
            }
        }
    })
}

/// Opens the sparse extent in `file` as a guest image of `size` bytes (the header's
/// capacity when `None`).
pub async fn open_sparse(
    file: Arc<dyn Source>,
    size: Option<u64>,
) -> Result<(Arc<dyn Source>, SparseHeader)> {
    let header = read_header(file.as_ref()).await?;
    let capacity = header.capacity * 512;
    let size = size.unwrap_or(capacity);
    if size > capacity {
        return Err(corrupt(format!(
            "the VMDK descriptor gives the extent {size} bytes, its header only {capacity}"
        )));
    }
    let gd = SparseMap::load_gd(file.as_ref(), &header, header.gd_offset).await?;
    let rgd = if header.flags & FLAG_RGD != 0 && header.rgd_offset != 0 && !header.compressed() {
        Some(SparseMap::load_gd(file.as_ref(), &header, header.rgd_offset).await?)
    } else {
        None
    };
    let gt_bytes = header.gtes_per_gt as usize * 8;
    let map = SparseMap {
        cache: L2Cache::new(gt_bytes, GT_CACHE_BYTES),
        window: GrainWindow::new(),
        header: header.clone(),
        gd,
        rgd,
    };
    Ok((
        Arc::new(MappedSource::new(file, Arc::new(map), size)),
        header,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::{ErrorKind, IoBuf};
    use ferry_testkit::MemSource;
    use std::io::Write;

    /// A sparse extent of 4 grains of 512 bytes, 2 GTEs per GT: GD at sector 1, RGD at
    /// sector 2, GTs at 3 and 4 (redundant 5, 6); grain 0 at sector 7, grain 1 zero,
    /// grain 3 at sector 8.
    fn image() -> Vec<u8> {
        let mut f = vec![0u8; 9 * 512];
        let put =
            |f: &mut Vec<u8>, at: usize, v: u32| f[at..at + 4].copy_from_slice(&v.to_le_bytes());
        put(&mut f, 0, MAGIC);
        put(&mut f, 4, 1);
        put(&mut f, 8, FLAG_RGD | 1);
        f[12..20].copy_from_slice(&4u64.to_le_bytes());
        f[20..28].copy_from_slice(&1u64.to_le_bytes());
        put(&mut f, 44, 2);
        f[48..56].copy_from_slice(&2u64.to_le_bytes());
        f[56..64].copy_from_slice(&1u64.to_le_bytes());
        for (gd, gts) in [(512, [3, 4]), (1024, [5, 6])] {
            put(&mut f, gd, gts[0]);
            put(&mut f, gd + 4, gts[1]);
            put(&mut f, gts[0] as usize * 512, 7);
            put(&mut f, gts[0] as usize * 512 + 4, 1);
            put(&mut f, gts[1] as usize * 512 + 4, 8);
        }
        f[7 * 512..8 * 512].fill(0x71);
        f[8 * 512..].fill(0x83);
        f
    }

    #[tokio::test]
    async fn reads_grains_through_the_tables() {
        let file: Arc<dyn Source> = Arc::new(MemSource::new(image()));
        let (img, _) = open_sparse(file, None).await.unwrap();
        assert_eq!(img.size(), 2048);
        let buf = img.read_at(0, IoBuf::new(2048)).await.unwrap();
        assert!(buf[..512].iter().all(|&b| b == 0x71));
        assert!(buf[512..1536].iter().all(|&b| b == 0));
        assert!(buf[1536..].iter().all(|&b| b == 0x83));
    }

    #[tokio::test]
    async fn a_redundant_table_that_disagrees_is_corrupt() {
        let mut f = image();
        f[6 * 512 + 4] = 7;
        let file: Arc<dyn Source> = Arc::new(MemSource::new(f));
        let (img, _) = open_sparse(file, None).await.unwrap();
        let err = img.read_at(1536, IoBuf::new(512)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        assert!(err.message().contains("redundant"), "{err}");
    }

    #[test]
    fn inflates_exactly_one_grain() {
        let data = vec![9u8; 4096];
        let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&data).unwrap();
        let z = enc.finish().unwrap();
        let mut out = vec![0u8; 4096];
        inflate_grain(&z, &mut out).unwrap();
        assert_eq!(out, data);
        let mut big = vec![0u8; 8192];
        assert!(inflate_grain(&z, &mut big).is_err());
    }
}
