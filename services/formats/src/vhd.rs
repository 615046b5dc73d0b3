//! VHD images (Virtual PC, Hyper-V's first format; qemu calls it `vpc`): fixed and
//! dynamic, read through [`MappedSource`], and differencing, read over their parent
//! through [`crate::diff`].
//!
//! Every VHD ends with a 512-byte footer (`conectix`); a fixed image is just the disk
//! followed by it, so it has no header and is detected by its last sector. A dynamic
//! image also starts with a copy of the footer, then a dynamic header (`cxsparse`) that
//! points at the block allocation table (BAT): one big-endian sector number per block
//! (usually 2 MiB), `0xFFFFFFFF` for a block never written. A stored block is a sector
//! bitmap followed by the data; like qemu, a stored block of a dynamic image is read
//! whole. A differencing image has the same tables; its bitmaps say which sectors it
//! holds (most significant bit first), its BAT's empty entries and clear bits are its
//! parent's. The parent is named by locators in the dynamic header (`W2ru`, relative,
//! and `W2ku`, absolute, UTF-16LE paths) and recognised by its footer's unique id,
//! which the child records.
//!
//! The guest size follows qemu's rule: images made by Virtual PC (`vpc `) and older
//! qemu (`qemu`) have the size of their CHS geometry, unless that geometry is the
//! largest one, every other creator the footer's current size.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Error, Result, Source};

use crate::diff::{utf16, Bitmap, DiffMap, DiffPlace, Differencing, Identity, Opened, ParentRef};
use crate::mapped::{be32, be64, corrupt, read_meta, BlockMap, MappedSource, Place};
use crate::qcow2::cache::L2Cache;

/// The footer's cookie.
pub const FOOTER_COOKIE: &[u8; 8] = b"conectix";
/// Bytes of a footer.
pub const FOOTER_LEN: usize = 512;
const DYNAMIC_COOKIE: &[u8; 8] = b"cxsparse";
const DYNAMIC_LEN: u64 = 1024;
/// Largest BAT loaded (16 Mi blocks: 32 TiB of 2 MiB blocks).
pub const MAX_BAT_BYTES: u64 = 64 << 20;
/// Longest parent locator read.
const MAX_LOCATOR_BYTES: u32 = 64 << 10;
/// Bytes of sector bitmaps a differencing image keeps.
const BITMAP_CACHE_BYTES: usize = 4 << 20;
/// The largest CHS geometry (65535 cylinders, 16 heads, 255 sectors).
const MAX_GEOMETRY: u64 = 65535 * 16 * 255;

/// The disk types a footer names.
pub const TYPE_FIXED: u32 = 2;
pub const TYPE_DYNAMIC: u32 = 3;
pub const TYPE_DIFFERENCING: u32 = 4;

/// A validated VHD footer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    pub disk_type: u32,
    /// Where the dynamic header is (dynamic and differencing images).
    pub data_offset: u64,
    pub creator_app: [u8; 4],
    pub current_size: u64,
    /// Sectors of the CHS geometry.
    pub chs_sectors: u64,
    /// The image's unique id (what a differencing child records of its parent).
    pub unique_id: [u8; 16],
}

impl Footer {
    /// Parses a footer (its checksum checked).
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < FOOTER_LEN || &b[..8] != FOOTER_COOKIE {
            return Err(corrupt("not a VHD image: the footer cookie is missing"));
        }
        let stored = be32(b, 64);
        let sum = b[..FOOTER_LEN]
            .iter()
            .enumerate()
            .filter(|(i, _)| !(64..68).contains(i))
            .fold(0u32, |acc, (_, &x)| acc.wrapping_add(u32::from(x)));
        if !sum != stored {
            return Err(corrupt(format!(
                "the VHD footer checksum is {stored:#x}, its bytes sum to {:#x}",
                !sum
            )));
        }
        let disk_type = be32(b, 60);
        if !matches!(disk_type, TYPE_FIXED | TYPE_DYNAMIC | TYPE_DIFFERENCING) {
            return Err(corrupt(format!("unknown VHD disk type {disk_type}")));
        }
        let chs_sectors =
            u64::from(u16::from_be_bytes([b[56], b[57]])) * u64::from(b[58]) * u64::from(b[59]);
        let mut unique_id = [0u8; 16];
        unique_id.copy_from_slice(&b[68..84]);
        Ok(Self {
            unique_id,
            disk_type,
            data_offset: be64(b, 16),
            creator_app: [b[28], b[29], b[30], b[31]],
            current_size: be64(b, 48),
            chs_sectors,
        })
    }

    /// The guest size by qemu's creator-application rule.
    pub fn virtual_size(&self) -> u64 {
        let chs_creator = &self.creator_app == b"vpc " || &self.creator_app == b"qemu";
        if chs_creator && self.chs_sectors != MAX_GEOMETRY {
            self.chs_sectors * 512
        } else {
            self.current_size / 512 * 512
        }
    }

    pub fn subformat(&self) -> &'static str {
        match self.disk_type {
            TYPE_FIXED => "fixed",
            TYPE_DYNAMIC => "dynamic",
            _ => "differencing",
        }
    }
}

