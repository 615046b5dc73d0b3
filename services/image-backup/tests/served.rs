//! A backup's image read as `ferry backup serve`'s clients read it (a [`BackupImage`]):
//! nbdcopy's pattern (4 connections, each taking the next region of the image and reading
//! it front to back in small requests, 64 in flight), with the read-ahead as large as the
//! cache allows and with the smallest cache, every byte compared with the image, the
//! whole read bounded by a timeout (a stall fails the test instead of hanging it), and
//! the chunks fetched bounded (read-ahead that thrashes the cache fetches chunks again).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_backup::{InitOptions, LocalStore, Repository};
use ferry_core::{ExtentKind, IoBuf, Source};
use ferry_engine::{CancellationToken, Progress};
use ferry_image_backup::{backup, BackupImage, BackupOptions, ChunkCache};
use ferry_testkit::MemSource;
use futures::stream::{self, StreamExt};

const CHUNK: u32 = 64 * 1024;
const CHUNKS: usize = 384;
/// nbdcopy's defaults, scaled to the chunk: 4 connections, 64 requests in flight each,
/// regions of 32 chunks, requests of a quarter chunk.
const READERS: usize = 4;
const IN_FLIGHT: usize = 64;
const REGION: u64 = 32 * CHUNK as u64;
const REQUEST: u64 = CHUNK as u64 / 4;

/// Distinct data in every chunk but every ninth (zero, served as a hole, never fetched).
fn image() -> Vec<u8> {
    let c = CHUNK as usize;
    let mut data = vec![0u8; CHUNKS * c];
    for (i, chunk) in data.chunks_mut(c).enumerate() {
        if i % 9 == 4 {
            continue;
        }
        for (j, b) in chunk.iter_mut().enumerate() {
            *b = ((i * 31 + j / 7) % 251) as u8 + 1;
        }
    }
    data
}

async fn backed_up(dir: &tempfile::TempDir, data: &[u8]) -> (Repository, ferry_backup::BackupId) {
    let repo = Repository::init(
        Arc::new(LocalStore::new(dir.path().join("repo"))),
        InitOptions::new().with_chunk_size(CHUNK),
    )
    .await
    .unwrap();
    let report = backup(
        &repo,
        Arc::new(MemSource::sparse(data.to_vec(), 4096)),
        &BackupOptions::new("mem"),
        &Progress::new(),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    (repo, report.manifest.id.clone())
}

/// Reads the whole image as nbdcopy does (data extents only); returns what was read.
async fn read_like_nbdcopy(image: &BackupImage) -> Vec<u8> {
    let size = image.size();
    let next = Arc::new(AtomicU64::new(0));
    let readers = (0..READERS).map(|_| {
        let (next, image) = (next.clone(), image.connect());
        async move {
            let image = image.await.unwrap();
            let mut got = Vec::new();
            loop {
                let start = next.fetch_add(REGION, Ordering::Relaxed);
                if start >= size {
                    return got;
                }
                let end = (start + REGION).min(size);
                let extents = image.extents(start, end - start).await.unwrap();
                let requests = extents
                    .iter()
                    .filter(|e| e.kind == ExtentKind::Data)
                    .flat_map(|e| (e.offset..e.offset + e.len).step_by(REQUEST as usize))
                    .map(|at| {
                        let image = image.clone();
                        async move {
                            let buf = IoBuf::new(REQUEST as usize);
                            (at, image.read_at(at, buf).await.unwrap())
                        }
                    });
                let mut done: Vec<(u64, IoBuf)> = stream::iter(requests)
                    .buffer_unordered(IN_FLIGHT)
                    .collect()
                    .await;
                got.append(&mut done);
            }
        }
    });
    let mut out = vec![0u8; size as usize];
    for reader in futures::future::join_all(readers).await {
        for (at, buf) in reader {
            out[at as usize..at as usize + buf.len()].copy_from_slice(&buf);
        }
    }
    out
}

/// Serves the backup through a cache of `cache_chunks` chunks with `read_ahead` asked;
/// the read must finish within a minute, exact, fetching each chunk at most `most` times
/// on average.
async fn serve_and_read(cache_chunks: u64, read_ahead: usize, most: f64) {
    let dir = tempfile::tempdir().unwrap();
    let data = image();
    let (repo, id) = backed_up(&dir, &data).await;
    let cache = ChunkCache::new(repo, cache_chunks * u64::from(CHUNK));
    let image = BackupImage::open(cache.clone(), &id, read_ahead)
        .await
        .unwrap();
    assert_eq!(
        image.read_ahead(),
        read_ahead.min(cache_chunks as usize / 2)
    );
    let read = tokio::time::timeout(Duration::from_secs(60), read_like_nbdcopy(&image))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the read stalled: cache {cache_chunks} chunks, read-ahead {}: {cache:?}",
                image.read_ahead()
            )
        });
    assert!(read == data, "the image read back differs");
    let data_chunks = (0..CHUNKS).filter(|i| i % 9 != 4).count() as f64;
    let stats = cache.stats();
    assert!(
        stats.misses as f64 <= most * data_chunks,
        "{} fetches for {data_chunks} data chunks: {stats:?}",
        stats.misses
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdcopys_pattern_with_the_largest_read_ahead_finishes_exact() {
    // `--read-ahead 32 --cache-size 512M` of 4 MiB chunks: 128 chunks, 32 ahead.
    serve_and_read(128, 32, 1.5).await;
    // The read-ahead capped by a cache that holds only twice as many chunks.
    serve_and_read(64, 1024, 1.5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdcopys_pattern_through_the_smallest_cache_finishes_exact() {
    // Two chunks: one ahead; the readers' own chunks evict each other, and the read
    // still ends, exact.
    serve_and_read(2, 8, 2.0).await;
}
