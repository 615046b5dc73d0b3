//! Replication of image backups: the repository's [`ferry_backup::sync`], with each
//! backup's block digests ([`crate::blocks`]) copied beside it, so that an incremental
//! backup made in the destination on top of a copied one reads only what changed, as it
//! would in the source. The block digests are decoded with the source's keys and stored
//! with the destination's, under the destination's chunk names, before the copy's index
//! and manifest.

use async_trait::async_trait;
use ferry_backup::{CopyBeside, FixedIndex, Manifest, Repository, SyncOptions, SyncReport};
use ferry_core::Result;

use crate::blocks;

/// [`ferry_backup::sync`] of image backups (see the module docs).
pub async fn sync(src: &Repository, dst: &Repository, options: &SyncOptions) -> Result<SyncReport> {
    ferry_backup::sync_with(src, dst, options, &BlockDigestsBeside).await
}

struct BlockDigestsBeside;

#[async_trait]
impl CopyBeside for BlockDigestsBeside {
    async fn copy(
        &self,
        src: &Repository,
        dst: &Repository,
        manifest: &Manifest,
        src_index: &FixedIndex,
        dst_index: &FixedIndex,
    ) -> Result<()> {
        let Some(blob) = blocks::fetch(src, manifest).await? else {
            return Ok(());
        };
        let digests = blocks::open(src, &manifest.id, src_index, &blob)?;
        blocks::store(dst, &manifest.id, dst_index, &digests).await
    }
}
