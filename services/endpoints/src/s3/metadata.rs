//! Ferry's own object metadata (`x-amz-meta-ferry-*`): the image size and its block hash,
//! so a later reader can check the object and skip hashing it again.

use std::collections::HashMap;

/// `x-amz-meta-ferry-size`: the image size in bytes, decimal.
pub const SIZE_KEY: &str = "ferry-size";
/// `x-amz-meta-ferry-blkhash`: the blksum-compatible block hash (SHA-256, 64 KiB blocks)
/// of the image, lowercase hex.
pub const BLKHASH_KEY: &str = "ferry-blkhash";

/// What an object written by ferry says about itself. Values that do not parse are
/// ignored: metadata is a hint, never trusted over the object itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FerryMetadata {
    pub size: Option<u64>,
    /// Lowercase hex, 64 characters.
    pub block_hash: Option<String>,
}

impl FerryMetadata {
    /// Reads the ferry keys from an object's user metadata (keys without `x-amz-meta-`).
    pub fn from_user_metadata(meta: Option<&HashMap<String, String>>) -> Self {
        let Some(meta) = meta else {
            return Self::default();
        };
        let get = |key: &str| {
            meta.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v.trim())
        };
        Self {
            size: get(SIZE_KEY).and_then(|v| v.parse().ok()),
            block_hash: get(BLKHASH_KEY)
                .filter(|v| is_block_hash(v))
                .map(str::to_ascii_lowercase),
        }
    }

    /// The user metadata pairs to store.
    pub fn to_pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        if let Some(size) = self.size {
            pairs.push((SIZE_KEY, size.to_string()));
        }
        if let Some(hash) = &self.block_hash {
            pairs.push((BLKHASH_KEY, hash.clone()));
        }
        pairs
    }
}

/// A SHA-256 digest in hex.
pub(crate) fn is_block_hash(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_junk() {
        let m = FerryMetadata {
            size: Some(12345),
            block_hash: Some("ab".repeat(32)),
        };
        let map: HashMap<String, String> = m
            .to_pairs()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(FerryMetadata::from_user_metadata(Some(&map)), m);

        let junk: HashMap<String, String> = [
            ("Ferry-Size".to_string(), "12x".to_string()),
            ("ferry-blkhash".to_string(), "zz".to_string()),
        ]
        .into();
        assert_eq!(
            FerryMetadata::from_user_metadata(Some(&junk)),
            FerryMetadata::default()
        );
        assert_eq!(
            FerryMetadata::from_user_metadata(None),
            FerryMetadata::default()
        );
    }
}
