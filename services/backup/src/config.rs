//! The `config` object: what every reader must know before touching anything else
//! (format version, repository id, chunk size, compression, encryption). Written once,
//! create-only, by `init`; rewritten once more, whole, only when a format 2 encrypted
//! repository moves its key into a key object (see [`crate::key_admin`]).

use ferry_core::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

use crate::immutable::Immutability;
use crate::key_slot::KEYS_PREFIX;
use crate::keys::{EncryptionConfig, KeySlotsRef};

/// The repository format this crate writes: 3, whose master keys are wrapped by key
/// objects under `keys/` (several passphrases per repository).
pub const FORMAT_VERSION: u32 = 3;
/// The format of an immutable repository (S3 Object Lock): format 3 plus the
/// `immutable` section, so that a ferry that would write objects without retention
/// refuses to open it.
pub const IMMUTABLE_FORMAT_VERSION: u32 = 4;
/// The oldest format this crate reads: 2, with one passphrase's wrapped key in the config.
/// It opens as it is; the first key command moves it to format 3.
pub const MIN_FORMAT_VERSION: u32 = 2;
/// The default chunk size: 4 MiB.
pub const DEFAULT_CHUNK_SIZE: u32 = 4 << 20;
/// Chunk sizes are multiples of the block hash's 64 KiB block...
pub const MIN_CHUNK_SIZE: u32 = 64 << 10;
/// ...and at most 64 MiB, so one chunk always fits comfortably in memory.
pub const MAX_CHUNK_SIZE: u32 = 64 << 20;
/// The default zstd level: 1, as Proxmox Backup Server uses for its chunks. On image data
/// level 3 saves a few percent of space for about 1.6 times the CPU.
pub const DEFAULT_ZSTD_LEVEL: i32 = 1;
/// A config is small; anything larger is not one.
pub(crate) const MAX_CONFIG_LEN: u64 = 64 << 10;

/// The parsed `config` object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub format_version: u32,
    /// 32 hex digits, random, fixed at init.
    pub id: String,
    pub chunk_size: u32,
    /// The zstd level, or `None` for no compression.
    pub zstd_level: Option<i32>,
    /// `None` for an unencrypted repository.
    pub encryption: Option<EncryptionConfig>,
    /// The retention every object version gets (format 4 only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immutable: Option<Immutability>,
}

#[derive(Deserialize)]
struct VersionOnly {
    format_version: u32,
}

pub(crate) fn check_chunk_size(size: u32) -> Result<()> {
    if !size.is_power_of_two() || !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&size) {
        return Err(Error::invalid_input(format!(
            "chunk size {size} must be a power of two from {MIN_CHUNK_SIZE} (64 KiB) to {MAX_CHUNK_SIZE} (64 MiB)"
        )));
    }
    Ok(())
}

pub(crate) fn check_zstd_level(level: Option<i32>) -> Result<()> {
    match level {
        Some(l) if !(1..=22).contains(&l) => Err(Error::invalid_input(format!(
            "zstd level {l} is out of range (1 to 22)"
        ))),
        _ => Ok(()),
    }
}

