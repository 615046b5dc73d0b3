//! Changed-block tracking through the CSI SnapshotMetadata service (KEP-3314), for
//! every caller of [`backup`](crate::backup): the CLI's `--snapshot-metadata` and the job
//! service's `StartBackupRequest.snapshot_metadata` (what the operator's movers send).
//!
//! Before the backup, the service is asked which ranges matter: with a parent backup and
//! a base snapshot (the request's, or the snapshot id the parent recorded) the delta
//! since the base, and the backup reads only those chunks; without a parent, the
//! snapshot's allocated ranges, and the backup reads only those. Whatever goes wrong (the
//! service unreachable, the token refused, the base unknown, a reply that breaks the
//! protocol) the backup is made without the service, as it would be without it (a
//! change-digest incremental, or a full read), and [`MetadataPlan::fallback`] says why:
//! never a wrong backup. Only choosing the parent can fail (the repository's error).

use std::sync::Arc;

use ferry_backup::Repository;
use ferry_core::{Result, Source};
use ferry_snapshot_metadata::{Client, ClientConfig, SecurityToken};

use crate::{parent_manifest, AllocatedOnly, ChangedRanges, KnownChanges, ParentChoice};

/// What to ask the service, and with which credentials.
#[derive(Debug, Clone)]
pub struct MetadataRequest {
    /// `https://HOST:PORT` (the `SnapshotMetadataService` object's address).
    pub url: String,
    /// The CA certificate(s) the service's certificate must chain to (PEM).
    pub ca_pem: Vec<u8>,
    /// A token for the service's audience (never printed).
    pub token: SecurityToken,
    /// The VolumeSnapshot being backed up.
    pub snapshot: String,
    /// Its namespace.
    pub namespace: String,
    /// The CSI handle of the base snapshot; default: the one the parent recorded.
    pub base_snapshot_id: Option<String>,
}

/// How a backup uses the service's answer.
pub struct MetadataPlan {
    /// The source to read (only its allocated ranges, for a full backup).
    pub source: Arc<dyn Source>,
    /// The changed ranges since the parent, for an incremental.
    pub changed: Option<Arc<dyn ChangedRanges>>,
    /// The parent, pinned to the one the delta was asked against.
    pub parent: ParentChoice,
    /// Why the service's answer is not used, when it is not.
    pub fallback: Option<String>,
}

impl std::fmt::Debug for MetadataPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataPlan")
            .field("source", &self.source.describe())
            .field("changed", &self.changed)
            .field("parent", &self.parent)
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl MetadataPlan {
    /// How the changed blocks were found: `SnapshotMetadata`, or `ChangeDigests` when
    /// the service's answer is not used.
    pub fn tracking(&self) -> &'static str {
        if self.fallback.is_some() {
            "ChangeDigests"
        } else {
            "SnapshotMetadata"
        }
    }
}

/// Asks the service and decides how the backup reads `source`.
pub async fn plan_with_snapshot_metadata(
    request: &MetadataRequest,
    repo: &Repository,
    source: Arc<dyn Source>,
    source_id: &str,
    parent: &ParentChoice,
) -> Result<MetadataPlan> {
    let size = source.size();
    let parent_manifest = parent_manifest(repo, parent, source_id, size).await?;
    let unused = |why: String| MetadataPlan {
        source: source.clone(),
        changed: None,
        parent: parent.clone(),
        fallback: Some(why),
    };
    let config = ClientConfig::new(
        &request.url,
        request.ca_pem.clone(),
        request.token.clone(),
        &request.namespace,
    );
    let connect = || async {
        Client::connect(config.clone())
            .await
            .map_err(|e| e.to_string())
    };
    let Ok(manifest) = parent_manifest else {
        let answer = match connect().await {
            Ok(client) => client
                .allocated(&request.snapshot, Some(size))
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        return Ok(match answer.and_then(|r| {
            tracing::info!(ranges = r.ranges.len(), bytes = r.bytes(), resumed = r.resumed, "allocated ranges from the CSI SnapshotMetadata service");
            AllocatedOnly::new(source.clone(), r.ranges).map_err(|e| e.to_string())
        }) {
            Ok(only) => MetadataPlan {
                source: Arc::new(only),
                changed: None,
                parent: parent.clone(),
                fallback: None,
            },
            Err(e) => unused(format!(
                "allocated ranges from the CSI SnapshotMetadata service are not used: {e}; reading the whole volume"
            )),
        });
    };
    let pinned = ParentChoice::Id(manifest.id.clone());
    if let (Some(given), Some(recorded)) = (&request.base_snapshot_id, &manifest.snapshot_id) {
        if given != recorded {
            // The delta since another snapshot than the parent's would be applied onto the
            // parent's data: a wrong backup.
            return Ok(MetadataPlan {
                parent: pinned,
                ..unused(format!(
                    "changed blocks from the CSI SnapshotMetadata service are not used: the parent backup {} was made from snapshot {recorded}, not from the base {given} given; comparing change digests instead",
                    manifest.id
                ))
            });
        }
    }
    let Some(base) = request
        .base_snapshot_id
        .clone()
        .or_else(|| manifest.snapshot_id.clone())
    else {
        return Ok(MetadataPlan {
            parent: pinned,
            ..unused(format!(
                "changed blocks from the CSI SnapshotMetadata service are not used: the parent backup {} records no snapshot id and no base snapshot id was given; comparing change digests instead",
                manifest.id
            ))
        });
    };
    let answer = match connect().await {
        Ok(client) => client
            .delta(&base, &request.snapshot, Some(size))
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e),
    };
    let what = format!(
        "the CSI SnapshotMetadata delta of {}/{} since {base}",
        request.namespace, request.snapshot
    );
    Ok(match answer.and_then(|r| {
        tracing::info!(ranges = r.ranges.len(), bytes = r.bytes(), resumed = r.resumed, "changed ranges from the CSI SnapshotMetadata service");
        KnownChanges::new(r.ranges, size, what).map_err(|e| e.to_string())
    }) {
        Ok(changed) => MetadataPlan {
            source,
            changed: Some(Arc::new(changed)),
            parent: pinned,
            fallback: None,
        },
        Err(e) => MetadataPlan {
            parent: pinned,
            ..unused(format!(
                "changed blocks from the CSI SnapshotMetadata service are not used: {e}; comparing change digests instead"
            ))
        },
    })
}

/// What a backup's report calls its changed-block tracking: for an incremental, how the
/// blocks to read were found (`tracking`: `SnapshotMetadata`, `DirtyBitmap`, or none
/// asked: `ChangeDigests`); for a full backup, `SnapshotMetadata` when only the
/// service's allocated ranges were read, else none.
pub fn changed_block_tracking(
    incremental: bool,
    tracking: Option<&'static str>,
) -> Option<&'static str> {
    match (incremental, tracking) {
        (true, Some(t)) => Some(t),
        (true, None) => Some("ChangeDigests"),
        (false, Some("SnapshotMetadata")) => Some("SnapshotMetadata"),
        (false, _) => None,
    }
}

/// `reason` joined to a backup's `full_reason` (either may be absent).
pub fn with_reason(full_reason: Option<String>, reason: Option<String>) -> Option<String> {
    match (full_reason, reason) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    }
}
