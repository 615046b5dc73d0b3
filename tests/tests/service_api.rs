//! The job service through real gRPC clients against a server on 127.0.0.1:0 in this
//! process: transfers and checksums to completion with bytes verified, watch semantics,
//! cancellation, limits, idempotency, bad requests, path escapes, health, reflection,
//! metrics parsed with a Prometheus parser, bearer tokens and mutual TLS.

use std::time::Duration;

use ferry_api::proto::{self, JobState};
use ferry_tests::service_support::*;
use tonic::Code;

const LIMIT: Duration = Duration::from_secs(120);

struct Env {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    service: ferry_server::server::RunningService,
    client: Client,
}

async fn env_with(configure: impl FnOnce(&mut ferry_server::config::ServiceConfig)) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("images");
    std::fs::create_dir(&root).unwrap();
    let mut cfg = test_config(&dir.path().join("data"), &root);
    configure(&mut cfg);
    let service = start_in_process(cfg).await;
    let client = connect(service.grpc_addr()).await;
    Env {
        _dir: dir,
        root,
        service,
        client,
    }
}

async fn env() -> Env {
    env_with(|_| {}).await
}

#[tokio::test]
async fn transfer_and_checksum_complete_with_bytes_verified() {
    let mut e = env().await;
    let src = make_image(&e.root.join("src.img"), 12 * 1024 * 1024 + 4096, 1);
    let dst = e.root.join("dst.img");
    let mut req = transfer(&src, &dst);
    req.options.as_mut().unwrap().verify = true;
    req.labels.insert("suite".into(), "api".into());
    let job = e.client.start_transfer(req).await.unwrap().into_inner();
    assert_eq!(state(&job), JobState::Queued);
    assert!(!job.id.is_empty());
    let done = wait_terminal(&mut e.client, &job.id, LIMIT).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    assert_same_image(&src, &dst);
    let Some(proto::job::Result::TransferResult(r)) = &done.result else {
        panic!("no transfer result: {done:?}")
    };
    assert_eq!(r.size, 12 * 1024 * 1024 + 4096);
    assert!(r.data_bytes >= 6 * 1024 * 1024, "{r:?}");
    assert!(r.zero_bytes > 0, "{r:?}");
    let (s, t) = (
        r.source_digest.clone().unwrap(),
        r.target_digest.clone().unwrap(),
    );
    assert_eq!(s, t);
    assert_eq!(s.hex.len(), 64);
    let Some(proto::job::Request::Transfer(echo)) = &done.request else {
        panic!("no request echo")
    };
    assert_eq!(echo.labels["suite"], "api");

    let ck = e
        .client
        .start_checksum(checksum(&dst))
        .await
        .unwrap()
        .into_inner();
    let ck = wait_terminal(&mut e.client, &ck.id, LIMIT).await;
    let Some(proto::job::Result::ChecksumResult(c)) = &ck.result else {
        panic!("no checksum result: {ck:?}")
    };
    assert_eq!(c.digest.as_ref().unwrap().hex, t.hex);
    assert_eq!(c.size, r.size);

    // A watcher of a finished job gets the final state at once and the stream ends.
    let started = std::time::Instant::now();
    let again = wait_terminal(&mut e.client, &done.id, Duration::from_secs(5)).await;
    assert_eq!(again.id, done.id);
    assert!(started.elapsed() < Duration::from_secs(2));
    e.service.shutdown().await;
}

#[tokio::test]
async fn watch_streams_progress_then_the_terminal_state() {
    let mut e = env().await;
    let src = make_image(&e.root.join("src.img"), 8 * 1024 * 1024, 2);
    let mut req = transfer(&src, &e.root.join("dst.img"));
    req.options.as_mut().unwrap().rate_limit = 8 * 1024 * 1024;
    let job = e.client.start_transfer(req).await.unwrap().into_inner();
    let mut stream = e
        .client
        .watch_job(proto::WatchJobRequest { id: job.id.clone() })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(ev) = stream.message().await.unwrap() {
        events.push(ev.job.unwrap());
    }
    assert!(events.len() >= 3, "{} events", events.len());
    assert!(is_terminal(events.last().unwrap()));
    assert!(events[..events.len() - 1].iter().all(|j| !is_terminal(j)));
    let dones: Vec<u64> = events
        .iter()
        .map(|j| j.progress.unwrap().done_bytes)
        .collect();
    assert!(dones.windows(2).all(|w| w[0] <= w[1]), "{dones:?}");
    assert!(
        dones.iter().any(|&d| d > 0 && d < 8 * 1024 * 1024),
        "no intermediate progress: {dones:?}"
    );
    e.service.shutdown().await;
}

