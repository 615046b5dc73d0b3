//! Protected backups (Proxmox Backup Server's flag): a backup marked protected is never
//! removed by a prune, nor by [`Repository::delete_snapshot`], until it is unprotected.
//!
//! The mark is its own object, `protected/<backup id>`, so that protecting is one
//! create and unprotecting one delete: the manifest is written once and never changed
//! (in an encrypted repository it is sealed, and a rewrite could lose it in a crash). A
//! prune lists the marks once before deciding, and a delete checks the backup's mark
//! again right before it removes the manifest. A mark outlives nothing: it names a
//! backup id and nothing else.
//!
//! Ferry releases older than repository format 3 do not know the marks: a prune run by
//! one of them removes protected backups like any other.

use std::collections::HashSet;

use bytes::Bytes;
use ferry_core::{Error, ErrorKind, Result};

use crate::manifest::{now, BackupId};
use crate::repository::Repository;
use crate::store::PutMode;

const PREFIX: &str = "protected/";

fn mark_name(id: &BackupId) -> String {
    format!("{PREFIX}{id}")
}

impl Repository {
    /// Marks backup `id` protected; returns whether it already was. The backup must exist.
    pub async fn protect(&self, id: &BackupId) -> Result<bool> {
        self.load_manifest(id).await?;
        if self.is_protected(id).await? {
            return Ok(true);
        }
        let record = serde_json::json!({ "backup": id, "time": now() }).to_string();
        self.store()
            .put(&mark_name(id), Bytes::from(record), PutMode::Overwrite)
            .await?;
        tracing::info!(backup = %id, repository = %self.store().location(), "protected a backup");
        Ok(false)
    }

    /// Removes backup `id`'s protection; returns whether it was protected.
    pub async fn unprotect(&self, id: &BackupId) -> Result<bool> {
        let was = self.is_protected(id).await?;
        if was {
            self.store().delete(&mark_name(id)).await?;
            tracing::info!(backup = %id, repository = %self.store().location(), "unprotected a backup");
        }
        Ok(was)
    }

    /// Whether backup `id` is protected.
    pub async fn is_protected(&self, id: &BackupId) -> Result<bool> {
        Ok(self.store().head(&mark_name(id)).await?.is_some())
    }

    /// Every protected backup id (one listing).
    pub async fn protected_backups(&self) -> Result<HashSet<BackupId>> {
        Ok(self
            .store()
            .list(PREFIX)
            .await?
            .into_iter()
            .filter_map(|m| m.name.strip_prefix(PREFIX).and_then(|n| n.parse().ok()))
            .collect())
    }

    /// The refusal to delete a protected backup.
    pub(crate) async fn refuse_if_protected(&self, id: &BackupId) -> Result<()> {
        if self.is_protected(id).await? {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "backup {id} is protected: unprotect it first (ferry backup unprotect {} {id})",
                    self.store().location()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::index::FixedIndex;
    use crate::manifest::SnapshotInfo;
    use crate::prune::{Keep, KeepPolicy, KeepReason};
    use crate::session::SessionOptions;
    use crate::store::{LocalStore, ObjectStore};
    use crate::InitOptions;

    async fn backup(repo: &Repository) -> BackupId {
        let session = repo.begin_session(SessionOptions::new()).await.unwrap();
        let index = FixedIndex::new(4096, 64 << 10).unwrap();
        session
            .finish(&index, SnapshotInfo::new("s"))
            .await
            .unwrap()
            .id
    }

    #[tokio::test]
    async fn a_protected_backup_survives_prune_and_delete_until_unprotected() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(LocalStore::new(dir.path()));
        let repo = Repository::init(store, InitOptions::new().with_chunk_size(64 << 10))
            .await
            .unwrap();
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(backup(&repo).await);
            tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        }
        let oldest = ids[0].clone();
        assert!(!repo.protect(&oldest).await.unwrap());
        assert!(repo.protect(&oldest).await.unwrap(), "already protected");
        let missing: BackupId = "20200101T000000Z-00000000".parse().unwrap();
        assert_eq!(
            repo.protect(&missing).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        let err = repo.delete_snapshot(&oldest).await.unwrap_err();
        assert!(err.to_string().contains("is protected"), "{err}");

        let policy = KeepPolicy::new().with_last(Keep::Count(1));
        let report = repo
            .prune(&policy, chrono::Utc::now(), false)
            .await
            .unwrap();
        assert_eq!(report.deleted, [ids[1].clone()]);
        let kept = report
            .plan
            .decisions
            .iter()
            .find(|d| d.snapshot.id == oldest)
            .unwrap();
        assert_eq!(kept.reasons, [KeepReason::Protected]);
        assert_eq!(
            repo.list_snapshots().await.unwrap(),
            [oldest.clone(), ids[2].clone()]
        );

        assert!(repo.unprotect(&oldest).await.unwrap());
        assert!(!repo.unprotect(&oldest).await.unwrap());
        let report = repo
            .prune(&policy, chrono::Utc::now(), false)
            .await
            .unwrap();
        assert_eq!(report.deleted, [oldest]);
    }
}
