//! The block digests of a backup: the SHA-256 of every 64 KiB block of its data chunks,
//! stored beside its index as `blockdigests/<backup id>`.
//!
//! The image's block hash is built from block digests, not from chunk digests, so a
//! backup that reuses a parent's chunk without reading it (a clean chunk of a dirty
//! bitmap) takes that chunk's block digests from here. Zero chunks need none: their
//! block digests are a constant.
//!
//! Each data chunk also has its change digest ([`crate::change`]): what lets the next
//! incremental backup tell an unchanged chunk without hashing it with SHA-256.
//!
//! Serialized (then compressed with zstd, and encrypted in an encrypted repository):
//!
//! ```text
//! magic "FRYBDIG2" | image size u64 LE | chunk size u32 LE | block size u32 LE (65536)
//! | data chunks u64 LE
//! | per data chunk, in image order: its chunk digest (32 bytes) | its change digest
//!   (32 bytes, all zero when not known) | its block digests (32 bytes each)
//! | SHA-256 of everything before it
//! ```
//!
//! Backups made before change digests have `FRYBDIG1`: the same without change digests.
//! They load with every change digest unknown.
//!
//! The chunk digests bind the object to the index: loading checks that they are the
//! index's non-zero digests in order. The stored object is
//! `magic (8) | serialized length u64 LE | payload`, the payload being one zstd frame
//! (`FRYBDZ01`) or, encrypted, a 12-byte nonce and the AES-256-GCM sealed zstd frame
//! (`FRYBDX01`; the 16-byte header is the associated data).
//!
//! The encryption key is HMAC-SHA256 under the repository's id key (the repository's
//! chunk-digest function) of a label one byte longer than the largest chunk: no chunk
//! can have that content, so no chunk name reveals the key, and only a holder of the
//! passphrase can compute it.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use bytes::Bytes;
use ferry_backup::{BackupId, FixedIndex, Manifest, PutMode, Repository, MAX_INDEX_ENTRIES};
use ferry_blkhash::{sha256, Hash, BLOCK_SIZE};
use ferry_core::{Error, ErrorKind, Result};
use zeroize::Zeroizing;

use crate::change::ChangeDigest;
use crate::hash::blocks_in;

const MAGIC: [u8; 8] = *b"FRYBDIG2";
const MAGIC_V1: [u8; 8] = *b"FRYBDIG1";
const MAGIC_ZSTD: [u8; 8] = *b"FRYBDZ01";
const MAGIC_ENC_ZSTD: [u8; 8] = *b"FRYBDX01";
const HEAD_LEN: usize = 32;
const ENVELOPE_LEN: usize = 16;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
const ZSTD_LEVEL: i32 = 3;
const KEY_LABEL: &[u8] = b"ferry image backup: block digests key v1";

/// Where a backup's block digests are stored.
pub fn object_name(id: &BackupId) -> String {
    format!("{PREFIX}{id}")
}

/// The prefix of every block digests object.
pub const PREFIX: &str = "blockdigests/";

/// The 64 KiB block digests and the change digest of a backup's data chunks, by chunk
/// number.
#[derive(Debug, Clone, Default)]
pub struct BlockDigests {
    chunks: Vec<Option<DataChunk>>,
}

#[derive(Debug, Clone)]
struct DataChunk {
    change: ChangeDigest,
    blocks: Box<[Hash]>,
}

impl BlockDigests {
    /// No digests yet for an image of `chunks` chunks.
    pub(crate) fn new(chunks: usize) -> Self {
        Self {
            chunks: vec![None; chunks],
        }
    }

    /// Chunk `i`'s block digests, if it is a data chunk.
    pub fn get(&self, i: usize) -> Option<&[Hash]> {
        self.chunks
            .get(i)
            .and_then(|c| c.as_ref().map(|c| &*c.blocks))
    }

    /// Chunk `i`'s change digest, if it is a data chunk and the digest is known.
    pub fn change(&self, i: usize) -> Option<ChangeDigest> {
        self.chunks
            .get(i)
            .and_then(|c| c.as_ref().and_then(|c| c.change.known()))
    }

