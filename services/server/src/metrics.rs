//! Prometheus metrics of the service, served on their own HTTP port.
//!
//! Names follow `ferry_<noun>_<unit>[_total]`; labels are bounded sets only (job kind,
//! job state, result, endpoint kind, operation, gRPC method, schedule state): never ids,
//! names or offsets. The one exception is `repository` on the backup metrics: the
//! repository's directory or s3:// URL (never credentials), a set as small as the
//! repositories a server backs up into, and what an alert on a failing or growing
//! repository needs. Per-schedule times (next run, last success) are in the schedule's
//! status over gRPC instead.

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::model::job::JobState;

/// Every metric of the service.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Jobs by state (gauge over the jobs the service knows, including history).
    pub jobs: IntGaugeVec,
    /// Jobs that reached a terminal state, by kind and result.
    pub jobs_finished: IntCounterVec,
    /// Run time of finished jobs (start to end), by kind and result.
    pub job_duration: HistogramVec,
    /// Time from acceptance to start, by kind.
    pub queue_wait: HistogramVec,
    /// Retries of transient errors, by kind.
    pub job_retries: IntCounterVec,
    /// Bytes read from sources, by endpoint kind.
    pub bytes_read: IntCounterVec,
    /// Image bytes read from job sources after decoding (qcow2 clusters, decompressed
    /// streams), by image format (raw, qcow2, gz, xz, zst) and endpoint kind.
    pub image_bytes_read: IntCounterVec,
    /// Bytes written to targets, by endpoint kind.
    pub bytes_written: IntCounterVec,
    /// Bytes made zero with write_zeroes, by endpoint kind.
    pub bytes_zeroed: IntCounterVec,
    /// Bytes neither read nor written: already committed before a resume, or zero ranges
    /// of a target known to be zero, by endpoint kind.
    pub bytes_skipped: IntCounterVec,
    /// Failed endpoint operations, by endpoint kind and operation.
    pub io_errors: IntCounterVec,
    /// Targets of finished transfers (one per target of a fan-out), by endpoint kind and
    /// result.
    pub transfer_targets: IntCounterVec,
    /// gRPC requests being handled, by method.
    pub requests_in_flight: IntGaugeVec,
    /// gRPC requests handled, by method and status code.
    pub requests: IntCounterVec,
    /// Schedules by state (active, paused).
    pub schedules: IntGaugeVec,
    /// Schedule fires and runs by result: started, skipped (the previous run was still
    /// going), missed (the server was down), and how started runs ended (succeeded,
    /// failed, cancelled; failed includes runs that could not start).
    pub schedule_runs: IntCounterVec,
    /// Bytes of finished backups by repository and kind: read (from the source), new
    /// (stored), reused (already stored), zero (never stored).
    pub backup_bytes: IntCounterVec,
    /// Run time of successful backups, by repository.
    pub backup_duration: HistogramVec,
    /// When a backup into the repository last succeeded (Unix seconds).
    pub backup_last_success: IntGaugeVec,
    /// Chunks a repository holds after its last GC, by repository.
    pub repository_chunks: IntGaugeVec,
    /// Stored bytes a repository holds after its last GC, by repository.
    pub repository_bytes: IntGaugeVec,
    /// Chunks checked by verifies, by repository and result (good, bad).
    pub verify_chunks: IntCounterVec,
}

/// The results `ferry_schedule_runs_total` counts.
pub const SCHEDULE_RUN_RESULTS: [&str; 6] = [
    "started",
    "skipped",
    "missed",
    "succeeded",
    "failed",
    "cancelled",
];

/// Histogram buckets of job run and queue times, in seconds.
const JOB_SECONDS: [f64; 13] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
];

