//! The VHDX headers, region table and metadata: everything needed to find and size the
//! BAT, each piece checksummed and bounded before it is trusted.

use ferry_core::{Error, Result, Source};

use super::crc::crc32c_skipping;
use crate::mapped::{corrupt, le16, le32, le64, read_meta};

/// The file identifier's signature.
pub const FILE_SIGNATURE: &[u8; 8] = b"vhdxfile";
const HEADER_OFFSETS: [u64; 2] = [64 << 10, 128 << 10];
const HEADER_LEN: u64 = 4096;
const REGION_OFFSETS: [u64; 2] = [192 << 10, 256 << 10];
const REGION_LEN: u64 = 64 << 10;
const MAX_REGION_ENTRIES: u32 = 2047;
/// Largest BAT loaded.
pub const MAX_BAT_BYTES: u64 = 256 << 20;
/// Largest log scanned for unapplied entries.
const MAX_LOG_BYTES: u64 = 64 << 20;
const MAX_METADATA_ENTRIES: u16 = 2047;

const BAT_GUID: &str = "2DC27766-F623-4200-9D64-115E9BFD4A08";
const METADATA_GUID: &str = "8B7CA206-4790-4B9A-B8FE-575F050F886E";
const FILE_PARAMETERS: &str = "CAA16737-FA36-4D43-B3B6-33F0AA44E76B";
const VIRTUAL_DISK_SIZE: &str = "2FA54224-CD1B-4876-B211-5DBED83BF4B8";
const LOGICAL_SECTOR_SIZE: &str = "8141BF1D-A96F-4709-BA47-F233A8FAAB5F";
const PARENT_LOCATOR: &str = "A8D35F2D-B30B-454D-ABF7-D3D84834AB0C";
/// The locator type of a VHDX parent.
const VHDX_PARENT_TYPE: &str = "B04AEFB7-D19E-4A81-B789-25B8E9445913";
/// Most key/value pairs of a parent locator.
const MAX_LOCATOR_ENTRIES: u16 = 256;

/// A GUID as VHDX stores it (the first three fields little-endian).
pub fn guid(text: &str) -> [u8; 16] {
    let hex: Vec<u8> = text
        .bytes()
        .filter(|b| *b != b'-')
        .collect::<Vec<_>>()
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap_or("00"), 16).unwrap_or(0))
        .collect();
    let mut g = [0u8; 16];
    g.copy_from_slice(&hex[..16]);
    g[0..4].reverse();
    g[4..6].reverse();
    g[6..8].reverse();
    g
}

/// One of the two headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub sequence: u64,
    /// Changes whenever the guest's data changes: what a child's `parent_linkage` names.
    pub data_write_guid: [u8; 16],
    pub log_guid: [u8; 16],
    pub log_length: u32,
    pub log_offset: u64,
}

impl Header {
    /// Parses a header; `None` when its signature or checksum is wrong (the other copy
    /// may be good).
    pub fn parse(b: &[u8]) -> Option<Self> {
        if b.len() < HEADER_LEN as usize || &b[..4] != b"head" {
            return None;
        }
        if crc32c_skipping(&b[..HEADER_LEN as usize], 4) != le32(b, 4) {
            return None;
        }
        let mut log_guid = [0u8; 16];
        log_guid.copy_from_slice(&b[48..64]);
        let mut data_write_guid = [0u8; 16];
        data_write_guid.copy_from_slice(&b[32..48]);
        Some(Self {
            sequence: le64(b, 8),
            data_write_guid,
            log_guid,
            log_length: le32(b, 68),
            log_offset: le64(b, 72),
        })
    }
}

/// Where the BAT and metadata regions are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Regions {
    pub bat: (u64, u32),
    pub metadata: (u64, u32),
}

impl Regions {
    /// Parses a region table; `None` when its signature or checksum is wrong.
    pub fn parse(b: &[u8]) -> Option<Result<Self>> {
        if b.len() < REGION_LEN as usize || &b[..4] != b"regi" {
            return None;
        }
        if crc32c_skipping(&b[..REGION_LEN as usize], 4) != le32(b, 4) {
            return None;
        }
        Some(Self::entries(b))
    }

