//! The key calls of BackupService (ListKeys, AddKey, RemoveKey, RotateKey): `ferry backup
//! key list|add|remove|rotate` for a controller, through the repository's own key
//! management (ferry-backup's `key_admin`, which keeps every step crash-safe). The key in
//! use comes from the request's `repository.key`, a new one from `new_key`, both secret
//! references read now and never stored or answered: replies hold key ids only.

use ferry_backup::{KdfParams, KeyInfo, Repository};
use ferry_core::Result;

use super::repository::passphrase_of;
use super::results::timestamp;
use crate::convert::validation::invalid;
use crate::secrets::SecretResolver;
use ferry_api::proto;

/// The wire form of a key.
fn key(k: &KeyInfo) -> proto::RepositoryKey {
    proto::RepositoryKey {
        id: k.id.clone(),
        create_time: k.created.map(timestamp),
        current: k.current,
        master_key: k.master_key.clone(),
        master_keys: k.master_keys.clone(),
    }
}

fn new_key(secrets: &SecretResolver, r: Option<&proto::SecretRef>) -> Result<ferry_core::Secret> {
    let r = r.ok_or_else(|| {
        invalid("new_key is missing: give the new passphrase by reference (env or file)")
    })?;
    passphrase_of(secrets, "new_key", r)
}

pub async fn list(repo: &Repository) -> Result<proto::ListKeysResponse> {
    Ok(proto::ListKeysResponse {
        keys: repo.list_keys().await?.iter().map(key).collect(),
    })
}

pub async fn add(
    repo: &Repository,
    secrets: &SecretResolver,
    req: &proto::AddKeyRequest,
) -> Result<proto::RepositoryKey> {
    let new = new_key(secrets, req.new_key.as_ref())?;
    Ok(key(&repo.add_key(&new, &KdfParams::default()).await?))
}

pub async fn remove(
    repo: &Repository,
    req: &proto::RemoveKeyRequest,
) -> Result<proto::RemoveKeyResponse> {
    let removed = repo.remove_key(&req.key_id).await?;
    Ok(proto::RemoveKeyResponse {
        removed: removed.removed,
        keys_left: u32::try_from(removed.keys).unwrap_or(u32::MAX),
    })
}

pub async fn rotate(
    repo: &Repository,
    secrets: &SecretResolver,
    req: &proto::RotateKeyRequest,
) -> Result<proto::RotateKeyResponse> {
    let new = new_key(secrets, req.new_key.as_ref())?;
    let rotated = repo
        .rotate_key(&new, &KdfParams::default(), req.new_master_key)
        .await?;
    Ok(proto::RotateKeyResponse {
        removed: rotated.removed,
        added: Some(key(&rotated.added)),
        new_master_key: rotated.new_master_key.unwrap_or_default(),
    })
}
