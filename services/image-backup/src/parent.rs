//! Choosing the parent of an incremental backup, and deciding whether it fits.
//!
//! A parent fits when it was made with the repository's current master key (chunks of an
//! older one are never taken into new backups, so that the old key stops mattering once
//! its backups are pruned), has the source's size and the repository's chunk size, and
//! its index and block digests load. One that does not fit is not an error: the backup is
//! made in full, and the reason is reported (logged, and in the report's `full_reason`).

use chrono::{DateTime, Utc};
use std::str::FromStr;

use ferry_backup::{BackupId, FixedIndex, Manifest, Repository};
use ferry_core::{Error, Result};
use futures::stream::{self, StreamExt};

use crate::blocks::{self, BlockDigests};

/// Which backup an incremental backup builds on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ParentChoice {
    /// The latest backup of the same source identity, if there is one.
    #[default]
    Auto,
    /// This backup.
    Id(BackupId),
    /// None: a full backup.
    None,
}

impl FromStr for ParentChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "none" => Ok(Self::None),
            id => id.parse().map(Self::Id).map_err(|_| {
                Error::invalid_input(format!(
                    "'{s}' is not a parent: use auto, none or a backup id (like 20261202T101500Z-0a1b2c3d)"
                ))
            }),
        }
    }
}

/// A parent that fits: what an incremental backup takes clean chunks from.
#[derive(Debug)]
pub(crate) struct Parent {
    pub manifest: Manifest,
    pub index: FixedIndex,
    pub blocks: BlockDigests,
}

/// The outcome of choosing: a fitting parent, or why there is none.
#[derive(Debug)]
pub(crate) enum Chosen {
    Parent(Box<Parent>),
    Full(String),
}

/// Manifests read at once while looking for the parent.
const PARALLEL_MANIFESTS: usize = 16;

/// The newest backup of `source` by start time (ids name the second only, so two
/// backups started in one second are told apart by their manifests' exact times).
/// Manifests are read newest first (the first alone, then several at once), and only
/// until every id left is from an earlier second than a backup of `source` already found.
async fn latest_of(repo: &Repository, source: &str) -> Result<Option<Manifest>> {
    latest_backup(repo, source, None).await
}

/// The newest backup of `source` started at or before `as_of` (any time when None), by
/// start time, as [`latest_of`] finds it; what a restore of "the latest backup" restores.
pub async fn latest_backup(
    repo: &Repository,
    source: &str,
    as_of: Option<DateTime<Utc>>,
) -> Result<Option<Manifest>> {
    let mut ids = repo.list_snapshots().await?;
    // Ids name their start's second: one after `as_of`'s second started after it.
    if let Some(t) = as_of {
        ids.retain(|id| id.time() <= t);
    }
    ids.reverse();
    // The newest is most often the one: it is read alone before the others, many at once.
    let rest = ids.split_off(ids.len().min(1));
    let load = |id: BackupId| async move { (repo.load_manifest(&id).await, id) };
    let mut manifests = std::pin::pin!(stream::iter(ids)
        .then(load)
        .chain(stream::iter(rest).map(load).buffered(PARALLEL_MANIFESTS)));
    let mut latest: Option<Manifest> = None;
    while let Some((loaded, id)) = manifests.next().await {
        if latest.as_ref().is_some_and(|l| id.time() < l.id.time()) {
            break;
        }
        match loaded {
            Ok(m) if m.source == source && as_of.is_none_or(|t| m.time <= t) => {
                if latest
                    .as_ref()
                    .is_none_or(|l| (l.time, &l.id) < (m.time, &m.id))
                {
                    latest = Some(m);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(backup = %id, error = %e, "skipping a backup whose manifest cannot be read")
            }
        }
    }
    Ok(latest)
}

/// Chooses the parent of a backup of `source` (`size` bytes).
pub(crate) async fn choose(
    repo: &Repository,
    choice: &ParentChoice,
    source: &str,
    size: u64,
) -> Result<Chosen> {
    let manifest = match choice {
        ParentChoice::None => {
            return Ok(Chosen::Full(
                "no parent was asked for (--parent none)".into(),
            ))
        }
        ParentChoice::Auto => match latest_of(repo, source).await? {
            Some(m) => m,
            None => {
                return Ok(Chosen::Full(format!(
                    "there is no earlier backup of {source}"
                )))
            }
        },
        // A parent named explicitly must exist: a typo should not silently mean "full".
        ParentChoice::Id(id) => repo.load_manifest(id).await?,
    };
    let id = manifest.id.clone();
    if !repo.uses_current_master_key(&manifest) {
        return Ok(Chosen::Full(format!(
            "the parent {id} was made with an earlier master key (key rotate --master): \
             new data is not deduplicated against it"
        )));
    }
    if manifest.image_size != size {
        return Ok(Chosen::Full(format!(
            "the parent {id} is an image of {} bytes, the source has {size}",
            manifest.image_size
        )));
    }
    if manifest.chunk_size != repo.chunk_size() {
        return Ok(Chosen::Full(format!(
            "the parent {id} has {}-byte chunks, the repository {}-byte chunks",
            manifest.chunk_size,
            repo.chunk_size()
        )));
    }
    let (index, blob) = tokio::join!(repo.load_index(&manifest), blocks::fetch(repo, &manifest));
    let index = match index {
        Ok(index) => index,
        Err(e) => {
            return Ok(Chosen::Full(format!(
                "the index of the parent {id} cannot be used: {e}"
            )))
        }
    };
    let blocks = match blob.and_then(|b| b.map(|b| blocks::open(repo, &id, &index, &b)).transpose())
    {
        Ok(Some(blocks)) => blocks,
        Ok(None) => {
            return Ok(Chosen::Full(format!(
                "the parent {id} has no block digests stored"
            )))
        }
        Err(e) => {
            return Ok(Chosen::Full(format!(
                "the block digests of the parent {id} cannot be used: {e}"
            )))
        }
    };
    Ok(Chosen::Parent(Box::new(Parent {
        manifest,
        index,
        blocks,
    })))
}

/// The manifest of the parent a backup of `source` (`size` bytes) would build on, or
/// why it would be a full backup: what a caller needs to know before the backup (which
/// storage snapshot the parent was read from). Pass its id as the backup's parent, so the
/// backup builds on that one.
pub async fn parent_manifest(
    repo: &Repository,
    choice: &ParentChoice,
    source: &str,
    size: u64,
) -> Result<std::result::Result<Manifest, String>> {
    Ok(match choose(repo, choice, source, size).await? {
        Chosen::Parent(p) => Ok(p.manifest),
        Chosen::Full(reason) => Err(reason),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_choices() {
        assert_eq!("auto".parse::<ParentChoice>().unwrap(), ParentChoice::Auto);
        assert_eq!("none".parse::<ParentChoice>().unwrap(), ParentChoice::None);
        let id = "20261202T101500Z-0a1b2c3d";
        assert_eq!(
            id.parse::<ParentChoice>().unwrap(),
            ParentChoice::Id(id.parse().unwrap())
        );
        assert!("latest".parse::<ParentChoice>().is_err());
    }
}
