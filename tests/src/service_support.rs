//! Support for the job service tests: a service in-process on 127.0.0.1:0 or the
//! `ferry-e2e serve` process (for kill -9 and SIGTERM), gRPC clients, request builders,
//! images with data and holes, byte checks with qemu-img, and a /metrics scraper.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_api::proto;
use ferry_api::proto::backup_service_client::BackupServiceClient;
use ferry_api::proto::job_service_client::JobServiceClient;
use ferry_api::proto::schedule_service_client::ScheduleServiceClient;
use ferry_server::config::ServiceConfig;
use ferry_server::server::{self, RunningService};
use tonic::transport::Channel;

pub use proto::{
    Endpoint, Job, JobState, StartChecksumRequest, StartTransferRequest, TransferOptions,
};

/// A gRPC client of the job service.
pub type Client = JobServiceClient<Channel>;
/// A gRPC client of the schedule service.
pub type ScheduleClient = ScheduleServiceClient<Channel>;
/// A gRPC client of the backup service.
pub type BackupClient = BackupServiceClient<Channel>;

/// A service configuration for tests: ports chosen at run time, data under `data_dir`,
/// files allowed under `root`, quick checkpoints and retries.
pub fn test_config(data_dir: &Path, root: &Path) -> ServiceConfig {
    let mut cfg = ServiceConfig::new(data_dir);
    cfg.grpc_listen = "127.0.0.1:0".parse().expect("address");
    cfg.metrics_listen = Some("127.0.0.1:0".parse().expect("address"));
    cfg.allow_roots = vec![root.to_path_buf()];
    cfg.manager.checkpoint_interval = Duration::from_millis(500);
    cfg.manager.progress_interval = Duration::from_millis(100);
    cfg.manager.retry_base = Duration::from_millis(50);
    cfg.manager.retry_max = Duration::from_millis(500);
    cfg.shutdown_timeout = Duration::from_secs(10);
    cfg
}

/// Starts a service in this process.
pub async fn start_in_process(cfg: ServiceConfig) -> RunningService {
    server::start(cfg).await.expect("start the service")
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("url")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect to the service")
}

/// Connects a client to `addr`.
pub async fn connect(addr: SocketAddr) -> Client {
    JobServiceClient::new(channel(addr).await)
}

/// Connects a backup client to `addr`.
pub async fn connect_backups(addr: SocketAddr) -> BackupClient {
    BackupServiceClient::new(channel(addr).await)
}

/// A job service in this process with its jobs and backups clients: files allowed under
/// `root` (`<dir>/images`), each of `secrets` (name, content) a file under its
/// `--secrets-dir`; `seconds`: schedules take a seconds field.
#[derive(Debug)]
pub struct BackupEnv {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub service: RunningService,
    pub jobs: Client,
    pub backups: BackupClient,
}

impl BackupEnv {
    pub async fn start(secrets: &[(&str, String)], seconds: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("images");
        std::fs::create_dir(&root).unwrap();
        let secrets_dir = write_secrets(dir.path(), secrets);
        let mut cfg = test_config(&dir.path().join("data"), &root);
        cfg.secrets_dir = Some(secrets_dir);
        cfg.schedules.seconds_field = seconds;
        let service = start_in_process(cfg).await;
        let jobs = connect(service.grpc_addr()).await;
        let backups = connect_backups(service.grpc_addr()).await;
        Self {
            dir,
            root,
            service,
            jobs,
            backups,
        }
    }
}

/// `<dir>/secrets` holding each of `secrets` (name, content) as a file: a `--secrets-dir`.
pub fn write_secrets(dir: &Path, secrets: &[(&str, String)]) -> PathBuf {
    let path = dir.join("secrets");
    std::fs::create_dir_all(&path).unwrap();
    for (name, value) in secrets {
        std::fs::write(path.join(name), value).unwrap();
    }
    path
}

/// A secret by reference: a file under the service's `--secrets-dir`.
pub fn file_ref(name: &str) -> Option<proto::SecretRef> {
    Some(proto::SecretRef {
        source: Some(proto::secret_ref::Source::File(name.into())),
    })
}

/// Connects a schedule client to `addr`.
pub async fn connect_schedules(addr: SocketAddr) -> ScheduleClient {
    ScheduleServiceClient::new(channel(addr).await)
}

/// An endpoint for a path or URL with no options.
pub fn endpoint(url: impl Into<String>) -> Option<Endpoint> {
    Some(Endpoint {
        url: url.into(),
        options: None,
        ..Default::default()
    })
}

/// A transfer request from `src` to `dst`.
pub fn transfer(src: &Path, dst: &Path) -> StartTransferRequest {
    StartTransferRequest {
        source: endpoint(src.display().to_string()),
        target: endpoint(dst.display().to_string()),
        options: Some(TransferOptions::default()),
        ..Default::default()
    }
}

/// A checksum request of `src`.
pub fn checksum(src: &Path) -> StartChecksumRequest {
    StartChecksumRequest {
        source: endpoint(src.display().to_string()),
        ..Default::default()
    }
}

/// Follows a job with WatchJob until its terminal state, which it returns.
pub async fn wait_terminal(client: &mut Client, id: &str, limit: Duration) -> Job {
    let fut = async {
        let mut stream = client
            .watch_job(proto::WatchJobRequest { id: id.into() })
            .await
            .expect("watch")
            .into_inner();
        let mut last = None;
        while let Some(ev) = stream.message().await.expect("watch stream") {
            last = ev.job;
        }
        last.expect("the watch stream sent the job")
    };
    let job = tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("job {id} did not finish within {limit:?}"));
    assert!(
        is_terminal(&job),
        "watch ended before a terminal state: {job:?}"
    );
    job
}

