//! Verify: re-reads chunks, checks each against its name, and reports which backups a
//! missing or damaged chunk breaks.
//!
//! A missing or damaged chunk is marked with a `bad/<digest>` record, so that later
//! backups store that chunk again instead of deduplicating against the damaged copy or
//! trusting their parent's index (which repairs the backups that reference it, since the
//! name stays the same).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use bytes::Bytes;
use chrono::Utc;
use ferry_core::{ErrorKind, Result};
use futures::stream::{self, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::manifest::BackupId;
use crate::repository::Repository;
use crate::store::{ObjectStore, PutMode};

/// The chunks marked missing or damaged (`bad/<digest>` records).
pub(crate) async fn bad_chunks(store: &dyn ObjectStore) -> Result<HashSet<Digest>> {
    Ok(store
        .list("bad/")
        .await?
        .into_iter()
        .filter_map(|m| m.name.strip_prefix("bad/").and_then(|h| h.parse().ok()))
        .collect())
}

/// What to verify.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct VerifyOptions {
    /// Only the chunks of these backups; `None`: every backup's chunks and every other
    /// chunk in the store.
    pub snapshots: Option<Vec<BackupId>>,
    /// Record missing and damaged chunks under `bad/` (default on).
    pub mark_bad: bool,
    /// Chunks read at once (default 8).
    pub parallel: usize,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        Self {
            snapshots: None,
            mark_bad: true,
            parallel: 8,
        }
    }
}

impl VerifyOptions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_snapshots(mut self, ids: Vec<BackupId>) -> Self {
        self.snapshots = Some(ids);
        self
    }

    pub fn with_mark_bad(mut self, on: bool) -> Self {
        self.mark_bad = on;
        self
    }
}

/// What is wrong with a chunk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChunkFault {
    /// Listed by an index but not stored.
    Missing,
    /// Stored, but unreadable or not matching its name.
    Damaged(String),
}

/// One bad chunk and the backups that need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkProblem {
    pub digest: Digest,
    pub fault: ChunkFault,
    /// The backups whose index lists the chunk (empty for an unreferenced chunk).
    pub snapshots: Vec<BackupId>,
}

/// What a verify found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    pub snapshots_checked: u64,
    pub chunks_checked: u64,
    /// Plaintext bytes of the good chunks.
    pub bytes_checked: u64,
    pub problems: Vec<ChunkProblem>,
    /// Backups whose manifest or index cannot be read, with the reason.
    pub unreadable_snapshots: Vec<(BackupId, String)>,
    /// Every backup that cannot be restored whole, sorted.
    pub broken_snapshots: Vec<BackupId>,
}

impl VerifyReport {
    /// Whether everything checked is intact.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty() && self.unreadable_snapshots.is_empty()
    }
}

/// A checked chunk: its digest, its plaintext size if good, its fault if not.
type ChunkCheck = (Digest, Option<u64>, Option<ChunkFault>);

#[derive(Serialize)]
struct BadRecord {
    found: chrono::DateTime<Utc>,
    fault: String,
}

impl Repository {
    /// Verifies backups (see [`VerifyOptions`]).
    pub async fn verify(&self, options: &VerifyOptions) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        let users = self.chunk_users(options, &mut report).await?;
        let results: Vec<ChunkCheck> = stream::iter(users.keys().copied())
            .map(|digest| self.check_chunk(digest))
            .buffer_unordered(options.parallel.max(1))
            .try_collect()
            .await?;

        let mut broken: BTreeSet<BackupId> = report
            .unreadable_snapshots
            .iter()
            .map(|(id, _)| id.clone())
            .collect();
        for (digest, size, fault) in results {
            report.chunks_checked += 1;
            report.bytes_checked += size.unwrap_or(0);
            let Some(fault) = fault else { continue };
            if options.mark_bad {
                self.mark_bad(&digest, &fault).await?;
            }
            let snapshots = users.get(&digest).cloned().unwrap_or_default();
            broken.extend(snapshots.iter().cloned());
            tracing::warn!(chunk = %digest, fault = ?fault, backups = snapshots.len(), "verify found a bad chunk");
            report.problems.push(ChunkProblem {
                digest,
                fault,
                snapshots,
            });
        }
        report.problems.sort_by_key(|p| p.digest);
        report.broken_snapshots = broken.into_iter().collect();
        Ok(report)
    }

    /// The chunks to check, each with the backups whose index lists it: those of the
    /// chosen backups, or of every backup and every other stored chunk. Backups that
    /// cannot be read are counted in the report.
    async fn chunk_users(
        &self,
        options: &VerifyOptions,
        report: &mut VerifyReport,
    ) -> Result<BTreeMap<Digest, Vec<BackupId>>> {
        let ids = match &options.snapshots {
            Some(ids) => ids.clone(),
            None => self.list_snapshots().await?,
        };
        let mut users: BTreeMap<Digest, Vec<BackupId>> = BTreeMap::new();
        for id in ids {
            let index = match self.load_manifest(&id).await {
                Ok(manifest) => self.load_index(&manifest).await,
                Err(e) => Err(e),
            };
            match index {
                Ok(index) => {
                    report.snapshots_checked += 1;
                    let unique: BTreeSet<Digest> = index
                        .digests()
                        .iter()
                        .filter(|d| !d.is_zero())
                        .copied()
                        .collect();
                    for digest in unique {
                        users.entry(digest).or_default().push(id.clone());
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Corrupt) => {
                    report.unreadable_snapshots.push((id, e.to_string()));
                }
                Err(e) => return Err(e),
            }
        }
        if options.snapshots.is_none() {
            for meta in self.store().list("chunks/").await? {
                if let Some(digest) = Digest::from_chunk_name(&meta.name) {
                    users.entry(digest).or_default();
                }
            }
        }
        Ok(users)
    }

    /// Reads one chunk: its plaintext size if it is good, its fault if not.
    async fn check_chunk(&self, digest: Digest) -> Result<ChunkCheck> {
        match self.get_chunk(&digest).await {
            Ok(plain) => Ok((digest, Some(plain.len() as u64), None)),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                Ok((digest, None, Some(ChunkFault::Missing)))
            }
            Err(e) if e.kind() == ErrorKind::Corrupt => Ok((
                digest,
                None,
                Some(ChunkFault::Damaged(e.message().to_string())),
            )),
            Err(e) => Err(e),
        }
    }

    /// Writes the `bad/<digest>` record of a missing or damaged chunk.
    async fn mark_bad(&self, digest: &Digest, fault: &ChunkFault) -> Result<()> {
        let record = BadRecord {
            found: Utc::now(),
            fault: match fault {
                ChunkFault::Missing => "missing".to_string(),
                ChunkFault::Damaged(reason) => reason.clone(),
            },
        };
        self.store()
            .put(
                &digest.bad_name(),
                Bytes::from(serde_json::to_vec(&record).unwrap_or_default()),
                PutMode::Overwrite,
            )
            .await?;
        Ok(())
    }
}
