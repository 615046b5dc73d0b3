//! Backup ids and manifests: the one object that makes a backup exist.
//!
//! A manifest is written last (after every chunk and the index), so a backup that did
//! not finish is never listed. In an unencrypted repository it is plain JSON; in an
//! encrypted one the same JSON is stored as an encrypted blob, so that source names and
//! tags do not leak.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, NaiveDateTime, SubsecRound, Utc};
use ferry_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::keys::random;

/// A manifest is small; anything larger is not one.
pub(crate) const MAX_MANIFEST_LEN: u64 = 1 << 20;
const TIME_FORMAT: &str = "%Y%m%dT%H%M%SZ";

/// The id of a backup, `20261202T101500Z-0a1b2c3d`: its UTC start time to the second and
/// 8 random hex digits. Ids sort by time.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BackupId(String);

impl BackupId {
    /// A new id for a backup starting at `time`.
    pub fn generate(time: DateTime<Utc>) -> Result<Self> {
        let suffix: [u8; 4] = random()?;
        Ok(Self(format!(
            "{}-{}",
            time.format(TIME_FORMAT),
            hex::encode(suffix)
        )))
    }

    /// The start time encoded in the id.
    pub fn time(&self) -> DateTime<Utc> {
        NaiveDateTime::parse_from_str(&self.0[..16], TIME_FORMAT)
            .map(|t| t.and_utc())
            .unwrap_or_default()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn manifest_name(&self) -> String {
        format!("snapshots/{}.json", self.0)
    }

    pub(crate) fn index_name(&self) -> String {
        format!("indexes/{}", self.0)
    }

    pub(crate) fn session_name(&self) -> String {
        format!("sessions/{}.json", self.0)
    }
}

impl FromStr for BackupId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let valid = s.is_ascii()
            && s.len() == 25
            && s.as_bytes()[16] == b'-'
            && NaiveDateTime::parse_from_str(&s[..16], TIME_FORMAT).is_ok()
            && s[17..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if valid {
            Ok(Self(s.to_string()))
        } else {
            Err(Error::invalid_input(format!(
                "'{s}' is not a backup id (like 20261202T101500Z-0a1b2c3d)"
            )))
        }
    }
}

impl TryFrom<String> for BackupId {
    type Error = Error;

    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<BackupId> for String {
    fn from(id: BackupId) -> String {
        id.0
    }
}

impl fmt::Display for BackupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for BackupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BackupId({})", self.0)
    }
}

/// What the backup code tells about a backup it finishes; the session adds the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotInfo {
    /// The source's identity (a URL or a name): snapshots are grouped by it for pruning.
    pub source: String,
    /// The backup this one was made incrementally from, if any.
    pub parent: Option<BackupId>,
    /// Free-form labels.
    pub tags: BTreeMap<String, String>,
    /// The image's block hash (blksum-compatible lowercase hex), when computed.
    pub block_hash: Option<String>,
    /// The storage snapshot the image was read from (a CSI snapshot handle), when the
    /// caller named one: the base of the next backup's changed-block query.
    pub snapshot_id: Option<String>,
}

impl SnapshotInfo {
    pub fn new(source: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            ..Self::default()
        }
    }

    pub fn with_parent(mut self, parent: BackupId) -> Self {
        self.parent = Some(parent);
        self
    }

    pub fn with_tag(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.insert(key.into(), value.into());
        self
    }

    pub fn with_block_hash(mut self, hex: impl Into<String>) -> Self {
        self.block_hash = Some(hex.into());
        self
    }

    pub fn with_snapshot_id(mut self, id: impl Into<String>) -> Self {
        self.snapshot_id = Some(id.into());
        self
    }
}

/// The manifest of a finished backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Manifest {
    pub id: BackupId,
    /// When the backup started (RFC 3339, UTC).
    pub time: DateTime<Utc>,
    pub image_size: u64,
    pub chunk_size: u32,
    pub source: String,
    pub parent: Option<BackupId>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Block hash of the whole image (blksum-compatible hex), if the backup computed it.
    pub block_hash: Option<String>,
    /// The storage snapshot the image was read from (a CSI VolumeSnapshotContent's
    /// snapshot handle), when the backup was told: the next incremental asks the CSI
    /// SnapshotMetadata service for the changes since it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// Bytes in chunks this backup stored (each distinct chunk once).
    pub bytes_new: u64,
    /// Bytes in chunks that were already stored (by earlier backups or earlier in this one).
    pub bytes_reused: u64,
    /// Bytes in zero chunks (not stored).
    pub bytes_zero: u64,
    pub chunks_new: u64,
    pub chunks_reused: u64,
    pub chunks_zero: u64,
    /// SHA-256 (hex) of the serialized index, binding this manifest to its index.
    pub index_sha256: String,
    /// The ferry version that wrote the backup.
    pub ferry_version: String,
    /// In an encrypted repository, the id of the master key its chunks, index and
    /// manifest are encrypted with; absent in backups made before key rotation existed
    /// (they used the repository's first master key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_key: Option<String>,
    /// In an immutable repository, the earliest retain-until date of the backup's
    /// chunks: a backup built on this one need not extend them while it is far enough.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks_retained_until: Option<DateTime<Utc>>,
}

impl Manifest {
    pub(crate) fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }
}

/// Now, to the millisecond (ids name the second; manifests order backups started in one second).
pub(crate) fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_their_time_and_sort_by_it() {
        let t = DateTime::parse_from_rfc3339("2026-12-02T10:15:00Z")
            .unwrap()
            .to_utc();
        let id = BackupId::generate(t).unwrap();
        assert!(id.as_str().starts_with("20261202T101500Z-"), "{id}");
        assert_eq!(id.time(), t);
        assert_eq!(id.to_string().parse::<BackupId>().unwrap(), id);
        let later = BackupId::generate(t + chrono::Duration::seconds(1)).unwrap();
        assert!(later > id);
        for bad in [
            "",
            "20261202T101500Z",
            "20261202T101500Z-0A1B2C3D",
            "2026120xT101500Z-0a1b2c3d",
            "../../etc/passwd",
        ] {
            assert!(bad.parse::<BackupId>().is_err(), "{bad}");
        }
    }
}
