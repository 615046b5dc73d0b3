//! Benchmark of the job service (not a pass/fail test: it is ignored by default and only
//! prints numbers). Run it on a release build:
//!
//! ```text
//! cargo test --release -p ferry-tests --test e2e -- service_bench:: --ignored --nocapture
//! ```
//!
//! It measures, in one run on this machine:
//! - a 4 GiB copy (2 GiB data in 1 MiB runs alternating with holes, page cache warm)
//!   through `ferry serve` (StartTransfer to terminal state seen by WatchJob) against the
//!   same copy by `ferry copy`, alternating, 3 times each: medians and the ratio;
//! - StartTransfer latency p50/p99/max with 50 concurrent clients (2,000 requests);
//! - the server's RSS idle and with 1,000 queued jobs.
//!
//! FERRY_BENCH_SIZE (bytes) shrinks the copy for a quick look.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_tests::service_support::*;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");
const GIB: u64 = 1024 * 1024 * 1024;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn drop_target(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// Starts `per_client` small transfers from each of 50 concurrent clients; returns the
/// sorted latencies in milliseconds and the wall time.
async fn start_many(
    addr: std::net::SocketAddr,
    small: &Path,
    root: &Path,
    prefix: &str,
    per_client: usize,
) -> (Vec<f64>, Duration) {
    let latencies = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let t = Instant::now();
    for c in 0..50 {
        let (small, root, latencies) = (small.to_path_buf(), root.to_path_buf(), latencies.clone());
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let mut client = connect(addr).await;
            for i in 0..per_client {
                let req = transfer(&small, &root.join(format!("{prefix}{c}-{i}.img")));
                let t = Instant::now();
                client.start_transfer(req).await.unwrap();
                latencies.lock().push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let wall = t.elapsed();
    let mut lat = latencies.lock().clone();
    lat.sort_by(|a, b| a.total_cmp(b));
    (lat, wall)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --nocapture on a release build"]
async fn service_benchmark() {
    let size: u64 = std::env::var("FERRY_BENCH_SIZE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4 * GIB);
    let tmp = tempfile::Builder::new()
        .prefix("ferry-bench-")
        .tempdir_in(std::env::var_os("FERRY_TEST_DIR").unwrap_or_else(|| "/var/tmp".into()))
        .unwrap();
    let root = tmp.path().join("images");
    std::fs::create_dir(&root).unwrap();
    let src = make_image(&root.join("src.img"), size, 1);
    let dst = root.join("dst.img");
    // Warm the page cache.
    let _ = std::fs::read(&src).map(|b| b.len());

    let args = vec![
        "--data-dir".to_string(),
        tmp.path().join("data").display().to_string(),
        "--allow-root".to_string(),
        root.display().to_string(),
        "--max-queued-jobs".to_string(),
        "100000".to_string(),
        "--log-filter".to_string(),
        "warn".to_string(),
    ];
    let server = ServeProcess::start(Path::new(BIN), &args, &[]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_idle = rss_kib(server.child.id());
    let mut client = connect(server.grpc).await;

    // 1. Copy through the service vs the CLI, alternating.
    let mut cli_s = Vec::new();
    let mut svc_s = Vec::new();
    for _ in 0..3 {
        drop_target(&dst);
        let t = Instant::now();
        let out = Command::new(BIN)
            .args(["copy"])
            .arg(&src)
            .arg(&dst)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        cli_s.push(t.elapsed().as_secs_f64());

        drop_target(&dst);
        let t = Instant::now();
        let job = client
            .start_transfer(transfer(&src, &dst))
            .await
            .unwrap()
            .into_inner();
        let done = wait_terminal(&mut client, &job.id, Duration::from_secs(600)).await;
        assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
        svc_s.push(t.elapsed().as_secs_f64());
    }
    assert_same_image(&src, &dst);
    let (cli, svc) = (median(cli_s.clone()), median(svc_s.clone()));

    // 2. StartTransfer latency with 50 concurrent clients while the jobs also run.
    let small = make_image(&root.join("small.img"), 64 * 1024, 2);
    let (lat, wall) = start_many(server.grpc, &small, &root, "l", 40).await;

    // 3. The same with every job held in the queue (one slow job holds the only running
    //    slot): the API and store alone; then RSS with those 1,000 queued jobs.
    drop(client);
    drop(server);
    let mut args1 = args.clone();
    args1[1] = tmp.path().join("data2").display().to_string();
    args1.extend(["--max-running-jobs".to_string(), "1".to_string()]);
    let server = ServeProcess::start(Path::new(BIN), &args1, &[]);
    let mut client = connect(server.grpc).await;
    let mut slow = transfer(&src, &root.join("slow.img"));
    slow.options.as_mut().unwrap().rate_limit = 1024 * 1024;
    client.start_transfer(slow).await.unwrap();
    let (qlat, qwall) = start_many(server.grpc, &small, &root, "q", 20).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let queued = client
        .list_jobs(ferry_api::proto::ListJobsRequest {
            states: vec![JobState::Queued as i32],
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs
        .len();
    let rss_queued = rss_kib(server.child.id());

    let gib = size as f64 / GIB as f64;
    println!("## ferry serve benchmark ({gib:.2} GiB image, half data in 1 MiB runs)");
    println!("| measure | value |");
    println!("|---|---|");
    println!("| `ferry copy` median of 3 | {cli:.2} s (runs {cli_s:.2?}) |");
    println!("| service StartTransfer to terminal, median of 3 | {svc:.2} s (runs {svc_s:.2?}) |");
    println!("| service / CLI | {:.3}x |", svc / cli);
    for (what, lat, wall) in [
        ("50 clients x 40, jobs running", &lat, wall),
        ("50 clients x 20, jobs queued", &qlat, qwall),
    ] {
        println!(
            "| StartTransfer latency, {what} | p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} requests in {:.2} s) |",
            percentile(lat, 0.5),
            percentile(lat, 0.99),
            lat.last().unwrap(),
            lat.len(),
            wall.as_secs_f64()
        );
    }
    println!("| RSS idle | {:.1} MiB |", rss_idle as f64 / 1024.0);
    println!(
        "| RSS with {queued} queued jobs (1 running) | {:.1} MiB |",
        rss_queued as f64 / 1024.0
    );
    assert!(queued >= 999, "{queued} queued");
}
