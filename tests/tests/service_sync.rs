//! Syncs through the job service with real gRPC clients (StartSync, a sync schedule,
//! `ferry job sync`), between a directory repository and the in-process S3 server
//! (s3s-fs) in each direction, each copy restored and compared with `qemu-img compare`;
//! the rate limit measured (elapsed time against bytes sent, with a wide margin), inside
//! and outside its time windows; a cancelled sync that leaves no half backup and is
//! resumed; and the repository calls a controller needs: InitRepository of an immutable
//! repository on moto (which enforces S3 Object Lock) and ProtectSnapshot /
//! UnprotectSnapshot against a prune, and the key calls (ListKeys, AddKey, RemoveKey,
//! RotateKey) with restores under each key.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use chrono::Datelike;
use ferry_api::proto::{self, JobState};
use ferry_tests::check::qemu_img_compare;
use ferry_tests::images::{make, Pattern};
use ferry_tests::moto_server::MotoServer;
use ferry_tests::s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};
use ferry_tests::service_support::*;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");
const MIB: u64 = 1024 * 1024;
const CHUNK: u64 = 256 * 1024;
const LIMIT: Duration = Duration::from_secs(180);
const SRC_KEY: &str = "source passphrase, kept secret";
const DST_KEY: &str = "destination passphrase, also secret";
const THIRD_KEY: &str = "a third passphrase for rotations";

type Env = BackupEnv;

async fn env() -> Env {
    let secrets = [
        ("src-key", format!("{SRC_KEY}\n")),
        ("dst-key", format!("{DST_KEY}\n")),
        ("third-key", format!("{THIRD_KEY}\n")),
        ("s3-id", ACCESS_KEY.into()),
        ("s3-secret", SECRET_KEY.into()),
    ];
    BackupEnv::start(&secrets, false).await
}

fn dir_repo(path: &Path, key: Option<&str>) -> proto::Repository {
    proto::Repository {
        url: path.display().to_string(),
        key: key.and_then(file_ref),
        ..Default::default()
    }
}

fn s3_repo(s3: &S3Server, url: &str, key: Option<&str>) -> proto::Repository {
    proto::Repository {
        url: url.into(),
        s3: Some(proto::S3Options {
            endpoint_url: s3.endpoint_url(),
            region: "us-east-1".into(),
            access_key_id: file_ref("s3-id"),
            secret_access_key: file_ref("s3-secret"),
            force_path_style: true,
            ..Default::default()
        }),
        key: key.and_then(file_ref),
    }
}

