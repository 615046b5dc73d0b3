//! Key objects: `keys/<id>`, each a passphrase's wrapping of the repository's master keys.
//!
//! Why objects and not a list in the config: every change of the keys is then one atomic
//! create or one atomic delete of a whole object, on a directory (a temporary file renamed
//! into place) as on S3 (a PUT). Adding a key creates its object; removing one deletes
//! its object; rotating creates the new object and only then deletes the old one. A
//! crash between the two leaves both keys working, never neither: no step of any key
//! command can leave a repository that no key opens. No object is ever rewritten in
//! place (the directory store's compare-and-swap is not crash-atomic, so it is not used).
//!
//! A key object holds, in the clear, its id, creation time, Argon2id parameters and
//! salt, and the ids and key checks of the master keys it wraps (oldest first; the last
//! one encrypts new data). The master keys themselves are sealed with AES-256-GCM under
//! the passphrase's KEK, one after another; the associated data binds the repository id,
//! the key's id and the master ids, so an object copied to another repository or name,
//! or with its master list edited, does not open.

use chrono::{DateTime, Utc};
use ferry_core::{Error, ErrorKind, Result, Secret};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::keys::{kek, random, seal, unseal, KdfParams, MasterKey, NONCE_LEN, TAG_LEN};
use crate::store::ObjectStore;

/// Where key objects live.
pub(crate) const KEYS_PREFIX: &str = "keys/";
/// A key object is small; anything larger is not one.
pub(crate) const MAX_SLOT_LEN: u64 = 64 << 10;
/// More master keys than a repository will ever rotate through.
const MAX_MASTERS: usize = 256;
const SLOT_AAD: &[u8] = b"ferry-backup key slot v1:";

/// The public description of a master key inside a key object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MasterInfo {
    /// 16 hex digits.
    pub id: String,
    pub created: Option<DateTime<Utc>>,
    /// Hex, 16 bytes derived from the master key: confirms an unwrapped key.
    pub key_check: String,
}

/// One key object, as stored (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KeySlot {
    /// 16 hex digits; the object is `keys/<id>`.
    pub id: String,
    pub created: Option<DateTime<Utc>>,
    pub kdf: KdfParams,
    /// Hex, 16 random bytes.
    pub salt: String,
    /// The master keys this key unwraps, oldest first; the last one encrypts new data.
    pub masters: Vec<MasterInfo>,
    /// Hex: nonce, the master keys one after another sealed with the KEK, the GCM tag.
    pub wrapped: String,
}

/// Every key object of a repository, in the order of their ids.
pub(crate) async fn load_all(store: &dyn ObjectStore) -> Result<Vec<KeySlot>> {
    let mut names: Vec<String> = store
        .list(KEYS_PREFIX)
        .await?
        .into_iter()
        .map(|m| m.name)
        .collect();
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let Some(id) = name.strip_prefix(KEYS_PREFIX).filter(|id| is_id(id)) else {
            continue;
        };
        // Deleted since the listing: a key removed meanwhile.
        let Some(data) = store.get(&name, MAX_SLOT_LEN).await? else {
            continue;
        };
        match KeySlot::parse(&data, id) {
            Ok(slot) => out.push(slot),
            Err(e) => tracing::warn!(key = %id, error = %e, "skipping a damaged key object"),
        }
    }
    Ok(out)
}

/// A new random key id.
pub(crate) fn new_id() -> Result<String> {
    Ok(hex::encode(random::<8>()?))
}

/// Whether `id` can be a key id (16 lowercase hex digits).
pub(crate) fn is_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn aad(repo_id: &[u8], slot_id: &str, masters: &[MasterInfo]) -> Vec<u8> {
    let mut out = [SLOT_AAD, repo_id, b":", slot_id.as_bytes()].concat();
    for m in masters {
        out.push(b':');
        out.extend_from_slice(m.id.as_bytes());
        out.push(b'=');
        out.extend_from_slice(m.key_check.as_bytes());
    }
    out
}

impl KeySlot {
    /// The object name.
    pub(crate) fn name(&self) -> String {
        format!("{KEYS_PREFIX}{}", self.id)
    }

