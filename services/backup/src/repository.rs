//! [`Repository`]: an opened repository, and every read and write of its objects.
//!
//! Writing a backup goes through a [`Session`](crate::Session) (chunks, then index, then
//! manifest); this module has the rest: init and open, chunk digests, reading chunks
//! back verified, listing, loading and deleting snapshots.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use ferry_core::{Error, ErrorKind, Result, Secret};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest as _, Sha256};
use zeroize::Zeroizing;

use crate::blob::{Codec, OVERHEAD};
use crate::config::{
    check_chunk_size, check_zstd_level, Config, DEFAULT_CHUNK_SIZE, DEFAULT_ZSTD_LEVEL,
    FORMAT_VERSION, IMMUTABLE_FORMAT_VERSION, MAX_CONFIG_LEN,
};
use crate::digest::{block_digests, blocks_are_zero, Digest};
use crate::immutable::Immutability;
use crate::index::{FixedIndex, MAX_INDEX_LEN};
use crate::key_slot::{self, KeySlot};
use crate::keys::{self, EncryptionConfig, KdfParams, MasterKey};
use crate::manifest::{BackupId, Manifest, MAX_MANIFEST_LEN};
use crate::store::{get_required, get_required_into, ObjectStore, Put, PutMode};
use ferry_blkhash::is_zero;
use ferry_blkhash::Hash;

const CONFIG: &str = "config";

/// How to create a repository.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InitOptions {
    /// Chunk size: a power of two from 64 KiB to 64 MiB (default 4 MiB). Fixed for the
    /// repository's life.
    pub chunk_size: u32,
    /// zstd level 1-22, or `None` for no compression (default 1).
    pub zstd_level: Option<i32>,
    /// A passphrase encrypts the repository (default: none, unencrypted).
    pub passphrase: Option<Secret>,
    /// Argon2id costs for the passphrase (default [`KdfParams::default`]).
    pub kdf: KdfParams,
    /// Make the repository immutable: every object version retained by S3 Object Lock
    /// (default: mutable). Needs a bucket with Object Lock enabled.
    pub immutable: Option<Immutability>,
}

impl Default for InitOptions {
    fn default() -> Self {
        Self {
            chunk_size: DEFAULT_CHUNK_SIZE,
            zstd_level: Some(DEFAULT_ZSTD_LEVEL),
            passphrase: None,
            kdf: KdfParams::default(),
            immutable: None,
        }
    }
}

impl InitOptions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_chunk_size(mut self, size: u32) -> Self {
        self.chunk_size = size;
        self
    }

    pub fn with_zstd_level(mut self, level: Option<i32>) -> Self {
        self.zstd_level = level;
        self
    }

    pub fn with_passphrase(mut self, passphrase: Secret) -> Self {
        self.passphrase = Some(passphrase);
        self
    }

    pub fn with_kdf(mut self, kdf: KdfParams) -> Self {
        self.kdf = kdf;
        self
    }

    pub fn with_immutability(mut self, immutable: Immutability) -> Self {
        self.immutable = Some(immutable);
        self
    }
}

/// An opened repository. Cheap to clone; every clone shares the store and the keys.
#[derive(Clone, Debug)]
pub struct Repository {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn ObjectStore>,
    config: Config,
    /// The current master key's codec and id key: everything new is written with them.
    codec: Codec,
    id_key: Option<Zeroizing<[u8; 32]>>,
    /// The older master keys' (newest first), for data written before a
    /// `key rotate --master`: reading tries the current key, then these.
    older: Vec<Sealer>,
    /// Which key decoded the last blob read with [`Repository::with_any_key`].
    last_key: AtomicUsize,
    unlocked: Option<Unlocked>,
}

/// The codec and id key of one older master key.
struct Sealer {
    codec: Codec,
    id_key: Zeroizing<[u8; 32]>,
}

/// What opened an encrypted repository: the key (its id), the master keys it unwrapped
/// (oldest first; the last one is current) and the passphrase, for the key commands.
#[derive(Debug)]
pub(crate) struct Unlocked {
    pub key_id: String,
    pub masters: Vec<MasterKey>,
    pub passphrase: Secret,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repository")
            .field("location", &self.store.location())
            .field("id", &self.config.id)
            .field("codec", &self.codec)
            .field("older_master_keys", &self.older.len())
            .finish()
    }
}

