//! Immutable repositories (S3 Object Lock) against moto's S3 server, which enforces
//! Object Lock. What moto 5.2.1 enforces was checked by trying each request with boto3
//! before these tests relied on it:
//!
//! - compliance retention: DeleteObject with a version id, and DeleteObjects naming the
//!   version, are refused (403 AccessDenied) until the retain-until date, with or
//!   without `x-amz-bypass-governance-retention`; afterwards they succeed;
//! - governance retention: refused without the bypass header, destroyed WITH it (moto
//!   checks no IAM policy: any credential may bypass; on AWS only principals granted
//!   `s3:BypassGovernanceRetention` can, so governance mode is as strong as the bucket's
//!   IAM policy);
//! - legal holds: a version under a legal hold cannot be deleted until the hold is off;
//! - DeleteObject without a version id leaves a delete marker; an overwrite adds a version;
//!   the older version stays readable by its id;
//! - NOT enforced by moto: PutObjectRetention is applied without any check, so a
//!   compliance retention can be shortened (or turned into governance) and the version
//!   then deleted. AWS refuses that for compliance mode (and for governance without the
//!   bypass right). These tests therefore do not try that attack against moto: it would
//!   "succeed" against moto and prove nothing about S3. GetObjectRetention answers 500;
//!   HeadObject gives the retention (what ferry uses).
//! - A bucket without Object Lock answers GetObjectLockConfiguration with 404
//!   ObjectLockConfigurationNotFoundError.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_backup::{
    BackupId, FixedIndex, GcOptions, Immutability, InitOptions, Keep, KeepPolicy, LockMode,
    ObjectStore, PutMode, Repository, S3Store, SessionOptions, SnapshotInfo,
};
use ferry_core::ErrorKind;
use ferry_tests::bin::{wait_with_deadline, Run, DEFAULT_DEADLINE};
use ferry_tests::images::{self, Pattern};
use ferry_tests::moto_server::MotoServer;
use ferry_tests::s3_server::S3Server;
use ferry_tests::{ferry, scratch_dir};
use serde_json::Value;

const BUCKET: &str = "vault";
const PREFIX: &str = "site-a";
const CHUNK: u32 = 64 << 10;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn parse(run: &Run) -> Value {
    serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {run}"))
}

async fn run(moto: &MotoServer, scratch: &Path, args: &[&str]) -> Run {
    let mut cmd = ferry!().command(args);
    moto.sdk_env(&mut cmd, scratch);
    cmd.env_remove("FERRY_BACKUP_KEY_FILE").stdin(Stdio::null());
    let description = format!("{cmd:?}");
    let child = cmd.spawn().unwrap();
    tokio::task::spawn_blocking(move || wait_with_deadline(child, DEFAULT_DEADLINE, description))
        .await
        .unwrap()
}

/// The store as a client holding the backup credentials sees it: plain S3 requests, no
/// retention of its own.
async fn attacker(moto: &MotoServer) -> Arc<dyn ObjectStore> {
    Arc::new(S3Store::connect(BUCKET, PREFIX, &moto.options()).await)
}

async fn restore_matches(moto: &MotoServer, dir: &Path, repo: &str, id: &str, image: &Path) {
    let out = dir.join(format!("restored-{id}.img"));
    run(
        moto,
        dir,
        &["backup", "restore", "--no-progress", repo, id, s(&out)],
    )
    .await
    .assert_success();
    assert!(
        std::fs::read(image).unwrap() == std::fs::read(&out).unwrap(),
        "backup {id} did not restore byte for byte"
    );
}

#[tokio::test]
async fn init_refuses_storage_without_object_lock() {
    let dir = scratch_dir();
    let moto = MotoServer::start();
    moto.create_bucket("plain");
    let refused = run(
        &moto,
        dir.path(),
        &["backup", "init", "--immutable-days", "7", "s3://plain/r"],
    )
    .await;
    assert_eq!(refused.status.code(), Some(1), "{refused}");
    assert!(
        refused.stderr.contains("without S3 Object Lock")
            && refused.stderr.contains("--object-lock-enabled-for-bucket"),
        "{refused}"
    );
    // Nothing was written: a mutable repository can still be made there.
    let store = attacker_at(&moto, "plain").await;
    assert!(store.list("").await.unwrap().is_empty());

    // The in-process s3s-fs server has no Object Lock either.
    let s3s = S3Server::start().await;
    s3s.create_bucket("nolock");
    let store: Arc<dyn ObjectStore> =
        Arc::new(S3Store::connect("nolock", "r", &s3s.options()).await);
    let err = Repository::init(
        store,
        InitOptions::new().with_immutability(Immutability::days(LockMode::Compliance, 1)),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("without S3 Object Lock"), "{err}");

    // A directory cannot enforce retention at all.
    let local = run(
        &moto,
        dir.path(),
        &[
            "backup",
            "init",
            "--immutable-days",
            "7",
            s(&dir.path().join("repo")),
        ],
    )
    .await;
    assert_eq!(local.status.code(), Some(1), "{local}");
    assert!(local.stderr.contains("cannot retain objects"), "{local}");
}