/// A validated dynamic header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicHeader {
    pub table_offset: u64,
    pub max_table_entries: u32,
    pub block_size: u64,
    /// The parent's name (differencing images), as the image gives it.
    pub parent_name: String,
    /// The parent's footer unique id (differencing images).
    pub parent_id: [u8; 16],
    /// The parent locators: (platform code, length, file offset).
    pub locators: Vec<([u8; 4], u32, u64)>,
}

impl DynamicHeader {
    pub fn parse(b: &[u8], file_size: u64) -> Result<Self> {
        if b.len() < DYNAMIC_LEN as usize || &b[..8] != DYNAMIC_COOKIE {
            return Err(corrupt("the VHD dynamic header cookie is missing"));
        }
        let block_size = u64::from(be32(b, 32));
        if !block_size.is_power_of_two() || !(512..=(256 << 20)).contains(&block_size) {
            return Err(corrupt(format!(
                "VHD block size {block_size} is not supported"
            )));
        }
        let mut parent_id = [0u8; 16];
        parent_id.copy_from_slice(&b[40..56]);
        let locators = b[576..768]
            .chunks_exact(24)
            .filter(|e| e[..4] != [0; 4])
            .map(|e| ([e[0], e[1], e[2], e[3]], be32(e, 8), be64(e, 16)))
            .collect();
        let header = Self {
            table_offset: be64(b, 16),
            max_table_entries: be32(b, 28),
            block_size,
            parent_name: utf16(&b[64..576], true),
            parent_id,
            locators,
        };
        let bat_bytes = u64::from(header.max_table_entries) * 4;
        if bat_bytes > MAX_BAT_BYTES {
            return Err(Error::unsupported(format!(
                "the VHD block table is {bat_bytes} bytes, more than the {MAX_BAT_BYTES} read"
            )));
        }
        if header
            .table_offset
            .checked_add(bat_bytes)
            .is_none_or(|end| end > file_size)
        {
            return Err(corrupt(format!(
                "the VHD block table ({bat_bytes} bytes at offset {}) is past the end of the \
                 image file ({file_size} bytes)",
                header.table_offset
            )));
        }
        Ok(header)
    }

    /// Bytes of the sector bitmap in front of each stored block (whole sectors).
    fn bitmap_bytes(&self) -> u64 {
        (self.block_size / 512).div_ceil(8).div_ceil(512) * 512
    }
}

#[derive(Debug)]
struct FixedMap;

#[async_trait]
impl BlockMap for FixedMap {
    fn block_size(&self) -> u64 {
        1 << 30
    }

    async fn lookup(&self, _file: &dyn Source, index: u64) -> Result<Place> {
        Ok(Place::Data(index << 30))
    }
}

#[derive(Debug)]
struct DynamicMap {
    header: DynamicHeader,
    bat: Vec<u32>,
}

#[async_trait]
impl BlockMap for DynamicMap {
    fn block_size(&self) -> u64 {
        self.header.block_size
    }

    async fn lookup(&self, _file: &dyn Source, index: u64) -> Result<Place> {
        match self.bat.get(index as usize).copied() {
            None | Some(0xffff_ffff) => Ok(Place::Zero),
            Some(sector) => Ok(Place::Data(
                u64::from(sector) * 512 + self.header.bitmap_bytes(),
            )),
        }
    }
}

/// A differencing image's blocks: the BAT, and each stored block's sector bitmap.
#[derive(Debug)]
struct DiffBlocks {
    header: DynamicHeader,
    bat: Vec<u32>,
    bitmaps: L2Cache<Vec<u8>>,
}

#[async_trait]
impl DiffMap for DiffBlocks {
    fn block_size(&self) -> u64 {
        self.header.block_size
    }

    fn sector_size(&self) -> u64 {
        512
    }

