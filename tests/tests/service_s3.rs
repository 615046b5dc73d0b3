//! The job service with per-job S3 settings, end to end: `ferry serve` as a real process,
//! a real S3 server in this process (s3s + s3s-fs, SigV4 checked), and gRPC clients.
//!
//! Each job names the store, region, addressing and credentials itself; the credentials
//! are references (an environment variable of the server, a file under `--secrets-dir`)
//! that the server reads when the job starts and again when it resumes after a restart.
//! The server's own AWS environment points at a dead endpoint with decoy credentials, so a
//! job that fell back to it would fail. Bytes are verified by block hash on both sides,
//! and the secret values are searched for in everything the server shows: GetJob,
//! ListJobs and WatchJob answers, its logs (at debug level), /metrics and the bytes of
//! its job store.

// Until tests/src/lib.rs exports it as ferry_tests::s3_server.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_api::proto::{self, secret_ref, JobState, SecretRef};
use ferry_tests::check::blkhash_file;
use ferry_tests::s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};
use ferry_tests::service_support::*;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");
const LIMIT: Duration = Duration::from_secs(180);
const MIB: u64 = 1024 * 1024;
const BUCKET: &str = "images";

/// Environment variables of the server holding the store's key pair.
const KEY_ID_VAR: &str = "FERRY_TEST_S3_KEY_ID";
const SECRET_VAR: &str = "FERRY_TEST_S3_SECRET";
/// An environment variable holding a secret key the store does not accept.
const WRONG_VAR: &str = "FERRY_TEST_S3_WRONG_SECRET";
const WRONG_SECRET: &str = "ferry-wrong-secret-key-9876543210";
/// Files under --secrets-dir holding the store's key pair.
const KEY_ID_FILE: &str = "s3-access-key-id";
const SECRET_FILE: &str = "s3-secret-access-key";
/// The server's standard AWS credentials: valid nowhere.
const DECOY_SECRET: &str = "ferry-decoy-secret-key-5555555555";

/// Every secret value of these tests: none may appear in anything the server shows.
const SECRETS: [&str; 3] = [SECRET_KEY, WRONG_SECRET, DECOY_SECRET];

struct Setup {
    tmp: tempfile::TempDir,
    root: PathBuf,
    data: PathBuf,
    secrets: PathBuf,
    s3: S3Server,
}

async fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("images");
    let data = tmp.path().join("data");
    let secrets = tmp.path().join("secrets");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(secrets.join(KEY_ID_FILE), format!("{ACCESS_KEY}\n")).unwrap();
    std::fs::write(secrets.join(SECRET_FILE), format!("{SECRET_KEY}\n")).unwrap();
    std::fs::write(tmp.path().join("empty-aws-config"), "").unwrap();
    let s3 = S3Server::start().await;
    s3.create_bucket(BUCKET);
    Setup {
        tmp,
        root,
        data,
        secrets,
        s3,
    }
}

impl Setup {
    fn args(&self) -> Vec<String> {
        [
            "--data-dir",
            self.data.to_str().unwrap(),
            "--allow-root",
            self.root.to_str().unwrap(),
            "--secrets-dir",
            self.secrets.to_str().unwrap(),
            "--checkpoint-interval",
            "300ms",
            "--log-filter",
            "debug",
        ]
        .map(String::from)
        .to_vec()
    }

    fn start(&self) -> ServeProcess {
        let empty = self.tmp.path().join("empty-aws-config");
        let empty = empty.to_str().unwrap();
        ServeProcess::start(
            Path::new(BIN),
            &self.args(),
            &[
                (KEY_ID_VAR, ACCESS_KEY),
                (SECRET_VAR, SECRET_KEY),
                (WRONG_VAR, WRONG_SECRET),
                // The standard chain leads nowhere: only the jobs' own settings work.
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
                ("AWS_ACCESS_KEY_ID", "ferry-decoy-key-id"),
                ("AWS_SECRET_ACCESS_KEY", DECOY_SECRET),
                ("AWS_REGION", "eu-central-1"),
                ("AWS_CONFIG_FILE", empty),
                ("AWS_SHARED_CREDENTIALS_FILE", empty),
                ("AWS_EC2_METADATA_DISABLED", "true"),
            ],
        )
    }

