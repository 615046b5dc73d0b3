//! SCSI commands and answers (SPC-4, SBC-3): CDB builders, sense data, INQUIRY VPD pages,
//! READ CAPACITY(16) and GET LBA STATUS parameter data.

use std::fmt;

use crate::error::{Error, Result};

pub const STATUS_GOOD: u8 = 0x00;
pub const STATUS_CHECK_CONDITION: u8 = 0x02;

/// Operation codes (byte 0 of a CDB).
pub mod opcode {
    pub const INQUIRY: u8 = 0x12;
    pub const UNMAP: u8 = 0x42;
    pub const READ_16: u8 = 0x88;
    pub const WRITE_16: u8 = 0x8a;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    /// SERVICE ACTION IN(16): READ CAPACITY(16) and GET LBA STATUS.
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
}

/// Service actions of SERVICE ACTION IN(16) (byte 1 of its CDB).
const READ_CAPACITY_16: u8 = 0x10;
const GET_LBA_STATUS: u8 = 0x12;
/// INQUIRY's EVPD bit: return the vital product data page named in byte 2.
const EVPD: u8 = 0x01;
/// WRITE SAME(16)'s UNMAP bit.
const WRITE_SAME_UNMAP: u8 = 0x08;

/// Vital product data pages.
pub mod vpd {
    pub const SUPPORTED_PAGES: u8 = 0x00;
    pub const BLOCK_LIMITS: u8 = 0xb0;
    pub const LOGICAL_BLOCK_PROVISIONING: u8 = 0xb2;
}

/// The sense key of a unit attention (reported once after login or a reset).
pub const SENSE_KEY_UNIT_ATTENTION: u8 = 0x6;
/// The peripheral device type of a direct-access block device.
pub const PERIPHERAL_DISK: u8 = 0x00;

/// Names a SCSI status byte.
pub fn status_name(status: u8) -> &'static str {
    match status {
        0x00 => "GOOD",
        0x02 => "CHECK CONDITION",
        0x04 => "CONDITION MET",
        0x08 => "BUSY",
        0x18 => "RESERVATION CONFLICT",
        0x28 => "TASK SET FULL",
        0x30 => "ACA ACTIVE",
        0x40 => "TASK ABORTED",
        _ => "unknown status",
    }
}

pub fn inquiry(page: Option<u8>, alloc: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode::INQUIRY;
    if let Some(p) = page {
        c[1] = EVPD;
        c[2] = p;
    }
    c[3..5].copy_from_slice(&alloc.to_be_bytes());
    c
}

pub fn read_capacity16(alloc: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode::SERVICE_ACTION_IN_16;
    c[1] = READ_CAPACITY_16;
    c[10..14].copy_from_slice(&alloc.to_be_bytes());
    c
}

pub fn get_lba_status(lba: u64, alloc: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode::SERVICE_ACTION_IN_16;
    c[1] = GET_LBA_STATUS;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&alloc.to_be_bytes());
    c
}

fn rw16(opcode: u8, flags: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(opcode::READ_16, 0, lba, blocks)
}

pub fn write16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(opcode::WRITE_16, 0, lba, blocks)
}

/// WRITE SAME(16); `unmap` sets the UNMAP bit.
pub fn write_same16(lba: u64, blocks: u32, unmap: bool) -> [u8; 16] {
    let flags = if unmap { WRITE_SAME_UNMAP } else { 0 };
    rw16(opcode::WRITE_SAME_16, flags, lba, blocks)
}

pub fn sync_cache16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(opcode::SYNCHRONIZE_CACHE_16, 0, lba, blocks)
}

/// UNMAP's CDB (10 bytes, padded to 16) and parameter list for `ranges` of (lba, blocks).
pub fn unmap(ranges: &[(u64, u32)]) -> ([u8; 16], Vec<u8>) {
    let len = 8 + 16 * ranges.len();
    let mut p = vec![0u8; len];
    p[0..2].copy_from_slice(&((len - 2) as u16).to_be_bytes());
    p[2..4].copy_from_slice(&((16 * ranges.len()) as u16).to_be_bytes());
    for (i, (lba, n)) in ranges.iter().enumerate() {
        let d = &mut p[8 + 16 * i..8 + 16 * (i + 1)];
        d[0..8].copy_from_slice(&lba.to_be_bytes());
        d[8..12].copy_from_slice(&n.to_be_bytes());
    }
    let mut c = [0u8; 16];
    c[0] = opcode::UNMAP;
    c[7..9].copy_from_slice(&(len as u16).to_be_bytes());
    (c, p)
}

/// Decoded sense data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
}