    async fn lookup(&self, file: &dyn Source, index: u64) -> Result<DiffPlace> {
        let sector = match self.bat.get(index as usize).copied() {
            None | Some(0xffff_ffff) => return Ok(DiffPlace::Parent),
            Some(sector) => u64::from(sector),
        };
        let at = sector * 512;
        let bytes = match self.bitmaps.get(at) {
            Some(bytes) => bytes,
            None => {
                let len = self.header.bitmap_bytes();
                let raw = read_meta(file, at, len, "VHD sector bitmap").await?;
                let bytes = Arc::new(raw.to_vec());
                self.bitmaps.insert(at, bytes.clone());
                bytes
            }
        };
        Ok(DiffPlace::Partial {
            host: at + self.header.bitmap_bytes(),
            bitmap: Bitmap {
                bytes,
                msb_first: true,
            },
        })
    }
}

/// What was learnt opening a VHD.
#[derive(Debug, Clone)]
pub struct VhdInfo {
    pub footer: Footer,
    pub block_size: Option<u64>,
}

/// The footer of the VHD in `file`: the copy at its start (dynamic and differencing
/// images) or, failing that, the footer at its end (fixed images).
pub async fn read_footer(file: &dyn Source) -> Result<Footer> {
    let file_size = file.size();
    if file_size < FOOTER_LEN as u64 {
        return Err(corrupt("the VHD image is shorter than its footer"));
    }
    let head = read_meta(file, 0, FOOTER_LEN as u64, "VHD footer copy").await?;
    if &head[..8] == FOOTER_COOKIE {
        return Footer::parse(&head);
    }
    let tail_at = file_size - FOOTER_LEN as u64;
    let tail = read_meta(file, tail_at, FOOTER_LEN as u64, "VHD footer").await?;
    let footer = Footer::parse(&tail)?;
    if footer.disk_type != TYPE_FIXED {
        return Err(corrupt(
            "the VHD footer says the image is dynamic but the file has no header copy",
        ));
    }
    Ok(footer)
}

/// The parent a differencing image names: its locators (`W2ru` then `W2ku`), or the
/// parent name field when it has neither, and the unique id the parent must have.
async fn parent_ref(file: &dyn Source, header: &DynamicHeader) -> Result<ParentRef> {
    let mut names = Vec::new();
    for (code, what) in [(b"W2ru", "W2ru locator"), (b"W2ku", "W2ku locator")] {
        for &(_, len, offset) in header.locators.iter().filter(|l| &l.0 == code) {
            if len > MAX_LOCATOR_BYTES {
                return Err(corrupt(format!(
                    "the VHD's {what} is {len} bytes, more than the {MAX_LOCATOR_BYTES} read"
                )));
            }
            let raw = read_meta(file, offset, u64::from(len), "VHD parent locator").await?;
            let name = utf16(&raw, false);
            if !name.is_empty() {
                names.push((what, name));
            }
        }
    }
    // The parent name field only when no locator names the parent (older images).
    if names.is_empty() && !header.parent_name.is_empty() {
        names.push(("parent name", header.parent_name.clone()));
    }
    Ok(ParentRef {
        names,
        identity: Identity::VhdUniqueId(header.parent_id),
    })
}

