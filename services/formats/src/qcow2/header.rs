//! The qcow2 header and its extensions, parsed and bounded before anything trusts them.
//!
//! Every field that later sizes an allocation or addresses the byte source is checked
//! here, so a malicious header gives an error instead of a panic or a huge allocation.

use ferry_core::{Error, ErrorKind, Result};

/// The header's magic, `QFI\xfb`.
pub const MAGIC: u32 = 0x5146_49fb;
/// Bytes read from the start of the image before parsing (fewer when the image is smaller).
pub const HEAD_LEN: usize = 4096;
/// The least an image must hold to be parsed: the smallest possible header cluster.
const MIN_HEAD_LEN: usize = 512;
/// Largest L1 table accepted (QEMU's QCOW_MAX_L1_SIZE).
pub const MAX_L1_BYTES: u64 = 32 * 1024 * 1024;
/// Longest backing file name accepted (QEMU's limit).
pub const MAX_BACKING_NAME: u32 = 1023;

const MIN_CLUSTER_BITS: u32 = 9;
const MAX_CLUSTER_BITS: u32 = 21;
const V3_HEADER_LEN: u32 = 104;

const INCOMPAT_DIRTY: u64 = 1 << 0;
const INCOMPAT_CORRUPT: u64 = 1 << 1;
const INCOMPAT_DATA_FILE: u64 = 1 << 2;
const INCOMPAT_COMPRESSION: u64 = 1 << 3;
const INCOMPAT_EXTL2: u64 = 1 << 4;
const INCOMPAT_KNOWN: u64 =
    INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_DATA_FILE | INCOMPAT_COMPRESSION | INCOMPAT_EXTL2;

const EXT_END: u32 = 0;
const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;

/// How compressed clusters are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    Deflate,
    Zstd,
}

impl Compression {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deflate => "zlib",
            Self::Zstd => "zstd",
        }
    }
}

/// A validated qcow2 header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub cluster_bits: u32,
    pub size: u64,
    pub l1_size: u32,
    pub l1_offset: u64,
    pub extended_l2: bool,
    pub compression: Compression,
    /// Where the backing file name is, if there is one: (offset, length).
    pub backing: Option<(u64, u32)>,
    /// The backing format the header names (`raw`, `qcow2`), if any.
    pub backing_format: Option<String>,
}

fn corrupt(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, message).with_operation("open qcow2")
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Refuses a head too short for a header or without the qcow2 magic.
fn check_magic(head: &[u8]) -> Result<()> {
    if head.len() < MIN_HEAD_LEN {
        return Err(corrupt(format!(
            "the image is {} bytes, too short for a qcow2 header",
            head.len()
        )));
    }
    if be32(head, 0) != MAGIC {
        return Err(corrupt("not a qcow2 image (no QFI\\xfb magic)"));
    }
    Ok(())
}

/// The header's version: 2 or 3.
fn parse_version(head: &[u8]) -> Result<u32> {
    let version = be32(head, 4);
    if version != 2 && version != 3 {
        return Err(Error::unsupported(format!(
            "qcow2 version {version} is not supported (only 2 and 3)"
        )));
    }
    Ok(version)
}

/// The header's cluster_bits, within the sizes QEMU allows.
fn parse_cluster_bits(head: &[u8]) -> Result<u32> {
    let cluster_bits = be32(head, 20);
    if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&cluster_bits) {
        return Err(corrupt(format!(
            "cluster_bits {cluster_bits} is outside {MIN_CLUSTER_BITS}..={MAX_CLUSTER_BITS}"
        )));
    }
    Ok(cluster_bits)
}

/// The fields version 3 added: the incompatible feature bits, the header's length and
/// the compression type byte (version 2: none, a 72-byte header, zlib).
fn v3_fields(head: &[u8], version: u32, cluster_size: u64) -> Result<(u64, u32, u8)> {
    if version != 3 {
        return Ok((0, 72, 0));
    }
    let header_len = be32(head, 100);
    if header_len < V3_HEADER_LEN || u64::from(header_len) > cluster_size.min(head.len() as u64) {
        return Err(corrupt(format!(
            "header length {header_len} is out of bounds"
        )));
    }
    let compression = if header_len > V3_HEADER_LEN {
        head[104]
    } else {
        0
    };
    Ok((be64(head, 72), header_len, compression))
}

/// Refuses incompatible features this reader cannot honour, and images marked corrupt.
fn check_incompatible(incompat: u64) -> Result<()> {
    let unknown = incompat & !INCOMPAT_KNOWN;
    if unknown != 0 {
        return Err(Error::unsupported(format!(
            "the qcow2 image uses unknown incompatible features (bits {unknown:#x})"
        )));
    }
    if incompat & INCOMPAT_DATA_FILE != 0 {
        return Err(Error::unsupported(
            "the qcow2 image keeps its data in an external data file, which is not supported",
        ));
    }
    if incompat & INCOMPAT_CORRUPT != 0 {
        return Err(corrupt(
            "the qcow2 image is marked corrupt; repair it with qemu-img check -r all",
        ));
    }
    Ok(())
}

