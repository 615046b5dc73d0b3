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

use std::cell::RefCell;

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce, Tag};
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
            .map(|key| {
                Aes256Gcm::new_from_slice(key).map_err(|_| Error::internal("AES key length"))
            })
            .transpose()?;
        Ok(Self { zstd_level, cipher })
    }

    pub(crate) fn encrypted(&self) -> bool {
        self.cipher.is_some()
    }

    /// Encodes `plain` as a blob, in one allocation: the header, then the payload
    /// compressed (by this thread's reused zstd context) or copied, then sealed in place.
    pub(crate) fn encode(&self, plain: &[u8]) -> Result<Vec<u8>> {
        let prefix = if self.cipher.is_some() {
            HEADER_LEN + NONCE_LEN
        } else {
            HEADER_LEN
        };
        let mut out = Vec::new();
        let compressed = match self.zstd_level {
            Some(level) => compress_after(plain, level, prefix, &mut out)?,
            None => false,
        };
        if !compressed {
            out.clear();
            out.reserve_exact(prefix + plain.len() + TAG_LEN);
            out.resize(prefix, 0);
            out.extend_from_slice(plain);
        }
        let magic = match (self.cipher.is_some(), compressed) {
            (false, false) => MAGIC_PLAIN,
            (false, true) => MAGIC_ZSTD,
            (true, false) => MAGIC_ENC,
            (true, true) => MAGIC_ENC_ZSTD,
        };
        out[..8].copy_from_slice(&magic);
        out[8..HEADER_LEN].copy_from_slice(&(plain.len() as u64).to_le_bytes());
        let Some(cipher) = &self.cipher else {
            return Ok(out);
        };
        let nonce: [u8; NONCE_LEN] = random()?;
        out[HEADER_LEN..prefix].copy_from_slice(&nonce);
        let (head, payload) = out.split_at_mut(prefix);
        let tag = cipher
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), &head[..HEADER_LEN], payload)
            .map_err(|_| Error::internal("AES-GCM encryption failed"))?;
        out.extend_from_slice(&tag);
        Ok(out)
    }

    /// Decodes a blob whose plaintext may be at most `max_plain` bytes.
    pub(crate) fn decode(&self, blob: &[u8], max_plain: u64) -> Result<Vec<u8>> {
        let parsed = self.open(blob, max_plain)?;
        let mut out = vec![0u8; parsed.declared];
        parsed.write_into(&mut out)?;
        Ok(out)
    }

    /// Decodes a blob into the front of `out`, which bounds the plaintext's length;
    /// returns that length.
    pub(crate) fn decode_into(&self, blob: &[u8], out: &mut [u8]) -> Result<usize> {
        let parsed = self.open(blob, out.len() as u64)?;
        parsed.write_into(&mut out[..parsed.declared])?;
        Ok(parsed.declared)
    }

    /// Checks a blob's header, and decrypts it when encrypted.
    fn open<'b>(&self, blob: &'b [u8], max_plain: u64) -> Result<Opened<'b>> {
        if blob.len() < HEADER_LEN {
            return Err(corrupt(format!(
                "the blob is truncated ({} bytes, less than its header)",
                blob.len()
            )));
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
        let payload = match (encrypted, &self.cipher) {
            (false, None) => Payload::Borrowed(body),
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
                let (sealed, tag) = sealed.split_at(sealed.len() - TAG_LEN);
                let mut opened = sealed.to_vec();
                cipher
                    .decrypt_in_place_detached(Nonce::from_slice(nonce), header, &mut opened, Tag::from_slice(tag))
                    .map_err(|_| corrupt("wrong key or corrupt blob (authentication failed)".to_string()))?;
                Payload::Owned(opened)
            }
        };
        Ok(Opened {
            payload,
            compressed,
            declared: declared as usize,
        })
    }
}

/// A blob's payload in the clear, not yet decompressed.
struct Opened<'b> {
    payload: Payload<'b>,
    compressed: bool,
    declared: usize,
}

enum Payload<'b> {
    Borrowed(&'b [u8]),
    Owned(Vec<u8>),
}

