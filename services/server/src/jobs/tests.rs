//! Job manager tests with real files in temporary directories and an opener that injects
//! faults: lifecycle, retries, permanent failures, cancellation, idempotency, restart
//! recovery from a checkpoint, listing and pruning.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferry_core::{EndpointSpec, Error, ErrorKind, Result, Source, Target};
use ferry_endpoints::{SourceOptions, TargetOptions};

use super::opener::{Endpoints, Opener};
use super::{JobManager, ListFilter, ManagerConfig};
use crate::admission::Limits;
use crate::convert::Validator;
use crate::metrics::Metrics;
use crate::model::job::{JobRecord, JobState, ResultRecord, TargetState};
use crate::secrets::SecretResolver;
use crate::security::AllowRoots;
use crate::status::ServiceError;
use crate::store::Store;
use ferry_api::proto;

/// Fails the first `failures` source opens with `kind`, then opens real endpoints.
#[derive(Debug)]
struct Flaky {
    failures: AtomicU32,
    kind: ErrorKind,
}

#[async_trait]
impl Opener for Flaky {
    async fn open_source(&self, spec: &EndpointSpec, o: &SourceOptions) -> Result<Arc<dyn Source>> {
        let left = self.failures.load(Ordering::SeqCst);
        if left > 0 {
            self.failures.store(left - 1, Ordering::SeqCst);
            return Err(Error::new(self.kind, "injected fault").with_operation("open"));
        }
        Endpoints.open_source(spec, o).await
    }

    async fn open_target(
        &self,
        spec: &EndpointSpec,
        size: u64,
        o: &TargetOptions,
    ) -> Result<Arc<dyn Target>> {
        Endpoints.open_target(spec, size, o).await
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    manager: JobManager,
    validator: Validator,
}

fn config() -> ManagerConfig {
    ManagerConfig {
        limits: Limits {
            max_running: 2,
            max_per_host: 2,
        },
        retry_base: Duration::from_millis(20),
        retry_max: Duration::from_millis(100),
        checkpoint_interval: Duration::from_millis(200),
        progress_interval: Duration::from_millis(50),
        ..ManagerConfig::default()
    }
}

fn open(dir: tempfile::TempDir, cfg: ManagerConfig, opener: Arc<dyn Opener>) -> Fixture {
    let (store, loaded) = Store::open(&dir.path().join("data")).unwrap();
    let manager = JobManager::start(
        cfg,
        store,
        loaded,
        Metrics::new(),
        opener,
        SecretResolver::default(),
    );
    let validator = Validator {
        roots: AllowRoots::new(&[dir.path().to_path_buf()]).unwrap(),
        secrets: SecretResolver::default(),
    };
    Fixture {
        dir,
        manager,
        validator,
    }
}

fn fixture(cfg: ManagerConfig) -> Fixture {
    open(tempfile::tempdir().unwrap(), cfg, Arc::new(Endpoints))
}

/// A deterministic image with data and zero runs.
fn image(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            if (i / 65536) % 3 == 2 {
                0
            } else {
                (i as u8).wrapping_mul(31).wrapping_add(seed)
            }
        })
        .collect()
}

impl Fixture {
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn transfer(&self, src: &str, dst: &str) -> proto::StartTransferRequest {
        proto::StartTransferRequest {
            source: Some(proto::Endpoint {
                url: self.path(src),
                options: None,
                ..Default::default()
            }),
            target: Some(proto::Endpoint {
                url: self.path(dst),
                options: None,
                ..Default::default()
            }),
            options: Some(proto::TransferOptions::default()),
            ..Default::default()
        }
    }

    async fn start(&self, req: &proto::StartTransferRequest) -> Result<JobRecord, ServiceError> {
        self.manager.submit(self.validator.transfer(req)?).await
    }

    async fn wait(&self, id: &str) -> JobRecord {
        let mut rx = self.manager.watch(id).unwrap();
        let r = tokio::time::timeout(
            Duration::from_secs(60),
            rx.wait_for(|r| r.state.is_terminal()),
        )
        .await
        .expect("job reaches a terminal state in time")
        .expect("job stays known")
        .clone();
        r
    }
}

