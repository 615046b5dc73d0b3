//! The job service with HTTP sources: `ferry serve` as a real process, nginx as the
//! server, gRPC clients. A job names its basic-auth password by reference (a file under
//! `--secrets-dir`); the value and the URL's query (a stand-in for a presigned signature)
//! must appear in nothing the service shows. A job killed mid-copy resumes after a
//! restart from the same object, and fails instead of mixing versions when the object
//! changed in between.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferry_api::proto::{self, secret_ref, JobState, SecretRef};
use ferry_tests::check::{blkhash_file, qemu_img_compare};
use ferry_tests::http_server::{Nginx, NginxOptions, PASSWORD, USER};
use ferry_tests::images::{self, Pattern};
use ferry_tests::service_support::*;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");
const LIMIT: Duration = Duration::from_secs(180);
const MIB: u64 = 1024 * 1024;
const PW_FILE: &str = "http-password";
/// Stands for a presigned URL's signature: it must never be shown.
const QUERY_SECRET: &str = "X-Signature=ferry-query-secret-1234";

struct Setup {
    _tmp: tempfile::TempDir,
    tmp: PathBuf,
    root: PathBuf,
    secrets: PathBuf,
}

fn setup() -> Setup {
    let tmp = ferry_tests::scratch_dir();
    let root = tmp.path().join("images");
    let secrets = tmp.path().join("secrets");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(secrets.join(PW_FILE), format!("{PASSWORD}\n")).unwrap();
    Setup {
        tmp: tmp.path().to_path_buf(),
        _tmp: tmp,
        root,
        secrets,
    }
}

impl Setup {
    fn serve(&self, data: &str) -> ServeProcess {
        let args = [
            "--data-dir",
            self.tmp.join(data).to_str().unwrap(),
            "--allow-root",
            self.root.to_str().unwrap(),
            "--secrets-dir",
            self.secrets.to_str().unwrap(),
            "--checkpoint-interval",
            "200ms",
            "--log-filter",
            "debug",
        ]
        .map(String::from);
        ServeProcess::start(Path::new(BIN), &args, &[])
    }
}

fn file(name: &str) -> SecretRef {
    SecretRef {
        source: Some(secret_ref::Source::File(name.into())),
    }
}

fn http_source(url: &str) -> Option<Endpoint> {
    Some(Endpoint {
        url: format!("{url}?{QUERY_SECRET}"),
        options: Some(proto::endpoint::Options::Http(proto::HttpOptions {
            user: USER.into(),
            password: Some(file(PW_FILE)),
            ..Default::default()
        })),
        ..Default::default()
    })
}