/// Histogram buckets of backup run times, in seconds.
const BACKUP_SECONDS: [f64; 12] = [
    1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0,
];

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .expect("valid metric");
    registry
        .register(Box::new(h.clone()))
        .expect("unique metric");
    h
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    // One declaration per metric, kept together as the list of what the service exports:
    // longer than the usual function for that reason only.
    pub fn new() -> Self {
        let registry = Registry::new();
        let m = Self {
            backup_bytes: counter(
                &registry,
                "ferry_backup_bytes_total",
                "Bytes of finished backups by repository and kind (read, new, reused, zero).",
                &["repository", "kind"],
            ),
            backup_duration: histogram(
                &registry,
                "ferry_backup_duration_seconds",
                "Run time of successful backups, by repository.",
                &["repository"],
                BACKUP_SECONDS.to_vec(),
            ),
            backup_last_success: gauge(
                &registry,
                "ferry_backup_last_success_timestamp_seconds",
                "When a backup into the repository last succeeded (Unix time).",
                &["repository"],
            ),
            repository_chunks: gauge(
                &registry,
                "ferry_repository_chunks",
                "Chunks a repository holds after its last garbage collection.",
                &["repository"],
            ),
            repository_bytes: gauge(
                &registry,
                "ferry_repository_bytes",
                "Stored bytes a repository holds after its last garbage collection.",
                &["repository"],
            ),
            verify_chunks: counter(
                &registry,
                "ferry_repository_verify_chunks_total",
                "Chunks checked by repository verifies, by repository and result (good, bad).",
                &["repository", "result"],
            ),
            jobs: gauge(&registry, "ferry_jobs", "Jobs by state.", &["state"]),
            jobs_finished: counter(
                &registry,
                "ferry_jobs_finished_total",
                "Jobs that reached a terminal state, by kind and result.",
                &["kind", "result"],
            ),
            job_duration: histogram(
                &registry,
                "ferry_job_duration_seconds",
                "Run time of finished jobs, by kind and result.",
                &["kind", "result"],
                JOB_SECONDS.to_vec(),
            ),
            queue_wait: histogram(
                &registry,
                "ferry_job_queue_wait_seconds",
                "Time jobs waited in the queue before they started, by kind.",
                &["kind"],
                JOB_SECONDS.to_vec(),
            ),
            job_retries: counter(
                &registry,
                "ferry_job_retries_total",
                "Retries after transient errors, by kind.",
                &["kind"],
            ),
            bytes_read: counter(
                &registry,
                "ferry_read_bytes_total",
                "Bytes read from sources, by endpoint kind.",
                &["endpoint"],
            ),
            image_bytes_read: counter(
                &registry,
                "ferry_image_read_bytes_total",
                "Image bytes read from job sources after decoding, by image format and endpoint kind.",
                &["format", "endpoint"],
            ),
            bytes_written: counter(
                &registry,
                "ferry_written_bytes_total",
                "Bytes written to targets, by endpoint kind.",
                &["endpoint"],
            ),
            bytes_zeroed: counter(
                &registry,
                "ferry_zeroed_bytes_total",
                "Bytes zeroed on targets with write_zeroes, by endpoint kind.",
                &["endpoint"],
            ),
            bytes_skipped: counter(
                &registry,
                "ferry_skipped_bytes_total",
                "Bytes neither read nor written (resumed or known zero), by endpoint kind.",
                &["endpoint"],
            ),
            io_errors: counter(
                &registry,
                "ferry_io_errors_total",
                "Failed endpoint operations, by endpoint kind and operation.",
                &["endpoint", "operation"],
            ),
            transfer_targets: counter(
                &registry,
                "ferry_transfer_targets_total",
                "Targets of finished transfers, by endpoint kind and result (succeeded, failed).",
                &["endpoint", "result"],
            ),
            requests_in_flight: gauge(
                &registry,
                "ferry_grpc_requests_in_flight",
                "gRPC requests being handled, by method.",
                &["method"],
            ),
            requests: counter(
                &registry,
                "ferry_grpc_requests_total",
                "gRPC requests handled, by method and code.",
                &["method", "code"],
            ),
            schedules: gauge(
                &registry,
                "ferry_schedules",
                "Schedules by state (active, paused).",
                &["state"],
            ),
            schedule_runs: counter(
                &registry,
                "ferry_schedule_runs_total",
                "Schedule runs by result: started, skipped, missed, succeeded, failed, cancelled.",
                &["result"],
            ),
            registry,
        };
        m.zero_known_labels();
        m
    }

    /// Exports every known job state, schedule state and schedule run result at zero,
    /// so that they exist before their first change.
    fn zero_known_labels(&self) {
        for state in JobState::ALL {
            self.jobs.with_label_values(&[state.as_str()]).set(0);
        }
        for state in ["active", "paused"] {
            self.schedules.with_label_values(&[state]).set(0);
        }
        for result in SCHEDULE_RUN_RESULTS {
            self.schedule_runs.with_label_values(&[result]).inc_by(0);
        }
    }

    /// Moves one job between states in the jobs gauge (None: not counted).
    pub fn job_state(&self, from: Option<JobState>, to: Option<JobState>) {
        if let Some(s) = from {
            self.jobs.with_label_values(&[s.as_str()]).dec();
        }
        if let Some(s) = to {
            self.jobs.with_label_values(&[s.as_str()]).inc();
        }
    }

    /// Moves one schedule between states in the schedules gauge (None: not counted).
    pub fn schedule_state(&self, from: Option<bool>, to: Option<bool>) {
        let name = |paused: bool| if paused { "paused" } else { "active" };
        if let Some(paused) = from {
            self.schedules.with_label_values(&[name(paused)]).dec();
        }
        if let Some(paused) = to {
            self.schedules.with_label_values(&[name(paused)]).inc();
        }
    }

    /// Records a successful backup into `repository`.
    pub fn backup_done(&self, repository: &str, r: &ferry_image_backup::BackupReport) {
        let m = &r.manifest;
        for (kind, bytes) in [
            ("read", r.bytes_read),
            ("new", m.bytes_new),
            ("reused", m.bytes_reused),
            ("zero", m.bytes_zero),
        ] {
            self.backup_bytes
                .with_label_values(&[repository, kind])
                .inc_by(bytes);
        }
        self.backup_duration
            .with_label_values(&[repository])
            .observe(r.elapsed.as_secs_f64());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.backup_last_success
            .with_label_values(&[repository])
            .set(now);
    }

    /// Records what a verify of `repository` checked.
    pub fn verify_done(&self, repository: &str, r: &ferry_backup::VerifyReport) {
        let bad = r.problems.len() as u64;
        self.verify_chunks
            .with_label_values(&[repository, "good"])
            .inc_by(r.chunks_checked.saturating_sub(bad));
        self.verify_chunks
            .with_label_values(&[repository, "bad"])
            .inc_by(bad);
    }

    /// Records what a GC of `repository` left.
    pub fn gc_done(&self, repository: &str, r: &ferry_backup::GcReport) {
        let kept = r.chunks_referenced + r.chunks_recent;
        self.repository_chunks
            .with_label_values(&[repository])
            .set(kept as i64);
        self.repository_bytes
            .with_label_values(&[repository])
            .set(r.bytes_kept as i64);
    }

    /// Counts schedule runs with this result.
    pub fn schedule_run(&self, result: &'static str, n: u64) {
        self.schedule_runs.with_label_values(&[result]).inc_by(n);
    }

    /// Counts a request in flight until the guard drops; the guard records the code.
    pub fn request(&self, method: &'static str) -> RequestGuard {
        self.requests_in_flight.with_label_values(&[method]).inc();
        RequestGuard {
            metrics: self.clone(),
            method,
            code: "unknown",
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Decrements the in-flight gauge and counts the request when dropped: a request cannot
/// be forgotten by an early return.
#[derive(Debug)]
pub struct RequestGuard {
    metrics: Metrics,
    method: &'static str,
    code: &'static str,
}

impl RequestGuard {
    pub fn set_code(&mut self, code: tonic::Code) {
        self.code = code_name(code);
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.metrics
            .requests_in_flight
            .with_label_values(&[self.method])
            .dec();
        self.metrics
            .requests
            .with_label_values(&[self.method, self.code])
            .inc();
    }
}

fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "ok",
        Cancelled => "cancelled",
        Unknown => "unknown",
        InvalidArgument => "invalid_argument",
        DeadlineExceeded => "deadline_exceeded",
        NotFound => "not_found",
        AlreadyExists => "already_exists",
        PermissionDenied => "permission_denied",
        ResourceExhausted => "resource_exhausted",
        FailedPrecondition => "failed_precondition",
        Aborted => "aborted",
        OutOfRange => "out_of_range",
        Unimplemented => "unimplemented",
        Internal => "internal",
        Unavailable => "unavailable",
        DataLoss => "data_loss",
        Unauthenticated => "unauthenticated",
    }
}

