//! Backups through the job service with real gRPC clients: a directory repository and
//! the in-process S3 server (s3s + s3s-fs), qemu-nbd with a dirty bitmap for an
//! incremental backup, restores checked with `qemu-img compare` and their allocation,
//! verify finding a corrupted chunk, prune and GC numbers, an encrypted repository whose
//! key is a secret reference (never in a job record or the metrics), kill -9 of a
//! `ferry-e2e serve` process mid backup, a backup schedule that prunes, bad requests,
//! racing InitRepository calls, a restore whose backup is pruned while the server is
//! down, and ListSnapshots page by page.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ferry_api::proto::{self, JobState};
use ferry_tests::check::{allocated_bytes, blkhash_file, qemu_img_compare, require_tool};
use ferry_tests::nbd_servers::{NbdServer, Nbdkit, QemuNbd};
use ferry_tests::s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};
use ferry_tests::service_support::*;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");
const MIB: u64 = 1024 * 1024;
const CHUNK: u64 = 256 * 1024;
const LIMIT: Duration = Duration::from_secs(120);
const PASSPHRASE: &str = "correct horse battery staple";

type Backups = BackupClient;
type Env = BackupEnv;

/// The repository key, a wrong one and the S3 credentials, as secret files.
fn secret_files() -> [(&'static str, String); 4] {
    [
        ("repo-key", format!("{PASSPHRASE}\n")),
        ("wrong-key", "not the passphrase\n".into()),
        ("s3-id", ACCESS_KEY.into()),
        ("s3-secret", SECRET_KEY.into()),
    ]
}

fn secrets_dir(dir: &Path) -> PathBuf {
    write_secrets(dir, &secret_files())
}

async fn env_with(seconds: bool) -> Env {
    BackupEnv::start(&secret_files(), seconds).await
}

fn dir_repo(path: &Path) -> Option<proto::Repository> {
    Some(proto::Repository {
        url: path.display().to_string(),
        ..Default::default()
    })
}

fn small_chunks() -> Option<proto::RepositoryInit> {
    Some(proto::RepositoryInit {
        chunk_size: CHUNK,
        zstd_level: None,
        ..Default::default()
    })
}

fn backup_req(src: &str, repo: Option<proto::Repository>) -> proto::StartBackupRequest {
    proto::StartBackupRequest {
        source: endpoint(src),
        repository: repo,
        ..Default::default()
    }
}

fn restore_req(
    repo: Option<proto::Repository>,
    id: &str,
    dst: &Path,
) -> proto::StartRestoreRequest {
    proto::StartRestoreRequest {
        repository: repo,
        snapshot_id: id.into(),
        target: endpoint(dst.display().to_string()),
        ..Default::default()
    }
}

async fn finished(job: tonic::Response<proto::Job>, jobs: &mut Client) -> proto::Job {
    let id = job.into_inner().id;
    wait_terminal(jobs, &id, LIMIT).await
}

fn succeeded(job: &proto::Job) {
    assert_eq!(
        state(job),
        JobState::Succeeded,
        "{:?} {:?}",
        job.error,
        job.message
    );
}

fn backup_result(job: &proto::Job) -> proto::BackupResult {
    succeeded(job);
    match &job.result {
        Some(proto::job::Result::BackupResult(r)) => r.clone(),
        other => panic!("not a backup result: {other:?}"),
    }
}

fn restore_result(job: &proto::Job) -> proto::RestoreResult {
    succeeded(job);
    match &job.result {
        Some(proto::job::Result::RestoreResult(r)) => r.clone(),
        other => panic!("not a restore result: {other:?}"),
    }
}

/// An image of `size` bytes: 1 MiB runs of pseudo-random bytes (no two chunks alike, so
/// nothing deduplicates by accident) alternating with 1 MiB holes.
fn image(path: &Path, size: u64, seed: u64) -> PathBuf {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    let mut offset = 0;
    while offset < size {
        let len = MIB.min(size - offset);
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ offset ^ 1;
        let mut buf = Vec::with_capacity(len as usize);
        while (buf.len() as u64) < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf.extend_from_slice(&x.to_le_bytes());
        }
        buf.truncate(len as usize);
        f.write_all_at(&buf, offset).unwrap();
        offset += 2 * MIB;
    }
    f.sync_all().unwrap();
    path.to_path_buf()
}

/// Overwrites 4 KiB at `offset` with a new pattern.
fn scribble(path: &Path, offset: u64, byte: u8) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&[byte; 4096]).unwrap();
    f.sync_all().unwrap();
}

/// Every chunk file of a directory repository.
fn chunk_files(repo: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(dirs) = std::fs::read_dir(repo.join("chunks")) else {
        return out;
    };
    for d in dirs.flatten() {
        for f in std::fs::read_dir(d.path()).unwrap().flatten() {
            out.push(f.path());
        }
    }
    out.sort();
    out
}

