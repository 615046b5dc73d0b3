//! S3 failures against a real server (s3s + s3s-fs in process): wrong credentials, a missing
//! bucket or key give clear errors that name what is wrong and never show a secret; a server
//! that stops mid-upload fails the copy cleanly, nothing is reported done, and the multipart
//! upload is aborted once the server is back; an upload dropped unfinished is aborted too.

// Until tests/src/lib.rs exports it as ferry_tests::s3_server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::spec::S3Spec;
use ferry_core::{EndpointSpec, ErrorKind, IoBuf, Secret, Source, Target};
use ferry_endpoints::s3::{S3Options, S3Source, S3Target, MIN_PART_SIZE};
use ferry_endpoints::SourceOptions;
use ferry_engine::{CancellationToken, CopyOptions, Progress};
use ferry_tests::images::{self, Pattern};
use ferry_tests::s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};
use ferry_tests::scratch_dir;

const BUCKET: &str = "images";
const MIB: u64 = 1024 * 1024;

fn spec(bucket: &str, key: &str) -> S3Spec {
    S3Spec {
        bucket: bucket.to_string(),
        key: key.to_string(),
    }
}

async fn server_with_object(key: &str, size: usize) -> S3Server {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET);
    let target = S3Target::open(&spec(BUCKET, key), size as u64, &server.options())
        .await
        .unwrap();
    let mut buf = IoBuf::new(size);
    buf.fill(0x5a);
    target.write_at(0, buf).await.unwrap();
    target.finish().await.unwrap();
    server
}

