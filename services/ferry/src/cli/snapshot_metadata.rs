//! `ferry backup create --snapshot-metadata URL`: changed-block tracking through the CSI
//! SnapshotMetadata service (KEP-3314).
//!
//! This module reads the command line's credentials (the CA and the token, from the files
//! the environment names; the token never printed) and hands the question to
//! [`ferry_image_backup::plan_with_snapshot_metadata`], which asks the service and falls
//! back, with the reason, whenever its answer cannot be used: never a wrong backup.

use std::path::PathBuf;
use std::sync::Arc;

use ferry_backup::Repository;
use ferry_core::Source;
use ferry_image_backup::{
    plan_with_snapshot_metadata, MetadataPlan, MetadataRequest, ParentChoice,
};
use ferry_snapshot_metadata::SecurityToken;

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
/// files are an error (the command line is wrong) and the repository's failures; the
/// service's failures are fallbacks.
pub async fn plan(
    request: &Request,
    repo: &Repository,
    source: Arc<dyn Source>,
    source_id: &str,
    parent: &ParentChoice,
) -> anyhow::Result<MetadataPlan> {
    let (ca_pem, token) = credentials()?;
    let request = MetadataRequest {
        url: request.url.clone(),
        ca_pem,
        token,
        snapshot: request.snapshot.clone(),
        namespace: request.namespace.clone(),
        base_snapshot_id: request.base_snapshot_id.clone(),
    };
    plan_with_snapshot_metadata(&request, repo, source, source_id, parent)
        .await
        .map_err(|e| super::failed(e, "cannot choose the parent backup"))
}
