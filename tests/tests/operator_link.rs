//! The operator's gRPC link to its movers ([`GrpcMoverLink`]) against a real job service
//! in this process, sending the ferry-api requests the operator builds: a verified fan-out
//! copy, the same start again answered with the same job, a checksum, a wrong token
//! refused, a cancel of nothing running; and the backup jobs of the Backup and Restore
//! kinds: a backup, an incremental one, a prune, a restore, the copy into a secondary
//! repository and the prune there, a pruned snapshot refused.
//! They live here, not in ferry-operator, because they need ferry-server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ferry_api::proto;
use ferry_core::Secret;
use ferry_operator::controller::{
    GrpcMoverLink, JobReport, JobRequest, JobState, LinkError, MoverAddress, MoverLink,
    PruneSummary,
};
use ferry_operator::mover::request::{OWNER_UID_LABEL, TARGET_LABEL};
use ferry_server::config::ServiceConfig;
use ferry_server::server::{self, RunningService};
use futures_util::StreamExt;

/// A mover's job service configuration: on a free loopback port, allowed to use `root`,
/// taking the token `t0ken`.
fn mover_config(dir: &Path, root: &Path) -> ServiceConfig {
    let mut cfg = ServiceConfig::new(dir.join("data"));
    cfg.grpc_listen = "127.0.0.1:0".parse().unwrap();
    cfg.metrics_listen = None;
    cfg.allow_roots = vec![root.to_path_buf()];
    cfg.auth_token = Some(Secret::new("t0ken"));
    cfg
}

/// The address of mover pod `p` in namespace `ns` that reaches `service`.
fn address_of(service: &RunningService) -> MoverAddress {
    let addr = service.grpc_addr();
    MoverAddress {
        namespace: "ns".into(),
        pod: "p".into(),
        ip: addr.ip().to_string(),
        port: addr.port(),
        token: "t0ken".into(),
    }
}

/// A job service allowed to use `root`, and the mover address that reaches it.
async fn mover_service(dir: &Path, root: &Path) -> (RunningService, MoverAddress) {
    let service = server::start(mover_config(dir, root)).await.unwrap();
    let mover = address_of(&service);
    (service, mover)
}

/// The last report of a job, once it ended.
async fn last(link: &GrpcMoverLink, mover: &MoverAddress, id: &str) -> JobReport {
    let mut stream = link.watch(mover, id).await.unwrap();
    let mut last = None;
    while let Some(r) = stream.next().await {
        let r = r.unwrap();
        let end = r.state.is_terminal();
        last = Some(r);
        if end {
            break;
        }
    }
    last.expect("at least one report")
}

fn file(p: &Path) -> proto::Endpoint {
    proto::Endpoint {
        url: p.display().to_string(),
        ..proto::Endpoint::default()
    }
}

fn labels(uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(OWNER_UID_LABEL.to_string(), uid.to_string())])
}

