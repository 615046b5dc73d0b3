//! Backup and restore between in-memory endpoints (ferry-testkit) and a repository in a
//! temporary directory: what is read, what is written, and the block hash, exactly.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_backup::{InitOptions, LocalStore, Repository};
use ferry_blkhash::{digest_bytes, to_hex};
use ferry_core::{Caps, Result};
use ferry_engine::{CancellationToken, Progress};
use ferry_image_backup::{
    backup, restore, BackupOptions, ChangedRanges, ParentChoice, RestoreOptions, RestoreOrder,
};
use ferry_testkit::{MemSource, Op, RecordingTarget};

const CHUNK: u32 = 64 * 1024;

async fn repo(dir: &tempfile::TempDir) -> Repository {
    Repository::init(
        Arc::new(LocalStore::new(dir.path().join("repo"))),
        InitOptions::new().with_chunk_size(CHUNK),
    )
    .await
    .unwrap()
}

/// 20 chunks and a short tail: data in chunks 0, 3 (partly), 7 and the tail; the rest
/// zero. Chunk 7 repeats chunk 0.
fn image() -> Vec<u8> {
    let c = CHUNK as usize;
    let mut data = vec![0u8; 20 * c + 1000];
    for (i, b) in data[..c].iter_mut().enumerate() {
        *b = (i % 251) as u8 + 1;
    }
    data[3 * c + 4096..3 * c + 8192].fill(9);
    let first = data[..c].to_vec();
    data[7 * c..8 * c].copy_from_slice(&first);
    data[20 * c + 10] = 5;
    data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_chunks_are_neither_read_nor_written_and_the_hash_matches() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repo(&dir).await;
    let data = image();
    let source = MemSource::sparse(data.clone(), 4096);
    let stats = Arc::clone(&source.stats);
    let (progress, cancel) = (Progress::new(), CancellationToken::new());
    let report = backup(
        &repo,
        Arc::new(source),
        &BackupOptions::new("mem"),
        &progress,
        &cancel,
    )
    .await
    .unwrap();
    let m = &report.manifest;
    assert_eq!(
        m.block_hash.as_deref(),
        Some(to_hex(&digest_bytes(&data)).as_str())
    );
    assert_eq!((m.chunks_new, m.chunks_reused, m.chunks_zero), (3, 1, 17));
    // Only data extents are read: chunk 0, chunk 7, 4 KiB of chunk 3, the tail block.
    let read: usize = stats.reads().iter().map(|r| r.1).sum();
    assert_eq!(read, 2 * CHUNK as usize + 4096 + 1000);

    for order in [RestoreOrder::OutOfOrder, RestoreOrder::InOrder] {
        let target = RecordingTarget::zeroed(data.len() as u64);
        let restored = restore(
            &repo,
            &m.id,
            Arc::new(target.clone()),
            &RestoreOptions::new().with_order(order),
            &progress,
            &cancel,
        )
        .await
        .unwrap();
        assert!(restored.verified);
        assert_eq!(target.data(), data);
        assert!(target.zeroes().is_empty(), "a zero target needs no zeroing");
        let mut writes = target.writes();
        writes.sort();
        // Zero 4 KiB blocks inside data chunks are not written either ([start, end)).
        let c = u64::from(CHUNK);
        assert_eq!(
            writes,
            vec![
                (0, c),
                (3 * c + 4096, 3 * c + 8192),
                (7 * c, 8 * c),
                (20 * c, 20 * c + 1000)
            ]
        );
    }

    // A target that is not known to be zero gets zero chunks as write_zeroes.
    let target = RecordingTarget::new(data.len() as u64);
    restore(
        &repo,
        &m.id,
        Arc::new(target.clone()),
        &RestoreOptions::new(),
        &progress,
        &cancel,
    )
    .await
    .unwrap();
    assert_eq!(target.data(), data);
    assert!(target.ops().iter().any(|op| matches!(op, Op::Zero { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_order_targets_are_written_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repo(&dir).await;
    let data: Vec<u8> = (0..12 * CHUNK as usize)
        .map(|i| (i * 7 % 253) as u8 + 1)
        .collect();
    let (progress, cancel) = (Progress::new(), CancellationToken::new());
    let report = backup(
        &repo,
        Arc::new(MemSource::new(data.clone())),
        &BackupOptions::new("m"),
        &progress,
        &cancel,
    )
    .await
    .unwrap();
    let caps = Caps {
        random_write: false,
        ..Caps::default()
    };
    let target = RecordingTarget::new(data.len() as u64).with_caps(caps);
    restore(
        &repo,
        &report.manifest.id,
        Arc::new(target.clone()),
        &RestoreOptions::new(),
        &progress,
        &cancel,
    )
    .await
    .unwrap();
    assert_eq!(target.data(), data);
    let writes = target.writes();
    assert!(writes.windows(2).all(|w| w[0].0 < w[1].0), "{writes:?}");
}

/// Says only `dirty` changed.
#[derive(Debug)]
struct Dirty(Vec<(u64, u64)>);

#[async_trait]
impl ChangedRanges for Dirty {
    async fn changed(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        Ok(self
            .0
            .iter()
            .filter(|(s, e)| *s < offset + len && *e > offset)
            .map(|(s, e)| (*s.max(&offset), *e.min(&(offset + len))))
            .collect())
    }

    fn describe(&self) -> String {
        "test bitmap".into()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_ranges_limit_reads_to_dirty_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repo(&dir).await;
    let mut data = image();
    let (progress, cancel) = (Progress::new(), CancellationToken::new());
    let first = backup(
        &repo,
        Arc::new(MemSource::sparse(data.clone(), 4096)),
        &BackupOptions::new("mem"),
        &progress,
        &cancel,
    )
    .await
    .unwrap();
    let c = u64::from(CHUNK);
    data[(5 * c) as usize + 3] = 0x77; // a zero chunk gets data
    data[(7 * c) as usize] ^= 0xff; // a data chunk changes
    let source = MemSource::sparse(data.clone(), 4096);
    let stats = Arc::clone(&source.stats);
    let options = BackupOptions::new("mem").with_changed(Arc::new(Dirty(vec![
        (5 * c, 5 * c + 4096),
        (7 * c, 7 * c + 1),
    ])));
    let second = backup(&repo, Arc::new(source), &options, &progress, &cancel)
        .await
        .unwrap();
    assert_eq!(second.manifest.parent.as_ref(), Some(&first.manifest.id));
    assert_eq!(second.chunks_read, 2);
    assert_eq!(second.chunks_unread, 19);
    let read: Vec<u64> = stats.reads().iter().map(|r| r.0 / c).collect();
    assert!(
        read.iter().all(|&chunk| chunk == 5 || chunk == 7),
        "{read:?}"
    );
    assert_eq!(
        second.manifest.block_hash.as_deref(),
        Some(to_hex(&digest_bytes(&data)).as_str())
    );
    assert_eq!(second.chunks_unchanged, 0, "both chunks read changed");

    // Without the bitmap every data chunk is read again: those unchanged (the two read
    // by the second backup, and the three it took from the first unread, whose change
    // digests it carried over) are told by their change digests; the changed one is not.
    data[3 * c as usize + 5000] ^= 1;
    let third = backup(
        &repo,
        Arc::new(MemSource::sparse(data.clone(), 4096)),
        &BackupOptions::new("mem"),
        &progress,
        &cancel,
    )
    .await
    .unwrap();
    assert_eq!(third.manifest.parent.as_ref(), Some(&second.manifest.id));
    assert_eq!((third.chunks_read, third.chunks_unread), (5, 0));
    assert_eq!(third.chunks_unchanged, 4, "{third:?}");
    assert_eq!(third.manifest.chunks_new, 1);
    assert_eq!(
        third.manifest.block_hash.as_deref(),
        Some(to_hex(&digest_bytes(&data)).as_str())
    );

    // Without a parent the bitmap cannot be used: a full backup, with the reason.
    let source = MemSource::sparse(data.clone(), 4096);
    let full = backup(
        &repo,
        Arc::new(source),
        &options.clone().with_parent(ParentChoice::None),
        &progress,
        &cancel,
    )
    .await
    .unwrap();
    assert!(full.full_reason.unwrap().contains("--parent none"));
    assert_eq!(full.chunks_unread, 0);
    assert_eq!(full.chunks_unchanged, 0);
    assert_eq!(full.manifest.block_hash, third.manifest.block_hash);
}

/// A target that takes writes smaller than a chunk: the engine reads parts of chunks, each
/// chunk is fetched once for all its parts, and the image and its block hash come out
/// whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_of_small_writes_gets_every_chunk_in_parts() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repo(&dir).await;
    let data = image();
    let (progress, cancel) = (Progress::new(), CancellationToken::new());
    let report = backup(
        &repo,
        Arc::new(MemSource::new(data.clone())),
        &BackupOptions::new("small"),
        &progress,
        &cancel,
    )
    .await
    .unwrap();
    let mut caps = Caps::default();
    caps.block.maximum = 16 * 1024;
    let target = RecordingTarget::new(data.len() as u64).with_caps(caps);
    let restored = restore(
        &repo,
        &report.manifest.id,
        Arc::new(target.clone()),
        &RestoreOptions::new().with_workers(3),
        &progress,
        &cancel,
    )
    .await
    .unwrap();
    assert_eq!(target.data(), data);
    assert!(restored.verified);
    assert_eq!(restored.block_hash, to_hex(&digest_bytes(&data)));
    let writes = target.writes();
    assert!(
        writes.iter().all(|(start, end)| end - start <= 16 * 1024),
        "{writes:?}"
    );
}
