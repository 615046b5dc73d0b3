//! VirtualBox VDI images (static and dynamic), read through [`MappedSource`].
//!
//! A VDI file is a header, a block map of little-endian 32-bit entries (one per block of
//! the guest disk, usually 1 MiB) and the blocks. An entry is the block's index among the
//! stored blocks, `0xFFFFFFFF` for a block never written and `0xFFFFFFFE` for a discarded
//! one: both read as zeroes. A static image is the same layout with every block stored.
//! The map is loaded whole at open (at most [`MAX_MAP_BYTES`]): it is small (4 bytes per
//! MiB) and every lookup needs it.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Error, Result, Source};

use crate::mapped::{corrupt, le32, le64, read_meta, BlockMap, MappedSource, Place};

/// The signature at offset 0x40.
pub const SIGNATURE: u32 = 0xbeda_107f;
/// Bytes of the header read and parsed.
pub const HEADER_LEN: usize = 0x190;
/// Largest block map loaded (16 Mi blocks: 16 TiB of 1 MiB blocks).
pub const MAX_MAP_BYTES: u64 = 64 << 20;
const UNALLOCATED: u32 = 0xffff_ffff;
const DISCARDED: u32 = 0xffff_fffe;

/// A validated VDI header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VdiHeader {
    /// 1: dynamic, 2: static.
    pub image_type: u32,
    pub map_offset: u64,
    pub data_offset: u64,
    pub disk_size: u64,
    pub block_size: u64,
    pub blocks: u32,
}

impl VdiHeader {
    /// `static` or `dynamic`, as `ferry info` names the subformat.
    pub fn subformat(&self) -> &'static str {
        if self.image_type == 2 {
            "static"
        } else {
            "dynamic"
        }
    }

    /// Parses and bounds the header in `head` (the first [`HEADER_LEN`] bytes).
    pub fn parse(head: &[u8], file_size: u64) -> Result<Self> {
        if head.len() < HEADER_LEN || le32(head, 0x40) != SIGNATURE {
            return Err(corrupt("not a VDI image: the signature is missing"));
        }
        let version = le32(head, 0x44);
        if version >> 16 != 1 {
            return Err(Error::unsupported(format!(
                "VDI version {}.{} is not supported (only 1.x)",
                version >> 16,
                version & 0xffff
            )));
        }
        let image_type = le32(head, 0x4c);
        match image_type {
            1 | 2 => {}
            3 | 4 => {
                return Err(Error::unsupported(format!(
                    "VDI image type {image_type} (undo or differencing) is not supported"
                )))
            }
            other => return Err(corrupt(format!("unknown VDI image type {other}"))),
        }
        let header = Self {
            image_type,
            map_offset: u64::from(le32(head, 0x154)),
            data_offset: u64::from(le32(head, 0x158)),
            disk_size: le64(head, 0x170),
            block_size: u64::from(le32(head, 0x178)),
            blocks: le32(head, 0x180),
        };
        let sector_size = le32(head, 0x168);
        if sector_size != 512 {
            return Err(corrupt(format!("VDI sector size {sector_size} is not 512")));
        }
        if le32(head, 0x17c) != 0 {
            return Err(Error::unsupported(
                "VDI blocks with extra data (block_extra) are not supported",
            ));
        }
        let bs = header.block_size;
        if !(512..=(256 << 20)).contains(&bs) || !bs.is_multiple_of(512) {
            return Err(corrupt(format!("VDI block size {bs} is not supported")));
        }
        if !header.map_offset.is_multiple_of(512) || !header.data_offset.is_multiple_of(512) {
            return Err(corrupt(
                "the VDI block map or data offset is not sector aligned",
            ));
        }
        if header.disk_size > u64::from(header.blocks) * bs {
            return Err(corrupt(format!(
                "the VDI disk size {} is larger than its {} blocks of {bs} bytes",
                header.disk_size, header.blocks
            )));
        }
        let map_bytes = u64::from(header.blocks) * 4;
        if map_bytes > MAX_MAP_BYTES {
            return Err(Error::unsupported(format!(
                "the VDI block map is {map_bytes} bytes, more than the {MAX_MAP_BYTES} read"
            )));
        }
        if header.map_offset + map_bytes > file_size {
            return Err(corrupt(format!(
                "the VDI block map ({map_bytes} bytes at offset {}) is past the end of the \
                 image file ({file_size} bytes)",
                header.map_offset
            )));
        }
        Ok(header)
    }
}

#[derive(Debug)]
struct VdiMap {
    header: VdiHeader,
    map: Vec<u32>,
}

#[async_trait]
impl BlockMap for VdiMap {
    fn block_size(&self) -> u64 {
        self.header.block_size
    }

