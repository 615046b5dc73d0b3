//! Fan-out through the job service (a real gRPC server on 127.0.0.1:0 in this process):
//! one source into three file targets in one job, each compared with `qemu-img compare`
//! and kept sparse; one target failing (an nbdkit export whose writes all fail) while the
//! other two get the image and the job fails naming it; verify on; a cancelled job
//! resumed into every target from its checkpoint; and `ferry job start` with several
//! targets.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_api::proto::{self, JobState, TargetState};
use ferry_tests::check::{assert_allocated_about, qemu_img_compare};
use ferry_tests::images::{make, Image, Pattern};
use ferry_tests::nbd_servers::{NbdServer, Nbdkit};
use ferry_tests::service_support::*;

const LIMIT: Duration = Duration::from_secs(120);
const MIB: u64 = 1 << 20;
const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");

struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
    service: ferry_server::server::RunningService,
    client: Client,
}

async fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("images");
    std::fs::create_dir(&root).unwrap();
    let service = start_in_process(test_config(&dir.path().join("data"), &root)).await;
    let client = connect(service.grpc_addr()).await;
    Env {
        _dir: dir,
        root,
        service,
        client,
    }
}

fn image(root: &Path, size: u64) -> Image {
    make(&root.join("golden.img"), Pattern::HalfData, size, 17).expect("make the image")
}

/// Byte for byte the image, and as sparse as it.
fn holds(image: &Image, target: &Path) {
    assert_eq!(std::fs::metadata(target).unwrap().len(), image.size);
    qemu_img_compare(&image.path, target);
    assert_allocated_about(target, image.nonzero_block_bytes);
}

/// A transfer of `image` into `targets` (the first is `target`, the rest `more_targets`).
fn fan_out(image: &Image, targets: &[String]) -> StartTransferRequest {
    StartTransferRequest {
        source: endpoint(image.path.display().to_string()),
        target: endpoint(targets[0].clone()),
        more_targets: targets[1..]
            .iter()
            .map(|t| endpoint(t.clone()).unwrap())
            .collect(),
        options: Some(TransferOptions::default()),
        ..Default::default()
    }
}

fn files(root: &Path, names: &[&str]) -> Vec<PathBuf> {
    names.iter().map(|n| root.join(n)).collect()
}

fn urls(paths: &[PathBuf]) -> Vec<String> {
    paths.iter().map(|p| p.display().to_string()).collect()
}

fn target_state(t: &proto::TargetOutcome) -> TargetState {
    TargetState::try_from(t.state).unwrap_or(TargetState::Unspecified)
}

#[tokio::test]
async fn one_job_writes_three_files_verified_and_sparse() {
    let mut e = env().await;
    let image = image(&e.root, 48 * MIB);
    let targets = files(&e.root, &["a.img", "b.img", "c.img"]);
    let mut req = fan_out(&image, &urls(&targets));
    req.options.as_mut().unwrap().verify = true;
    let job = e.client.start_transfer(req).await.unwrap().into_inner();
    assert_eq!(job.targets.len(), 3);
    let done = wait_terminal(&mut e.client, &job.id, LIMIT).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    for t in &targets {
        holds(&image, t);
    }
    let Some(proto::job::Result::TransferResult(r)) = &done.result else {
        panic!("no transfer result: {done:?}")
    };
    let source = r.source_digest.clone().expect("verified");
    assert_eq!(r.size, image.size);
    for (t, path) in done.targets.iter().zip(&targets) {
        assert_eq!(target_state(t), TargetState::Succeeded, "{t:?}");
        assert_eq!(t.target, path.display().to_string());
        assert_eq!(t.digest.as_ref(), Some(&source), "each target read back");
        assert_eq!(t.done_bytes, image.size);
        assert!(t.resumable);
    }
    let s = parse_metrics(&scrape_metrics(e.service.metrics_addr().unwrap()).await);
    let succeeded = sample(
        &s,
        "ferry_transfer_targets_total",
        &[("endpoint", "file"), ("result", "succeeded")],
    );
    assert_eq!(succeeded, Some(3.0));
    // Each target got the data (and only it: the holes stay holes).
    let written = sample(&s, "ferry_written_bytes_total", &[("endpoint", "file")]).unwrap();
    let data = image.nonzero_block_bytes as f64;
    assert!(
        (3.0 * data * 0.99..4.0 * data).contains(&written),
        "three targets of {data} data bytes, {written} written"
    );
}