impl Repository {
    /// Creates a repository in an empty location (refused where a config exists).
    ///
    /// An encrypted one gets a random master key and a key object for the passphrase,
    /// written before the config: a repository is never visible without its key. The
    /// key object of an init that loses a race for the config cannot open the winner's
    /// repository (it is bound to another repository id) and is removed again.
    pub async fn init(store: Arc<dyn ObjectStore>, options: InitOptions) -> Result<Self> {
        check_chunk_size(options.chunk_size)?;
        check_zstd_level(options.zstd_level)?;
        let location = store.location();
        let exists = || {
            Error::invalid_input(format!(
                "{location} already holds a repository (it has a config): open it instead"
            ))
        };
        // Checked first so that an init over a repository writes nothing into it (the
        // create-only config below still settles a race between two inits).
        if store.head(CONFIG).await?.is_some() {
            return Err(exists());
        }
        let store = match &options.immutable {
            None => store,
            Some(imm) => immutable_store(&store, imm).await?,
        };
        let id = hex::encode(keys::random::<16>()?);
        let unlocked = match &options.passphrase {
            Some(passphrase) => {
                let master = MasterKey::generate()?;
                let key_id = key_slot::new_id()?;
                let slot = KeySlot::seal(
                    key_id.clone(),
                    passphrase,
                    &options.kdf,
                    id.as_bytes(),
                    std::slice::from_ref(&master),
                )?;
                store
                    .put(
                        &slot.name(),
                        Bytes::from(slot.to_json()),
                        PutMode::CreateOnly,
                    )
                    .await?;
                Some(Unlocked {
                    key_id,
                    masters: vec![master],
                    passphrase: passphrase.clone(),
                })
            }
            None => None,
        };
        let config = Config {
            format_version: if options.immutable.is_some() {
                IMMUTABLE_FORMAT_VERSION
            } else {
                FORMAT_VERSION
            },
            id,
            chunk_size: options.chunk_size,
            zstd_level: options.zstd_level,
            encryption: unlocked.as_ref().map(|_| Config::key_slots()),
            immutable: options.immutable,
        };
        match store
            .put(CONFIG, Bytes::from(config.to_json()), PutMode::CreateOnly)
            .await?
        {
            Put::Written => {}
            Put::Conflict => {
                if let Some(u) = &unlocked {
                    let _ = store
                        .delete(&format!("{}{}", key_slot::KEYS_PREFIX, u.key_id))
                        .await;
                }
                return Err(exists());
            }
        }
        tracing::info!(repository = %location, encrypted = unlocked.is_some(), "created a backup repository");
        Self::assemble(store, config, unlocked)
    }