async fn snapshots(backups: &mut Backups, repo: Option<proto::Repository>) -> Vec<proto::Snapshot> {
    backups
        .list_snapshots(proto::ListSnapshotsRequest {
            repository: repo,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshots
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_restore_incremental_prune_gc_and_verify_on_a_directory() {
    let mut e = env_with(false).await;
    let src = image(&e.root.join("src.img"), 16 * MIB, 3);
    let repo_dir = e.root.join("repo");
    let repo = dir_repo(&repo_dir);
    let info = e
        .backups
        .init_repository(proto::InitRepositoryRequest {
            repository: repo.clone(),
            options: small_chunks(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.chunk_size, CHUNK);
    assert!(!info.encrypted);

    let mut req = backup_req(&src.display().to_string(), repo.clone());
    req.tags.insert("vm".into(), "web1".into());
    let first = finished(
        e.jobs.clone().start_backup(req.clone()).await.unwrap(),
        &mut e.jobs,
    )
    .await;
    assert_eq!(first.kind, proto::JobKind::Backup as i32);
    let first = backup_result(&first);
    assert_eq!(first.size, 16 * MIB);
    assert!(first.parent_id.is_empty());
    assert!(
        !first.full_reason.is_empty(),
        "a first backup says why it is full"
    );
    assert_eq!(first.bytes_new, 8 * MIB, "{first:?}");
    assert_eq!(first.bytes_zero, 8 * MIB, "{first:?}");
    assert_eq!(first.digest.as_ref().unwrap().hex, blkhash_file(&src));

    let listed = snapshots(&mut e.backups, repo.clone()).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, first.snapshot_id);
    assert_eq!(listed[0].tags["vm"], "web1");
    let got = e
        .backups
        .get_snapshot(proto::GetSnapshotRequest {
            repository: repo.clone(),
            id: first.snapshot_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.size, 16 * MIB);
    assert_eq!(got.source_id, src.display().to_string());
    assert_eq!(got.bytes_new, 8 * MIB);

    // Restore: the same bytes, and sparse.
    let dst = e.root.join("restored.img");
    let restored = finished(
        e.jobs
            .clone()
            .start_restore(restore_req(repo.clone(), &first.snapshot_id, &dst))
            .await
            .unwrap(),
        &mut e.jobs,
    )
    .await;
    let restored = restore_result(&restored);
    assert!(restored.verified);
    assert_eq!(restored.data_bytes, 8 * MIB);
    qemu_img_compare(&src, &dst);
    assert!(
        allocated_bytes(&dst) <= 9 * MIB,
        "the restore is not sparse: {} bytes allocated",
        allocated_bytes(&dst)
    );

    // Incremental: one 4 KiB write changes one chunk.
    scribble(&src, 4 * MIB + 8192, 0xee);
    let second = finished(
        e.jobs.clone().start_backup(req.clone()).await.unwrap(),
        &mut e.jobs,
    )
    .await;
    let second = backup_result(&second);
    assert_eq!(second.parent_id, first.snapshot_id);
    assert_eq!(second.bytes_new, CHUNK, "{second:?}");
    assert_eq!(second.bytes_reused, 8 * MIB - CHUNK, "{second:?}");
    assert_eq!(second.digest.as_ref().unwrap().hex, blkhash_file(&src));
    let by_tag = e
        .backups
        .list_snapshots(proto::ListSnapshotsRequest {
            repository: repo.clone(),
            tags: BTreeMap::from([("vm".to_string(), "web1".to_string())]),
            page_size: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_tag.snapshots.len(), 1);
    assert_eq!(by_tag.snapshots[0].id, first.snapshot_id);
    assert!(!by_tag.next_page_token.is_empty());

    // Prune keeps the newest; GC frees the one chunk only the first backup used.
    let prune = finished(
        e.jobs
            .clone()
            .start_prune(proto::StartPruneRequest {
                repository: repo.clone(),
                retention: Some(proto::Retention {
                    keep_last: 1,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap(),
        &mut e.jobs,
    )
    .await;
    succeeded(&prune);
    let Some(proto::job::Result::PruneResult(p)) = &prune.result else {
        panic!("{prune:?}")
    };
    assert_eq!(p.removed.len(), 1);
    assert_eq!(p.removed[0].id, first.snapshot_id);
    assert_eq!(p.kept[0].id, second.snapshot_id);
    assert_eq!(p.kept[0].reasons, vec!["last".to_string()]);
    let chunks_before = chunk_files(&repo_dir).len();
    // Chunk times are whole seconds: a chunk written this second is not older than a
    // grace of 0 yet.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let gc = finished(
        e.jobs
            .clone()
            .start_gc(proto::StartGcRequest {
                repository: repo.clone(),
                grace_seconds: Some(0),
                ..Default::default()
            })
            .await
            .unwrap(),
        &mut e.jobs,
    )
    .await;
    succeeded(&gc);
    let Some(proto::job::Result::GcResult(g)) = &gc.result else {
        panic!("{gc:?}")
    };
    assert_eq!(g.chunks_removed, 1, "{g:?}");
    assert!(g.bytes_removed > 0, "{g:?}");
    assert_eq!(g.chunks_referenced, 32, "{g:?}");
    assert_eq!(chunk_files(&repo_dir).len(), chunks_before - 1);
    let dst2 = e.root.join("restored2.img");
    let r2 = finished(
        e.jobs
            .clone()
            .start_restore(restore_req(repo.clone(), &second.snapshot_id, &dst2))
            .await
            .unwrap(),
        &mut e.jobs,
    )
    .await;
    restore_result(&r2);
    qemu_img_compare(&src, &dst2);

    // Verify: clean, then one damaged chunk names the broken backup.
    let verify_req = proto::StartRepositoryVerifyRequest {
        repository: repo.clone(),
        ..Default::default()
    };
    let clean = finished(
        e.jobs
            .clone()
            .start_repository_verify(verify_req.clone())
            .await
            .unwrap(),
        &mut e.jobs,
    )
    .await;
    succeeded(&clean);
    let victim = &chunk_files(&repo_dir)[0];
    let mut bytes = std::fs::read(victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(victim, bytes).unwrap();
    let bad = finished(
        e.jobs
            .clone()
            .start_repository_verify(verify_req)
            .await
            .unwrap(),
        &mut e.jobs,
    )
    .await;
    assert_eq!(state(&bad), JobState::Failed, "{bad:?}");
    assert_eq!(bad.error.as_ref().unwrap().kind, "corrupt");
    let Some(proto::job::Result::RepositoryVerifyResult(v)) = &bad.result else {
        panic!("{bad:?}")
    };
    assert!(!v.ok);
    assert_eq!(v.chunks_bad, 1, "{v:?}");
    assert_eq!(v.bad_chunks[0].fault, "damaged");
    assert_eq!(v.broken_snapshots, vec![second.snapshot_id.clone()]);
    assert_eq!(
        v.bad_chunks[0].snapshot_ids,
        vec![second.snapshot_id.clone()]
    );

    let s = parse_metrics(&scrape_metrics(e.service.metrics_addr().unwrap()).await);
    let label = repo_dir.canonicalize().unwrap().display().to_string();
    let new = sample(
        &s,
        "ferry_backup_bytes_total",
        &[("repository", label.as_str()), ("kind", "new")],
    );
    assert_eq!(new, Some((8 * MIB + CHUNK) as f64));
    let bad_chunks = sample(
        &s,
        "ferry_repository_verify_chunks_total",
        &[("repository", label.as_str()), ("result", "bad")],
    );
    assert_eq!(bad_chunks, Some(1.0));
    let kept = sample(
        &s,
        "ferry_repository_chunks",
        &[("repository", label.as_str())],
    );
    assert_eq!(kept, Some(32.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_s3_repository_with_key_and_credentials_by_reference() {
    let mut e = env_with(false).await;
    let s3 = S3Server::start().await;
    s3.create_bucket("backups");
    let s3_options = proto::S3Options {
        endpoint_url: s3.endpoint_url(),
        region: "us-east-1".into(),
        access_key_id: file_ref("s3-id"),
        secret_access_key: file_ref("s3-secret"),
        force_path_style: true,
        ..Default::default()
    };
    let repo = Some(proto::Repository {
        url: "s3://backups/vms".into(),
        s3: Some(s3_options.clone()),
        key: file_ref("repo-key"),
    });
    let src = image(&e.root.join("disk.img"), 8 * MIB + 4096, 9);
    let mut req = backup_req(&src.display().to_string(), repo.clone());
    req.init_if_missing = small_chunks();
    req.source_id = "vm/disk0".into();
    let job = finished(e.jobs.clone().start_backup(req).await.unwrap(), &mut e.jobs).await;
    let b = backup_result(&job);
    assert_eq!(b.source_id, "vm/disk0");
    let info = e
        .backups
        .get_repository(proto::GetRepositoryRequest {
            repository: repo.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(info.encrypted);
    // The manifest in the bucket is encrypted: the source name is not readable there.
    let manifest = s3.object_path("backups", &format!("vms/snapshots/{}.json", b.snapshot_id));
    let stored = std::fs::read(&manifest).unwrap();
    assert!(!String::from_utf8_lossy(&stored).contains("vm/disk0"));

    let dst = e.root.join("restored.img");
    let r = finished(
        e.jobs
            .clone()
            .start_restore(restore_req(repo.clone(), &b.snapshot_id, &dst))
            .await
            .unwrap(),
        &mut e.jobs,
    )
    .await;
    assert!(restore_result(&r).verified);
    qemu_img_compare(&src, &dst);

    // A wrong key: a clear error, no key in the job record or the metrics.
    let wrong = Some(proto::Repository {
        key: file_ref("wrong-key"),
        ..repo.clone().unwrap()
    });
    let failed = finished(
        e.jobs
            .clone()
            .start_restore(restore_req(
                wrong.clone(),
                &b.snapshot_id,
                &e.root.join("x.img"),
            ))
            .await
            .unwrap(),
        &mut e.jobs,
    )
    .await;
    assert_eq!(state(&failed), JobState::Failed);
    let error = failed.error.clone().unwrap();
    assert_eq!(error.kind, "permission_denied", "{error:?}");
    assert!(
        error.message.contains("passphrase") || error.message.contains("key"),
        "{error:?}"
    );
    let status = e
        .backups
        .list_snapshots(proto::ListSnapshotsRequest {
            repository: wrong,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let record = format!(
        "{:?}",
        e.jobs
            .list_jobs(proto::ListJobsRequest::default())
            .await
            .unwrap()
            .into_inner()
    );
    let metrics = scrape_metrics(e.service.metrics_addr().unwrap()).await;
    let stored: String = walk(&e.dir.path().join("data"));
    for text in [&record, &metrics, &stored] {
        assert!(!text.contains(PASSPHRASE));
        assert!(!text.contains(SECRET_KEY));
        assert!(!text.contains("not the passphrase"));
    }
}

/// Every file under `dir` as lossy text (the job store, for secret checks).
fn walk(dir: &Path) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.push_str(&walk(&p));
        } else if let Ok(bytes) = std::fs::read(&p) {
            out.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    out
}

fn sh(program: &str, args: &[&str]) {
    require_tool(program, "qemu-utils");
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incremental_backup_reads_only_the_dirty_bitmap() {
    let mut e = env_with(false).await;
    let disk = e.root.join("disk.qcow2");
    let d = disk.to_str().unwrap();
    sh("qemu-img", &["create", "-q", "-f", "qcow2", d, "32M"]);
    for cmd in ["write -P 0x11 0 3M", "write -P 0x22 10M 2M"] {
        sh("qemu-io", &["-f", "qcow2", "-c", cmd, d]);
    }
    let repo = dir_repo(&e.root.join("repo"));
    let export = |bitmap: Option<&str>| {
        NbdServer::qemu_nbd(
            &disk,
            &QemuNbd {
                format: Some("qcow2".into()),
                export: "disk".into(),
                bitmap: bitmap.map(Into::into),
                read_only: true,
                ..QemuNbd::default()
            },
        )
    };
    let first = {
        let server = export(None);
        let mut req = backup_req(&server.uri(), repo.clone());
        req.init_if_missing = small_chunks();
        req.source_id = "disk".into();
        backup_result(&finished(e.jobs.clone().start_backup(req).await.unwrap(), &mut e.jobs).await)
    };
    sh("qemu-img", &["bitmap", "--add", d, "b0"]);
    sh("qemu-io", &["-f", "qcow2", "-c", "write -P 0x55 1M 64k", d]);
    sh(
        "qemu-io",
        &["-f", "qcow2", "-c", "write -P 0x66 20M 64k", d],
    );
    let second = {
        let server = export(Some("b0"));
        let mut req = backup_req(&server.uri(), repo.clone());
        req.source_id = "disk".into();
        req.dirty_bitmap = "b0".into();
        backup_result(&finished(e.jobs.clone().start_backup(req).await.unwrap(), &mut e.jobs).await)
    };
    assert_eq!(second.parent_id, first.snapshot_id);
    assert_eq!(second.chunks_read, 2, "{second:?}");
    assert!(second.bytes_read <= 2 * CHUNK, "{second:?}");
    assert!(second.chunks_unread > 0, "{second:?}");
    assert_eq!(second.bytes_new, 2 * CHUNK, "{second:?}");
    let dst = e.root.join("restored.img");
    let r = finished(
        e.jobs
            .clone()
            .start_restore(restore_req(repo.clone(), &second.snapshot_id, &dst))
            .await
            .unwrap(),
        &mut e.jobs,
    )
    .await;
    restore_result(&r);
    let out = Command::new("qemu-img")
        .args(["compare", "-f", "qcow2", "-F", "raw", d])
        .arg(&dst)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

fn serve_args(data: &Path, root: &Path, secrets: &Path) -> Vec<String> {
    vec![
        "--data-dir".into(),
        data.display().to_string(),
        "--allow-root".into(),
        root.display().to_string(),
        "--secrets-dir".into(),
        secrets.display().to_string(),
        "--test-cron-seconds".into(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_backup_then_the_restarted_server_finishes_it_without_resending() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("images");
    let data = tmp.path().join("data");
    std::fs::create_dir(&root).unwrap();
    let secrets = secrets_dir(tmp.path());
    let src = image(&root.join("src.img"), 16 * MIB, 5);
    // Slow reads: 32 data chunks at 150 ms each take about 5 s with one worker.
    let slow = NbdServer::nbdkit(
        &["file", src.to_str().unwrap(), "rdelay=150ms"],
        &Nbdkit {
            filters: vec!["delay".into()],
            export: "src".into(),
            read_only: true,
            ..Nbdkit::default()
        },
    );
    let repo_dir = root.join("repo");
    let repo = Some(proto::Repository {
        url: repo_dir.display().to_string(),
        key: file_ref("repo-key"),
        ..Default::default()
    });
    let server = ServeProcess::start(Path::new(BIN), &serve_args(&data, &root, &secrets), &[]);
    let mut jobs = connect(server.grpc).await;
    let mut req = backup_req(&slow.uri(), repo.clone());
    req.init_if_missing = small_chunks();
    req.workers = 1;
    let id = jobs.start_backup(req).await.unwrap().into_inner().id;
    let mut stream = jobs
        .watch_job(proto::WatchJobRequest { id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    loop {
        let j = stream
            .message()
            .await
            .unwrap()
            .expect("job still running")
            .job
            .unwrap();
        assert!(!is_terminal(&j), "the backup finished too early: {j:?}");
        if j.progress.unwrap().done_bytes >= 6 * MIB {
            break;
        }
    }
    let stored_before_kill = chunk_files(&repo_dir).len() as u64;
    assert!(stored_before_kill >= 2, "{stored_before_kill}");
    server.kill9();

    let server = ServeProcess::start(Path::new(BIN), &serve_args(&data, &root, &secrets), &[]);
    let mut jobs = connect(server.grpc).await;
    let done = wait_terminal(&mut jobs, &id, LIMIT).await;
    let b = backup_result(&done);
    assert_eq!(done.attempt, 2, "{done:?}\n{}", server.stderr());
    assert!(
        b.chunks_reused >= stored_before_kill,
        "chunks stored before the kill were sent again: {b:?} ({stored_before_kill} stored)"
    );
    assert_eq!(b.chunks_new + b.chunks_reused, 32, "{b:?}");
    assert_eq!(b.digest.as_ref().unwrap().hex, blkhash_file(&src));
    let dst = root.join("restored.img");
    let restore = jobs
        .start_restore(restore_req(repo, &b.snapshot_id, &dst))
        .await
        .unwrap();
    let r = finished(restore, &mut jobs).await;
    restore_result(&r);
    qemu_img_compare(&src, &dst);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_schedule_runs_and_prunes_after_each_backup() {
    let mut e = env_with(true).await;
    let src = image(&e.root.join("src.img"), 2 * MIB, 1);
    let repo = dir_repo(&e.root.join("repo"));
    let mut template = backup_req(&src.display().to_string(), repo.clone());
    template.init_if_missing = small_chunks();
    template.retention = Some(proto::Retention {
        keep_last: 2,
        ..Default::default()
    });
    let mut schedules = connect_schedules(e.service.grpc_addr()).await;
    let created = schedules
        .create_schedule(proto::CreateScheduleRequest {
            name: "nightly".into(),
            cron: "*/1 * * * * *".into(),
            template: Some(proto::JobTemplate {
                request: Some(proto::job_template::Request::Backup(template)),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let s = schedules
            .get_schedule(proto::GetScheduleRequest {
                id: created.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        let st = s.status.unwrap_or_default();
        if st.runs_started >= 4
            && st
                .last_run
                .as_ref()
                .is_some_and(|r| r.result == proto::ScheduleRunResult::Succeeded as i32)
        {
            schedules
                .pause_schedule(proto::PauseScheduleRequest {
                    id: created.id.clone(),
                })
                .await
                .unwrap();
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{st:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Let a run started before the pause finish.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let jobs = e
        .jobs
        .list_jobs(proto::ListJobsRequest {
            kind: proto::JobKind::Backup as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    let done: Vec<_> = jobs
        .iter()
        .filter(|j| state(j) == JobState::Succeeded)
        .collect();
    assert!(done.len() >= 4, "{jobs:?}");
    let last = backup_result(done.last().unwrap());
    let pruned = last.prune.expect("the run pruned");
    assert_eq!(pruned.kept.len(), 2, "{pruned:?}");
    assert!(!pruned.removed.is_empty() || done.len() == 2);
    let listed = snapshots(&mut e.backups, repo).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
}

#[tokio::test]
async fn bad_backup_requests_are_refused_with_the_reason() {
    let mut e = env_with(false).await;
    let src = image(&e.root.join("src.img"), MIB, 1);
    let src_url = src.display().to_string();
    let repo_dir = e.root.join("repo");
    let repo = dir_repo(&repo_dir);

    let code = |r: Result<tonic::Response<proto::Job>, tonic::Status>| {
        let s = r.expect_err("refused");
        (s.code(), s.message().to_string())
    };
    let outside = dir_repo(Path::new("/var/tmp/ferry-outside-repo"));
    let (c, m) = code(e.jobs.start_backup(backup_req(&src_url, outside)).await);
    assert_eq!(c, Code::PermissionDenied, "{m}");
    let (c, m) = code(e.jobs.start_backup(backup_req(&src_url, None)).await);
    assert_eq!(c, Code::InvalidArgument, "{m}");
    assert!(m.contains("repository"), "{m}");
    let mut req = backup_req(&src_url, repo.clone());
    req.parent = "yesterday".into();
    let (c, m) = code(e.jobs.start_backup(req).await);
    assert_eq!(c, Code::InvalidArgument);
    assert!(m.contains("parent"), "{m}");
    let mut req = backup_req(&src_url, repo.clone());
    req.dirty_bitmap = "b0".into();
    let (c, m) = code(e.jobs.start_backup(req).await);
    assert_eq!(c, Code::InvalidArgument);
    assert!(m.contains("dirty_bitmap"), "{m}");
    let mut req = backup_req(&src_url, repo.clone());
    req.retention = Some(proto::Retention::default());
    let (c, m) = code(e.jobs.start_backup(req).await);
    assert_eq!(c, Code::InvalidArgument);
    assert!(m.contains("retention"), "{m}");
    let mut req = backup_req(&src_url, repo.clone());
    req.retention = Some(proto::Retention {
        keep_daily: -3,
        ..Default::default()
    });
    let (c, m) = code(e.jobs.start_backup(req).await);
    assert_eq!(c, Code::InvalidArgument);
    assert!(m.contains("retention.keep_daily"), "{m}");
    let mut req = backup_req(&src_url, repo.clone());
    req.init_if_missing = Some(proto::RepositoryInit {
        chunk_size: 1000,
        zstd_level: None,
        ..Default::default()
    });
    let (c, m) = code(e.jobs.start_backup(req).await);
    assert_eq!(c, Code::InvalidArgument);
    assert!(m.contains("init_if_missing.chunk_size"), "{m}");
    let with_s3 = Some(proto::Repository {
        s3: Some(proto::S3Options::default()),
        ..repo.clone().unwrap()
    });
    let (c, m) = code(e.jobs.start_backup(backup_req(&src_url, with_s3)).await);
    assert_eq!(c, Code::InvalidArgument);
    assert!(m.contains("repository.s3"), "{m}");
    let (c, m) = code(
        e.jobs
            .start_prune(proto::StartPruneRequest {
                repository: repo.clone(),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(c, Code::InvalidArgument);
    assert!(m.contains("retention"), "{m}");
    let (c, m) = code(
        e.jobs
            .start_restore(restore_req(repo.clone(), "latest", &e.root.join("x.img")))
            .await,
    );
    assert_eq!(c, Code::InvalidArgument);
    assert!(m.contains("snapshot_id"), "{m}");
    let mut req = restore_req(
        repo.clone(),
        "20261202T101500Z-0a1b2c3d",
        &e.root.join("x.img"),
    );
    req.cache = 7;
    let (c, m) = code(e.jobs.start_restore(req).await);
    assert_eq!(c, Code::InvalidArgument);
    assert!(m.contains("cache mode 7"), "{m}");

    // A missing repository: the job fails saying so; the service calls are NOT_FOUND.
    let job = finished(
        e.jobs
            .clone()
            .start_backup(backup_req(&src_url, repo.clone()))
            .await
            .unwrap(),
        &mut e.jobs,
    )
    .await;
    assert_eq!(state(&job), JobState::Failed);
    let error = job.error.unwrap();
    assert_eq!(error.kind, "not_found", "{error:?}");
    assert!(error.message.contains("init_if_missing"), "{error:?}");
    let status = e
        .backups
        .get_repository(proto::GetRepositoryRequest {
            repository: repo.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    // An unknown snapshot of an existing repository.
    e.backups
        .init_repository(proto::InitRepositoryRequest {
            repository: repo.clone(),
            options: small_chunks(),
        })
        .await
        .unwrap();
    let again = e
        .backups
        .init_repository(proto::InitRepositoryRequest {
            repository: repo.clone(),
            options: small_chunks(),
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::AlreadyExists);
    let unknown = "20200101T000000Z-0a1b2c3d";
    let (c, m) = code(
        e.jobs
            .start_restore(restore_req(repo.clone(), unknown, &e.root.join("x.img")))
            .await,
    );
    assert_eq!(c, Code::NotFound, "{m}");
    assert!(m.contains(unknown), "{m}");
    let status = e
        .backups
        .get_snapshot(proto::GetSnapshotRequest {
            repository: repo.clone(),
            id: unknown.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert!(!e.root.join("x.img").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_init_repository_calls_create_one_repository() {
    let mut e = env_with(false).await;
    // Encrypted rounds widen the race: each caller derives a key before writing.
    for (round, key) in [None, file_ref("repo-key"), None, file_ref("repo-key")]
        .into_iter()
        .enumerate()
    {
        let name = format!("repo-{round}");
        let repo = Some(proto::Repository {
            url: e.root.join(&name).display().to_string(),
            key,
            ..Default::default()
        });
        let req = proto::InitRepositoryRequest {
            repository: repo.clone(),
            options: small_chunks(),
        };
        let (mut a, mut b) = (e.backups.clone(), e.backups.clone());
        let (ra, rb) = tokio::join!(
            a.init_repository(req.clone()),
            b.init_repository(req.clone())
        );
        let mut created = Vec::new();
        for r in [ra, rb] {
            match r {
                Ok(info) => created.push(info.into_inner()),
                Err(s) => {
                    assert_eq!(s.code(), Code::AlreadyExists, "round {round}: {s:?}");
                    assert!(s.message().contains(&name), "{s:?}");
                }
            }
        }
        assert_eq!(created.len(), 1, "round {round}: {created:?}");
        let third = e.backups.init_repository(req).await.unwrap_err();
        assert_eq!(third.code(), Code::AlreadyExists, "{third:?}");
        assert!(third.message().contains(&name), "{third:?}");
        // The repository is the winner's, whole: it opens, with the winner's id.
        let info = e
            .backups
            .get_repository(proto::GetRepositoryRequest {
                repository: repo.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.id, created[0].id);
        assert_eq!(info.chunk_size, CHUNK);
        let src = image(&e.root.join(format!("src-{round}.img")), MIB, round as u64);
        let b = backup_result(
            &finished(
                e.jobs
                    .clone()
                    .start_backup(backup_req(&src.display().to_string(), repo))
                    .await
                    .unwrap(),
                &mut e.jobs,
            )
            .await,
        );
        assert_eq!(b.digest.unwrap().hex, blkhash_file(&src));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_whose_backup_was_pruned_during_a_restart_fails_at_once_with_not_found() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("images");
    let data = tmp.path().join("data");
    std::fs::create_dir(&root).unwrap();
    let secrets = secrets_dir(tmp.path());
    let src = image(&root.join("src.img"), 4 * MIB, 9);
    let repo_dir = root.join("repo");
    let repo = dir_repo(&repo_dir);
    let server = ServeProcess::start(Path::new(BIN), &serve_args(&data, &root, &secrets), &[]);
    let mut jobs = connect(server.grpc).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let mut req = backup_req(&src.display().to_string(), repo.clone());
        req.init_if_missing = small_chunks();
        let done = finished(jobs.start_backup(req).await.unwrap(), &mut jobs).await;
        ids.push(backup_result(&done).snapshot_id);
    }
    // A slow target (every write waits 1 s) keeps the restore of the older backup running.
    let slow = NbdServer::nbdkit(
        &["memory", "size=8M", "wdelay=1000ms"],
        &Nbdkit {
            filters: vec!["delay".into()],
            ..Nbdkit::default()
        },
    );
    let mut req = proto::StartRestoreRequest {
        repository: repo.clone(),
        snapshot_id: ids[0].clone(),
        target: endpoint(slow.uri()),
        ..Default::default()
    };
    req.workers = 1;
    req.idempotency_key = "restore-older".into();
    let id = jobs
        .start_restore(req.clone())
        .await
        .unwrap()
        .into_inner()
        .id;
    watch_until(&mut jobs, &id, |j| {
        state(j) == JobState::Running && j.progress.as_ref().map_or(0, |p| p.done_bytes) > 0
    })
    .await;
    server.kill9();

    // While the server is down, a prune deletes the backup being restored.
    let out = Command::new(BIN)
        .args(["backup", "prune", "--keep-last", "1"])
        .arg(&repo_dir)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!repo_dir
        .join("snapshots")
        .join(format!("{}.json", ids[0]))
        .exists());

    let server = ServeProcess::start(Path::new(BIN), &serve_args(&data, &root, &secrets), &[]);
    let mut jobs = connect(server.grpc).await;
    let started = std::time::Instant::now();
    let done = wait_terminal(&mut jobs, &id, LIMIT).await;
    assert_eq!(state(&done), JobState::Failed, "{done:?}");
    // Final at once: no retry after the resumed attempt.
    assert_eq!(done.attempt, 2, "{done:?}\n{}", server.stderr());
    assert!(started.elapsed() < Duration::from_secs(20), "{done:?}");
    let error = done.error.unwrap();
    assert_eq!(error.kind, "not_found", "{error:?}");
    assert!(error.message.contains(&ids[0]), "{error:?}");
    assert!(error.message.contains("repo"), "{error:?}");
    assert!(!server.stderr().contains("retrying"), "{}", server.stderr());
    // A retry of the accepted request gets its job, not a refusal.
    let again = jobs.start_restore(req).await.unwrap().into_inner();
    assert_eq!(again.id, id);
    assert_eq!(state(&again), JobState::Failed);

    // Asked again, StartRestore answers NOT_FOUND naming the backup and the repository.
    let status = jobs
        .start_restore(restore_req(repo.clone(), &ids[0], &root.join("x.img")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains(&ids[0]), "{status:?}");
    assert!(
        status.message().contains(&repo_dir.display().to_string()),
        "{status:?}"
    );
    // The backup that is left restores.
    let dst = root.join("restored.img");
    let r = finished(
        jobs.start_restore(restore_req(repo, &ids[1], &dst))
            .await
            .unwrap(),
        &mut jobs,
    )
    .await;
    restore_result(&r);
    qemu_img_compare(&src, &dst);
}

/// Every page of ListSnapshots with `size` backups a page: the ids, and the page sizes.
async fn all_pages(
    backups: &mut Backups,
    mut req: proto::ListSnapshotsRequest,
    size: u32,
) -> (Vec<String>, Vec<usize>) {
    req.page_size = size;
    let (mut ids, mut sizes) = (Vec::new(), Vec::new());
    loop {
        let page = backups
            .list_snapshots(req.clone())
            .await
            .unwrap()
            .into_inner();
        sizes.push(page.snapshots.len());
        ids.extend(page.snapshots.into_iter().map(|s| s.id));
        if page.next_page_token.is_empty() {
            return (ids, sizes);
        }
        req.page_token = page.next_page_token;
        assert!(sizes.len() < 100, "the pages do not end");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_listed_page_by_page_in_order() {
    let mut e = env_with(false).await;
    let repo_dir = e.root.join("repo");
    let repo = dir_repo(&repo_dir);
    e.backups
        .init_repository(proto::InitRepositoryRequest {
            repository: repo.clone(),
            options: small_chunks(),
        })
        .await
        .unwrap();
    // Seven backups, one after the other: a, b, a, b, a, b, a (b's tagged).
    let mut made: Vec<(String, String)> = Vec::new();
    for i in 0..7u64 {
        if i == 6 {
            // The last one in a second of its own (the damaged manifest below).
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
        let source = if i % 2 == 0 { "a" } else { "b" };
        let src = image(&e.root.join(format!("{source}.img")), CHUNK, i);
        let mut req = backup_req(&src.display().to_string(), repo.clone());
        req.source_id = source.into();
        if source == "b" {
            req.tags.insert("group".into(), "odd".into());
        }
        let done = finished(e.jobs.clone().start_backup(req).await.unwrap(), &mut e.jobs).await;
        made.push((backup_result(&done).snapshot_id, source.into()));
    }
    let all: Vec<String> = made.iter().map(|(id, _)| id.clone()).collect();
    let of = |source: &str| -> Vec<String> {
        made.iter()
            .filter(|(_, s)| s == source)
            .map(|(id, _)| id.clone())
            .collect()
    };
    let list = proto::ListSnapshotsRequest {
        repository: repo.clone(),
        ..Default::default()
    };

    // Oldest first, each once, pages full but the last.
    for size in [1, 2, 3, 7] {
        let (ids, sizes) = all_pages(&mut e.backups, list.clone(), size).await;
        assert_eq!(ids, all, "page size {size}");
        let full = sizes[..sizes.len() - 1].iter().all(|&n| n == size as usize);
        assert!(
            full && sizes.len() == 7usize.div_ceil(size as usize),
            "{sizes:?}"
        );
    }
    let (one_page, _) = all_pages(&mut e.backups, list.clone(), 0).await;
    assert_eq!(one_page, all);
    // Filters page over what they select.
    let by_source = proto::ListSnapshotsRequest {
        source_id: "a".into(),
        ..list.clone()
    };
    for size in [1, 3, 4] {
        let (ids, _) = all_pages(&mut e.backups, by_source.clone(), size).await;
        assert_eq!(ids, of("a"), "page size {size}");
    }
    let by_tag = proto::ListSnapshotsRequest {
        tags: [("group".to_string(), "odd".to_string())].into(),
        ..list.clone()
    };
    let (ids, sizes) = all_pages(&mut e.backups, by_tag.clone(), 2).await;
    assert_eq!(ids, of("b"));
    assert_eq!(sizes, [2, 1]);
    let nothing = proto::ListSnapshotsRequest {
        source_id: "c".into(),
        ..list.clone()
    };
    let (ids, sizes) = all_pages(&mut e.backups, nothing, 2).await;
    assert!(ids.is_empty() && sizes == [0], "{ids:?} {sizes:?}");

    // A token from elsewhere is refused.
    let status = e
        .backups
        .list_snapshots(proto::ListSnapshotsRequest {
            page_token: "yesterday".into(),
            ..list.clone()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("page_token"), "{status:?}");

    // A page reads only its own manifests: with the newest manifest damaged, the first
    // pages still list; the page that holds it says which backup is damaged.
    std::fs::write(
        repo_dir.join("snapshots").join(format!("{}.json", all[6])),
        b"{ not a manifest",
    )
    .unwrap();
    let first = e
        .backups
        .list_snapshots(proto::ListSnapshotsRequest {
            page_size: 2,
            ..list.clone()
        })
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = first.snapshots.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, [all[0].as_str(), all[1].as_str()]);
    let mut req = proto::ListSnapshotsRequest {
        page_size: 2,
        page_token: first.next_page_token,
        ..list.clone()
    };
    let second = e
        .backups
        .list_snapshots(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.snapshots.len(), 2);
    req.page_token = second.next_page_token;
    let third = e
        .backups
        .list_snapshots(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(third.snapshots.len(), 2);
    req.page_token = third.next_page_token;
    let status = e.backups.list_snapshots(req).await.unwrap_err();
    assert_eq!(status.code(), Code::DataLoss, "{status:?}");
    assert!(status.message().contains(&all[6]), "{status:?}");
}

/// A finished backup of `path` into `repo` under `source`.
async fn backed_up(
    e: &mut Env,
    repo: Option<proto::Repository>,
    path: &Path,
    source: &str,
) -> proto::BackupResult {
    let mut req = backup_req(&path.display().to_string(), repo);
    req.source_id = source.into();
    let job = finished(e.jobs.clone().start_backup(req).await.unwrap(), &mut e.jobs).await;
    backup_result(&job)
}

/// A restore of "the latest backup of a source" (`StartRestoreRequest.latest`): the job
/// finds the newest backup of that source (another source's newer backup is not it), or
/// the newest started at or before `as_of`; none such is NOT_FOUND at once, and a request
/// naming both an id and `latest` is refused. Each restore is compared with its image.
#[tokio::test]
async fn a_restore_of_the_latest_backup_of_a_source_at_or_before_a_time() {
    let mut e = env_with(false).await;
    let repo = dir_repo(&e.root.join("repo"));
    e.backups
        .init_repository(proto::InitRepositoryRequest {
            repository: repo.clone(),
            options: small_chunks(),
        })
        .await
        .unwrap();
    let src = image(&e.root.join("src.img"), 4 * MIB, 7);
    let old_copy = e.root.join("src-old.img");
    std::fs::copy(&src, &old_copy).unwrap();
    let first = backed_up(&mut e, repo.clone(), &src, "vms/web1").await;
    // Ids name the second a backup started in: the next one starts in a later second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let between = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    scribble(&src, 0, 0x5a);
    let second = backed_up(&mut e, repo.clone(), &src, "vms/web1").await;
    let other = image(&e.root.join("other.img"), 4 * MIB, 9);
    backed_up(&mut e, repo.clone(), &other, "vms/db").await;

    let latest = |as_of: Option<chrono::DateTime<chrono::Utc>>, dst: &Path| {
        let mut req = restore_req(repo.clone(), "", dst);
        req.latest = Some(proto::LatestBackup {
            source_id: "vms/web1".into(),
            as_of: as_of.map(|t| prost_types::Timestamp {
                seconds: t.timestamp(),
                nanos: t.timestamp_subsec_nanos() as i32,
            }),
        });
        req
    };
    let newest = e.root.join("newest.img");
    let job = finished(
        e.jobs
            .clone()
            .start_restore(latest(None, &newest))
            .await
            .unwrap(),
        &mut e.jobs,
    )
    .await;
    assert_eq!(restore_result(&job).snapshot_id, second.snapshot_id);
    assert_same_image(&src, &newest);

    let then = e.root.join("then.img");
    let job = finished(
        e.jobs
            .clone()
            .start_restore(latest(Some(between), &then))
            .await
            .unwrap(),
        &mut e.jobs,
    )
    .await;
    assert_eq!(restore_result(&job).snapshot_id, first.snapshot_id);
    assert_same_image(&old_copy, &then);

    let before_all = between - chrono::TimeDelta::days(1);
    let refused = e
        .jobs
        .clone()
        .start_restore(latest(Some(before_all), &e.root.join("none.img")))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("no backup of source 'vms/web1' started at or before"),
        "{refused:?}"
    );

    let mut both = latest(None, &e.root.join("both.img"));
    both.snapshot_id = first.snapshot_id.clone();
    let refused = e.jobs.clone().start_restore(both).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
}
