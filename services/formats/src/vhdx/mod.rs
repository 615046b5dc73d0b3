//! VHDX images (Hyper-V), fixed and dynamic, read through [`MappedSource`].
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
//! zeroes. Differencing images (a parent locator, partially present blocks) are refused.

mod crc;
pub mod header;

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Result, Source};

use crate::mapped::{corrupt, le64, read_meta, BlockMap, MappedSource, Place};
pub use header::{Layout, MAX_BAT_BYTES};

#[derive(Debug)]
struct BatMap {
    block_size: u64,
    chunk_ratio: u64,
    bat: Vec<u64>,
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
        let at = index + index / self.chunk_ratio;
        let Some(&entry) = self.bat.get(at as usize) else {
            return Err(corrupt(format!("VHDX block {index} is past the BAT")));
        };
        match entry & 7 {
            PAYLOAD_NOT_PRESENT | PAYLOAD_UNDEFINED | PAYLOAD_ZERO | PAYLOAD_UNMAPPED => {
                Ok(Place::Zero)
            }
            PAYLOAD_FULLY_PRESENT => {
                let offset = (entry >> 20) << 20;
                if offset == 0 {
                    return Err(corrupt(format!(
                        "VHDX block {index} is present at file offset 0"
                    )));
                }
                Ok(Place::Data(offset))
            }
            PAYLOAD_PARTIALLY_PRESENT => Err(corrupt(format!(
                "VHDX block {index} is partially present, which only a differencing image may be"
            ))),
            state => Err(corrupt(format!(
                "VHDX block {index} has unknown state {state}"
            ))),
        }
    }
}

/// Opens the VHDX image in `file`.
pub async fn open_vhdx(file: Arc<dyn Source>) -> Result<(Arc<dyn Source>, Layout)> {
    let layout = header::read_layout(file.as_ref()).await?;
    let raw = read_meta(
        file.as_ref(),
        layout.bat_offset,
        layout.bat_entries * 8,
        "VHDX BAT",
    )
    .await?;
    let bat = raw.chunks_exact(8).map(|c| le64(c, 0)).collect();
    let map = BatMap {
        block_size: layout.block_size,
        chunk_ratio: layout.chunk_ratio,
        bat,
    };
    let size = layout.virtual_size;
    Ok((
        Arc::new(MappedSource::new(file, Arc::new(map), size)),
        layout,
    ))
}
