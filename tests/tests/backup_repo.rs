//! The backup repository on real storage: a directory (LocalStore) and an in-process S3
//! server (s3s + s3s-fs, SigV4 checked). Every test body runs on both backends; only the
//! constructor differs. Damage is done to the stored files themselves (a bit flip, a
//! truncation), as a failing disk would. The tests that go through the store alone also
//! run on a second S3 implementation, moto's server, whose objects are not files.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use ferry_backup::{
    BackupId, ChunkFault, ChunkOutcome, Digest, FixedIndex, GcLease, GcOptions, InitOptions,
    KdfParams, Keep, KeepPolicy, LeaseHeld, LocalStore, ObjectStore, Put, PutMode, Repository,
    S3Store, SessionOptions, SnapshotInfo, VerifyOptions, FORMAT_VERSION,
};
use ferry_core::{ErrorKind, Secret};
use ferry_tests::moto_server::MotoServer;
use ferry_tests::s3_server::S3Server;

/// The smallest chunk size, so tests stay small.
const CHUNK: u32 = 64 * 1024;
const BUCKET: &str = "repo";
const PREFIX: &str = "site-a/backups";

/// One storage backend with a way to reach the files behind its objects.
struct Backend {
    store: Arc<dyn ObjectStore>,
    files: Option<PathBuf>,
    _dir: Option<tempfile::TempDir>,
    _server: Option<S3Server>,
    _moto: Option<MotoServer>,
}

impl Backend {
    async fn local() -> Self {
        let dir = ferry_tests::scratch_dir();
        let root = dir.path().join("repo");
        Self {
            store: Arc::new(LocalStore::new(&root)),
            files: Some(root),
            _dir: Some(dir),
            _server: None,
            _moto: None,
        }
    }

    async fn s3() -> Self {
        let server = S3Server::start().await;
        server.create_bucket(BUCKET);
        let store = S3Store::connect(BUCKET, PREFIX, &server.options()).await;
        Self {
            store: Arc::new(store),
            files: Some(server.object_path(BUCKET, PREFIX)),
            _dir: None,
            _server: Some(server),
            _moto: None,
        }
    }

    async fn moto() -> Self {
        let server = MotoServer::start();
        server.create_bucket(BUCKET);
        let store = S3Store::connect(BUCKET, PREFIX, &server.options()).await;
        Self {
            store: Arc::new(store),
            files: None,
            _dir: None,
            _server: None,
            _moto: Some(server),
        }
    }

    /// The directory holding the stored objects as files.
    fn files(&self) -> &std::path::Path {
        self.files
            .as_deref()
            .expect("this backend's objects are not files: run the test on local and s3 only")
    }

    /// The file holding object `name`.
    fn file(&self, name: &str) -> PathBuf {
        self.files().join(name)
    }

    async fn init(&self, options: InitOptions) -> Repository {
        Repository::init(Arc::clone(&self.store), options.with_chunk_size(CHUNK))
            .await
            .expect("init the repository")
    }

    async fn chunk_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .store
            .list("chunks/")
            .await
            .expect("list chunks")
            .into_iter()
            .map(|m| m.name)
            .collect();
        names.sort();
        names
    }
}

/// One test per backend from one body: for each `async fn name(backend: Backend)`, a
/// module `name` with one test per backend listed in the brackets, each named after its
/// constructor. Tests that damage stored files run on `local` and `s3` only: moto's
/// objects are not files.
macro_rules! backends {
    (@one [$($backend:ident),+] $name:ident) => {
        mod $name {
            $(
                #[tokio::test]
                async fn $backend() {
                    super::$name(super::Backend::$backend().await).await;
                }
            )+
        }
    };
    ($backends:tt: $($name:ident),* $(,)?) => {$(
        backends!(@one $backends $name);
    )*};
}

backends!(
    [local, s3]: round_trip_zstd,
    round_trip_encrypted,
    corrupt_chunk_is_detected,
    truncated_and_oversized_blobs_are_refused,
    verify_names_the_broken_snapshots,
);

