//! The blob format of chunks and indexes: a 16-byte header, then the payload.
//!
//! ```text
//! magic    8 bytes   FRYBLOBP plain | FRYBLOBZ zstd | FRYBLOBE encrypted | FRYBLOBX encrypted zstd
//! length   8 bytes   little-endian length of the plaintext
//! payload            plain: the plaintext
//!                    zstd: one zstd frame
//!                    encrypted: 12-byte nonce, AES-256-GCM ciphertext, 16-byte tag;
//!                    the header is the associated data, so it cannot be altered either
//! ```
//!
//! Compression is kept only when it shrinks the data. Decoding never allocates more than
//! the caller's limit, whatever the header claims, and a failed tag is reported as "wrong
//! key or corrupt blob".

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use ferry_core::{Error, ErrorKind, Result};

use crate::keys::random;

const MAGIC_PLAIN: [u8; 8] = *b"FRYBLOBP";
const MAGIC_ZSTD: [u8; 8] = *b"FRYBLOBZ";
const MAGIC_ENC: [u8; 8] = *b"FRYBLOBE";
const MAGIC_ENC_ZSTD: [u8; 8] = *b"FRYBLOBX";
/// Magic and plaintext length.
pub(crate) const HEADER_LEN: usize = 16;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// The most a stored blob can exceed its plaintext: the header and the encryption.
pub(crate) const OVERHEAD: u64 = (HEADER_LEN + NONCE_LEN + TAG_LEN) as u64;

/// Encodes and decodes blobs of one repository: its compression and, when encrypted, its
/// chunk key.
pub(crate) struct Codec {
    zstd_level: Option<i32>,
    cipher: Option<Aes256Gcm>,
}

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codec")
            .field("zstd_level", &self.zstd_level)
            .field("encrypted", &self.cipher.is_some())
            .finish()
    }
}

fn corrupt(message: String) -> Error {
    Error::new(ErrorKind::Corrupt, message)
}

impl Codec {
    pub(crate) fn new(zstd_level: Option<i32>, chunk_key: Option<&[u8; 32]>) -> Result<Self> {
        let cipher = chunk_key
            .map(|key| Aes256Gcm::new_from_slice(key).map_err(|_| Error::internal("AES key length")))
            .transpose()?;
        Ok(Self { zstd_level, cipher })
    }

    pub(crate) fn encrypted(&self) -> bool {
        self.cipher.is_some()
    }