async fn attacker_at(moto: &MotoServer, bucket: &str) -> Arc<dyn ObjectStore> {
    Arc::new(S3Store::connect(bucket, "r", &moto.options()).await)
}

/// Every attack a holder of the backup credentials can make, tried against a compliance
/// repository: DeleteObject by version id (refused by Object Lock), DeleteObject without
/// one (a delete marker), overwrites (a new version), prune and GC. Afterwards undelete
/// brings everything back and both backups restore byte for byte.
#[tokio::test]
async fn backup_credentials_cannot_destroy_a_retained_backup() {
    let dir = scratch_dir();
    let moto = MotoServer::start();
    moto.create_locked_bucket(BUCKET);
    let repo = format!("s3://{BUCKET}/{PREFIX}");
    let made = run(
        &moto,
        dir.path(),
        &[
            "backup",
            "init",
            "--chunk-size",
            "64K",
            "--immutable-days",
            "1",
            &repo,
        ],
    )
    .await;
    made.assert_success();
    assert!(
        made.stdout.contains("retained 1 day(s) in compliance mode"),
        "{made}"
    );

    let first = images::make(&dir.path().join("a.img"), Pattern::HalfData, 1 << 20, 1).unwrap();
    let second = images::make(&dir.path().join("b.img"), Pattern::HalfData, 1 << 20, 2).unwrap();
    let mut ids = Vec::new();
    for image in [&first, &second] {
        let made = run(
            &moto,
            dir.path(),
            &[
                "backup",
                "create",
                "--no-progress",
                "--json",
                "--parent",
                "none",
                "--source-id",
                "vm1",
                s(&image.path),
                &repo,
            ],
        )
        .await;
        made.assert_success();
        ids.push(parse(&made)["id"].as_str().unwrap().to_string());
        std::thread::sleep(Duration::from_millis(1100));
    }

    let store = attacker(&moto).await;
    let before = store.list_versions("").await.unwrap();
    let data: Vec<_> = before.iter().filter(|v| !v.delete_marker).collect();
    assert!(data.len() > 20, "{} versions", data.len());
    // Every data version carries a retention date.
    for v in &data {
        let meta = store
            .head_version(&v.name, &v.version_id)
            .await
            .unwrap()
            .unwrap();
        assert!(
            meta.retain_until.is_some(),
            "{} was written without a retention",
            v.name
        );
    }
    // Records that ended (the sessions) ended by a delete marker.
    assert!(
        before
            .iter()
            .any(|v| v.name.starts_with("sessions/") && v.delete_marker && v.latest),
        "a finished session leaves a delete marker"
    );

    // 1. DeleteObject with a version id: every data version refused.
    let mut refused = 0;
    for v in &data {
        let err = store
            .delete_version(&v.name, &v.version_id)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{}: {err}", v.name);
        refused += 1;
    }
    assert_eq!(refused, data.len());

    // 2. Prune everything it may, then GC with no grace: nothing is destroyed.
    let pruned = run(
        &moto,
        dir.path(),
        &["backup", "prune", "--json", "--keep-last", "1", &repo],
    )
    .await;
    pruned.assert_success();
    assert_eq!(parse(&pruned)["deleted"][0], ids[0].as_str(), "{pruned}");
    let gc = run(
        &moto,
        dir.path(),
        &["backup", "gc", "--json", "--grace", "0", &repo],
    )
    .await;
    gc.assert_success();
    let report = parse(&gc);
    assert!(report["chunks_retained"].as_u64().unwrap() > 0, "{gc}");
    assert_eq!(report["chunks_removed"], 0, "{gc}");
    // The pruned backup is hidden, with the prune's record.
    let hidden = run(&moto, dir.path(), &["backup", "undelete", "--json", &repo]).await;
    hidden.assert_success();
    let hidden = parse(&hidden);
    assert_eq!(hidden["hidden"][0]["id"], ids[0].as_str(), "{hidden}");
    assert_eq!(hidden["hidden"][0]["pruned"], true, "{hidden}");

    // 3. Overwrites: the second backup's manifest and one of its chunks.
    let manifest = format!("snapshots/{}.json", ids[1]);
    let chunk = store
        .list("chunks/")
        .await
        .unwrap()
        .into_iter()
        .next()
        .unwrap()
        .name;
    for name in [&manifest, &chunk] {
        store
            .put(name, Bytes::from_static(b"ransom"), PutMode::Overwrite)
            .await
            .unwrap();
    }
    // 4. DeleteObject without a version id on everything: the config, the keys, every
    // chunk, index and manifest.
    for meta in store.list("").await.unwrap() {
        store.delete(&meta.name).await.unwrap();
    }
    assert!(
        store.list("").await.unwrap().is_empty(),
        "everything is hidden"
    );
    let listed = run(&moto, dir.path(), &["backup", "list", &repo]).await;
    assert_eq!(
        listed.status.code(),
        Some(1),
        "the repository looks gone: {listed}"
    );

    // Not one data version was destroyed.
    let after = store.list_versions("").await.unwrap();
    for v in &data {
        assert!(
            after.iter().any(|a| a.version_id == v.version_id),
            "{} lost a version",
            v.name
        );
    }

    // undelete lists both backups, then brings them back with their chunks.
    let hidden = run(&moto, dir.path(), &["backup", "undelete", "--json", &repo]).await;
    hidden.assert_success();
    let hidden = parse(&hidden);
    let listed: Vec<&str> = hidden["hidden"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [ids[0].as_str(), ids[1].as_str()], "{hidden}");
    let undone = run(
        &moto,
        dir.path(),
        &["backup", "undelete", "--json", "--all", &repo],
    )
    .await;
    undone.assert_success();
    let undone = parse(&undone);
    assert_eq!(undone["backups"].as_array().unwrap().len(), 2, "{undone}");
    assert!(undone["chunks"].as_u64().unwrap() > 10, "{undone}");
    assert_eq!(undone["chunks_lost"], 0, "{undone}");
    restore_matches(&moto, dir.path(), &repo, &ids[0], &first.path).await;
    restore_matches(&moto, dir.path(), &repo, &ids[1], &second.path).await;
}

