//! Repository keys: the cryptography of master keys, and the passphrase-derived keys
//! that wrap them.
//!
//! A repository's data is encrypted under a random 32-byte master key. From a master key
//! the chunk key (AES-256-GCM) and the id key (HMAC-SHA256 chunk names) are derived by
//! HKDF-SHA256 with the repository id as salt, and a short key check (also derived)
//! confirms that an unwrapped master key is the one the repository's data uses. A
//! passphrase never encrypts data: KEK = Argon2id(passphrase, salt) only wraps master
//! keys (AES-256-GCM), so a passphrase can be replaced without touching a chunk.
//!
//! Repositories of format 2 stored one wrapped master key in the config ([`SingleKey`]);
//! format 3 keeps them in key objects (see [`crate::key_slot`]). Both are read here.
//! Every key lives in zeroizing memory and no error message ever holds one.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use argon2::{Algorithm, Argon2, Params};
use chrono::{DateTime, Utc};
use ferry_core::{Error, ErrorKind, Result, Secret};
use hkdf::Hkdf;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use zeroize::Zeroizing;

const WRAP_AAD: &[u8] = b"ferry-backup master key v1:";
const INFO_CHUNK: &[u8] = b"ferry-backup chunk key v1";
const INFO_ID: &[u8] = b"ferry-backup id key v1";
const INFO_CHECK: &[u8] = b"ferry-backup key check v1";
pub(crate) const NONCE_LEN: usize = 12;
pub(crate) const TAG_LEN: usize = 16;

/// Argon2id cost parameters, stored in the config so that a repository keeps opening
/// when the defaults change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdfParams {
    /// Always `argon2id`.
    pub algorithm: String,
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes over the memory.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
}

impl Default for KdfParams {
    /// 64 MiB, 3 passes, 1 lane: about a quarter second on a server core.
    fn default() -> Self {
        Self {
            algorithm: "argon2id".to_string(),
            memory_kib: 64 * 1024,
            iterations: 3,
            parallelism: 1,
        }
    }
}

impl KdfParams {
    /// Cheap parameters (8 MiB, 1 pass) for tests; never for real repositories.
    pub fn insecure_fast() -> Self {
        Self {
            algorithm: "argon2id".to_string(),
            memory_kib: 8 * 1024,
            iterations: 1,
            parallelism: 1,
        }
    }

    /// Refuses parameters a damaged or hostile config could use to exhaust memory or time.
    fn check(&self) -> Result<Params> {
        if self.algorithm != "argon2id" {
            return Err(Error::unsupported(format!(
                "the repository's key derivation '{}' is not supported (only argon2id)",
                self.algorithm
            )));
        }
        if !(8..=4 * 1024 * 1024).contains(&self.memory_kib)
            || !(1..=64).contains(&self.iterations)
            || !(1..=64).contains(&self.parallelism)
        {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the repository's argon2id parameters are out of range (memory {} KiB, {} passes, {} lanes)",
                    self.memory_kib, self.iterations, self.parallelism
                ),
            ));
        }
        Params::new(self.memory_kib, self.iterations, self.parallelism, Some(32)).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!("invalid argon2id parameters: {e}"),
            )
        })
    }
}

/// The `encryption` object of the config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EncryptionConfig {
    /// Format 3: the master keys are wrapped by the key objects under `keys/`, any one of
    /// which opens the repository.
    KeySlots(KeySlotsRef),
    /// Format 2: one passphrase wrapping one master key, in the config itself.
    Single(SingleKey),
}

/// The format 3 `encryption` object: where the key objects are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySlotsRef {
    /// Always `keys/`.
    pub key_objects: String,
}

/// The format 2 `encryption` object: one wrapped master key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SingleKey {
    pub kdf: KdfParams,
    /// Hex, 16 random bytes.
    pub salt: String,
    /// Hex: nonce, then the master key encrypted with the KEK, then the GCM tag.
    pub wrapped_key: String,
    /// Hex, 16 bytes derived from the master key.
    pub key_check: String,
}

impl SingleKey {
    /// The stable id this key has in `ferry backup key list`, and keeps as a key object
    /// when the repository moves to format 3: the first 16 hex digits of its salt.
    pub(crate) fn slot_id(&self) -> String {
        self.salt.chars().take(16).collect()
    }

