//! Changed-block tracking through the CSI SnapshotMetadata service, against the test
//! kit's stand-in of the sidecar (the upstream proto over TLS with a test CA, a token and
//! an audience, answers computed from real snapshot files): `ferry backup create
//! --snapshot-metadata`, the job service's `StartBackupRequest.snapshot_metadata`, and
//! the request the operator builds for a Backup of a VolumeSnapshot, sent over its link
//! to a real mover.
//!
//! Each snapshot is a sparse file the service answers from, and a fully allocated copy of
//! it is what the backup reads (a block device shows no holes): so the bytes read show
//! what the service's answer saved. Every backup is restored and compared with
//! `qemu-img compare`, and its block hash with the image's.

use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_testkit::snapshot_metadata::{Fault, MetadataServer, MetadataServerConfig, Style};
use ferry_tests::bin::{wait_with_deadline, Run, DEFAULT_DEADLINE};
use ferry_tests::check::{blkhash_file, qemu_img_compare, require_tool};
use ferry_tests::{ferry, scratch_dir};
use serde_json::Value;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 64 * MIB;
const CHUNK: u64 = 256 * 1024;
const TOKEN: &str = "tok-7f3a9c1e-secret";
const AUDIENCE: &str = "snapshot-metadata.example.com";
const NAMESPACE: &str = "apps";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Writes `len` bytes of a pattern seeded by `seed` at `offset` (the file keeps its holes
/// elsewhere).
fn write_at(path: &Path, offset: u64, len: u64, seed: u8) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap();
    if file.metadata().unwrap().len() < SIZE {
        file.set_len(SIZE).unwrap();
    }
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect();
    file.write_all_at(&data, offset).unwrap();
}

/// A fully allocated copy of `sparse` (what a block device of the snapshot reads like).
fn dense_copy(sparse: &Path, dense: &Path) {
    let out = Command::new("cp")
        .args(["--sparse=never", s(sparse), s(dense)])
        .output()
        .unwrap();
    assert!(out.status.success(), "cp: {out:?}");
}

/// Two snapshots of one volume: `snap-1` (handle `h-1`) and `snap-2` (handle `h-2`),
/// whose changes are `CHANGES`.
struct Volume {
    dir: tempfile::TempDir,
    repo: PathBuf,
    ca: PathBuf,
    token: PathBuf,
    dev1: PathBuf,
    dev2: PathBuf,
}

/// What changed from snap-1 to snap-2: (offset, length). Chunks touched: 4, 80..=81, 160.
const CHANGES: [(u64, u64); 3] = [
    (MIB + 4096, 65536),
    (20 * MIB + 100_000, 300_000),
    (40 * MIB, 4096),
];

fn changed_chunk_bytes() -> u64 {
    let mut chunks = std::collections::BTreeSet::new();
    for (offset, len) in CHANGES {
        for c in offset / CHUNK..=(offset + len - 1) / CHUNK {
            chunks.insert(c);
        }
    }
    chunks.len() as u64 * CHUNK
}

impl Volume {
    fn new() -> Self {
        require_tool("qemu-img", "qemu-utils");
        let dir = scratch_dir();
        let snap1 = dir.path().join("snap-1.img");
        write_at(&snap1, 0, 8 * MIB, 1);
        write_at(&snap1, 20 * MIB, MIB, 2);
        let snap2 = dir.path().join("snap-2.img");
        let out = Command::new("cp")
            .args(["--sparse=always", s(&snap1), s(&snap2)])
            .output()
            .unwrap();
        assert!(out.status.success(), "cp: {out:?}");
        for (i, (offset, len)) in CHANGES.into_iter().enumerate() {
            write_at(&snap2, offset, len, 10 + i as u8);
        }
        let (dev1, dev2) = (dir.path().join("dev-1.img"), dir.path().join("dev-2.img"));
        dense_copy(&snap1, &dev1);
        dense_copy(&snap2, &dev2);
        let token = dir.path().join("token");
        std::fs::write(&token, format!("  {TOKEN}\n")).unwrap();
        let repo = dir.path().join("repo");
        ferry!()
            .run(["backup", "init", "--chunk-size", "256K", s(&repo)])
            .assert_success();
        Self {
            ca: dir.path().join("ca.pem"),
            repo,
            token,
            dev1,
            dev2,
            dir,
        }
    }