/// Governance mode is only as strong as the bucket's IAM policy: moto checks no policy,
/// so a request that asks to bypass governance retention destroys a version. On AWS
/// the backup credentials must be denied `s3:BypassGovernanceRetention` (docs/BACKUP.md).
#[tokio::test]
async fn governance_retention_yields_to_a_bypass_only() {
    let moto = MotoServer::start();
    moto.create_locked_bucket(BUCKET);
    let store: Arc<dyn ObjectStore> = attacker(&moto).await;
    let repo = Repository::init(
        Arc::clone(&store),
        InitOptions::new()
            .with_chunk_size(CHUNK)
            .with_immutability(Immutability::days(LockMode::Governance, 1)),
    )
    .await
    .unwrap();
    assert_eq!(repo.config().format_version, 4);
    let config = store.list_versions("config").await.unwrap().pop().unwrap();
    let err = store
        .delete_version("config", &config.version_id)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    let client = ferry_s3::client(&moto.options()).await;
    client
        .delete_object()
        .bucket(BUCKET)
        .key(format!("{PREFIX}/config"))
        .version_id(&config.version_id)
        .bypass_governance_retention(true)
        .send()
        .await
        .expect("moto lets any credential bypass governance retention");
    assert!(store
        .head_version("config", &config.version_id)
        .await
        .unwrap()
        .is_none());
}

async fn backup_of(
    repo: &Repository,
    data: &[Vec<u8>],
    parent: Option<(&BackupId, &FixedIndex)>,
) -> (BackupId, FixedIndex) {
    let session = match parent {
        Some((id, index)) => repo
            .begin_incremental_session(SessionOptions::new(), id, index)
            .await
            .unwrap(),
        None => repo.begin_session(SessionOptions::new()).await.unwrap(),
    };
    let mut index = FixedIndex::new((data.len() * CHUNK as usize) as u64, CHUNK).unwrap();
    for (i, chunk) in data.iter().enumerate() {
        let digest = repo.chunk_digest(chunk);
        if !session.reuse_chunk(&digest).await.unwrap() {
            session.put_chunk(chunk).await.unwrap();
        }
        index.set(i, digest).unwrap();
    }
    let manifest = session
        .finish(&index, SnapshotInfo::new("src"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    (manifest.id, index)
}

fn chunks(seed: u8, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            (0..CHUNK as usize)
                .map(|j| (j as u8).wrapping_mul(31) ^ seed ^ (i as u8))
                .collect()
        })
        .collect()
}