impl Config {
    /// Parses a config, checking the format version first so that a newer repository
    /// gets a clear message instead of a field error.
    pub(crate) fn parse(data: &[u8], location: &str) -> Result<Self> {
        let damaged = |e: serde_json::Error| {
            Error::new(
                ErrorKind::Corrupt,
                format!("the config of the repository at {location} is damaged: {e}"),
            )
        };
        let version: VersionOnly = serde_json::from_slice(data).map_err(damaged)?;
        if !(MIN_FORMAT_VERSION..=IMMUTABLE_FORMAT_VERSION).contains(&version.format_version) {
            return Err(Error::unsupported(format!(
                "the repository at {location} has format version {}, but this ferry reads format version {FORMAT_VERSION} (and {MIN_FORMAT_VERSION}; {IMMUTABLE_FORMAT_VERSION} for immutable repositories): {}",
                version.format_version,
                if version.format_version > IMMUTABLE_FORMAT_VERSION {
                    "use a newer ferry"
                } else {
                    "it was written by an older ferry, which can still read it"
                }
            )));
        }
        let config: Config = serde_json::from_slice(data).map_err(damaged)?;
        check_chunk_size(config.chunk_size)
            .and_then(|()| check_zstd_level(config.zstd_level))
            .map_err(|e| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!("the config of {location}: {}", e.message()),
                )
            })?;
        let keys_fit = match (&config.encryption, config.format_version) {
            (None, _) => true,
            (Some(EncryptionConfig::Single(_)), v) => v == MIN_FORMAT_VERSION,
            (Some(EncryptionConfig::KeySlots(r)), v) => {
                v >= FORMAT_VERSION && r.key_objects == KEYS_PREFIX
            }
        };
        if config.immutable.is_some() != (config.format_version == IMMUTABLE_FORMAT_VERSION) {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the config of {location} is format version {} {} an immutable section",
                    config.format_version,
                    if config.immutable.is_some() {
                        "with"
                    } else {
                        "without"
                    }
                ),
            ));
        }
        if !keys_fit {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "the config of {location} has an encryption section that format version {} does not have",
                    config.format_version
                ),
            ));
        }
        if config.id.len() != 32 || hex::decode(&config.id).is_err() {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("the config of {location} has no valid id"),
            ));
        }
        Ok(config)
    }

    /// The `encryption` section of a format 3 config.
    pub(crate) fn key_slots() -> EncryptionConfig {
        EncryptionConfig::KeySlots(KeySlotsRef {
            key_objects: KEYS_PREFIX.to_string(),
        })
    }

    pub(crate) fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_version_is_named_with_ours() {
        for other in [1, 5] {
            let config = format!(r#"{{"format_version": {other}, "anything": true}}"#);
            let err = Config::parse(config.as_bytes(), "/r").unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unsupported);
            let text = err.to_string();
            assert!(
                text.contains(&format!("format version {other}"))
                    && text.contains("format version 3 (and 2; 4 for immutable repositories)"),
                "{text}"
            );
        }
    }

    #[test]
    fn chunk_sizes_are_powers_of_two_of_whole_blocks() {
        for ok in [64 << 10, 1 << 20, 4 << 20, 64 << 20] {
            assert!(check_chunk_size(ok).is_ok(), "{ok}");
        }
        for bad in [0, 4096, 3 << 20, 128 << 20] {
            assert!(check_chunk_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn round_trips() {
        let config = Config {
            format_version: FORMAT_VERSION,
            id: "00112233445566778899aabbccddeeff".into(),
            chunk_size: DEFAULT_CHUNK_SIZE,
            zstd_level: Some(3),
            encryption: None,
            immutable: None,
        };
        assert_eq!(Config::parse(&config.to_json(), "/r").unwrap(), config);
        let encrypted = Config {
            encryption: Some(Config::key_slots()),
            ..config.clone()
        };
        assert_eq!(
            Config::parse(&encrypted.to_json(), "/r").unwrap(),
            encrypted
        );
    }

    #[test]
    fn a_format_2_config_opens_and_keeps_its_single_key() {
        // As ferry wrote it before key objects (tests/fixtures/legacy-v2-encrypted).
        let text = r#"{"format_version": 2, "id": "00112233445566778899aabbccddeeff",
            "chunk_size": 65536, "zstd_level": 1, "encryption": {
            "kdf": {"algorithm": "argon2id", "memory_kib": 65536, "iterations": 3, "parallelism": 1},
            "salt": "e3f9b77a7dc9ea4a036dfa7400337896", "wrapped_key": "00",
            "key_check": "16457c803c1f7b4bda1f096cdd0127b4"}}"#;
        let config = Config::parse(text.as_bytes(), "/r").unwrap();
        assert!(matches!(
            config.encryption,
            Some(EncryptionConfig::Single(_))
        ));
        // A format 3 config must point at key objects, a format 2 one must not.
        let mixed = text.replace(r#""format_version": 2"#, r#""format_version": 3"#);
        assert_eq!(
            Config::parse(mixed.as_bytes(), "/r").unwrap_err().kind(),
            ErrorKind::Corrupt
        );
    }
}
