//! PDU framing (RFC 7143 section 11): the 48-byte basic header segment, additional header
//! segments, the padded data segment and the optional CRC32C digests.
//!
//! Parsing is pure and bounded: a header announcing more data than the receiver declared
//! (MaxRecvDataSegmentLength) is refused before anything is allocated.

use crate::error::{Error, Result};

pub use crate::bhs::{op, Bhs, BHS_LEN, FINAL, IMMEDIATE, RESERVED_TAG};

/// Padding needed after a data segment of `len` bytes.
pub fn pad(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// The zero bytes that pad a data segment of `len` bytes to a multiple of 4.
pub fn padding(len: usize) -> &'static [u8] {
    &[0u8; 3][..pad(len)]
}

/// The iSCSI CRC32C digest, as its 4 wire bytes.
pub fn digest(parts: &[&[u8]]) -> [u8; 4] {
    let mut crc = 0u32;
    for p in parts {
        crc = crc32c::crc32c_append(crc, p);
    }
    crc.to_le_bytes()
}

/// Length of a CRC32C digest on the wire.
pub const DIGEST_LEN: usize = 4;
/// Most bytes that follow a data segment: padding and a data digest.
pub const MAX_DATA_TAIL: usize = 3 + DIGEST_LEN;

/// Digest settings of a connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

impl Digests {
    /// Bytes of header digest after the header and its AHS.
    pub fn header_len(self) -> usize {
        if self.header {
            DIGEST_LEN
        } else {
            0
        }
    }
    /// Bytes of data digest after a data segment of `data_len` bytes (none when empty).
    pub fn data_len(self, data_len: usize) -> usize {
        if self.data && data_len > 0 {
            DIGEST_LEN
        } else {
            0
        }
    }
}

/// Checks a received header against the receive limit and returns the bytes that follow
/// it on the wire before the data segment: AHS and header digest.
pub fn check_header(bhs: &Bhs, max_data: usize) -> Result<()> {
    if bhs.reserved_bit() {
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
        let most = BHS_LEN + DIGEST_LEN + self.data.len() + MAX_DATA_TAIL;
        let mut out = Vec::with_capacity(most);
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
        let hd = digests.header_len();
        let dl = bhs.data_len();
        let padded = dl + pad(dl);
        let dd = digests.data_len(dl);
        let total = BHS_LEN + ahs + hd + padded + dd;
        if buf.len() < total {
            return Ok(None);
        }
        if digests.header {
            let got = &buf[BHS_LEN + ahs..BHS_LEN + ahs + DIGEST_LEN];
            if digest(&[&buf[..BHS_LEN + ahs]]) != got {
                return Err(Error::Protocol("header digest mismatch".into()));
            }
        }
        let start = BHS_LEN + ahs + hd;
        if dd == DIGEST_LEN {
            let got = &buf[start + padded..start + padded + DIGEST_LEN];
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
    bhs.clear_ahs_len();
    bhs.set_data_len(data.len());
    out.extend_from_slice(&bhs.0);
    if digests.header {
        out.extend_from_slice(&digest(&[&bhs.0]));
    }
    if !data.is_empty() {
        out.extend_from_slice(data);
        let p = padding(data.len());
        out.extend_from_slice(p);
        if digests.data {
            out.extend_from_slice(&digest(&[data, p]));
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
            let bhs = crate::bhs::TextResponse {
                final_: true,
                itt: 7,
                ..Default::default()
            }
            .to_bhs();
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
        let mut bhs = crate::bhs::DataIn::default().to_bhs();
        bhs.set_data_len(0xff_ffff);
        assert!(Pdu::parse(&bhs.0, Digests::default(), 262144).is_err());
    }
}
