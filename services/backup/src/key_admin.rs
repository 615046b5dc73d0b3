//! The key commands of an encrypted repository: list, add, remove and rotate its keys
//! (passphrases), and start a new master key.
//!
//! Each key is a key object (see [`crate::key_slot`]) wrapping the master keys, so every
//! change is one create or one delete of a whole object, never an object rewritten in
//! place: at every step of every command, including a crash between two steps, the
//! repository opens with the old key or the new one. Rotating writes the new key before
//! it deletes the old one.
//!
//! A new master key (`rotate --master`) encrypts and names everything written after it.
//! Older master keys stay wrapped by the key so that old backups stay readable; chunk
//! names are keyed by the master key, so new backups no longer deduplicate against
//! chunks of the old one (as in Proxmox Backup Server after a key change). Only the key
//! that runs the command can be given the new master key (the others' passphrases are
//! not known), so it must be the repository's only key.
//!
//! A format 2 repository (one passphrase in the config) moves to format 3 on its first
//! key change: its key is written as a key object with the same passphrase and id, and
//! then the config is rewritten to point at the key objects. Either config opens with
//! the passphrase, so a crash between the two is harmless, and two ferries migrating at
//! once write the same config.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use ferry_core::{Error, ErrorKind, Result, Secret};
use serde::Serialize;

use crate::config::{Config, FORMAT_VERSION, MAX_CONFIG_LEN};
use crate::key_slot::{self, KeySlot};
use crate::keys::{EncryptionConfig, KdfParams, MasterKey};
use crate::repository::{Repository, Unlocked};
use crate::store::{Put, PutMode};

const CONFIG: &str = "config";

/// One key of a repository, as `ferry backup key list` shows it (no key material).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyInfo {
    /// 16 hex digits, stable for the key's life.
    pub id: String,
    /// When the key was added (unknown for the key of a format 2 repository).
    pub created: Option<DateTime<Utc>>,
    /// How its passphrase is stretched.
    pub kdf: KdfParams,
    /// Whether this key opened the repository for this command.
    pub current: bool,
    /// The master key it encrypts new data with.
    pub master_key: String,
    /// Every master key it can read with, oldest first.
    pub master_keys: Vec<String>,
}

/// What `key remove` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyRemoved {
    pub removed: String,
    /// Keys left.
    pub keys: usize,
}

/// What `key rotate` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyRotated {
    /// The key that ran the command, now gone.
    pub removed: String,
    /// Its replacement.
    pub added: KeyInfo,
    /// The new master key, with `--master`.
    pub new_master_key: Option<String>,
}

fn not_encrypted(location: &str) -> Error {
    Error::invalid_input(format!(
        "the repository at {location} is not encrypted: it has no keys"
    ))
}

fn info_of(slot: &KeySlot, current: &str) -> KeyInfo {
    KeyInfo {
        id: slot.id.clone(),
        created: slot.created,
        kdf: slot.kdf.clone(),
        current: slot.id == current,
        master_key: slot
            .masters
            .last()
            .map(|m| m.id.clone())
            .unwrap_or_default(),
        master_keys: slot.masters.iter().map(|m| m.id.clone()).collect(),
    }
}

impl Repository {
    fn unlocked_or_refuse(&self) -> Result<&Unlocked> {
        self.unlocked()
            .ok_or_else(|| not_encrypted(&self.store().location()))
    }

    /// The keys of the repository, in the order of their ids.
    pub async fn list_keys(&self) -> Result<Vec<KeyInfo>> {
        let unlocked = self.unlocked_or_refuse()?;
        match &self.config().encryption {
            Some(EncryptionConfig::Single(single)) => Ok(vec![KeyInfo {
                id: single.slot_id(),
                created: None,
                kdf: single.kdf.clone(),
                current: true,
                master_key: single.master_id(),
                master_keys: vec![single.master_id()],
            }]),
            _ => Ok(key_slot::load_all(self.store().as_ref())
                .await?
                .iter()
                .map(|s| info_of(s, &unlocked.key_id))
                .collect()),
        }
    }

    /// Adds a key for `passphrase`: it opens the repository as the key in use does (the
    /// same master keys).
    pub async fn add_key(&self, passphrase: &Secret, kdf: &KdfParams) -> Result<KeyInfo> {
        let unlocked = self.unlocked_or_refuse()?;
        self.migrate_to_key_objects().await?;
        let slot = self
            .write_key(passphrase, kdf, unlocked.masters.clone())
            .await?;
        tracing::info!(repository = %self.store().location(), key = %slot.id, "added a key");
        Ok(info_of(&slot, &unlocked.key_id))
    }