/// The link against a real job service in this process: a verified copy, the same
/// start again (another resume_from) answered with the same job, a checksum, a wrong
/// token refused, a cancel of nothing running.
#[tokio::test]
async fn drives_a_real_job_service() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let (service, mover) = mover_service(dir.path(), &root).await;
    let src = root.join("src.img");
    let dst = root.join("dst.img");
    let dst2 = root.join("dst2.img");
    let bytes: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&src, &bytes).unwrap();
    let link = GrpcMoverLink::default();
    let request = proto::StartTransferRequest {
        source: Some(file(&src)),
        target: Some(file(&dst)),
        more_targets: vec![file(&dst2)],
        options: Some(proto::TransferOptions {
            verify: true,
            verify_algorithm: proto::HashAlgorithm::Sha256 as i32,
            ..proto::TransferOptions::default()
        }),
        idempotency_key: "uid/0,1".into(),
        labels: BTreeMap::from([
            (OWNER_UID_LABEL.to_string(), "uid".to_string()),
            (TARGET_LABEL.to_string(), "0,1".to_string()),
        ]),
        priority: 0,
        refuse_if_target_busy: true,
        resume_from: None,
    };
    let job = JobRequest::Transfer(Box::new(request.clone()));
    let started = link.start(&mover, &job).await.unwrap();
    let again = JobRequest::Transfer(Box::new(proto::StartTransferRequest {
        resume_from: Some(proto::Checkpoint {
            size: 3 << 20,
            committed: vec![proto::Range {
                start: 0,
                end: 1 << 20,
            }],
        }),
        ..request
    }));
    assert_eq!(link.start(&mover, &again).await.unwrap().id, started.id);

    let copied = last(&link, &mover, &started.id).await;
    assert_eq!(copied.state, JobState::Succeeded, "{copied:?}");
    assert_eq!(std::fs::read(&dst).unwrap(), bytes);
    assert_eq!(std::fs::read(&dst2).unwrap(), bytes);
    let targets: Vec<(usize, JobState)> =
        copied.targets.iter().map(|t| (t.index, t.state)).collect();
    assert_eq!(
        targets,
        [(0, JobState::Succeeded), (1, JobState::Succeeded)]
    );
    let source_digest = copied.source_digest.clone().unwrap();
    assert!(source_digest.starts_with("sha256:"), "{source_digest}");
    assert_eq!(
        copied.target_digest.as_deref(),
        Some(source_digest.as_str())
    );
    for t in &copied.targets {
        assert_eq!(t.digest.as_deref(), Some(source_digest.as_str()), "{t:?}");
    }
    assert_eq!(copied.progress.total_bytes, 3 << 20);

    let checksum = JobRequest::Checksum(Box::new(proto::StartChecksumRequest {
        source: Some(file(&dst)),
        options: Some(proto::ChecksumOptions {
            algorithm: proto::HashAlgorithm::Sha256 as i32,
            ..proto::ChecksumOptions::default()
        }),
        idempotency_key: "uid-c".into(),
        labels: labels("uid-c"),
        priority: 0,
    }));
    let started = link.start(&mover, &checksum).await.unwrap();
    let summed = last(&link, &mover, &started.id).await;
    assert_eq!(summed.source_digest, Some(source_digest));

    let wrong = MoverAddress {
        token: "wrong".into(),
        ..mover.clone()
    };
    assert!(matches!(
        link.start(&wrong, &checksum).await,
        Err(LinkError::Rejected(_))
    ));
    link.cancel(&mover, "uid").await.unwrap();
    service.shutdown().await;
}

/// A backup request of `src` into `repo` for the resource of uid `uid`.
fn backup(src: &Path, repo: &proto::Repository, uid: &str) -> JobRequest {
    JobRequest::Backup(Box::new(proto::StartBackupRequest {
        source: Some(file(src)),
        repository: Some(repo.clone()),
        init_if_missing: Some(proto::RepositoryInit::default()),
        source_id: "vms/web1".into(),
        parent: "auto".into(),
        tags: BTreeMap::from([("vm".into(), "web1".into())]),
        idempotency_key: format!("{uid}/backup"),
        labels: labels(uid),
        ..proto::StartBackupRequest::default()
    }))
}

/// A restore request of `snapshot_id` from `repo` into `target`.
fn restore(repo: &proto::Repository, snapshot_id: &str, target: PathBuf, uid: &str) -> JobRequest {
    JobRequest::Restore(Box::new(proto::StartRestoreRequest {
        repository: Some(repo.clone()),
        snapshot_id: snapshot_id.into(),
        target: Some(file(&target)),
        idempotency_key: format!("{uid}/restore"),
        labels: labels(uid),
        refuse_if_target_busy: true,
        ..proto::StartRestoreRequest::default()
    }))
}

