//! Checksum headers: the CRC32C of a body, sent as the `x-amz-checksum-crc32c` header of
//! an upload so the store checks what it received.
//!
//! The SDK's default is a trailing checksum in an aws-chunked body, which re-frames the
//! body and hashes every byte once more on both sides; a header computed up front does
//! neither. Image parts (ferry-endpoints) and repository objects (ferry-backup) both use it.

/// The `x-amz-checksum-crc32c` value of `data`, sent with an upload instead of the
/// SDK's default trailing checksum, which needs the body re-framed (aws-chunked).
pub fn crc32c_header(data: &[u8]) -> String {
    let mut crc = aws_smithy_checksums::ChecksumAlgorithm::Crc32c.into_impl();
    crc.update(data);
    crc.header_value()
        .to_str()
        .expect("base64 is ASCII")
        .to_string()
}