    /// `s3://images/KEY` on the test store with the given credential references.
    fn s3(&self, key: &str, key_id: SecretRef, secret: SecretRef) -> Option<Endpoint> {
        Some(Endpoint {
            url: format!("s3://{BUCKET}/{key}"),
            options: Some(proto::endpoint::Options::S3(proto::S3Options {
                endpoint_url: self.s3.endpoint_url(),
                region: "us-east-1".into(),
                access_key_id: Some(key_id),
                secret_access_key: Some(secret),
                session_token: None,
                force_path_style: true,
            })),
            ..Default::default()
        })
    }

    /// The store's key pair by environment variable reference.
    fn s3_env(&self, key: &str) -> Option<Endpoint> {
        self.s3(key, env(KEY_ID_VAR), env(SECRET_VAR))
    }

    /// The store's key pair by secrets-dir file reference.
    fn s3_file(&self, key: &str) -> Option<Endpoint> {
        self.s3(key, file(KEY_ID_FILE), file(SECRET_FILE))
    }

    /// Every byte of the job store (the redb file and anything beside it).
    fn store_bytes(&self) -> Vec<u8> {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(&self.data).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                all.extend(std::fs::read(&path).unwrap());
            }
        }
        assert!(
            !all.is_empty(),
            "no job store under {}",
            self.data.display()
        );
        all
    }
}

fn env(name: &str) -> SecretRef {
    SecretRef {
        source: Some(secret_ref::Source::Env(name.into())),
    }
}

fn file(name: &str) -> SecretRef {
    SecretRef {
        source: Some(secret_ref::Source::File(name.into())),
    }
}