    /// A key object `id` for `passphrase`, wrapping `masters` (oldest first).
    pub(crate) fn seal(
        id: String,
        passphrase: &Secret,
        kdf: &KdfParams,
        repo_id: &[u8],
        masters: &[MasterKey],
    ) -> Result<Self> {
        if masters.is_empty() || masters.len() > MAX_MASTERS {
            return Err(Error::internal("a key object wraps 1 to 256 master keys"));
        }
        let salt: [u8; 16] = random()?;
        let kek = kek(passphrase, &salt, kdf)?;
        let infos = masters
            .iter()
            .map(|m| {
                Ok(MasterInfo {
                    id: m.id.clone(),
                    created: m.created,
                    key_check: m.check(repo_id)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut plain = Zeroizing::new(Vec::with_capacity(32 * masters.len()));
        for m in masters {
            plain.extend_from_slice(&m.key[..]);
        }
        let wrapped = seal(&kek, &plain, &aad(repo_id, &id, &infos))?;
        Ok(Self {
            id,
            created: Some(crate::manifest::now()),
            kdf: kdf.clone(),
            salt: hex::encode(salt),
            masters: infos,
            wrapped: hex::encode(wrapped),
        })
    }

    /// Parses the key object stored as `keys/<name_id>`.
    pub(crate) fn parse(data: &[u8], name_id: &str) -> Result<Self> {
        let damaged = |what: String| {
            Error::new(
                ErrorKind::Corrupt,
                format!("the key object {KEYS_PREFIX}{name_id} is damaged: {what}"),
            )
        };
        let slot: KeySlot = serde_json::from_slice(data).map_err(|e| damaged(e.to_string()))?;
        if slot.id != name_id || !is_id(&slot.id) {
            return Err(damaged(format!("it names itself {}", slot.id)));
        }
        if slot.masters.is_empty() || slot.masters.len() > MAX_MASTERS {
            return Err(damaged(format!(
                "it lists {} master keys",
                slot.masters.len()
            )));
        }
        let wrapped_len = hex::decode(&slot.wrapped)
            .map_err(|_| damaged("its wrapped keys are not hex".into()))?
            .len();
        if wrapped_len != NONCE_LEN + 32 * slot.masters.len() + TAG_LEN {
            return Err(damaged("its wrapped keys have the wrong length".into()));
        }
        if hex::decode(&slot.salt).map_or(true, |s| s.len() < 8) {
            return Err(damaged("its salt is not valid".into()));
        }
        Ok(slot)
    }

    pub(crate) fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// The master keys, oldest first, if `passphrase` is this key's; `None` if not.
    /// Kind Corrupt when the passphrase opens it but a key check fails.
    pub(crate) fn open(
        &self,
        passphrase: &Secret,
        repo_id: &[u8],
    ) -> Result<Option<Vec<MasterKey>>> {
        let salt = hex::decode(&self.salt).map_err(|_| self.damaged("salt"))?;
        let wrapped = hex::decode(&self.wrapped).map_err(|_| self.damaged("wrapped keys"))?;
        let kek = kek(passphrase, &salt, &self.kdf)?;
        let Some(plain) = unseal(&kek, &wrapped, &aad(repo_id, &self.id, &self.masters))? else {
            return Ok(None);
        };
        if plain.len() != 32 * self.masters.len() {
            return Err(self.damaged("wrapped keys"));
        }
        let mut out = Vec::with_capacity(self.masters.len());
        for (info, key) in self.masters.iter().zip(plain.chunks_exact(32)) {
            let mut bytes = Zeroizing::new([0u8; 32]);
            bytes.copy_from_slice(key);
            let master = MasterKey {
                id: info.id.clone(),
                created: info.created,
                key: bytes,
            };
            if master.check(repo_id)? != info.key_check {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "the key object {} opens, but the key check of master key {} fails: it is damaged",
                        self.name(),
                        info.id
                    ),
                ));
            }
            out.push(master);
        }
        Ok(Some(out))
    }

    fn damaged(&self, what: &str) -> Error {
        Error::new(
            ErrorKind::Corrupt,
            format!("the key object {}'s {what} is damaged", self.name()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masters(n: usize) -> Vec<MasterKey> {
        (0..n).map(|_| MasterKey::generate().unwrap()).collect()
    }

    #[test]
    fn a_key_object_opens_with_its_passphrase_only_in_its_repository() {
        let kdf = KdfParams::insecure_fast();
        let keys = masters(2);
        let id = new_id().unwrap();
        let slot = KeySlot::seal(id.clone(), &Secret::new("p1"), &kdf, b"repo", &keys).unwrap();
        let slot = KeySlot::parse(&slot.to_json(), &id).unwrap();
        let opened = slot.open(&Secret::new("p1"), b"repo").unwrap().unwrap();
        assert_eq!(opened.len(), 2);
        for (a, b) in opened.iter().zip(&keys) {
            assert_eq!((a.id.as_str(), *a.key), (b.id.as_str(), *b.key));
        }
        assert!(slot.open(&Secret::new("p2"), b"repo").unwrap().is_none());
        assert!(slot.open(&Secret::new("p1"), b"other").unwrap().is_none());
        // Its JSON holds no key material: neither a master key nor the passphrase.
        let text = String::from_utf8(slot.to_json()).unwrap();
        for k in &keys {
            assert!(!text.contains(&hex::encode(&k.key[..])));
        }
        assert!(!text.contains("p1\""));
    }

    #[test]
    fn a_moved_or_edited_key_object_does_not_open() {
        let kdf = KdfParams::insecure_fast();
        let id = new_id().unwrap();
        let slot =
            KeySlot::seal(id.clone(), &Secret::new("p"), &kdf, b"repo", &masters(2)).unwrap();
        // Under another name.
        let other = new_id().unwrap();
        let mut moved = slot.clone();
        moved.id = other.clone();
        let moved = KeySlot::parse(&moved.to_json(), &other).unwrap();
        assert!(moved.open(&Secret::new("p"), b"repo").unwrap().is_none());
        // Its master list reordered.
        let mut edited = slot.clone();
        edited.masters.reverse();
        assert!(edited.open(&Secret::new("p"), b"repo").unwrap().is_none());
        // Named as another object.
        assert_eq!(
            KeySlot::parse(&slot.to_json(), &other).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
        // Truncated wrapping.
        let mut cut = slot.clone();
        cut.wrapped.truncate(cut.wrapped.len() - 2);
        assert_eq!(
            KeySlot::parse(&cut.to_json(), &id).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
    }

    #[test]
    fn ids_are_sixteen_hex_digits() {
        assert!(is_id(&new_id().unwrap()));
        for bad in [
            "",
            "0123",
            "0123456789abcdeg",
            "0123456789ABCDEF",
            "../config0000000",
        ] {
            assert!(!is_id(bad), "{bad}");
        }
    }
}