    /// Opens a repository. An encrypted one needs a passphrase of one of its keys; an
    /// unencrypted one ignores it.
    pub async fn open(store: Arc<dyn ObjectStore>, passphrase: Option<&Secret>) -> Result<Self> {
        let location = store.location();
        let data = store.get(CONFIG, MAX_CONFIG_LEN).await?.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("there is no repository at {location} (no config): create one first"),
            )
        })?;
        let config = Config::parse(&data, &location)?;
        let store = match &config.immutable {
            None => store,
            Some(imm) => store.with_retention(imm.retention())?,
        };
        let unlocked = match (&config.encryption, passphrase) {
            (None, _) => None,
            (Some(_), None) => {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                    "the repository at {location} is encrypted: a passphrase is needed to open it"
                ),
                ))
            }
            (Some(EncryptionConfig::Single(single)), Some(passphrase)) => {
                let master = keys::unlock_single(single, passphrase, config.id.as_bytes())
                    .map_err(|e| e.with_endpoint(location.clone()))?;
                Some(Unlocked {
                    key_id: single.slot_id(),
                    masters: vec![master],
                    passphrase: passphrase.clone(),
                })
            }
            (Some(EncryptionConfig::KeySlots(_)), Some(passphrase)) => Some(
                unlock_with_slots(store.as_ref(), &config, passphrase)
                    .await
                    .map_err(|e| e.with_endpoint(location.clone()))?,
            ),
        };
        Self::assemble(store, config, unlocked)
    }

    fn assemble(
        store: Arc<dyn ObjectStore>,
        config: Config,
        unlocked: Option<Unlocked>,
    ) -> Result<Self> {
        let repo_id = config.id.as_bytes();
        let (codec, id_key, older) = match &unlocked {
            None => (Codec::new(config.zstd_level, None)?, None, Vec::new()),
            Some(u) => {
                let (current, earlier) = u
                    .masters
                    .split_last()
                    .ok_or_else(|| Error::internal("an unlocked repository has no master key"))?;
                let keys = current.keys(repo_id)?;
                let codec = Codec::new(config.zstd_level, Some(&keys.chunk))?;
                let older = earlier
                    .iter()
                    .rev()
                    .map(|m| {
                        let keys = m.keys(repo_id)?;
                        Ok(Sealer {
                            codec: Codec::new(config.zstd_level, Some(&keys.chunk))?,
                            id_key: keys.id,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                (codec, Some(keys.id), older)
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                config,
                codec,
                id_key,
                older,
                last_key: AtomicUsize::new(0),
                unlocked,
            }),
        })
    }

    /// What unlocked the repository (`None` when it is not encrypted).
    pub(crate) fn unlocked(&self) -> Option<&Unlocked> {
        self.inner.unlocked.as_ref()
    }

    /// The id of the master key new data is encrypted with (`None` when not encrypted).
    pub fn current_master_key(&self) -> Option<&str> {
        self.unlocked()
            .and_then(|u| u.masters.last())
            .map(|m| m.id.as_str())
    }

    /// Whether a backup's chunks were written with the current master key, so that a new
    /// backup may take chunks from it. A backup of a format 2 repository names no master
    /// key: it used the first.
    pub fn uses_current_master_key(&self, manifest: &Manifest) -> bool {
        let Some(u) = self.unlocked() else {
            return true;
        };
        let used = match &manifest.master_key {
            Some(id) => Some(id.as_str()),
            None => u.masters.first().map(|m| m.id.as_str()),
        };
        used == self.current_master_key()
    }

    /// Runs `f` with the current master key's codec and id key and, if that fails and
    /// there are older master keys, with each of them: the first success wins, else the
    /// current key's error is returned. The key that last succeeded is tried first, so
    /// that reading an old backup costs one attempt per blob, not one per master key.
    fn with_any_key<T>(
        &self,
        mut f: impl FnMut(&Codec, Option<&[u8; 32]>) -> Result<T>,
    ) -> Result<T> {
        let older = &self.inner.older;
        if older.is_empty() {
            return f(&self.inner.codec, self.inner.id_key.as_deref());
        }
        let hint = self.inner.last_key.load(Ordering::Relaxed).min(older.len());
        let mut first = None;
        for i in std::iter::once(hint).chain((0..=older.len()).filter(|&i| i != hint)) {
            let (codec, id_key) = self.key_at(i);
            match f(codec, id_key) {
                Ok(found) => {
                    self.inner.last_key.store(i, Ordering::Relaxed);
                    return Ok(found);
                }
                Err(e) if i == 0 => first = Some(e),
                Err(_) => {}
            }
        }
        Err(first.unwrap_or_else(|| Error::internal("no master key was tried")))
    }

    /// Master key `i` for [`Repository::with_any_key`]: 0 is the current one, `i > 0`
    /// the older one `older[i - 1]`.
    fn key_at(&self, i: usize) -> (&Codec, Option<&[u8; 32]>) {
        match i.checked_sub(1).and_then(|o| self.inner.older.get(o)) {
            Some(sealer) => (&sealer.codec, Some(&sealer.id_key)),
            None => (&self.inner.codec, self.inner.id_key.as_deref()),
        }
    }

    /// The store the repository lives in.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.store
    }

    /// The repository's config (no secret in it: the master key is stored wrapped).
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The chunk size every backup in this repository uses.
    pub fn chunk_size(&self) -> u32 {
        self.inner.config.chunk_size
    }

    /// Whether chunks, indexes and manifests are encrypted.
    pub fn is_encrypted(&self) -> bool {
        self.inner.codec.encrypted()
    }

    /// The name of a chunk with this content (see [`Repository::chunk_digest_of_blocks`]).
    pub fn chunk_digest(&self, data: &[u8]) -> Digest {
        if is_zero(data) {
            return Digest::ZERO;
        }
        self.name(&block_digests(data))
    }

    /// The name of a chunk of `len` bytes whose 64 KiB blocks have these SHA-256 digests
    /// (see [`crate::block_digests`]): [`Digest::ZERO`] for all zeroes, else the SHA-256
    /// of the digests one after the other (HMAC-SHA256 under the id key when encrypted,
    /// so names leak nothing).
    pub fn chunk_digest_of_blocks(&self, len: usize, blocks: &[Hash]) -> Digest {
        if blocks_are_zero(len, blocks) {
            return Digest::ZERO;
        }
        self.name(blocks)
    }

    fn name(&self, blocks: &[Hash]) -> Digest {
        name_with(self.inner.id_key.as_deref(), blocks)
    }

    /// Whether a chunk is stored and not marked damaged by a verify.
    pub async fn has_chunk(&self, digest: &Digest) -> Result<bool> {
        if digest.is_zero() {
            return Ok(true);
        }
        let store = self.store();
        Ok(store.head(&digest.chunk_name()).await?.is_some()
            && store.head(&digest.bad_name()).await?.is_none())
    }

    /// Reads a chunk and checks its content against its name (kind Corrupt if it does
    /// not match, NotFound if it is missing). The zero marker reads as an error: zero
    /// chunks are not stored, their length comes from the index. Decoding and checking
    /// run on a blocking thread.
    pub async fn get_chunk(&self, digest: &Digest) -> Result<Vec<u8>> {
        let blob = self.fetch_chunk(digest).await?;
        let (repo, digest) = (self.clone(), *digest);
        tokio::task::spawn_blocking(move || {
            let mut plain = vec![0u8; repo.chunk_size() as usize];
            let (len, _) = repo.open_chunk(&digest, &blob, &mut plain)?;
            plain.truncate(len);
            Ok(plain)
        })
        .await
        .map_err(|_| Error::internal("a chunk decoding thread panicked"))?
    }

    /// Fetches a chunk's stored blob, to be opened with [`Repository::open_chunk`].
    pub async fn fetch_chunk(&self, digest: &Digest) -> Result<Vec<u8>> {
        self.fetch_chunk_into(digest, Vec::new()).await
    }

    /// [`Repository::fetch_chunk`] into the allocation of `buf`, for a reader of many
    /// chunks that reuses one buffer.
    pub async fn fetch_chunk_into(&self, digest: &Digest, buf: Vec<u8>) -> Result<Vec<u8>> {
        if digest.is_zero() {
            return Err(Error::invalid_input(
                "the zero-chunk marker names no stored chunk: restore it as zeroes",
            ));
        }
        let chunk_size = u64::from(self.chunk_size());
        get_required_into(
            self.store().as_ref(),
            &digest.chunk_name(),
            chunk_size + OVERHEAD,
            buf,
        )
        .await
    }

    /// Decodes a fetched chunk into the front of `out` and checks its content against
    /// its name (kind Corrupt if it does not match); returns its length and its block
    /// digests. CPU work: call it off the async threads.
    pub fn open_chunk(
        &self,
        digest: &Digest,
        blob: &[u8],
        out: &mut [u8],
    ) -> Result<(usize, Vec<Hash>)> {
        self.with_any_key(|codec, id_key| {
            let len = codec
                .decode_into(blob, out)
                .map_err(|e| Error::new(e.kind(), format!("chunk {digest}: {}", e.message())))?;
            let blocks = block_digests(&out[..len]);
            let name = if blocks_are_zero(len, &blocks) {
                Digest::ZERO
            } else {
                name_with(id_key, &blocks)
            };
            if name != *digest {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("chunk {digest} is damaged: its content does not match its name"),
                ));
            }
            Ok((len, blocks))
        })
    }

    /// Stores a chunk's blob (always writes; deduplication is the session's job).
    /// A chunk's stored form: compressed (when smaller) and encrypted as configured.
    pub(crate) fn encode_chunk(&self, plain: &[u8]) -> Result<Vec<u8>> {
        self.inner.codec.encode(plain)
    }

    /// Stores an encoded chunk under its digest's name.
    pub(crate) async fn store_blob(&self, digest: &Digest, blob: Vec<u8>) -> Result<()> {
        self.store()
            .put_batched(&digest.chunk_name(), Bytes::from(blob))
            .await
    }

    /// Every finished backup, oldest first.
    pub async fn list_snapshots(&self) -> Result<Vec<BackupId>> {
        let mut ids: Vec<BackupId> = self
            .store()
            .list("snapshots/")
            .await?
            .into_iter()
            .filter_map(|m| {
                m.name
                    .strip_prefix("snapshots/")
                    .and_then(|n| n.strip_suffix(".json"))
                    .and_then(|n| n.parse().ok())
            })
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Reads a backup's manifest.
    pub async fn load_manifest(&self, id: &BackupId) -> Result<Manifest> {
        let data = self
            .store()
            .get(&id.manifest_name(), MAX_MANIFEST_LEN)
            .await?
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "backup {id} does not exist in the repository at {}",
                        self.store().location()
                    ),
                )
            })?;
        let json = if self.is_encrypted() {
            self.with_any_key(|codec, _| codec.decode(&data, MAX_MANIFEST_LEN))?
        } else {
            data
        };
        let manifest: Manifest = serde_json::from_slice(&json).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!("the manifest of backup {id} is damaged: {e}"),
            )
        })?;
        if manifest.id != *id {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the manifest stored as backup {id} belongs to backup {}",
                    manifest.id
                ),
            ));
        }
        Ok(manifest)
    }

    pub(crate) async fn store_manifest(&self, manifest: &Manifest) -> Result<()> {
        let json = manifest.to_json();
        let data = if self.is_encrypted() {
            self.inner.codec.encode(&json)?
        } else {
            json
        };
        match self
            .store()
            .put(
                &manifest.id.manifest_name(),
                Bytes::from(data),
                PutMode::CreateOnly,
            )
            .await?
        {
            Put::Written => Ok(()),
            Put::Conflict => Err(Error::internal(format!(
                "backup {} already has a manifest",
                manifest.id
            ))),
        }
    }

    /// Reads a backup's index and checks it against its manifest.
    pub async fn load_index(&self, manifest: &Manifest) -> Result<FixedIndex> {
        let (index, sha) = self.read_index(&manifest.id).await?;
        if sha != manifest.index_sha256
            || index.image_size() != manifest.image_size
            || index.chunk_size() != manifest.chunk_size
        {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the index of backup {} does not match its manifest",
                    manifest.id
                ),
            ));
        }
        Ok(index)
    }

    /// Reads an index without a manifest to check it against (GC, verify), with the
    /// SHA-256 of its serialized form.
    pub(crate) async fn read_index(&self, id: &BackupId) -> Result<(FixedIndex, String)> {
        let blob = get_required(
            self.store().as_ref(),
            &id.index_name(),
            MAX_INDEX_LEN + OVERHEAD,
        )
        .await?;
        self.decode_index(id, &blob)
    }

    /// Decodes a stored index blob of backup `id`, with the SHA-256 of its serialized form.
    pub(crate) fn decode_index(&self, id: &BackupId, blob: &[u8]) -> Result<(FixedIndex, String)> {
        let data = self
            .with_any_key(|codec, _| codec.decode(blob, MAX_INDEX_LEN))
            .map_err(|e| {
                Error::new(
                    e.kind(),
                    format!("the index of backup {id}: {}", e.message()),
                )
            })?;
        let index = FixedIndex::decode(&data).map_err(|e| {
            Error::new(
                e.kind(),
                format!("the index of backup {id}: {}", e.message()),
            )
        })?;
        Ok((index, hex::encode(Sha256::digest(&data))))
    }

    /// Stores an index; returns the SHA-256 of its serialized form for the manifest.
    pub(crate) async fn store_index(&self, id: &BackupId, index: &FixedIndex) -> Result<String> {
        let data = index.encode();
        let sha = hex::encode(Sha256::digest(&data));
        let blob = self.inner.codec.encode(&data)?;
        self.store()
            .put(&id.index_name(), Bytes::from(blob), PutMode::Overwrite)
            .await?;
        Ok(sha)
    }

    /// Deletes a backup: its manifest first (so it is no longer listed), then its index.
    /// Its chunks stay until a garbage collection finds them unreferenced.
    /// A protected backup is refused (see [`Repository::protect`]).
    pub async fn delete_snapshot(&self, id: &BackupId) -> Result<()> {
        self.refuse_if_protected(id).await?;
        self.store().delete(&id.manifest_name()).await?;
        self.store().delete(&id.index_name()).await?;
        tracing::info!(backup = %id, repository = %self.store().location(), "deleted a backup");
        Ok(())
    }
}