    /// The id of its master key: the first 16 hex digits of the key check (public,
    /// derived from the master key, and stable).
    pub(crate) fn master_id(&self) -> String {
        self.key_check.chars().take(16).collect()
    }
}

/// The working keys of one master key.
pub(crate) struct Keys {
    pub chunk: Zeroizing<[u8; 32]>,
    pub id: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(***)")
    }
}

/// An unwrapped master key, its public id and when it was made (unknown for the master
/// key of a format 2 repository).
#[derive(Clone)]
pub(crate) struct MasterKey {
    pub id: String,
    pub created: Option<DateTime<Utc>>,
    pub key: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MasterKey({}, ***)", self.id)
    }
}

impl MasterKey {
    /// A new random master key with a random id.
    pub(crate) fn generate() -> Result<Self> {
        Ok(Self {
            id: hex::encode(random::<8>()?),
            created: Some(crate::manifest::now()),
            key: Zeroizing::new(random::<32>()?),
        })
    }

    /// Its chunk and id keys.
    pub(crate) fn keys(&self, repo_id: &[u8]) -> Result<Keys> {
        Ok(Keys {
            chunk: derive(&self.key, repo_id, INFO_CHUNK)?,
            id: derive(&self.key, repo_id, INFO_ID)?,
        })
    }

    /// Its key check: 16 bytes in hex, derived, safe to store.
    pub(crate) fn check(&self, repo_id: &[u8]) -> Result<String> {
        let check = derive(&self.key, repo_id, INFO_CHECK)?;
        Ok(hex::encode(&check[..16]))
    }
}

pub(crate) fn random<const N: usize>() -> Result<[u8; N]> {
    let mut out = [0u8; N];
    getrandom::fill(&mut out)
        .map_err(|e| Error::internal(format!("the system random source failed: {e}")))?;
    Ok(out)
}

/// The key-encryption key of a passphrase. Empty passphrases are refused.
pub(crate) fn kek(
    passphrase: &Secret,
    salt: &[u8],
    kdf: &KdfParams,
) -> Result<Zeroizing<[u8; 32]>> {
    if passphrase.expose().is_empty() {
        return Err(Error::invalid_input("the repository passphrase is empty"));
    }
    let params = kdf.check()?;
    let mut out = Zeroizing::new([0u8; 32]);
    Argon2::new(Algorithm::Argon2id, argon2::Version::V0x13, params)
        .hash_password_into(passphrase.expose().as_bytes(), salt, &mut out[..])
        .map_err(|e| Error::internal(format!("argon2id failed: {e}")))?;
    Ok(out)
}

fn derive(master: &[u8; 32], repo_id: &[u8], info: &[u8]) -> Result<Zeroizing<[u8; 32]>> {
    let mut out = Zeroizing::new([0u8; 32]);
    Hkdf::<Sha256>::new(Some(repo_id), master)
        .expand(info, &mut out[..])
        .map_err(|_| Error::internal("HKDF output length"))?;
    Ok(out)
}

/// Seals `plain` under `key` with a random nonce: `nonce | ciphertext | tag`.
pub(crate) fn seal(key: &[u8; 32], plain: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
    let nonce: [u8; NONCE_LEN] = random()?;
    let cipher = Aes256Gcm::new_from_slice(key).map_err(|_| Error::internal("AES key length"))?;
    let sealed = cipher
        .encrypt(Nonce::from_slice(&nonce), Payload { msg: plain, aad })
        .map_err(|_| Error::internal("AES-GCM encryption failed"))?;
    Ok([nonce.as_slice(), &sealed].concat())
}

/// Opens what [`seal`] sealed; `None` when the key (or the associated data) is wrong or
/// the data damaged: AES-GCM cannot tell these apart.
pub(crate) fn unseal(
    key: &[u8; 32],
    sealed: &[u8],
    aad: &[u8],
) -> Result<Option<Zeroizing<Vec<u8>>>> {
    if sealed.len() < NONCE_LEN + TAG_LEN {
        return Ok(None);
    }
    let cipher = Aes256Gcm::new_from_slice(key).map_err(|_| Error::internal("AES key length"))?;
    Ok(cipher
        .decrypt(
            Nonce::from_slice(&sealed[..NONCE_LEN]),
            Payload {
                msg: &sealed[NONCE_LEN..],
                aad,
            },
        )
        .ok()
        .map(Zeroizing::new))
}

