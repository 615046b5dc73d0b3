//! VHDX images (Hyper-V), fixed and dynamic, read through [`MappedSource`], and
//! differencing, read over their parent through [`crate::diff`].
//!
//! Layout (MS-VHDX): a file identifier (`vhdxfile`) at 0, two headers at 64 KiB and
//! 128 KiB (the valid one with the higher sequence number is current), two copies of a
//! region table at 192 KiB and 256 KiB that locate the block allocation table (BAT) and
//! the metadata region, the metadata (block size, virtual size, sector size, whether the
//! disk has a parent) and the log. Every structure carries a CRC-32C, checked here.
//!
//! The log makes metadata updates crash-safe; a log with entries that were never applied
//! (the writer crashed) must be replayed before the BAT can be trusted. Ferry never
//! writes to a source, so it refuses such an image with an error that says so, rather
//! than replaying in memory or reading stale tables.
//!
//! The BAT interleaves payload block entries with sector bitmap entries (one per "chunk"
//! of payload blocks); a payload entry is a state and a file offset in MiB. Fully
//! present blocks are data; not present, undefined, zero and unmapped blocks read as
//! zeroes. In a differencing image (the file parameters' has-parent bit) not present
//! blocks are the parent's (the others read as zeroes as in a dynamic image), and a
//! partially present block holds the sectors its chunk's sector bitmap block marks (one
//! bit per logical sector, least significant bit first). The parent is named by the parent locator's `relative_path`
//! and `absolute_win32_path` and recognised by `parent_linkage`: its DataWriteGuid.

mod crc;
pub mod header;

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Result, Source};

use crate::diff::{
    parse_guid, Bitmap, DiffMap, DiffPlace, Differencing, Identity, Opened, ParentRef,
};
use crate::mapped::{corrupt, le64, read_meta, BlockMap, MappedSource, Place};
use crate::qcow2::cache::L2Cache;
pub use header::{Layout, MAX_BAT_BYTES};

/// Bytes of sector bitmaps a differencing image keeps.
const BITMAP_CACHE_BYTES: usize = 4 << 20;
/// A sector bitmap block entry's state when the block is in the file.
const SB_BLOCK_PRESENT: u64 = 6;

#[derive(Debug)]
struct BatMap {
    block_size: u64,
    chunk_ratio: u64,
    bat: Vec<u64>,
}

impl BatMap {
    /// The payload entry of block `index` (past the sector bitmap entries before it).
    fn entry(&self, index: u64) -> Result<u64> {
        let at = index + index / self.chunk_ratio;
        self.bat
            .get(at as usize)
            .copied()
            .ok_or_else(|| corrupt(format!("VHDX block {index} is past the BAT")))
    }
}

const PAYLOAD_NOT_PRESENT: u64 = 0;
const PAYLOAD_UNDEFINED: u64 = 1;
const PAYLOAD_ZERO: u64 = 2;
const PAYLOAD_UNMAPPED: u64 = 3;
const PAYLOAD_FULLY_PRESENT: u64 = 6;
const PAYLOAD_PARTIALLY_PRESENT: u64 = 7;

#[async_trait]
impl BlockMap for BatMap {
    fn block_size(&self) -> u64 {
        self.block_size
    }

    async fn lookup(&self, _file: &dyn Source, index: u64) -> Result<Place> {
        let entry = self.entry(index)?;
        match entry & 7 {
            PAYLOAD_NOT_PRESENT | PAYLOAD_UNDEFINED | PAYLOAD_ZERO | PAYLOAD_UNMAPPED => {
                Ok(Place::Zero)
            }
            PAYLOAD_FULLY_PRESENT => Ok(Place::Data(block_offset(entry, "block", index)?)),
            PAYLOAD_PARTIALLY_PRESENT => Err(corrupt(format!(
                "VHDX block {index} is partially present, which only a differencing image may be"
            ))),
            state => Err(corrupt(format!(
                "VHDX block {index} has unknown state {state}"
            ))),
        }
    }
}

/// A payload entry's file offset (its upper bits, in MiB), never 0 (the file identifier).
fn block_offset(entry: u64, what: &str, index: u64) -> Result<u64> {
    let offset = (entry >> 20) << 20;
    if offset == 0 {
        return Err(corrupt(format!(
            "VHDX {what} {index} is present at file offset 0"
        )));
    }
    Ok(offset)
}

/// A differencing VHDX's BAT, and the sector bitmaps of its partially present blocks.
#[derive(Debug)]
struct DiffBatMap {
    table: BatMap,
    sector_size: u64,
    bitmaps: L2Cache<Vec<u8>>,
}