/// The store of a new immutable repository: refused unless the bucket has Object Lock.
pub(crate) async fn immutable_store(
    store: &Arc<dyn ObjectStore>,
    imm: &Immutability,
) -> Result<Arc<dyn ObjectStore>> {
    if imm.period_secs == 0 {
        return Err(Error::invalid_input(
            "an immutable repository needs a retention of at least one day (--immutable-days)",
        ));
    }
    // A directory refuses here, with why.
    let locked = store.with_retention(imm.retention())?;
    if !store.object_lock_enabled().await? {
        return Err(Error::invalid_input(format!(
            "{} is in a bucket without S3 Object Lock: an immutable repository needs a bucket created with Object Lock enabled (aws s3api create-bucket --object-lock-enabled-for-bucket ...; it cannot be turned on for an existing bucket everywhere), or drop --immutable-days",
            store.location()
        )));
    }
    Ok(locked)
}

/// The name of a chunk whose blocks have these digests, under `id_key` (or plain SHA-256).
fn name_with(id_key: Option<&[u8; 32]>, blocks: &[Hash]) -> Digest {
    let mut out = [0u8; 32];
    match id_key {
        Some(key) => {
            // HMAC accepts keys of any length: this cannot fail.
            if let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(&key[..]) {
                blocks.iter().for_each(|b| mac.update(b));
                out.copy_from_slice(&mac.finalize().into_bytes());
            }
        }
        None => {
            let mut hasher = Sha256::new();
            blocks.iter().for_each(|b| hasher.update(b));
            out.copy_from_slice(&hasher.finalize());
        }
    }
    Digest(out)
}