fn assert_no_secret(what: &str, text: &str) {
    assert!(
        !text.contains(PASSWORD),
        "the password shows in {what}: {text}"
    );
    assert!(
        !text.contains("ferry-query-secret"),
        "the URL query shows in {what}: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_read_http_with_a_password_by_reference() {
    let nginx = Nginx::start();
    let img = images::make(
        &nginx.root().join("private/disk.img"),
        Pattern::HalfData,
        24 * MIB,
        3,
    )
    .unwrap();
    let s = setup();
    let server = s.serve("data");
    let mut client = connect(server.grpc).await;
    let target = s.root.join("copy.img");
    let started = client
        .start_transfer(StartTransferRequest {
            source: http_source(&nginx.url("private/disk.img")),
            target: endpoint(target.display().to_string()),
            options: Some(TransferOptions {
                verify: true,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("start transfer")
        .into_inner();
    let id = started.id;
    let job = wait_terminal(&mut client, &id, LIMIT).await;
    assert_eq!(
        state(&job),
        JobState::Succeeded,
        "{job:?}\n{}",
        server.stderr()
    );
    qemu_img_compare(&img.path, &target);
    assert_no_secret("the job", &format!("{job:?}"));
    let listed = client
        .list_jobs(proto::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_no_secret("ListJobs", &format!("{listed:?}"));

    let sum = client
        .start_checksum(StartChecksumRequest {
            source: http_source(&nginx.url("private/disk.img")),
            ..Default::default()
        })
        .await
        .expect("start checksum")
        .into_inner();
    let job = wait_terminal(&mut client, &sum.id, LIMIT).await;
    assert_eq!(state(&job), JobState::Succeeded, "{job:?}");
    let text = format!("{job:?}");
    assert!(text.contains(&blkhash_file(&img.path)), "{text}");

    // A wrong password: a clear failure that names neither secret.
    std::fs::write(s.secrets.join("wrong"), "wrong-password-777\n").unwrap();
    let mut source = http_source(&nginx.url("private/disk.img"));
    if let Some(proto::endpoint::Options::Http(h)) =
        source.as_mut().and_then(|e| e.options.as_mut())
    {
        h.password = Some(file("wrong"));
    }
    let started = client
        .start_transfer(StartTransferRequest {
            source,
            target: endpoint(s.root.join("wrong.img").display().to_string()),
            ..Default::default()
        })
        .await
        .expect("start transfer")
        .into_inner();
    let job = wait_terminal(&mut client, &started.id, LIMIT).await;
    assert_eq!(state(&job), JobState::Failed, "{job:?}");
    let text = format!("{job:?}");
    assert!(text.contains("refused the credentials"), "{text}");
    assert!(!text.contains("wrong-password-777"), "{text}");
    assert_no_secret("the failed job", &text);

    // HTTP is read-only: a target is refused up front.
    let err = client
        .start_transfer(StartTransferRequest {
            source: endpoint(target.display().to_string()),
            target: endpoint(nginx.url("x.img")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    let metrics = scrape_metrics(server.metrics.expect("metrics address")).await;
    assert!(
        metrics.contains("\"http\""),
        "no http label in the metrics:\n{metrics}"
    );
    assert_no_secret("the metrics", &metrics);
    assert_no_secret("the server log", &server.stderr());
}

/// Starts a rate-limited copy and kills the server once some of it is committed.
async fn start_and_kill(s: &Setup, url: &str, target: &Path) -> String {
    let server = s.serve("data");
    let mut client = connect(server.grpc).await;
    let started = client
        .start_transfer(StartTransferRequest {
            source: http_source(url),
            target: endpoint(target.display().to_string()),
            ..Default::default()
        })
        .await
        .expect("start transfer")
        .into_inner();
    let id = started.id;
    let t0 = Instant::now();
    loop {
        let job = client
            .get_job(proto::GetJobRequest { id: id.clone() })
            .await
            .unwrap()
            .into_inner();
        let committed = job.progress.as_ref().map_or(0, |p| p.committed_bytes);
        assert!(!is_terminal(&job), "the job ended before the kill: {job:?}");
        if committed >= 2 * MIB {
            break;
        }
        assert!(t0.elapsed() < LIMIT, "no progress: {job:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the checkpoint be persisted.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill9();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_job_reads_the_same_version_or_fails() {
    let nginx = Nginx::start_with(&NginxOptions {
        limit_rate: Some("512k".into()),
        ..NginxOptions::default()
    });
    let size = 48 * MIB;
    let img = images::make(
        &nginx.root().join("private/big.img"),
        Pattern::HalfData,
        size,
        9,
    )
    .unwrap();
    let url = nginx.url("private/big.img");

    // Same object after the restart: the job resumes and the bytes are right.
    let s = setup();
    let target = s.root.join("resumed.img");
    let id = start_and_kill(&s, &url, &target).await;
    let server = s.serve("data");
    let mut client = connect(server.grpc).await;
    let job = wait_terminal(&mut client, &id, LIMIT).await;
    assert_eq!(
        state(&job),
        JobState::Succeeded,
        "{job:?}\n{}",
        server.stderr()
    );
    qemu_img_compare(&img.path, &target);
    drop(server);

    // The object changes while the server is down: the resumed job fails.
    let s = setup();
    let target = s.root.join("changed.img");
    let id = start_and_kill(&s, &url, &target).await;
    let later = std::time::SystemTime::now() + Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&img.path)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let server = s.serve("data");
    let mut client = connect(server.grpc).await;
    let job = wait_terminal(&mut client, &id, LIMIT).await;
    assert_eq!(
        state(&job),
        JobState::Failed,
        "{job:?}\n{}",
        server.stderr()
    );
    let text = format!("{job:?}");
    assert!(text.contains("changed since the job started"), "{text}");
    assert_no_secret("the job", &text);
}

/// A caller's checkpoint names no HTTP object version, so it could mix two versions of
/// the object: StartTransfer refuses it for an HTTP source, naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_from_with_an_http_source_is_refused() {
    let s = setup();
    let server = s.serve("data");
    let mut client = connect(server.grpc).await;
    let err = client
        .start_transfer(StartTransferRequest {
            source: http_source("http://127.0.0.1:9/disk.img"),
            target: endpoint(s.root.join("out.img").display().to_string()),
            resume_from: Some(proto::Checkpoint {
                size: 4 * MIB,
                committed: vec![proto::Range { start: 0, end: MIB }],
            }),
            ..Default::default()
        })
        .await
        .expect_err("a resume_from with an HTTP source is accepted");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("resume_from"), "{}", err.message());
    assert_no_secret("the error", err.message());
}
