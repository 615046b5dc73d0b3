//! `kill -9` in the middle of a prune and of a garbage collection, of the CLI and of
//! `ferry serve`: every backup still listed stays whole (verified, and restored byte for
//! byte), and the next run (or the restarted server's same job) completes the work.
//!
//! The repository lives on the in-process S3 server, whose DeleteObject requests pass a
//! gate ([`DeleteGate`]): the test holds the deletes from a chosen one on, so the process
//! is killed with some deletions done and the next one on its way, then lets the held
//! ones go on as a server would after its client vanished, or (the CLI prune) fails them
//! so that the killed prune leaves a backup's index without its manifest.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use ferry_api::proto::{self, JobState};
use ferry_tests::bin::{wait_with_deadline, Run, DEFAULT_DEADLINE};
use ferry_tests::check::qemu_img_compare;
use ferry_tests::images::{self, Pattern};
use ferry_tests::s3_server::{DeleteGate, S3Server, ACCESS_KEY, SECRET_KEY};
use ferry_tests::service_support::*;
use ferry_tests::{ferry, scratch_dir};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");
const MIB: u64 = 1024 * 1024;
/// 4 MiB images in 64 KiB chunks: 64 chunks each, none shared (random data).
const IMAGE: u64 = 4 * MIB;
const CHUNKS_PER_IMAGE: usize = 64;
const BUCKET: &str = "backups";
const PREFIX: &str = "r";
const REPO: &str = "s3://backups/r";
const LIMIT: Duration = Duration::from_secs(120);

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn json(run: &Run) -> Value {
    serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {run}"))
}

/// Runs the CLI against `server` to completion.
fn cli(server: &S3Server, args: &[&str]) -> Run {
    let child = spawn_cli(server, args);
    wait_with_deadline(child, DEFAULT_DEADLINE, format!("ferry {args:?}"))
}

fn spawn_cli(server: &S3Server, args: &[&str]) -> Child {
    let mut cmd = ferry!().command(args);
    server.sdk_env(&mut cmd);
    cmd.spawn().unwrap()
}

/// Objects stored under `dir` (s3s-fs keeps its own bookkeeping in dot files elsewhere).
fn count_objects(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                count_objects(&p)
            } else {
                1
            }
        })
        .sum()
}

fn chunk_objects(server: &S3Server) -> usize {
    count_objects(&server.object_path(BUCKET, &format!("{PREFIX}/chunks")))
}