/// Backup jobs through the link against a real job service in this process: a
/// backup into a directory repository it creates, a second backup on top of it, a
/// prune keeping the last one, and a restore of the kept snapshot, whose bytes and
/// block hash are the source's.
#[tokio::test]
async fn drives_backups_through_a_real_job_service() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("repo")).unwrap();
    let (service, mover) = mover_service(dir.path(), &root).await;
    let link = GrpcMoverLink::default();
    let src = root.join("src.img");
    let mut bytes: Vec<u8> = (0..12u32 << 20).map(|i| (i % 251) as u8).collect();
    // The second 4 MiB chunk is all zeroes: never stored.
    bytes[(4 << 20)..(8 << 20)].fill(0);
    std::fs::write(&src, &bytes).unwrap();
    let repo = proto::Repository {
        url: root.join("repo").display().to_string(),
        s3: None,
        key: None,
    };
    let started = link
        .start(&mover, &backup(&src, &repo, "b1"))
        .await
        .unwrap();
    let first = last(&link, &mover, &started.id).await;
    assert_eq!(first.state, JobState::Succeeded, "{first:?}");
    let first = first.backup.expect("a backup summary");
    assert!(first.parent_id.is_empty(), "{first:?}");
    assert_eq!(first.bytes_new + first.bytes_reused, 8 << 20, "{first:?}");
    assert!(first.block_hash.starts_with("blkhash:"), "{first:?}");
    // The same request again: the same job.
    assert_eq!(
        link.start(&mover, &backup(&src, &repo, "b1"))
            .await
            .unwrap()
            .id,
        started.id
    );
    let started = link
        .start(&mover, &backup(&src, &repo, "b2"))
        .await
        .unwrap();
    let second = last(&link, &mover, &started.id).await.backup.unwrap();
    assert_eq!(second.parent_id, first.snapshot_id);
    assert_eq!(second.bytes_new, 0, "nothing changed: {second:?}");
    assert_eq!(second.block_hash, first.block_hash);

    let prune = JobRequest::Prune(Box::new(proto::StartPruneRequest {
        repository: Some(repo.clone()),
        source_id: "vms/web1".into(),
        retention: Some(proto::Retention {
            keep_last: 1,
            ..proto::Retention::default()
        }),
        idempotency_key: "b2/prune".into(),
        labels: labels("b2"),
        ..proto::StartPruneRequest::default()
    }));
    let started = link.start(&mover, &prune).await.unwrap();
    let pruned = last(&link, &mover, &started.id).await;
    assert_eq!(pruned.state, JobState::Succeeded, "{pruned:?}");
    assert_eq!(
        pruned.prune,
        Some(PruneSummary {
            kept: 1,
            removed: 1,
            removed_ids: vec![first.snapshot_id.clone()],
            kept_ids: vec![second.snapshot_id.clone()],
        })
    );

    let dst = root.join("restored.img");
    let request = restore(&repo, &second.snapshot_id, dst.clone(), "r1");
    let started = link.start(&mover, &request).await.unwrap();
    let restored = last(&link, &mover, &started.id).await;
    assert_eq!(restored.state, JobState::Succeeded, "{restored:?}");
    assert_eq!(
        restored.restored_snapshot.as_deref(),
        Some(second.snapshot_id.as_str())
    );
    assert_eq!(std::fs::read(&dst).unwrap(), bytes);

    // The newest backup of the source, as the Restore of a sourceId asks for it: the
    // operator's own request, the mover finding the snapshot.
    let newest = root.join("newest.img");
    std::fs::write(&newest, []).unwrap();
    let repo_spec = ferry_operator::crd::BackupRepositorySpec {
        url: Some("s3://unused/prefix".into()),
        s3: None,
        pvc: None,
        encryption: None,
        initialize: None,
    };
    let mut request = ferry_operator::mover::backup_request::restore_request(
        "r3",
        &repo_spec,
        &ferry_operator::crd::SnapshotChoice::Latest {
            source_id: "vms/web1".into(),
            as_of: None,
        },
        &ferry_operator::mover::ResolvedPvc::new("newest", ferry_operator::crd::VolumeMode::Block),
    );
    // Inside a pod: /dev/ferry/newest and the repository's URL; here the local files.
    request.target = Some(file(&newest));
    request.repository = Some(repo.clone());
    let started = link
        .start(&mover, &JobRequest::Restore(Box::new(request)))
        .await
        .unwrap();
    let restored = last(&link, &mover, &started.id).await;
    assert_eq!(restored.state, JobState::Succeeded, "{restored:?}");
    assert_eq!(
        restored.restored_snapshot.as_deref(),
        Some(second.snapshot_id.as_str())
    );
    assert_eq!(std::fs::read(&newest).unwrap(), bytes);

    // The operator's copy into a secondary repository it creates, then its prune there:
    // the copy restores exact.
    let secondary = root.join("secondary");
    let (sync, prune_there) = secondary_requests(&repo_spec);
    let mut sync = sync;
    // Inside a pod: the repositories' URLs; here the local directories.
    sync.source = Some(repo.clone());
    sync.destination = Some(proto::Repository {
        url: secondary.display().to_string(),
        s3: None,
        key: None,
    });
    assert!(sync.init_destination_if_missing);
    let started = link
        .start(&mover, &JobRequest::Sync(Box::new(sync.clone())))
        .await
        .unwrap();
    let synced = last(&link, &mover, &started.id).await;
    assert_eq!(synced.state, JobState::Succeeded, "{synced:?}");
    let summary = synced.sync.expect("a sync summary");
    assert_eq!((summary.copied, summary.present), (1, 0), "{summary:?}");
    assert!(
        summary.chunks_copied > 0 && summary.bytes_copied > 0,
        "{summary:?}"
    );
    let mut prune_there = prune_there;
    prune_there.repository = sync.destination.clone();
    let started = link
        .start(&mover, &JobRequest::Prune(Box::new(prune_there)))
        .await
        .unwrap();
    let pruned = last(&link, &mover, &started.id).await;
    assert_eq!(pruned.prune.map(|p| (p.kept, p.removed)), Some((1, 0)));
    let copied = root.join("copied.img");
    let request = restore(
        sync.destination.as_ref().unwrap(),
        &second.snapshot_id,
        copied.clone(),
        "r4",
    );
    let started = link.start(&mover, &request).await.unwrap();
    let restored = last(&link, &mover, &started.id).await;
    assert_eq!(restored.state, JobState::Succeeded, "{restored:?}");
    assert_eq!(std::fs::read(&copied).unwrap(), bytes);

    // The pruned snapshot is gone: restoring it fails, saying so.
    let gone = restore(&repo, &first.snapshot_id, root.join("gone.img"), "r2");
    match link.start(&mover, &gone).await {
        Err(LinkError::Rejected(e)) => assert!(e.contains("NotFound"), "{e}"),
        Ok(started) => {
            let failed = last(&link, &mover, &started.id).await;
            assert_eq!(failed.state, JobState::Failed, "{failed:?}");
            assert_eq!(failed.error.unwrap().kind, "not_found");
        }
        Err(e) => panic!("{e}"),
    }
    service.shutdown().await;
}

