//! A mover resumes from a checkpoint held outside the server, as the operator will do it:
//! the real `ferry serve` copies a rate-limited image while a watcher records the job's
//! checkpoint from WatchJob; the server is killed with SIGKILL; a new server with an
//! EMPTY data directory starts the transfer again with `resume_from` set to that
//! checkpoint, skips exactly those bytes, and leaves a byte-exact, sparse target. Also:
//! every malformed checkpoint is refused with a message naming the problem, and a resume
//! into a target that does not hold the checkpoint's bytes is caught by `verify`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferry_api::proto::{self, JobState};
use ferry_server::server::RunningService;
use ferry_tests::check::{assert_allocated_about, blkhash_file, qemu_img_compare_result};
use ferry_tests::nbd_servers::{NbdServer, QemuNbd};
use ferry_tests::service_support::*;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");
const LIMIT: Duration = Duration::from_secs(180);
const MIB: u64 = 1024 * 1024;
/// The image: 64 MiB, 1 MiB data runs alternating with 1 MiB holes.
const SIZE: u64 = 64 * MIB;

struct Dirs {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    tmp: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = ferry_tests::scratch_dir();
    let root = tmp.path().join("images");
    std::fs::create_dir(&root).unwrap();
    Dirs {
        root,
        tmp: tmp.path().to_path_buf(),
        _tmp: tmp,
    }
}

/// `ferry serve` with its own data directory, which must not exist yet (each server of
/// a test starts with nothing: no job, no checkpoint).
fn serve(d: &Dirs, data: &str) -> ServeProcess {
    let data = d.tmp.join(data);
    assert!(!data.exists(), "{} exists already", data.display());
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--allow-root",
        d.root.to_str().unwrap(),
        "--checkpoint-interval",
        "200ms",
    ]
    .map(String::from);
    ServeProcess::start(Path::new(BIN), &args, &[])
}

fn committed_bytes(c: &proto::Checkpoint) -> u64 {
    c.committed.iter().map(|r| r.end - r.start).sum()
}

fn transfer_result(job: &Job) -> &proto::TransferResult {
    match &job.result {
        Some(proto::job::Result::TransferResult(r)) => r,
        _ => panic!("no transfer result: {job:?}"),
    }
}

/// Starts a copy limited to 8 MiB/s (about 4 s for the image's 32 MiB of data) and
/// follows it until WatchJob shows a checkpoint with at least 4 MiB committed; returns
/// that checkpoint, the last one the watcher saw.
async fn copy_until_checkpoint(client: &mut Client, src: &str, dst: &Path) -> proto::Checkpoint {
    let req = StartTransferRequest {
        source: endpoint(src),
        target: endpoint(dst.display().to_string()),
        options: Some(TransferOptions {
            rate_limit: 8 * MIB,
            request_size: 256 * 1024,
            ..Default::default()
        }),
        ..Default::default()
    };
    let job = client.start_transfer(req).await.unwrap().into_inner();
    assert!(job.checkpoint.is_none(), "{job:?}");
    let mut stream = client
        .watch_job(proto::WatchJobRequest { id: job.id })
        .await
        .unwrap()
        .into_inner();
    loop {
        let j = stream
            .message()
            .await
            .unwrap()
            .expect("the job is still running")
            .job
            .unwrap();
        assert!(!is_terminal(&j), "the copy finished too early: {j:?}");
        let Some(cp) = j.checkpoint else { continue };
        assert_eq!(cp.size, SIZE);
        assert!(
            cp.committed.windows(2).all(|w| w[0].end <= w[1].start),
            "{cp:?}"
        );
        // The checkpoint is what progress counts as committed (fewer than 256 ranges here).
        assert_eq!(
            committed_bytes(&cp),
            j.progress.unwrap().committed_bytes,
            "{cp:?}"
        );
        if committed_bytes(&cp) >= 4 * MIB {
            return cp;
        }
    }
}

