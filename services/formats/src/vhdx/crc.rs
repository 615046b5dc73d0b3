//! CRC-32C (Castagnoli), as VHDX checksums its headers, region tables and log entries.

/// The CRC-32C of `data` with the four bytes at `skip..skip + 4` read as zeroes (where
/// the checksum itself is stored).
pub fn crc32c_skipping(data: &[u8], skip: usize) -> u32 {
    let mut crc = crc32c::crc32c(&data[..skip]);
    crc = crc32c::crc32c_append(crc, &[0; 4]);
    crc32c::crc32c_append(crc, &data[skip + 4..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_the_checksum_field() {
        let mut data = b"123456789abc".to_vec();
        let plain = crc32c::crc32c(&[b"1234", &[0u8; 4][..], b"9abc"].concat());
        data[4..8].copy_from_slice(&[9, 9, 9, 9]);
        assert_eq!(crc32c_skipping(&data, 4), plain);
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }
}
