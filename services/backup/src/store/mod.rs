//! Where a repository keeps its objects: a small key-value interface that both a
//! directory (local disk or an NFS mount) and an S3 bucket can honour, including the
//! two conditional writes the repository's safety rests on (create-only, and
//! replace-if-unchanged for the GC lease).
//!
//! Names are relative, `/`-separated paths made of ASCII letters, digits, `.`, `_` and
//! `-` (`chunks/ab/ab12...`, `snapshots/20261202T101500Z-0a1b2c3d.json`). Times are the
//! store's own clock (file modification time, S3 `Last-Modified`), in whole seconds, so
//! that every comparison the garbage collector makes uses one clock.

mod local;
mod s3;

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use ferry_core::{Error, ErrorKind, Result};

pub use local::LocalStore;
pub use s3::S3Store;

/// What a listing or a `head` tells about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The object's name, relative to the store's root.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written or touched, by the store's clock, in whole seconds.
    pub modified: SystemTime,
    /// Until when the store refuses to destroy it (S3 Object Lock retention), when the
    /// store said (`head` on an immutable store; never in listings).
    pub retain_until: Option<SystemTime>,
}

/// S3 Object Lock's two retention modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LockMode {
    /// Nobody can shorten the retention or destroy a version before it ends, the
    /// bucket's owner included.
    Compliance,
    /// Only a principal allowed `s3:BypassGovernanceRetention` (and asking for it) can.
    Governance,
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Compliance => "compliance",
            Self::Governance => "governance",
        })
    }
}

impl std::str::FromStr for LockMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "compliance" => Ok(Self::Compliance),
            "governance" => Ok(Self::Governance),
            _ => Err(Error::invalid_input(format!(
                "'{s}' is not an Object Lock mode: use governance or compliance"
            ))),
        }
    }
}

/// The retention a store gives every object version it writes (see
/// [`ObjectStore::with_retention`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub mode: LockMode,
    /// Every version is retained this long after it is written...
    pub period: Duration,
    /// ...and a version written with [`ObjectStore::put_batched`] (a chunk, shared by
    /// later backups) this much longer, so that a later backup that reuses it need not
    /// extend its retention at once (see [`crate::immutable`]).
    pub shared_extra: Duration,
}

/// One version of an object in a versioned store ([`ObjectStore::list_versions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectVersion {
    pub name: String,
    /// The store's id of this version.
    pub version_id: String,
    /// A delete marker (what a delete without a version id leaves), not data.
    pub delete_marker: bool,
    /// The version a plain read returns (for a delete marker: the object reads as gone).
    pub latest: bool,
    pub size: u64,
    pub modified: SystemTime,
}

/// An opaque tag of one state of an object (an S3 ETag; a content digest on disk), used
/// to replace an object only if nobody changed it since it was read.
#[derive(Clone, PartialEq, Eq)]
pub struct Version(pub(crate) String);

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Version({})", self.0)
    }
}

/// How a `put` treats an object that already exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutMode {
    /// Replace it.
    Overwrite,
    /// Fail with [`Put::Conflict`] (S3 `If-None-Match: *`; a hard link on disk).
    CreateOnly,
    /// Replace it only if it is still in the state `Version` (S3 `If-Match`; a rename
    /// check on disk); otherwise (changed or gone) [`Put::Conflict`].
    ReplaceIf(Version),
}

/// What a `put` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// The object now holds the new data.
    Written,
    /// The [`PutMode`] condition did not hold; nothing was written.
    Conflict,
}

/// A store of whole objects. Writes are atomic: a reader sees the old object or the new
/// one, never a part, and a crash never leaves a partial object under its final name.
#[async_trait]
pub trait ObjectStore: Send + Sync + fmt::Debug {
    /// Where the store is (`/srv/backups`, `s3://bucket/prefix`), for messages.
    fn location(&self) -> String;

    /// Writes `data` as `name` according to `mode`.
    async fn put(&self, name: &str, data: Bytes, mode: PutMode) -> Result<Put>;

    /// Writes `data` as `name`, replacing it, for a caller that writes many objects and
    /// then calls [`ObjectStore::persist`] before anything refers to them (a backup's
    /// chunks, before its index). The object's content is durable before it is visible
    /// under its name, so a crash never leaves a partial object; the name itself may be
    /// durable only after `persist`. The default is [`ObjectStore::put`].
    async fn put_batched(&self, name: &str, data: Bytes) -> Result<()> {
        self.put(name, data, PutMode::Overwrite).await.map(|_| ())
    }

    /// Makes every object written with [`ObjectStore::put_batched`] durable under its
    /// name. The default does nothing: a store whose writes are durable when they return
    /// (S3) needs nothing more.
    async fn persist(&self) -> Result<()> {
        Ok(())
    }

    /// Reads a whole object, or `None` if it does not exist. Objects larger than
    /// `max_len` are refused (kind Corrupt) without reading them into memory.
    async fn get(&self, name: &str, max_len: u64) -> Result<Option<Vec<u8>>> {
        self.get_into(name, max_len, Vec::new()).await
    }

    /// [`ObjectStore::get`] into the allocation of `buf` (its content is replaced), so
    /// that a caller reading many objects reuses one buffer instead of mapping and
    /// faulting in fresh memory for each.
    async fn get_into(&self, name: &str, max_len: u64, buf: Vec<u8>) -> Result<Option<Vec<u8>>>;