/// The copy and the prune of a Backup (uid `b3`, of `vms/web1`) whose secondary
/// repository keeps its last 3 snapshots and is created by the first copy, as the
/// operator builds them.
fn secondary_requests(
    repo: &ferry_operator::crd::BackupRepositorySpec,
) -> (proto::StartSyncRequest, proto::StartPruneRequest) {
    use ferry_operator::crd::{Backup, BackupSpec, Retention, Secondary};
    let mut b = Backup::new(
        "web1-now",
        BackupSpec {
            source_pvc: "web1".into(),
            path: None,
            repository: "site-a".into(),
            source_id: None,
            parent: None,
            tags: None,
            retain: None,
            mover: None,
            volume_snapshot: None,
            secondary: Some(Secondary {
                repository: "site-b".into(),
                retain: Some(Retention {
                    last: Some(3),
                    ..Retention::default()
                }),
                remove_vanished: None,
                rate_limit: None,
                rate_limit_windows: Vec::new(),
            }),
            resolved_repository: Some(repo.clone()),
            resolved_snapshot_metadata: None,
            resolved_secondary: Some(ferry_operator::crd::BackupRepositorySpec {
                url: Some("s3://also-unused/site-b".into()),
                initialize: Some(true),
                ..repo.clone()
            }),
        },
    );
    b.metadata.namespace = Some("vms".into());
    b.metadata.uid = Some("b3".into());
    let sync = ferry_operator::mover::backup_request::sync_request(&b)
        .unwrap()
        .unwrap();
    let prune = ferry_operator::mover::backup_request::secondary_prune_request(&b)
        .unwrap()
        .unwrap();
    (sync, prune)
}