/// The whole mover story for one source URL; `src` is the file the source serves.
async fn kill_then_resume_elsewhere(d: &Dirs, source_url: &str, src: &Path, endpoint_kind: &str) {
    let dst = d.root.join("dst.img");
    let server = serve(d, "data-first");
    let mut client = connect(server.grpc).await;
    let checkpoint = copy_until_checkpoint(&mut client, source_url, &dst).await;
    server.kill9();

    // A new mover: a fresh server that has never heard of the job.
    let started = Instant::now();
    let server = serve(d, "data-second");
    let mut client = connect(server.grpc).await;
    let req = StartTransferRequest {
        source: endpoint(source_url),
        target: endpoint(dst.display().to_string()),
        options: Some(TransferOptions::default()),
        resume_from: Some(checkpoint.clone()),
        ..Default::default()
    };
    let job = client.start_transfer(req).await.unwrap().into_inner();
    assert_eq!(job.checkpoint.as_ref(), Some(&checkpoint), "{job:?}");
    let done = wait_terminal(&mut client, &job.id, LIMIT).await;
    assert_eq!(
        state(&done),
        JobState::Succeeded,
        "{:?}\n{}",
        done.error,
        server.stderr()
    );
    let resumed = committed_bytes(&checkpoint);
    assert!(resumed > 0 && resumed < SIZE, "{checkpoint:?}");
    assert_eq!(transfer_result(&done).resumed_bytes, resumed);
    assert_eq!(done.progress.unwrap().resumed_bytes, resumed);
    assert_eq!(done.attempt, 1, "the new server's first attempt");
    // A finished copy's checkpoint: everything committed.
    let full = done.checkpoint.expect("a checkpoint");
    assert_eq!(
        (full.size, full.committed),
        (
            SIZE,
            vec![proto::Range {
                start: 0,
                end: SIZE
            }]
        )
    );
    // The resumed bytes were not read again: less than the image's 32 MiB of data.
    let s = parse_metrics(&scrape_metrics(server.metrics.unwrap()).await);
    let read = sample(&s, "ferry_read_bytes_total", &[("endpoint", endpoint_kind)]).unwrap();
    assert!(
        read < 32.0 * MIB as f64,
        "read {read} bytes after the resume"
    );
    eprintln!(
        "resumed {resumed} of {SIZE} bytes ({} ranges); the second server read {read} bytes \
         and finished in {:?}",
        checkpoint.committed.len(),
        started.elapsed()
    );

    if let Err(e) = qemu_img_compare_result(src, &dst) {
        panic!("{e}");
    }
    assert_eq!(blkhash_file(src), blkhash_file(&dst));
    assert_allocated_about(&dst, SIZE / 2);
}

#[tokio::test]
async fn file_source_resumes_on_a_new_server_from_the_recorded_checkpoint() {
    let d = dirs();
    let src = make_image(&d.root.join("src.img"), SIZE, 7);
    kill_then_resume_elsewhere(&d, src.to_str().unwrap(), &src, "file").await;
}

#[tokio::test]
async fn nbd_source_resumes_on_a_new_server_from_the_recorded_checkpoint() {
    let d = dirs();
    let src = make_image(&d.tmp.join("nbd-src.img"), SIZE, 9);
    let nbd = NbdServer::qemu_nbd(
        &src,
        &QemuNbd {
            export: "disk".into(),
            read_only: true,
            ..Default::default()
        },
    );
    kill_then_resume_elsewhere(&d, &nbd.uri(), &src, "nbd").await;
}

/// An in-process service over `d.root` for the checks that need no process to die.
async fn in_process(d: &Dirs) -> (RunningService, Client) {
    let cfg = test_config(&d.tmp.join("data"), &d.root);
    let service = start_in_process(cfg).await;
    let client = connect(service.grpc_addr()).await;
    (service, client)
}

