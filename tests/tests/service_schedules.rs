//! Schedules of the job service through real gRPC clients: runs that produce real jobs
//! (bytes compared), no overlap of a slow run, pause and resume, run-now, the missed-run
//! policies across a restart, a recorded fire started exactly once after a crash, kill -9
//! of a `ferry-e2e serve` process around fires, invalid requests, metrics and the
//! `ferry schedule` client.
//!
//! Cron fires every minute at most; these tests start the server with its seconds-field
//! test hook (`ScheduleConfig::seconds_field`, `--test-cron-seconds`), which the API
//! cannot turn on, so a schedule fires every second or two and no test takes minutes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_api::proto::{self, JobState, MissedRunPolicy, ScheduleRunResult};
use ferry_server::config::ServiceConfig;
use ferry_server::server::RunningService;
use ferry_tests::service_support::*;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");
const MIB: u64 = 1024 * 1024;
const LIMIT: Duration = Duration::from_secs(60);

struct Env {
    dir: tempfile::TempDir,
    root: PathBuf,
    service: Option<RunningService>,
    jobs: Client,
    schedules: ScheduleClient,
}

fn config(dir: &Path, root: &Path, seconds: bool) -> ServiceConfig {
    let mut cfg = test_config(&dir.join("data"), root);
    cfg.schedules.seconds_field = seconds;
    cfg
}

async fn env_with(seconds: bool) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("images");
    std::fs::create_dir(&root).unwrap();
    let service = start_in_process(config(dir.path(), &root, seconds)).await;
    let jobs = connect(service.grpc_addr()).await;
    let schedules = connect_schedules(service.grpc_addr()).await;
    Env {
        dir,
        root,
        service: Some(service),
        jobs,
        schedules,
    }
}

async fn env() -> Env {
    env_with(true).await
}

impl Env {
    fn service(&self) -> &RunningService {
        self.service.as_ref().expect("service running")
    }

    /// Shuts the service down (the clients' connections are dropped first, so the
    /// server has none to wait for).
    async fn stop(&mut self) {
        let idle = || tonic::transport::Channel::from_static("http://127.0.0.1:9").connect_lazy();
        self.jobs = proto::job_service_client::JobServiceClient::new(idle());
        self.schedules = proto::schedule_service_client::ScheduleServiceClient::new(idle());
        if let Some(s) = self.service.take() {
            s.shutdown().await;
        }
    }

    /// Starts the service again on the same data directory.
    async fn restart(&mut self) {
        self.stop().await;
        let service = start_in_process(config(self.dir.path(), &self.root, true)).await;
        self.jobs = connect(service.grpc_addr()).await;
        self.schedules = connect_schedules(service.grpc_addr()).await;
        self.service = Some(service);
    }

    async fn get(&mut self, id: &str) -> proto::Schedule {
        self.schedules
            .get_schedule(proto::GetScheduleRequest { id: id.into() })
            .await
            .expect("get schedule")
            .into_inner()
    }