/// Follows a job with WatchJob until an update satisfies `until`, which it returns; fails
/// if the job ends first (a test that wants to act in the middle of a job).
pub async fn watch_until(client: &mut Client, id: &str, until: impl Fn(&Job) -> bool) -> Job {
    let mut stream = client
        .watch_job(proto::WatchJobRequest { id: id.into() })
        .await
        .expect("watch")
        .into_inner();
    loop {
        let job = stream
            .message()
            .await
            .expect("watch stream")
            .and_then(|ev| ev.job)
            .unwrap_or_else(|| panic!("the watch of job {id} ended while it ran"));
        assert!(!is_terminal(&job), "the job finished too early: {job:?}");
        if until(&job) {
            return job;
        }
    }
}

pub fn is_terminal(job: &Job) -> bool {
    [JobState::Succeeded, JobState::Failed, JobState::Cancelled]
        .iter()
        .any(|s| *s as i32 == job.state)
}

pub fn state(job: &Job) -> JobState {
    JobState::try_from(job.state).unwrap_or(JobState::Unspecified)
}

/// Writes an image of `size` bytes: 1 MiB data runs alternating with 1 MiB holes, data
/// derived from `seed`. Returns the path.
pub fn make_image(path: &Path, size: u64, seed: u8) -> PathBuf {
    let mut f = std::fs::File::create(path).expect("create image");
    f.set_len(size).expect("size image");
    const RUN: u64 = 1024 * 1024;
    let mut buf = vec![0u8; RUN as usize];
    let mut offset = 0;
    let mut run = 0u64;
    while offset < size {
        let len = RUN.min(size - offset);
        if run.is_multiple_of(2) {
            for (i, b) in buf.iter_mut().enumerate().take(len as usize) {
                *b = ((offset as usize + i) as u8)
                    .wrapping_mul(131)
                    .wrapping_add(seed)
                    | 1;
            }
            std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(offset)).expect("seek");
            f.write_all(&buf[..len as usize]).expect("write image");
        }
        offset += len;
        run += 1;
    }
    f.sync_all().expect("sync image");
    path.to_path_buf()
}

/// Fails unless `qemu-img compare` finds the two raw images identical.
pub fn assert_same_image(a: &Path, b: &Path) {
    let out = Command::new("qemu-img")
        .args(["compare", "-q", "-f", "raw", "-F", "raw"])
        .arg(a)
        .arg(b)
        .output()
        .unwrap_or_else(|e| panic!("qemu-img is needed (apt-get install -y qemu-utils): {e}"));
    assert!(
        out.status.success(),
        "qemu-img compare {} {} failed: {}{}",
        a.display(),
        b.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// GET /metrics from the metrics port.
pub async fn scrape_metrics(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connect metrics");
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
            .await
            .expect("send request");
        let mut text = String::new();
        s.read_to_string(&mut text).await.expect("read metrics");
        text
    };
    let text = tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("metrics answered in time");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    body.to_string()
}

/// Parses an exposition with a real Prometheus text parser.
pub fn parse_metrics(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("valid Prometheus text exposition")
}

/// The value of the sample `name` whose labels include all of `labels`.
pub fn sample(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(ref h) => h.last().map_or(0.0, |b| b.count),
            prometheus_parse::Value::Summary(_) => f64::NAN,
        })
}

/// `ferry-e2e serve` as a child process.
#[derive(Debug)]
pub struct ServeProcess {
    pub child: Child,
    pub grpc: SocketAddr,
    pub metrics: Option<SocketAddr>,
    stderr: std::sync::Arc<parking_lot::Mutex<String>>,
}

impl ServeProcess {
    /// Starts `BIN serve ARGS...` with ports chosen at run time and waits for its
    /// "ferry serve: grpc=... metrics=..." line.
    pub fn start(bin: &Path, args: &[String], envs: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .args([
                "--grpc-listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start ferry-e2e serve");
        let stderr = std::sync::Arc::new(parking_lot::Mutex::new(String::new()));
        let sink = stderr.clone();
        let mut err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "ferry serve did not report its ports; stderr:\n{}",
                    stderr.lock().clone()
                );
            }
        };
        let mut grpc = None;
        let mut metrics = None;
        for part in line.split_whitespace() {
            if let Some(a) = part.strip_prefix("grpc=") {
                grpc = a.parse().ok();
            }
            if let Some(a) = part.strip_prefix("metrics=") {
                metrics = a.parse().ok();
            }
        }
        Self {
            child,
            grpc: grpc.unwrap_or_else(|| panic!("no grpc= in '{line}'")),
            metrics,
            stderr,
        }
    }

    /// What the server logged so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().clone()
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill9(mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
    }

    /// SIGTERM, then waits up to `limit` for the exit; returns the exit status and time.
    pub fn terminate(mut self, limit: Duration) -> (std::process::ExitStatus, Duration, String) {
        let pid = self.child.id() as i32;
        // SAFETY: plain kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill SIGTERM");
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                std::thread::sleep(Duration::from_millis(50));
                return (status, started.elapsed(), self.stderr());
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                panic!(
                    "ferry serve did not exit within {limit:?} of SIGTERM:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Resident set size of a process in KiB (from /proc).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