#[tokio::test]
async fn transfer_with_verify_and_checksum_succeed() {
    let f = fixture(config());
    let data = image(3 * 1024 * 1024 + 512, 1);
    std::fs::write(f.path("a.img"), &data).unwrap();
    let mut req = f.transfer("a.img", "b.img");
    req.options.as_mut().unwrap().verify = true;
    let job = f.start(&req).await.unwrap();
    assert_eq!(job.state, JobState::Queued);
    let done = f.wait(&job.id).await;
    assert_eq!(done.state, JobState::Succeeded, "{:?}", done.error);
    assert_eq!(std::fs::read(f.path("b.img")).unwrap(), data);
    let Some(ResultRecord::Transfer {
        size,
        source_digest,
        target_digest,
        ..
    }) = &done.result
    else {
        panic!("no transfer result: {done:?}")
    };
    assert_eq!(*size, data.len() as u64);
    assert_eq!(source_digest, target_digest);
    assert!(source_digest.is_some());

    let ck = proto::StartChecksumRequest {
        source: Some(proto::Endpoint {
            url: f.path("b.img"),
            options: None,
            ..Default::default()
        }),
        ..Default::default()
    };
    let job = f
        .manager
        .submit(f.validator.checksum(&ck).unwrap())
        .await
        .unwrap();
    let done2 = f.wait(&job.id).await;
    let Some(ResultRecord::Checksum { digest, .. }) = &done2.result else {
        panic!("no checksum result: {done2:?}")
    };
    assert_eq!(Some(digest), target_digest.as_ref());
    let text = f.manager.metrics().encode();
    assert!(text.contains("ferry_jobs_finished_total{kind=\"transfer\",result=\"succeeded\"} 1"));
    assert!(text.contains("ferry_jobs{state=\"succeeded\"} 2"), "{text}");
}

#[tokio::test]
async fn transient_errors_are_retried_and_permanent_ones_fail_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let opener = Arc::new(Flaky {
        failures: AtomicU32::new(2),
        kind: ErrorKind::Disconnected,
    });
    let f = open(dir, config(), opener.clone());
    let data = image(200_000, 2);
    std::fs::write(f.path("a.img"), &data).unwrap();
    let job = f.start(&f.transfer("a.img", "b.img")).await.unwrap();
    let done = f.wait(&job.id).await;
    assert_eq!(done.state, JobState::Succeeded, "{:?}", done.error);
    assert_eq!(done.attempt, 3);
    assert_eq!(std::fs::read(f.path("b.img")).unwrap(), data);
    assert!(f
        .manager
        .metrics()
        .encode()
        .contains("ferry_job_retries_total{kind=\"transfer\"} 2"));

    // A missing source is NotFound: permanent, so one attempt only.
    let job = f.start(&f.transfer("missing.img", "c.img")).await.unwrap();
    let done = f.wait(&job.id).await;
    assert_eq!(done.state, JobState::Failed);
    assert_eq!(done.attempt, 1);
    let err = done.error.unwrap();
    assert_eq!(err.kind, "not_found");
    assert!(err.message.contains("missing.img"), "{}", err.message);
}

#[tokio::test]
async fn retries_stop_after_max_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ManagerConfig {
        max_attempts: 3,
        ..config()
    };
    let f = open(
        dir,
        cfg,
        Arc::new(Flaky {
            failures: AtomicU32::new(100),
            kind: ErrorKind::Timeout,
        }),
    );
    std::fs::write(f.path("a.img"), image(4096, 3)).unwrap();
    let job = f.start(&f.transfer("a.img", "b.img")).await.unwrap();
    let done = f.wait(&job.id).await;
    assert_eq!(done.state, JobState::Failed);
    assert_eq!(done.attempt, 3);
    assert_eq!(done.error.unwrap().kind, "timeout");
}

#[tokio::test]
async fn idempotency_keys() {
    let f = fixture(config());
    std::fs::write(f.path("a.img"), image(4096, 4)).unwrap();
    let mut req = f.transfer("a.img", "b.img");
    req.idempotency_key = "k1".into();
    let first = f.start(&req).await.unwrap();
    let again = f.start(&req).await.unwrap();
    assert_eq!(first.id, again.id);
    let mut other = req.clone();
    other.target = Some(proto::Endpoint {
        url: f.path("c.img"),
        options: None,
        ..Default::default()
    });
    match f.start(&other).await {
        Err(ServiceError::KeyConflict { job_id, .. }) => assert_eq!(job_id, first.id),
        other => panic!("expected a key conflict, got {other:?}"),
    }
    f.wait(&first.id).await;
    assert_eq!(f.manager.len(), 1);
}