    pub(crate) fn set(&mut self, i: usize, blocks: Vec<Hash>, change: Option<ChangeDigest>) {
        if let Some(slot) = self.chunks.get_mut(i) {
            *slot = Some(DataChunk {
                change: change.unwrap_or(ChangeDigest::UNKNOWN),
                blocks: blocks.into_boxed_slice(),
            });
        }
    }

    pub(crate) fn clear(&mut self, i: usize) {
        if let Some(slot) = self.chunks.get_mut(i) {
            *slot = None;
        }
    }
}

fn corrupt(id: &BackupId, message: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        format!("the block digests of backup {id} are damaged: {message}"),
    )
}

/// The serialized length of one data chunk's entry: its digest, its change digest (not
/// in version 1) and its block digests.
fn entry_len(chunk_len: u64, version: Version) -> usize {
    let change = match version {
        Version::V1 => 0,
        Version::V2 => 32,
    };
    32 + change + 32 * blocks_in(chunk_len)
}

/// The layouts of the serialized block digests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

impl Version {
    fn magic(self) -> [u8; 8] {
        match self {
            Version::V1 => MAGIC_V1,
            Version::V2 => MAGIC,
        }
    }
}

/// The serialized length for `index`: what loading expects, exactly.
fn serialized_len(index: &FixedIndex, version: Version) -> usize {
    let mut len = HEAD_LEN + 32;
    for (i, d) in index.digests().iter().enumerate() {
        if !d.is_zero() {
            let (_, chunk_len) = index.chunk_range(i);
            len += entry_len(chunk_len, version);
        }
    }
    len
}

fn head(index: &FixedIndex, version: Version) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD_LEN);
    out.extend_from_slice(&version.magic());
    out.extend_from_slice(&index.image_size().to_le_bytes());
    out.extend_from_slice(&index.chunk_size().to_le_bytes());
    out.extend_from_slice(&(BLOCK_SIZE as u32).to_le_bytes());
    let data = index.digests().iter().filter(|d| !d.is_zero()).count() as u64;
    out.extend_from_slice(&data.to_le_bytes());
    out
}

fn serialize(index: &FixedIndex, digests: &BlockDigests) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(serialized_len(index, Version::V2));
    out.extend_from_slice(&head(index, Version::V2));
    for (i, d) in index.digests().iter().enumerate() {
        if d.is_zero() {
            continue;
        }
        let (_, len) = index.chunk_range(i);
        let chunk = digests
            .chunks
            .get(i)
            .and_then(|c| c.as_ref())
            .filter(|c| c.blocks.len() == blocks_in(len))
            .ok_or_else(|| {
                Error::internal(format!("chunk {i} of the backup has no block digests"))
            })?;
        out.extend_from_slice(&d.0);
        out.extend_from_slice(&chunk.change.0);
        out.extend_from_slice(chunk.blocks.as_flattened());
    }
    let sum = sha256(&out);
    out.extend_from_slice(&sum);
    Ok(out)
}

fn parse(id: &BackupId, index: &FixedIndex, data: &[u8]) -> Result<BlockDigests> {
    let version = match data.get(..8) {
        Some(m) if m == MAGIC => Version::V2,
        Some(m) if m == MAGIC_V1 => Version::V1,
        _ => return Err(corrupt(id, "they are not block digests of a known version")),
    };
    if data.len() != serialized_len(index, version) {
        return Err(corrupt(id, "their length does not match the index"));
    }
    let (body, sum) = data.split_at(data.len() - 32);
    if sha256(body) != sum {
        return Err(corrupt(id, "their checksum does not match"));
    }
    if body[..HEAD_LEN] != head(index, version)[..] {
        return Err(corrupt(id, "their header does not match the index"));
    }
    let mut out = BlockDigests::new(index.len());
    let mut at = HEAD_LEN;
    let mut take = |n: usize| {
        let part = &body[at..at + n];
        at += n;
        part
    };
    for (i, d) in index.digests().iter().enumerate() {
        if d.is_zero() {
            continue;
        }
        let (_, len) = index.chunk_range(i);
        if take(32) != d.0 {
            return Err(corrupt(id, format!("chunk {i} does not match the index")));
        }
        let change = match version {
            Version::V1 => None,
            Version::V2 => Some(ChangeDigest(to_hash(take(32)))),
        };
        let blocks = take(32 * blocks_in(len))
            .chunks_exact(32)
            .map(to_hash)
            .collect();
        out.set(i, blocks, change);
    }
    Ok(out)
}