async fn read_back(repo: &Repository, id: &BackupId, data: &[Vec<u8>]) {
    let manifest = repo.load_manifest(id).await.unwrap();
    let index = repo.load_index(&manifest).await.unwrap();
    for (i, want) in data.iter().enumerate() {
        assert!(&repo.get_chunk(&index.digests()[i]).await.unwrap() == want);
    }
}

/// A backup built on a parent whose chunks' retention ends too soon extends it (each
/// chunk once), and records how long its chunks are retained so that the next backup
/// needs no request; GC destroys nothing retained, destroys a pruned backup's versions
/// once their retention has passed, and keeps a backup hidden without a prune.
#[tokio::test]
async fn retention_is_extended_and_gc_waits_for_it() {
    let moto = MotoServer::start();
    moto.create_locked_bucket(BUCKET);
    let store: Arc<dyn ObjectStore> = attacker(&moto).await;
    let period = 8;
    let imm = Immutability {
        mode: LockMode::Compliance,
        period_secs: period,
    };
    let repo = Repository::init(
        Arc::clone(&store),
        InitOptions::new()
            .with_chunk_size(CHUNK)
            .with_immutability(imm),
    )
    .await
    .unwrap();
    let data = chunks(1, 4);
    let (first, first_index) = backup_of(&repo, &data, None).await;
    let m1 = repo.load_manifest(&first).await.unwrap();
    let horizon1 = m1.chunks_retained_until.expect("a retention horizon");
    // Chunks are retained 1.5 periods: a backup within 0.4 periods needs no extension.
    let (second, second_index) = backup_of(&repo, &data, Some((&first, &first_index))).await;
    let m2 = repo.load_manifest(&second).await.unwrap();
    assert_eq!(
        m2.chunks_retained_until,
        Some(horizon1),
        "no extension needed yet"
    );
    // Past 0.4 periods the parent's chunks are extended, once each.
    tokio::time::sleep(Duration::from_secs(period * 4 / 10 + 1)).await;
    let (third, _) = backup_of(&repo, &data, Some((&second, &second_index))).await;
    let m3 = repo.load_manifest(&third).await.unwrap();
    let horizon3 = m3.chunks_retained_until.unwrap();
    assert!(horizon3 > horizon1, "{horizon3} after {horizon1}");
    let chunk = first_index.digests()[0].chunk_name();
    let until = store
        .head(&chunk)
        .await
        .unwrap()
        .unwrap()
        .retain_until
        .unwrap();
    assert!(chrono::DateTime::<chrono::Utc>::from(until) >= horizon3);

    // A different backup, then prune the three of the first data.
    let other = chunks(9, 2);
    let (fourth, _) = backup_of(&repo, &other, None).await;
    let report = repo
        .prune(
            &KeepPolicy::new().with_last(Keep::Count(1)),
            chrono::Utc::now(),
            false,
        )
        .await
        .unwrap();
    let mut deleted = report.deleted.clone();
    deleted.sort();
    assert_eq!(deleted, [first.clone(), second.clone(), third.clone()]);
    let gc = repo
        .gc(&GcOptions::new().with_grace(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(gc.chunks_removed, 0, "{gc:?}");
    assert_eq!(gc.chunks_retained, 4, "{gc:?}");

    // Hide the kept backup as an attacker would (no prune record).
    store
        .delete(&format!("snapshots/{fourth}.json"))
        .await
        .unwrap();

    // Past every retention, GC destroys the pruned backups and their chunks for good.
    let wait = until
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default()
        + Duration::from_secs(2);
    tokio::time::sleep(wait).await;
    let gc = repo
        .gc(&GcOptions::new().with_grace(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(gc.chunks_removed, 4, "{gc:?}");
    assert_eq!(gc.hidden_backups, 1, "{gc:?}");
    for id in [&first, &second, &third] {
        let left = store
            .list_versions(&format!("snapshots/{id}"))
            .await
            .unwrap();
        assert!(left.is_empty(), "{id}: {left:?}");
    }
    assert!(store.list_versions(&chunk).await.unwrap().is_empty());
    // The hidden one is whole: undelete brings it back.
    let undone = ferry_backup::undelete(
        Arc::clone(&store),
        None,
        Some(std::slice::from_ref(&fourth)),
    )
    .await
    .unwrap();
    assert_eq!(undone.backups, std::slice::from_ref(&fourth));
    read_back(&repo, &fourth, &other).await;
}
