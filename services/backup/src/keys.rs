//! Repository keys: a passphrase unlocks a random master key, from which the chunk key
//! (AES-256-GCM) and the id key (HMAC-SHA256 chunk names) are derived.
//!
//! KEK = Argon2id(passphrase, salt) with the parameters stored in the config; the master
//! key (32 random bytes) is stored wrapped by the KEK with AES-256-GCM, so changing the
//! passphrase later only rewrites the config. Chunk and id keys come from the master key
//! by HKDF-SHA256 with the repository id as salt, and a short key check (also derived)
//! confirms the derivation. Every key lives in zeroizing memory.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use argon2::{Algorithm, Argon2, Params};
use ferry_core::{Error, ErrorKind, Result, Secret};
use hkdf::Hkdf;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use zeroize::Zeroizing;

const WRAP_AAD: &[u8] = b"ferry-backup master key v1:";
const INFO_CHUNK: &[u8] = b"ferry-backup chunk key v1";
const INFO_ID: &[u8] = b"ferry-backup id key v1";
const INFO_CHECK: &[u8] = b"ferry-backup key check v1";
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

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
        Params::new(self.memory_kib, self.iterations, self.parallelism, Some(32))
            .map_err(|e| Error::new(ErrorKind::Corrupt, format!("invalid argon2id parameters: {e}")))
    }
}

/// The `encryption` object of the config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncryptionConfig {
    pub kdf: KdfParams,
    /// Hex, 16 random bytes.
    pub salt: String,
    /// Hex: nonce, then the master key encrypted with the KEK, then the GCM tag.
    pub wrapped_key: String,
    /// Hex, 16 bytes derived from the master key.
    pub key_check: String,
}

/// The working keys of an unlocked repository.
pub(crate) struct Keys {
    pub chunk: Zeroizing<[u8; 32]>,
    pub id: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(***)")
    }
}

pub(crate) fn random<const N: usize>() -> Result<[u8; N]> {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).map_err(|e| Error::internal(format!("the system random source failed: {e}")))?;
    Ok(out)
}

fn kek(passphrase: &Secret, salt: &[u8], kdf: &KdfParams) -> Result<Zeroizing<[u8; 32]>> {
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

fn keys_from(master: &[u8; 32], repo_id: &[u8]) -> Result<(Keys, String)> {
    let check = derive(master, repo_id, INFO_CHECK)?;
    let keys = Keys {
        chunk: derive(master, repo_id, INFO_CHUNK)?,
        id: derive(master, repo_id, INFO_ID)?,
    };
    Ok((keys, hex::encode(&check[..16])))
}

fn aad(repo_id: &[u8]) -> Vec<u8> {
    [WRAP_AAD, repo_id].concat()
}

/// Creates a new master key protected by `passphrase`.
pub(crate) fn create(passphrase: &Secret, kdf: &KdfParams, repo_id: &[u8]) -> Result<(EncryptionConfig, Keys)> {
    if passphrase.expose().is_empty() {
        return Err(Error::invalid_input("the repository passphrase is empty"));
    }
    let salt: [u8; 16] = random()?;
    let master = Zeroizing::new(random::<32>()?);
    let kek = kek(passphrase, &salt, kdf)?;
    let nonce: [u8; NONCE_LEN] = random()?;
    let cipher = Aes256Gcm::new_from_slice(&kek[..]).map_err(|_| Error::internal("AES key length"))?;
    let sealed = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: &master[..],
                aad: &aad(repo_id),
            },
        )
        .map_err(|_| Error::internal("AES-GCM encryption failed"))?;
    let (keys, key_check) = keys_from(&master, repo_id)?;
    let config = EncryptionConfig {
        kdf: kdf.clone(),
        salt: hex::encode(salt),
        wrapped_key: hex::encode([nonce.as_slice(), &sealed].concat()),
        key_check,
    };
    Ok((config, keys))
}

/// Unlocks the master key with `passphrase`.
pub(crate) fn unlock(config: &EncryptionConfig, passphrase: &Secret, repo_id: &[u8]) -> Result<Keys> {
    let corrupt = |what: &str| Error::new(ErrorKind::Corrupt, format!("the repository config's {what} is damaged"));
    let salt = hex::decode(&config.salt).map_err(|_| corrupt("salt"))?;
    let wrapped = Zeroizing::new(hex::decode(&config.wrapped_key).map_err(|_| corrupt("wrapped key"))?);
    if wrapped.len() != NONCE_LEN + 32 + TAG_LEN || salt.len() < 8 {
        return Err(corrupt("wrapped key"));
    }
    let kek = kek(passphrase, &salt, &config.kdf)?;
    let cipher = Aes256Gcm::new_from_slice(&kek[..]).map_err(|_| Error::internal("AES key length"))?;
    let master = cipher
        .decrypt(
            Nonce::from_slice(&wrapped[..NONCE_LEN]),
            Payload {
                msg: &wrapped[NONCE_LEN..],
                aad: &aad(repo_id),
            },
        )
        .map_err(|_| {
            Error::new(
                ErrorKind::PermissionDenied,
                "wrong passphrase for this repository (or its config is damaged)",
            )
        })?;
    let master = Zeroizing::new(master);
    let mut key = Zeroizing::new([0u8; 32]);
    key.copy_from_slice(&master);
    let (keys, check) = keys_from(&key, repo_id)?;
    if check != config.key_check {
        return Err(Error::new(
            ErrorKind::Corrupt,
            "the repository key check failed: the config is damaged",
        ));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_right_passphrase_unlocks_the_same_keys() {
        let kdf = KdfParams::insecure_fast();
        let (config, keys) = create(&Secret::new("correct horse"), &kdf, b"repo-1").unwrap();
        let again = unlock(&config, &Secret::new("correct horse"), b"repo-1").unwrap();
        assert_eq!(*keys.chunk, *again.chunk);
        assert_eq!(*keys.id, *again.id);
        assert_ne!(*keys.chunk, *keys.id);
        let wrong = unlock(&config, &Secret::new("battery staple"), b"repo-1").unwrap_err();
        assert_eq!(wrong.kind(), ErrorKind::PermissionDenied);
        assert!(wrong.to_string().contains("wrong passphrase"), "{wrong}");
        // A config moved to another repository does not open there.
        assert!(unlock(&config, &Secret::new("correct horse"), b"repo-2").is_err());
    }

    #[test]
    fn hostile_parameters_are_refused_before_any_work() {
        let mut kdf = KdfParams::insecure_fast();
        kdf.memory_kib = u32::MAX;
        let err = kek(&Secret::new("x"), b"saltsalt", &kdf).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        kdf.algorithm = "scrypt".into();
        assert_eq!(kek(&Secret::new("x"), b"saltsalt", &kdf).unwrap_err().kind(), ErrorKind::Unsupported);
    }
}