/// Metrics that can be served: the service's ([`Metrics`]), or any registry's text
/// exposition (the `ferry operator` serves its own through a closure).
pub trait Exposition: Clone + Send + Sync + 'static {
    /// The text exposition format.
    fn encode(&self) -> String;
}

impl Exposition for Metrics {
    fn encode(&self) -> String {
        Metrics::encode(self)
    }
}

/// Metrics encoded by a function (another crate's registry).
#[derive(Clone)]
#[allow(missing_debug_implementations)] // a closure has no Debug
pub struct EncodedBy<F>(pub F);

impl<F: Fn() -> String + Clone + Send + Sync + 'static> Exposition for EncodedBy<F> {
    fn encode(&self) -> String {
        (self.0)()
    }
}

/// Serves `GET /metrics` (and `/healthz`) until `shutdown` fires.
pub async fn serve<E: Exposition>(listener: TcpListener, metrics: E, shutdown: CancellationToken) {
    loop {
        let (stream, _peer): (_, SocketAddr) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let metrics = metrics.clone();
                async move { Ok::<_, Infallible>(respond(&req, &metrics)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = shutdown.cancelled() => {}
            }
        });
    }
}

fn respond<E: Exposition>(req: &Request<Incoming>, metrics: &E) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&hyper::Method::GET, "/metrics") => (
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.encode(),
        ),
        (&hyper::Method::GET, "/healthz") => (200, "text/plain", "ok\n".to_string()),
        _ => (404, "text/plain", "not found: try /metrics\n".to_string()),
    };
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_every_family_with_bounded_labels() {
        let m = Metrics::new();
        m.job_state(None, Some(JobState::Queued));
        m.job_state(Some(JobState::Queued), Some(JobState::Running));
        m.jobs_finished
            .with_label_values(&["transfer", "succeeded"])
            .inc();
        m.bytes_read.with_label_values(&["file"]).inc_by(4096);
        {
            let mut g = m.request("StartTransfer");
            assert_eq!(
                m.requests_in_flight
                    .with_label_values(&["StartTransfer"])
                    .get(),
                1
            );
            g.set_code(tonic::Code::Ok);
        }
        let text = m.encode();
        assert!(text.contains("ferry_jobs{state=\"running\"} 1"), "{text}");
        assert!(text.contains("ferry_jobs{state=\"queued\"} 0"), "{text}");
        assert!(text.contains("ferry_read_bytes_total{endpoint=\"file\"} 4096"));
        assert!(text.contains("ferry_grpc_requests_total{code=\"ok\",method=\"StartTransfer\"} 1"));
        assert!(text.contains("ferry_grpc_requests_in_flight{method=\"StartTransfer\"} 0"));
        m.schedule_state(None, Some(false));
        m.schedule_state(Some(false), Some(true));
        m.schedule_run("skipped", 2);
        let text = m.encode();
        assert!(
            text.contains("ferry_schedules{state=\"paused\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ferry_schedules{state=\"active\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("ferry_schedule_runs_total{result=\"skipped\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("ferry_schedule_runs_total{result=\"missed\"} 0"),
            "{text}"
        );
    }
}