fn to_hash(bytes: &[u8]) -> Hash {
    let mut h = [0u8; 32];
    h.copy_from_slice(bytes);
    h
}

/// The key that encrypts block digests in an encrypted repository (see the module docs).
fn key(repo: &Repository) -> Zeroizing<[u8; 32]> {
    let mut label = vec![0u8; repo.chunk_size() as usize + 1];
    label[..KEY_LABEL.len()].copy_from_slice(KEY_LABEL);
    Zeroizing::new(repo.chunk_digest(&label).0)
}

fn cipher(repo: &Repository) -> Result<Aes256Gcm> {
    Aes256Gcm::new_from_slice(key(repo).as_ref()).map_err(|_| Error::internal("AES key length"))
}

fn encode(repo: &Repository, plain: &[u8]) -> Result<Vec<u8>> {
    let compressed = zstd::bulk::compress(plain, ZSTD_LEVEL)
        .map_err(|e| Error::internal(format!("zstd compression failed: {e}")))?;
    let mut header = [0u8; ENVELOPE_LEN];
    header[8..].copy_from_slice(&(plain.len() as u64).to_le_bytes());
    if !repo.is_encrypted() {
        header[..8].copy_from_slice(&MAGIC_ZSTD);
        return Ok([header.as_slice(), &compressed].concat());
    }
    header[..8].copy_from_slice(&MAGIC_ENC_ZSTD);
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce)
        .map_err(|e| Error::internal(format!("the system random source failed: {e}")))?;
    let sealed = cipher(repo)?
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: &compressed,
                aad: &header,
            },
        )
        .map_err(|_| Error::internal("AES-GCM encryption failed"))?;
    Ok([header.as_slice(), &nonce, &sealed].concat())
}

/// Opens the envelope of block digests whose plaintext must be one of `lengths` long.
fn decode(repo: &Repository, id: &BackupId, blob: &[u8], lengths: &[usize]) -> Result<Vec<u8>> {
    if blob.len() < ENVELOPE_LEN {
        return Err(corrupt(id, "the object is truncated"));
    }
    let (header, payload) = blob.split_at(ENVELOPE_LEN);
    let mut len = [0u8; 8];
    len.copy_from_slice(&header[8..]);
    let Some(&expected) = lengths
        .iter()
        .find(|&&l| l as u64 == u64::from_le_bytes(len))
    else {
        return Err(corrupt(id, "their length does not match the index"));
    };
    let opened;
    let frame = match (&header[..8], repo.is_encrypted()) {
        (m, false) if m == MAGIC_ZSTD => payload,
        (m, true) if m == MAGIC_ENC_ZSTD => {
            if payload.len() < NONCE_LEN + TAG_LEN {
                return Err(corrupt(id, "the encrypted object is truncated"));
            }
            let (nonce, sealed) = payload.split_at(NONCE_LEN);
            opened = cipher(repo)?
                .decrypt(
                    Nonce::from_slice(nonce),
                    Payload {
                        msg: sealed,
                        aad: header,
                    },
                )
                .map_err(|_| corrupt(id, "wrong key or corrupt object (authentication failed)"))?;
            opened.as_slice()
        }
        _ => return Err(corrupt(id, "not a block digests object of this repository")),
    };
    let plain = zstd::bulk::decompress(frame, expected)
        .map_err(|e| corrupt(id, format!("they do not decompress: {e}")))?;
    if plain.len() != expected {
        return Err(corrupt(id, "their length does not match the index"));
    }
    Ok(plain)
}

/// Stores the block digests of backup `id`, whose index is `index`. Written before the
/// manifest, so a listed backup always has them (unless removed by hand).
pub(crate) async fn store(
    repo: &Repository,
    id: &BackupId,
    index: &FixedIndex,
    digests: &BlockDigests,
) -> Result<()> {
    let plain = serialize(index, digests)?;
    let blob = encode(repo, &plain)?;
    repo.store()
        .put(&object_name(id), Bytes::from(blob), PutMode::Overwrite)
        .await?;
    Ok(())
}

