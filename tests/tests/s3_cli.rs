//! `ferry copy` and `ferry checksum` with s3:// URLs, configured the way users configure
//! the AWS SDK: endpoint, region and credentials from the environment only (the server is
//! the in-process s3s-fs; the ferry binary under test is a separate process).

// Until tests/src/lib.rs exports it as ferry_tests::s3_server.

use std::process::Stdio;

use ferry_tests::bin::{wait_with_deadline, Run, DEFAULT_DEADLINE};
use ferry_tests::check::{blkhash_file, qemu_img_compare};
use ferry_tests::images::{self, Pattern};
use ferry_tests::s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};
use ferry_tests::{ferry, scratch_dir};

const BUCKET: &str = "images";

/// Runs ferry with the server's settings in the SDK's standard environment variables
/// (and nothing from this machine's AWS config files or metadata service).
async fn run(server: &S3Server, secret: &str, args: &[&str]) -> Run {
    let empty = server.root().join("empty-aws-config");
    std::fs::write(&empty, "").expect("write an empty AWS config file");
    let mut cmd = ferry!().command(args);
    cmd.env("AWS_ENDPOINT_URL", server.endpoint_url())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_CONFIG_FILE", &empty)
        .env("AWS_SHARED_CREDENTIALS_FILE", &empty)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .stdin(Stdio::null());
    let description = format!("{cmd:?}");
    let child = cmd.spawn().expect("start ferry");
    tokio::task::spawn_blocking(move || wait_with_deadline(child, DEFAULT_DEADLINE, description))
        .await
        .expect("wait for ferry")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_and_checksum_through_the_environment() {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET);
    let scratch = scratch_dir();
    // Above the default 16 MiB part size: a multipart upload through the CLI.
    let size = 40 * 1024 * 1024 + 1234;
    let img = images::make(&scratch.path().join("a.img"), Pattern::HalfData, size, 42).unwrap();
    let src = img.path.to_str().unwrap();
    let expected = blkhash_file(&img.path);

    let url = format!("s3://{BUCKET}/cli/disk.img");
    run(&server, SECRET_KEY, &["copy", "--no-progress", src, &url])
        .await
        .assert_success();
    assert_eq!(
        blkhash_file(&server.object_path(BUCKET, "cli/disk.img")),
        expected
    );
    assert!(
        server.pending_uploads().is_empty(),
        "{:?}",
        server.pending_uploads()
    );

    let out = run(&server, SECRET_KEY, &["checksum", "--no-progress", &url]).await;
    out.assert_success();
    assert!(out.stdout.contains(&expected), "{out}");

    let back = scratch.path().join("back.img");
    run(
        &server,
        SECRET_KEY,
        &["copy", "--no-progress", &url, back.to_str().unwrap()],
    )
    .await
    .assert_success();
    qemu_img_compare(&img.path, &back);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_errors_are_one_clean_line_without_secrets() {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET);
    let scratch = scratch_dir();
    let img = images::make(&scratch.path().join("a.img"), Pattern::Random, 4096, 1).unwrap();
    let src = img.path.to_str().unwrap();
    let wrong = "definitely-not-the-secret-123";

    let out = run(
        &server,
        wrong,
        &["copy", "--no-progress", src, "s3://images/big.img"],
    )
    .await;
    let line = out.assert_clean_failure();
    assert!(
        line.contains("bucket 'images'") && line.contains("check the"),
        "{line}"
    );
    assert!(
        !out.stderr.contains(wrong) && !out.stderr.contains(ACCESS_KEY),
        "{out}"
    );

    let out = run(
        &server,
        SECRET_KEY,
        &[
            "copy",
            "--no-progress",
            "s3://images/missing.img",
            "/dev/null",
        ],
    )
    .await;
    let line = out.assert_clean_failure();
    assert!(
        line.contains("'missing.img' not found in bucket 'images'"),
        "{line}"
    );

    let out = run(
        &server,
        SECRET_KEY,
        &["copy", "--no-progress", src, "s3://no-such-bucket/x.img"],
    )
    .await;
    let line = out.assert_clean_failure();
    assert!(
        line.contains("bucket 'no-such-bucket' does not exist"),
        "{line}"
    );
    assert!(server.pending_uploads().is_empty());
}