#[tokio::test]
async fn cancel_queued_and_running_jobs() {
    let cfg = ManagerConfig {
        limits: Limits {
            max_running: 1,
            max_per_host: 1,
        },
        ..config()
    };
    let f = fixture(cfg);
    std::fs::write(f.path("a.img"), image(8 * 1024 * 1024, 5)).unwrap();
    let mut slow = f.transfer("a.img", "b.img");
    slow.options.as_mut().unwrap().rate_limit = 1024 * 1024;
    let running = f.start(&slow).await.unwrap();
    let queued = f.start(&f.transfer("a.img", "c.img")).await.unwrap();
    let mut rx = f.manager.watch(&running.id).unwrap();
    rx.wait_for(|r| r.state == JobState::Running).await.unwrap();
    assert_eq!(f.manager.get(&queued.id).unwrap().state, JobState::Queued);

    let c = f.manager.cancel(&queued.id).await.unwrap();
    assert_eq!(c.state, JobState::Cancelled);
    let started = std::time::Instant::now();
    let c = f.manager.cancel(&running.id).await.unwrap();
    assert_eq!(c.state, JobState::Cancelled);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cancel was not prompt"
    );
    assert_eq!(c.error.unwrap().kind, "cancelled");
    // Cancelling a finished job changes nothing.
    assert_eq!(
        f.manager.cancel(&running.id).await.unwrap().state,
        JobState::Cancelled
    );
    assert!(matches!(
        f.manager.cancel("nope").await,
        Err(ServiceError::UnknownJob { .. })
    ));
}

#[tokio::test]
async fn one_writer_per_target_and_refusal() {
    let cfg = ManagerConfig {
        limits: Limits {
            max_running: 4,
            max_per_host: 4,
        },
        ..config()
    };
    let f = fixture(cfg);
    std::fs::write(f.path("a.img"), image(2 * 1024 * 1024, 6)).unwrap();
    let mut slow = f.transfer("a.img", "b.img");
    slow.options.as_mut().unwrap().rate_limit = 2 * 1024 * 1024;
    let first = f.start(&slow).await.unwrap();
    let second = f.start(&f.transfer("a.img", "b.img")).await.unwrap();
    let mut refuse = f.transfer("a.img", "b.img");
    refuse.refuse_if_target_busy = true;
    assert!(matches!(
        f.start(&refuse).await,
        Err(ServiceError::TargetBusy { .. })
    ));
    let mut rx = f.manager.watch(&first.id).unwrap();
    rx.wait_for(|r| r.state == JobState::Running).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(f.manager.get(&second.id).unwrap().state, JobState::Queued);
    let a = f.wait(&first.id).await;
    let b = f.wait(&second.id).await;
    assert_eq!(
        (a.state, b.state),
        (JobState::Succeeded, JobState::Succeeded)
    );
    assert!(b.started_ms.unwrap() >= a.ended_ms.unwrap());
}

#[tokio::test]
async fn restart_resumes_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(dir, config(), Arc::new(Endpoints));
    let data = image(6 * 1024 * 1024, 7);
    std::fs::write(f.path("a.img"), &data).unwrap();
    let mut slow = f.transfer("a.img", "b.img");
    slow.options.as_mut().unwrap().rate_limit = 2 * 1024 * 1024;
    slow.options.as_mut().unwrap().request_size = 256 * 1024;
    let job = f.start(&slow).await.unwrap();
    let mut rx = f.manager.watch(&job.id).unwrap();
    rx.wait_for(|r| r.progress.committed >= 1024 * 1024)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    f.manager.shutdown(Duration::from_secs(10)).await;
    let Fixture { dir, .. } = f;

    let f = open(dir, config(), Arc::new(Endpoints));
    let before = f.manager.get(&job.id).unwrap();
    assert!(!before.state.is_terminal(), "{before:?}");
    let done = f.wait(&job.id).await;
    assert_eq!(done.state, JobState::Succeeded, "{:?}", done.error);
    assert!(done.progress.resumed >= 1024 * 1024, "{:?}", done.progress);
    assert_eq!(done.attempt, 2);
    let Some(ResultRecord::Transfer { resumed_bytes, .. }) = done.result else {
        panic!()
    };
    assert_eq!(resumed_bytes, done.progress.resumed);
    assert_eq!(std::fs::read(f.path("b.img")).unwrap(), data);
}