backends!(
    [local, s3, moto]: store_semantics,
    round_trip_plain,
    dedup_stores_a_chunk_once,
    zero_chunks_are_markers,
    chunk_names_are_the_sha256_of_their_block_digests,
    wrong_and_missing_keys,
    version_mismatch_is_named,
    init_twice_is_refused,
    gc_removes_only_unreferenced_old_chunks,
    gc_respects_a_running_session,
    second_gc_is_refused,
    stale_lease_is_taken_over,
    crash_before_manifest_leaves_nothing_listed,
    reused_chunk_removed_during_backup_fails_it,
    prune_deletes_what_the_policy_forgets,
    incremental_reuse_by_digest,
    gc_marks_a_running_incremental_parent,
    verify_marks_missing_chunks_for_the_next_incremental,
);

/// Deterministic incompressible chunk contents: `seed` picks the sequence.
fn chunk(seed: u8, len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(seed).wrapping_mul(0x0100_0000_01b3);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// A compressible chunk.
fn text_chunk(seed: u8) -> Vec<u8> {
    format!("chunk {seed} ")
        .repeat(CHUNK as usize / 8)
        .as_bytes()[..CHUNK as usize]
        .to_vec()
}

/// Backs up `chunks` (the last may be short) as one image; returns the manifest's id.
async fn backup(repo: &Repository, source: &str, chunks: &[Vec<u8>]) -> (BackupId, FixedIndex) {
    let size: u64 = chunks.iter().map(|c| c.len() as u64).sum();
    let session = repo
        .begin_session(SessionOptions::new())
        .await
        .expect("begin");
    let mut index = FixedIndex::new(size, repo.chunk_size()).expect("index");
    for (i, data) in chunks.iter().enumerate() {
        let put = session.put_chunk(data).await.expect("put chunk");
        index.set(i, put.digest).unwrap();
    }
    let manifest = session
        .finish(&index, SnapshotInfo::new(source).with_tag("test", "yes"))
        .await
        .expect("finish");
    (manifest.id, index)
}

/// Restores a backup into memory through the public API only.
async fn restore(repo: &Repository, id: &BackupId) -> Vec<u8> {
    let manifest = repo.load_manifest(id).await.expect("manifest");
    let index = repo.load_index(&manifest).await.expect("index");
    let mut out = Vec::new();
    for (i, digest) in index.digests().iter().enumerate() {
        let (_, len) = index.chunk_range(i);
        if digest.is_zero() {
            out.resize(out.len() + len as usize, 0);
        } else {
            let data = repo.get_chunk(digest).await.expect("chunk");
            assert_eq!(data.len() as u64, len, "chunk {i} length");
            out.extend_from_slice(&data);
        }
    }
    out
}

fn flip_bit(path: &std::path::Path, at_from_end: usize) {
    let mut data = std::fs::read(path).expect("read the stored file");
    let at = data.len() - at_from_end;
    data[at] ^= 0x10;
    std::fs::write(path, data).expect("write the damaged file");
}

async fn store_semantics(b: Backend) {
    let s = &b.store;
    assert_eq!(s.get("config", 100).await.unwrap(), None);
    assert_eq!(s.head("config").await.unwrap(), None);
    assert_eq!(
        s.put("a/b/one", Bytes::from_static(b"1111"), PutMode::Overwrite)
            .await
            .unwrap(),
        Put::Written
    );
    assert_eq!(
        s.put("a/b/one", Bytes::from_static(b"2"), PutMode::CreateOnly)
            .await
            .unwrap(),
        Put::Conflict
    );
    assert_eq!(
        s.get("a/b/one", 100).await.unwrap().as_deref(),
        Some(&b"1111"[..])
    );
    let err = s.get("a/b/one", 3).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    // A reused buffer's old content is replaced, not appended to.
    let stale = b"stale content, longer than the object".to_vec();
    assert_eq!(
        s.get_into("a/b/one", 100, stale).await.unwrap().as_deref(),
        Some(&b"1111"[..])
    );
    assert_eq!(s.get_into("a/none", 100, vec![1; 8]).await.unwrap(), None);
    let err = s.get_into("a/b/one", 3, Vec::new()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert_eq!(
        s.put("a/two", Bytes::from_static(b"22"), PutMode::CreateOnly)
            .await
            .unwrap(),
        Put::Written
    );
    let meta = s.head("a/two").await.unwrap().expect("head");
    assert_eq!(meta.size, 2);

    let mut names: Vec<String> = s
        .list("a/")
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    names.sort();
    assert_eq!(names, ["a/b/one", "a/two"]);

    // Replace-if-unchanged: the version read wins once, a stale version never.
    let (_, v1) = s.get_versioned("a/two", 100).await.unwrap().unwrap();
    assert_eq!(
        s.put(
            "a/two",
            Bytes::from_static(b"33"),
            PutMode::ReplaceIf(v1.clone())
        )
        .await
        .unwrap(),
        Put::Written
    );
    assert_eq!(
        s.put(
            "a/two",
            Bytes::from_static(b"44"),
            PutMode::ReplaceIf(v1.clone())
        )
        .await
        .unwrap(),
        Put::Conflict
    );
    assert_eq!(
        s.get("a/two", 100).await.unwrap().as_deref(),
        Some(&b"33"[..])
    );
    assert_eq!(
        s.put("gone", Bytes::from_static(b"1"), PutMode::ReplaceIf(v1))
            .await
            .unwrap(),
        Put::Conflict
    );
    assert_eq!(s.head("gone").await.unwrap(), None);

    // Touch renews the time and keeps the content.
    let before = s.head("a/b/one").await.unwrap().unwrap().modified;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    s.touch("a/b/one").await.unwrap();
    let after = s.head("a/b/one").await.unwrap().unwrap().modified;
    assert!(after > before, "{before:?} -> {after:?}");
    assert_eq!(
        s.get("a/b/one", 100).await.unwrap().as_deref(),
        Some(&b"1111"[..])
    );
    assert_eq!(
        s.touch("nothing").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );

    s.delete("a/b/one").await.unwrap();
    s.delete("a/b/one").await.unwrap();
    assert_eq!(s.head("a/b/one").await.unwrap(), None);
    assert!(s
        .put("../escape", Bytes::new(), PutMode::Overwrite)
        .await
        .is_err());
}

async fn round_trip(b: &Backend, options: InitOptions, passphrase: Option<Secret>) {
    let repo = b.init(options).await;
    let chunks = vec![
        text_chunk(1),
        chunk(2, CHUNK as usize),
        vec![0; CHUNK as usize],
        chunk(3, 1000),
    ];
    let (id, _) = backup(&repo, "nbd://host/vm1", &chunks).await;
    let reopened = Repository::open(Arc::clone(&b.store), passphrase.as_ref())
        .await
        .expect("reopen");
    assert_eq!(reopened.list_snapshots().await.unwrap(), vec![id.clone()]);
    assert_eq!(restore(&reopened, &id).await, chunks.concat());
    let m = reopened.load_manifest(&id).await.unwrap();
    assert_eq!(m.image_size, 3 * u64::from(CHUNK) + 1000);
    assert_eq!((m.chunks_new, m.chunks_reused, m.chunks_zero), (3, 0, 1));
    assert_eq!(
        (m.bytes_new, m.bytes_zero),
        (2 * u64::from(CHUNK) + 1000, u64::from(CHUNK))
    );
    assert_eq!(m.source, "nbd://host/vm1");
    assert_eq!(m.tags.get("test").map(String::as_str), Some("yes"));
    assert_eq!(b.chunk_names().await.len(), 3);
}

async fn round_trip_plain(b: Backend) {
    round_trip(&b, InitOptions::new().with_zstd_level(None), None).await;
}

async fn round_trip_zstd(b: Backend) {
    round_trip(&b, InitOptions::new().with_zstd_level(Some(3)), None).await;
    // The compressible chunk is stored compressed: no chunk file is as large as a full
    // chunk plus header except the incompressible one.
    let mut small = 0;
    for entry in walk(&b.files().join("chunks")) {
        if std::fs::metadata(&entry).unwrap().len() < u64::from(CHUNK) / 4 {
            small += 1;
        }
    }
    assert!(small >= 1, "no chunk was stored compressed");
}

async fn round_trip_encrypted(b: Backend) {
    let pass = Secret::new("correct horse battery staple");
    round_trip(
        &b,
        InitOptions::new()
            .with_passphrase(pass.clone())
            .with_kdf(KdfParams::insecure_fast()),
        Some(pass),
    )
    .await;
    // Nothing stored reveals the content or the source.
    let stored = walk(b.files());
    assert!(stored.len() >= 5, "too few objects: {stored:?}");
    for path in stored {
        let data = std::fs::read(&path).unwrap();
        assert!(
            !contains(&data, b"chunk 1 chunk 1"),
            "{} holds plaintext",
            path.display()
        );
        assert!(
            !contains(&data, b"nbd://host/vm1"),
            "{} names the source",
            path.display()
        );
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else if !entry.file_name().to_string_lossy().starts_with('.') {
            out.push(path);
        }
    }
    out
}

async fn dedup_stores_a_chunk_once(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    let a = chunk(7, CHUNK as usize);
    let (first, _) = backup(&repo, "vm", &[a.clone(), a.clone(), chunk(8, 10)]).await;
    assert_eq!(b.chunk_names().await.len(), 2);
    let m = repo.load_manifest(&first).await.unwrap();
    assert_eq!((m.chunks_new, m.chunks_reused), (2, 1));
    let (second, _) = backup(&repo, "vm", &[a.clone(), chunk(8, 10)]).await;
    let m = repo.load_manifest(&second).await.unwrap();
    assert_eq!((m.chunks_new, m.chunks_reused, m.bytes_new), (0, 2, 0));
    assert_eq!(b.chunk_names().await.len(), 2);
    assert_eq!(restore(&repo, &second).await, [a, chunk(8, 10)].concat());
}

/// The documented naming, computed here from nothing but SHA-256: what another tool reading
/// the repository would do.
async fn chunk_names_are_the_sha256_of_their_block_digests(b: Backend) {
    use sha2::{Digest as _, Sha256};
    let repo = Repository::init(
        Arc::clone(&b.store),
        InitOptions::new().with_chunk_size(4 * CHUNK),
    )
    .await
    .unwrap();
    let mut partly_zero = chunk(3, 4 * CHUNK as usize);
    partly_zero[CHUNK as usize..3 * CHUNK as usize].fill(0);
    let chunks = [
        chunk(1, 4 * CHUNK as usize),
        partly_zero,
        chunk(2, 2 * CHUNK as usize + 7),
    ];
    let (id, index) = backup(&repo, "vm", &chunks).await;
    for (data, digest) in chunks.iter().zip(index.digests()) {
        let mut outer = Sha256::new();
        for block in data.chunks(CHUNK as usize) {
            outer.update(Sha256::digest(block));
        }
        assert_eq!(digest.0, <[u8; 32]>::from(outer.finalize()));
        assert_eq!(repo.get_chunk(digest).await.unwrap(), *data);
    }
    assert_eq!(b.chunk_names().await.len(), 3);
    assert_eq!(restore(&repo, &id).await, chunks.concat());
}

async fn zero_chunks_are_markers(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    let (id, index) = backup(&repo, "vm", &[vec![0; CHUNK as usize], vec![0; 5]]).await;
    assert!(index.digests().iter().all(Digest::is_zero));
    assert!(b.chunk_names().await.is_empty());
    assert_eq!(repo.chunk_digest(&[0; 100]), Digest::ZERO);
    assert_eq!(restore(&repo, &id).await, vec![0; CHUNK as usize + 5]);
    let err = repo.get_chunk(&Digest::ZERO).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

async fn wrong_and_missing_keys(b: Backend) {
    b.init(
        InitOptions::new()
            .with_passphrase(Secret::new("right"))
            .with_kdf(KdfParams::insecure_fast()),
    )
    .await;
    let err = Repository::open(Arc::clone(&b.store), Some(&Secret::new("wrong")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    assert!(err.to_string().contains("wrong passphrase"), "{err}");
    assert!(!err.to_string().contains("right"), "{err}");
    let err = Repository::open(Arc::clone(&b.store), None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied);
    assert!(
        err.to_string().contains("encrypted") && err.to_string().contains("passphrase"),
        "{err}"
    );
    let repo = Repository::open(Arc::clone(&b.store), Some(&Secret::new("right")))
        .await
        .unwrap();
    assert!(repo.is_encrypted());
    // Encrypted digests are keyed: not the SHA-256 anyone could compute.
    let data = chunk(1, 100);
    let other = ferry_tests::scratch_dir();
    let plain = Repository::init(Arc::new(LocalStore::new(other.path())), InitOptions::new())
        .await
        .unwrap();
    assert_ne!(repo.chunk_digest(&data), plain.chunk_digest(&data));
}

async fn corrupt_chunk_is_detected(b: Backend) {
    let repo = b.init(InitOptions::new().with_zstd_level(None)).await;
    let data = chunk(5, CHUNK as usize);
    backup(&repo, "vm", std::slice::from_ref(&data)).await;
    let digest = repo.chunk_digest(&data);
    flip_bit(&b.file(&digest.chunk_name()), 100);
    let err = repo.get_chunk(&digest).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
}

async fn truncated_and_oversized_blobs_are_refused(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    let data = chunk(6, CHUNK as usize);
    backup(&repo, "vm", std::slice::from_ref(&data)).await;
    let digest = repo.chunk_digest(&data);
    let path = b.file(&digest.chunk_name());
    let stored = std::fs::read(&path).unwrap();
    std::fs::write(&path, &stored[..stored.len() / 2]).unwrap();
    let err = repo.get_chunk(&digest).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");

    let other = repo.chunk_digest(&chunk(9, 10));
    b.store
        .put(
            &other.chunk_name(),
            Bytes::from(vec![1u8; CHUNK as usize * 3]),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    let err = repo.get_chunk(&other).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("more than"), "{err}");
}

async fn version_mismatch_is_named(b: Backend) {
    b.init(InitOptions::new()).await;
    let config = b.store.get("config", 1 << 16).await.unwrap().unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&config).unwrap();
    json["format_version"] = serde_json::json!(7);
    b.store
        .put(
            "config",
            Bytes::from(serde_json::to_vec(&json).unwrap()),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    let err = Repository::open(Arc::clone(&b.store), None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    let text = err.to_string();
    assert!(
        text.contains("version 7") && text.contains(&format!("version {FORMAT_VERSION}")),
        "{text}"
    );
}

async fn init_twice_is_refused(b: Backend) {
    b.init(InitOptions::new()).await;
    let err = Repository::init(Arc::clone(&b.store), InitOptions::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("already holds a repository"),
        "{err}"
    );
    let err = Repository::open(Arc::new(LocalStore::new("/nonexistent/ferry-repo")), None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

/// Leaves `chunks` stored but referenced by nothing (a backup abandoned before its index).
async fn orphan_chunks(repo: &Repository, chunks: &[Vec<u8>]) {
    let session = repo.begin_session(SessionOptions::new()).await.unwrap();
    for c in chunks {
        session.put_chunk(c).await.unwrap();
    }
    session.abandon().await;
}

fn grace0() -> GcOptions {
    GcOptions::new().with_grace(Duration::ZERO)
}

async fn gc_removes_only_unreferenced_old_chunks(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    let kept = [chunk(1, CHUNK as usize), chunk(2, 100)];
    let (id, _) = backup(&repo, "vm", &kept).await;
    orphan_chunks(&repo, &[chunk(3, CHUNK as usize)]).await;
    assert_eq!(b.chunk_names().await.len(), 3);

    // The default grace period keeps the young orphan.
    let report = repo.gc(&GcOptions::new()).await.unwrap();
    assert_eq!(
        (
            report.chunks_removed,
            report.chunks_recent,
            report.chunks_referenced
        ),
        (0, 1, 2)
    );
    assert_eq!(b.chunk_names().await.len(), 3);

    // Without grace (and once its second is over), only the orphan goes.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = repo.gc(&grace0()).await.unwrap();
    assert_eq!(
        (report.chunks_removed, report.chunks_referenced),
        (1, 2),
        "{report:?}"
    );
    assert!(report.bytes_removed > 0);
    assert_eq!(b.chunk_names().await.len(), 2);
    assert_eq!(restore(&repo, &id).await, kept.concat());
    assert!(
        b.store.head("locks/gc").await.unwrap().is_none(),
        "the lease is released"
    );
    assert!(b.store.head("locks/gc-last").await.unwrap().is_some());
}

async fn gc_respects_a_running_session(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    let old = chunk(1, CHUNK as usize);
    orphan_chunks(&repo, std::slice::from_ref(&old)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // A backup is running: it reuses the old orphan and stores a new chunk, and has
    // written no index yet.
    let session = repo
        .begin_session(SessionOptions::new().with_touch_older_than(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        session.put_chunk(&old).await.unwrap().outcome,
        ChunkOutcome::Reused
    );
    let new = chunk(2, CHUNK as usize);
    assert_eq!(
        session.put_chunk(&new).await.unwrap().outcome,
        ChunkOutcome::New
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let report = repo.gc(&grace0()).await.unwrap();
    assert_eq!(report.running_sessions, 1);
    assert_eq!(report.chunks_removed, 0, "{report:?}");
    assert_eq!(b.chunk_names().await.len(), 2);

    let mut index = FixedIndex::new(2 * u64::from(CHUNK), CHUNK).unwrap();
    index.set(0, repo.chunk_digest(&old)).unwrap();
    index.set(1, repo.chunk_digest(&new)).unwrap();
    let manifest = session
        .finish(&index, SnapshotInfo::new("vm"))
        .await
        .unwrap();
    assert_eq!(restore(&repo, &manifest.id).await, [old, new].concat());

    // Without the session, the same GC removes chunks nothing references.
    orphan_chunks(&repo, &[chunk(3, 10)]).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(repo.gc(&grace0()).await.unwrap().chunks_removed, 1);
}

async fn second_gc_is_refused(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    let lease = GcLease::acquire(Arc::clone(&b.store), "first gc", Duration::from_secs(60))
        .await
        .unwrap();
    let err = repo
        .gc(&GcOptions::new().with_holder("second gc"))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("another garbage collection"),
        "{err}"
    );
    assert!(err.to_string().contains("first gc"), "{err}");
    let held = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<LeaseHeld>())
        .expect("a LeaseHeld source");
    assert_eq!(held.holder, "first gc");
    lease.release().await.unwrap();
    repo.gc(&GcOptions::new())
        .await
        .expect("the GC runs once the lease is released");
}

async fn stale_lease_is_taken_over(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    // A GC that dies: its lease is never renewed nor released.
    let lease = GcLease::acquire(Arc::clone(&b.store), "crashed gc", Duration::from_secs(1))
        .await
        .unwrap();
    drop(lease);
    assert!(
        repo.gc(&GcOptions::new()).await.is_err(),
        "the lease is still valid"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    repo.gc(&GcOptions::new().with_holder("rescuer"))
        .await
        .expect("a stale lease is taken over");
    assert!(b.store.head("locks/gc").await.unwrap().is_none());
}

async fn crash_before_manifest_leaves_nothing_listed(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    let session = repo
        .begin_session(
            SessionOptions::new()
                .with_heartbeat(Duration::from_millis(200), Duration::from_secs(1)),
        )
        .await
        .unwrap();
    session.put_chunk(&chunk(1, CHUNK as usize)).await.unwrap();
    session.put_chunk(&chunk(2, CHUNK as usize)).await.unwrap();
    drop(session);
    assert!(repo.list_snapshots().await.unwrap().is_empty());
    // Once the crashed session's record is stale, a GC frees its chunks.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let report = repo.gc(&grace0()).await.unwrap();
    assert_eq!(report.chunks_removed, 2, "{report:?}");
    assert!(b.chunk_names().await.is_empty());
}

async fn reused_chunk_removed_during_backup_fails_it(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    let shared = chunk(1, CHUNK as usize);
    let (first, _) = backup(&repo, "vm", std::slice::from_ref(&shared)).await;
    repo.delete_snapshot(&first).await.unwrap();

    let session = repo.begin_session(SessionOptions::new()).await.unwrap();
    assert_eq!(
        session.put_chunk(&shared).await.unwrap().outcome,
        ChunkOutcome::Reused
    );
    // A GC that listed the chunk before this session existed removes it now.
    b.store
        .delete(&repo.chunk_digest(&shared).chunk_name())
        .await
        .unwrap();
    repo.gc(&grace0()).await.unwrap();

    let mut index = FixedIndex::new(u64::from(CHUNK), CHUNK).unwrap();
    index.set(0, repo.chunk_digest(&shared)).unwrap();
    let err = session
        .finish(&index, SnapshotInfo::new("vm"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(
        err.to_string().contains("removed by a garbage collection"),
        "{err}"
    );
    assert!(repo.list_snapshots().await.unwrap().is_empty());
    assert!(
        b.store.list("indexes/").await.unwrap().is_empty(),
        "the failed backup's index is removed"
    );
}

/// Chunks an incremental session takes from its parent's index are protected by the
/// parent: a GC marks it, and holds back when the parent is pruned during the backup.
async fn gc_marks_a_running_incremental_parent(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    let (a, gone) = (chunk(1, CHUNK as usize), chunk(2, CHUNK as usize));
    let (parent, parent_index) = backup(&repo, "vm", &[a.clone(), gone.clone()]).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let session = repo
        .begin_incremental_session(
            SessionOptions::new().with_touch_older_than(Duration::ZERO),
            &parent,
            &parent_index,
        )
        .await
        .unwrap();
    assert!(session
        .reuse_chunk(&parent_index.digests()[0])
        .await
        .unwrap());
    let changed = chunk(3, CHUNK as usize);
    assert_eq!(
        session.put_chunk(&changed).await.unwrap().outcome,
        ChunkOutcome::New
    );
    // The parent is pruned while the backup runs; the chunk reused from it was never
    // touched, and is older than the GC's cutoff.
    repo.delete_snapshot(&parent).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = repo.gc(&grace0()).await.unwrap();
    assert_eq!(report.sessions_without_parent, 1, "{report:?}");
    assert_eq!(report.chunks_removed, 0, "{report:?}");
    assert_eq!(b.chunk_names().await.len(), 3);

    let mut index = FixedIndex::new(2 * u64::from(CHUNK), CHUNK).unwrap();
    index.set(0, parent_index.digests()[0]).unwrap();
    index.set(1, repo.chunk_digest(&changed)).unwrap();
    let manifest = session
        .finish(&index, SnapshotInfo::new("vm").with_parent(parent))
        .await
        .unwrap();
    assert_eq!((manifest.chunks_new, manifest.chunks_reused), (1, 1));
    assert_eq!(restore(&repo, &manifest.id).await, [a, changed].concat());

    // With the backup finished, its parent's other chunk is garbage.
    let report = repo.gc(&grace0()).await.unwrap();
    assert_eq!(
        (report.sessions_without_parent, report.chunks_removed),
        (0, 1),
        "{report:?}"
    );
    assert!(!repo.has_chunk(&repo.chunk_digest(&gone)).await.unwrap());
    assert!(repo.verify(&VerifyOptions::new()).await.unwrap().is_ok());
}

/// An incremental trusts its parent's index, except for chunks a verify found missing:
/// those it stores again, which repairs the parent too.
async fn verify_marks_missing_chunks_for_the_next_incremental(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    let chunks = [chunk(1, CHUNK as usize), chunk(2, CHUNK as usize)];
    let (parent, parent_index) = backup(&repo, "vm", &chunks).await;
    let lost = parent_index.digests()[0];
    b.store.delete(&lost.chunk_name()).await.unwrap();

    let report = repo.verify(&VerifyOptions::new()).await.unwrap();
    assert_eq!(report.problems.len(), 1, "{report:?}");
    assert_eq!(report.problems[0].fault, ChunkFault::Missing);
    assert_eq!(report.broken_snapshots, vec![parent.clone()]);
    assert!(b.store.head(&lost.bad_name()).await.unwrap().is_some());

    let session = repo
        .begin_incremental_session(SessionOptions::new(), &parent, &parent_index)
        .await
        .unwrap();
    assert!(!session.reuse_chunk(&lost).await.unwrap(), "not trusted");
    assert!(session
        .reuse_chunk(&parent_index.digests()[1])
        .await
        .unwrap());
    assert_eq!(
        session.put_chunk(&chunks[0]).await.unwrap().outcome,
        ChunkOutcome::New
    );
    let manifest = session
        .finish(
            &parent_index,
            SnapshotInfo::new("vm").with_parent(parent.clone()),
        )
        .await
        .unwrap();
    assert!(b.store.head(&lost.bad_name()).await.unwrap().is_none());
    assert_eq!(restore(&repo, &manifest.id).await, chunks.concat());
    assert_eq!(restore(&repo, &parent).await, chunks.concat());
    assert!(repo.verify(&VerifyOptions::new()).await.unwrap().is_ok());
}

async fn verify_names_the_broken_snapshots(b: Backend) {
    let repo = b.init(InitOptions::new().with_zstd_level(None)).await;
    let shared = chunk(1, CHUNK as usize);
    let (one, _) = backup(&repo, "vm", &[shared.clone(), chunk(2, 10)]).await;
    let (two, _) = backup(&repo, "vm", std::slice::from_ref(&shared)).await;
    let (three, _) = backup(&repo, "other", &[chunk(3, 10)]).await;
    let report = repo.verify(&VerifyOptions::new()).await.unwrap();
    assert!(report.is_ok(), "{report:?}");
    assert_eq!((report.snapshots_checked, report.chunks_checked), (3, 3));

    let digest = repo.chunk_digest(&shared);
    flip_bit(&b.file(&digest.chunk_name()), 7);
    let report = repo.verify(&VerifyOptions::new()).await.unwrap();
    assert_eq!(report.problems.len(), 1, "{report:?}");
    let problem = &report.problems[0];
    assert_eq!(problem.digest, digest);
    assert!(matches!(problem.fault, ChunkFault::Damaged(_)));
    let mut expect = vec![one.clone(), two.clone()];
    expect.sort();
    assert_eq!(report.broken_snapshots, expect);
    assert!(!report.broken_snapshots.contains(&three));
    assert!(b.store.head(&digest.bad_name()).await.unwrap().is_some());

    // Only the given snapshot's chunks are read.
    let only = repo
        .verify(&VerifyOptions::new().with_snapshots(vec![three.clone()]))
        .await
        .unwrap();
    assert!(only.is_ok() && only.chunks_checked == 1, "{only:?}");

    // The next backup stores the damaged chunk again instead of deduplicating.
    assert!(!repo.has_chunk(&digest).await.unwrap());
    let session = repo.begin_session(SessionOptions::new()).await.unwrap();
    assert_eq!(
        session.put_chunk(&shared).await.unwrap().outcome,
        ChunkOutcome::New
    );
    session.abandon().await;
    assert!(b.store.head(&digest.bad_name()).await.unwrap().is_none());
    assert!(repo.verify(&VerifyOptions::new()).await.unwrap().is_ok());
    assert_eq!(restore(&repo, &one).await, [shared, chunk(2, 10)].concat());
}

async fn prune_deletes_what_the_policy_forgets(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    let mut ids = Vec::new();
    for seed in 0..3 {
        ids.push(backup(&repo, "vm", &[chunk(seed, 100)]).await.0);
    }
    ids.push(backup(&repo, "db", &[chunk(9, 100)]).await.0);
    let policy = KeepPolicy::new().with_last(Keep::Count(1));

    let dry = repo.prune(&policy, Utc::now(), true).await.unwrap();
    assert_eq!(dry.plan.forgotten().count(), 2);
    assert!(dry.deleted.is_empty());
    assert_eq!(repo.list_snapshots().await.unwrap().len(), 4);

    let done = repo.prune(&policy, Utc::now(), false).await.unwrap();
    assert_eq!(done.deleted.len(), 2);
    let left = repo.list_snapshots().await.unwrap();
    assert_eq!(left.len(), 2);
    for id in &done.deleted {
        assert!(b
            .store
            .head(&format!("indexes/{id}"))
            .await
            .unwrap()
            .is_none());
        assert!(!left.contains(id));
    }
    let err = repo
        .prune(&KeepPolicy::new(), Utc::now(), false)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    // The freed chunks go at the next GC.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(repo.gc(&grace0()).await.unwrap().chunks_removed, 2);
}

async fn incremental_reuse_by_digest(b: Backend) {
    let repo = b.init(InitOptions::new()).await;
    let chunks = [chunk(1, CHUNK as usize), chunk(2, CHUNK as usize)];
    let (parent, parent_index) = backup(&repo, "vm", &chunks).await;

    // Chunk 0 is unchanged (reused by digest without reading), chunk 1 changed.
    let session = repo.begin_session(SessionOptions::new()).await.unwrap();
    let mut index = FixedIndex::new(2 * u64::from(CHUNK), CHUNK).unwrap();
    assert!(session
        .reuse_chunk(&parent_index.digests()[0])
        .await
        .unwrap());
    index.set(0, parent_index.digests()[0]).unwrap();
    let changed = chunk(3, CHUNK as usize);
    index
        .set(1, session.put_chunk(&changed).await.unwrap().digest)
        .unwrap();
    assert!(!session
        .reuse_chunk(&repo.chunk_digest(&chunk(4, 10)))
        .await
        .unwrap());
    let manifest = session
        .finish(&index, SnapshotInfo::new("vm").with_parent(parent.clone()))
        .await
        .unwrap();
    assert_eq!(manifest.parent, Some(parent));
    assert_eq!((manifest.chunks_new, manifest.chunks_reused), (1, 1));
    assert_eq!(
        restore(&repo, &manifest.id).await,
        [chunks[0].clone(), changed].concat()
    );

    // An index naming a chunk the session never stored nor reused is refused.
    let session = repo.begin_session(SessionOptions::new()).await.unwrap();
    let err = session
        .finish(&index, SnapshotInfo::new("vm"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
}