/// A TCP proxy that forwards until frozen, then holds its connections open and silent:
/// what a mover whose node vanished, or a half-open connection, looks like to the
/// operator.
struct FreezingProxy {
    addr: std::net::SocketAddr,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl FreezingProxy {
    async fn start(to: std::net::SocketAddr) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let frozen = std::sync::Arc::new(AtomicBool::new(false));
        let flag = frozen.clone();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let server = tokio::net::TcpStream::connect(to).await.unwrap();
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (mut from, mut to) in [(cr, sw), (sr, cw)].map(|(r, w)| (r, w)) {
                    let flag = flag.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 64 << 10];
                        loop {
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if flag.load(Ordering::SeqCst) {
                                // Silent, not closed: keep both halves open forever.
                                std::future::pending::<()>().await;
                            }
                            if to.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        Self {
            addr,
            frozen,
            accepted,
        }
    }

    /// Connections it accepted so far.
    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Every call of the link to one mover (start, watch, cancel, a second start) goes over
/// one connection: one TCP and TLS handshake per mover, not per call.
#[tokio::test]
async fn the_link_keeps_one_connection_per_mover() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let (service, direct) = mover_service(dir.path(), &root).await;
    let proxy = FreezingProxy::start(service.grpc_addr()).await;
    let through_proxy = MoverAddress {
        ip: proxy.addr.ip().to_string(),
        port: proxy.addr.port(),
        ..direct.clone()
    };
    let src = root.join("src.img");
    std::fs::write(&src, vec![7u8; 1 << 20]).unwrap();
    let link = GrpcMoverLink::default();
    for key in ["first", "second"] {
        let job = JobRequest::Transfer(Box::new(proto::StartTransferRequest {
            source: Some(file(&src)),
            target: Some(file(&root.join(format!("{key}.img")))),
            idempotency_key: key.into(),
            labels: labels(key),
            ..proto::StartTransferRequest::default()
        }));
        let started = link.start(&through_proxy, &job).await.unwrap();
        let mut stream = link.watch(&through_proxy, &started.id).await.unwrap();
        let mut last = None;
        while let Some(report) = stream.next().await {
            last = Some(report.unwrap());
        }
        assert_eq!(last.unwrap().state, JobState::Succeeded);
        link.cancel(&through_proxy, key).await.unwrap();
    }
    assert_eq!(proxy.accepted(), 1);
    let copied = std::fs::read(root.join("second.img")).unwrap();
    assert_eq!(copied, std::fs::read(&src).unwrap());
    service.shutdown().await;
}

/// A job stream outlives the link's request timeout, and a mover that goes silent mid-job
/// (no reset, no close: a vanished node) ends the follow with an error within the
/// keepalive interval plus its timeout, instead of hanging it forever.
#[tokio::test]
async fn a_silent_mover_ends_the_follow_within_the_keepalive_time() {
    use ferry_operator::controller::LinkTimeouts;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let (service, direct) = mover_service(dir.path(), &root).await;
    let proxy = FreezingProxy::start(service.grpc_addr()).await;
    let through_proxy = MoverAddress {
        ip: proxy.addr.ip().to_string(),
        port: proxy.addr.port(),
        ..direct.clone()
    };
    let src = root.join("src.img");
    std::fs::write(&src, vec![7u8; 8 << 20]).unwrap();
    let link = GrpcMoverLink::new(LinkTimeouts {
        connect: Duration::from_secs(5),
        request: Duration::from_secs(1),
        keepalive_interval: Duration::from_secs(1),
        keepalive_timeout: Duration::from_secs(1),
    });
    // 8 MiB at 1 MiB/s: about 8 s of job, longer than the request timeout.
    let job = JobRequest::Transfer(Box::new(proto::StartTransferRequest {
        source: Some(file(&src)),
        target: Some(file(&root.join("dst.img"))),
        options: Some(proto::TransferOptions {
            rate_limit: 1 << 20,
            ..proto::TransferOptions::default()
        }),
        idempotency_key: "slow".into(),
        labels: labels("slow"),
        ..proto::StartTransferRequest::default()
    }));
    let started = link.start(&through_proxy, &job).await.unwrap();
    let mut stream = link.watch(&through_proxy, &started.id).await.unwrap();
    let watching = Instant::now();
    while watching.elapsed() < Duration::from_secs(3) {
        let report = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("the running job reports")
            .expect("the stream goes on past the request timeout")
            .unwrap();
        assert!(!report.state.is_terminal(), "{report:?}");
    }

    proxy.freeze();
    let frozen = Instant::now();
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a silent mover must not hang the follow")
        {
            Some(Ok(report)) => assert!(!report.state.is_terminal(), "{report:?}"),
            Some(Err(e)) => break e,
            None => panic!("the stream ended without an error"),
        }
    };
    assert!(matches!(ended, LinkError::Unavailable(_)), "{ended:?}");
    assert!(
        frozen.elapsed() < Duration::from_secs(5),
        "noticed after {:?}",
        frozen.elapsed()
    );
    link.cancel(&direct, "slow").await.unwrap();
    service.shutdown().await;
}