/// How compressed clusters are compressed: the compression type byte, valid only with
/// the compression type feature bit.
fn parse_compression(incompat: u64, byte: u8) -> Result<Compression> {
    match (incompat & INCOMPAT_COMPRESSION != 0, byte) {
        (_, 0) => Ok(Compression::Deflate),
        (true, 1) => Ok(Compression::Zstd),
        (false, c) => Err(corrupt(format!(
            "compression type {c} without the compression type feature bit"
        ))),
        (true, c) => Err(Error::unsupported(format!("unknown compression type {c}"))),
    }
}

impl Header {
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// Bytes of one L2 entry: 8, or 16 with extended L2 (subcluster bitmaps).
    pub fn l2_entry_bytes(&self) -> u64 {
        if self.extended_l2 {
            16
        } else {
            8
        }
    }

    /// Guest bytes one L2 table maps.
    pub fn l2_coverage(&self) -> u64 {
        self.cluster_size() / self.l2_entry_bytes() * self.cluster_size()
    }

    /// Parses the first bytes of an image (up to [`HEAD_LEN`]) stored in `file_size` bytes.
    pub fn parse(head: &[u8], file_size: u64) -> Result<Self> {
        check_magic(head)?;
        let version = parse_version(head)?;
        let cluster_bits = parse_cluster_bits(head)?;
        let cluster_size = 1u64 << cluster_bits;
        if be32(head, 32) != 0 {
            return Err(Error::unsupported(
                "the qcow2 image is encrypted; decrypt it first (qemu-img convert)",
            ));
        }
        let (incompat, header_len, compression_byte) = v3_fields(head, version, cluster_size)?;
        check_incompatible(incompat)?;
        let compression = parse_compression(incompat, compression_byte)?;
        let extended_l2 = incompat & INCOMPAT_EXTL2 != 0;
        if extended_l2 && cluster_bits < 14 {
            return Err(corrupt(
                "extended L2 entries need clusters of at least 16 KiB",
            ));
        }
        let header = Self {
            version,
            cluster_bits,
            size: be64(head, 24),
            l1_size: be32(head, 36),
            l1_offset: be64(head, 40),
            extended_l2,
            compression,
            backing: None,
            backing_format: None,
        };
        header.check_l1(file_size)?;
        let backing = parse_backing(head, cluster_size, file_size)?;
        let backing_format = parse_extensions(head, header_len as usize)?;
        Ok(Self {
            backing,
            backing_format,
            ..header
        })
    }

    /// Bounds the virtual size, the L1 table's size and its place in the file.
    fn check_l1(&self, file_size: u64) -> Result<()> {
        let coverage = self.l2_coverage();
        let needed = self.size.div_ceil(coverage);
        let l1_bytes = u64::from(self.l1_size) * 8;
        if l1_bytes > MAX_L1_BYTES {
            return Err(corrupt(format!(
                "the L1 table would be {l1_bytes} bytes (at most {MAX_L1_BYTES})"
            )));
        }
        if needed > u64::from(self.l1_size) {
            return Err(corrupt(format!(
                "the L1 table has {} entries, too few for a virtual size of {} bytes",
                self.l1_size, self.size
            )));
        }
        if self.l1_size > 0 {
            if !self.l1_offset.is_multiple_of(self.cluster_size()) {
                return Err(corrupt(format!(
                    "the L1 table offset {} is not cluster aligned",
                    self.l1_offset
                )));
            }
            match self.l1_offset.checked_add(l1_bytes) {
                Some(end) if end <= file_size => {}
                _ => {
                    return Err(corrupt(format!(
                        "the L1 table at {} ({l1_bytes} bytes) reaches past the end of the \
                         image file ({file_size} bytes)",
                        self.l1_offset
                    )))
                }
            }
        }
        Ok(())
    }
}

fn parse_backing(head: &[u8], cluster_size: u64, file_size: u64) -> Result<Option<(u64, u32)>> {
    let offset = be64(head, 8);
    let len = be32(head, 16);
    if offset == 0 {
        return Ok(None);
    }
    if len == 0 || len > MAX_BACKING_NAME {
        return Err(corrupt(format!(
            "backing file name length {len} is out of bounds"
        )));
    }
    let end = offset.saturating_add(u64::from(len));
    if end > cluster_size || end > file_size {
        return Err(corrupt(
            "the backing file name lies outside the header cluster",
        ));
    }
    Ok(Some((offset, len)))
}

/// Walks the header extensions that fit in the bytes read, returning the backing format.
fn parse_extensions(head: &[u8], mut at: usize) -> Result<Option<String>> {
    let mut format = None;
    while at + 8 <= head.len() {
        let kind = be32(head, at);
        let len = be32(head, at + 4) as usize;
        if kind == EXT_END {
            break;
        }
        let data = at + 8;
        let Some(end) = data.checked_add(len).filter(|&e| e <= head.len()) else {
            // An extension beyond the bytes read: none of those this reader needs.
            break;
        };
        if kind == EXT_BACKING_FORMAT {
            let name = String::from_utf8_lossy(&head[data..end]).into_owned();
            format = Some(name);
        }
        at = data + len.div_ceil(8) * 8;
    }
    Ok(format)
}

#[cfg(test)]
mod tests;
