//! `ferry serve` as a real process: kill -9 in the middle of a copy and restart (the job
//! resumes from its checkpoint, not from zero, and the result is byte-exact), graceful
//! SIGTERM within a bounded time, and the `ferry job` client commands.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ferry_api::proto::{self, JobState};
use ferry_tests::service_support::*;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");
const LIMIT: Duration = Duration::from_secs(180);
const MIB: u64 = 1024 * 1024;

struct Dirs {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    data: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("images");
    let data = tmp.path().join("data");
    std::fs::create_dir(&root).unwrap();
    Dirs {
        root,
        data,
        _tmp: tmp,
    }
}

fn serve_args(d: &Dirs) -> Vec<String> {
    vec![
        "--data-dir".into(),
        d.data.display().to_string(),
        "--allow-root".into(),
        d.root.display().to_string(),
        "--checkpoint-interval".into(),
        "300ms".into(),
        "--shutdown-timeout".into(),
        "10s".into(),
    ]
}

/// Starts a slow copy (rate limited) and waits until a checkpoint covering at least
/// `min_committed` bytes has had time to be persisted.
async fn slow_copy_until(
    client: &mut Client,
    src: &Path,
    dst: &Path,
    min_committed: u64,
) -> String {
    let mut req = transfer(src, dst);
    let o = req.options.as_mut().unwrap();
    o.rate_limit = 8 * MIB;
    o.request_size = 256 * 1024;
    let job = client.start_transfer(req).await.unwrap().into_inner();
    let mut stream = client
        .watch_job(proto::WatchJobRequest { id: job.id.clone() })
        .await
        .unwrap()
        .into_inner();
    loop {
        let ev = stream.message().await.unwrap().expect("job still running");
        let j = ev.job.unwrap();
        assert!(!is_terminal(&j), "the copy finished too early: {j:?}");
        if j.progress.unwrap().committed_bytes >= min_committed {
            break;
        }
    }
    // A checkpoint interval and a bit: the committed ranges are in the store now.
    tokio::time::sleep(Duration::from_millis(800)).await;
    job.id
}

