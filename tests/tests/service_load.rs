//! Load: 1,000 small jobs queued at once by 50 concurrent clients while 100 watchers
//! follow them; every job reaches a terminal state, nothing is lost, no watcher starves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_api::proto::{self, JobState};
use ferry_tests::service_support::*;

const JOBS: usize = 1000;
const CLIENTS: usize = 50;
const WATCHERS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_jobs_and_a_hundred_watchers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("images");
    std::fs::create_dir(&root).unwrap();
    let mut cfg = test_config(&dir.path().join("data"), &root);
    cfg.manager.limits.max_running = 8;
    let service = start_in_process(cfg).await;
    let addr = service.grpc_addr();
    let src = make_image(&root.join("src.img"), 64 * 1024, 1);
    let started = Instant::now();

    // Queue every job from 50 concurrent clients.
    let mut submitters = Vec::new();
    for c in 0..CLIENTS {
        let (src, root) = (src.clone(), root.clone());
        submitters.push(tokio::spawn(async move {
            let mut client = connect(addr).await;
            let mut ids = Vec::new();
            for i in (c..JOBS).step_by(CLIENTS) {
                let mut req = transfer(&src, &root.join(format!("t{i:04}.img")));
                req.labels.insert("load".into(), "1".into());
                req.idempotency_key = format!("load-{i}");
                let job = client
                    .start_transfer(req)
                    .await
                    .expect("start")
                    .into_inner();
                ids.push((i, job.id));
            }
            ids
        }));
    }
    let mut ids = vec![String::new(); JOBS];
    for s in submitters {
        for (i, id) in s.await.unwrap() {
            ids[i] = id;
        }
    }
    let queued_in = started.elapsed();
    let ids = Arc::new(ids);

    // 100 watchers, each following 10 jobs one after the other (together: all of them).
    let mut watchers = Vec::new();
    for w in 0..WATCHERS {
        let ids = ids.clone();
        watchers.push(tokio::spawn(async move {
            let mut client = connect(addr).await;
            let mut finished = Vec::new();
            for i in (w..JOBS).step_by(WATCHERS) {
                let job = wait_terminal(&mut client, &ids[i], Duration::from_secs(90)).await;
                finished.push((i, state(&job)));
            }
            (w, finished, Instant::now())
        }));
    }
    let mut watched = 0;
    let mut last_watcher_done = Duration::ZERO;
    for w in watchers {
        let (_, finished, at) = tokio::time::timeout(Duration::from_secs(120), w)
            .await
            .expect("a watcher starved")
            .unwrap();
        for (i, st) in &finished {
            assert_eq!(*st, JobState::Succeeded, "job {i}");
        }
        watched += finished.len();
        last_watcher_done = last_watcher_done.max(at.duration_since(started));
    }
    assert_eq!(watched, JOBS);

    // Nothing lost: the listing has every job, once, all succeeded.
    let mut client = connect(addr).await;
    let mut token = String::new();
    let mut listed = Vec::new();
    loop {
        let mut req = proto::ListJobsRequest {
            page_size: 333,
            page_token: token.clone(),
            ..Default::default()
        };
        req.labels.insert("load".into(), "1".into());
        let page = client.list_jobs(req).await.unwrap().into_inner();
        listed.extend(page.jobs);
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(listed.len(), JOBS);
    let mut listed_ids: Vec<_> = listed.iter().map(|j| j.id.clone()).collect();
    listed_ids.sort();
    listed_ids.dedup();
    assert_eq!(listed_ids.len(), JOBS);
    assert!(listed.iter().all(|j| state(j) == JobState::Succeeded));
    for i in (0..JOBS).step_by(97) {
        assert_same_image(&src, &root.join(format!("t{i:04}.img")));
    }
    let s = parse_metrics(&scrape_metrics(service.metrics_addr().unwrap()).await);
    assert_eq!(
        sample(&s, "ferry_jobs", &[("state", "succeeded")]),
        Some(JOBS as f64)
    );
    assert_eq!(
        sample(
            &s,
            "ferry_jobs_finished_total",
            &[("kind", "transfer"), ("result", "succeeded")]
        ),
        Some(JOBS as f64)
    );
    println!(
        "{JOBS} jobs queued in {queued_in:?}; all finished and watched in {last_watcher_done:?}"
    );
    service.shutdown().await;
}