impl DiffBatMap {
    /// Bitmap bytes per payload block.
    fn bitmap_bytes(&self) -> u64 {
        self.table.block_size / self.sector_size / 8
    }
}

#[async_trait]
impl DiffMap for DiffBatMap {
    fn block_size(&self) -> u64 {
        self.table.block_size
    }

    fn sector_size(&self) -> u64 {
        self.sector_size
    }

    async fn lookup(&self, file: &dyn Source, index: u64) -> Result<DiffPlace> {
        let entry = self.table.entry(index)?;
        let ratio = self.table.chunk_ratio;
        match entry & 7 {
            PAYLOAD_NOT_PRESENT => Ok(DiffPlace::Parent),
            // Undefined and unmapped blocks may read as zeroes (MS-VHDX 2.5.1.1); zero
            // blocks must.
            PAYLOAD_UNDEFINED | PAYLOAD_ZERO | PAYLOAD_UNMAPPED => Ok(DiffPlace::Zero),
            PAYLOAD_FULLY_PRESENT => Ok(DiffPlace::Data(block_offset(entry, "block", index)?)),
            PAYLOAD_PARTIALLY_PRESENT => {
                let host = block_offset(entry, "block", index)?;
                let chunk = index / ratio;
                let sb_at = chunk * (ratio + 1) + ratio;
                let sb = self.table.bat.get(sb_at as usize).copied().unwrap_or(0);
                if sb & 7 != SB_BLOCK_PRESENT {
                    return Err(corrupt(format!(
                        "VHDX block {index} is partially present but the sector bitmap \
                         block of its chunk is not"
                    )));
                }
                let len = self.bitmap_bytes();
                let from = block_offset(sb, "sector bitmap block", chunk)? + (index % ratio) * len;
                let bytes = match self.bitmaps.get(from) {
                    Some(bytes) => bytes,
                    None => {
                        let raw = read_meta(file, from, len, "VHDX sector bitmap").await?;
                        let bytes = Arc::new(raw.to_vec());
                        self.bitmaps.insert(from, bytes.clone());
                        bytes
                    }
                };
                Ok(DiffPlace::Partial {
                    host,
                    bitmap: Bitmap {
                        bytes,
                        msb_first: false,
                    },
                })
            }
            state => Err(corrupt(format!(
                "VHDX block {index} has unknown state {state}"
            ))),
        }
    }
}

/// The parent a differencing VHDX's locator names: `relative_path` then
/// `absolute_win32_path`, and `parent_linkage` (or `parent_linkage2`), the DataWriteGuid
/// the parent must have.
fn parent_ref(locator: &[(String, String)]) -> Result<ParentRef> {
    let value = |key: &str| {
        locator
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let mut names = Vec::new();
    for (key, what) in [
        ("relative_path", "relative_path"),
        ("absolute_win32_path", "absolute_win32_path"),
    ] {
        if let Some(v) = value(key).filter(|v| !v.is_empty()) {
            names.push((what, v));
        }
    }
    let linkage = value("parent_linkage")
        .ok_or_else(|| corrupt("the differencing VHDX's parent locator has no parent_linkage"))?;
    let mut guids = vec![parse_guid(&linkage)
        .ok_or_else(|| corrupt(format!("the VHDX parent_linkage {linkage:?} is not a GUID")))?];
    guids.extend(value("parent_linkage2").and_then(|v| parse_guid(&v)));
    Ok(ParentRef {
        names,
        identity: Identity::VhdxDataWriteGuid(guids),
    })
}

/// Opens the VHDX image in `file`.
pub async fn open_vhdx(file: Arc<dyn Source>) -> Result<(Opened, Layout)> {
    let (layout, locator) = header::read_layout(file.as_ref()).await?;
    let raw = read_meta(
        file.as_ref(),
        layout.bat_offset,
        layout.bat_entries * 8,
        "VHDX BAT",
    )
    .await?;
    let bat = raw.chunks_exact(8).map(|c| le64(c, 0)).collect();
    let size = layout.virtual_size;
    let map = BatMap {
        block_size: layout.block_size,
        chunk_ratio: layout.chunk_ratio,
        bat,
    };
    if layout.has_parent {
        let parent = parent_ref(&locator)?;
        let sector_size = u64::from(layout.logical_sector_size);
        let map = DiffBatMap {
            table: map,
            sector_size,
            bitmaps: L2Cache::new(
                (layout.block_size / sector_size / 8) as usize,
                BITMAP_CACHE_BYTES,
            ),
        };
        let diff = Differencing::new(file, Arc::new(map), size, parent);
        return Ok((Opened::Differencing(diff), layout));
    }
    let image = Arc::new(MappedSource::new(file, Arc::new(map), size));
    Ok((Opened::Image(image), layout))
}