#[tokio::test]
async fn listing_filters_and_pages() {
    let f = fixture(config());
    std::fs::write(f.path("a.img"), image(4096, 8)).unwrap();
    let mut ids = Vec::new();
    for i in 0..7 {
        let mut req = f.transfer("a.img", &format!("t{i}.img"));
        req.labels.insert(
            "parity".into(),
            if i % 2 == 0 { "even" } else { "odd" }.into(),
        );
        ids.push(f.start(&req).await.unwrap().id);
    }
    for id in &ids {
        f.wait(id).await;
    }
    let mut filter = ListFilter::default();
    filter.labels.insert("parity".into(), "even".into());
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = f.manager.list(&filter, 2, &token).unwrap();
        assert!(page.jobs.len() <= 2);
        seen.extend(page.jobs.into_iter().map(|j| j.id));
        token = page.next_token;
        if token.is_empty() {
            break;
        }
    }
    let even: Vec<_> = ids.iter().step_by(2).cloned().collect();
    assert_eq!(seen, even);
    filter.states = vec![JobState::Failed];
    assert!(f.manager.list(&filter, 10, "").unwrap().jobs.is_empty());
    assert!(f.manager.list(&filter, 10, "garbage").is_err());
}

#[tokio::test]
async fn history_is_pruned_by_count() {
    let cfg = ManagerConfig {
        history_max_count: 3,
        ..config()
    };
    let f = fixture(cfg);
    std::fs::write(f.path("a.img"), image(4096, 9)).unwrap();
    let mut ids = Vec::new();
    for i in 0..5 {
        let id = f
            .start(&f.transfer("a.img", &format!("p{i}.img")))
            .await
            .unwrap()
            .id;
        f.wait(&id).await;
        ids.push(id);
    }
    f.manager.prune().await;
    assert_eq!(f.manager.len(), 3);
    assert!(f.manager.get(&ids[0]).is_err());
    assert!(f.manager.get(&ids[4]).is_ok());
    assert!(f
        .manager
        .metrics()
        .encode()
        .contains("ferry_jobs{state=\"succeeded\"} 3"));
}

/// A caller's checkpoint (`resume_from`) is where the job starts: shown on the record at
/// once, its bytes skipped (here the target holds other bytes there, which stay), and a
/// finished copy's checkpoint covers the image.
#[tokio::test]
async fn a_callers_checkpoint_is_where_the_job_starts() {
    let f = fixture(config());
    let data = image(4 * 1024 * 1024, 10);
    std::fs::write(f.path("a.img"), &data).unwrap();
    let mut target = data.clone();
    target[..1024 * 1024].fill(0xee);
    std::fs::write(f.path("b.img"), &target).unwrap();
    let mut req = f.transfer("a.img", "b.img");
    req.resume_from = Some(proto::Checkpoint {
        size: data.len() as u64,
        committed: vec![proto::Range {
            start: 0,
            end: 1024 * 1024,
        }],
    });
    let job = f.start(&req).await.unwrap();
    let seeded = job.checkpoint.clone().expect("the caller's checkpoint");
    assert_eq!(seeded.committed, [(0, 1024 * 1024)]);
    let done = f.wait(&job.id).await;
    assert_eq!(done.state, JobState::Succeeded, "{:?}", done.error);
    assert_eq!(done.progress.resumed, 1024 * 1024);
    let Some(ResultRecord::Transfer { resumed_bytes, .. }) = done.result else {
        panic!("no transfer result: {done:?}")
    };
    assert_eq!(resumed_bytes, 1024 * 1024);
    let cp = done.checkpoint.expect("a checkpoint");
    assert_eq!(
        (cp.size, cp.committed),
        (data.len() as u64, vec![(0, data.len() as u64)])
    );
    assert_eq!(std::fs::read(f.path("b.img")).unwrap(), target);
}