    fn entries(b: &[u8]) -> Result<Self> {
        let count = le32(b, 8);
        if count > MAX_REGION_ENTRIES {
            return Err(corrupt(format!(
                "the VHDX region table has {count} entries"
            )));
        }
        let (bat_guid, meta_guid) = (guid(BAT_GUID), guid(METADATA_GUID));
        let (mut bat, mut metadata) = (None, None);
        for i in 0..count as usize {
            let e = &b[16 + i * 32..16 + (i + 1) * 32];
            let place = (le64(e, 16), le32(e, 24));
            if e[..16] == bat_guid {
                bat = Some(place);
            } else if e[..16] == meta_guid {
                metadata = Some(place);
            } else if le32(e, 28) & 1 != 0 {
                return Err(Error::unsupported(
                    "the VHDX has a required region ferry does not know",
                ));
            }
        }
        match (bat, metadata) {
            (Some(bat), Some(metadata)) => Ok(Self { bat, metadata }),
            _ => Err(corrupt(
                "the VHDX region table lacks the BAT or the metadata region",
            )),
        }
    }
}

/// Everything needed to read the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// `fixed` or `dynamic`, as the file parameters say.
    pub subformat: &'static str,
    pub virtual_size: u64,
    pub block_size: u64,
    pub logical_sector_size: u32,
    /// Payload blocks per sector bitmap block.
    pub chunk_ratio: u64,
    pub bat_offset: u64,
    pub bat_entries: u64,
    /// A differencing image (its BAT has a sector bitmap entry for every chunk).
    pub has_parent: bool,
}

/// The metadata items ferry needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metadata {
    pub block_size: u32,
    /// Blocks stay allocated (a fixed VHDX).
    pub leave_allocated: bool,
    pub has_parent: bool,
    pub virtual_size: u64,
    pub logical_sector_size: u32,
}

impl Metadata {
    /// Parses the metadata region `b` (its table and items).
    pub fn parse(b: &[u8]) -> Result<Self> {
        let item = |id: &str, len: usize| metadata_item(b, id, len);
        let missing = |what: &str| corrupt(format!("the VHDX metadata has no {what}"));
        let params = item(FILE_PARAMETERS, 8)?.ok_or_else(|| missing("file parameters"))?;
        let size = item(VIRTUAL_DISK_SIZE, 8)?.ok_or_else(|| missing("virtual disk size"))?;
        let sector = item(LOGICAL_SECTOR_SIZE, 4)?.ok_or_else(|| missing("logical sector size"))?;
        Ok(Self {
            block_size: le32(params, 0),
            leave_allocated: le32(params, 4) & 1 != 0,
            has_parent: le32(params, 4) & 2 != 0,
            virtual_size: le64(size, 0),
            logical_sector_size: le32(sector, 0),
        })
    }

    /// Checks the values and derives the BAT's shape.
    pub fn layout(&self, bat: (u64, u32)) -> Result<Layout> {
        let bs = u64::from(self.block_size);
        if !bs.is_power_of_two() || !((1 << 20)..=(256 << 20)).contains(&bs) {
            return Err(corrupt(format!("VHDX block size {bs} is not valid")));
        }
        let lss = self.logical_sector_size;
        if lss != 512 && lss != 4096 {
            return Err(corrupt(format!(
                "VHDX logical sector size {lss} is not valid"
            )));
        }
        if self.virtual_size > (64 << 40) || !self.virtual_size.is_multiple_of(u64::from(lss)) {
            return Err(corrupt(format!(
                "VHDX virtual size {} is not valid",
                self.virtual_size
            )));
        }
        let chunk_ratio = ((1u64 << 23) * u64::from(lss)) / bs;
        let payload = self.virtual_size.div_ceil(bs);
        let bat_entries = if payload == 0 {
            0
        } else if self.has_parent {
            // Every chunk, the last one too, has its sector bitmap entry.
            payload.div_ceil(chunk_ratio) * (chunk_ratio + 1)
        } else {
            payload + (payload - 1) / chunk_ratio
        };
        let bytes = bat_entries * 8;
        if bytes > u64::from(bat.1) {
            return Err(corrupt(format!(
                "the VHDX BAT region ({} bytes) is smaller than its {bat_entries} entries",
                bat.1
            )));
        }
        if bytes > MAX_BAT_BYTES {
            return Err(Error::unsupported(format!(
                "the VHDX BAT is {bytes} bytes, more than the {MAX_BAT_BYTES} read"
            )));
        }
        Ok(Layout {
            subformat: if self.leave_allocated {
                "fixed"
            } else {
                "dynamic"
            },
            virtual_size: self.virtual_size,
            block_size: bs,
            logical_sector_size: lss,
            chunk_ratio,
            bat_offset: bat.0,
            bat_entries,
            has_parent: self.has_parent,
        })
    }
}