/// A job service serving mutual TLS with a certificate `ca` made for the mover pod
/// `pod` in namespace `ns`, accepting only clients of `ca`.
async fn tls_mover_service(
    dir: &Path,
    root: &Path,
    ca: &ferry_operator::mover::tls::MoverCa,
    pod: &str,
) -> (RunningService, MoverAddress) {
    let issued = ca.issue_mover(pod, "ns").unwrap();
    let tls_dir = dir.join("tls");
    std::fs::create_dir_all(&tls_dir).unwrap();
    for (name, pem) in [
        ("tls.crt", issued.cert_pem.as_str()),
        ("tls.key", issued.key_pem.as_str()),
        ("ca.crt", ca.cert_pem()),
    ] {
        std::fs::write(tls_dir.join(name), pem).unwrap();
    }
    let mut cfg = mover_config(dir, root);
    cfg.tls = Some(ferry_server::security::TlsFiles {
        cert: tls_dir.join("tls.crt"),
        key: tls_dir.join("tls.key"),
        client_ca: Some(tls_dir.join("ca.crt")),
    });
    let service = server::start(cfg).await.unwrap();
    let mover = address_of(&service);
    (service, mover)
}

/// The operator's mutual TLS with a real job service as the mover pod runs it: the
/// operator's link with the movers' CA runs a checksum; a link of another CA, a link
/// without TLS, and a mover whose certificate names another pod are all refused.
#[tokio::test]
async fn movers_and_the_operator_prove_themselves_by_the_movers_ca() {
    use ferry_operator::mover::tls::MoverCa;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let src = root.join("src.img");
    let bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i % 241) as u8).collect();
    std::fs::write(&src, &bytes).unwrap();
    let ca = Arc::new(MoverCa::generate().unwrap());
    let (service, mover) = tls_mover_service(dir.path(), &root, &ca, "p").await;
    let checksum = JobRequest::Checksum(Box::new(proto::StartChecksumRequest {
        source: Some(file(&src)),
        options: Some(proto::ChecksumOptions {
            algorithm: proto::HashAlgorithm::Sha256 as i32,
            ..proto::ChecksumOptions::default()
        }),
        idempotency_key: "uid-t".into(),
        labels: labels("uid-t"),
        priority: 0,
    }));

    let link = GrpcMoverLink::default().with_ca(ca.clone());
    let started = link.start(&mover, &checksum).await.unwrap();
    let summed = last(&link, &mover, &started.id).await;
    assert_eq!(summed.state, JobState::Succeeded, "{summed:?}");
    let expected = {
        use sha2::Digest;
        format!(
            "sha256:{}",
            ferry_tests::check::hex(&sha2::Sha256::digest(&bytes))
        )
    };
    assert_eq!(summed.source_digest.as_deref(), Some(expected.as_str()));

    let stranger = GrpcMoverLink::default().with_ca(Arc::new(MoverCa::generate().unwrap()));
    let refused = stranger.start(&mover, &checksum).await;
    assert!(refused.is_err(), "a link of another CA got in: {refused:?}");
    let plain = GrpcMoverLink::default();
    let refused = plain.start(&mover, &checksum).await;
    assert!(refused.is_err(), "a plain link got in: {refused:?}");
    service.shutdown().await;

    // A mover whose certificate was made for another pod is not the mover asked for.
    let other = tempfile::tempdir().unwrap();
    let (service, mover) = tls_mover_service(other.path(), &root, &ca, "q").await;
    let refused = link.start(&mover, &checksum).await;
    assert!(
        refused.is_err(),
        "a mover of another pod was trusted: {refused:?}"
    );
    service.shutdown().await;
}