impl Sense {
    /// Parses fixed (0x70/0x71) or descriptor (0x72/0x73) format sense data.
    pub fn parse(data: &[u8]) -> Option<Self> {
        let code = data.first()? & 0x7f;
        match code {
            0x70 | 0x71 => Some(Self {
                key: data.get(2)? & 0x0f,
                asc: data.get(12).copied().unwrap_or(0),
                ascq: data.get(13).copied().unwrap_or(0),
            }),
            0x72 | 0x73 => Some(Self {
                key: data.get(1)? & 0x0f,
                asc: data.get(2).copied().unwrap_or(0),
                ascq: data.get(3).copied().unwrap_or(0),
            }),
            _ => None,
        }
    }

    pub fn key_name(&self) -> &'static str {
        match self.key {
            0x0 => "NO SENSE",
            0x1 => "RECOVERED ERROR",
            0x2 => "NOT READY",
            0x3 => "MEDIUM ERROR",
            0x4 => "HARDWARE ERROR",
            0x5 => "ILLEGAL REQUEST",
            0x6 => "UNIT ATTENTION",
            0x7 => "DATA PROTECT",
            0x8 => "BLANK CHECK",
            0xb => "ABORTED COMMAND",
            0xd => "VOLUME OVERFLOW",
            0xe => "MISCOMPARE",
            _ => "RESERVED",
        }
    }

    /// The name of the additional sense code, for the common ones.
    pub fn asc_name(&self) -> &'static str {
        match (self.asc, self.ascq) {
            (0x00, 0x00) => "no additional sense information",
            (0x04, _) => "logical unit not ready",
            (0x0c, 0x00) => "write error",
            (0x11, 0x00) => "unrecovered read error",
            (0x1a, 0x00) => "parameter list length error",
            (0x20, 0x00) => "invalid command operation code",
            (0x21, 0x00) => "logical block address out of range",
            (0x24, 0x00) => "invalid field in CDB",
            (0x25, 0x00) => "logical unit not supported",
            (0x26, 0x00) => "invalid field in parameter list",
            (0x27, _) => "write protected",
            (0x28, 0x00) => "not ready to ready change, medium may have changed",
            (0x29, _) => "power on, reset, or bus device reset occurred",
            (0x2a, _) => "parameters changed",
            (0x3a, _) => "medium not present",
            (0x55, 0x03) => "insufficient resources",
            _ => "unknown additional sense code",
        }
    }
}

impl fmt::Display for Sense {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CHECK CONDITION: sense key {} (0x{:x}), ASC/ASCQ 0x{:02x}/0x{:02x} ({})",
            self.key_name(),
            self.key,
            self.asc,
            self.ascq,
            self.asc_name()
        )
    }
}

/// The standard INQUIRY data fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inquiry {
    pub peripheral_type: u8,
    pub vendor: String,
    pub product: String,
    pub revision: String,
}

fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}

impl Inquiry {
    pub fn parse(d: &[u8]) -> Result<Self> {
        if d.len() < 36 {
            return Err(Error::Protocol(format!(
                "INQUIRY data of {} bytes, want 36",
                d.len()
            )));
        }
        Ok(Self {
            peripheral_type: d[0] & 0x1f,
            vendor: ascii(&d[8..16]),
            product: ascii(&d[16..32]),
            revision: ascii(&d[32..36]),
        })
    }
}

fn be32(d: &[u8], i: usize) -> u32 {
    d.get(i..i + 4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(0)
}

fn be64(d: &[u8], i: usize) -> u64 {
    d.get(i..i + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0)
}

/// The Block Limits VPD page (0xB0). Zero means "not reported".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockLimits {
    pub optimal_granularity: u32,
    pub max_transfer: u32,
    pub optimal_transfer: u32,
    pub max_unmap_lba_count: u32,
    pub max_unmap_descriptors: u32,
    pub unmap_granularity: u32,
    pub max_write_same: u64,
}

impl BlockLimits {
    pub fn parse(d: &[u8]) -> Result<Self> {
        if d.len() < 16 || d[1] != vpd::BLOCK_LIMITS {
            return Err(Error::Protocol("malformed Block Limits VPD page".into()));
        }
        Ok(Self {
            optimal_granularity: u32::from(u16::from_be_bytes([d[6], d[7]])),
            max_transfer: be32(d, 8),
            optimal_transfer: be32(d, 12),
            max_unmap_lba_count: be32(d, 20),
            max_unmap_descriptors: be32(d, 24),
            unmap_granularity: be32(d, 28),
            max_write_same: be64(d, 36),
        })
    }
}

/// The Logical Block Provisioning VPD page (0xB2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Provisioning {
    /// UNMAP is supported.
    pub lbpu: bool,
    /// WRITE SAME(16) with UNMAP is supported.
    pub lbpws: bool,
    /// Deallocated blocks read as zeroes.
    pub lbprz: bool,
    /// 0 full, 1 resource, 2 thin.
    pub provisioning_type: u8,
}