#[tokio::test]
async fn kill_9_mid_copy_then_restart_resumes_from_the_checkpoint() {
    let d = dirs();
    // 64 MiB, half data: at 8 MiB/s the data takes about 4 s.
    let src = make_image(&d.root.join("src.img"), 64 * MIB, 1);
    let dst = d.root.join("dst.img");
    let server = ServeProcess::start(Path::new(BIN), &serve_args(&d), &[]);
    let mut client = connect(server.grpc).await;
    let id = slow_copy_until(&mut client, &src, &dst, 4 * MIB).await;
    let before = client
        .get_job(proto::GetJobRequest { id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    let committed_before = before.progress.unwrap().committed_bytes;
    server.kill9();

    let server = ServeProcess::start(Path::new(BIN), &serve_args(&d), &[]);
    let mut client = connect(server.grpc).await;
    let after_restart = client
        .get_job(proto::GetJobRequest { id: id.clone() })
        .await
        .expect("the job survived kill -9")
        .into_inner();
    assert!(!is_terminal(&after_restart), "{after_restart:?}");
    let done = wait_terminal(&mut client, &id, LIMIT).await;
    assert_eq!(
        state(&done),
        JobState::Succeeded,
        "{:?}\n{}",
        done.error,
        server.stderr()
    );
    assert_eq!(done.attempt, 2, "one attempt before the kill, one after");
    let log = server.stderr();
    assert!(
        log.contains("INFO") && !log.contains('\x1b'),
        "a text log into a pipe has no colour codes:\n{log}"
    );
    let Some(proto::job::Result::TransferResult(r)) = &done.result else {
        panic!("no result: {done:?}")
    };
    assert!(
        r.resumed_bytes >= 4 * MIB,
        "the copy started from zero again: resumed {} bytes (committed {} before the kill)",
        r.resumed_bytes,
        committed_before
    );
    assert!(r.resumed_bytes < 64 * MIB);
    assert_eq!(done.progress.unwrap().resumed_bytes, r.resumed_bytes);
    assert_same_image(&src, &dst);
    let s = parse_metrics(&scrape_metrics(server.metrics.unwrap()).await);
    let skipped = sample(&s, "ferry_skipped_bytes_total", &[("endpoint", "file")]).unwrap();
    assert!(skipped >= r.resumed_bytes as f64, "skipped {skipped}");
    // Data read after the restart is less than the image's data: the committed part was
    // not read again.
    let read = sample(&s, "ferry_read_bytes_total", &[("endpoint", "file")]).unwrap();
    assert!(
        read < 32.0 * MIB as f64,
        "read {read} bytes after the restart"
    );
}

#[tokio::test]
async fn sigterm_checkpoints_and_exits_in_bounded_time_then_resumes() {
    let d = dirs();
    let src = make_image(&d.root.join("src.img"), 64 * MIB, 2);
    let dst = d.root.join("dst.img");
    let server = ServeProcess::start(Path::new(BIN), &serve_args(&d), &[]);
    let mut client = connect(server.grpc).await;
    // A queued job too: it must run after the restart.
    let id = slow_copy_until(&mut client, &src, &dst, 2 * MIB).await;
    let (status, took, log) = server.terminate(Duration::from_secs(20));
    assert!(status.success(), "exit status {status:?}\n{log}");
    assert!(took < Duration::from_secs(12), "SIGTERM took {took:?}");
    assert!(log.contains("shutdown complete"), "{log}");

    let server = ServeProcess::start(Path::new(BIN), &serve_args(&d), &[]);
    let mut client = connect(server.grpc).await;
    let done = wait_terminal(&mut client, &id, LIMIT).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    let Some(proto::job::Result::TransferResult(r)) = &done.result else {
        panic!()
    };
    assert!(r.resumed_bytes >= 2 * MIB, "resumed {}", r.resumed_bytes);
    assert_same_image(&src, &dst);
}

#[tokio::test]
async fn queued_and_finished_jobs_survive_a_restart() {
    let d = dirs();
    let src = make_image(&d.root.join("src.img"), 16 * MIB, 3);
    let mut args = serve_args(&d);
    args.extend(["--max-running-jobs".to_string(), "1".to_string()]);
    let server = ServeProcess::start(Path::new(BIN), &args, &[]);
    let mut client = connect(server.grpc).await;
    let first = client
        .start_transfer(transfer(&src, &d.root.join("a.img")))
        .await
        .unwrap()
        .into_inner();
    let first = wait_terminal(&mut client, &first.id, LIMIT).await;
    let mut slow = transfer(&src, &d.root.join("b.img"));
    slow.options.as_mut().unwrap().rate_limit = 4 * MIB;
    let running = client.start_transfer(slow).await.unwrap().into_inner();
    let queued = client
        .start_transfer(transfer(&src, &d.root.join("c.img")))
        .await
        .unwrap()
        .into_inner();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let q = client
        .get_job(proto::GetJobRequest {
            id: queued.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&q), JobState::Queued);
    server.kill9();

    let server = ServeProcess::start(Path::new(BIN), &args, &[]);
    let mut client = connect(server.grpc).await;
    let f = client
        .get_job(proto::GetJobRequest {
            id: first.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&f), JobState::Succeeded);
    assert_eq!(f.result, first.result);
    for id in [&running.id, &queued.id] {
        let done = wait_terminal(&mut client, id, LIMIT).await;
        assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    }
    for name in ["a.img", "b.img", "c.img"] {
        assert_same_image(&src, &d.root.join(name));
    }
}

fn job_cmd(server: &ServeProcess, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("job")
        .args(["--server", &format!("http://{}", server.grpc)])
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run ferry-e2e job")
}

#[tokio::test]
async fn ferry_job_client_commands() {
    let d = dirs();
    let src = make_image(&d.root.join("src.img"), 8 * MIB, 4);
    let dst = d.root.join("dst.img");
    let server = ServeProcess::start(Path::new(BIN), &serve_args(&d), &[]);
    let (s, t) = (src.display().to_string(), dst.display().to_string());

    let out = job_cmd(
        &server,
        &[
            "start", &s, &t, "--verify", "--label", "who=cli", "--key", "k1", "--watch",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("state:    succeeded"), "{stdout}");
    assert_same_image(&src, &dst);

    let out = job_cmd(&server, &["--json", "list", "--label", "who=cli"]);
    assert!(out.status.success());
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON list");
    let jobs = list.as_array().unwrap();
    assert_eq!(jobs.len(), 1);
    let id = jobs[0]["id"].as_str().unwrap().to_string();
    assert_eq!(jobs[0]["state"], "succeeded");
    assert_eq!(
        jobs[0]["result"]["source_digest"]["hex"],
        jobs[0]["result"]["target_digest"]["hex"]
    );

    let out = job_cmd(&server, &["--json", "get", &id]);
    let job: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON job");
    assert_eq!(job["labels"]["who"], "cli");

    let out = job_cmd(&server, &["start", "--checksum", &t, "--watch"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("digest:"), "{stdout}");

    let mut slow = vec!["--json", "start", &s];
    let slow_dst = d.root.join("slow.img").display().to_string();
    slow.extend([slow_dst.as_str(), "--rate-limit", "1M"]);
    let out = job_cmd(&server, &slow);
    let job: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON job");
    let slow_id = job["id"].as_str().unwrap().to_string();
    let out = job_cmd(&server, &["cancel", &slow_id]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("cancelled"), "{stdout}");
    let out = job_cmd(&server, &["watch", &slow_id, "--no-progress"]);
    assert!(
        !out.status.success(),
        "watching a cancelled job exits non-zero"
    );

    let out = job_cmd(&server, &["get", "no-such-job"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no job with id"));

    let outside = job_cmd(&server, &["start", "/etc/passwd", &t]);
    assert!(!outside.status.success());
    assert!(String::from_utf8_lossy(&outside.stderr).contains("PermissionDenied"));
}