    /// Like [`ObjectStore::get`], with the version to hand to [`PutMode::ReplaceIf`].
    async fn get_versioned(&self, name: &str, max_len: u64) -> Result<Option<(Vec<u8>, Version)>>;

    /// Size and modification time, or `None` if the object does not exist.
    async fn head(&self, name: &str) -> Result<Option<ObjectMeta>>;

    /// Every object whose name starts with `prefix`, in no particular order.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>>;

    /// Removes an object; removing a missing object is not an error.
    async fn delete(&self, name: &str) -> Result<()>;

    /// Sets an object's modification time to now without changing its content
    /// (kind NotFound if it does not exist). On a store with a [`Retention`], extends
    /// the object's retention instead (a new version would be a new object to retain).
    async fn touch(&self, name: &str) -> Result<()>;

    /// Whether the store can retain versions (an S3 bucket with Object Lock enabled).
    async fn object_lock_enabled(&self) -> Result<bool> {
        Ok(false)
    }

    /// This store, writing every object version with `retention`. Refused (kind
    /// Unsupported) by a store that cannot enforce it.
    fn with_retention(&self, _retention: Retention) -> Result<std::sync::Arc<dyn ObjectStore>> {
        Err(Error::unsupported(format!(
            "{} cannot retain objects: immutable repositories need an S3 bucket with Object Lock enabled",
            self.location()
        )))
    }

    /// The retention this store writes with, if any.
    fn retention(&self) -> Option<Retention> {
        None
    }

    /// Extends the retention of the current version of `name` to at least `until`
    /// (never shortens it); `false` when the object does not exist.
    async fn extend_retention(&self, name: &str, _until: SystemTime) -> Result<bool> {
        Err(Error::unsupported(format!(
            "{} cannot retain objects ({name})",
            self.location()
        )))
    }

    /// Every version (and delete marker) of every object under `prefix`.
    async fn list_versions(&self, prefix: &str) -> Result<Vec<ObjectVersion>> {
        Err(Error::unsupported(format!(
            "{} keeps no object versions ({prefix})",
            self.location()
        )))
    }

    /// Size, time and retention of one version, or `None` if it does not exist.
    async fn head_version(&self, name: &str, _version_id: &str) -> Result<Option<ObjectMeta>> {
        Err(Error::unsupported(format!(
            "{} keeps no object versions ({name})",
            self.location()
        )))
    }

    /// Reads one version of an object, or `None` if it does not exist.
    async fn get_version(
        &self,
        name: &str,
        _version_id: &str,
        _max_len: u64,
    ) -> Result<Option<Vec<u8>>> {
        Err(Error::unsupported(format!(
            "{} keeps no object versions ({name})",
            self.location()
        )))
    }

    /// Destroys one version (or delete marker) for good. A store under Object Lock
    /// refuses a version still retained (kind PermissionDenied).
    async fn delete_version(&self, name: &str, _version_id: &str) -> Result<()> {
        Err(Error::unsupported(format!(
            "{} keeps no object versions ({name})",
            self.location()
        )))
    }

    /// Makes an older version the current one again, by copying it (inside the store)
    /// as a new version; works with the rights of a backup (no version is destroyed).
    async fn restore_version(&self, name: &str, _version_id: &str) -> Result<()> {
        Err(Error::unsupported(format!(
            "{} keeps no object versions ({name})",
            self.location()
        )))
    }
}

/// Reads an object that must exist: a missing one is a NotFound error naming it.
pub(crate) async fn get_required(
    store: &dyn ObjectStore,
    name: &str,
    max_len: u64,
) -> Result<Vec<u8>> {
    get_required_into(store, name, max_len, Vec::new()).await
}

/// [`get_required`] into `buf`'s allocation ([`ObjectStore::get_into`]).
pub(crate) async fn get_required_into(
    store: &dyn ObjectStore,
    name: &str,
    max_len: u64,
    buf: Vec<u8>,
) -> Result<Vec<u8>> {
    store.get_into(name, max_len, buf).await?.ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            format!(
                "{name} is missing from the repository at {}",
                store.location()
            ),
        )
    })
}

/// Checks a name against the rules above, so that no name can leave the store's root.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 512
        && name.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        });
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_input(format!(
            "'{name}' is not a valid repository object name"
        )))
    }
}

/// The refusal of an object larger than a caller's limit.
pub(crate) fn too_large(location: &str, name: &str, size: u64, max_len: u64) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        format!("{name} in {location} is {size} bytes, more than the {max_len} bytes such an object can have: it is damaged or not part of this repository"),
    )
}

/// Drops the sub-second part, so that times from listings and from `head` compare alike.
pub(crate) fn whole_seconds(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => UNIX_EPOCH + Duration::from_secs(d.as_secs()),
        Err(_) => UNIX_EPOCH,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_inside_the_root() {
        for good in [
            "config",
            "chunks/ab/ab01",
            "snapshots/20261202T101500Z-0a1b2c3d.json",
            "locks/gc",
        ] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "a//b",
            "../x",
            "a/../b",
            "a/./b",
            "a b",
            "chunks/",
            "a\\b",
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn times_lose_their_fraction() {
        let t = UNIX_EPOCH + Duration::from_millis(1_500);
        assert_eq!(whole_seconds(t), UNIX_EPOCH + Duration::from_secs(1));
    }
}