/// The refusal of a passphrase that opens no key of the repository.
pub(crate) fn wrong_passphrase() -> Error {
    Error::new(
        ErrorKind::PermissionDenied,
        "wrong passphrase for this repository (or its keys are damaged)",
    )
}

fn legacy_aad(repo_id: &[u8]) -> Vec<u8> {
    [WRAP_AAD, repo_id].concat()
}

/// Unlocks the master key of a format 2 repository with `passphrase`.
pub(crate) fn unlock_single(
    config: &SingleKey,
    passphrase: &Secret,
    repo_id: &[u8],
) -> Result<MasterKey> {
    let corrupt = |what: &str| {
        Error::new(
            ErrorKind::Corrupt,
            format!("the repository config's {what} is damaged"),
        )
    };
    let salt = hex::decode(&config.salt).map_err(|_| corrupt("salt"))?;
    let wrapped =
        Zeroizing::new(hex::decode(&config.wrapped_key).map_err(|_| corrupt("wrapped key"))?);
    if wrapped.len() != NONCE_LEN + 32 + TAG_LEN || salt.len() < 8 {
        return Err(corrupt("wrapped key"));
    }
    let kek = kek(passphrase, &salt, &config.kdf)?;
    let plain = unseal(&kek, &wrapped, &legacy_aad(repo_id))?.ok_or_else(wrong_passphrase)?;
    let mut key = Zeroizing::new([0u8; 32]);
    key.copy_from_slice(&plain);
    let master = MasterKey {
        id: config.master_id(),
        created: None,
        key,
    };
    if master.check(repo_id)? != config.key_check {
        return Err(Error::new(
            ErrorKind::Corrupt,
            "the repository key check failed: the config is damaged",
        ));
    }
    Ok(master)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A format 2 key, as ferry wrote it before key objects (for the compatibility tests).
    pub(crate) fn single_key(
        passphrase: &Secret,
        kdf: &KdfParams,
        repo_id: &[u8],
    ) -> (SingleKey, MasterKey) {
        let salt: [u8; 16] = random().unwrap();
        let mut master = MasterKey::generate().unwrap();
        let kek = kek(passphrase, &salt, kdf).unwrap();
        let wrapped = seal(&kek, &master.key[..], &legacy_aad(repo_id)).unwrap();
        let key_check = master.check(repo_id).unwrap();
        let config = SingleKey {
            kdf: kdf.clone(),
            salt: hex::encode(salt),
            wrapped_key: hex::encode(wrapped),
            key_check,
        };
        master.id = config.master_id();
        (config, master)
    }

    #[test]
    fn the_right_passphrase_unlocks_the_same_master_key() {
        let kdf = KdfParams::insecure_fast();
        let (config, master) = single_key(&Secret::new("correct horse"), &kdf, b"repo-1");
        let again = unlock_single(&config, &Secret::new("correct horse"), b"repo-1").unwrap();
        assert_eq!(*master.key, *again.key);
        assert_eq!(master.id, again.id);
        let keys = again.keys(b"repo-1").unwrap();
        assert_ne!(*keys.chunk, *keys.id);
        let wrong = unlock_single(&config, &Secret::new("battery staple"), b"repo-1").unwrap_err();
        assert_eq!(wrong.kind(), ErrorKind::PermissionDenied);
        assert!(wrong.to_string().contains("wrong passphrase"), "{wrong}");
        // A config moved to another repository does not open there.
        assert!(unlock_single(&config, &Secret::new("correct horse"), b"repo-2").is_err());
    }

    #[test]
    fn hostile_parameters_are_refused_before_any_work() {
        let mut kdf = KdfParams::insecure_fast();
        kdf.memory_kib = u32::MAX;
        let err = kek(&Secret::new("x"), b"saltsalt", &kdf).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        kdf.algorithm = "scrypt".into();
        assert_eq!(
            kek(&Secret::new("x"), b"saltsalt", &kdf)
                .unwrap_err()
                .kind(),
            ErrorKind::Unsupported
        );
        assert_eq!(
            kek(&Secret::new(""), b"saltsalt", &KdfParams::insecure_fast())
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidInput
        );
    }
}