/// A registry image's copy reports the manifest digest it pinned (what a Transfer's
/// `status.sourceVersion` shows), through the link's reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_copy_reports_the_digest_it_read() {
    use ferry_tests::registry_server::{Auth, Registry};

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let registry_dir = dir.path().join("registry");
    std::fs::create_dir_all(&registry_dir).unwrap();
    let registry = Registry::start_with(&registry_dir, &Auth::AnonymousPlain);
    let disk = dir.path().join("disk.img");
    let bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
    std::fs::write(&disk, &bytes).unwrap();
    registry.build("disk", &disk, "amd64");
    registry.push("disk", "vms/disk:1", "gzip");
    let (_service, mover) = mover_service(dir.path(), &root).await;
    let dst = root.join("dst.img");
    let request = proto::StartTransferRequest {
        source: Some(proto::Endpoint {
            url: registry.url("vms/disk:1"),
            options: Some(proto::endpoint::Options::Registry(proto::RegistryOptions {
                insecure: true,
                ..proto::RegistryOptions::default()
            })),
            ..proto::Endpoint::default()
        }),
        target: Some(file(&dst)),
        idempotency_key: "uid-r/0".into(),
        labels: labels("uid-r"),
        ..proto::StartTransferRequest::default()
    };
    let link = GrpcMoverLink::default();
    let started = link
        .start(&mover, &JobRequest::Transfer(Box::new(request)))
        .await
        .unwrap();
    let done = last(&link, &mover, &started.id).await;
    assert_eq!(done.state, JobState::Succeeded, "{done:?}");
    assert_eq!(std::fs::read(&dst).unwrap(), bytes);
    let version = done.source_version.expect("the pinned digest");
    let out = std::process::Command::new("curl")
        .args(["-sSfI", "-H", "Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"])
        .arg(format!("http://{}/v2/vms/disk/manifests/1", registry.host()))
        .output()
        .unwrap();
    let headers = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(
        headers.contains(&format!("docker-content-digest: {version}")),
        "{version} not in {headers}"
    );
}