/// Opens real endpoints, except that the file targets named in `failing` fail every write
/// after their first `after` writes with the kind given, the first time they are opened.
#[derive(Debug)]
struct Breaking {
    failing: Vec<(&'static str, ErrorKind)>,
    after: u32,
    opened: parking_lot::Mutex<Vec<String>>,
}

impl Breaking {
    fn new(failing: Vec<(&'static str, ErrorKind)>, after: u32) -> Arc<Self> {
        Arc::new(Self {
            failing,
            after,
            opened: parking_lot::Mutex::default(),
        })
    }
}

#[async_trait]
impl Opener for Breaking {
    async fn open_source(&self, spec: &EndpointSpec, o: &SourceOptions) -> Result<Arc<dyn Source>> {
        Endpoints.open_source(spec, o).await
    }

    async fn open_target(
        &self,
        spec: &EndpointSpec,
        size: u64,
        o: &TargetOptions,
    ) -> Result<Arc<dyn Target>> {
        let target = Endpoints.open_target(spec, size, o).await?;
        let EndpointSpec::File(path) = spec else {
            return Ok(target);
        };
        let name = path.display().to_string();
        let Some((_, kind)) = self.failing.iter().find(|(f, _)| name.ends_with(f)) else {
            return Ok(target);
        };
        let mut opened = self.opened.lock();
        if opened.contains(&name) {
            return Ok(target);
        }
        opened.push(name);
        Ok(Arc::new(FailAfter {
            inner: target,
            writes_left: Arc::new(std::sync::atomic::AtomicI64::new(i64::from(self.after))),
            kind: *kind,
        }))
    }
}

/// A target whose writes fail once its budget of writes is spent.
struct FailAfter {
    inner: Arc<dyn Target>,
    writes_left: Arc<std::sync::atomic::AtomicI64>,
    kind: ErrorKind,
}

impl FailAfter {
    fn spend(&self) -> Result<()> {
        if self.writes_left.fetch_sub(1, Ordering::SeqCst) <= 0 {
            return Err(Error::new(self.kind, "injected write failure").with_operation("write"));
        }
        Ok(())
    }
}

#[async_trait]
impl Target for FailAfter {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> ferry_core::Caps {
        self.inner.caps()
    }
    async fn write_at(&self, offset: u64, buf: ferry_core::IoBuf) -> Result<ferry_core::IoBuf> {
        self.spend()?;
        self.inner.write_at(offset, buf).await
    }
    async fn write_zeroes(&self, offset: u64, len: u64, mode: ferry_core::ZeroMode) -> Result<()> {
        self.inner.write_zeroes(offset, len, mode).await
    }
    async fn flush(&self) -> Result<()> {
        self.inner.flush().await
    }
    async fn connect(&self) -> Result<Arc<dyn Target>> {
        Ok(Arc::new(Self {
            inner: self.inner.connect().await?,
            writes_left: self.writes_left.clone(),
            kind: self.kind,
        }))
    }
    async fn finish(&self) -> Result<()> {
        self.inner.finish().await
    }
    async fn abort(&self) -> Result<()> {
        self.inner.abort().await
    }
}

impl Fixture {
    fn fan_out(&self, src: &str, targets: &[&str]) -> proto::StartTransferRequest {
        let mut req = self.transfer(src, targets[0]);
        req.more_targets = targets[1..]
            .iter()
            .map(|t| proto::Endpoint {
                url: self.path(t),
                ..Default::default()
            })
            .collect();
        let o = req.options.as_mut().unwrap();
        o.request_size = 256 * 1024;
        o.workers = 2;
        req
    }
}

/// One target of three fails for good mid-copy: the other two hold the image, verified;
/// the job fails naming the failed one, keeps its result, and says target by target
/// which hold the image.
#[tokio::test]
async fn a_fan_out_with_a_failed_target_fails_and_the_others_hold_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let f = open(
        dir,
        config(),
        Breaking::new(vec![("t1.img", ErrorKind::NoSpace)], 2),
    );
    let data = image(4 * 1024 * 1024 + 4096, 7);
    std::fs::write(f.path("a.img"), &data).unwrap();
    let mut req = f.fan_out("a.img", &["t0.img", "t1.img", "t2.img"]);
    req.options.as_mut().unwrap().verify = true;
    let job = f.start(&req).await.unwrap();
    assert_eq!(job.targets.len(), 3);
    assert!(job.targets.iter().all(|t| t.state == TargetState::Running));
    let done = f.wait(&job.id).await;
    assert_eq!(done.state, JobState::Failed, "{done:?}");
    assert_eq!(done.attempt, 1, "a partial failure is final");
    let err = done.error.clone().unwrap();
    assert_eq!(err.kind, "no_space");
    assert!(
        err.message.starts_with("1 of 3 targets failed: "),
        "{}",
        err.message
    );
    assert!(err.message.contains("t1.img"), "{}", err.message);
    assert!(err.message.contains("the image is on"), "{}", err.message);
    for i in [0, 2] {
        let t = &done.targets[i];
        assert_eq!(t.state, TargetState::Succeeded, "{t:?}");
        assert_eq!(std::fs::read(f.path(&format!("t{i}.img"))).unwrap(), data);
        assert_eq!(t.done, data.len() as u64);
    }
    let failed = &done.targets[1];
    assert_eq!(failed.state, TargetState::Failed);
    assert!(!failed.resumable);
    assert_eq!(failed.error.as_ref().unwrap().kind, "no_space");
    let Some(ResultRecord::Transfer { source_digest, .. }) = &done.result else {
        panic!("the result of the targets that hold the image: {done:?}")
    };
    let source_digest = source_digest.clone().expect("verified");
    assert_eq!(done.targets[0].digest.as_ref(), Some(&source_digest));
    assert_eq!(done.targets[2].digest.as_ref(), Some(&source_digest));
    assert_eq!(failed.digest, None);
    let text = f.manager.metrics().encode();
    assert!(
        text.contains("ferry_transfer_targets_total{endpoint=\"file\",result=\"succeeded\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("ferry_transfer_targets_total{endpoint=\"file\",result=\"failed\"} 1"),
        "{text}"
    );
}

/// Both targets fail in one attempt: the one that failed first is out of the job; the
/// one that failed last (transiently) held every committed range, so the retry resumes
/// it alone, and it gets the image.
#[tokio::test]
async fn the_last_target_to_fail_is_retried_and_an_earlier_failure_stays_failed() {
    let dir = tempfile::tempdir().unwrap();
    let opener = Breaking::new(
        vec![
            ("early.img", ErrorKind::Io),
            ("late.img", ErrorKind::Disconnected),
        ],
        0,
    );
    let f = open(dir, config(), opener);
    let data = image(4 * 1024 * 1024, 9);
    std::fs::write(f.path("a.img"), &data).unwrap();
    let mut req = f.fan_out("a.img", &["early.img", "late.img"]);
    req.options.as_mut().unwrap().workers = 1;
    let job = f.start(&req).await.unwrap();
    let done = f.wait(&job.id).await;
    assert_eq!(done.state, JobState::Failed, "{done:?}");
    assert_eq!(done.attempt, 2, "the transient failure was retried");
    let early = &done.targets[0];
    assert_eq!(early.state, TargetState::Failed);
    assert!(!early.resumable);
    assert_eq!(early.error.as_ref().unwrap().kind, "io");
    assert_eq!(done.targets[1].state, TargetState::Succeeded, "{done:?}");
    assert_eq!(std::fs::read(f.path("late.img")).unwrap(), data);
    assert_eq!(done.error.unwrap().kind, "io");
}

/// Every target holds the image: the job succeeds with one outcome per target.
#[tokio::test]
async fn a_fan_out_succeeds_when_every_target_holds_the_image() {
    let f = fixture(config());
    let data = image(3 * 1024 * 1024 + 100, 3);
    std::fs::write(f.path("a.img"), &data).unwrap();
    let job = f
        .start(&f.fan_out("a.img", &["x.img", "y.img", "z.img"]))
        .await
        .unwrap();
    let done = f.wait(&job.id).await;
    assert_eq!(done.state, JobState::Succeeded, "{:?}", done.error);
    for (t, name) in done.targets.iter().zip(["x.img", "y.img", "z.img"]) {
        assert_eq!(t.state, TargetState::Succeeded);
        assert!(t.target.ends_with(name), "{}", t.target);
        assert_eq!(std::fs::read(f.path(name)).unwrap(), data);
    }
}
