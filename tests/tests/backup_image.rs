//! Image backups and restores (ferry-image-backup) on real storage: a directory repository
//! and the in-process S3 server (s3s + s3s-fs), sources and targets opened by URL like the
//! CLI opens them. Stores and sources are wrapped to count what was uploaded and read;
//! results are checked with `qemu-img compare`, the independent block hash and the
//! allocation of the restored file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use ferry_backup::store::Version;
use ferry_backup::{
    BackupId, InitOptions, KdfParams, LocalStore, ObjectMeta, ObjectStore, Put, PutMode,
    Repository, S3Store,
};
use ferry_core::{ErrorKind, Result, Secret, Source};
use ferry_engine::{CancellationToken, Progress};
use ferry_image_backup::{
    backup, restore, BackupOptions, BackupReport, ParentChoice, RestoreOptions, RestoreOrder,
};
use ferry_testkit::CountingSource;
use ferry_tests::check::{assert_allocated_about, blkhash_file, qemu_img_compare};
use ferry_tests::copying;
use ferry_tests::images::{self, Pattern};
use ferry_tests::s3_server::S3Server;
use ferry_tests::scratch_dir;

/// Small chunks keep the images small while giving them many chunks, some all-zero.
const CHUNK: u32 = 256 * 1024;
const BUCKET: &str = "backups";

/// Counts the chunk uploads and lookups that reach the store.
#[derive(Debug)]
struct CountingStore {
    inner: Arc<dyn ObjectStore>,
    chunk_puts: AtomicU64,
    chunk_heads: AtomicU64,
}

#[async_trait]
impl ObjectStore for CountingStore {
    fn location(&self) -> String {
        self.inner.location()
    }