fn checkpoint(size: u64, ranges: &[(u64, u64)]) -> proto::Checkpoint {
    proto::Checkpoint {
        size,
        committed: ranges
            .iter()
            .map(|&(start, end)| proto::Range { start, end })
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_checkpoints_are_refused_naming_the_problem() {
    let d = dirs();
    let src = make_image(&d.root.join("src.img"), 4 * MIB, 3);
    let dst = d.root.join("dst.img");
    let (service, mut client) = in_process(&d).await;
    let too_many: Vec<(u64, u64)> = (0..257).map(|i| (i * 4096, i * 4096 + 512)).collect();
    let cases = [
        (
            checkpoint(4 * MIB, &[(0, MIB), (2 * MIB, 2 * MIB)]),
            "resume_from.committed[1] [2097152, 2097152) is empty",
        ),
        (
            checkpoint(4 * MIB, &[(MIB, 0)]),
            "resume_from.committed[0] [1048576, 0) is empty",
        ),
        (
            checkpoint(4 * MIB, &[(2 * MIB, 3 * MIB), (0, MIB)]),
            "resume_from.committed[1] [0, 1048576) starts before the end of the range before \
             it (3145728): ranges must be sorted and must not overlap",
        ),
        (
            checkpoint(4 * MIB, &[(0, 2 * MIB), (MIB, 3 * MIB)]),
            "resume_from.committed[1] [1048576, 3145728) starts before the end",
        ),
        (
            checkpoint(4 * MIB, &[(3 * MIB, 4 * MIB + 1)]),
            "resume_from.committed[0] [3145728, 4194305) ends beyond resume_from.size 4194304",
        ),
        (
            checkpoint(4 * MIB, &too_many),
            "resume_from.committed has 257 ranges: at most 256",
        ),
    ];
    for (cp, expected) in cases {
        let mut req = transfer(&src, &dst);
        req.resume_from = Some(cp);
        let status = client.start_transfer(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(expected), "{status:?}");
    }
    assert!(!dst.exists(), "a refused request created the target");

    // The size is the source's, known when the job opens it: the job fails before the
    // target is opened.
    let mut req = transfer(&src, &dst);
    req.resume_from = Some(checkpoint(8 * MIB, &[(0, MIB)]));
    let job = client.start_transfer(req).await.unwrap().into_inner();
    let done = wait_terminal(&mut client, &job.id, LIMIT).await;
    assert_eq!(state(&done), JobState::Failed, "{done:?}");
    let error = done.error.clone().unwrap();
    assert_eq!(error.kind, "invalid_input", "{error:?}");
    assert!(
        error
            .message
            .contains("resume_from.size 8388608 is not the source's size 4194304"),
        "{error:?}"
    );
    assert_eq!(done.attempt, 1, "not retried: {done:?}");
    assert!(!dst.exists(), "the job created the target");

    // Well-formed edge cases are accepted: adjacent ranges, and no range at all.
    for cp in [
        checkpoint(4 * MIB, &[(0, MIB), (MIB, 2 * MIB)]),
        checkpoint(4 * MIB, &[]),
    ] {
        let resumed = committed_bytes(&cp);
        let mut req = transfer(&src, &dst);
        req.resume_from = Some(cp);
        if resumed > 0 {
            // The target holds those bytes.
            std::fs::copy(&src, &dst).unwrap();
        }
        let job = client.start_transfer(req).await.unwrap().into_inner();
        let done = wait_terminal(&mut client, &job.id, LIMIT).await;
        assert_eq!(state(&done), JobState::Succeeded, "{done:?}");
        assert_eq!(transfer_result(&done).resumed_bytes, resumed);
        assert!(qemu_img_compare_result(&src, &dst).is_ok());
        std::fs::remove_file(&dst).unwrap();
    }
    service.shutdown().await;
}

/// The caller asserts that the target holds the checkpoint's bytes; the server does not
/// read them. Resuming into a target that does not hold them leaves a wrong image (the
/// check below can fail), and `verify` catches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_catches_a_resume_into_a_target_without_the_bytes() {
    let d = dirs();
    let src = make_image(&d.root.join("src.img"), 8 * MIB, 5);
    let (service, mut client) = in_process(&d).await;
    // "[0, 4 MiB) is committed" - but these targets are new and empty.
    let claim = checkpoint(8 * MIB, &[(0, 4 * MIB)]);
    let mut outcomes = Vec::new();
    for verify in [false, true] {
        let dst = d.root.join(format!("dst-verify-{verify}.img"));
        let mut req = transfer(&src, &dst);
        req.resume_from = Some(claim.clone());
        req.options.as_mut().unwrap().verify = verify;
        let job = client.start_transfer(req).await.unwrap().into_inner();
        let done = wait_terminal(&mut client, &job.id, LIMIT).await;
        outcomes.push((done, dst));
    }
    let (trusted, dst) = &outcomes[0];
    assert_eq!(state(trusted), JobState::Succeeded, "{trusted:?}");
    assert_eq!(transfer_result(trusted).resumed_bytes, 4 * MIB);
    let differs = qemu_img_compare_result(&src, dst).expect_err("the skipped bytes are missing");
    assert!(
        differs.contains("Content mismatch at offset 0"),
        "{differs}"
    );
    // The copied half is right: only the claimed range is wrong.
    let tail = |p: &Path| std::fs::read(p).unwrap()[4 * MIB as usize..].to_vec();
    assert!(tail(&src) == tail(dst));

    let (verified, _) = &outcomes[1];
    assert_eq!(state(verified), JobState::Failed, "{verified:?}");
    let error = verified.error.as_ref().unwrap();
    assert_eq!(error.kind, "corrupt", "{error:?}");
    service.shutdown().await;
}