fn assert_no_secret(text: &str) {
    for secret in [
        SECRET_KEY,
        "wrong-secret-value-42",
        ACCESS_KEY,
        "AKIAWRONGKEY",
    ] {
        assert!(!text.contains(secret), "a credential leaked: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_permission_denied_naming_the_bucket() {
    let server = server_with_object("disk.img", 4096).await;
    let cases = [
        ("wrong secret", ACCESS_KEY, "wrong-secret-value-42"),
        ("unknown key", "AKIAWRONGKEY", SECRET_KEY),
    ];
    for (what, key_id, secret) in cases {
        let mut options = server.options();
        options.access_key_id = Some(Secret::new(key_id));
        options.secret_access_key = Some(Secret::new(secret));
        assert_no_secret(&format!("{options:?}"));

        let err = S3Source::open(&spec(BUCKET, "disk.img"), &options)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{what}: {err}");
        let text = err.to_string();
        assert!(text.contains("bucket 'images'"), "{what}: {text}");
        assert!(text.contains("check the"), "{what}: {text}");
        assert_no_secret(&text);
        assert_no_secret(&format!("{err:?}"));

        // A multipart target fails at open (CreateMultipartUpload); a single-PUT target at finish.
        let err = S3Target::open(&spec(BUCKET, "new.img"), 4 * MIN_PART_SIZE, &options)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{what}: {err}");
        assert!(err.to_string().contains("bucket 'images'"), "{err}");
        assert_no_secret(&format!("{err} {err:?}"));

        let target = S3Target::open(&spec(BUCKET, "small.img"), 10, &options)
            .await
            .unwrap();
        target.write_at(0, IoBuf::new(10)).await.unwrap();
        let err = target.finish().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{what}: {err}");
        assert_no_secret(&format!("{err} {err:?} {target:?}"));
    }
    assert!(
        server.pending_uploads().is_empty(),
        "{:?}",
        server.pending_uploads()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_bucket_and_key_are_not_found_naming_them() {
    let server = server_with_object("disk.img", 4096).await;
    let options = server.options();

    let err = S3Source::open(&spec("no-such-bucket", "disk.img"), &options)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(
        err.to_string()
            .contains("bucket 'no-such-bucket' does not exist"),
        "{err}"
    );

    let err = S3Source::open(&spec(BUCKET, "dir/missing.img"), &options)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("'dir/missing.img' not found in bucket 'images'"),
        "{text}"
    );

    let err = S3Target::open(
        &spec("no-such-bucket", "x.img"),
        3 * MIN_PART_SIZE,
        &options,
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(
        err.to_string()
            .contains("bucket 'no-such-bucket' does not exist"),
        "{err}"
    );

    // Below the part size (a single PUT at the end) the bucket is checked at open too.
    let err = S3Target::open(&spec("no-such-bucket", "x.img"), 1000, &options)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("no-such-bucket"), "{err}");
    assert!(server.pending_uploads().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_beyond_the_object_are_refused() {
    let server = server_with_object("disk.img", 4096).await;
    let source = S3Source::open(&spec(BUCKET, "disk.img"), &server.options())
        .await
        .unwrap();
    let err = source.read_at(4000, IoBuf::new(200)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let buf = source.read_at(4000, IoBuf::new(96)).await.unwrap();
    assert!(buf.iter().all(|&b| b == 0x5a));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stopping_mid_upload_fails_cleanly_and_the_upload_is_aborted_when_it_returns() {
    let mut server = S3Server::start().await;
    server.create_bucket(BUCKET);
    let scratch = scratch_dir();
    let size = 8 * MIN_PART_SIZE;
    let img = images::make(&scratch.path().join("big.img"), Pattern::Random, size, 9).unwrap();
    let mut options: S3Options = server.options();
    options.abort_timeout = Some(Duration::from_secs(60));
    let key = "crash/disk.img";
    let target = Arc::new(
        S3Target::open(&spec(BUCKET, key), size, &options)
            .await
            .unwrap(),
    );
    let source = ferry_endpoints::open_source(
        &EndpointSpec::File(img.path.clone()),
        &SourceOptions::default(),
    )
    .await
    .unwrap();

    let progress = Progress::new();
    let copy_options = CopyOptions {
        // Slow enough that the server goes away in the middle of the upload.
        rate_limit: Some(8 * MIB),
        ..CopyOptions::default()
    };
    let copy = tokio::spawn({
        let progress = progress.clone();
        let target: Arc<dyn Target> = target.clone();
        async move {
            ferry_engine::copy(
                source,
                target,
                &copy_options,
                &progress,
                &CancellationToken::new(),
            )
            .await
        }
    });

    // Wait until at least one part is stored, then pull the plug.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !server
        .pending_uploads()
        .iter()
        .any(|name| name.contains(".part-"))
    {
        assert!(Instant::now() < deadline, "no part was ever uploaded");
        assert!(
            !copy.is_finished(),
            "the copy ended before the server stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
    assert!(progress.snapshot().done < size, "the copy was already done");

    // The copy fails while the server is down and the engine aborts the target; the abort
    // keeps retrying until the server is back.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !target.is_aborted() {
        assert!(Instant::now() < deadline, "the copy did not fail");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Longer than the SDK's own retries of one request: only ferry's abort loop is left.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        !copy.is_finished(),
        "the abort cannot have reached the server"
    );
    assert!(!target.is_finished());
    assert!(
        !server.pending_uploads().is_empty(),
        "the upload is still there while the server is down"
    );
    server.restart().await;

    let result = tokio::time::timeout(Duration::from_secs(90), copy)
        .await
        .expect("the copy ends")
        .expect("the copy task does not panic");
    let err = result.expect_err("the copy must fail");
    assert!(
        err.kind().is_transient(),
        "a lost server is a transient failure: {err}"
    );
    assert!(
        err.to_string().contains("s3://images/crash/disk.img"),
        "{err}"
    );
    assert!(
        server.pending_uploads().is_empty(),
        "the multipart upload was not aborted: {:?}",
        server.pending_uploads()
    );
    assert!(
        !server.object_path(BUCKET, key).exists(),
        "a failed upload must not leave an object"
    );
    let done = progress.checkpoint();
    let committed: u64 = done.committed.iter().map(|(s, e)| e - s).sum();
    assert!(committed < size, "nothing may be reported done: {done:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_dropped_unfinished_is_aborted() {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET);
    let size = 3 * MIN_PART_SIZE;
    let target = S3Target::open(&spec(BUCKET, "dropped.img"), size, &server.options())
        .await
        .unwrap();
    let mut buf = IoBuf::new(MIN_PART_SIZE as usize);
    buf.fill(1);
    let buf = target.write_at(0, buf).await.unwrap();
    target.flush().await.unwrap();
    drop(buf);
    assert!(
        server
            .pending_uploads()
            .iter()
            .any(|n| n.contains(".part-1")),
        "{:?}",
        server.pending_uploads()
    );
    drop(target);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.pending_uploads().is_empty() {
        assert!(
            Instant::now() < deadline,
            "not aborted: {:?}",
            server.pending_uploads()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!server.object_path(BUCKET, "dropped.img").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_abort_removes_parts_and_refuses_more_writes() {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET);
    let size = 2 * MIN_PART_SIZE + 1;
    let target = S3Target::open(&spec(BUCKET, "aborted.img"), size, &server.options())
        .await
        .unwrap();
    target
        .write_zeroes(0, MIN_PART_SIZE, ferry_core::ZeroMode::MayDeallocate)
        .await
        .unwrap();
    target.flush().await.unwrap();
    assert!(!server.pending_uploads().is_empty());
    target.abort().await.unwrap();
    assert!(
        server.pending_uploads().is_empty(),
        "{:?}",
        server.pending_uploads()
    );
    let err = target
        .write_at(MIN_PART_SIZE, IoBuf::new(10))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert!(target.finish().await.is_err());
    // Writing a part twice is refused rather than silently corrupting the object.
    let target = S3Target::open(&spec(BUCKET, "twice.img"), size, &server.options())
        .await
        .unwrap();
    target
        .write_zeroes(0, MIN_PART_SIZE, ferry_core::ZeroMode::MayDeallocate)
        .await
        .unwrap();
    let err = target.write_at(10, IoBuf::new(10)).await.unwrap_err();
    assert!(err.to_string().contains("already complete"), "{err}");
    target.abort().await.unwrap();
    assert!(server.pending_uploads().is_empty());
    let _ = MIB;
}
