//! `ferry backup create --snapshot-metadata URL`: changed-block tracking through the CSI
//! SnapshotMetadata service (KEP-3314).
//!
//! Before the backup, the service is asked which ranges matter: with a parent backup and
//! a base snapshot (`--base-snapshot-id`, or the snapshot id the parent recorded) the
//! delta since the base, and the backup reads only those chunks; without a parent, the
//! snapshot's allocated ranges, and the backup reads only those. Whatever goes wrong (the
//! service unreachable, the token refused, the base unknown, a reply that breaks the
//! protocol) the backup is made without the service, as it would be without the flag (a
//! change-digest incremental, or a full read), and the reason is reported: never a wrong
//! backup. The token is read from a file and never printed.

use std::path::PathBuf;
use std::sync::Arc;

use ferry_backup::Repository;
use ferry_core::Source;
use ferry_image_backup::{
    parent_manifest, AllocatedOnly, ChangedRanges, KnownChanges, ParentChoice,
};
use ferry_snapshot_metadata::{Client, ClientConfig, SecurityToken};

/// The CA certificate file (PEM) the service's certificate must chain to.
pub const CA_FILE_ENV: &str = "FERRY_SNAPSHOT_METADATA_CA_FILE";
/// A file holding the service account token for the service's audience.
pub const TOKEN_FILE_ENV: &str = "FERRY_SNAPSHOT_METADATA_TOKEN_FILE";

/// What the command line asked of the service.
#[derive(Debug, Clone)]
pub struct Request {
    pub url: String,
    pub snapshot: String,
    pub namespace: String,
    pub base_snapshot_id: Option<String>,
}

/// How a backup uses the service's answer.
pub struct Plan {
    /// The source to read (only its allocated ranges, for a full backup).
    pub source: Arc<dyn Source>,
    /// The changed ranges since the parent, for an incremental.
    pub changed: Option<Arc<dyn ChangedRanges>>,
    /// The parent, pinned to the one the delta was asked against.
    pub parent: ParentChoice,
    /// Why the service's answer is not used, when it is not.
    pub fallback: Option<String>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("source", &self.source.describe())
            .field("changed", &self.changed)
            .field("parent", &self.parent)
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl Plan {
    /// The `changed_block_tracking` of the report.
    pub fn tracking(&self) -> &'static str {
        if self.fallback.is_some() {
            "ChangeDigests"
        } else {
            "SnapshotMetadata"
        }
    }
}

/// The CA and the token, from the files the environment names.
fn credentials() -> anyhow::Result<(Vec<u8>, SecurityToken)> {
    let path = |name: &str| -> anyhow::Result<PathBuf> {
        std::env::var_os(name).map(PathBuf::from).ok_or_else(|| {
            anyhow::anyhow!("--snapshot-metadata needs {name} (the path of a file): it is not set")
        })
    };
    let ca_path = path(CA_FILE_ENV)?;
    let ca = std::fs::read(&ca_path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read the CA certificate {} ({CA_FILE_ENV}): {e}",
            ca_path.display()
        )
    })?;
    let token_path = path(TOKEN_FILE_ENV)?;
    let token = std::fs::read_to_string(&token_path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read the token file {} ({TOKEN_FILE_ENV}): {e}",
            token_path.display()
        )
    })?;
    let token = token.trim();
    if token.is_empty() {
        anyhow::bail!(
            "the token file {} ({TOKEN_FILE_ENV}) is empty",
            token_path.display()
        );
    }
    Ok((ca, SecurityToken::new(token)))
}

/// Asks the service and decides how the backup reads `source`. Only the credentials'
/// files are an error (the command line is wrong); the service's failures are fallbacks.
pub async fn plan(
    request: &Request,
    repo: &Repository,
    source: Arc<dyn Source>,
    source_id: &str,
    parent: &ParentChoice,
) -> anyhow::Result<Plan> {
    let (ca, token) = credentials()?;
    let size = source.size();
    let parent_manifest = parent_manifest(repo, parent, source_id, size)
        .await
        .map_err(|e| super::failed(e, "cannot choose the parent backup"))?;
    let unused = |why: String| Plan {
        source: source.clone(),
        changed: None,
        parent: parent.clone(),
        fallback: Some(why),
    };
    let config = ClientConfig::new(&request.url, ca, token, &request.namespace);
    let connect = || async {
        Client::connect(config.clone())
            .await
            .map_err(|e| e.to_string())
    };
    match parent_manifest {
        Ok(manifest) => {
            let pinned = ParentChoice::Id(manifest.id.clone());
            let Some(base) = request
                .base_snapshot_id
                .clone()
                .or_else(|| manifest.snapshot_id.clone())
            else {
                return Ok(Plan {
                    parent: pinned,
                    ..unused(format!(
                        "changed blocks from the CSI SnapshotMetadata service are not used: the parent backup {} records no snapshot id (--snapshot-id) and no --base-snapshot-id was given; comparing change digests instead",
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
            match answer.and_then(|r| {
                tracing::info!(ranges = r.ranges.len(), bytes = r.bytes(), resumed = r.resumed, "changed ranges from the CSI SnapshotMetadata service");
                KnownChanges::new(r.ranges, size, what).map_err(|e| e.to_string())
            }) {
                Ok(changed) => Ok(Plan {
                    source,
                    changed: Some(Arc::new(changed)),
                    parent: pinned,
                    fallback: None,
                }),
                Err(e) => Ok(Plan {
                    parent: pinned,
                    ..unused(format!(
                        "changed blocks from the CSI SnapshotMetadata service are not used: {e}; comparing change digests instead"
                    ))
                }),
            }
        }
        Err(_) => {
            let answer = match connect().await {
                Ok(client) => client
                    .allocated(&request.snapshot, Some(size))
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            match answer.and_then(|r| {
                tracing::info!(ranges = r.ranges.len(), bytes = r.bytes(), resumed = r.resumed, "allocated ranges from the CSI SnapshotMetadata service");
                AllocatedOnly::new(source.clone(), r.ranges).map_err(|e| e.to_string())
            }) {
                Ok(only) => Ok(Plan {
                    source: Arc::new(only),
                    changed: None,
                    parent: parent.clone(),
                    fallback: None,
                }),
                Err(e) => Ok(unused(format!(
                    "allocated ranges from the CSI SnapshotMetadata service are not used: {e}; reading the whole volume"
                ))),
            }
        }
    }
}