    fn config(&self) -> MetadataServerConfig {
        MetadataServerConfig::new(AUDIENCE, TOKEN, NAMESPACE)
            .with_snapshot("snap-1", "h-1", self.dir.path().join("snap-1.img"))
            .with_snapshot("snap-2", "h-2", self.dir.path().join("snap-2.img"))
    }

    async fn serve(&self, config: MetadataServerConfig) -> MetadataServer {
        let server = MetadataServer::start(config).await.unwrap();
        std::fs::write(&self.ca, server.ca_pem()).unwrap();
        server
    }

    /// `ferry backup create --json DEV REPO --snapshot-metadata URL ... EXTRA`.
    async fn backup(&self, url: &str, dev: &Path, extra: &[&str]) -> Run {
        let mut args: Vec<String> = [
            "backup",
            "create",
            "--no-progress",
            "--json",
            "--source-id",
            "pvc/data",
            "--snapshot-metadata",
            url,
            "--namespace",
            NAMESPACE,
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.extend(extra.iter().map(|a| a.to_string()));
        args.push(s(dev).into());
        args.push(s(&self.repo).into());
        let mut cmd = ferry!().command(&args);
        cmd.env("FERRY_SNAPSHOT_METADATA_CA_FILE", &self.ca)
            .env("FERRY_SNAPSHOT_METADATA_TOKEN_FILE", &self.token);
        let description = format!("{cmd:?}");
        let child = cmd.spawn().unwrap();
        tokio::task::spawn_blocking(move || {
            wait_with_deadline(child, DEFAULT_DEADLINE, description)
        })
        .await
        .unwrap()
    }

    async fn full(&self, url: &str) -> Value {
        let run = self
            .backup(
                url,
                &self.dev1,
                &["--snapshot", "snap-1", "--snapshot-id", "h-1"],
            )
            .await;
        run.assert_success();
        json(&run)
    }

    async fn incremental(&self, url: &str) -> (Value, Run) {
        self.incremental_with(url, &[]).await
    }

    async fn incremental_with(&self, url: &str, extra: &[&str]) -> (Value, Run) {
        let mut args = vec!["--snapshot", "snap-2", "--snapshot-id", "h-2"];
        args.extend_from_slice(extra);
        let run = self.backup(url, &self.dev2, &args).await;
        run.assert_success();
        (json(&run), run)
    }

    /// Restores backup `id` and compares it with `dev` byte for byte.
    async fn check_restore(&self, id: &str, dev: &Path, name: &str) {
        let out = self.dir.path().join(name);
        let (repo, out2) = (self.repo.clone(), out.clone());
        let id = id.to_string();
        let run = tokio::task::spawn_blocking(move || {
            ferry!().run([
                "backup",
                "restore",
                "--no-progress",
                s(&repo),
                id.as_str(),
                s(&out2),
            ])
        })
        .await
        .unwrap();
        run.assert_success();
        qemu_img_compare(dev, &out);
        std::fs::remove_file(&out).unwrap();
    }
}

fn json(run: &Run) -> Value {
    let last = run.stdout.trim().lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {run}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_and_incremental_read_only_allocated_and_changed_ranges() {
    let volume = Volume::new();
    let server = volume.serve(volume.config()).await;
    let url = server.url();

    let first = volume.full(&url).await;
    assert_eq!(
        first["changed_block_tracking"], "SnapshotMetadata",
        "{first}"
    );
    assert_eq!(first["snapshot_id"], "h-1");
    assert_eq!(first["block_hash"], blkhash_file(&volume.dev1).as_str());
    // Only the allocated 9 MiB are read, although the device is fully allocated.
    let read = first["bytes_read"].as_u64().unwrap();
    assert!(read > 0 && read <= 9 * MIB, "read {read} bytes: {first}");
    volume
        .check_restore(first["id"].as_str().unwrap(), &volume.dev1, "r1.img")
        .await;

    let (second, _) = volume.incremental(&url).await;
    assert_eq!(second["parent"], first["id"], "{second}");
    assert_eq!(second["changed_block_tracking"], "SnapshotMetadata");
    assert!(second["full_reason"].is_null(), "{second}");
    assert_eq!(second["block_hash"], blkhash_file(&volume.dev2).as_str());
    let read = second["bytes_read"].as_u64().unwrap();
    let changed = changed_chunk_bytes();
    assert!(
        read > 0 && read * 100 <= changed * 105,
        "read {read} bytes, the changed chunks hold {changed}: {second}"
    );
    assert_eq!(second["chunks_read"], changed / CHUNK);
    volume
        .check_restore(second["id"].as_str().unwrap(), &volume.dev2, "r2.img")
        .await;
    assert_eq!(
        server.requests().iter().map(|r| r.rpc).collect::<Vec<_>>(),
        ["allocated", "delta"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_length_streams_cut_mid_way_are_resumed() {
    let volume = Volume::new();
    let mut config = volume.config().with_style(Style::Fixed(65536));
    config.max_results = 16;
    let server = volume.serve(config).await;
    let url = server.url();

    server.set_fault(Fault::StopAfter {
        messages: 3,
        times: 2,
    });
    let first = volume.full(&url).await;
    assert_eq!(
        first["changed_block_tracking"], "SnapshotMetadata",
        "{first}"
    );
    assert_eq!(first["block_hash"], blkhash_file(&volume.dev1).as_str());
    let read = first["bytes_read"].as_u64().unwrap();
    assert!(read <= 9 * MIB, "read {read} bytes: {first}");
    volume
        .check_restore(first["id"].as_str().unwrap(), &volume.dev1, "r1.img")
        .await;
    // Cut after 3 messages of 16 blocks of 64 KiB, twice: resumed at 3 MiB, then 6 MiB.
    let offsets: Vec<i64> = server
        .requests()
        .iter()
        .map(|r| r.starting_offset)
        .collect();
    assert_eq!(offsets, [0, 3 * MIB as i64, 6 * MIB as i64]);

    server.set_fault(Fault::StopAfter {
        messages: 1,
        times: 1,
    });
    let (second, _) = volume.incremental(&url).await;
    assert_eq!(
        second["changed_block_tracking"], "SnapshotMetadata",
        "{second}"
    );
    assert_eq!(second["block_hash"], blkhash_file(&volume.dev2).as_str());
    let read = second["bytes_read"].as_u64().unwrap();
    assert!(
        read * 100 <= changed_chunk_bytes() * 105,
        "read {read}: {second}"
    );
    volume
        .check_restore(second["id"].as_str().unwrap(), &volume.dev2, "r2.img")
        .await;
    let deltas: Vec<i64> = server
        .requests()
        .iter()
        .filter(|r| r.rpc == "delta")
        .map(|r| r.starting_offset)
        .collect();
    assert_eq!(deltas.len(), 2, "{deltas:?}");
    assert!(deltas[1] > 0, "{deltas:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_replies_fall_back_to_change_digests() {
    let volume = Volume::new();
    let server = volume.serve(volume.config()).await;
    let url = server.url();
    let first = volume.full(&url).await;
    assert_eq!(first["changed_block_tracking"], "SnapshotMetadata");

    for (fault, reason) in [
        (Fault::OutOfOrder, "out of order"),
        (Fault::Overlapping, "overlaps the previous one"),
        (Fault::PastCapacity, "past the volume's capacity"),
        (
            Fault::TinyExtents { count: 1_100_000 },
            "more than 1048576 separate ranges",
        ),
    ] {
        server.set_fault(fault);
        let parent = first["id"].as_str().unwrap();
        let (second, run) = volume.incremental_with(&url, &["--parent", parent]).await;
        let why = second["full_reason"].as_str().unwrap_or_default();
        assert!(why.contains(reason), "{fault:?}: {second}");
        assert!(why.contains("comparing change digests"), "{second}");
        assert!(run.stderr.contains("warning"), "{fault:?}: {run}");
        assert_eq!(second["changed_block_tracking"], "ChangeDigests");
        assert_eq!(second["parent"], first["id"]);
        assert_eq!(second["block_hash"], blkhash_file(&volume.dev2).as_str());
        volume
            .check_restore(second["id"].as_str().unwrap(), &volume.dev2, "r.img")
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_tokens_unknown_bases_and_no_service_fall_back() {
    let volume = Volume::new();
    let mut config = volume.config();
    config
        .tokens
        .insert("tok-other-audience".into(), "another.example.com".into());
    let server = volume.serve(config).await;
    let url = server.url();
    let first = volume.full(&url).await;

    // A token the service does not know: unauthenticated, and the token never shown.
    std::fs::write(&volume.token, "tok-wrong-4711").unwrap();
    let (second, run) = volume.incremental(&url).await;
    let why = second["full_reason"].as_str().unwrap_or_default();
    assert!(why.contains("unauthenticated"), "{second}");
    assert_eq!(second["parent"], first["id"]);
    assert_eq!(second["changed_block_tracking"], "ChangeDigests");
    assert_eq!(second["block_hash"], blkhash_file(&volume.dev2).as_str());
    assert!(!run.stdout.contains("tok-wrong-4711") && !run.stderr.contains("tok-wrong-4711"));
    volume
        .check_restore(second["id"].as_str().unwrap(), &volume.dev2, "r.img")
        .await;

    // A token for another audience.
    std::fs::write(&volume.token, "tok-other-audience").unwrap();
    let (third, run) = volume.incremental(&url).await;
    let why = third["full_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("unauthenticated") && why.contains("audience"),
        "{third}"
    );
    assert!(
        !run.stdout.contains("tok-other-audience") && !run.stderr.contains("tok-other-audience")
    );

    // A base other than the snapshot the parent was made from: not asked, since its delta
    // would be applied onto the parent's data.
    std::fs::write(&volume.token, TOKEN).unwrap();
    let run = volume
        .backup(
            &url,
            &volume.dev2,
            &["--snapshot", "snap-2", "--base-snapshot-id", "h-1"],
        )
        .await;
    run.assert_success();
    let why = json(&run)["full_reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        why.contains("was made from snapshot h-2, not from the base h-1 given"),
        "{why}"
    );

    // A parent that recorded no snapshot, and a base the service does not know.
    volume
        .backup(&url, &volume.dev2, &["--snapshot", "snap-2"])
        .await
        .assert_success();
    let run = volume
        .backup(
            &url,
            &volume.dev2,
            &["--snapshot", "snap-2", "--base-snapshot-id", "h-gone"],
        )
        .await;
    run.assert_success();
    let fourth = json(&run);
    let why = fourth["full_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("does not know") && why.contains("h-gone"),
        "{fourth}"
    );
    assert_eq!(fourth["block_hash"], blkhash_file(&volume.dev2).as_str());
    assert!(!run.stdout.contains(TOKEN) && !run.stderr.contains(TOKEN));

    // No service at all: a full backup reads the whole device.
    drop(server);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let run = volume
        .backup(
            &url,
            &volume.dev1,
            &["--snapshot", "snap-1", "--parent", "none"],
        )
        .await;
    run.assert_success();
    let fifth = json(&run);
    let why = fifth["full_reason"].as_str().unwrap_or_default();
    assert!(why.contains("unreachable"), "{fifth}");
    assert_eq!(fifth["bytes_read"], SIZE);
    assert!(fifth["changed_block_tracking"].is_null());
    assert_eq!(fifth["block_hash"], blkhash_file(&volume.dev1).as_str());
    volume
        .check_restore(fifth["id"].as_str().unwrap(), &volume.dev1, "r5.img")
        .await;
}

/// A backup job of the service asking `server` about `snapshot` (recorded as `handle`),
/// reading `dev`, with the token in the secrets file `token`.
fn job_request(
    volume: &Volume,
    server: &MetadataServer,
    dev: &Path,
    (snapshot, handle): (&str, &str),
    token: &str,
) -> ferry_api::proto::StartBackupRequest {
    use ferry_api::proto;
    proto::StartBackupRequest {
        source: ferry_tests::service_support::endpoint(s(dev)),
        repository: Some(proto::Repository {
            url: s(&volume.repo).into(),
            ..Default::default()
        }),
        source_id: "pvc/data".into(),
        snapshot_metadata: Some(proto::SnapshotMetadataSource {
            address: server.url(),
            ca_certificate: server.ca_pem().as_bytes().to_vec(),
            token: ferry_tests::service_support::file_ref(token),
            snapshot: snapshot.into(),
            namespace: NAMESPACE.into(),
            base_snapshot_id: String::new(),
        }),
        volume_snapshot_handle: handle.into(),
        ..Default::default()
    }
}

/// Runs a backup job to its end and returns its result.
async fn backup_job(
    jobs: &mut ferry_tests::service_support::Client,
    request: ferry_api::proto::StartBackupRequest,
) -> (ferry_api::proto::Job, ferry_api::proto::BackupResult) {
    use ferry_api::proto;
    let id = jobs.start_backup(request).await.unwrap().into_inner().id;
    let job = ferry_tests::service_support::wait_terminal(jobs, &id, DEFAULT_DEADLINE).await;
    match &job.result {
        Some(proto::job::Result::BackupResult(r)) => (job.clone(), r.clone()),
        other => panic!("not a finished backup ({other:?}): {job:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_service_reads_only_what_the_service_answers_and_falls_back_on_a_bad_token() {
    use ferry_tests::service_support::{connect, start_in_process, test_config};
    let volume = Volume::new();
    let server = volume.serve(volume.config()).await;
    let secrets = volume.dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(secrets.join("sm-token"), format!("{TOKEN}\n")).unwrap();
    std::fs::write(secrets.join("other-token"), "tok-not-for-this-audience\n").unwrap();
    let mut cfg = test_config(&volume.dir.path().join("data"), volume.dir.path());
    cfg.secrets_dir = Some(secrets);
    let service = start_in_process(cfg).await;
    let mut jobs = connect(service.grpc_addr()).await;

    let full = job_request(
        &volume,
        &server,
        &volume.dev1,
        ("snap-1", "h-1"),
        "sm-token",
    );
    let (_, first) = backup_job(&mut jobs, full).await;
    assert_eq!(
        first.changed_block_tracking, "SnapshotMetadata",
        "{first:?}"
    );
    assert_eq!(
        first.full_reason, "there is no earlier backup of pvc/data",
        "{first:?}"
    );
    assert!(
        first.bytes_read > 0 && first.bytes_read <= 9 * MIB,
        "{first:?}"
    );
    volume
        .check_restore(&first.snapshot_id, &volume.dev1, "j1.img")
        .await;

    let next = job_request(
        &volume,
        &server,
        &volume.dev2,
        ("snap-2", "h-2"),
        "sm-token",
    );
    let (_, second) = backup_job(&mut jobs, next).await;
    assert_eq!(second.parent_id, first.snapshot_id, "{second:?}");
    assert_eq!(
        second.changed_block_tracking, "SnapshotMetadata",
        "{second:?}"
    );
    assert!(second.full_reason.is_empty(), "{second:?}");
    let changed = changed_chunk_bytes();
    assert_eq!(second.chunks_read, changed / CHUNK, "{second:?}");
    assert!(second.bytes_read * 100 <= changed * 105, "{second:?}");
    let hash = second
        .digest
        .as_ref()
        .map(|d| d.hex.clone())
        .unwrap_or_default();
    assert_eq!(hash, blkhash_file(&volume.dev2), "{second:?}");
    volume
        .check_restore(&second.snapshot_id, &volume.dev2, "j2.img")
        .await;
    assert_eq!(
        server.requests().iter().map(|r| r.rpc).collect::<Vec<_>>(),
        ["allocated", "delta"],
        "the delta was asked since the parent's recorded handle h-1"
    );

    // A token the service refuses: the backup is made all the same, comparing change
    // digests, and says why; the token is in neither the result nor the job record.
    let refused = job_request(
        &volume,
        &server,
        &volume.dev2,
        ("snap-2", "h-3"),
        "other-token",
    );
    let (job, third) = backup_job(&mut jobs, refused).await;
    assert_eq!(third.changed_block_tracking, "ChangeDigests", "{third:?}");
    assert!(third.full_reason.contains("not used"), "{third:?}");
    assert_eq!(
        third.bytes_read,
        64 * MIB,
        "the whole volume read: {third:?}"
    );
    volume
        .check_restore(&third.snapshot_id, &volume.dev2, "j3.img")
        .await;
    let record = format!("{job:?}");
    assert!(
        !record.contains("tok-not-for") && !record.contains(TOKEN),
        "{record}"
    );

    // A token file that is not there: the same fallback, with the reason.
    let missing = job_request(
        &volume,
        &server,
        &volume.dev2,
        ("snap-2", "h-4"),
        "no-such-token",
    );
    let (_, fourth) = backup_job(&mut jobs, missing).await;
    assert_eq!(fourth.changed_block_tracking, "ChangeDigests", "{fourth:?}");
    assert!(fourth.full_reason.contains("no-such-token"), "{fourth:?}");
}

/// The request the operator builds for a Backup of a VolumeSnapshot whose driver has a
/// SnapshotMetadataService (what `ferry operator` looked up: address, CA, handle), sent
/// over the operator's link to a real mover whose `--secrets-dir` holds the minted token
/// where the pod projects it: the first backup reads only the allocated ranges, the
/// second only the delta since the handle the first recorded, and the status the
/// operator writes from the mover's report says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_request_reads_only_the_delta_on_a_real_mover() {
    use ferry_api::proto;
    use ferry_core::Secret;
    use ferry_operator::controller::{GrpcMoverLink, JobState, MoverAddress, MoverKind, MoverLink};
    use ferry_operator::crd::{
        Backup, BackupRepositorySpec, BackupStatus, MetadataLookup, MetadataService, VolumeMode,
    };
    use ferry_operator::mover::backup_request::backup_request;
    use ferry_operator::mover::ResolvedPvc;
    use futures_util::StreamExt;

    let volume = Volume::new();
    let server = volume.serve(volume.config()).await;
    // Where the pod's projected ServiceAccount token for the service's audience lands.
    let secrets = volume.dir.path().join("mover-secrets");
    let token_file = secrets.join(ferry_operator::mover::layout::SNAPSHOT_METADATA_TOKEN_FILE);
    std::fs::create_dir_all(token_file.parent().unwrap()).unwrap();
    std::fs::write(&token_file, TOKEN).unwrap();
    let mut cfg = ferry_server::config::ServiceConfig::new(volume.dir.path().join("mover-data"));
    cfg.grpc_listen = "127.0.0.1:0".parse().unwrap();
    cfg.metrics_listen = None;
    cfg.allow_roots = vec![volume.dir.path().to_path_buf()];
    cfg.auth_token = Some(Secret::new("t0ken"));
    cfg.secrets_dir = Some(secrets);
    let service = ferry_server::server::start(cfg).await.unwrap();
    let mover = MoverAddress {
        namespace: NAMESPACE.into(),
        pod: "data-backup-fbk-1".into(),
        ip: service.grpc_addr().ip().to_string(),
        port: service.grpc_addr().port(),
        token: "t0ken".into(),
    };
    let link = GrpcMoverLink::default();

    let mut last_status = BackupStatus::default();
    for (n, snapshot, handle, dev) in [
        (1, "snap-1", "h-1", &volume.dev1),
        (2, "snap-2", "h-2", &volume.dev2),
    ] {
        let mut backup: Backup = serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "Backup",
            "metadata": {"name": format!("data-{n}"), "namespace": NAMESPACE,
                         "uid": format!("uid-{n}")},
            "spec": {"sourcePVC": "data-src", "repository": "site-a", "sourceId": "pvc/data",
                     "volumeSnapshot": snapshot},
        }))
        .unwrap();
        backup.spec.resolved_repository = Some(BackupRepositorySpec {
            url: Some("s3://unused/prefix".into()),
            s3: None,
            pvc: None,
            encryption: None,
            initialize: None,
        });
        backup.spec.resolved_snapshot_metadata = Some(MetadataLookup::Service(MetadataService {
            driver: "hostpath.csi.k8s.io".into(),
            address: server.url(),
            ca_pem: server.ca_pem().as_bytes().to_vec(),
            audience: AUDIENCE.into(),
            snapshot_handle: handle.into(),
        }));
        let pvcs = [ResolvedPvc::new("data-src", VolumeMode::Block)];
        let mut request = backup_request(&backup, &pvcs).unwrap();
        assert!(request.snapshot_metadata.is_some(), "{request:?}");
        // Inside a pod these are /dev/ferry/data-src and the repository's URL (the pod
        // spec's own tests cover that mapping); here, the local device file and directory.
        request.source = ferry_tests::service_support::endpoint(s(dev));
        request.repository = Some(proto::Repository {
            url: s(&volume.repo).into(),
            ..Default::default()
        });
        let job = ferry_operator::controller::JobRequest::Backup(Box::new(request));
        let started = link.start(&mover, &job).await.unwrap();
        let mut stream = link.watch(&mover, &started.id).await.unwrap();
        let mut report = None;
        while let Some(r) = stream.next().await {
            let r = r.unwrap();
            let end = r.state.is_terminal();
            report = Some(r);
            if end {
                break;
            }
        }
        let report = report.unwrap();
        assert_eq!(report.state, JobState::Succeeded, "{report:?}");
        let mut status = BackupStatus::default();
        backup.succeed(&mut status, std::slice::from_ref(&report));
        assert_eq!(
            status.changed_block_tracking.as_deref(),
            Some("SnapshotMetadata"),
            "{status:?}"
        );
        assert_eq!(status.snapshot_handle.as_deref(), Some(handle));
        let read = status.bytes_read.unwrap();
        if n == 1 {
            assert!(read > 0 && read <= 9 * MIB, "{status:?}");
            let why = status.full_reason.as_deref().unwrap_or_default();
            assert!(why.contains("no earlier backup"), "{status:?}");
        } else {
            assert_eq!(status.full_reason, None, "{status:?}");
            assert_eq!(status.parent_id, last_status.snapshot_id, "{status:?}");
            assert!(read * 100 <= changed_chunk_bytes() * 105, "{status:?}");
        }
        volume
            .check_restore(
                status.snapshot_id.as_deref().unwrap(),
                dev,
                &format!("o{n}.img"),
            )
            .await;
        last_status = status;
    }
    // A delta against any other base than h-1 would have failed and fallen back.
    assert_eq!(
        server.requests().iter().map(|r| r.rpc).collect::<Vec<_>>(),
        ["allocated", "delta"]
    );
}