#[tokio::test]
async fn cancellation_stops_a_running_job_promptly() {
    let mut e = env().await;
    let src = make_image(&e.root.join("src.img"), 32 * 1024 * 1024, 3);
    let mut req = transfer(&src, &e.root.join("dst.img"));
    req.options.as_mut().unwrap().rate_limit = 2 * 1024 * 1024;
    let job = e.client.start_transfer(req).await.unwrap().into_inner();
    let mut stream = e
        .client
        .watch_job(proto::WatchJobRequest { id: job.id.clone() })
        .await
        .unwrap()
        .into_inner();
    while let Some(ev) = stream.message().await.unwrap() {
        if ev.job.unwrap().progress.unwrap().done_bytes > 0 {
            break;
        }
    }
    let started = std::time::Instant::now();
    let cancelled = e
        .client
        .cancel_job(proto::CancelJobRequest { id: job.id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&cancelled), JobState::Cancelled, "{cancelled:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(cancelled.error.unwrap().kind, "cancelled");
    let p = cancelled.progress.unwrap();
    assert!(p.done_bytes < 32 * 1024 * 1024, "{p:?}");
    let s = parse_metrics(&scrape_metrics(e.service.metrics_addr().unwrap()).await);
    assert_eq!(
        sample(
            &s,
            "ferry_jobs_finished_total",
            &[("kind", "transfer"), ("result", "cancelled")]
        ),
        Some(1.0)
    );
    e.service.shutdown().await;
}

#[tokio::test]
async fn global_limit_keeps_later_jobs_queued() {
    let mut e = env_with(|c| {
        c.manager.limits.max_running = 1;
    })
    .await;
    let src = make_image(&e.root.join("src.img"), 8 * 1024 * 1024, 4);
    let mut slow = transfer(&src, &e.root.join("a.img"));
    slow.options.as_mut().unwrap().rate_limit = 8 * 1024 * 1024;
    let first = e.client.start_transfer(slow).await.unwrap().into_inner();
    let second = e
        .client
        .start_transfer(transfer(&src, &e.root.join("b.img")))
        .await
        .unwrap()
        .into_inner();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listed = e
        .client
        .list_jobs(proto::ListJobsRequest {
            states: vec![JobState::Queued as i32],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.jobs.len(), 1);
    assert_eq!(listed.jobs[0].id, second.id);
    let a = wait_terminal(&mut e.client, &first.id, LIMIT).await;
    let b = wait_terminal(&mut e.client, &second.id, LIMIT).await;
    assert_eq!(
        (state(&a), state(&b)),
        (JobState::Succeeded, JobState::Succeeded)
    );
    let a_end = a.end_time.unwrap();
    let b_start = b.start_time.unwrap();
    assert!((b_start.seconds, b_start.nanos) >= (a_end.seconds, a_end.nanos));
    assert_same_image(&src, &e.root.join("b.img"));
    e.service.shutdown().await;
}

#[tokio::test]
async fn idempotency_keys_return_the_same_job_or_already_exists() {
    let mut e = env().await;
    let src = make_image(&e.root.join("src.img"), 1024 * 1024, 5);
    let mut req = transfer(&src, &e.root.join("dst.img"));
    req.idempotency_key = "controller-retry-1".into();
    let a = e
        .client
        .start_transfer(req.clone())
        .await
        .unwrap()
        .into_inner();
    let b = e
        .client
        .start_transfer(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a.id, b.id);
    let mut different = req.clone();
    different.target = endpoint(e.root.join("other.img").display().to_string());
    let err = e.client.start_transfer(different).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert!(err.message().contains(&a.id), "{}", err.message());
    let done = wait_terminal(&mut e.client, &a.id, LIMIT).await;
    // Still the same job after it finished: never a second copy.
    let c = e.client.start_transfer(req).await.unwrap().into_inner();
    assert_eq!(c.id, a.id);
    assert_eq!(c.state, done.state);
    let all = e
        .client
        .list_jobs(proto::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.jobs.len(), 1);
    e.service.shutdown().await;
}

#[tokio::test]
async fn bad_requests_and_unknown_jobs() {
    let mut e = env().await;
    let src = make_image(&e.root.join("src.img"), 65536, 6);
    let dst = e.root.join("dst.img");
    let cases: Vec<(proto::StartTransferRequest, &str)> = vec![
        (
            proto::StartTransferRequest {
                target: endpoint(dst.display().to_string()),
                ..Default::default()
            },
            "source is missing",
        ),
        (
            {
                let mut r = transfer(&src, &dst);
                r.source = endpoint("ftp://host/x");
                r
            },
            "unknown scheme",
        ),
        (
            {
                let mut r = transfer(&src, &dst);
                r.options.as_mut().unwrap().order = 99;
                r
            },
            "CommitOrder",
        ),
        (
            {
                let mut r = transfer(&src, &dst);
                r.options.as_mut().unwrap().workers = 1_000_000;
                r
            },
            "workers",
        ),
        (transfer(&src, &src), "same image"),
        (
            {
                let mut r = transfer(&src, &dst);
                r.target = endpoint("iscsi://user%secretpw@127.0.0.1/iqn.2026-01.io.ferry:t/1");
                r
            },
            "by reference",
        ),
        (
            {
                let mut r = transfer(&src, &dst);
                r.idempotency_key = "k".repeat(1000);
                r
            },
            "idempotency_key",
        ),
    ];
    for (req, needle) in cases {
        let err = e.client.start_transfer(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{needle}: {err:?}");
        assert!(
            err.message().contains(needle),
            "{needle}: {}",
            err.message()
        );
        assert!(!err.message().contains("secretpw"), "{}", err.message());
    }
    for code_of in [
        e.client
            .get_job(proto::GetJobRequest { id: "nope".into() })
            .await
            .unwrap_err(),
        e.client
            .cancel_job(proto::CancelJobRequest { id: "nope".into() })
            .await
            .unwrap_err(),
    ] {
        assert_eq!(code_of.code(), Code::NotFound);
    }
    let err = e
        .client
        .watch_job(proto::WatchJobRequest { id: "nope".into() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = e
        .client
        .list_jobs(proto::ListJobsRequest {
            page_token: "bogus".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // A missing source file is accepted (it may appear) and fails as not_found.
    let job = e
        .client
        .start_transfer(transfer(&e.root.join("missing.img"), &dst))
        .await
        .unwrap()
        .into_inner();
    let done = wait_terminal(&mut e.client, &job.id, LIMIT).await;
    assert_eq!(state(&done), JobState::Failed);
    assert_eq!(done.error.unwrap().kind, "not_found");
    e.service.shutdown().await;
}

#[tokio::test]
async fn paths_outside_the_allowed_roots_are_refused() {
    let mut e = env().await;
    let outside = tempfile::tempdir().unwrap();
    let secret = make_image(&outside.path().join("secret.img"), 65536, 7);
    let src = make_image(&e.root.join("src.img"), 65536, 8);
    std::os::unix::fs::symlink(&secret, e.root.join("link.img")).unwrap();
    std::os::unix::fs::symlink(outside.path(), e.root.join("linkdir")).unwrap();
    let escapes = [
        (secret.clone(), e.root.join("dst.img")),
        (e.root.join("link.img"), e.root.join("dst.img")),
        (src.clone(), e.root.join("linkdir/new.img")),
        (src.clone(), e.root.join("../escape.img")),
        (e.root.join("../images/src.img"), e.root.join("dst.img")),
        (src.clone(), outside.path().join("new.img")),
    ];
    for (s, d) in escapes {
        let err = e.client.start_transfer(transfer(&s, &d)).await.unwrap_err();
        assert_eq!(
            err.code(),
            Code::PermissionDenied,
            "{} -> {}: {err:?}",
            s.display(),
            d.display()
        );
    }
    let err = e
        .client
        .start_checksum(checksum(&e.root.join("link.img")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(!outside.path().join("new.img").exists());
    let all = e
        .client
        .list_jobs(proto::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(all.jobs.is_empty());
    e.service.shutdown().await;
}

#[tokio::test]
async fn list_filters_by_label_and_pages() {
    let mut e = env().await;
    let src = make_image(&e.root.join("src.img"), 65536, 9);
    let mut ids = Vec::new();
    for i in 0..25 {
        let mut req = transfer(&src, &e.root.join(format!("t{i}.img")));
        req.labels.insert("batch".into(), (i % 2).to_string());
        ids.push(e.client.start_transfer(req).await.unwrap().into_inner().id);
    }
    for id in &ids {
        wait_terminal(&mut e.client, id, LIMIT).await;
    }
    let mut token = String::new();
    let mut seen = Vec::new();
    loop {
        let mut req = proto::ListJobsRequest {
            page_size: 4,
            page_token: token.clone(),
            states: vec![JobState::Succeeded as i32],
            ..Default::default()
        };
        req.labels.insert("batch".into(), "0".into());
        let page = e.client.list_jobs(req).await.unwrap().into_inner();
        assert!(page.jobs.len() <= 4);
        seen.extend(page.jobs.into_iter().map(|j| j.id));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    let expected: Vec<_> = ids.iter().step_by(2).cloned().collect();
    assert_eq!(seen, expected);
    e.service.shutdown().await;
}

/// TCP_NODELAY of each TCP socket of this process connected from `port` (the server's side
/// of the connections to a listener on that port).
fn nodelay_of_accepted(port: u16) -> Vec<bool> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // SAFETY: plain syscalls on a descriptor number with buffers of the stated sizes;
        // a descriptor closed meanwhile only makes them fail.
        unsafe {
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if libc::getsockname(fd, (&raw mut addr).cast(), &mut len) != 0
                || i32::from(addr.sin_family) != libc::AF_INET
                || u16::from_be(addr.sin_port) != port
            {
                continue;
            }
            let mut peer: libc::sockaddr_in = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if libc::getpeername(fd, (&raw mut peer).cast(), &mut len) != 0 {
                continue; // the listener
            }
            let mut on: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            assert_eq!(
                libc::getsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_NODELAY,
                    (&raw mut on).cast(),
                    &mut len
                ),
                0
            );
            found.push(on != 0);
        }
    }
    found
}

/// The server sets TCP_NODELAY on the connections it accepts (tonic's builder setting does
/// not reach a listener the server binds itself). Without it, Nagle's algorithm held the
/// tail of a new connection's first reply until the client's delayed ACK: 50 concurrent
/// clients saw their first StartTransfer take 40-47 ms (docs/SERVICE.md, Benchmark).
#[tokio::test]
async fn accepted_connections_have_tcp_nodelay() {
    let mut e = env().await;
    let mut second = connect(e.service.grpc_addr()).await;
    for c in [&mut e.client, &mut second] {
        c.list_jobs(proto::ListJobsRequest::default())
            .await
            .unwrap();
    }
    let nodelay = nodelay_of_accepted(e.service.grpc_addr().port());
    assert!(nodelay.len() >= 2, "accepted sockets found: {nodelay:?}");
    assert!(nodelay.iter().all(|on| *on), "TCP_NODELAY: {nodelay:?}");
    e.service.shutdown().await;
}

#[tokio::test]
async fn health_reflection_and_metrics() {
    let mut e = env().await;
    let channel =
        tonic::transport::Channel::from_shared(format!("http://{}", e.service.grpc_addr()))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "ferry.v1.JobService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        ServerReflectionRequest,
    };
    let mut reflection = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = reflection
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("unexpected reflection response {resp:?}")
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"ferry.v1.JobService"), "{names:?}");
    assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");

    let src = make_image(&e.root.join("src.img"), 4 * 1024 * 1024, 10);
    let job = e
        .client
        .start_transfer(transfer(&src, &e.root.join("dst.img")))
        .await
        .unwrap()
        .into_inner();
    wait_terminal(&mut e.client, &job.id, LIMIT).await;
    let _ = e
        .client
        .start_transfer(transfer(&src, &src))
        .await
        .unwrap_err();
    let text = scrape_metrics(e.service.metrics_addr().unwrap()).await;
    let s = parse_metrics(&text);
    let get = |name: &str, labels: &[(&str, &str)]| {
        sample(&s, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in\n{text}"))
    };
    assert_eq!(get("ferry_jobs", &[("state", "succeeded")]), 1.0);
    assert_eq!(get("ferry_jobs", &[("state", "running")]), 0.0);
    assert_eq!(
        get(
            "ferry_jobs_finished_total",
            &[("kind", "transfer"), ("result", "succeeded")]
        ),
        1.0
    );
    // The image's 2 MiB, plus the first and the last sector that format detection reads
    // to tell raw from qcow2, a compressed stream or a VM image (a VHD's footer is last).
    let read = get("ferry_read_bytes_total", &[("endpoint", "file")]);
    assert!(
        (2.0 * 1024.0 * 1024.0..=2.0 * 1024.0 * 1024.0 + 1024.0).contains(&read),
        "{read}"
    );
    assert_eq!(
        get(
            "ferry_image_read_bytes_total",
            &[("format", "raw"), ("endpoint", "file")]
        ),
        2.0 * 1024.0 * 1024.0
    );
    assert_eq!(
        get("ferry_written_bytes_total", &[("endpoint", "file")]),
        2.0 * 1024.0 * 1024.0
    );
    assert!(get("ferry_skipped_bytes_total", &[("endpoint", "file")]) >= 1024.0 * 1024.0);
    assert_eq!(
        get("ferry_job_duration_seconds", &[("kind", "transfer")]),
        1.0
    );
    assert_eq!(
        get("ferry_job_queue_wait_seconds", &[("kind", "transfer")]),
        1.0
    );
    assert_eq!(
        get(
            "ferry_grpc_requests_total",
            &[("method", "StartTransfer"), ("code", "ok")]
        ),
        1.0
    );
    assert_eq!(
        get(
            "ferry_grpc_requests_total",
            &[("method", "StartTransfer"), ("code", "invalid_argument")]
        ),
        1.0
    );
    assert_eq!(
        get(
            "ferry_grpc_requests_in_flight",
            &[("method", "StartTransfer")]
        ),
        0.0
    );
    // Labels stay bounded: no job ids or paths anywhere in the exposition.
    assert!(!text.contains(&job.id));
    assert!(!text.contains("src.img"));
    e.service.shutdown().await;
}

#[tokio::test]
async fn bearer_token_is_required_when_configured() {
    let token_dir = tempfile::tempdir().unwrap();
    let e = env_with(|c| {
        c.auth_token = Some(ferry_core::Secret::new("s3cr3t-t0ken"));
    })
    .await;
    let _ = token_dir;
    let mut anonymous = e.client.clone();
    let err = anonymous
        .list_jobs(proto::ListJobsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let mut req = tonic::Request::new(proto::ListJobsRequest::default());
    req.metadata_mut()
        .insert("authorization", "Bearer wrong".parse().unwrap());
    assert_eq!(
        anonymous.list_jobs(req).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    let mut req = tonic::Request::new(proto::ListJobsRequest::default());
    req.metadata_mut()
        .insert("authorization", "Bearer s3cr3t-t0ken".parse().unwrap());
    assert!(anonymous.list_jobs(req).await.is_ok());
    // Health stays open for probes.
    let channel =
        tonic::transport::Channel::from_shared(format!("http://{}", e.service.grpc_addr()))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    assert!(health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new()
        })
        .await
        .is_ok());
    e.service.shutdown().await;
}

#[tokio::test]
async fn mutual_tls() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let dir = tempfile::tempdir().unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client = CertificateParams::new(vec!["client".to_string()])
        .unwrap()
        .signed_by(&client_key, &issuer)
        .unwrap();
    let w = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let ca_pem = w("ca.pem", ca.pem());
    let tls = ferry_server::security::TlsFiles {
        cert: w("server.pem", server.pem()),
        key: w("server.key", server_key.serialize_pem()),
        client_ca: Some(ca_pem.clone()),
    };
    let e = env_with(|c| c.tls = Some(tls)).await;
    let url = format!("https://localhost:{}", e.service.grpc_addr().port());
    let ca_cert = tonic::transport::Certificate::from_pem(std::fs::read(&ca_pem).unwrap());
    let with_identity = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(ca_cert.clone())
        .domain_name("localhost")
        .identity(tonic::transport::Identity::from_pem(
            client.pem(),
            client_key.serialize_pem(),
        ));
    let channel = tonic::transport::Channel::from_shared(url.clone())
        .unwrap()
        .tls_config(with_identity)
        .unwrap()
        .connect()
        .await
        .expect("mTLS connection with a client certificate");
    let mut c = proto::job_service_client::JobServiceClient::new(channel);
    assert!(c.list_jobs(proto::ListJobsRequest::default()).await.is_ok());

    let without_identity = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(ca_cert)
        .domain_name("localhost");
    let refused = async {
        let channel = tonic::transport::Channel::from_shared(url)
            .unwrap()
            .tls_config(without_identity)
            .unwrap()
            .connect()
            .await?;
        let mut c = proto::job_service_client::JobServiceClient::new(channel);
        c.list_jobs(proto::ListJobsRequest::default())
            .await
            .map_err(|s| Box::new(s) as Box<dyn std::error::Error + Send + Sync>)?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    }
    .await;
    assert!(
        refused.is_err(),
        "a client without a certificate got through"
    );
    // Plain text is refused too.
    let plain = tonic::transport::Channel::from_shared(format!("http://{}", e.service.grpc_addr()))
        .unwrap()
        .connect()
        .await;
    if let Ok(ch) = plain {
        let mut c = proto::job_service_client::JobServiceClient::new(ch);
        assert!(c
            .list_jobs(proto::ListJobsRequest::default())
            .await
            .is_err());
    }
    e.service.shutdown().await;
}