    /// Encodes `plain` as a blob.
    pub(crate) fn encode(&self, plain: &[u8]) -> Result<Vec<u8>> {
        let compressed = match self.zstd_level {
            Some(level) => {
                let out = zstd::bulk::compress(plain, level)
                    .map_err(|e| Error::internal(format!("zstd compression failed: {e}")))?;
                (out.len() < plain.len()).then_some(out)
            }
            None => None,
        };
        let (magic, payload) = match (&self.cipher, &compressed) {
            (None, None) => (MAGIC_PLAIN, plain),
            (None, Some(c)) => (MAGIC_ZSTD, c.as_slice()),
            (Some(_), None) => (MAGIC_ENC, plain),
            (Some(_), Some(c)) => (MAGIC_ENC_ZSTD, c.as_slice()),
        };
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(&magic);
        header[8..].copy_from_slice(&(plain.len() as u64).to_le_bytes());
        let Some(cipher) = &self.cipher else {
            return Ok([header.as_slice(), payload].concat());
        };
        let nonce: [u8; NONCE_LEN] = random()?;
        let sealed = cipher
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: payload, aad: &header })
            .map_err(|_| Error::internal("AES-GCM encryption failed"))?;
        Ok([header.as_slice(), &nonce, &sealed].concat())
    }

    /// Decodes a blob whose plaintext may be at most `max_plain` bytes.
    pub(crate) fn decode(&self, blob: &[u8], max_plain: u64) -> Result<Vec<u8>> {
        if blob.len() < HEADER_LEN {
            return Err(corrupt(format!("the blob is truncated ({} bytes, less than its header)", blob.len())));
        }
        let (header, body) = blob.split_at(HEADER_LEN);
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&header[..8]);
        let mut len = [0u8; 8];
        len.copy_from_slice(&header[8..]);
        let declared = u64::from_le_bytes(len);
        if declared > max_plain {
            return Err(corrupt(format!(
                "the blob claims {declared} bytes, more than the {max_plain} it may hold"
            )));
        }
        let (encrypted, compressed) = match magic {
            MAGIC_PLAIN => (false, false),
            MAGIC_ZSTD => (false, true),
            MAGIC_ENC => (true, false),
            MAGIC_ENC_ZSTD => (true, true),
            _ => return Err(corrupt("not a ferry blob (unknown magic)".to_string())),
        };
        let opened;
        let payload = match (encrypted, &self.cipher) {
            (false, None) => body,
            (false, Some(_)) => {
                return Err(corrupt(
                    "an unencrypted blob in an encrypted repository: it was not written by this repository".to_string(),
                ))
            }
            (true, None) => {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    "an encrypted blob in a repository opened without a key",
                ))
            }
            (true, Some(cipher)) => {
                if body.len() < NONCE_LEN + TAG_LEN || (body.len() - NONCE_LEN - TAG_LEN) as u64 > declared {
                    return Err(corrupt(format!("the encrypted blob is truncated or oversized ({} bytes)", blob.len())));
                }
                let (nonce, sealed) = body.split_at(NONCE_LEN);
                opened = cipher
                    .decrypt(Nonce::from_slice(nonce), Payload { msg: sealed, aad: header })
                    .map_err(|_| corrupt("wrong key or corrupt blob (authentication failed)".to_string()))?;
                opened.as_slice()
            }
        };
        let plain = if compressed {
            if payload.len() as u64 >= declared.max(1) {
                return Err(corrupt("a compressed blob is not smaller than its plaintext".to_string()));
            }
            let out = zstd::bulk::decompress(payload, declared as usize)
                .map_err(|e| corrupt(format!("the blob's zstd data is damaged: {e}")))?;
            if out.len() as u64 != declared {
                return Err(corrupt(format!(
                    "the blob decompressed to {} bytes, not the {declared} its header says",
                    out.len()
                )));
            }
            out
        } else {
            if payload.len() as u64 != declared {
                return Err(corrupt(format!(
                    "the blob holds {} bytes, not the {declared} its header says (truncated or damaged)",
                    payload.len()
                )));
            }
            payload.to_vec()
        };
        Ok(plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codecs() -> Vec<(&'static str, Codec)> {
        let key = [7u8; 32];
        vec![
            ("plain", Codec::new(None, None).unwrap()),
            ("zstd", Codec::new(Some(3), None).unwrap()),
            ("encrypted", Codec::new(None, Some(&key)).unwrap()),
            ("encrypted zstd", Codec::new(Some(3), Some(&key)).unwrap()),
        ]
    }

    fn compressible() -> Vec<u8> {
        (0..100_000u32).map(|i| (i % 7) as u8).collect()
    }

    #[test]
    fn every_kind_round_trips_and_has_its_own_magic() {
        let data = compressible();
        let mut magics = Vec::new();
        for (name, codec) in codecs() {
            let blob = codec.encode(&data).unwrap();
            magics.push(blob[..8].to_vec());
            assert_eq!(codec.decode(&blob, data.len() as u64).unwrap(), data, "{name}");
        }
        magics.sort();
        magics.dedup();
        assert_eq!(magics.len(), 4);
    }

    #[test]
    fn incompressible_data_is_stored_as_is() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let codec = Codec::new(Some(3), None).unwrap();
        let blob = codec.encode(&data).unwrap();
        assert_eq!(&blob[..8], b"FRYBLOBP");
        assert_eq!(blob.len(), data.len() + HEADER_LEN);
    }

    #[test]
    fn truncated_oversized_and_flipped_blobs_are_refused() {
        let data = compressible();
        for (name, codec) in codecs() {
            let blob = codec.encode(&data).unwrap();
            for cut in [0, 5, HEADER_LEN, blob.len() - 1] {
                let err = codec.decode(&blob[..cut], data.len() as u64).unwrap_err();
                assert_eq!(err.kind(), ErrorKind::Corrupt, "{name} cut at {cut}: {err}");
            }
            let err = codec.decode(&blob, data.len() as u64 - 1).unwrap_err();
            assert!(err.to_string().contains("more than"), "{name}: {err}");
            let mut flipped = blob.clone();
            let last = flipped.len() - 1;
            flipped[last] ^= 0x01;
            // A flip in a plain blob changes the data: the chunk digest check catches it.
            if name.starts_with("encrypted") {
                let err = codec.decode(&flipped, data.len() as u64).unwrap_err();
                assert!(err.to_string().contains("wrong key or corrupt blob"), "{name}: {err}");
            }
        }
    }

    #[test]
    fn a_header_claiming_gigabytes_allocates_nothing() {
        let mut blob = b"FRYBLOBZ".to_vec();
        blob.extend_from_slice(&(1u64 << 40).to_le_bytes());
        blob.extend_from_slice(&[0u8; 64]);
        let err = Codec::new(Some(3), None).unwrap().decode(&blob, 4 << 20).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
    }

    #[test]
    fn the_wrong_key_is_named() {
        let blob = Codec::new(None, Some(&[1; 32])).unwrap().encode(b"secret data").unwrap();
        let err = Codec::new(None, Some(&[2; 32])).unwrap().decode(&blob, 100).unwrap_err();
        assert!(err.to_string().contains("wrong key or corrupt blob"), "{err}");
        let err = Codec::new(None, None).unwrap().decode(&blob, 100).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    }
}