    async fn lookup(&self, _file: &dyn Source, index: u64) -> Result<Place> {
        match self.map.get(index as usize).copied() {
            None => Err(corrupt(format!("VDI block {index} is past the block map"))),
            Some(UNALLOCATED | DISCARDED) => Ok(Place::Zero),
            Some(entry) if entry >= self.header.blocks => Err(corrupt(format!(
                "VDI block {index} maps to stored block {entry}, past the {} blocks",
                self.header.blocks
            ))),
            Some(entry) => Ok(Place::Data(
                self.header.data_offset + u64::from(entry) * self.header.block_size,
            )),
        }
    }
}

/// Opens the VDI image in `file`.
pub async fn open_vdi(file: Arc<dyn Source>) -> Result<(Arc<dyn Source>, VdiHeader)> {
    let head = read_meta(file.as_ref(), 0, HEADER_LEN as u64, "VDI header").await?;
    let header = VdiHeader::parse(&head, file.size())?;
    let bytes = read_meta(
        file.as_ref(),
        header.map_offset,
        u64::from(header.blocks) * 4,
        "VDI block map",
    )
    .await?;
    let map = bytes.chunks_exact(4).map(|c| le32(c, 0)).collect();
    let size = header.disk_size;
    let source = MappedSource::new(
        file,
        Arc::new(VdiMap {
            header: header.clone(),
            map,
        }),
        size,
    );
    Ok((Arc::new(source), header))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::IoBuf;
    use ferry_testkit::MemSource;

    /// A dynamic VDI of 4 blocks of 512 bytes: block 0 stored second, block 1 never
    /// written, block 2 stored first, block 3 discarded.
    pub(crate) fn image() -> Vec<u8> {
        let mut f = vec![0u8; 0x200];
        f[0x40..0x44].copy_from_slice(&SIGNATURE.to_le_bytes());
        f[0x44..0x48].copy_from_slice(&0x0001_0001u32.to_le_bytes());
        f[0x4c..0x50].copy_from_slice(&1u32.to_le_bytes());
        f[0x154..0x158].copy_from_slice(&0x200u32.to_le_bytes());
        f[0x158..0x15c].copy_from_slice(&0x400u32.to_le_bytes());
        f[0x168..0x16c].copy_from_slice(&512u32.to_le_bytes());
        f[0x170..0x178].copy_from_slice(&2048u64.to_le_bytes());
        f[0x178..0x17c].copy_from_slice(&512u32.to_le_bytes());
        f[0x180..0x184].copy_from_slice(&4u32.to_le_bytes());
        let mut map = vec![0u8; 0x200];
        for (i, e) in [1u32, UNALLOCATED, 0, DISCARDED].iter().enumerate() {
            map[i * 4..i * 4 + 4].copy_from_slice(&e.to_le_bytes());
        }
        f.extend(map);
        f.extend([0xbb; 512]);
        f.extend([0xaa; 512]);
        f
    }

    #[tokio::test]
    async fn reads_blocks_through_the_map() {
        let file: Arc<dyn Source> = Arc::new(MemSource::new(image()));
        let (img, h) = open_vdi(file).await.unwrap();
        assert_eq!(h.subformat(), "dynamic");
        assert_eq!(img.size(), 2048);
        let buf = img.read_at(0, IoBuf::new(2048)).await.unwrap();
        assert!(buf[..512].iter().all(|&b| b == 0xaa));
        assert!(buf[512..1024].iter().all(|&b| b == 0));
        assert!(buf[1024..1536].iter().all(|&b| b == 0xbb));
        assert!(buf[1536..].iter().all(|&b| b == 0));
        let ext = img.extents(0, 2048).await.unwrap();
        assert_eq!(ext.len(), 4);
        assert_eq!(ext[1].kind, ferry_core::ExtentKind::Zero);
    }

    #[tokio::test]
    async fn truncated_data_or_map_is_corrupt() {
        let mut f = image();
        f.truncate(f.len() - 100);
        let file: Arc<dyn Source> = Arc::new(MemSource::new(f));
        let (img, _) = open_vdi(file).await.unwrap();
        let err = img.read_at(0, IoBuf::new(512)).await.unwrap_err();
        assert_eq!(err.kind(), ferry_core::ErrorKind::Corrupt, "{err}");
        let mut f = image();
        f.truncate(0x1f0);
        let file: Arc<dyn Source> = Arc::new(MemSource::new(f));
        let Err(err) = open_vdi(file).await else {
            panic!("a VDI whose block map is cut off opened")
        };
        assert_eq!(err.kind(), ferry_core::ErrorKind::Corrupt, "{err}");
    }
}
