//! The pages of ListSnapshots (ferry-server's `backups::pages`): in order, none
//! missing or repeated, and each page reading only the manifests it needs (an in-memory
//! list of manifests that counts its loads).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use ferry_backup::{BackupId, Manifest};
use ferry_server::backups::pages::{page, Page, Position};

/// A manifest of backup `id` started `ms` milliseconds into its second.
fn manifest(id: &str, ms: u32, source: &str) -> Manifest {
    let id: BackupId = id.parse().unwrap();
    let time = id.time() + chrono::Duration::milliseconds(i64::from(ms));
    serde_json::from_value(serde_json::json!({
        "id": id, "time": time, "image_size": 1, "chunk_size": 65536,
        "source": source, "parent": null, "tags": {}, "block_hash": null,
        "bytes_new": 0, "bytes_reused": 0, "bytes_zero": 0, "chunks_new": 0,
        "chunks_reused": 0, "chunks_zero": 0, "index_sha256": "", "ferry_version": "t",
    }))
    .unwrap()
}

struct Repo {
    manifests: BTreeMap<BackupId, Manifest>,
    loads: AtomicUsize,
}

impl Repo {
    fn new(list: Vec<Manifest>) -> Self {
        Self {
            manifests: list.into_iter().map(|m| (m.id.clone(), m)).collect(),
            loads: AtomicUsize::new(0),
        }
    }

    fn ids(&self) -> Vec<BackupId> {
        self.manifests.keys().cloned().collect()
    }

    async fn page(&self, after: Option<&Position>, size: usize, source: Option<&str>) -> Page {
        page(
            &self.ids(),
            after,
            size,
            |id| {
                self.loads.fetch_add(1, Ordering::Relaxed);
                let m = self.manifests.get(&id).cloned();
                async move { Ok(m) }
            },
            |m| source.is_none_or(|s| m.source == s),
        )
        .await
        .unwrap()
    }

    /// Every page of `size`, as ids, and the most manifests one page read.
    async fn all(&self, size: usize, source: Option<&str>) -> (Vec<String>, usize) {
        let mut seen = Vec::new();
        let mut after = None;
        let mut most = 0;
        loop {
            self.loads.store(0, Ordering::Relaxed);
            let p = self.page(after.as_ref(), size, source).await;
            most = most.max(self.loads.load(Ordering::Relaxed));
            assert!(p.manifests.len() <= size);
            seen.extend(p.manifests.iter().map(|m| m.id.to_string()));
            if !p.more {
                return (seen, most);
            }
            after = Some(Position::of(p.manifests.last().unwrap()));
            let token = after.as_ref().unwrap().token();
            assert_eq!(Position::parse(&token).unwrap(), after);
        }
    }
}

fn many(n: u32) -> Vec<Manifest> {
    (0..n)
        .map(|i| {
            let id = format!("20261202T10{:02}{:02}Z-0000{:04x}", i / 60, i % 60, i);
            manifest(&id, 0, if i % 3 == 0 { "a" } else { "b" })
        })
        .collect()
}

#[tokio::test]
async fn pages_read_only_their_manifests() {
    let repo = Repo::new(many(200));
    let (seen, most) = repo.all(10, None).await;
    let expected: Vec<String> = repo.ids().iter().map(ToString::to_string).collect();
    assert_eq!(seen, expected);
    assert!(most <= 10, "one page read {most} manifests");
}

#[tokio::test]
async fn a_filter_reads_until_the_page_is_full() {
    let repo = Repo::new(many(200));
    let (seen, _) = repo.all(7, Some("a")).await;
    let expected: Vec<String> = repo
        .manifests
        .values()
        .filter(|m| m.source == "a")
        .map(|m| m.id.to_string())
        .collect();
    assert_eq!(seen.len(), 67);
    assert_eq!(seen, expected);
    repo.loads.store(0, Ordering::Relaxed);
    let first = repo.page(None, 7, Some("a")).await;
    assert_eq!(first.manifests.len(), 7);
    assert!(first.more);
    // Every third is of source a: the 7th of them is the 19th backup.
    assert_eq!(repo.loads.load(Ordering::Relaxed), 19);
    // Past the last one of source a, a page finds none and ends the listing.
    let last = Position::of(repo.manifests.values().nth(198).unwrap());
    let empty = repo.page(Some(&last), 7, Some("a")).await;
    assert!(empty.manifests.is_empty() && !empty.more);
}

#[tokio::test]
async fn backups_of_one_second_order_by_milliseconds() {
    // Ids of one second sort by their random part; the manifests say which started
    // first.
    let repo = Repo::new(vec![
        manifest("20261202T101500Z-ffffffff", 100, "a"),
        manifest("20261202T101500Z-00000000", 900, "a"),
        manifest("20261202T101500Z-88888888", 500, "a"),
        manifest("20261202T101459Z-88888888", 999, "a"),
        manifest("20261202T101501Z-00000000", 0, "a"),
    ]);
    for size in 1..=5 {
        let (seen, _) = repo.all(size, None).await;
        assert_eq!(
            seen,
            [
                "20261202T101459Z-88888888",
                "20261202T101500Z-ffffffff",
                "20261202T101500Z-88888888",
                "20261202T101500Z-00000000",
                "20261202T101501Z-00000000",
            ],
            "page size {size}"
        );
    }
}

#[tokio::test]
async fn a_position_whose_backup_is_gone_still_places_the_page() {
    let repo = Repo::new(many(20));
    let first = repo.page(None, 5, None).await;
    let after = Position::of(first.manifests.last().unwrap());
    let mut fewer = Repo::new(many(20));
    fewer.manifests.remove(after.id());
    let next = fewer.page(Some(&after), 5, None).await;
    let ids: Vec<String> = next.manifests.iter().map(|m| m.id.to_string()).collect();
    let expected: Vec<String> = repo.ids()[5..10].iter().map(ToString::to_string).collect();
    assert_eq!(ids, expected);
}

#[test]
fn foreign_tokens_are_refused() {
    for bad in ["x", "12/", "/20261202T101500Z-0a1b2c3d", "1/yesterday"] {
        let e = Position::parse(bad).unwrap_err();
        assert!(e.message().contains("page_token"), "{bad}");
    }
    assert_eq!(Position::parse("").unwrap(), None);
}