/// Fetches the stored block digests of the backup `manifest` describes, before its index
/// is at hand (so that both load at once); `None` when the backup has none stored. Open
/// them with [`open`].
pub async fn fetch(repo: &Repository, manifest: &Manifest) -> Result<Option<Vec<u8>>> {
    let chunk = u64::from(manifest.chunk_size.max(1));
    let chunks = manifest.image_size.div_ceil(chunk).min(MAX_INDEX_ENTRIES) as usize;
    // Every chunk holding data, zstd's worst case on incompressible input, the envelope.
    let expected = HEAD_LEN + 32 + chunks * entry_len(chunk, Version::V2);
    let max_len = (expected + expected / 64 + 1024 + ENVELOPE_LEN + NONCE_LEN + TAG_LEN) as u64;
    repo.store().get(&object_name(&manifest.id), max_len).await
}

/// Decodes fetched block digests of backup `id` and checks them against its index.
pub fn open(
    repo: &Repository,
    id: &BackupId,
    index: &FixedIndex,
    blob: &[u8],
) -> Result<BlockDigests> {
    let lengths = [Version::V2, Version::V1].map(|v| serialized_len(index, v));
    let plain = decode(repo, id, blob, &lengths)?;
    parse(id, index, &plain)
}

/// Deletes the block digests of backup `id` (after the backup itself was deleted).
pub async fn delete(repo: &Repository, id: &BackupId) -> Result<()> {
    repo.store().delete(&object_name(id)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_backup::Digest;

    fn index_with(chunks: &[bool], size: u64, chunk: u32) -> FixedIndex {
        let mut index = FixedIndex::new(size, chunk).unwrap();
        for (i, data) in chunks.iter().enumerate() {
            if *data {
                index.set(i, Digest([i as u8 + 1; 32])).unwrap();
            }
        }
        index
    }

    #[test]
    fn round_trips_and_binds_to_the_index() {
        let chunk = 2 * BLOCK_SIZE as u32;
        let size = 3 * u64::from(chunk) - 100;
        let index = index_with(&[true, false, true], size, chunk);
        let mut digests = BlockDigests::new(3);
        let change = ChangeDigest([9; 32]);
        digests.set(0, vec![[1; 32], [2; 32]], Some(change));
        digests.set(2, vec![[3; 32], [4; 32]], None);
        let id: BackupId = "20261202T101500Z-0a1b2c3d".parse().unwrap();
        let data = serialize(&index, &digests).unwrap();
        assert_eq!(data.len(), serialized_len(&index, Version::V2));
        let back = parse(&id, &index, &data).unwrap();
        assert_eq!(back.get(0).unwrap(), &[[1; 32], [2; 32]]);
        assert_eq!(back.change(0), Some(change));
        assert!(back.get(1).is_none());
        assert_eq!(back.get(2).unwrap(), &[[3; 32], [4; 32]]);
        assert_eq!(
            back.change(2),
            None,
            "an unknown change digest stays unknown"
        );

        let other = index_with(&[true, true, false], size, chunk);
        assert!(parse(&id, &other, &data).is_err());
        let mut damaged = data.clone();
        damaged[HEAD_LEN + 40] ^= 1;
        assert_eq!(
            parse(&id, &index, &damaged).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
    }

    #[test]
    fn version_1_loads_with_change_digests_unknown() {
        let chunk = BLOCK_SIZE as u32;
        let index = index_with(&[false, true], 2 * u64::from(chunk), chunk);
        let mut data = head(&index, Version::V1);
        data.extend_from_slice(&[2; 32]);
        data.extend_from_slice(&[7; 32]);
        let sum = sha256(&data);
        data.extend_from_slice(&sum);
        let id: BackupId = "20261202T101500Z-0a1b2c3d".parse().unwrap();
        let back = parse(&id, &index, &data).unwrap();
        assert_eq!(back.get(1).unwrap(), &[[7; 32]]);
        assert_eq!(back.change(1), None);
        assert!(back.get(0).is_none());
    }

    #[test]
    fn a_data_chunk_without_digests_is_refused() {
        let index = index_with(&[true], BLOCK_SIZE as u64, BLOCK_SIZE as u32);
        assert!(serialize(&index, &BlockDigests::new(1)).is_err());
    }
}
