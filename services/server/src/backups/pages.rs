//! ListSnapshots' pages, read without loading every manifest of the repository: the
//! snapshot ids (one listing) are sorted, and only the manifests of the page are read, in
//! small concurrent batches; with a filter, manifests are read until the page is full.
//! Another page follows when backups are left unread, so a filtered listing may end with
//! an empty page.
//!
//! Order: oldest first by start time, then by id. Ids name their start second, so the
//! ids alone order backups of different seconds; the manifests of one second (usually
//! one) are read together and ordered by their start time in milliseconds.
//!
//! A page token is a position, `MILLISECONDS/ID` (the last backup of the previous page),
//! not a snapshot that must still exist: a prune between two pages neither restarts the
//! listing nor repeats a backup.

use std::future::Future;

use ferry_backup::{BackupId, Manifest};
use ferry_core::{Error, Result};

/// Manifests read at once.
const BATCH: usize = 16;

/// Where a page starts: after the backup the token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    ms: i64,
    id: BackupId,
}

impl Position {
    /// The backup the page starts after.
    pub fn id(&self) -> &BackupId {
        &self.id
    }

    /// The position a token names; None for the empty token (the first page).
    pub fn parse(token: &str) -> Result<Option<Self>> {
        if token.is_empty() {
            return Ok(None);
        }
        let bad = || Error::invalid_input("page_token is not a token this server returned");
        let (ms, id) = token.split_once('/').ok_or_else(bad)?;
        let ms = ms.parse().map_err(|_| bad())?;
        let id = id.parse().map_err(|_| bad())?;
        Ok(Some(Self { ms, id }))
    }

    /// The position of a listed backup.
    pub fn of(m: &Manifest) -> Self {
        Self {
            ms: m.time.timestamp_millis(),
            id: m.id.clone(),
        }
    }

    /// The token naming this position.
    pub fn token(&self) -> String {
        format!("{}/{}", self.ms, self.id)
    }

    /// The sort key: the id's second first (what the ids alone order), then the start
    /// time in milliseconds, then the id.
    fn key(&self) -> (i64, i64, &BackupId) {
        (second(&self.id), self.ms, &self.id)
    }
}

fn second(id: &BackupId) -> i64 {
    id.time().timestamp()
}

/// One page and whether more backups follow it.
#[derive(Debug)]
pub struct Page {
    pub manifests: Vec<Manifest>,
    pub more: bool,
}

/// The page of at most `size` backups (`size` > 0) after `after` among `ids` (sorted, as
/// `Repository::list_snapshots` returns them) that `wanted` accepts. `load` reads one
/// manifest; `Ok(None)` is a backup deleted since the listing, skipped.
pub async fn page<L, F>(
    ids: &[BackupId],
    after: Option<&Position>,
    size: usize,
    load: L,
    wanted: impl Fn(&Manifest) -> bool,
) -> Result<Page>
where
    L: Fn(BackupId) -> F,
    F: Future<Output = Result<Option<Manifest>>>,
{
    let size = size.max(1);
    // Backups of seconds before the position's are before it: never read.
    let mut next = match after {
        Some(p) => ids.partition_point(|id| second(id) < second(&p.id)),
        None => 0,
    };
    let mut out: Vec<Manifest> = Vec::new();
    // The backups of the second being read, in load order.
    let mut group: Vec<Manifest> = Vec::new();
    let mut group_second: Option<i64> = None;
    let flush = |group: &mut Vec<Manifest>, out: &mut Vec<Manifest>| {
        group.sort_by(|a, b| Position::of(a).key().cmp(&Position::of(b).key()));
        out.append(group);
    };
    loop {
        if next == ids.len() || Some(second(&ids[next])) != group_second {
            flush(&mut group, &mut out);
            group_second = None;
        }
        if out.len() >= size || next == ids.len() {
            break;
        }
        // The rest of a second's backups are read even when the page is full: which of
        // them come first is known only then.
        let want = size.saturating_sub(out.len() + group.len());
        let end = (next + want.clamp(1, BATCH)).min(ids.len());
        // The position's own backup is before the page: known without reading it.
        let batch = ids[next..end]
            .iter()
            .filter(|id| after.is_none_or(|p| **id != p.id))
            .cloned()
            .map(&load);
        let loaded = futures_util::future::try_join_all(batch).await?;
        next = end;
        for m in loaded.into_iter().flatten() {
            let s = second(&m.id);
            if group_second != Some(s) {
                flush(&mut group, &mut out);
                group_second = Some(s);
            }
            let later = after.is_none_or(|p| Position::of(&m).key() > p.key());
            if later && wanted(&m) {
                group.push(m);
            }
        }
    }
    let more = out.len() > size || next < ids.len();
    out.truncate(size);
    Ok(Page {
        manifests: out,
        more,
    })
}