/// Finds the key object `passphrase` opens, in a format 3 repository. Every key object
/// costs one Argon2id derivation, as in restic; damaged ones are skipped with a warning.
async fn unlock_with_slots(
    store: &dyn ObjectStore,
    config: &Config,
    passphrase: &Secret,
) -> Result<Unlocked> {
    let slots = key_slot::load_all(store).await?;
    if slots.is_empty() {
        return Err(Error::new(
            ErrorKind::Corrupt,
            "the repository has no key objects (keys/): no passphrase can open it",
        ));
    }
    for slot in &slots {
        let parsed = {
            let (slot, passphrase, repo_id) = (slot.clone(), passphrase.clone(), config.id.clone());
            tokio::task::spawn_blocking(move || slot.open(&passphrase, repo_id.as_bytes()))
                .await
                .map_err(|_| Error::internal("a key derivation thread panicked"))?
        };
        match parsed {
            Ok(Some(masters)) => {
                return Ok(Unlocked {
                    key_id: slot.id.clone(),
                    masters,
                    passphrase: passphrase.clone(),
                })
            }
            Ok(None) => {}
            Err(e) if e.kind() == ErrorKind::InvalidInput => return Err(e),
            Err(e) => tracing::warn!(key = %slot.id, error = %e, "skipping a key object"),
        }
    }
    Err(keys::wrong_passphrase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_detection() {
        assert!(is_zero(&[0u8; 4097]));
        let mut d = vec![0u8; 4097];
        d[4096] = 1;
        assert!(!is_zero(&d));
        d[4096] = 0;
        d[3] = 1;
        assert!(!is_zero(&d));
    }
}