impl Opened<'_> {
    /// Writes the plaintext into `out` (exactly the declared length).
    fn write_into(&self, out: &mut [u8]) -> Result<()> {
        let payload = match &self.payload {
            Payload::Borrowed(b) => b,
            Payload::Owned(v) => v.as_slice(),
        };
        let declared = self.declared;
        if !self.compressed {
            if payload.len() != declared {
                return Err(corrupt(format!(
                    "the blob holds {} bytes, not the {declared} its header says (truncated or damaged)",
                    payload.len()
                )));
            }
            out.copy_from_slice(payload);
            return Ok(());
        }
        if payload.len() >= declared.max(1) {
            return Err(corrupt(
                "a compressed blob is not smaller than its plaintext".to_string(),
            ));
        }
        let n = DECOMPRESSOR
            .with(|d| {
                let mut d = d.borrow_mut();
                let d = match d.as_mut() {
                    Some(d) => d,
                    None => d.insert(zstd::bulk::Decompressor::new()?),
                };
                d.decompress_to_buffer(payload, out)
            })
            .map_err(|e| corrupt(format!("the blob's zstd data is damaged: {e}")))?;
        if n != declared {
            return Err(corrupt(format!(
                "the blob decompressed to {n} bytes, not the {declared} its header says"
            )));
        }
        Ok(())
    }
}

thread_local! {
    /// Each thread's zstd contexts, kept between chunks: a context for 4 MiB inputs holds
    /// about a MiB of tables, which allocating anew for every chunk costs page faults.
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Compresses `plain` into `out` after `prefix` bytes (left as zeroes for the header).
/// `false`: compression does not shrink it (`out` is then undefined).
fn compress_after(plain: &[u8], level: i32, prefix: usize, out: &mut Vec<u8>) -> Result<bool> {
    let room = zstd::zstd_safe::compress_bound(plain.len());
    out.clear();
    out.reserve_exact(prefix + room + TAG_LEN);
    out.resize(prefix, 0);
    let mut cursor = std::io::Cursor::new(std::mem::take(out));
    cursor.set_position(prefix as u64);
    let written = COMPRESSOR.with(|c| -> std::io::Result<usize> {
        let mut c = c.borrow_mut();
        let compressor = match c.as_mut() {
            Some((l, compressor)) if *l == level => compressor,
            _ => &mut c.insert((level, zstd::bulk::Compressor::new(level)?)).1,
        };
        compressor.compress_to_buffer(plain, &mut cursor)
    });
    *out = cursor.into_inner();
    let n = written.map_err(|e| Error::internal(format!("zstd compression failed: {e}")))?;
    out.truncate(prefix + n);
    Ok(n < plain.len())
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
            assert_eq!(
                codec.decode(&blob, data.len() as u64).unwrap(),
                data,
                "{name}"
            );
        }
        magics.sort();
        magics.dedup();
        assert_eq!(magics.len(), 4);
    }

    #[test]
    fn incompressible_data_is_stored_as_is() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let data: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
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
                assert!(
                    err.to_string().contains("wrong key or corrupt blob"),
                    "{name}: {err}"
                );
            }
        }
    }

    #[test]
    fn decoding_into_a_buffer_is_bounded_by_the_buffer() {
        let data = compressible();
        for (name, codec) in codecs() {
            let blob = codec.encode(&data).unwrap();
            let mut out = vec![0xAA; data.len() + 10];
            let n = codec.decode_into(&blob, &mut out).unwrap();
            assert_eq!(&out[..n], &data[..], "{name}");
            let mut short = vec![0; data.len() - 1];
            let err = codec.decode_into(&blob, &mut short).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Corrupt, "{name}: {err}");
        }
    }

    #[test]
    fn a_header_claiming_gigabytes_allocates_nothing() {
        let mut blob = b"FRYBLOBZ".to_vec();
        blob.extend_from_slice(&(1u64 << 40).to_le_bytes());
        blob.extend_from_slice(&[0u8; 64]);
        let err = Codec::new(Some(3), None)
            .unwrap()
            .decode(&blob, 4 << 20)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
    }

    #[test]
    fn the_wrong_key_is_named() {
        let blob = Codec::new(None, Some(&[1; 32]))
            .unwrap()
            .encode(b"secret data")
            .unwrap();
        let err = Codec::new(None, Some(&[2; 32]))
            .unwrap()
            .decode(&blob, 100)
            .unwrap_err();
        assert!(
            err.to_string().contains("wrong key or corrupt blob"),
            "{err}"
        );
        let err = Codec::new(None, None)
            .unwrap()
            .decode(&blob, 100)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    }
}
