//! PDU framing (RFC 7143 section 11): the 48-byte basic header segment, additional header
//! segments, the padded data segment and the optional CRC32C digests.
//!
//! Parsing is pure and bounded: a header announcing more data than the receiver declared
//! (MaxRecvDataSegmentLength) is refused before anything is allocated.

use crate::error::{Error, Result};

pub const BHS_LEN: usize = 48;

/// Opcodes (initiator to target).
pub mod op {
    pub const NOP_OUT: u8 = 0x00;
    pub const SCSI_CMD: u8 = 0x01;
    pub const TMF_REQ: u8 = 0x02;
    pub const LOGIN_REQ: u8 = 0x03;
    pub const TEXT_REQ: u8 = 0x04;
    pub const DATA_OUT: u8 = 0x05;
    pub const LOGOUT_REQ: u8 = 0x06;
    // Target to initiator.
    pub const NOP_IN: u8 = 0x20;
    pub const SCSI_RSP: u8 = 0x21;
    pub const TMF_RSP: u8 = 0x22;
    pub const LOGIN_RSP: u8 = 0x23;
    pub const TEXT_RSP: u8 = 0x24;
    pub const DATA_IN: u8 = 0x25;
    pub const LOGOUT_RSP: u8 = 0x26;
    pub const R2T: u8 = 0x31;
    pub const ASYNC: u8 = 0x32;
    pub const REJECT: u8 = 0x3f;
}

/// The immediate-delivery bit of byte 0.
pub const IMMEDIATE: u8 = 0x40;
/// The final bit of byte 1.
pub const FINAL: u8 = 0x80;
/// The reserved tag value.
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// A basic header segment.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_LEN]);

impl std::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Bhs(op=0x{:02x} flags=0x{:02x} itt=0x{:08x} dsl={})",
            self.opcode(),
            self.flags(),
            self.itt(),
            self.data_len()
        )
    }
}

impl Default for Bhs {
    fn default() -> Self {
        Self([0; BHS_LEN])
    }
}

impl Bhs {
    pub fn new(opcode: u8, flags: u8) -> Self {
        let mut b = Self::default();
        b.0[0] = opcode;
        b.0[1] = flags;
        b
    }
    pub fn opcode(&self) -> u8 {
        self.0[0] & 0x3f
    }
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    pub fn u8_at(&self, i: usize) -> u8 {
        self.0[i]
    }
    pub fn u16_at(&self, i: usize) -> u16 {
        u16::from_be_bytes([self.0[i], self.0[i + 1]])
    }
    pub fn u32_at(&self, i: usize) -> u32 {
        u32::from_be_bytes(self.0[i..i + 4].try_into().unwrap_or([0; 4]))
    }
    pub fn set_u16(&mut self, i: usize, v: u16) {
        self.0[i..i + 2].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_u32(&mut self, i: usize, v: u32) {
        self.0[i..i + 4].copy_from_slice(&v.to_be_bytes());
    }
    pub fn set_u64(&mut self, i: usize, v: u64) {
        self.0[i..i + 8].copy_from_slice(&v.to_be_bytes());
    }
    /// TotalAHSLength in bytes.
    pub fn ahs_len(&self) -> usize {
        usize::from(self.0[4]) * 4
    }
    /// DataSegmentLength (without padding).
    pub fn data_len(&self) -> usize {
        (usize::from(self.0[5]) << 16) | (usize::from(self.0[6]) << 8) | usize::from(self.0[7])
    }
    pub fn set_data_len(&mut self, len: usize) {
        let len = len as u32;
        self.0[5] = (len >> 16) as u8;
        self.0[6] = (len >> 8) as u8;
        self.0[7] = len as u8;
    }
    pub fn itt(&self) -> u32 {
        self.u32_at(16)
    }
    pub fn set_itt(&mut self, v: u32) {
        self.set_u32(16, v)
    }
    pub fn set_lun(&mut self, lun: [u8; 8]) {
        self.0[8..16].copy_from_slice(&lun);
    }
    pub fn lun(&self) -> [u8; 8] {
        self.0[8..16].try_into().unwrap_or([0; 8])
    }
}

/// Padding needed after a data segment of `len` bytes.
pub fn pad(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// The iSCSI CRC32C digest, as its 4 wire bytes.
pub fn digest(parts: &[&[u8]]) -> [u8; 4] {
    let mut crc = 0u32;
    for p in parts {
        crc = crc32c::crc32c_append(crc, p);
    }
    crc.to_le_bytes()
}

/// Digest settings of a connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// Checks a received header against the receive limit and returns the bytes that follow
/// it on the wire before the data segment: AHS and header digest.
pub fn check_header(bhs: &Bhs, max_data: usize) -> Result<()> {
    if bhs.0[0] & 0x80 != 0 {
        return Err(Error::Protocol(format!(
            "reserved bit set in byte 0 of {bhs:?}"
        )));
    }
    if bhs.data_len() > max_data {
        return Err(Error::Protocol(format!(
            "data segment of {} bytes exceeds the {} we declared (MaxRecvDataSegmentLength)",
            bhs.data_len(),
            max_data
        )));
    }
    Ok(())
}

/// A whole PDU held in memory (login, text, responses with sense data).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pdu {
    pub bhs: Bhs,
    pub ahs: Vec<u8>,
    pub data: Vec<u8>,
}

impl Pdu {
    pub fn new(bhs: Bhs, data: Vec<u8>) -> Self {
        Self {
            bhs,
            ahs: Vec::new(),
            data,
        }
    }