#[tokio::test]
async fn a_failing_target_fails_the_job_naming_it_and_the_others_hold_the_image() {
    let mut e = env().await;
    let image = image(&e.root, 32 * MIB);
    let broken = NbdServer::nbdkit(
        &[
            "memory",
            &format!("size={}", image.size),
            "error-pwrite=EIO",
            "error-pwrite-rate=100%",
        ],
        &Nbdkit {
            filters: vec!["error".into()],
            ..Nbdkit::default()
        },
    );
    let files = files(&e.root, &["a.img", "c.img"]);
    let targets = vec![
        files[0].display().to_string(),
        broken.uri(),
        files[1].display().to_string(),
    ];
    let mut req = fan_out(&image, &targets);
    req.options.as_mut().unwrap().verify = true;
    let job = e.client.start_transfer(req).await.unwrap().into_inner();
    let done = wait_terminal(&mut e.client, &job.id, LIMIT).await;
    assert_eq!(state(&done), JobState::Failed, "{done:?}");
    for f in &files {
        holds(&image, f);
    }
    let error = done.error.clone().expect("the job's error");
    assert!(
        error.message.starts_with("1 of 3 targets failed: "),
        "{}",
        error.message
    );
    let port = format!(":{}", broken.port().expect("a TCP export"));
    assert!(
        error.message.contains(&port),
        "names the target: {}",
        error.message
    );
    assert!(
        error.message.contains("a.img") && error.message.contains("c.img"),
        "says where the image is: {}",
        error.message
    );
    let states: Vec<TargetState> = done.targets.iter().map(target_state).collect();
    assert_eq!(
        states,
        [
            TargetState::Succeeded,
            TargetState::Failed,
            TargetState::Succeeded
        ]
    );
    let failed = &done.targets[1];
    assert!(!failed.resumable);
    assert!(failed.error.is_some() && failed.digest.is_none());
    assert!(
        done.targets[0].digest.is_some() && done.targets[2].digest.is_some(),
        "verified: {done:?}"
    );
    assert!(
        matches!(done.result, Some(proto::job::Result::TransferResult(_))),
        "what was done for the targets that hold the image: {done:?}"
    );
}

#[tokio::test]
async fn a_cancelled_fan_out_resumes_into_every_target() {
    let mut e = env().await;
    let image = image(&e.root, 64 * MIB);
    let targets = files(&e.root, &["a.img", "b.img", "c.img"]);
    let mut req = fan_out(&image, &urls(&targets));
    let o = req.options.as_mut().unwrap();
    o.rate_limit = 8 * MIB;
    o.request_size = 256 * 1024;
    let job = e
        .client
        .start_transfer(req.clone())
        .await
        .unwrap()
        .into_inner();
    watch_until(&mut e.client, &job.id, |j| {
        j.progress.as_ref().map_or(0, |p| p.committed_bytes) >= 4 * MIB
    })
    .await;
    let cancelled = e
        .client
        .cancel_job(proto::CancelJobRequest { id: job.id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&cancelled), JobState::Cancelled);
    let checkpoint = cancelled.checkpoint.clone().expect("a checkpoint");
    assert!(
        cancelled.targets.iter().all(|t| t.resumable),
        "every target holds the checkpoint: {cancelled:?}"
    );

    let mut again = req;
    let o = again.options.as_mut().unwrap();
    o.rate_limit = 0;
    o.verify = true;
    again.resume_from = Some(checkpoint);
    let job = e.client.start_transfer(again).await.unwrap().into_inner();
    let done = wait_terminal(&mut e.client, &job.id, LIMIT).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    let Some(proto::job::Result::TransferResult(r)) = &done.result else {
        panic!("no result: {done:?}")
    };
    assert!(
        r.resumed_bytes >= 4 * MIB,
        "resumed {} bytes",
        r.resumed_bytes
    );
    for t in &targets {
        qemu_img_compare(&image.path, t);
    }
    assert!(done
        .targets
        .iter()
        .all(|t| target_state(t) == TargetState::Succeeded && t.digest.is_some()));
}

#[tokio::test]
async fn ferry_job_start_takes_several_targets() {
    let e = env().await;
    let image = image(&e.root, 16 * MIB);
    let targets = files(&e.root, &["x.img", "y.img", "z.img"]);
    let mut command = std::process::Command::new(BIN);
    command
        .arg("job")
        .args(["--server", &format!("http://{}", e.service.grpc_addr())])
        .args(["start", &image.path.display().to_string()])
        .args(urls(&targets))
        .args(["--verify", "--watch"])
        .env_remove("RUST_LOG");
    // Off the runtime's thread: the service under test runs on it.
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("run ferry-e2e job");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("state:    succeeded"), "{stdout}");
    for t in &targets {
        holds(&image, t);
        let line = format!("target:   {} succeeded", t.display());
        assert!(stdout.contains(&line), "{line} in {stdout}");
    }
}