impl Provisioning {
    pub fn parse(d: &[u8]) -> Result<Self> {
        if d.len() < 8 || d[1] != vpd::LOGICAL_BLOCK_PROVISIONING {
            return Err(Error::Protocol(
                "malformed Logical Block Provisioning VPD page".into(),
            ));
        }
        Ok(Self {
            lbpu: d[5] & 0x80 != 0,
            lbpws: d[5] & 0x40 != 0,
            lbprz: d[5] & 0x1c != 0,
            provisioning_type: d[6] & 0x07,
        })
    }
}

/// READ CAPACITY(16) data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub blocks: u64,
    pub block_size: u32,
    /// Logical block provisioning management enabled (thin).
    pub lbpme: bool,
    /// Deallocated blocks read as zeroes.
    pub lbprz: bool,
}

impl Capacity {
    pub fn parse(d: &[u8]) -> Result<Self> {
        if d.len() < 16 {
            return Err(Error::Protocol("short READ CAPACITY(16) data".into()));
        }
        let last = be64(d, 0);
        let block_size = be32(d, 8);
        if block_size == 0 || !block_size.is_power_of_two() || block_size > 1 << 20 {
            return Err(Error::Protocol(format!("bad block size {block_size}")));
        }
        Ok(Self {
            blocks: last
                .checked_add(1)
                .ok_or_else(|| Error::Protocol("capacity overflows".into()))?,
            block_size,
            lbpme: d[14] & 0x80 != 0,
            lbprz: d[14] & 0x40 != 0,
        })
    }

    pub fn bytes(&self) -> Option<u64> {
        self.blocks.checked_mul(u64::from(self.block_size))
    }
}

/// Provisioning status of a range of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbaStatus {
    Mapped,
    Deallocated,
    Anchored,
}

/// One GET LBA STATUS descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbaExtent {
    pub lba: u64,
    pub blocks: u32,
    pub status: LbaStatus,
}

/// Parses GET LBA STATUS parameter data.
pub fn parse_lba_status(d: &[u8]) -> Result<Vec<LbaExtent>> {
    if d.len() < 8 {
        return Err(Error::Protocol("short GET LBA STATUS data".into()));
    }
    let avail = (be32(d, 0) as usize).saturating_add(4).min(d.len());
    let mut out = Vec::new();
    let mut i = 8;
    while i + 16 <= avail {
        let status = match d[i + 12] & 0x0f {
            0 => LbaStatus::Mapped,
            1 => LbaStatus::Deallocated,
            2 => LbaStatus::Anchored,
            s => return Err(Error::Protocol(format!("unknown provisioning status {s}"))),
        };
        out.push(LbaExtent {
            lba: be64(d, i),
            blocks: be32(d, i + 8),
            status,
        });
        i += 16;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sense_formats() {
        let mut fixed = [0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x05;
        fixed[12] = 0x21;
        let s = Sense::parse(&fixed).unwrap();
        assert_eq!((s.key, s.asc, s.ascq), (5, 0x21, 0));
        let text = s.to_string();
        assert!(
            text.contains("ILLEGAL REQUEST") && text.contains("0x21/0x00"),
            "{text}"
        );
        assert!(text.contains("out of range"));
        let desc = [0x72, 0x03, 0x11, 0x00];
        assert_eq!(Sense::parse(&desc).unwrap().key, 3);
        assert!(Sense::parse(&[]).is_none());
        assert!(Sense::parse(&[0x70]).is_none());
    }

    #[test]
    fn capacity_and_lba_status() {
        let mut d = [0u8; 32];
        d[7] = 0xff;
        d[10] = 0x02;
        d[14] = 0xc0;
        let c = Capacity::parse(&d).unwrap();
        assert_eq!(
            (c.blocks, c.block_size, c.lbpme, c.lbprz),
            (256, 512, true, true)
        );
        let mut s = vec![0u8; 40];
        s[3] = 36;
        s[15] = 8;
        s[19] = 16;
        s[20] = 1;
        s[23] = 24;
        s[27] = 8;
        s[28] = 0;
        let e = parse_lba_status(&s).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(
            e[0],
            LbaExtent {
                lba: 8,
                blocks: 16,
                status: LbaStatus::Deallocated
            }
        );
        assert_eq!(e[1].status, LbaStatus::Mapped);
    }

    #[test]
    fn unmap_parameters() {
        let (c, p) = unmap(&[(1, 2), (10, 20)]);
        assert_eq!(c[0], 0x42);
        assert_eq!(p.len(), 40);
        assert_eq!(u16::from_be_bytes([c[7], c[8]]), 40);
        assert_eq!(u16::from_be_bytes([p[0], p[1]]), 38);
        assert_eq!(u16::from_be_bytes([p[2], p[3]]), 32);
    }
}