/// Creates a repository of 256 KiB chunks; `zstd_level` 0 stores chunks uncompressed.
async fn init(e: &mut Env, repo: &proto::Repository, zstd_level: i32) {
    e.backups
        .init_repository(proto::InitRepositoryRequest {
            repository: Some(repo.clone()),
            options: Some(proto::RepositoryInit {
                chunk_size: CHUNK,
                zstd_level: Some(zstd_level),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
}

async fn run(
    mut jobs: Client,
    job: Result<tonic::Response<proto::Job>, tonic::Status>,
) -> proto::Job {
    let id = job.unwrap().into_inner().id;
    wait_terminal(&mut jobs, &id, LIMIT).await
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

async fn backup(e: &mut Env, src: &Path, repo: &proto::Repository) -> String {
    let req = proto::StartBackupRequest {
        source: endpoint(src.display().to_string()),
        repository: Some(repo.clone()),
        source_id: "vm/disk0".into(),
        ..Default::default()
    };
    let job = run(e.jobs.clone(), e.jobs.clone().start_backup(req).await).await;
    succeeded(&job);
    match job.result {
        Some(proto::job::Result::BackupResult(b)) => b.snapshot_id,
        other => panic!("not a backup result: {other:?}"),
    }
}

/// Restores backup `id` of `repo` through a restore job and compares it with `original`.
async fn restore_exact(e: &mut Env, repo: &proto::Repository, id: &str, original: &Path) {
    let dst = e.root.join(format!("restored-{id}.img"));
    let req = proto::StartRestoreRequest {
        repository: Some(repo.clone()),
        snapshot_id: id.into(),
        target: endpoint(dst.display().to_string()),
        ..Default::default()
    };
    let job = run(e.jobs.clone(), e.jobs.clone().start_restore(req).await).await;
    succeeded(&job);
    qemu_img_compare(original, &dst);
    std::fs::remove_file(&dst).unwrap();
}

fn sync_req(src: &proto::Repository, dst: &proto::Repository) -> proto::StartSyncRequest {
    proto::StartSyncRequest {
        source: Some(src.clone()),
        destination: Some(dst.clone()),
        ..Default::default()
    }
}

fn sync_result(job: &proto::Job) -> proto::SyncResult {
    succeeded(job);
    match &job.result {
        Some(proto::job::Result::SyncResult(r)) => r.clone(),
        other => panic!("not a sync result: {other:?}"),
    }
}

async fn snapshot_ids(e: &mut Env, repo: &proto::Repository) -> Vec<String> {
    e.backups
        .list_snapshots(proto::ListSnapshotsRequest {
            repository: Some(repo.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshots
        .into_iter()
        .map(|s| s.id)
        .collect()
}

/// Every file under `dir` as lossy text (the job store, for secret checks).
fn walk(dir: &Path) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.push_str(&walk(&p));
        } else if let Ok(bytes) = std::fs::read(&p) {
            out.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    out
}

/// Overwrites 64 KiB at `offset` with random bytes.
fn scribble(path: &Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let noise = noise(offset);
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&noise, offset).unwrap();
    f.sync_all().unwrap();
}

fn noise(seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..64 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_jobs_copy_between_a_directory_and_s3_both_ways_and_the_copies_restore_exact() {
    let mut e = env().await;
    let s3 = S3Server::start().await;
    s3.create_bucket("replica");

    // Two backups of an image (the second after a change) in an encrypted directory.
    let primary = dir_repo(&e.root.join("primary"), Some("src-key"));
    init(&mut e, &primary, 1).await;
    let disk = e.root.join("disk.img");
    make(&disk, Pattern::HalfData, 12 * MIB + 4096, 33).unwrap();
    let first = backup(&mut e, &disk, &primary).await;
    let v1 = e.root.join("disk-v1.img");
    std::fs::copy(&disk, &v1).unwrap();
    scribble(&disk, 3 * MIB);
    scribble(&disk, 9 * MIB + 8192);
    let second = backup(&mut e, &disk, &primary).await;

    // Into S3, under the destination's own key (chunks re-encrypted).
    let replica = s3_repo(&s3, "s3://replica/site-b", Some("dst-key"));
    init(&mut e, &replica, 1).await;
    let job = run(
        e.jobs.clone(),
        e.jobs
            .clone()
            .start_sync(sync_req(&primary, &replica))
            .await,
    )
    .await;
    assert_eq!(job.kind, proto::JobKind::Sync as i32);
    let r = sync_result(&job);
    // Backups made within one second sort by their ids' random part, not by time.
    let mut copied = r.copied.clone();
    copied.sort();
    let mut made = vec![first.clone(), second.clone()];
    made.sort();
    assert_eq!((r.backups_copied, r.backups_present, copied), (2, 0, made));
    assert!(r.chunks_copied > 0 && !r.same_keys, "{r:?}");
    assert!(
        r.chunks_reused > 0,
        "the second backup shares chunks: {r:?}"
    );
    let p = job.progress.unwrap();
    assert_eq!(p.total_bytes, 2 * (12 * MIB + 4096), "{p:?}");
    assert_eq!(p.done_bytes, p.total_bytes, "{p:?}");
    assert!(p.data_bytes > 0 && p.zero_bytes > 0, "{p:?}");
    assert_eq!(
        snapshot_ids(&mut e, &replica).await,
        [first.clone(), second.clone()]
    );
    restore_exact(&mut e, &replica, &first, &v1).await;
    restore_exact(&mut e, &replica, &second, &disk).await;

    // Again: nothing to copy.
    let job = run(
        e.jobs.clone(),
        e.jobs
            .clone()
            .start_sync(sync_req(&primary, &replica))
            .await,
    )
    .await;
    let r = sync_result(&job);
    assert_eq!(
        (r.backups_copied, r.backups_present, r.chunks_copied),
        (0, 2, 0)
    );

    // Back from S3 into a new directory with the same passphrase as the replica's (given
    // no destination key, the source's reference opens it; its master key is its own, so
    // chunks are re-encrypted), only the latest backup by a keep rule.
    let restored_site = dir_repo(&e.root.join("site-c"), Some("dst-key"));
    init(&mut e, &restored_site, 0).await;
    let mut req = sync_req(
        &replica,
        &proto::Repository {
            key: None,
            ..restored_site.clone()
        },
    );
    req.retention = Some(proto::Retention {
        keep_last: 1,
        ..Default::default()
    });
    req.source_id = "vm/disk0".into();
    let job = run(e.jobs.clone(), e.jobs.clone().start_sync(req).await).await;
    let r = sync_result(&job);
    assert_eq!(r.copied, [second.as_str()]);
    restore_exact(&mut e, &restored_site, &second, &disk).await;

    // A wrong destination key fails the job with the reason, and no secret shows anywhere.
    let wrong = proto::Repository {
        key: file_ref("src-key"),
        ..replica.clone()
    };
    let job = run(
        e.jobs.clone(),
        e.jobs.clone().start_sync(sync_req(&primary, &wrong)).await,
    )
    .await;
    assert_eq!(state(&job), JobState::Failed);
    assert_eq!(
        job.error.as_ref().unwrap().kind,
        "permission_denied",
        "{job:?}"
    );
    let records = format!(
        "{:?}",
        e.jobs
            .list_jobs(proto::ListJobsRequest::default())
            .await
            .unwrap()
            .into_inner()
    );
    let metrics = scrape_metrics(e.service.metrics_addr().unwrap()).await;
    let stored = walk(&e.dir.path().join("data"));
    for text in [&records, &metrics, &stored] {
        for secret in [SRC_KEY, DST_KEY, SECRET_KEY] {
            assert!(!text.contains(secret), "a secret leaked");
        }
    }

    // Bad requests are refused at once, naming the field.
    let status = e
        .jobs
        .start_sync(sync_req(&primary, &dir_repo(Path::new("/etc/ferry"), None)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("destination"), "{status:?}");
    let status = e
        .jobs
        .start_sync(sync_req(&primary, &primary))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}

/// `init_destination_if_missing`: a missing destination is created sharing the source's
/// keys (chunks copied as stored) with its own passphrase added as one more key; a sync
/// that stopped between the creation and the key's addition (its marker left) has the key
/// added by the next; a passphrase that does not open an existing destination is refused,
/// never added; without the flag a missing destination is not found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_creates_a_missing_destination_sharing_the_sources_keys() {
    let mut e = env().await;
    let primary = dir_repo(&e.root.join("primary"), Some("src-key"));
    init(&mut e, &primary, 1).await;
    let disk = e.root.join("disk.img");
    make(&disk, Pattern::HalfData, 8 * MIB, 7).unwrap();
    let id = backup(&mut e, &disk, &primary).await;
    let keys_of = |e: &mut Env, repo: &proto::Repository| {
        let mut backups = e.backups.clone();
        let repo = repo.clone();
        async move {
            backups
                .list_keys(proto::ListKeysRequest {
                    repository: Some(repo),
                })
                .await
                .unwrap()
                .into_inner()
                .keys
                .len()
        }
    };

    let missing = dir_repo(&e.root.join("nowhere"), None);
    let job = run(
        e.jobs.clone(),
        e.jobs
            .clone()
            .start_sync(sync_req(&primary, &missing))
            .await,
    )
    .await;
    assert_eq!(state(&job), JobState::Failed);
    assert_eq!(job.error.as_ref().unwrap().kind, "not_found", "{job:?}");
    assert!(!e.root.join("nowhere").join("config").exists());

    // Created in one go with its own passphrase: two keys, either restores.
    let second = dir_repo(&e.root.join("second"), Some("dst-key"));
    let mut req = sync_req(&primary, &second);
    req.init_destination_if_missing = true;
    let r = sync_result(&run(e.jobs.clone(), e.jobs.clone().start_sync(req).await).await);
    assert_eq!(r.copied, [id.as_str()]);
    assert!(r.same_keys, "chunks copied as stored: {r:?}");
    assert!(!e.root.join("second/init-from-key-owed").exists());
    restore_exact(&mut e, &second, &id, &disk).await;
    let under_source_key = dir_repo(&e.root.join("second"), Some("src-key"));
    restore_exact(&mut e, &under_source_key, &id, &disk).await;
    assert_eq!(
        keys_of(&mut e, &second).await,
        2,
        "the source's key and its own"
    );

    // Another passphrase for it now: refused, not added.
    let wrong = dir_repo(&e.root.join("second"), Some("third-key"));
    let mut req = sync_req(&primary, &wrong);
    req.init_destination_if_missing = true;
    let job = run(e.jobs.clone(), e.jobs.clone().start_sync(req).await).await;
    assert_eq!(state(&job), JobState::Failed);
    assert_eq!(
        job.error.as_ref().unwrap().kind,
        "permission_denied",
        "{job:?}"
    );
    assert_eq!(keys_of(&mut e, &second).await, 2, "no key added");

    // Created without a key of its own, then a sync stopped before adding one (its
    // marker left): the next sync adds its passphrase.
    let replica = dir_repo(&e.root.join("replica"), Some("dst-key"));
    let mut req = sync_req(&primary, &dir_repo(&e.root.join("replica"), None));
    req.init_destination_if_missing = true;
    sync_result(&run(e.jobs.clone(), e.jobs.clone().start_sync(req).await).await);
    std::fs::write(e.root.join("replica/init-from-key-owed"), b"").unwrap();
    let mut req = sync_req(&primary, &replica);
    req.init_destination_if_missing = true;
    let r = sync_result(&run(e.jobs.clone(), e.jobs.clone().start_sync(req).await).await);
    assert_eq!((r.backups_copied, r.backups_present), (0, 1), "{r:?}");
    assert!(!e.root.join("replica/init-from-key-owed").exists());
    restore_exact(&mut e, &replica, &id, &disk).await;
}

/// The weekday name of `days` days from now (UTC).
fn day_from_now(days: i64) -> String {
    let d = (chrono::Utc::now() + chrono::Duration::days(days)).weekday();
    ["mon", "tue", "wed", "thu", "fri", "sat", "sun"][d.num_days_from_monday() as usize].into()
}

/// Runs a sync of `src` into a new directory repository named `name` with `limit`;
/// returns the bytes sent and the seconds the job ran.
async fn timed_sync(
    e: &mut Env,
    src: &proto::Repository,
    name: &str,
    limit: impl FnOnce(&mut proto::StartSyncRequest),
) -> (u64, f64) {
    let dst = dir_repo(&e.root.join(name), None);
    init(e, &dst, 0).await;
    let mut req = sync_req(src, &dst);
    limit(&mut req);
    let started = Instant::now();
    let job = run(e.jobs.clone(), e.jobs.clone().start_sync(req).await).await;
    let seconds = started.elapsed().as_secs_f64();
    let r = sync_result(&job);
    assert_eq!(r.backups_copied, 1);
    (r.bytes_copied, seconds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_bounds_a_sync_inside_its_windows_only_and_a_cancelled_sync_resumes() {
    let mut e = env().await;
    // 4 MiB of random bytes, stored uncompressed: 16 chunks to send.
    let src = dir_repo(&e.root.join("src"), None);
    init(&mut e, &src, 0).await;
    let disk = e.root.join("disk.img");
    make(&disk, Pattern::Random, 4 * MIB, 7).unwrap();
    let id = backup(&mut e, &disk, &src).await;
    const RATE: u64 = 512 * 1024;

    // Limited by a window that holds now (every day, the whole day): at least the time
    // the bytes take at the rate (less a margin for timer slack).
    let (bytes, seconds) = timed_sync(&mut e, &src, "limited", |r| {
        r.rate_limit = RATE;
        r.rate_limit_windows = vec![proto::RateLimitWindow {
            start: "00:00".into(),
            end: "24:00".into(),
            ..Default::default()
        }];
    })
    .await;
    assert!(bytes >= 4 * MIB, "{bytes}");
    let at_rate = bytes as f64 / RATE as f64;
    assert!(
        seconds >= 0.8 * at_rate,
        "{bytes} bytes at {RATE} B/s take {at_rate:.1} s; the sync took {seconds:.2} s"
    );

    // A window on another day: unlimited now, far quicker than at the rate.
    let (bytes, seconds) = timed_sync(&mut e, &src, "outside", |r| {
        r.rate_limit = RATE;
        r.rate_limit_windows = vec![proto::RateLimitWindow {
            days: vec![day_from_now(3)],
            start: "00:00".into(),
            end: "24:00".into(),
            ..Default::default()
        }];
    })
    .await;
    let at_rate = bytes as f64 / RATE as f64;
    assert!(
        seconds < 0.5 * at_rate,
        "outside its window the limit must not apply: {seconds:.2} s for {bytes} bytes"
    );

    // A slow sync cancelled midway: it ends cancelled, the destination lists nothing,
    // and the next sync sends only what is missing and restores exact.
    let dst = dir_repo(&e.root.join("cancelled"), None);
    init(&mut e, &dst, 0).await;
    let mut req = sync_req(&src, &dst);
    req.rate_limit = 256 * 1024;
    let id_job = e
        .jobs
        .clone()
        .start_sync(req)
        .await
        .unwrap()
        .into_inner()
        .id;
    let running = watch_until(&mut e.jobs.clone(), &id_job, |j| {
        j.progress.is_some_and(|p| p.data_bytes >= MIB)
    })
    .await;
    assert_eq!(running.progress.unwrap().total_bytes, 4 * MIB);
    let asked = Instant::now();
    let job = e
        .jobs
        .cancel_job(proto::CancelJobRequest { id: id_job.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&job), JobState::Cancelled, "{job:?}");
    assert!(asked.elapsed() < Duration::from_secs(5));
    assert!(snapshot_ids(&mut e, &dst).await.is_empty());
    let job = run(
        e.jobs.clone(),
        e.jobs.clone().start_sync(sync_req(&src, &dst)).await,
    )
    .await;
    let r = sync_result(&job);
    assert_eq!(r.backups_copied, 1);
    assert!(
        r.chunks_reused > 0 && r.chunks_copied < 16,
        "the chunks sent before the cancel are reused: {r:?}"
    );
    restore_exact(&mut e, &dst, &id, &disk).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_schedule_and_the_cli_client_start_sync_jobs() {
    let mut e = env().await;
    let src = dir_repo(&e.root.join("src"), Some("src-key"));
    let dst = dir_repo(&e.root.join("dst"), Some("dst-key"));
    init(&mut e, &src, 1).await;
    init(&mut e, &dst, 1).await;
    let disk = e.root.join("disk.img");
    make(&disk, Pattern::HalfData, 6 * MIB, 5).unwrap();
    let id = backup(&mut e, &disk, &src).await;

    let mut schedules = connect_schedules(e.service.grpc_addr()).await;
    let mut template = sync_req(&src, &dst);
    template.rate_limit = 64 * MIB;
    template.rate_limit_windows = vec![proto::RateLimitWindow {
        days: vec!["mon".into(), "tue".into()],
        start: "22:00".into(),
        end: "06:00".into(),
        time_zone: "Europe/Oslo".into(),
    }];
    let schedule = schedules
        .create_schedule(proto::CreateScheduleRequest {
            name: "replicate".into(),
            cron: "@daily".into(),
            template: Some(proto::JobTemplate {
                request: Some(proto::job_template::Request::Sync(template.clone())),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let ran = schedules
        .run_schedule_now(proto::RunScheduleNowRequest {
            id: schedule.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let job = wait_terminal(&mut e.jobs, &ran.job.unwrap().id, LIMIT).await;
    assert_eq!(sync_result(&job).copied, [id.as_str()]);
    assert_eq!(job.labels["ferry.schedule"], "replicate");
    restore_exact(&mut e, &dst, &id, &disk).await;

    // A template with a bad window is refused when the schedule is created.
    template.rate_limit_windows[0].start = "25:00".into();
    let status = schedules
        .create_schedule(proto::CreateScheduleRequest {
            name: "broken".into(),
            cron: "@daily".into(),
            template: Some(proto::JobTemplate {
                request: Some(proto::job_template::Request::Sync(template)),
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("rate_limit_windows[0].start"),
        "{status:?}"
    );

    // `ferry job sync` (a second backup first, so there is something to copy).
    let second = backup(&mut e, &disk, &src).await;
    let out = Command::new(BIN)
        .args(["job", "--server"])
        .arg(format!("http://{}", e.service.grpc_addr()))
        .args(["--json", "sync"])
        .arg(e.root.join("src"))
        .arg(e.root.join("dst"))
        .args(["--key-file", "src-key", "--dest-key-file", "dst-key"])
        .args([
            "--limit-rate",
            "100M",
            "--limit-window",
            "mon-fri 08:00-18:00",
        ])
        .args(["--limit-time-zone", "Europe/Oslo", "--watch"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(v["kind"], "sync", "{v}");
    assert_eq!(v["state"], "succeeded", "{v}");
    assert_eq!(v["result"]["backups_copied"], 1, "{v}");
    assert_eq!(v["result"]["copied"][0], second.as_str(), "{v}");
    restore_exact(&mut e, &dst, &second, &disk).await;

    // `ferry schedule create --sync`: the template holds both keys by reference, the keep
    // rule, the limit and its windows in their time zone; a run finds nothing to copy.
    let out = Command::new(BIN)
        .args(["schedule", "--server"])
        .arg(format!("http://{}", e.service.grpc_addr()))
        .args(["create", "nightly-sync", "--cron", "@daily", "--sync"])
        .arg(e.root.join("src"))
        .arg(e.root.join("dst"))
        .args(["--repo-key-file", "src-key", "--dest-key-file", "dst-key"])
        .args(["--keep-last", "1", "--rate-limit", "100M"])
        .args([
            "--limit-window",
            "sat,sun 00:00-24:00",
            "--limit-time-zone",
            "Europe/Oslo",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let schedule = schedules
        .get_schedule(proto::GetScheduleRequest {
            id: "nightly-sync".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let Some(proto::job_template::Request::Sync(t)) = schedule.template.and_then(|t| t.request)
    else {
        panic!("not a sync template")
    };
    assert_eq!(t.destination.unwrap().key, file_ref("dst-key"));
    assert_eq!(t.retention.unwrap().keep_last, 1);
    assert_eq!(t.rate_limit, 100 * MIB);
    assert_eq!(t.rate_limit_windows[0].days, ["sat", "sun"]);
    assert_eq!(t.rate_limit_windows[0].time_zone, "Europe/Oslo");
    let ran = schedules
        .run_schedule_now(proto::RunScheduleNowRequest {
            id: "nightly-sync".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let job = wait_terminal(&mut e.jobs, &ran.job.unwrap().id, LIMIT).await;
    let r = sync_result(&job);
    assert_eq!((r.backups_copied, r.backups_present), (0, 1), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_repository_makes_an_immutable_repository_and_refuses_what_cannot_be_one() {
    let mut e = env().await;
    let moto = MotoServer::start();
    moto.create_locked_bucket("locked");
    moto.create_bucket("plain");
    let repo = |bucket: &str| proto::Repository {
        url: format!("s3://{bucket}/repo"),
        s3: Some(proto::S3Options {
            endpoint_url: moto.endpoint_url(),
            region: "us-east-1".into(),
            access_key_id: file_ref("s3-id"),
            secret_access_key: file_ref("s3-secret"),
            force_path_style: true,
            ..Default::default()
        }),
        key: None,
    };
    let init = |repository: proto::Repository, days: u32, mode: proto::ImmutableMode| {
        proto::InitRepositoryRequest {
            repository: Some(repository),
            options: Some(proto::RepositoryInit {
                chunk_size: CHUNK,
                immutable_days: days,
                immutable_mode: mode as i32,
                ..Default::default()
            }),
        }
    };
    let info = e
        .backups
        .init_repository(init(repo("locked"), 2, proto::ImmutableMode::Governance))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.immutable_days, 2);
    assert_eq!(info.immutable_mode, proto::ImmutableMode::Governance as i32);
    let got = e
        .backups
        .get_repository(proto::GetRepositoryRequest {
            repository: Some(repo("locked")),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (got.immutable_days, got.immutable_mode),
        (2, info.immutable_mode)
    );

    // A backup into it (every version written with its retention) restores.
    let disk = e.root.join("disk.img");
    make(&disk, Pattern::HalfData, 2 * MIB, 3).unwrap();
    let id = backup(&mut e, &disk, &repo("locked")).await;
    restore_exact(&mut e, &repo("locked"), &id, &disk).await;

    for (request, what) in [
        (
            init(repo("plain"), 2, proto::ImmutableMode::Compliance),
            "Object Lock",
        ),
        (
            init(
                dir_repo(&e.root.join("dir"), None),
                2,
                proto::ImmutableMode::Unspecified,
            ),
            "only an s3:// repository",
        ),
        (
            init(repo("plain"), 0, proto::ImmutableMode::Governance),
            "options.immutable_mode needs options.immutable_days",
        ),
        (
            init(repo("plain"), 40_000, proto::ImmutableMode::Unspecified),
            "options.immutable_days 40000",
        ),
    ] {
        let status = e.backups.init_repository(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(what), "{what}: {status:?}");
    }
    // The refused plain bucket holds no repository.
    let status = e
        .backups
        .get_repository(proto::GetRepositoryRequest {
            repository: Some(repo("plain")),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protected_backup_survives_prunes_until_it_is_unprotected() {
    let mut e = env().await;
    let repo = dir_repo(&e.root.join("repo"), Some("src-key"));
    init(&mut e, &repo, 1).await;
    let disk = e.root.join("disk.img");
    make(&disk, Pattern::HalfData, 2 * MIB, 4).unwrap();
    let old = backup(&mut e, &disk, &repo).await;
    scribble(&disk, 0);
    let new = backup(&mut e, &disk, &repo).await;
    let protect = |id: &str| proto::ProtectSnapshotRequest {
        repository: Some(repo.clone()),
        id: id.into(),
    };

    let r = e
        .backups
        .protect_snapshot(protect(&old))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.was_protected && r.snapshot.unwrap().protected);
    let again = e.backups.protect_snapshot(protect(&old)).await.unwrap();
    assert!(again.into_inner().was_protected);
    let listed = e
        .backups
        .list_snapshots(proto::ListSnapshotsRequest {
            repository: Some(repo.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshots;
    let flags: Vec<(String, bool)> = listed.iter().map(|s| (s.id.clone(), s.protected)).collect();
    assert_eq!(flags, [(old.clone(), true), (new.clone(), false)]);

    let prune = || proto::StartPruneRequest {
        repository: Some(repo.clone()),
        retention: Some(proto::Retention {
            keep_last: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    let job = run(e.jobs.clone(), e.jobs.clone().start_prune(prune()).await).await;
    succeeded(&job);
    let Some(proto::job::Result::PruneResult(p)) = &job.result else {
        panic!("{job:?}")
    };
    assert!(p.removed.is_empty(), "{p:?}");
    assert!(p
        .kept
        .iter()
        .any(|k| k.id == old && k.reasons.contains(&"protected".into())));

    let r = e
        .backups
        .unprotect_snapshot(protect(&old))
        .await
        .unwrap()
        .into_inner();
    assert!(r.was_protected && !r.snapshot.unwrap().protected);
    let got = e
        .backups
        .get_snapshot(proto::GetSnapshotRequest {
            repository: Some(repo.clone()),
            id: old.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!got.protected);
    let job = run(e.jobs.clone(), e.jobs.clone().start_prune(prune()).await).await;
    let Some(proto::job::Result::PruneResult(p)) = &job.result else {
        panic!("{job:?}")
    };
    assert_eq!(
        p.removed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        [old.as_str()]
    );
    restore_exact(&mut e, &repo, &new, &disk).await;

    // An unknown backup, a bad id.
    let status = e
        .backups
        .protect_snapshot(protect("20200101T000000Z-00000000"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let status = e
        .backups
        .protect_snapshot(protect("nope"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_listed_added_removed_and_rotated_over_grpc() {
    let mut e = env().await;
    let path = e.root.join("repo");
    let with = |key: &str| dir_repo(&path, Some(key));
    init(&mut e, &with("src-key"), 1).await;
    let disk = e.root.join("disk.img");
    make(&disk, Pattern::HalfData, 2 * MIB, 6).unwrap();
    let id = backup(&mut e, &disk, &with("src-key")).await;
    let list = |e: &mut Env, key: &str| {
        let mut backups = e.backups.clone();
        let repository = Some(with(key));
        async move {
            backups
                .list_keys(proto::ListKeysRequest { repository })
                .await
                .map(|r| r.into_inner().keys)
        }
    };
    let opens = |e: &mut Env, key: &str| {
        let mut backups = e.backups.clone();
        let repository = Some(with(key));
        async move {
            backups
                .get_repository(proto::GetRepositoryRequest { repository })
                .await
                .map(|_| ())
                .map_err(|s| s.code())
        }
    };

    let keys = list(&mut e, "src-key").await.unwrap();
    assert_eq!(keys.len(), 1);
    assert!(keys[0].current && keys[0].id.len() == 16, "{keys:?}");
    let first = keys[0].id.clone();

    let added = e
        .backups
        .add_key(proto::AddKeyRequest {
            repository: Some(with("src-key")),
            new_key: file_ref("dst-key"),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!added.current && added.id != first, "{added:?}");
    assert_eq!(added.master_key, keys[0].master_key, "the same master key");
    assert_eq!(list(&mut e, "dst-key").await.unwrap().len(), 2);
    restore_exact(&mut e, &with("dst-key"), &id, &disk).await;

    // A key cannot remove itself; another key can.
    let remove = |key: &str, id: &str| proto::RemoveKeyRequest {
        repository: Some(with(key)),
        key_id: id.into(),
    };
    let status = e
        .backups
        .remove_key(remove("src-key", &first))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let removed = e
        .backups
        .remove_key(remove("dst-key", &first))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (removed.removed.as_str(), removed.keys_left),
        (first.as_str(), 1)
    );
    assert_eq!(opens(&mut e, "src-key").await, Err(Code::PermissionDenied));

    // Rotation replaces the key in use; the backups stay readable under the new one.
    let rotated = e
        .backups
        .rotate_key(proto::RotateKeyRequest {
            repository: Some(with("dst-key")),
            new_key: file_ref("third-key"),
            new_master_key: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rotated.removed, added.id);
    assert!(rotated.new_master_key.is_empty());
    assert_eq!(opens(&mut e, "dst-key").await, Err(Code::PermissionDenied));
    assert_eq!(opens(&mut e, "third-key").await, Ok(()));
    restore_exact(&mut e, &with("third-key"), &id, &disk).await;

    // The last key stays; a missing new key, an unknown key id and an unencrypted
    // repository are refused with the reason.
    let last = rotated.added.unwrap().id;
    let status = e
        .backups
        .remove_key(remove("third-key", &last))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = e
        .backups
        .remove_key(remove("third-key", "0123456789abcdef"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let status = e
        .backups
        .add_key(proto::AddKeyRequest {
            repository: Some(with("third-key")),
            new_key: None,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("new_key"), "{status:?}");
    let plain = dir_repo(&e.root.join("plain"), None);
    init(&mut e, &plain, 1).await;
    let status = e
        .backups
        .list_keys(proto::ListKeysRequest {
            repository: Some(plain),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    let metrics = scrape_metrics(e.service.metrics_addr().unwrap()).await;
    for secret in [SRC_KEY, DST_KEY, THIRD_KEY] {
        assert!(!metrics.contains(secret));
    }
}

/// Runs `ferry job [--json] key ARGS...` against the service; its status, stdout, stderr.
fn key_cli(e: &Env, json: bool, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(["job", "--server"])
        .arg(format!("http://{}", e.service.grpc_addr()));
    if json {
        cmd.arg("--json");
    }
    let out = cmd.arg("key").args(args).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    for secret in [SRC_KEY, DST_KEY, THIRD_KEY] {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "a passphrase was printed: {stdout} {stderr}"
        );
    }
    (out.status.success(), stdout, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_client_lists_adds_removes_and_rotates_keys() {
    let mut e = env().await;
    let path = e.root.join("repo");
    let repo = path.display().to_string();
    let with = |key: &str| dir_repo(&path, Some(key));
    init(&mut e, &with("src-key"), 1).await;
    let disk = e.root.join("disk.img");
    make(&disk, Pattern::HalfData, 2 * MIB, 7).unwrap();
    let id = backup(&mut e, &disk, &with("src-key")).await;
    let opens = |e: &Env, key: &str| {
        let mut backups = e.backups.clone();
        let repository = Some(with(key));
        async move {
            backups
                .get_repository(proto::GetRepositoryRequest { repository })
                .await
                .map(|_| ())
                .map_err(|s| s.code())
        }
    };
    let json = |text: &str| -> serde_json::Value {
        serde_json::from_str(text.trim()).unwrap_or_else(|err| panic!("{err}: {text}"))
    };

    let (ok, out, err) = key_cli(&e, true, &["list", &repo, "--key-file", "src-key"]);
    assert!(ok, "{err}");
    let keys = json(&out);
    assert_eq!(keys.as_array().map(Vec::len), Some(1), "{keys}");
    assert_eq!(keys[0]["current"], true, "{keys}");
    let first = keys[0]["id"].as_str().unwrap().to_string();

    // A key added over the CLI opens the repository and restores its backup.
    assert_eq!(opens(&e, "dst-key").await, Err(Code::PermissionDenied));
    let (ok, out, err) = key_cli(
        &e,
        false,
        &[
            "add",
            &repo,
            "--key-file",
            "src-key",
            "--new-key-file",
            "dst-key",
        ],
    );
    assert!(ok, "{err}");
    let added = out
        .trim()
        .strip_prefix("added key ")
        .unwrap_or_else(|| panic!("{out}"));
    assert!(added.len() == 16 && added != first, "{out}");
    assert_eq!(opens(&e, "dst-key").await, Ok(()));
    restore_exact(&mut e, &with("dst-key"), &id, &disk).await;
    let (ok, out, err) = key_cli(&e, false, &["list", &repo, "--key-file", "dst-key"]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("{added} (in use)"))),
        "{out}"
    );

    // A key cannot remove itself (the reason, a failure exit); another key removes it,
    // and it no longer opens the repository.
    let (ok, _, err) = key_cli(
        &e,
        false,
        &["remove", &repo, "--key-file", "src-key", &first],
    );
    assert!(!ok && err.contains("InvalidArgument"), "{err}");
    let (ok, out, err) = key_cli(
        &e,
        true,
        &["remove", &repo, "--key-file", "dst-key", &first],
    );
    assert!(ok, "{err}");
    let removed = json(&out);
    assert_eq!(
        (removed["removed"].as_str(), removed["keys"].as_u64()),
        (Some(first.as_str()), Some(1))
    );
    assert_eq!(opens(&e, "src-key").await, Err(Code::PermissionDenied));

    // Rotation replaces the key in use by the new one; the backup stays readable.
    let (ok, out, err) = key_cli(
        &e,
        true,
        &[
            "rotate",
            &repo,
            "--key-file",
            "dst-key",
            "--new-key-file",
            "third-key",
        ],
    );
    assert!(ok, "{err}");
    let rotated = json(&out);
    assert_eq!(rotated["removed"].as_str(), Some(added), "{rotated}");
    assert!(rotated["new_master_key"].is_null(), "{rotated}");
    assert_eq!(opens(&e, "dst-key").await, Err(Code::PermissionDenied));
    assert_eq!(opens(&e, "third-key").await, Ok(()));
    restore_exact(&mut e, &with("third-key"), &id, &disk).await;

    // A new key is required by the CLI itself; a key file the server lacks is refused
    // with the reason.
    let (ok, _, err) = key_cli(&e, false, &["add", &repo, "--key-file", "third-key"]);
    assert!(!ok && err.contains("--new-key"), "{err}");
    let (ok, _, err) = key_cli(
        &e,
        false,
        &[
            "add",
            &repo,
            "--key-file",
            "third-key",
            "--new-key-file",
            "missing",
        ],
    );
    assert!(!ok && err.contains("missing"), "{err}");
}