/// Waits until the gate holds a delete, the process still running (it is in the middle).
fn wait_held(gate: &DeleteGate, mut alive: impl FnMut() -> bool) {
    let started = Instant::now();
    while gate.held() == 0 {
        assert!(alive(), "the process ended before its deletes were held");
        assert!(
            started.elapsed() < LIMIT,
            "no delete reached the gate in {LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill_when_held(gate: &DeleteGate, mut child: Child) {
    wait_held(gate, || child.try_wait().unwrap().is_none());
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

/// Backs up `image` as source `vm` and returns the backup's ID.
fn back_up(server: &S3Server, image: &Path) -> String {
    let made = cli(
        server,
        &[
            "backup",
            "create",
            "--no-progress",
            "--json",
            "--source-id",
            "vm",
            s(image),
            REPO,
        ],
    );
    made.assert_success();
    json(&made)["id"].as_str().unwrap().to_string()
}

fn listed(server: &S3Server) -> Vec<String> {
    let list = cli(server, &["backup", "list", "--json", REPO]);
    list.assert_success();
    json(&list)
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap().to_string())
        .collect()
}

/// Verifies every chunk of every backup, and restores `id` checking it against `image`.
fn assert_whole(server: &S3Server, dir: &Path, id: &str, image: &Path) {
    cli(server, &["backup", "verify", REPO]).assert_success();
    let out = dir.join(format!("restored-{id}.img"));
    cli(
        server,
        &["backup", "restore", "--no-progress", REPO, id, s(&out)],
    )
    .assert_success();
    qemu_img_compare(image, &out);
}

/// A repository holding backups of `images` (in this order, all of source `vm`).
async fn repository_with(dir: &Path, seeds: &[u64]) -> (S3Server, Vec<(PathBuf, String)>) {
    let server = S3Server::start_with_delete_gate().await;
    server.create_bucket(BUCKET);
    cli(&server, &["backup", "init", "--chunk-size", "64K", REPO]).assert_success();
    let mut made = Vec::new();
    for &seed in seeds {
        let image = images::make(
            &dir.join(format!("disk-{seed}.img")),
            Pattern::Random,
            IMAGE,
            seed,
        )
        .unwrap()
        .path;
        let id = back_up(&server, &image);
        made.push((image, id));
    }
    (server, made)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_gc_deletes_nothing_in_use_and_the_next_gc_completes() {
    let dir = scratch_dir();
    let (server, made) = repository_with(dir.path(), &[1, 2]).await;
    let (image, kept) = made[1].clone();
    tokio::task::block_in_place(|| {
        cli(&server, &["backup", "prune", "--keep-last", "1", REPO]).assert_success();
        assert_eq!(listed(&server), vec![kept.clone()]);
        assert_eq!(chunk_objects(&server), 2 * CHUNKS_PER_IMAGE);

        // S3 times have a resolution of one second: the unused chunks must be older than
        // the GC's start (its lease's time) to be swept with a grace of 0.
        std::thread::sleep(Duration::from_millis(1100));
        let gate = server.delete_gate();
        gate.hold_from(3);
        let gc = spawn_cli(
            &server,
            &["backup", "gc", "--grace", "0", "--lease-ttl", "10s", REPO],
        );
        kill_when_held(gate, gc);
        let killed_at = Instant::now();
        gate.release();
        gate.wait_idle(LIMIT);
        let left = chunk_objects(&server);
        assert!(
            (CHUNKS_PER_IMAGE..2 * CHUNKS_PER_IMAGE).contains(&left),
            "the killed GC removed some unused chunks and nothing more: {left} left"
        );

        // Its lease keeps other GCs out until it expires.
        let refused = cli(&server, &["backup", "gc", "--grace", "0", REPO]);
        let line = refused.assert_clean_failure();
        assert!(
            line.contains("another garbage collection is running") && line.contains("pid"),
            "{refused}"
        );
        assert_whole(&server, dir.path(), &kept, &image);

        let expiry = Duration::from_secs(11);
        if let Some(rest) = expiry.checked_sub(killed_at.elapsed()) {
            std::thread::sleep(rest);
        }
        let done = cli(&server, &["backup", "gc", "--grace", "0", "--json", REPO]);
        done.assert_success();
        let report = json(&done);
        assert_eq!(
            report["chunks_referenced"].as_u64(),
            Some(CHUNKS_PER_IMAGE as u64),
            "{report}"
        );
        assert_eq!(
            report["chunks_removed"].as_u64(),
            Some((left - CHUNKS_PER_IMAGE) as u64),
            "{report}"
        );
        assert_eq!(chunk_objects(&server), CHUNKS_PER_IMAGE);
        assert_whole(&server, dir.path(), &kept, &image);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_prune_leaves_whole_backups_and_a_rerun_finishes_it() {
    let dir = scratch_dir();
    let (server, made) = repository_with(dir.path(), &[3, 4, 5]).await;
    let (image, kept) = made[2].clone();
    tokio::task::block_in_place(|| {
        let gate = server.delete_gate();
        // A prune deletes one backup at a time, its manifest then its index: the first
        // forgotten backup's manifest goes, its index is on its way when the kill comes.
        gate.hold_from(2);
        let prune = spawn_cli(&server, &["backup", "prune", "--keep-last", "1", REPO]);
        kill_when_held(gate, prune);
        gate.fail_held();
        gate.wait_idle(LIMIT);
        let indexes = || count_objects(&server.object_path(BUCKET, &format!("{PREFIX}/indexes")));
        assert_eq!(
            indexes(),
            3,
            "the first forgotten backup's index outlived its manifest"
        );
        let after_kill = listed(&server);
        assert_eq!(after_kill.len(), 2, "{after_kill:?}");
        assert!(after_kill.contains(&kept), "{after_kill:?}");
        let survivor = after_kill.iter().find(|id| **id != kept).unwrap();
        let survivor_image = &made.iter().find(|(_, id)| id == survivor).unwrap().0;
        assert_whole(&server, dir.path(), survivor, survivor_image);
        assert_whole(&server, dir.path(), &kept, &image);

        cli(&server, &["backup", "prune", "--keep-last", "1", REPO]).assert_success();
        assert_eq!(listed(&server), vec![kept.clone()]);
        assert_eq!(indexes(), 2, "the kept backup's and the orphan");
        let gc = cli(&server, &["backup", "gc", "--grace", "0", "--json", REPO]);
        gc.assert_success();
        let report = json(&gc);
        assert_eq!(report["orphan_indexes_removed"].as_u64(), Some(1), "{gc}");
        assert_eq!(
            report["chunks_referenced"].as_u64(),
            Some(CHUNKS_PER_IMAGE as u64),
            "{gc}"
        );
        assert_eq!(chunk_objects(&server), CHUNKS_PER_IMAGE);
        assert_eq!(indexes(), 1, "no index without its backup is left");
        assert_whole(&server, dir.path(), &kept, &image);
    });
}

// ---- through `ferry serve` ----------------------------------------------------------

/// A server process for the S3 repository: its credentials by reference to files.
struct Served {
    tmp: tempfile::TempDir,
    root: PathBuf,
    repo: Option<proto::Repository>,
}

impl Served {
    fn new(s3: &S3Server) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("images");
        std::fs::create_dir(&root).unwrap();
        let secrets = tmp.path().join("secrets");
        std::fs::create_dir(&secrets).unwrap();
        std::fs::write(secrets.join("s3-id"), ACCESS_KEY).unwrap();
        std::fs::write(secrets.join("s3-secret"), SECRET_KEY).unwrap();
        let repo = Some(proto::Repository {
            url: REPO.into(),
            s3: Some(proto::S3Options {
                endpoint_url: s3.endpoint_url(),
                region: "us-east-1".into(),
                access_key_id: file_ref("s3-id"),
                secret_access_key: file_ref("s3-secret"),
                force_path_style: true,
                ..Default::default()
            }),
            key: None,
        });
        Self { tmp, root, repo }
    }

    fn start(&self) -> ServeProcess {
        let arg = |p: PathBuf| p.display().to_string();
        ServeProcess::start(
            Path::new(BIN),
            &[
                "--data-dir".into(),
                arg(self.tmp.path().join("data")),
                "--allow-root".into(),
                arg(self.root.clone()),
                "--secrets-dir".into(),
                arg(self.tmp.path().join("secrets")),
            ],
            &[],
        )
    }
}

fn result(job: &proto::Job) -> &proto::job::Result {
    assert_eq!(
        state(job),
        JobState::Succeeded,
        "{:?} {:?}",
        job.error,
        job.message
    );
    job.result.as_ref().expect("a result")
}

/// Backs up `seeds`' images through the server, then returns them with their snapshots.
async fn served_backups(
    served: &Served,
    jobs: &mut Client,
    seeds: &[u64],
) -> Vec<(PathBuf, String)> {
    let mut made = Vec::new();
    for &seed in seeds {
        let image = images::make(
            &served.root.join(format!("disk-{seed}.img")),
            Pattern::Random,
            IMAGE,
            seed,
        )
        .unwrap()
        .path;
        let id = jobs
            .start_backup(proto::StartBackupRequest {
                source: endpoint(image.display().to_string()),
                repository: served.repo.clone(),
                source_id: "vm".into(),
                init_if_missing: Some(proto::RepositoryInit {
                    chunk_size: 64 * 1024,
                    zstd_level: None,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .id;
        let done = wait_terminal(jobs, &id, LIMIT).await;
        let proto::job::Result::BackupResult(b) = result(&done) else {
            panic!("not a backup result: {done:?}");
        };
        made.push((image, b.snapshot_id.clone()));
    }
    made
}

async fn served_restore_matches(served: &Served, jobs: &mut Client, snapshot: &str, image: &Path) {
    let out = served.root.join(format!("restored-{snapshot}.img"));
    let id = jobs
        .start_restore(proto::StartRestoreRequest {
            repository: served.repo.clone(),
            snapshot_id: snapshot.into(),
            target: endpoint(out.display().to_string()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    let done = wait_terminal(jobs, &id, LIMIT).await;
    result(&done);
    qemu_img_compare(image, &out);
}

async fn served_verify(served: &Served, jobs: &mut Client) -> proto::RepositoryVerifyResult {
    let id = jobs
        .start_repository_verify(proto::StartRepositoryVerifyRequest {
            repository: served.repo.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    let done = wait_terminal(jobs, &id, LIMIT).await;
    match result(&done) {
        proto::job::Result::RepositoryVerifyResult(r) => r.clone(),
        other => panic!("not a verify result: {other:?}"),
    }
}

fn keep_last_1() -> Option<proto::Retention> {
    Some(proto::Retention {
        keep_last: 1,
        ..Default::default()
    })
}

/// Kills the server once the gate holds a delete (polling without blocking the runtime
/// that serves S3).
async fn kill_server_when_held(gate: &DeleteGate, mut server: ServeProcess) {
    let started = Instant::now();
    while gate.held() == 0 {
        assert!(
            server.child.try_wait().unwrap().is_none(),
            "the server ended before its deletes were held: {}",
            server.stderr()
        );
        assert!(
            started.elapsed() < LIMIT,
            "no delete reached the gate in {LIMIT:?}: {}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_server_mid_gc_then_the_restarted_server_finishes_the_job() {
    let s3 = S3Server::start_with_delete_gate().await;
    s3.create_bucket(BUCKET);
    let served = Served::new(&s3);
    let server = served.start();
    let mut jobs = connect(server.grpc).await;
    let made = served_backups(&served, &mut jobs, &[6, 7]).await;
    let (image, kept) = made[1].clone();
    let prune = jobs
        .start_prune(proto::StartPruneRequest {
            repository: served.repo.clone(),
            retention: keep_last_1(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    result(&wait_terminal(&mut jobs, &prune, LIMIT).await);
    assert_eq!(chunk_objects(&s3), 2 * CHUNKS_PER_IMAGE);

    // S3 times have a resolution of one second: the unused chunks must be older than the
    // GC's start (its lease's time) to be swept with a grace of 0.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let gate = s3.delete_gate();
    gate.hold_from(3);
    let gc = jobs
        .start_gc(proto::StartGcRequest {
            repository: served.repo.clone(),
            grace_seconds: Some(0),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    kill_server_when_held(gate, server).await;
    gate.release();
    tokio::task::block_in_place(|| gate.wait_idle(LIMIT));
    let left = chunk_objects(&s3);
    assert!(left < 2 * CHUNKS_PER_IMAGE, "{left}");

    // The restarted server resumes the same job, which takes over its own lease at once
    // (another GC would have to wait for it to expire).
    let server = served.start();
    let mut jobs = connect(server.grpc).await;
    let done = wait_terminal(&mut jobs, &gc, LIMIT).await;
    assert_eq!(done.attempt, 2, "{done:?}\n{}", server.stderr());
    let proto::job::Result::GcResult(report) = result(&done) else {
        panic!("not a GC result: {done:?}");
    };
    assert_eq!(
        report.chunks_referenced, CHUNKS_PER_IMAGE as u64,
        "{report:?}"
    );
    assert_eq!(
        report.chunks_removed,
        (left - CHUNKS_PER_IMAGE) as u64,
        "{report:?}"
    );
    assert_eq!(chunk_objects(&s3), CHUNKS_PER_IMAGE);
    let verified = served_verify(&served, &mut jobs).await;
    assert!(verified.ok && verified.chunks_bad == 0, "{verified:?}");
    served_restore_matches(&served, &mut jobs, &kept, &image).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_server_mid_prune_then_the_restarted_server_finishes_the_job() {
    let s3 = S3Server::start_with_delete_gate().await;
    s3.create_bucket(BUCKET);
    let served = Served::new(&s3);
    let server = served.start();
    let mut jobs = connect(server.grpc).await;
    let made = served_backups(&served, &mut jobs, &[8, 9, 10]).await;
    let (image, kept) = made[2].clone();

    let gate = s3.delete_gate();
    gate.hold_from(2);
    let prune = jobs
        .start_prune(proto::StartPruneRequest {
            repository: served.repo.clone(),
            retention: keep_last_1(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    kill_server_when_held(gate, server).await;
    gate.release();
    tokio::task::block_in_place(|| gate.wait_idle(LIMIT));

    let server = served.start();
    let mut jobs = connect(server.grpc).await;
    let done = wait_terminal(&mut jobs, &prune, LIMIT).await;
    assert_eq!(done.attempt, 2, "{done:?}\n{}", server.stderr());
    let proto::job::Result::PruneResult(pruned) = result(&done) else {
        panic!("not a prune result: {done:?}");
    };
    let kept_ids: Vec<&str> = pruned.kept.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(kept_ids, vec![kept.as_str()], "{pruned:?}");
    let verified = served_verify(&served, &mut jobs).await;
    assert!(verified.ok, "{verified:?}");
    assert_eq!(verified.snapshots_checked, 1, "{verified:?}");
    served_restore_matches(&served, &mut jobs, &kept, &image).await;
}