    /// Removes key `id`. Refused for the key that opened the repository (open it with
    /// another key to remove this one), for the last key, and for a key holding a master
    /// key no other key holds (backups would become unreadable).
    pub async fn remove_key(&self, id: &str) -> Result<KeyRemoved> {
        let unlocked = self.unlocked_or_refuse()?;
        let location = self.store().location();
        if !key_slot::is_id(id) {
            return Err(Error::invalid_input(format!(
                "'{id}' is not a key id (16 hex digits, as `ferry backup key list` prints them)"
            )));
        }
        if id == unlocked.key_id {
            return Err(Error::invalid_input(format!(
                "key {id} is the key this command was opened with: it cannot remove itself \
                 (set FERRY_BACKUP_KEY_FILE to another key of the repository to remove it)"
            )));
        }
        let slots = match &self.config().encryption {
            Some(EncryptionConfig::Single(_)) => Vec::new(),
            _ => key_slot::load_all(self.store().as_ref()).await?,
        };
        let Some(victim) = slots.iter().find(|s| s.id == id) else {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("the repository at {location} has no key {id} (see ferry backup key list)"),
            ));
        };
        let rest: Vec<&KeySlot> = slots.iter().filter(|s| s.id != id).collect();
        if rest.is_empty() {
            return Err(Error::invalid_input(format!(
                "key {id} is the repository's last key: without a key nobody can read the backups"
            )));
        }
        for master in &victim.masters {
            if !rest
                .iter()
                .any(|s| s.masters.iter().any(|m| m.id == master.id))
            {
                return Err(Error::invalid_input(format!(
                    "key {id} is the only key holding master key {}: backups made with it \
                     could no longer be read. Add a key with that key first",
                    master.id
                )));
            }
        }
        self.store().delete(&victim.name()).await?;
        tracing::info!(repository = %location, key = %id, "removed a key");
        Ok(KeyRemoved {
            removed: id.to_string(),
            keys: rest.len(),
        })
    }

    /// Replaces the key that opened the repository by one for `passphrase`, without
    /// touching any data: the new key is written, then the old one deleted. With
    /// `new_master`, the new key also holds a new master key, which encrypts everything
    /// written from then on (see the module docs); refused while the repository has other
    /// keys.
    pub async fn rotate_key(
        &self,
        passphrase: &Secret,
        kdf: &KdfParams,
        new_master: bool,
    ) -> Result<KeyRotated> {
        let unlocked = self.unlocked_or_refuse()?;
        let location = self.store().location();
        if passphrase.expose() == unlocked.passphrase.expose() {
            return Err(Error::invalid_input(
                "the new passphrase is the one in use: rotating to it would change nothing",
            ));
        }
        self.migrate_to_key_objects().await?;
        let slots = key_slot::load_all(self.store().as_ref()).await?;
        if new_master {
            let others: Vec<&str> = slots
                .iter()
                .filter(|s| s.id != unlocked.key_id)
                .map(|s| s.id.as_str())
                .collect();
            let mine: Vec<&str> = unlocked.masters.iter().map(|m| m.id.as_str()).collect();
            if let Some(newer) = slots.iter().find(|s| {
                s.id != unlocked.key_id && s.masters.iter().any(|m| !mine.contains(&m.id.as_str()))
            }) {
                return Err(Error::invalid_input(format!(
                    "key {} holds a master key that the key in use does not: an earlier \
                     `key rotate --master` was interrupted after writing it. Finish that \
                     rotation instead: with key {} as FERRY_BACKUP_KEY_FILE, run \
                     `ferry backup key remove {location} {}`",
                    newer.id, newer.id, unlocked.key_id
                )));
            }
            if !others.is_empty() {
                return Err(Error::invalid_input(format!(
                    "a new master key can only be given to the key in use, and the repository \
                     has other keys ({}): remove them first (ferry backup key remove), then \
                     add them again after the rotation",
                    others.join(", ")
                )));
            }
        }
        let mut masters = unlocked.masters.clone();
        let new_master_key = if new_master {
            let master = MasterKey::generate()?;
            let id = master.id.clone();
            masters.push(master);
            Some(id)
        } else {
            None
        };
        let slot = self.write_key(passphrase, kdf, masters).await?;
        let old = format!("{}{}", key_slot::KEYS_PREFIX, unlocked.key_id);
        self.store().delete(&old).await.map_err(|e| {
            Error::new(
                e.kind(),
                format!(
                    "the new key {} was added, but the old key {} could not be removed ({}): \
                     remove it with `ferry backup key remove` using the new key",
                    slot.id,
                    unlocked.key_id,
                    e.message()
                ),
            )
        })?;
        tracing::info!(repository = %location, old = %unlocked.key_id, new = %slot.id,
            new_master_key = new_master_key.is_some(), "rotated a key");
        Ok(KeyRotated {
            removed: unlocked.key_id.clone(),
            added: info_of(&slot, &slot.id),
            new_master_key,
        })
    }

    /// Writes a new key object (create-only, under a fresh id).
    async fn write_key(
        &self,
        passphrase: &Secret,
        kdf: &KdfParams,
        masters: Vec<MasterKey>,
    ) -> Result<KeySlot> {
        let repo_id = self.config().id.clone();
        let passphrase = passphrase.clone();
        let kdf = kdf.clone();
        let slot = tokio::task::spawn_blocking(move || {
            KeySlot::seal(
                key_slot::new_id()?,
                &passphrase,
                &kdf,
                repo_id.as_bytes(),
                &masters,
            )
        })
        .await
        .map_err(|_| Error::internal("a key derivation thread panicked"))??;
        match self
            .store()
            .put(
                &slot.name(),
                Bytes::from(slot.to_json()),
                PutMode::CreateOnly,
            )
            .await?
        {
            Put::Written => Ok(slot),
            Put::Conflict => Err(Error::internal(format!(
                "a key {} already exists (a random id collided): run the command again",
                slot.id
            ))),
        }
    }

    /// Checks that the key object `id` opens with the passphrase in use to the master keys
    /// in use (an earlier migration's object).
    async fn check_existing_key(&self, id: &str) -> Result<()> {
        let unlocked = self.unlocked_or_refuse()?;
        let name = format!("{}{id}", key_slot::KEYS_PREFIX);
        let refuse = || {
            Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{name} exists in {} but is not this key's: the repository was not changed \
                     (remove that object if nobody made it on purpose)",
                    self.store().location()
                ),
            )
        };
        let data = self
            .store()
            .get(&name, key_slot::MAX_SLOT_LEN)
            .await?
            .ok_or_else(refuse)?;
        let existing = KeySlot::parse(&data, id)?;
        let (passphrase, repo_id) = (unlocked.passphrase.clone(), self.config().id.clone());
        let opened =
            tokio::task::spawn_blocking(move || existing.open(&passphrase, repo_id.as_bytes()))
                .await
                .map_err(|_| Error::internal("a key derivation thread panicked"))??;
        let same = opened.is_some_and(|masters| {
            masters.len() == unlocked.masters.len()
                && masters
                    .iter()
                    .zip(&unlocked.masters)
                    .all(|(a, b)| a.id == b.id && *a.key == *b.key)
        });
        if same {
            Ok(())
        } else {
            Err(refuse())
        }
    }

    /// Moves a format 2 repository's key into a key object, then rewrites the config to
    /// format 3 (see the module docs). Nothing to do in a format 3 repository.
    async fn migrate_to_key_objects(&self) -> Result<()> {
        let unlocked = self.unlocked_or_refuse()?;
        let Some(EncryptionConfig::Single(single)) = &self.config().encryption else {
            return Ok(());
        };
        let store = self.store();
        let location = store.location();
        let repo_id = self.config().id.clone();
        let (passphrase, kdf, masters, id) = (
            unlocked.passphrase.clone(),
            single.kdf.clone(),
            unlocked.masters.clone(),
            single.slot_id(),
        );
        let mut slot = tokio::task::spawn_blocking(move || {
            KeySlot::seal(id, &passphrase, &kdf, repo_id.as_bytes(), &masters)
        })
        .await
        .map_err(|_| Error::internal("a key derivation thread panicked"))??;
        // The key is as old as the repository, which a format 2 config does not record.
        slot.created = None;
        // A conflict is the object of an earlier, interrupted migration: it serves as
        // well if this passphrase opens it to the same master key, and anything else (an
        // object planted under the key's public id) stops the migration before the switch.
        if store
            .put(
                &slot.name(),
                Bytes::from(slot.to_json()),
                PutMode::CreateOnly,
            )
            .await?
            == Put::Conflict
        {
            self.check_existing_key(&slot.id).await?;
        }
        let now = store.get(CONFIG, MAX_CONFIG_LEN).await?.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("the config of {location} disappeared"),
            )
        })?;
        let current = Config::parse(&now, &location)?;
        if current.format_version >= FORMAT_VERSION {
            return Ok(());
        }
        if current != *self.config() {
            return Err(Error::invalid_input(format!(
                "the config of {location} changed while this command ran: run it again"
            )));
        }
        let next = Config {
            format_version: FORMAT_VERSION,
            encryption: Some(Config::key_slots()),
            ..current
        };
        // One atomic replacement (a renamed temporary file; an S3 PUT), after which the
        // key object just written opens the repository with the same passphrase.
        store
            .put(CONFIG, Bytes::from(next.to_json()), PutMode::Overwrite)
            .await?;
        tracing::info!(repository = %location, key = %slot.id,
            "moved the repository's key into a key object (format {FORMAT_VERSION})");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use async_trait::async_trait;

    use super::*;
    use crate::index::FixedIndex;
    use crate::keys::tests::single_key;
    use crate::manifest::SnapshotInfo;
    use crate::session::SessionOptions;
    use crate::store::{LocalStore, ObjectMeta, ObjectStore, Version};
    use crate::{Digest, InitOptions};

    const CHUNK: u32 = 64 << 10;

    fn kdf() -> KdfParams {
        KdfParams::insecure_fast()
    }

    fn secret(s: &str) -> Secret {
        Secret::new(s)
    }

    async fn init(store: Arc<dyn ObjectStore>, pass: &str) -> Repository {
        Repository::init(
            store,
            InitOptions::new()
                .with_chunk_size(CHUNK)
                .with_passphrase(secret(pass))
                .with_kdf(kdf()),
        )
        .await
        .unwrap()
    }

    async fn open(store: &Arc<dyn ObjectStore>, pass: &str) -> Result<Repository> {
        Repository::open(Arc::clone(store), Some(&secret(pass))).await
    }

    /// Backs `data` (one chunk) up; returns its digest.
    async fn backup(repo: &Repository, data: &[u8]) -> (Digest, crate::Manifest) {
        let session = repo.begin_session(SessionOptions::new()).await.unwrap();
        let mut index = FixedIndex::new(data.len() as u64, CHUNK).unwrap();
        let put = session.put_chunk(data).await.unwrap();
        index.set(0, put.digest).unwrap();
        let manifest = session
            .finish(&index, SnapshotInfo::new("t"))
            .await
            .unwrap();
        (put.digest, manifest)
    }

    /// Reads a backup whole through `repo` and returns its one chunk.
    async fn restore(repo: &Repository, manifest: &crate::Manifest) -> Vec<u8> {
        let manifest = repo.load_manifest(&manifest.id).await.unwrap();
        let index = repo.load_index(&manifest).await.unwrap();
        repo.get_chunk(&index.digests()[0]).await.unwrap()
    }

    fn data(seed: u8) -> Vec<u8> {
        (0..CHUNK as usize)
            .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
            .collect()
    }

    fn local() -> (tempfile::TempDir, Arc<dyn ObjectStore>) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(LocalStore::new(dir.path().join("repo")));
        (dir, store)
    }

    #[tokio::test]
    async fn added_keys_open_the_same_data_and_removed_ones_do_not() {
        let (_dir, store) = local();
        let repo = init(Arc::clone(&store), "first").await;
        let (_, m) = backup(&repo, &data(3)).await;
        let added = repo.add_key(&secret("second"), &kdf()).await.unwrap();
        assert!(!added.current);
        let second = open(&store, "second").await.unwrap();
        assert_eq!(restore(&second, &m).await, data(3));
        let keys = second.list_keys().await.unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(
            keys.iter()
                .filter(|k| k.current)
                .map(|k| &k.id)
                .collect::<Vec<_>>(),
            [&added.id]
        );
        assert!(keys.iter().all(|k| k.master_keys.len() == 1));

        // The key in use cannot remove itself; an unknown or malformed id is named.
        let err = second.remove_key(&added.id).await.unwrap_err();
        assert!(err.to_string().contains("cannot remove itself"), "{err}");
        let err = second.remove_key("0123456789abcdef").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
        let err = second.remove_key("../config").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");

        let first_id = keys.iter().find(|k| !k.current).unwrap().id.clone();
        let removed = second.remove_key(&first_id).await.unwrap();
        assert_eq!(removed.keys, 1);
        let err = open(&store, "first").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
        assert!(!err.to_string().contains("first"), "{err}");
        let again = open(&store, "second").await.unwrap();
        assert_eq!(restore(&again, &m).await, data(3));
    }

    #[tokio::test]
    async fn rotating_replaces_the_key_in_use_and_keeps_the_chunks() {
        let (_dir, store) = local();
        let repo = init(Arc::clone(&store), "old").await;
        let (digest, m) = backup(&repo, &data(5)).await;
        let chunks_before = store.list("chunks/").await.unwrap();
        let err = repo
            .rotate_key(&secret("old"), &kdf(), false)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("the one in use"), "{err}");
        let rotated = repo
            .rotate_key(&secret("new"), &kdf(), false)
            .await
            .unwrap();
        assert!(rotated.new_master_key.is_none());
        assert!(open(&store, "old").await.is_err());
        let new = open(&store, "new").await.unwrap();
        assert_eq!(restore(&new, &m).await, data(5));
        // Same master key: same chunk names, nothing rewritten, dedup continues.
        assert_eq!(new.chunk_digest(&data(5)), digest);
        let mut after = store.list("chunks/").await.unwrap();
        let mut before = chunks_before;
        after.sort_by(|a, b| a.name.cmp(&b.name));
        before.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(after, before);
        assert!(new.uses_current_master_key(&m));
        let keys = new.list_keys().await.unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].id, rotated.added.id);
        // The last key cannot go.
        assert!(new.remove_key(&keys[0].id).await.is_err());
    }

    #[tokio::test]
    async fn a_new_master_key_encrypts_new_data_and_old_backups_stay_readable() {
        let (_dir, store) = local();
        let repo = init(Arc::clone(&store), "a").await;
        let (old_digest, old) = backup(&repo, &data(7)).await;
        // Refused while another key exists (it could not be given the new master key).
        let other = repo.add_key(&secret("b"), &kdf()).await.unwrap();
        let err = repo
            .rotate_key(&secret("c"), &kdf(), true)
            .await
            .unwrap_err();
        assert!(err.to_string().contains(&other.id), "{err}");
        repo.remove_key(&other.id).await.unwrap();

        let rotated = repo.rotate_key(&secret("c"), &kdf(), true).await.unwrap();
        let new_master = rotated.new_master_key.clone().unwrap();
        assert_eq!(rotated.added.master_key, new_master);
        assert_eq!(rotated.added.master_keys.len(), 2);
        let repo = open(&store, "c").await.unwrap();
        assert_eq!(repo.current_master_key(), Some(new_master.as_str()));
        assert!(!repo.uses_current_master_key(&old));
        // The same content gets another name: no dedup against the old master key's chunks.
        assert_ne!(repo.chunk_digest(&data(7)), old_digest);
        let (new_digest, new) = backup(&repo, &data(7)).await;
        assert_ne!(new_digest, old_digest);
        assert_eq!(new.master_key.as_deref(), Some(new_master.as_str()));
        assert!(repo.uses_current_master_key(&new));
        // Both backups read back exactly, each through its own master key.
        assert_eq!(restore(&repo, &old).await, data(7));
        assert_eq!(restore(&repo, &new).await, data(7));
        // A second new master key keeps both older ones.
        let third = repo.rotate_key(&secret("d"), &kdf(), true).await.unwrap();
        assert_eq!(third.added.master_keys.len(), 3);
        let repo = open(&store, "d").await.unwrap();
        assert_eq!(restore(&repo, &old).await, data(7));
        assert_eq!(restore(&repo, &new).await, data(7));
    }

    /// A format 2 config with one key, as ferry wrote them before key objects.
    async fn legacy(store: &Arc<dyn ObjectStore>, pass: &str) {
        let id = "00112233445566778899aabbccddeeff";
        let (single, _) = single_key(&secret(pass), &kdf(), id.as_bytes());
        let config = Config {
            format_version: 2,
            id: id.into(),
            chunk_size: CHUNK,
            zstd_level: Some(1),
            encryption: Some(EncryptionConfig::Single(single)),
            immutable: None,
        };
        store
            .put(CONFIG, Bytes::from(config.to_json()), PutMode::CreateOnly)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_format_2_repository_opens_and_moves_to_key_objects_on_its_first_key_change() {
        let (_dir, store) = local();
        legacy(&store, "legacy").await;
        let repo = open(&store, "legacy").await.unwrap();
        let (_, m) = backup(&repo, &data(9)).await;
        let keys = repo.list_keys().await.unwrap();
        assert_eq!(keys.len(), 1);
        assert!(keys[0].current && keys[0].created.is_none());
        let legacy_id = keys[0].id.clone();
        // The only key: neither itself nor "the last key" can be removed.
        assert!(repo.remove_key(&legacy_id).await.is_err());

        let added = repo.add_key(&secret("added"), &kdf()).await.unwrap();
        let config =
            Config::parse(&store.get(CONFIG, 1 << 16).await.unwrap().unwrap(), "r").unwrap();
        assert_eq!(config.format_version, FORMAT_VERSION);
        for pass in ["legacy", "added"] {
            let repo = open(&store, pass).await.unwrap();
            assert_eq!(restore(&repo, &m).await, data(9), "{pass}");
            let ids: Vec<String> = repo
                .list_keys()
                .await
                .unwrap()
                .into_iter()
                .map(|k| k.id)
                .collect();
            assert!(
                ids.contains(&legacy_id) && ids.contains(&added.id),
                "{ids:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_planted_key_object_stops_the_move_to_key_objects() {
        let (_dir, store) = local();
        legacy(&store, "legacy").await;
        let repo = open(&store, "legacy").await.unwrap();
        let m = backup(&repo, &data(17)).await.1;
        // Someone writes an object under the old key's (public) id with another passphrase.
        let id = repo.list_keys().await.unwrap()[0].id.clone();
        let planted = KeySlot::seal(
            id,
            &secret("attacker"),
            &kdf(),
            repo.config().id.as_bytes(),
            &[MasterKey::generate().unwrap()],
        )
        .unwrap();
        store
            .put(
                &planted.name(),
                Bytes::from(planted.to_json()),
                PutMode::CreateOnly,
            )
            .await
            .unwrap();
        let err = repo.add_key(&secret("added"), &kdf()).await.unwrap_err();
        assert!(err.to_string().contains("not this key's"), "{err}");
        // Nothing switched: the repository still opens with its key and reads its data.
        let config =
            Config::parse(&store.get(CONFIG, 1 << 16).await.unwrap().unwrap(), "r").unwrap();
        assert_eq!(config.format_version, 2);
        let again = open(&store, "legacy").await.unwrap();
        assert_eq!(restore(&again, &m).await, data(17));
    }

    /// A store that "crashes" at its `at`-th write (put or delete): before doing it, or
    /// right after it (the write done, the caller never told). Later writes also fail.
    #[derive(Debug)]
    struct Crashing {
        inner: Arc<dyn ObjectStore>,
        writes: Arc<AtomicUsize>,
        at: usize,
        after: bool,
    }

    impl Crashing {
        fn write(&self) -> (bool, bool) {
            let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
            // (do it, then fail)
            match n.cmp(&self.at) {
                std::cmp::Ordering::Less => (true, false),
                std::cmp::Ordering::Equal => (self.after, true),
                std::cmp::Ordering::Greater => (false, true),
            }
        }
    }

    fn crash() -> Error {
        Error::new(ErrorKind::Io, "crashed")
    }

    #[async_trait]
    impl ObjectStore for Crashing {
        fn location(&self) -> String {
            self.inner.location()
        }
        async fn put(&self, name: &str, data: Bytes, mode: PutMode) -> Result<Put> {
            let (run, fail) = self.write();
            let out = if run {
                self.inner.put(name, data, mode).await?
            } else {
                Put::Written
            };
            if fail {
                return Err(crash());
            }
            Ok(out)
        }
        async fn get_into(
            &self,
            name: &str,
            max_len: u64,
            buf: Vec<u8>,
        ) -> Result<Option<Vec<u8>>> {
            self.inner.get_into(name, max_len, buf).await
        }
        async fn get_versioned(
            &self,
            name: &str,
            max_len: u64,
        ) -> Result<Option<(Vec<u8>, Version)>> {
            self.inner.get_versioned(name, max_len).await
        }
        async fn head(&self, name: &str) -> Result<Option<ObjectMeta>> {
            self.inner.head(name).await
        }
        async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
            self.inner.list(prefix).await
        }
        async fn delete(&self, name: &str) -> Result<()> {
            let (run, fail) = self.write();
            if run {
                self.inner.delete(name).await?;
            }
            if fail {
                return Err(crash());
            }
            Ok(())
        }
        async fn touch(&self, name: &str) -> Result<()> {
            self.inner.touch(name).await
        }
    }

    /// Every step of a rotation (with the move of a format 2 repository to key objects
    /// first, and with a new master key) interrupted before and after each write: the
    /// repository always opens with the old passphrase or the new one, and reads the
    /// old backup exactly.
    #[tokio::test]
    async fn a_crash_at_any_step_of_a_rotation_leaves_a_repository_the_old_or_new_key_opens() {
        for new_master in [false, true] {
            let mut completed = false;
            for at in 1..=6 {
                for after in [false, true] {
                    let (_dir, store) = local();
                    legacy(&store, "old").await;
                    let m = backup(&open(&store, "old").await.unwrap(), &data(11))
                        .await
                        .1;
                    let counter = Arc::new(AtomicUsize::new(0));
                    let crashing: Arc<dyn ObjectStore> = Arc::new(Crashing {
                        inner: Arc::clone(&store),
                        writes: Arc::clone(&counter),
                        at,
                        after,
                    });
                    let repo = open(&crashing, "old").await.unwrap();
                    let outcome = repo.rotate_key(&secret("new"), &kdf(), new_master).await;
                    let writes = counter.load(Ordering::SeqCst);
                    if outcome.is_ok() {
                        // Fewer writes than `at`: the rotation finished uninterrupted.
                        assert!(writes < at, "at {at}: {writes} writes");
                        completed = true;
                    }
                    let old = open(&store, "old").await;
                    let new = open(&store, "new").await;
                    assert!(
                        old.is_ok() || new.is_ok(),
                        "new master {new_master}, crash at write {at} (after: {after}): neither key opens"
                    );
                    for repo in [&old, &new].into_iter().flatten() {
                        assert_eq!(restore(repo, &m).await, data(11));
                    }
                    // The way on after the crash: rotating again when only the old key
                    // opens; removing the old key with the new one when both do.
                    match (old, new) {
                        (Ok(old), Err(_)) => {
                            old.rotate_key(&secret("again"), &kdf(), new_master)
                                .await
                                .unwrap();
                            let again = open(&store, "again").await.unwrap();
                            assert_eq!(restore(&again, &m).await, data(11));
                        }
                        (Ok(old), Ok(new)) => {
                            if new_master {
                                let err = old
                                    .rotate_key(&secret("again"), &kdf(), true)
                                    .await
                                    .unwrap_err();
                                assert!(err.to_string().contains("was interrupted"), "{err}");
                            }
                            let old_id = &old.unlocked().unwrap().key_id;
                            new.remove_key(old_id).await.unwrap();
                        }
                        _ => {}
                    }
                    assert!(open(&store, "old").await.is_err());
                }
            }
            assert!(completed, "the rotation never ran to its end");
        }
    }

    #[tokio::test]
    async fn a_half_done_rotation_opens_with_both_keys() {
        // The new key object written, the old one not yet deleted.
        let (_dir, store) = local();
        let repo = init(Arc::clone(&store), "old").await;
        let m = backup(&repo, &data(13)).await.1;
        let unlocked = repo.unlocked().unwrap();
        repo.write_key(&secret("new"), &kdf(), unlocked.masters.clone())
            .await
            .unwrap();
        for pass in ["old", "new"] {
            let repo = open(&store, pass).await.unwrap();
            assert_eq!(restore(&repo, &m).await, data(13));
        }
    }

    #[tokio::test]
    async fn an_unencrypted_repository_has_no_keys() {
        let (_dir, store) = local();
        let repo = Repository::init(store, InitOptions::new().with_chunk_size(CHUNK))
            .await
            .unwrap();
        let err = repo.list_keys().await.unwrap_err();
        assert!(err.to_string().contains("not encrypted"), "{err}");
        assert!(repo.add_key(&secret("x"), &kdf()).await.is_err());
    }
}