    /// Polls the schedule until `done` holds.
    async fn wait_for(
        &mut self,
        id: &str,
        limit: Duration,
        what: &str,
        done: impl Fn(&proto::Schedule) -> bool,
    ) -> proto::Schedule {
        let started = Instant::now();
        loop {
            let s = self.get(id).await;
            if done(&s) {
                return s;
            }
            assert!(
                started.elapsed() < limit,
                "schedule {id}: {what} did not happen within {limit:?}: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The jobs a schedule started, oldest first.
    async fn jobs_of(&mut self, name: &str) -> Vec<proto::Job> {
        let mut labels = BTreeMap::new();
        labels.insert("ferry.schedule".to_string(), name.to_string());
        self.jobs
            .list_jobs(proto::ListJobsRequest {
                labels,
                page_size: 1000,
                ..Default::default()
            })
            .await
            .expect("list jobs")
            .into_inner()
            .jobs
    }

    async fn metrics(&self) -> prometheus_parse::Scrape {
        parse_metrics(&scrape_metrics(self.service().metrics_addr().unwrap()).await)
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn ms(t: &Option<prost_types::Timestamp>) -> Option<u64> {
    t.as_ref()
        .map(|t| t.seconds as u64 * 1000 + t.nanos as u64 / 1_000_000)
}

fn status(s: &proto::Schedule) -> proto::ScheduleStatus {
    s.status.clone().unwrap_or_default()
}

fn last_result(s: &proto::Schedule) -> Option<ScheduleRunResult> {
    status(s)
        .last_run
        .map(|r| ScheduleRunResult::try_from(r.result).unwrap_or(ScheduleRunResult::Unspecified))
}

fn transfer_template(src: &Path, dst: &Path, rate_limit: u64) -> proto::JobTemplate {
    let mut req = transfer(src, dst);
    req.options.as_mut().unwrap().rate_limit = rate_limit;
    proto::JobTemplate {
        request: Some(proto::job_template::Request::Transfer(req)),
    }
}

fn checksum_template(src: &Path) -> proto::JobTemplate {
    proto::JobTemplate {
        request: Some(proto::job_template::Request::Checksum(checksum(src))),
    }
}

fn create(name: &str, cron: &str, template: proto::JobTemplate) -> proto::CreateScheduleRequest {
    proto::CreateScheduleRequest {
        name: name.into(),
        cron: cron.into(),
        template: Some(template),
        ..Default::default()
    }
}

fn sample_or_zero(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(s, name, labels).unwrap_or(0.0)
}

#[tokio::test]
async fn a_schedule_runs_transfers_on_time_pauses_and_resumes() {
    let mut e = env().await;
    let src = make_image(&e.root.join("src.img"), 4 * MIB + 4096, 1);
    let dst = e.root.join("dst.img");
    let mut req = create(
        "copy-every-2s",
        "*/2 * * * * *",
        transfer_template(&src, &dst, 0),
    );
    req.labels.insert("team".into(), "x".into());
    if let Some(proto::job_template::Request::Transfer(t)) =
        req.template.as_mut().unwrap().request.as_mut()
    {
        t.labels.insert("team".into(), "x".into());
    }
    let before = now_ms();
    let created = e.schedules.create_schedule(req).await.unwrap().into_inner();
    let after = now_ms();
    let next = ms(&status(&created).next_run_time).expect("a next run time");
    assert!(
        next > before && next <= after + 2000,
        "next {next}, now {before}..{after}"
    );
    assert_eq!(next % 2000, 0, "fires on even seconds");
    assert!(!created.paused);

    let s = e
        .wait_for(&created.id, LIMIT, "a succeeded run", |s| {
            last_result(s) == Some(ScheduleRunResult::Succeeded)
        })
        .await;
    let run = status(&s).last_run.unwrap();
    assert_eq!(ms(&run.fire_time).unwrap() % 2000, 0);
    assert!(!run.manual);
    let job = e
        .jobs
        .get_job(proto::GetJobRequest {
            id: run.job_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&job), JobState::Succeeded, "{:?}", job.error);
    assert_eq!(job.labels["ferry.schedule"], "copy-every-2s");
    assert_eq!(job.labels["ferry.schedule_id"], created.id);
    assert_eq!(job.labels["team"], "x");
    assert_eq!(
        job.idempotency_key,
        format!("schedule/{}/{}", created.id, ms(&run.fire_time).unwrap())
    );
    assert_same_image(&src, &dst);
    assert!(status(&s).last_success_time.is_some());
    assert_eq!(status(&s).consecutive_failures, 0);

    // Pause: no next run time, and no run while paused.
    let paused = e
        .schedules
        .pause_schedule(proto::PauseScheduleRequest {
            id: "copy-every-2s".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(paused.paused);
    assert!(status(&paused).next_run_time.is_none());
    let s = e
        .wait_for(&created.id, LIMIT, "the last run to end", |s| {
            last_result(s) != Some(ScheduleRunResult::Running)
        })
        .await;
    let started = status(&s).runs_started;
    let jobs = e.jobs_of("copy-every-2s").await.len() as u64;
    assert_eq!(jobs, started, "one job per run");
    let m = e.metrics().await;
    assert_eq!(
        sample(&m, "ferry_schedules", &[("state", "paused")]),
        Some(1.0)
    );
    assert_eq!(
        sample(&m, "ferry_schedules", &[("state", "active")]),
        Some(0.0)
    );
    assert!(sample_or_zero(&m, "ferry_schedule_runs_total", &[("result", "started")]) >= 1.0);
    assert!(sample_or_zero(&m, "ferry_schedule_runs_total", &[("result", "succeeded")]) >= 1.0);
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let s = e.get(&created.id).await;
    assert_eq!(status(&s).runs_started, started, "a paused schedule ran");
    assert_eq!(e.jobs_of("copy-every-2s").await.len() as u64, started);

    // Resume: runs again from now on.
    let resumed = e
        .schedules
        .resume_schedule(proto::ResumeScheduleRequest {
            id: created.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!resumed.paused);
    assert!(ms(&status(&resumed).next_run_time).unwrap() > now_ms() - 100);
    e.wait_for(&created.id, LIMIT, "a run after resuming", |s| {
        status(s).runs_started > started
    })
    .await;
    e.stop().await;
}

#[tokio::test]
async fn a_slow_run_is_never_overlapped_and_the_fires_meanwhile_are_skipped() {
    let mut e = env().await;
    // 16 MiB with 8 MiB of data at 2 MiB/s: about 4 s per run, fires every second.
    let src = make_image(&e.root.join("src.img"), 16 * MIB, 2);
    let dst = e.root.join("dst.img");
    let created = e
        .schedules
        .create_schedule(create(
            "slow",
            "* * * * * *",
            transfer_template(&src, &dst, 2 * MIB),
        ))
        .await
        .unwrap()
        .into_inner();
    let started = Instant::now();
    let mut max_unfinished = 0;
    while started.elapsed() < Duration::from_secs(7) {
        let unfinished = e
            .jobs_of("slow")
            .await
            .iter()
            .filter(|j| !is_terminal(j))
            .count();
        max_unfinished = max_unfinished.max(unfinished);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(max_unfinished, 1, "runs overlapped (or none ran)");
    let s = e.get(&created.id).await;
    assert!(status(&s).runs_skipped >= 3, "{s:?}");
    assert!(status(&s).runs_started >= 1, "{s:?}");
    e.schedules
        .pause_schedule(proto::PauseScheduleRequest {
            id: created.id.clone(),
        })
        .await
        .unwrap();
    let s = e
        .wait_for(&created.id, LIMIT, "the last run to end", |s| {
            last_result(s) != Some(ScheduleRunResult::Running)
        })
        .await;
    assert_eq!(last_result(&s), Some(ScheduleRunResult::Succeeded), "{s:?}");
    assert_same_image(&src, &dst);
    // Each run was created only after the previous one ended.
    let mut jobs = e.jobs_of("slow").await;
    jobs.sort_by_key(|j| ms(&j.create_time));
    for pair in jobs.windows(2) {
        assert!(
            ms(&pair[1].create_time) >= ms(&pair[0].end_time),
            "job {} was created before job {} ended",
            pair[1].id,
            pair[0].id
        );
    }
    let m = e.metrics().await;
    assert!(sample_or_zero(&m, "ferry_schedule_runs_total", &[("result", "skipped")]) >= 3.0);
    e.stop().await;
}

#[tokio::test]
async fn run_now_starts_a_run_and_refuses_to_overlap_it() {
    let mut e = env().await;
    let src = make_image(&e.root.join("src.img"), 16 * MIB, 3);
    let dst = e.root.join("dst.img");
    let mut req = create("manual", "@daily", transfer_template(&src, &dst, MIB));
    req.paused = true;
    let created = e.schedules.create_schedule(req).await.unwrap().into_inner();
    assert!(status(&created).next_run_time.is_none());

    let r = e
        .schedules
        .run_schedule_now(proto::RunScheduleNowRequest {
            id: "manual".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let job = r.job.unwrap();
    let run = status(r.schedule.as_ref().unwrap()).last_run.unwrap();
    assert!(run.manual);
    assert_eq!(run.job_id, job.id);
    assert!(job
        .idempotency_key
        .starts_with(&format!("schedule/{}/now/", created.id)));

    let err = e
        .schedules
        .run_schedule_now(proto::RunScheduleNowRequest {
            id: created.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("has not finished"), "{err:?}");

    e.jobs
        .cancel_job(proto::CancelJobRequest { id: job.id.clone() })
        .await
        .unwrap();
    let s = e
        .wait_for(&created.id, LIMIT, "the cancelled run", |s| {
            last_result(s) == Some(ScheduleRunResult::Cancelled)
        })
        .await;
    assert_eq!(status(&s).consecutive_failures, 1);

    let again = e
        .schedules
        .run_schedule_now(proto::RunScheduleNowRequest {
            id: created.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_ne!(again.id, job.id);
    let done = wait_terminal(&mut e.jobs, &again.id, LIMIT).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    assert_same_image(&src, &dst);
    let s = e
        .wait_for(&created.id, LIMIT, "the success recorded", |s| {
            last_result(s) == Some(ScheduleRunResult::Succeeded)
        })
        .await;
    assert_eq!(status(&s).consecutive_failures, 0);
    assert_eq!(status(&s).runs_started, 2);
    assert!(s.paused, "run-now does not resume a paused schedule");
    e.stop().await;
}

#[tokio::test]
async fn invalid_schedules_are_refused_with_the_reason() {
    let mut e = env_with(false).await;
    let src = make_image(&e.root.join("src.img"), MIB, 4);
    let good = || checksum_template(&src);
    let refused = |r: Result<tonic::Response<proto::Schedule>, tonic::Status>| {
        r.expect_err("the request was accepted")
    };

    for (cron, zone, needle) in [
        ("61 * * * *", "", "cron '61 * * * *' is not valid"),
        ("@every 5m", "", "is not valid"),
        ("* * * *", "", "five fields"),
        ("*/2 * * * * *", "", "is not valid"),
        ("0 0 30 2 *", "", "never fires"),
        (
            "@daily",
            "Mars/Olympus_Mons",
            "time_zone 'Mars/Olympus_Mons'",
        ),
    ] {
        let mut req = create("bad", cron, good());
        req.time_zone = zone.into();
        let err = refused(e.schedules.create_schedule(req).await);
        assert_eq!(err.code(), Code::InvalidArgument, "{cron} {zone}: {err:?}");
        assert!(err.message().contains(needle), "{cron} {zone}: {err:?}");
    }
    let mut req = create("bad", "@daily", good());
    req.template = None;
    let err = refused(e.schedules.create_schedule(req).await);
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("template is missing"), "{err:?}");

    let mut t = checksum(&src);
    t.idempotency_key = "mine".into();
    let req = create(
        "bad",
        "@daily",
        proto::JobTemplate {
            request: Some(proto::job_template::Request::Checksum(t)),
        },
    );
    let err = refused(e.schedules.create_schedule(req).await);
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("idempotency_key"), "{err:?}");

    let err = refused(
        e.schedules
            .create_schedule(create(
                "bad",
                "@daily",
                checksum_template(Path::new("/etc/passwd")),
            ))
            .await,
    );
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    let err = refused(
        e.schedules
            .create_schedule(create("bad name!", "@daily", good()))
            .await,
    );
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("name"), "{err:?}");

    let ok = e
        .schedules
        .create_schedule(create("nightly", "@daily", good()))
        .await
        .unwrap()
        .into_inner();
    let err = refused(
        e.schedules
            .create_schedule(create("nightly", "@hourly", good()))
            .await,
    );
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");

    // Unknown ids and names.
    let err = e
        .schedules
        .get_schedule(proto::GetScheduleRequest { id: "nope".into() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = e
        .schedules
        .update_schedule(proto::UpdateScheduleRequest {
            id: "nope".into(),
            paused: Some(true),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    for err in [
        e.schedules
            .run_schedule_now(proto::RunScheduleNowRequest { id: "nope".into() })
            .await
            .unwrap_err(),
        e.schedules
            .pause_schedule(proto::PauseScheduleRequest { id: "nope".into() })
            .await
            .unwrap_err(),
        e.schedules
            .delete_schedule(proto::DeleteScheduleRequest { id: "nope".into() })
            .await
            .unwrap_err(),
    ] {
        assert_eq!(err.code(), Code::NotFound, "{err:?}");
    }

    // An invalid update changes nothing; a valid one moves the next run time.
    let err = e
        .schedules
        .update_schedule(proto::UpdateScheduleRequest {
            id: ok.id.clone(),
            time_zone: Some("Nowhere/Atlantis".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let same = e.get(&ok.id).await;
    assert_eq!(same.time_zone, "");
    assert_eq!(status(&same).next_run_time, status(&ok).next_run_time);
    let moved = e
        .schedules
        .update_schedule(proto::UpdateScheduleRequest {
            id: "nightly".into(),
            cron: Some("0 3 * * *".into()),
            time_zone: Some("Europe/Oslo".into()),
            missed_run_policy: Some(MissedRunPolicy::Skip as i32),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(moved.cron, "0 3 * * *");
    assert_eq!(moved.missed_run_policy, MissedRunPolicy::Skip as i32);
    // 03:00 in Oslo is 01:00 or 02:00 UTC.
    let next = ms(&status(&moved).next_run_time).unwrap();
    let hour = (next / 3_600_000) % 24;
    assert!(hour == 1 || hour == 2, "next run at UTC hour {hour}");
    assert_eq!(next % 3_600_000, 0);

    let list = e
        .schedules
        .list_schedules(proto::ListSchedulesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.schedules.len(), 1);
    e.schedules
        .delete_schedule(proto::DeleteScheduleRequest {
            id: "nightly".into(),
        })
        .await
        .unwrap();
    let err = e
        .schedules
        .get_schedule(proto::GetScheduleRequest { id: ok.id.clone() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let m = e.metrics().await;
    assert!(
        sample_or_zero(
            &m,
            "ferry_grpc_requests_total",
            &[("method", "CreateSchedule"), ("code", "invalid_argument")]
        ) >= 6.0
    );
    assert_eq!(
        sample(&m, "ferry_schedules", &[("state", "active")]),
        Some(0.0)
    );
    e.stop().await;
}

/// Waits until the wall clock is `offset_ms` past a multiple of `period_ms`.
async fn align(period_ms: u64, offset_ms: u64) {
    loop {
        let phase = now_ms() % period_ms;
        if phase >= offset_ms && phase < offset_ms + 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_restart_applies_the_missed_run_policy() {
    let mut e = env().await;
    let src = make_image(&e.root.join("src.img"), 2 * MIB, 5);
    // Right after a 5-second boundary: the next fire is about 4.5 s away.
    align(5000, 300).await;
    let mut once = create("once", "*/5 * * * * *", checksum_template(&src));
    once.missed_run_policy = MissedRunPolicy::RunOnce as i32;
    let once = e
        .schedules
        .create_schedule(once)
        .await
        .unwrap()
        .into_inner();
    let mut skip = create("skip", "*/5 * * * * *", checksum_template(&src));
    skip.missed_run_policy = MissedRunPolicy::Skip as i32;
    let skip = e
        .schedules
        .create_schedule(skip)
        .await
        .unwrap()
        .into_inner();
    let fire = ms(&status(&once).next_run_time).unwrap();
    assert_eq!(ms(&status(&skip).next_run_time), Some(fire));
    e.stop().await;

    // Down across the fire time, back up before the next one.
    tokio::time::sleep(Duration::from_millis(
        (fire + 1200).saturating_sub(now_ms()),
    ))
    .await;
    e.restart().await;
    let s = e
        .wait_for(
            &once.id,
            Duration::from_secs(3),
            "the run of the missed fire",
            |s| status(s).last_run.is_some(),
        )
        .await;
    let run = status(&s).last_run.unwrap();
    assert_eq!(
        ms(&run.fire_time),
        Some(fire),
        "the run stands for the missed fire"
    );
    assert_eq!(status(&s).runs_missed, 0, "the one missed fire had its run");
    assert_eq!(ms(&status(&s).next_run_time), Some(fire + 5000));
    let k = e
        .wait_for(
            &skip.id,
            Duration::from_secs(3),
            "the missed fire counted",
            |s| status(s).runs_missed == 1,
        )
        .await;
    assert!(
        now_ms() < fire + 5000,
        "too slow to tell the policies apart"
    );
    assert!(
        status(&k).last_run.is_none(),
        "skip ran a missed fire: {k:?}"
    );
    assert_eq!(ms(&status(&k).next_run_time), Some(fire + 5000));
    let m = e.metrics().await;
    assert_eq!(
        sample(&m, "ferry_schedule_runs_total", &[("result", "missed")]),
        Some(1.0)
    );
    let job = wait_terminal(&mut e.jobs, &run.job_id, LIMIT).await;
    assert_eq!(state(&job), JobState::Succeeded, "{:?}", job.error);
    e.stop().await;
}

#[tokio::test]
async fn a_fire_recorded_before_a_crash_is_started_exactly_once() {
    use ferry_server::model::schedule::PendingFire;
    use ferry_server::store::Store;

    let mut e = env().await;
    let src = make_image(&e.root.join("src.img"), 2 * MIB, 6);
    let mut req = create("started", "@daily", checksum_template(&src));
    req.paused = true;
    let started = e.schedules.create_schedule(req).await.unwrap().into_inner();
    let mut req = create("unstarted", "@daily", checksum_template(&src));
    req.paused = true;
    let unstarted = e.schedules.create_schedule(req).await.unwrap().into_inner();
    let r = e
        .schedules
        .run_schedule_now(proto::RunScheduleNowRequest {
            id: started.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let job = r.job.unwrap();
    let fire = ms(&status(r.schedule.as_ref().unwrap())
        .last_run
        .unwrap()
        .fire_time)
    .unwrap();
    wait_terminal(&mut e.jobs, &job.id, LIMIT).await;
    e.stop().await;

    // What a kill -9 can leave: one fire recorded whose job had been created but not yet
    // recorded as the run, one fire recorded whose job had not been created.
    {
        let data = e.dir.path().join("data");
        let (store, loaded) = Store::open(&data).unwrap();
        for mut s in loaded.schedules {
            if s.id == started.id {
                s.pending = Some(PendingFire {
                    fire_ms: fire,
                    manual: true,
                });
                s.last_run = None;
                s.runs_started = 0;
            } else {
                s.pending = Some(PendingFire {
                    fire_ms: 1_700_000_000_000,
                    manual: false,
                });
            }
            store.put_schedule(&s).await.unwrap();
        }
        store.close();
    }
    e.restart().await;
    let s = e
        .wait_for(&started.id, LIMIT, "the recorded fire resolved", |s| {
            status(s).last_run.is_some()
        })
        .await;
    assert_eq!(
        status(&s).last_run.unwrap().job_id,
        job.id,
        "a second job ran"
    );
    assert_eq!(status(&s).runs_started, 1);
    assert_eq!(e.jobs_of("started").await.len(), 1);
    let u = e
        .wait_for(&unstarted.id, LIMIT, "the recorded fire started", |s| {
            status(s).last_run.is_some()
        })
        .await;
    let run = status(&u).last_run.unwrap();
    assert_eq!(ms(&run.fire_time), Some(1_700_000_000_000));
    let jobs = e.jobs_of("unstarted").await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        jobs[0].idempotency_key,
        format!("schedule/{}/1700000000000", unstarted.id)
    );
    let done = wait_terminal(&mut e.jobs, &run.job_id, LIMIT).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);

    // Another restart finds nothing left to start.
    e.restart().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(e.jobs_of("started").await.len(), 1);
    assert_eq!(e.jobs_of("unstarted").await.len(), 1);
    assert_eq!(status(&e.get(&unstarted.id).await).runs_started, 1);
    e.stop().await;
}

fn serve_args(data: &Path, root: &Path) -> Vec<String> {
    vec![
        "--data-dir".into(),
        data.display().to_string(),
        "--allow-root".into(),
        root.display().to_string(),
        "--test-cron-seconds".into(),
    ]
}

#[tokio::test]
async fn kill_9_around_fires_never_runs_a_fire_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("images");
    let data = tmp.path().join("data");
    std::fs::create_dir(&root).unwrap();
    let src = make_image(&root.join("src.img"), 2 * MIB, 7);
    let mut server = ServeProcess::start(Path::new(BIN), &serve_args(&data, &root), &[]);
    let mut schedules = connect_schedules(server.grpc).await;
    let created = schedules
        .create_schedule(create(
            "every-second",
            "* * * * * *",
            checksum_template(&src),
        ))
        .await
        .unwrap()
        .into_inner();
    // Kill at a few points around fire times: just after one, in the middle, just before.
    for offset in [5, 500, 950] {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        align(1000, offset).await;
        server.kill9();
        server = ServeProcess::start(Path::new(BIN), &serve_args(&data, &root), &[]);
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut schedules = connect_schedules(server.grpc).await;
    schedules
        .pause_schedule(proto::PauseScheduleRequest {
            id: created.id.clone(),
        })
        .await
        .unwrap();
    let mut jobs_client = connect(server.grpc).await;
    let mut labels = BTreeMap::new();
    labels.insert("ferry.schedule".to_string(), "every-second".to_string());
    let jobs = jobs_client
        .list_jobs(proto::ListJobsRequest {
            labels,
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert!(jobs.len() >= 4, "too few runs: {}", jobs.len());
    let prefix = format!("schedule/{}/", created.id);
    let mut fires = BTreeSet::new();
    for j in &jobs {
        let fire: u64 = j
            .idempotency_key
            .strip_prefix(&prefix)
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("unexpected key {}", j.idempotency_key));
        assert_eq!(fire % 1000, 0);
        assert!(fires.insert(fire), "fire {fire} ran twice");
    }
    let s = schedules
        .get_schedule(proto::GetScheduleRequest {
            id: created.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status(&s).runs_started,
        jobs.len() as u64,
        "runs counted once each"
    );
    let log = server.stderr();
    assert!(!log.contains("panicked"), "{log}");
}

fn schedule_cmd(server: &ServeProcess, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("schedule")
        .args(["--server", &format!("http://{}", server.grpc)])
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run ferry-e2e schedule")
}

#[tokio::test]
async fn ferry_schedule_client_commands() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("images");
    let data = tmp.path().join("data");
    std::fs::create_dir(&root).unwrap();
    let src = make_image(&root.join("src.img"), 4 * MIB, 8);
    let dst = root.join("dst.img");
    let server = ServeProcess::start(Path::new(BIN), &serve_args(&data, &root), &[]);
    let (s, t) = (src.display().to_string(), dst.display().to_string());

    let out = schedule_cmd(
        &server,
        &[
            "--json",
            "create",
            "nightly",
            "--cron",
            "@daily",
            "--time-zone",
            "Europe/Oslo",
            "--missed",
            "skip",
            "--paused",
            "--label",
            "team=x",
            &s,
            &t,
            "--verify",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON schedule");
    assert_eq!(created["name"], "nightly");
    assert_eq!(created["time_zone"], "Europe/Oslo");
    assert_eq!(created["missed_run_policy"], "skip");
    assert_eq!(created["paused"], true);
    assert_eq!(created["kind"], "transfer");
    assert_eq!(created["labels"]["team"], "x");
    assert!(created["next_run_time"].is_null());

    let out = schedule_cmd(&server, &["--json", "list", "--label", "team=x"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON list");
    assert_eq!(list.as_array().unwrap().len(), 1);

    let out = schedule_cmd(&server, &["resume", "nightly"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("state:     active"), "{text}");
    let out = schedule_cmd(&server, &["--json", "get", "nightly"]);
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON schedule");
    assert!(got["next_run_time"].is_string(), "{got}");

    let out = schedule_cmd(&server, &["--json", "run", "nightly"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ran: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON run");
    let job_id = ran["job"]["id"].as_str().unwrap().to_string();
    let mut jobs = connect(server.grpc).await;
    let done = wait_terminal(&mut jobs, &job_id, LIMIT).await;
    assert_eq!(state(&done), JobState::Succeeded, "{:?}", done.error);
    assert_same_image(&src, &dst);

    let out = schedule_cmd(&server, &["pause", "nightly"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("state:     paused"));
    let out = schedule_cmd(&server, &["create", "bad", "--cron", "* * *", &s, &t]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("InvalidArgument"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = schedule_cmd(&server, &["delete", "nightly"]);
    assert!(out.status.success());
    let out = schedule_cmd(&server, &["get", "nightly"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no schedule"));
}
