//! L1 and L2 table entries: what one guest cluster (or subcluster) maps to.

use ferry_core::{Error, ErrorKind, Result};

const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
const L1_RESERVED: u64 = 0x7f00_0000_0000_01ff;
const COMPRESSED: u64 = 1 << 62;
const ZERO_FLAG: u64 = 1;
/// Subclusters per cluster with extended L2 entries.
pub const SUBCLUSTERS: u64 = 32;

pub(crate) fn corrupt(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, message)
}

/// Where one guest range's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Stored uncompressed at this host offset.
    Host(u64),
    /// Reads as zeroes.
    Zero,
    /// Not allocated here: the backing file's bytes, or zeroes without one.
    Unallocated,
    /// A compressed cluster: `len` bytes at host `offset` hold the whole cluster.
    Compressed { offset: u64, len: u64 },
}

/// The L2 table offset an L1 entry names, or `None` when the range is unallocated.
pub fn l1_entry(entry: u64, cluster_size: u64, file_size: u64) -> Result<Option<u64>> {
    if entry & L1_RESERVED != 0 {
        return Err(corrupt(format!(
            "L1 entry {entry:#x} has reserved bits set"
        )));
    }
    let offset = entry & OFFSET_MASK;
    if offset == 0 {
        return Ok(None);
    }
    if !offset.is_multiple_of(cluster_size) {
        return Err(corrupt(format!(
            "L2 table offset {offset} is not cluster aligned"
        )));
    }
    if offset.saturating_add(cluster_size) > file_size {
        return Err(corrupt(format!(
            "L2 table offset {offset} is past the end of the image file ({file_size} bytes)"
        )));
    }
    Ok(Some(offset))
}

/// Decodes a standard L2 entry for a cluster of `1 << cluster_bits` bytes.
pub fn l2_entry(entry: u64, cluster_bits: u32, file_size: u64) -> Result<Place> {
    let cluster_size = 1u64 << cluster_bits;
    if entry & COMPRESSED != 0 {
        return compressed(entry, cluster_bits, file_size);
    }
    if entry & ZERO_FLAG != 0 {
        return Ok(Place::Zero);
    }
    let offset = entry & OFFSET_MASK;
    if offset == 0 {
        return Ok(Place::Unallocated);
    }
    check_data_cluster(offset, cluster_size, file_size)?;
    Ok(Place::Host(offset))
}

fn check_data_cluster(offset: u64, cluster_size: u64, file_size: u64) -> Result<()> {
    if !offset.is_multiple_of(cluster_size) {
        return Err(corrupt(format!(
            "data cluster offset {offset} is not cluster aligned"
        )));
    }
    if offset >= file_size {
        return Err(corrupt(format!(
            "data cluster offset {offset} is past the end of the image file ({file_size} bytes)"
        )));
    }
    Ok(())
}

fn compressed(entry: u64, cluster_bits: u32, file_size: u64) -> Result<Place> {
    let x = 62 - (cluster_bits - 8);
    let offset = entry & ((1u64 << x) - 1);
    let extra_sectors = (entry >> x) & ((1u64 << (cluster_bits - 8)) - 1);
    let len = (extra_sectors + 1) * 512 - (offset & 511);
    if offset >= file_size {
        return Err(corrupt(format!(
            "compressed cluster offset {offset} is past the end of the image file ({file_size} bytes)"
        )));
    }
    Ok(Place::Compressed { offset, len })
}

/// Decodes an extended L2 entry (`entry` and its subcluster `bitmap`) for subcluster
/// `index` (0..32).
pub fn extended_l2_entry(
    entry: u64,
    bitmap: u64,
    index: u64,
    cluster_bits: u32,
    file_size: u64,
) -> Result<Place> {
    let cluster_size = 1u64 << cluster_bits;
    if entry & COMPRESSED != 0 {
        return compressed(entry, cluster_bits, file_size);
    }
    let allocated = (bitmap >> index) & 1 != 0;
    let zero = (bitmap >> (index + SUBCLUSTERS)) & 1 != 0;
    match (allocated, zero) {
        (true, true) => Err(corrupt(format!(
            "subcluster {index} is marked both allocated and zero"
        ))),
        (true, false) => {
            let offset = entry & OFFSET_MASK;
            if offset == 0 {
                return Err(corrupt("an allocated subcluster has no host cluster"));
            }
            check_data_cluster(offset, cluster_size, file_size)?;
            Ok(Place::Host(offset + index * (cluster_size / SUBCLUSTERS)))
        }
        (false, true) => Ok(Place::Zero),
        (false, false) => Ok(Place::Unallocated),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn standard_entries() {
        assert_eq!(l2_entry(0, 16, GIB).unwrap(), Place::Unallocated);
        assert_eq!(l2_entry(1, 16, GIB).unwrap(), Place::Zero);
        assert_eq!(
            l2_entry((1 << 63) | 0x30000, 16, GIB).unwrap(),
            Place::Host(0x30000)
        );
        assert_eq!(l2_entry(0x30000 | 1, 16, GIB).unwrap(), Place::Zero);
    }

    #[test]
    fn data_offset_past_the_end_or_unaligned_is_corrupt() {
        let err = l2_entry(2 * GIB, 16, GIB).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        assert!(err.message().contains("past the end"), "{err}");
        let err = l2_entry(0x30200, 16, GIB).unwrap_err();
        assert!(err.message().contains("aligned"), "{err}");
    }

    #[test]
    fn l1_entries_are_bounded() {
        assert_eq!(l1_entry(0, 65536, GIB).unwrap(), None);
        assert_eq!(
            l1_entry((1 << 63) | 0x50000, 65536, GIB).unwrap(),
            Some(0x50000)
        );
        assert!(l1_entry(GIB, 65536, GIB)
            .unwrap_err()
            .message()
            .contains("past the end"));
        assert!(l1_entry(0x50200, 65536, GIB)
            .unwrap_err()
            .message()
            .contains("aligned"));
        assert!(l1_entry(0x50001, 65536, GIB)
            .unwrap_err()
            .message()
            .contains("reserved"));
    }

    #[test]
    fn compressed_descriptor() {
        // 64 KiB clusters: x = 54; offset 0x12345 with 3 additional sectors.
        let entry = COMPRESSED | (3 << 54) | 0x12345;
        assert_eq!(
            l2_entry(entry, 16, GIB).unwrap(),
            Place::Compressed {
                offset: 0x12345,
                len: 4 * 512 - 0x145
            }
        );
        let past = COMPRESSED | (2 * GIB);
        assert_eq!(
            l2_entry(past, 16, GIB).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
    }

    #[test]
    fn extended_entries() {
        let host = 0x40000u64;
        let bitmap = 0b01 | (0b10 << 32);
        assert_eq!(
            extended_l2_entry(host, bitmap, 0, 16, GIB).unwrap(),
            Place::Host(host)
        );
        assert_eq!(
            extended_l2_entry(host, bitmap, 1, 16, GIB).unwrap(),
            Place::Zero
        );
        assert_eq!(
            extended_l2_entry(host, bitmap, 2, 16, GIB).unwrap(),
            Place::Unallocated
        );
        assert_eq!(
            extended_l2_entry(host, 1 << 5, 5, 16, GIB).unwrap(),
            Place::Host(host + 5 * 2048)
        );
        assert!(extended_l2_entry(host, 1 | (1 << 32), 0, 16, GIB).is_err());
        assert!(extended_l2_entry(0, 1, 0, 16, GIB).is_err());
    }
}