/// The metadata item `id` of the metadata region `b` (at least `len` bytes of it, all of
/// it returned); `None` when the table has no such item.
fn metadata_item<'a>(b: &'a [u8], id: &str, len: usize) -> Result<Option<&'a [u8]>> {
    if b.len() < 32 || &b[..8] != b"metadata" {
        return Err(corrupt("the VHDX metadata table signature is missing"));
    }
    let count = le16(b, 10);
    if count > MAX_METADATA_ENTRIES || 32 + usize::from(count) * 32 > b.len() {
        return Err(corrupt(format!(
            "the VHDX metadata table has {count} entries"
        )));
    }
    let id = guid(id);
    for i in 0..usize::from(count) {
        let e = &b[32 + i * 32..64 + i * 32];
        if e[..16] == id {
            let (offset, length) = (le32(e, 16) as usize, le32(e, 20) as usize);
            if length < len || offset.checked_add(length).is_none_or(|end| end > b.len()) {
                return Err(corrupt("a VHDX metadata item is outside its region"));
            }
            return Ok(Some(&b[offset..offset + length]));
        }
    }
    Ok(None)
}

/// The key/value pairs of a differencing VHDX's parent locator (metadata region `b`):
/// `parent_linkage`, `relative_path`, `absolute_win32_path`, ...
pub fn parent_locator(b: &[u8]) -> Result<Vec<(String, String)>> {
    let item = metadata_item(b, PARENT_LOCATOR, 20)?
        .ok_or_else(|| corrupt("the differencing VHDX has no parent locator"))?;
    if item[..16] != guid(VHDX_PARENT_TYPE) {
        return Err(Error::unsupported(
            "the VHDX parent locator is not of the VHDX type",
        ));
    }
    let count = le16(item, 18);
    if count > MAX_LOCATOR_ENTRIES || 20 + usize::from(count) * 12 > item.len() {
        return Err(corrupt(format!(
            "the VHDX parent locator has {count} entries"
        )));
    }
    let text = |offset: u32, len: u16| -> Result<String> {
        let (offset, len) = (offset as usize, usize::from(len));
        let bytes = offset
            .checked_add(len)
            .and_then(|end| item.get(offset..end))
            .ok_or_else(|| corrupt("a VHDX parent locator entry is outside the locator"))?;
        Ok(crate::diff::utf16(bytes, false))
    };
    (0..usize::from(count))
        .map(|i| {
            let e = &item[20 + i * 12..32 + i * 12];
            let key = text(le32(e, 0), le16(e, 8))?;
            let value = text(le32(e, 4), le16(e, 10))?;
            Ok((key, value))
        })
        .collect()
}

/// Whether the log region `log` holds an entry of the log `guid` (a log that was
/// written and must be replayed before the tables can be trusted).
pub fn log_has_entries(log: &[u8], guid: &[u8; 16]) -> bool {
    log.chunks_exact(4096)
        .any(|s| &s[..4] == b"loge" && s[32..48] == guid[..])
}

/// The file identifier's check and the current header.
pub async fn read_header(file: &dyn Source) -> Result<Header> {
    let id = read_meta(file, 0, 8, "VHDX file identifier").await?;
    if &id[..] != FILE_SIGNATURE {
        return Err(corrupt(
            "not a VHDX image: the vhdxfile signature is missing",
        ));
    }
    let mut current: Option<Header> = None;
    for at in HEADER_OFFSETS {
        let b = read_meta(file, at, HEADER_LEN, "VHDX header").await?;
        if let Some(h) = Header::parse(&b) {
            if current.as_ref().is_none_or(|c| h.sequence > c.sequence) {
                current = Some(h);
            }
        }
    }
    current.ok_or_else(|| corrupt("neither VHDX header is valid"))
}