/// A transfer from `source` to `target` with a verify pass.
fn transfer_req(source: Option<Endpoint>, target: Option<Endpoint>) -> StartTransferRequest {
    StartTransferRequest {
        source,
        target,
        options: Some(TransferOptions {
            verify: true,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Follows a job with WatchJob to its terminal state; returns it and every event as text.
async fn watch(client: &mut Client, id: &str) -> (Job, String) {
    let fut = async {
        let mut stream = client
            .watch_job(proto::WatchJobRequest { id: id.into() })
            .await
            .expect("watch")
            .into_inner();
        let (mut last, mut text) = (None, String::new());
        while let Some(ev) = stream.message().await.expect("watch stream") {
            text.push_str(&format!("{ev:?}\n"));
            last = ev.job;
        }
        (last.expect("the watch stream sent the job"), text)
    };
    let (job, text) = tokio::time::timeout(LIMIT, fut)
        .await
        .unwrap_or_else(|_| panic!("job {id} did not finish within {LIMIT:?}"));
    assert!(is_terminal(&job), "watch ended early: {job:?}");
    (job, text)
}

/// Everything the API shows of the server's jobs: GetJob of each, ListJobs (every page),
/// WatchJob of each.
async fn api_text(client: &mut Client, ids: &[String]) -> String {
    let mut text = String::new();
    for id in ids {
        let job = client
            .get_job(proto::GetJobRequest { id: id.clone() })
            .await
            .unwrap()
            .into_inner();
        text.push_str(&format!("{job:?}\n"));
        text.push_str(&watch(client, id).await.1);
    }
    let mut token = String::new();
    loop {
        let page = client
            .list_jobs(proto::ListJobsRequest {
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        text.push_str(&format!("{page:?}\n"));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    text
}

/// Fails when any secret value occurs in `haystack` (`what` names where it was found).
fn assert_no_secret(what: &str, haystack: &[u8]) {
    assert_absent(what, haystack, &SECRETS);
}

/// Fails when any secret value, or the access key id, occurs in `haystack`. (The key id
/// is an identifier rather than a secret: at debug level the AWS SDK logs it, never the
/// secret key. The API, metrics and the job store have only its reference.)
fn assert_no_credential(what: &str, haystack: &[u8]) {
    assert_no_secret(what, haystack);
    assert_absent(what, haystack, &[ACCESS_KEY]);
}

/// Looks for each needle as is and hex-encoded (the job store keeps requests in hex).
fn assert_absent(what: &str, haystack: &[u8], needles: &[&str]) {
    for needle in needles {
        assert!(
            !contains(haystack, needle.as_bytes()) && !contains(haystack, hex(needle).as_bytes()),
            "the credential {needle:?} appears in {what}"
        );
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn hex(text: &str) -> String {
    ferry_tests::check::hex(text.as_bytes())
}

fn transfer_result(job: &Job) -> &proto::TransferResult {
    match &job.result {
        Some(proto::job::Result::TransferResult(r)) => r,
        _ => panic!("no transfer result: {job:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_jobs_use_their_own_settings_and_credential_references() {
    let s = setup().await;
    let size = 40 * MIB + 4096;
    let src = make_image(&s.root.join("src.img"), size, 7);
    let expected = blkhash_file(&src);
    let server = s.start();
    let mut client = connect(server.grpc).await;
    let mut ids = Vec::new();
    let mut watched = String::new();

    // file -> s3, credentials from environment variables of the server.
    let req = transfer_req(endpoint(src.display().to_string()), s.s3_env("disk.img"));
    let job = client.start_transfer(req).await.unwrap().into_inner();
    let (up, text) = watch(&mut client, &job.id).await;
    watched.push_str(&text);
    ids.push(up.id.clone());
    assert_eq!(
        state(&up),
        JobState::Succeeded,
        "{:?}\n{}",
        up.error,
        server.stderr()
    );
    assert_eq!(
        blkhash_file(&s.s3.object_path(BUCKET, "disk.img")),
        expected
    );
    let r = transfer_result(&up);
    assert_eq!(r.size, size);
    assert_eq!(r.source_digest.as_ref().unwrap().hex, expected);
    assert_eq!(r.target_digest.as_ref().unwrap().hex, expected);
    assert!(
        s.s3.pending_uploads().is_empty(),
        "{:?}",
        s.s3.pending_uploads()
    );

    // checksum of the object, credentials from files under --secrets-dir.
    let ck = client
        .start_checksum(StartChecksumRequest {
            source: s.s3_file("disk.img"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (ck, text) = watch(&mut client, &ck.id).await;
    watched.push_str(&text);
    ids.push(ck.id.clone());
    assert_eq!(state(&ck), JobState::Succeeded, "{:?}", ck.error);
    let Some(proto::job::Result::ChecksumResult(c)) = &ck.result else {
        panic!("no checksum result: {ck:?}")
    };
    assert_eq!(c.digest.as_ref().unwrap().hex, expected);
    assert_eq!(c.size, size);

    // s3 -> file, credentials from files.
    let back = s.root.join("back.img");
    let req = transfer_req(s.s3_file("disk.img"), endpoint(back.display().to_string()));
    let job = client.start_transfer(req).await.unwrap().into_inner();
    let (down, text) = watch(&mut client, &job.id).await;
    watched.push_str(&text);
    ids.push(down.id.clone());
    assert_eq!(state(&down), JobState::Succeeded, "{:?}", down.error);
    assert_eq!(blkhash_file(&back), expected);
    assert_same_image(&src, &back);

    // A wrong secret key: the job fails at once with a permission error that names
    // neither the wrong secret nor the right one.
    let wrong = transfer_req(
        endpoint(src.display().to_string()),
        s.s3("wrong.img", env(KEY_ID_VAR), env(WRONG_VAR)),
    );
    let job = client.start_transfer(wrong).await.unwrap().into_inner();
    let (failed, text) = watch(&mut client, &job.id).await;
    watched.push_str(&text);
    ids.push(failed.id.clone());
    assert_eq!(state(&failed), JobState::Failed, "{failed:?}");
    let err = failed
        .error
        .clone()
        .expect("a failed job carries its error");
    assert_eq!(err.kind, "permission_denied", "{err:?}");
    assert_eq!(failed.attempt, 1, "a permission error is not retried");
    assert_no_credential("the job error", err.message.as_bytes());
    assert!(!s.s3.object_path(BUCKET, "wrong.img").exists());
    let wrong_ck = StartChecksumRequest {
        source: s.s3("disk.img", file(KEY_ID_FILE), env(WRONG_VAR)),
        ..Default::default()
    };
    let job = client.start_checksum(wrong_ck).await.unwrap().into_inner();
    let (failed, text) = watch(&mut client, &job.id).await;
    watched.push_str(&text);
    ids.push(failed.id.clone());
    assert_eq!(state(&failed), JobState::Failed, "{failed:?}");
    assert_eq!(failed.error.as_ref().unwrap().kind, "permission_denied");

    // Bad references are refused up front, naming the reference.
    let cases = [
        (
            s.s3("x.img", env(KEY_ID_VAR), env("FERRY_TEST_S3_UNSET")),
            Code::InvalidArgument,
            "target.s3.secret_access_key: environment variable FERRY_TEST_S3_UNSET is not set",
        ),
        (
            s.s3("x.img", file("no-such-key"), file(SECRET_FILE)),
            Code::InvalidArgument,
            "target.s3.access_key_id: secret file 'no-such-key' cannot be read",
        ),
        (
            s.s3("x.img", file("../secrets/s3-secret-access-key"), file(SECRET_FILE)),
            Code::PermissionDenied,
            "target.s3.access_key_id: secret file '../secrets/s3-secret-access-key' must be a relative name",
        ),
    ];
    for (target, code, message) in cases {
        let req = transfer_req(endpoint(src.display().to_string()), target);
        let status = client.start_transfer(req).await.unwrap_err();
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(message), "{status:?}");
        assert_no_credential("a refusal", status.message().as_bytes());
    }

    // Nowhere a secret: the API, the logs, /metrics, the job store.
    assert_no_credential("WatchJob events", watched.as_bytes());
    let api = api_text(&mut client, &ids).await;
    assert!(
        api.contains(SECRET_VAR) && api.contains(SECRET_FILE),
        "{api}"
    );
    assert_no_credential("GetJob/ListJobs/WatchJob", api.as_bytes());
    let metrics = scrape_metrics(server.metrics.unwrap()).await;
    let scrape = parse_metrics(&metrics);
    assert!(sample(&scrape, "ferry_written_bytes_total", &[("endpoint", "s3")]).unwrap() > 0.0);
    assert_no_credential("/metrics", metrics.as_bytes());
    let (status, _, log) = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}\n{log}");
    assert!(log.contains("DEBUG"), "the log has no debug lines:\n{log}");
    assert_no_secret("the server log", log.as_bytes());
    let store = s.store_bytes();
    // The search covers the stored requests (hex-encoded): their references are there.
    assert!(contains(&store, hex(SECRET_VAR).as_bytes()));
    assert_no_credential("the job store", &store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_job_reads_its_references_again_when_it_resumes_after_kill_9() {
    let s = setup().await;
    let size = 64 * MIB;
    let src = make_image(&s.root.join("src.img"), size, 9);
    let expected = blkhash_file(&src);
    let server = s.start();
    let mut client = connect(server.grpc).await;
    let up = transfer_req(endpoint(src.display().to_string()), s.s3_env("disk.img"));
    let up = client.start_transfer(up).await.unwrap().into_inner();
    let (up, _) = watch(&mut client, &up.id).await;
    assert_eq!(state(&up), JobState::Succeeded, "{:?}", up.error);

    // A slow s3 -> file copy, killed once part of it is committed.
    let back = s.root.join("back.img");
    let mut req = transfer_req(s.s3_file("disk.img"), endpoint(back.display().to_string()));
    let o = req.options.as_mut().unwrap();
    o.rate_limit = 8 * MIB;
    o.request_size = 256 * 1024;
    let job = client.start_transfer(req).await.unwrap().into_inner();
    watch_until(&mut client, &job.id, |j| {
        j.progress.as_ref().map_or(0, |p| p.committed_bytes) >= 4 * MIB
    })
    .await;
    // A checkpoint interval and a bit: the committed ranges are in the store now.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let first_log = server.stderr();
    server.kill9();
    assert_no_credential("the job store after kill -9", &s.store_bytes());

    let server = s.start();
    let mut client = connect(server.grpc).await;
    let (done, text) = watch(&mut client, &job.id).await;
    assert_eq!(
        state(&done),
        JobState::Succeeded,
        "{:?}\n{}",
        done.error,
        server.stderr()
    );
    assert_eq!(done.attempt, 2, "one attempt before the kill, one after");
    let r = transfer_result(&done);
    assert!(r.resumed_bytes >= 4 * MIB, "resumed {}", r.resumed_bytes);
    assert!(r.resumed_bytes < size);
    assert_eq!(r.target_digest.as_ref().unwrap().hex, expected);
    assert_eq!(blkhash_file(&back), expected);
    assert_no_credential("WatchJob events", text.as_bytes());
    let api = api_text(&mut client, &[up.id.clone(), done.id.clone()]).await;
    assert_no_credential("GetJob/ListJobs/WatchJob", api.as_bytes());
    let (status, _, log) = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}\n{log}");
    assert_no_secret("the first server's log", first_log.as_bytes());
    assert_no_secret("the second server's log", log.as_bytes());
    assert_no_credential("the job store", &s.store_bytes());
}