/// Opens the VHD image in `file`.
pub async fn open_vhd(file: Arc<dyn Source>) -> Result<(Opened, VhdInfo)> {
    let file_size = file.size();
    let footer = read_footer(file.as_ref()).await?;
    let size = footer.virtual_size();
    match footer.disk_type {
        TYPE_FIXED => {
            if size > file_size - FOOTER_LEN as u64 {
                return Err(corrupt(format!(
                    "the fixed VHD says its disk is {size} bytes but the file holds only {} \
                     before its footer: the image is truncated",
                    file_size - FOOTER_LEN as u64
                )));
            }
            let info = VhdInfo {
                footer,
                block_size: None,
            };
            let image = Arc::new(MappedSource::new(file, Arc::new(FixedMap), size));
            Ok((Opened::Image(image), info))
        }
        disk_type => {
            let bytes = read_meta(
                file.as_ref(),
                footer.data_offset,
                DYNAMIC_LEN,
                "VHD dynamic header",
            )
            .await?;
            let header = DynamicHeader::parse(&bytes, file_size)?;
            let bat_bytes = u64::from(header.max_table_entries) * 4;
            let raw = read_meta(
                file.as_ref(),
                header.table_offset,
                bat_bytes,
                "VHD block table",
            )
            .await?;
            let bat = raw.chunks_exact(4).map(|c| be32(c, 0)).collect();
            let info = VhdInfo {
                footer,
                block_size: Some(header.block_size),
            };
            if disk_type == TYPE_DIFFERENCING {
                let parent = parent_ref(file.as_ref(), &header).await?;
                let bitmap_bytes = header.bitmap_bytes() as usize;
                let map = DiffBlocks {
                    header,
                    bat,
                    bitmaps: L2Cache::new(bitmap_bytes, BITMAP_CACHE_BYTES),
                };
                let diff = Differencing::new(file, Arc::new(map), size, parent);
                return Ok((Opened::Differencing(diff), info));
            }
            let map = DynamicMap { header, bat };
            let image = Arc::new(MappedSource::new(file, Arc::new(map), size));
            Ok((Opened::Image(image), info))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::{ErrorKind, IoBuf};
    use ferry_testkit::MemSource;

    fn footer(disk_type: u32, creator: &[u8; 4], size: u64, chs: (u16, u8, u8)) -> Vec<u8> {
        let mut f = vec![0u8; 512];
        f[..8].copy_from_slice(FOOTER_COOKIE);
        f[16..24].copy_from_slice(&512u64.to_be_bytes());
        f[28..32].copy_from_slice(creator);
        f[48..56].copy_from_slice(&size.to_be_bytes());
        f[56..58].copy_from_slice(&chs.0.to_be_bytes());
        f[58] = chs.1;
        f[59] = chs.2;
        f[60..64].copy_from_slice(&disk_type.to_be_bytes());
        let sum = f.iter().fold(0u32, |a, &x| a.wrapping_add(u32::from(x)));
        f[64..68].copy_from_slice(&(!sum).to_be_bytes());
        f
    }

    #[test]
    fn size_follows_the_creator_rule() {
        let f = Footer::parse(&footer(2, b"qemu", 1 << 20, (4, 4, 17))).unwrap();
        assert_eq!(f.virtual_size(), 4 * 4 * 17 * 512);
        let f = Footer::parse(&footer(2, b"win ", 1 << 20, (4, 4, 17))).unwrap();
        assert_eq!(f.virtual_size(), 1 << 20);
        let f = Footer::parse(&footer(2, b"vpc ", 1 << 40, (65535, 16, 255))).unwrap();
        assert_eq!(f.virtual_size(), 1 << 40);
        let mut bad = footer(2, b"qemu", 1 << 20, (4, 4, 17));
        bad[100] ^= 1;
        assert_eq!(Footer::parse(&bad).unwrap_err().kind(), ErrorKind::Corrupt);
    }

    /// A dynamic VHD of 2 blocks of 4 KiB: block 1 stored, block 0 not.
    fn dynamic() -> Vec<u8> {
        let mut f = footer(3, b"qem2", 8192, (1, 1, 1));
        let mut dh = vec![0u8; 1024];
        dh[..8].copy_from_slice(DYNAMIC_COOKIE);
        dh[16..24].copy_from_slice(&1536u64.to_be_bytes());
        dh[28..32].copy_from_slice(&2u32.to_be_bytes());
        dh[32..36].copy_from_slice(&4096u32.to_be_bytes());
        f.extend(dh);
        let mut bat = vec![0xffu8; 512];
        bat[4..8].copy_from_slice(&4u32.to_be_bytes());
        f.extend(bat);
        f.extend([0xffu8; 512]);
        f.extend([0x5au8; 4096]);
        f.extend(footer(3, b"qem2", 8192, (1, 1, 1)));
        f
    }

    #[tokio::test]
    async fn reads_a_dynamic_image() {
        let file: Arc<dyn Source> = Arc::new(MemSource::new(dynamic()));
        let (Opened::Image(img), info) = open_vhd(file).await.unwrap() else {
            panic!("a dynamic image needs no parent")
        };
        assert_eq!(info.footer.subformat(), "dynamic");
        assert_eq!(img.size(), 8192);
        let buf = img.read_at(0, IoBuf::new(8192)).await.unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 0));
        assert!(buf[4096..].iter().all(|&b| b == 0x5a));
        let ext = img.extents(0, 8192).await.unwrap();
        assert_eq!(ext.len(), 2);
    }

    #[tokio::test]
    async fn a_block_past_the_end_is_corrupt() {
        let mut img = dynamic();
        img.truncate(img.len() - 2048);
        let file: Arc<dyn Source> = Arc::new(MemSource::new(img));
        let (Opened::Image(img), _) = open_vhd(file).await.unwrap() else {
            panic!("a dynamic image needs no parent")
        };
        let err = img.read_at(4096, IoBuf::new(4096)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
    }
}