/// Reads the identifier, the current header, the region table and the metadata; for a
/// differencing image, its parent locator's key/value pairs too.
pub async fn read_layout(file: &dyn Source) -> Result<(Layout, Vec<(String, String)>)> {
    let header = read_header(file).await?;
    if header.log_guid != [0; 16] {
        let len = u64::from(header.log_length);
        if len > MAX_LOG_BYTES {
            return Err(Error::unsupported(format!("the VHDX log is {len} bytes")));
        }
        let log = read_meta(file, header.log_offset, len, "VHDX log").await?;
        if log_has_entries(&log, &header.log_guid) {
            return Err(Error::unsupported(
                "the VHDX has a dirty log (it was not closed cleanly, its last metadata \
                 updates are only in the log); ferry does not replay VHDX logs: open it once \
                 read-write with Hyper-V or qemu-img (for example `qemu-img check -r all`) to \
                 replay it, then copy again",
            )
            .with_operation("open VHDX"));
        }
    }
    let mut regions = None;
    for at in REGION_OFFSETS {
        let b = read_meta(file, at, REGION_LEN, "VHDX region table").await?;
        if let Some(r) = Regions::parse(&b) {
            regions = Some(r?);
            break;
        }
    }
    let regions = regions.ok_or_else(|| corrupt("neither VHDX region table is valid"))?;
    let meta = read_meta(
        file,
        regions.metadata.0,
        u64::from(regions.metadata.1).min(1 << 20),
        "VHDX metadata",
    )
    .await?;
    let layout = Metadata::parse(&meta)?.layout(regions.bat)?;
    let locator = if layout.has_parent {
        parent_locator(&meta)?
    } else {
        Vec::new()
    };
    Ok((layout, locator))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_are_stored_mixed_endian() {
        assert_eq!(
            guid(BAT_GUID),
            [
                0x66, 0x77, 0xc2, 0x2d, 0x23, 0xf6, 0x00, 0x42, 0x9d, 0x64, 0x11, 0x5e, 0x9b, 0xfd,
                0x4a, 0x08
            ]
        );
    }

    #[test]
    fn layout_follows_the_chunk_ratio() {
        let m = Metadata {
            block_size: 32 << 20,
            leave_allocated: false,
            has_parent: false,
            virtual_size: 4 << 30,
            logical_sector_size: 512,
        };
        let l = m.layout((1 << 20, 1 << 20)).unwrap();
        assert_eq!(l.chunk_ratio, 128);
        assert_eq!(l.bat_entries, 128);
        let big = Metadata {
            virtual_size: 8 << 30,
            ..m
        };
        assert_eq!(big.layout((1 << 20, 1 << 20)).unwrap().bat_entries, 257);
        let diff = Metadata {
            has_parent: true,
            ..m
        }
        .layout((0, 1 << 20))
        .unwrap();
        assert_eq!(
            diff.bat_entries, 129,
            "the last chunk's bitmap entry counts"
        );
        assert!(Metadata {
            block_size: 3 << 20,
            ..m
        }
        .layout((0, 1 << 20))
        .is_err());
        assert!(m.layout((0, 8)).is_err());
    }

    /// A metadata region holding only a parent locator of `pairs`, the last entry's
    /// value at `value_at` when given.
    fn locator_region(pairs: &[(&str, &str)], value_at: Option<u32>) -> Vec<u8> {
        let utf16 = |t: &str| -> Vec<u8> { t.encode_utf16().flat_map(u16::to_le_bytes).collect() };
        let mut item = guid(VHDX_PARENT_TYPE).to_vec();
        item.extend([0, 0]);
        item.extend((pairs.len() as u16).to_le_bytes());
        let mut data: Vec<u8> = Vec::new();
        let table = 20 + pairs.len() * 12;
        for (k, v) in pairs {
            let (k, v) = (utf16(k), utf16(v));
            let key_at = (table + data.len()) as u32;
            data.extend(&k);
            let val_at = value_at.unwrap_or((table + data.len()) as u32);
            data.extend(&v);
            item.extend(key_at.to_le_bytes());
            item.extend(val_at.to_le_bytes());
            item.extend((k.len() as u16).to_le_bytes());
            item.extend((v.len() as u16).to_le_bytes());
        }
        item.extend(data);
        let mut b = vec![0u8; 4096];
        b[..8].copy_from_slice(b"metadata");
        b[10..12].copy_from_slice(&1u16.to_le_bytes());
        b[32..48].copy_from_slice(&guid(PARENT_LOCATOR));
        b[48..52].copy_from_slice(&1024u32.to_le_bytes());
        b[52..56].copy_from_slice(&(item.len() as u32).to_le_bytes());
        b[1024..1024 + item.len()].copy_from_slice(&item);
        b
    }

    #[test]
    fn parent_locator_pairs_are_read_within_their_item() {
        let pairs = [
            ("parent_linkage", "{01}"),
            ("relative_path", ".\\base.vhdx"),
        ];
        let got = parent_locator(&locator_region(&pairs, None)).unwrap();
        assert_eq!(got[1], ("relative_path".into(), ".\\base.vhdx".into()));
        let err = parent_locator(&locator_region(&pairs, Some(60_000))).unwrap_err();
        assert_eq!(err.kind(), ferry_core::ErrorKind::Corrupt, "{err}");
        let mut region = locator_region(&pairs, None);
        region[32..48].fill(0);
        assert!(parent_locator(&region).is_err(), "no locator item");
    }

    #[test]
    fn a_log_entry_of_the_header_guid_is_dirty() {
        let g = [7u8; 16];
        let mut log = vec![0u8; 8192];
        assert!(!log_has_entries(&log, &g));
        log[4096..4100].copy_from_slice(b"loge");
        log[4096 + 32..4096 + 48].copy_from_slice(&g);
        assert!(log_has_entries(&log, &g));
        assert!(!log_has_entries(&log, &[8u8; 16]));
    }
}