    async fn put(&self, name: &str, data: Bytes, mode: PutMode) -> Result<Put> {
        if name.starts_with("chunks/") {
            self.chunk_puts.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.put(name, data, mode).await
    }

    async fn get_into(&self, name: &str, max_len: u64, buf: Vec<u8>) -> Result<Option<Vec<u8>>> {
        self.inner.get_into(name, max_len, buf).await
    }

    async fn get_versioned(&self, name: &str, max_len: u64) -> Result<Option<(Vec<u8>, Version)>> {
        self.inner.get_versioned(name, max_len).await
    }

    async fn head(&self, name: &str) -> Result<Option<ObjectMeta>> {
        if name.starts_with("chunks/") {
            self.chunk_heads.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.head(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        self.inner.list(prefix).await
    }

    async fn delete(&self, name: &str) -> Result<()> {
        self.inner.delete(name).await
    }

    async fn touch(&self, name: &str) -> Result<()> {
        self.inner.touch(name).await
    }
}

/// A repository on one backend, with its chunk uploads counted.
struct Backend {
    store: Arc<CountingStore>,
    files: PathBuf,
    _server: Option<S3Server>,
    _dir: tempfile::TempDir,
}

impl Backend {
    async fn local() -> Self {
        let dir = scratch_dir();
        let files = dir.path().join("repo");
        Self::with(Arc::new(LocalStore::new(&files)), files, None, dir)
    }

    async fn s3() -> Self {
        let server = S3Server::start().await;
        server.create_bucket(BUCKET);
        let store = S3Store::connect(BUCKET, "vm", &server.options()).await;
        let files = server.object_path(BUCKET, "vm");
        Self::with(Arc::new(store), files, Some(server), scratch_dir())
    }

    fn with(
        inner: Arc<dyn ObjectStore>,
        files: PathBuf,
        server: Option<S3Server>,
        dir: tempfile::TempDir,
    ) -> Self {
        Self {
            store: Arc::new(CountingStore {
                inner,
                chunk_puts: AtomicU64::new(0),
                chunk_heads: AtomicU64::new(0),
            }),
            files,
            _server: server,
            _dir: dir,
        }
    }

    fn puts(&self) -> u64 {
        self.store.chunk_puts.load(Ordering::Relaxed)
    }

    fn heads(&self) -> u64 {
        self.store.chunk_heads.load(Ordering::Relaxed)
    }

    async fn init(&self, passphrase: Option<&str>) -> Repository {
        let mut options = InitOptions::new()
            .with_chunk_size(CHUNK)
            .with_kdf(KdfParams::insecure_fast());
        if let Some(p) = passphrase {
            options = options.with_passphrase(Secret::new(p));
        }
        Repository::init(self.store.clone(), options)
            .await
            .expect("init the repository")
    }
}

fn url(path: &Path) -> String {
    path.to_str().expect("utf-8 path").to_string()
}

async fn back_up(
    repo: &Repository,
    source: Arc<dyn Source>,
    options: &BackupOptions,
) -> Result<BackupReport> {
    backup(
        repo,
        source,
        options,
        &Progress::new(),
        &CancellationToken::new(),
    )
    .await
}

async fn back_up_file(repo: &Repository, image: &Path) -> BackupReport {
    let source = copying::source(&url(image)).await.expect("open the image");
    back_up(repo, source, &BackupOptions::new(url(image)))
        .await
        .expect("back the image up")
}

async fn restore_to(
    repo: &Repository,
    id: &BackupId,
    out: &Path,
    size: u64,
    order: RestoreOrder,
) -> Result<ferry_image_backup::RestoreReport> {
    let target = copying::target(&url(out), size).await?;
    restore(
        repo,
        id,
        target,
        &RestoreOptions::new().with_order(order),
        &Progress::new(),
        &CancellationToken::new(),
    )
    .await
}

async fn full_backup_and_sparse_restore(backend: Backend) {
    let repo = backend.init(None).await;
    let scratch = scratch_dir();
    let img = images::make(
        &scratch.path().join("disk.img"),
        Pattern::HalfData,
        24 * 1024 * 1024 + 4096 + 77,
        7,
    )
    .unwrap();
    let expected = blkhash_file(&img.path);

    let report = back_up_file(&repo, &img.path).await;
    let m = &report.manifest;
    assert_eq!(m.block_hash.as_deref(), Some(expected.as_str()));
    assert_eq!(m.image_size, img.size);
    assert!(
        m.chunks_zero > 0,
        "a half-data image in 256K chunks has zero chunks: {m:?}"
    );
    assert_eq!(
        m.chunks_new,
        backend.puts(),
        "every new chunk uploaded once"
    );
    assert_eq!(
        report.full_reason.as_deref(),
        Some(format!("there is no earlier backup of {}", url(&img.path)).as_str())
    );
    // Zero chunks are never read.
    assert!(report.bytes_read <= img.size - m.bytes_zero, "{report:?}");

    for order in [RestoreOrder::OutOfOrder, RestoreOrder::InOrder] {
        let out = scratch.path().join(format!("restored-{order:?}.img"));
        let restored = restore_to(&repo, &m.id, &out, m.image_size, order)
            .await
            .expect("restore");
        assert!(restored.verified);
        assert_eq!(restored.block_hash, expected);
        qemu_img_compare(&img.path, &out);
        // A new file reads as zeroes: zero chunks and zero blocks are not written.
        assert_allocated_about(&out, img.nonzero_block_bytes);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_backup_and_sparse_restore_local() {
    full_backup_and_sparse_restore(Backend::local().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_backup_and_sparse_restore_s3() {
    full_backup_and_sparse_restore(Backend::s3().await).await;
}

/// Overwrites 4 KiB at the start of each chunk in `chunks` with new random bytes.
fn change_chunks(path: &Path, chunks: &[u64], seed: u8) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    for (n, c) in chunks.iter().enumerate() {
        let data: Vec<u8> = (0..4096u32)
            .map(|i| (i as u8) ^ seed ^ (n as u8).wrapping_mul(31) ^ 0x5a)
            .collect();
        file.write_all_at(&data, c * u64::from(CHUNK)).unwrap();
    }
}

async fn second_backup_uploads_only_changed_chunks(backend: Backend) {
    let repo = backend.init(None).await;
    let scratch = scratch_dir();
    // 400 chunks of random data; 1% of them change.
    let img = images::make(
        &scratch.path().join("disk.img"),
        Pattern::Random,
        400 * u64::from(CHUNK),
        3,
    )
    .unwrap();
    let first = back_up_file(&repo, &img.path).await;
    assert_eq!(first.manifest.chunks_new, 400);
    let (before, heads_before) = (backend.puts(), backend.heads());

    change_chunks(&img.path, &[5, 150, 151, 399], 1);
    let second = back_up_file(&repo, &img.path).await;
    assert_eq!(
        backend.puts() - before,
        4,
        "only the changed chunks are uploaded"
    );
    assert_eq!(
        backend.heads() - heads_before,
        4,
        "only the changed chunks are looked up: the parent's are taken from its index"
    );
    assert_eq!(second.manifest.chunks_new, 4);
    assert_eq!(second.manifest.chunks_reused, 396);
    assert_eq!(
        second.chunks_unchanged, 396,
        "the unchanged chunks are told by their change digests"
    );
    assert_eq!(second.manifest.parent.as_ref(), Some(&first.manifest.id));
    assert!(second.full_reason.is_none());
    assert_eq!(second.manifest.block_hash, Some(blkhash_file(&img.path)));

    let out = scratch.path().join("second.img");
    restore_to(
        &repo,
        &second.manifest.id,
        &out,
        img.size,
        RestoreOrder::Auto,
    )
    .await
    .unwrap();
    qemu_img_compare(&img.path, &out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_backup_uploads_only_changed_chunks_local() {
    second_backup_uploads_only_changed_chunks(Backend::local().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_backup_uploads_only_changed_chunks_s3() {
    second_backup_uploads_only_changed_chunks(Backend::s3().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_backup_is_not_listed_and_a_rerun_uploads_the_rest() {
    let backend = Backend::local().await;
    let repo = backend.init(None).await;
    let scratch = scratch_dir();
    let img = images::make(
        &scratch.path().join("disk.img"),
        Pattern::Random,
        64 * u64::from(CHUNK),
        9,
    )
    .unwrap();
    let inner = copying::source(&url(&img.path)).await.unwrap();
    let (failing, _) = CountingSource::failing_from(inner, Some(40 * u64::from(CHUNK)));
    let failing: Arc<dyn Source> = failing;
    let options = BackupOptions::new("disk").with_workers(1);
    let err = back_up(&repo, failing, &options).await.unwrap_err();
    assert!(err.to_string().contains("injected read failure"), "{err}");
    assert!(
        repo.list_snapshots().await.unwrap().is_empty(),
        "a failed backup is not listed"
    );
    let stored = backend.puts();
    assert_eq!(stored, 40);

    let source = copying::source(&url(&img.path)).await.unwrap();
    let report = back_up(&repo, source, &options).await.unwrap();
    assert_eq!(
        backend.puts() - stored,
        24,
        "the rerun uploads only what the first run did not"
    );
    assert_eq!(report.manifest.chunks_new, 24);
    assert_eq!(report.manifest.chunks_reused, 40);
    assert_eq!(
        repo.list_snapshots().await.unwrap(),
        vec![report.manifest.id.clone()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_round_trip_and_wrong_or_missing_key() {
    let backend = Backend::s3().await;
    let repo = backend.init(Some("correct horse battery staple")).await;
    let scratch = scratch_dir();
    let img = images::make(
        &scratch.path().join("disk.img"),
        Pattern::HalfData,
        8 * 1024 * 1024,
        5,
    )
    .unwrap();
    let report = back_up_file(&repo, &img.path).await;
    let store: Arc<dyn ObjectStore> = backend.store.clone();

    let reopened = Repository::open(
        Arc::clone(&store),
        Some(&Secret::new("correct horse battery staple")),
    )
    .await
    .unwrap();
    let out = scratch.path().join("back.img");
    restore_to(
        &reopened,
        &report.manifest.id,
        &out,
        img.size,
        RestoreOrder::Auto,
    )
    .await
    .unwrap();
    qemu_img_compare(&img.path, &out);
    // The block digests are encrypted too: the plaintext digests appear nowhere.
    let stored = std::fs::read(
        backend
            .files
            .join(ferry_image_backup::blocks::object_name(&report.manifest.id)),
    )
    .unwrap();
    assert!(!stored.windows(8).any(|w| w == b"FRYBDIG2"));

    let wrong = Repository::open(Arc::clone(&store), Some(&Secret::new("wrong")))
        .await
        .unwrap_err();
    assert!(!wrong.to_string().contains("correct horse"), "{wrong}");
    let none = Repository::open(store, None).await.unwrap_err();
    assert_eq!(none.kind(), ErrorKind::PermissionDenied, "{none}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_refuses_a_target_smaller_than_the_image() {
    let backend = Backend::local().await;
    let repo = backend.init(None).await;
    let scratch = scratch_dir();
    let img = images::make(
        &scratch.path().join("disk.img"),
        Pattern::HalfData,
        4 * 1024 * 1024,
        1,
    )
    .unwrap();
    let report = back_up_file(&repo, &img.path).await;
    let small = ferry_testkit::RecordingTarget::new(img.size - 512);
    let err = restore(
        &repo,
        &report.manifest.id,
        Arc::new(small.clone()),
        &RestoreOptions::new(),
        &Progress::new(),
        &CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("less than the"), "{err}");
    assert!(
        small.ops().is_empty(),
        "nothing may be written before the size check"
    );
}

/// Backs a random image of `chunks` chunks up into a directory repository, lets `damage`
/// do its worst to the stored file of chunk `which`, and requires a restore in each of
/// `orders` to fail with `kind`, naming the chunk and the backup.
async fn restore_fails_on_a_damaged_chunk(
    chunks: u64,
    which: usize,
    damage: impl Fn(&Path),
    kind: ErrorKind,
    orders: &[RestoreOrder],
) {
    let backend = Backend::local().await;
    let repo = backend.init(None).await;
    let scratch = scratch_dir();
    let img = images::make(
        &scratch.path().join("disk.img"),
        Pattern::Random,
        chunks * u64::from(CHUNK),
        2,
    )
    .unwrap();
    let report = back_up_file(&repo, &img.path).await;
    let index = repo.load_index(&report.manifest).await.unwrap();
    let digest = index.digest(which).unwrap();
    damage(&backend.files.join(digest.chunk_name()));
    for &order in orders {
        let out = scratch.path().join(format!("back-{order:?}.img"));
        let err = restore_to(&repo, &report.manifest.id, &out, img.size, order)
            .await
            .unwrap_err();
        let text = err.to_string();
        assert_eq!(err.kind(), kind, "{order:?}: {text}");
        assert!(
            text.contains(&digest.to_string()),
            "names the chunk: {text}"
        );
        assert!(
            text.contains(report.manifest.id.as_str()),
            "names the backup: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_chunk_is_detected_at_restore_naming_chunk_and_backup() {
    let flip = |file: &Path| {
        let mut bytes = std::fs::read(file).unwrap();
        let at = bytes.len() - 10;
        bytes[at] ^= 0x40;
        std::fs::write(file, bytes).unwrap();
    };
    restore_fails_on_a_damaged_chunk(8, 3, flip, ErrorKind::Corrupt, &[RestoreOrder::Auto]).await;
}

/// A chunk missing from the store fails the restore in either order (the fetch stage's
/// error reaches the caller; nothing waits forever), naming the chunk and the backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_chunk_fails_the_restore_in_either_order() {
    let remove = |file: &Path| std::fs::remove_file(file).unwrap();
    restore_fails_on_a_damaged_chunk(
        40,
        5,
        remove,
        ErrorKind::NotFound,
        &[RestoreOrder::InOrder, RestoreOrder::OutOfOrder],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parent_auto_follows_the_source_and_a_misfit_parent_means_full() {
    let backend = Backend::local().await;
    let repo = backend.init(None).await;
    let scratch = scratch_dir();
    let a = images::make(
        &scratch.path().join("a.img"),
        Pattern::Random,
        8 * u64::from(CHUNK),
        1,
    )
    .unwrap();
    let first = back_up_file(&repo, &a.path).await;
    // The same source grown: the parent does not fit.
    let b = images::make(&a.path, Pattern::Random, 9 * u64::from(CHUNK), 1).unwrap();
    let second = back_up_file(&repo, &b.path).await;
    assert!(second.manifest.parent.is_none());
    let reason = second.full_reason.unwrap();
    assert!(
        reason.contains(first.manifest.id.as_str()) && reason.contains("bytes"),
        "{reason}"
    );
    // An explicit parent that does not exist is an error, not a silent full backup.
    let source = copying::source(&url(&b.path)).await.unwrap();
    let missing: BackupId = "20200101T000000Z-00000000".parse().unwrap();
    let err = back_up(
        &repo,
        source,
        &BackupOptions::new("x").with_parent(ParentChoice::Id(missing)),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
}