    /// The PDU's wire form.
    pub fn encode(&self, digests: Digests) -> Vec<u8> {
        let mut out = Vec::with_capacity(BHS_LEN + self.data.len() + 12);
        encode_into(&mut out, &self.bhs, &self.data, digests);
        out
    }

    /// Parses one PDU from the start of `buf`: Ok(None) when more bytes are needed, else the
    /// PDU and how many bytes it took. Data segments above `max_data` are errors.
    pub fn parse(buf: &[u8], digests: Digests, max_data: usize) -> Result<Option<(Pdu, usize)>> {
        if buf.len() < BHS_LEN {
            return Ok(None);
        }
        let mut bhs = Bhs::default();
        bhs.0.copy_from_slice(&buf[..BHS_LEN]);
        check_header(&bhs, max_data)?;
        let ahs = bhs.ahs_len();
        let hd = if digests.header { 4 } else { 0 };
        let dl = bhs.data_len();
        let padded = dl + pad(dl);
        let dd = if digests.data && dl > 0 { 4 } else { 0 };
        let total = BHS_LEN + ahs + hd + padded + dd;
        if buf.len() < total {
            return Ok(None);
        }
        if digests.header {
            let got = &buf[BHS_LEN + ahs..BHS_LEN + ahs + 4];
            if digest(&[&buf[..BHS_LEN + ahs]]) != got {
                return Err(Error::Protocol("header digest mismatch".into()));
            }
        }
        let start = BHS_LEN + ahs + hd;
        if dd == 4 {
            let got = &buf[start + padded..start + padded + 4];
            if digest(&[&buf[start..start + padded]]) != got {
                return Err(Error::Protocol("data digest mismatch".into()));
            }
        }
        Ok(Some((
            Pdu {
                bhs,
                ahs: buf[BHS_LEN..BHS_LEN + ahs].to_vec(),
                data: buf[start..start + dl].to_vec(),
            },
            total,
        )))
    }
}

/// Appends the wire form of a PDU with header `bhs` (its data length is set here) and data.
pub fn encode_into(out: &mut Vec<u8>, bhs: &Bhs, data: &[u8], digests: Digests) {
    let mut bhs = *bhs;
    bhs.0[4] = 0;
    bhs.set_data_len(data.len());
    out.extend_from_slice(&bhs.0);
    if digests.header {
        out.extend_from_slice(&digest(&[&bhs.0]));
    }
    if !data.is_empty() {
        out.extend_from_slice(data);
        let p = pad(data.len());
        out.extend_from_slice(&[0u8; 3][..p]);
        if digests.data {
            out.extend_from_slice(&digest(&[data, &[0u8; 3][..p]]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_rfc_test_vector() {
        // RFC 3720 B.4: 32 bytes of zeroes -> CRC 0x8a9136aa, sent as aa 36 91 8a.
        assert_eq!(digest(&[&[0u8; 32]]), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(digest(&[&[0xffu8; 32]]), 0x62a8ab43u32.to_le_bytes());
    }

    #[test]
    fn round_trip_with_digests() {
        for digests in [
            Digests::default(),
            Digests {
                header: true,
                data: true,
            },
        ] {
            let mut bhs = Bhs::new(op::TEXT_RSP, FINAL);
            bhs.set_itt(7);
            let pdu = Pdu::new(bhs, b"abcde".to_vec());
            let wire = pdu.encode(digests);
            assert_eq!(wire.len() % 4, 0);
            for cut in 0..wire.len() {
                assert!(Pdu::parse(&wire[..cut], digests, 8192).unwrap().is_none());
            }
            let (back, used) = Pdu::parse(&wire, digests, 8192).unwrap().unwrap();
            assert_eq!(used, wire.len());
            assert_eq!(back.data, b"abcde");
            assert_eq!(back.bhs.itt(), 7);
            if digests.data {
                let mut bad = wire.clone();
                let n = bad.len();
                bad[n - 6] ^= 1;
                assert!(Pdu::parse(&bad, digests, 8192).is_err());
            }
        }
    }

    #[test]
    fn oversized_segment_is_refused() {
        let mut bhs = Bhs::new(op::DATA_IN, 0);
        bhs.set_data_len(0xff_ffff);
        assert!(Pdu::parse(&bhs.0, Digests::default(), 262144).is_err());
    }
}
