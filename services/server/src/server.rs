//! Starts a whole service in-process: store, job manager, schedule manager, gRPC (jobs,
//! schedules, health, reflection) and the metrics endpoint; and stops it in order.
//! `ferry serve` and the tests both use [`start`].
//!
//! Shutdown contract: [`RunningService::shutdown`] stops accepting connections, ends
//! watch streams, stops the scheduler (no new runs; a fire it recorded but could not
//! start is started by the next start), interrupts running jobs (each persists its last checkpoint and stays
//! "running" in the store, so the next start resumes it), waits at most the configured
//! shutdown timeout for them, and closes the store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{Error, ErrorKind, Result};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::{Router, TcpIncoming};
use tonic::transport::Server;

use super::api::JobApi;
use super::backups::api::BackupApi;
use super::config::ServiceConfig;
use super::convert::Validator;
use super::jobs::opener::{Endpoints, Opener};
use super::jobs::JobManager;
use super::metrics::{self, Metrics};
use super::schedules::api::ScheduleApi;
use super::schedules::ScheduleManager;
use super::secrets::SecretResolver;
use super::security::{AllowRoots, BearerAuth};
use super::store::Store;
use crate::model::schedule::ScheduleRecord;
use ferry_api::proto::backup_service_server::BackupServiceServer;
use ferry_api::proto::schedule_service_server::ScheduleServiceServer;
use ferry_api::proto::{self, job_service_server::JobServiceServer};

/// A running service.
#[derive(Debug)]
pub struct RunningService {
    grpc_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    manager: JobManager,
    schedules: ScheduleManager,
    stop: CancellationToken,
    grpc: JoinHandle<std::result::Result<(), tonic::transport::Error>>,
    metrics_task: Option<JoinHandle<()>>,
    health: tonic_health::server::HealthReporter,
    shutdown_timeout: Duration,
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io(format!("cannot listen for {what} on {addr}"), e))
}

/// Opens the store and starts the job manager on what it holds; returns the store's
/// schedules for the schedule manager.
fn start_manager(
    cfg: &ServiceConfig,
    metrics: &Metrics,
    opener: Arc<dyn Opener>,
    secrets: &SecretResolver,
    roots: &AllowRoots,
) -> Result<(JobManager, Store, Vec<ScheduleRecord>)> {
    let (store, mut loaded) = Store::open(&cfg.data_dir)?;
    tracing::info!(
        jobs = loaded.jobs.len(),
        checkpoints = loaded.checkpoints.len(),
        schedules = loaded.schedules.len(),
        data_dir = %cfg.data_dir.display(),
        "job store opened"
    );
    let schedules = std::mem::take(&mut loaded.schedules);
    let mut settings = cfg.manager.clone();
    settings.allow_roots = roots.clone();
    let manager = JobManager::start(
        settings,
        store.clone(),
        loaded,
        metrics.clone(),
        opener,
        secrets.clone(),
    );
    Ok((manager, store, schedules))
}

/// The gRPC server, with TLS when configured.
fn server_builder(cfg: &ServiceConfig) -> Result<Server> {
    let builder = Server::builder().concurrency_limit_per_connection(256);
    match &cfg.tls {
        None => Ok(builder),
        Some(tls) => builder
            .tls_config(tls.server_config()?)
            .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("TLS configuration: {e}"))),
    }
}

/// Starts the service with the real endpoints.
pub async fn start(cfg: ServiceConfig) -> Result<RunningService> {
    start_with(cfg, Arc::new(Endpoints)).await
}

/// A service behind the bearer-token check (a no-op without a configured token).
fn guarded<S>(service: S, cfg: &ServiceConfig) -> Guarded<S> {
    tonic::service::interceptor::InterceptedService::new(
        service,
        BearerAuth::new(cfg.auth_token.clone()),
    )
}

/// The health service, every API (and the server as a whole) reported serving.
async fn serving_health() -> (
    tonic_health::server::HealthReporter,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
) {
    let (health, service) = tonic_health::server::health_reporter();
    for name in [
        proto::JOB_SERVICE_NAME,
        proto::SCHEDULE_SERVICE_NAME,
        proto::BACKUP_SERVICE_NAME,
        "",
    ] {
        health
            .set_service_status(name, tonic_health::ServingStatus::Serving)
            .await;
    }
    (health, service)
}

/// The service's listeners, bound before anything starts.
struct Listeners {
    grpc: TcpListener,
    grpc_addr: SocketAddr,
    metrics: Option<TcpListener>,
    metrics_addr: Option<SocketAddr>,
}

impl Listeners {
    async fn bind(cfg: &ServiceConfig) -> Result<Self> {
        let grpc = bind(cfg.grpc_listen, "gRPC").await?;
        let grpc_addr = grpc
            .local_addr()
            .map_err(|e| Error::io("gRPC listener has no address", e))?;
        let metrics = match cfg.metrics_listen {
            Some(addr) => Some(bind(addr, "metrics").await?),
            None => None,
        };
        let metrics_addr = metrics.as_ref().and_then(|l| l.local_addr().ok());
        Ok(Self {
            grpc,
            grpc_addr,
            metrics,
            metrics_addr,
        })
    }
}

type Guarded<S> = tonic::service::interceptor::InterceptedService<S, BearerAuth>;

/// The three APIs, each with the configured message size limit and behind the
/// bearer-token check.
struct Apis {
    jobs: Guarded<JobServiceServer<JobApi>>,
    schedules: Guarded<ScheduleServiceServer<ScheduleApi>>,
    backups: Guarded<BackupServiceServer<BackupApi>>,
}

impl Apis {
    fn new(
        cfg: &ServiceConfig,
        manager: &JobManager,
        schedules: &ScheduleManager,
        validator: Validator,
        metrics: &Metrics,
        stop: &CancellationToken,
    ) -> Self {
        let backups = BackupServiceServer::new(BackupApi::new(validator.clone(), metrics.clone()))
            .max_decoding_message_size(cfg.max_message_bytes)
            .max_encoding_message_size(cfg.max_message_bytes);
        let api = JobApi::new(manager.clone(), validator, stop.clone());
        let jobs = JobServiceServer::new(api)
            .max_decoding_message_size(cfg.max_message_bytes)
            .max_encoding_message_size(cfg.max_message_bytes);
        let schedules = ScheduleServiceServer::new(ScheduleApi::new(schedules.clone()))
            .max_decoding_message_size(cfg.max_message_bytes)
            .max_encoding_message_size(cfg.max_message_bytes);
        Self {
            jobs: guarded(jobs, cfg),
            schedules: guarded(schedules, cfg),
            backups: guarded(backups, cfg),
        }
    }
}

/// The reflection services (v1 and v1alpha) over the ferry and health protos.
fn reflection() -> Result<(
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
)> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let v1 = builder()
        .build_v1()
        .map_err(|e| Error::internal(format!("reflection: {e}")))?;
    let v1alpha = builder()
        .build_v1alpha()
        .map_err(|e| Error::internal(format!("reflection: {e}")))?;
    Ok((v1, v1alpha))
}

/// Serves gRPC on `listener` until `stop`.
fn serve_grpc(
    router: Router,
    listener: TcpListener,
    stop: &CancellationToken,
) -> JoinHandle<std::result::Result<(), tonic::transport::Error>> {
    // TCP_NODELAY on every accepted connection. `Server::tcp_nodelay` does not apply to a
    // listener we bind ourselves: without this, Nagle held back the tail of a connection's
    // first response until the client's delayed ACK, 40 ms later (the StartTransfer p99
    // of docs/SERVICE.md "Latest numbers").
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let signal = stop.clone();
    tokio::spawn(
        router.serve_with_incoming_shutdown(incoming, async move { signal.cancelled().await }),
    )
}

/// Starts the service with the given endpoint opener (tests inject faults with it).
pub async fn start_with(cfg: ServiceConfig, opener: Arc<dyn Opener>) -> Result<RunningService> {
    let roots = AllowRoots::new(&cfg.allow_roots)?;
    let secrets = SecretResolver::new(cfg.secrets_dir.clone());
    let listeners = Listeners::bind(&cfg).await?;
    let metrics = Metrics::new();
    let (manager, store, stored_schedules) =
        start_manager(&cfg, &metrics, opener, &secrets, &roots)?;
    let validator = Validator { roots, secrets };
    let schedules = ScheduleManager::start(
        cfg.schedules.clone(),
        store,
        stored_schedules,
        manager.clone(),
        validator.clone(),
        metrics.clone(),
    );
    let stop = CancellationToken::new();
    let apis = Apis::new(&cfg, &manager, &schedules, validator, &metrics, &stop);
    let (health, health_service) = serving_health().await;
    let (reflection, reflection_alpha) = reflection()?;
    let router = server_builder(&cfg)?
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(apis.jobs)
        .add_service(apis.schedules)
        .add_service(apis.backups);
    let grpc = serve_grpc(router, listeners.grpc, &stop);
    let metrics_task = listeners.metrics.map(|l| {
        let stop = stop.clone();
        tokio::spawn(metrics::serve(l, metrics, stop))
    });
    let (grpc_addr, metrics_addr) = (listeners.grpc_addr, listeners.metrics_addr);
    tracing::info!(%grpc_addr, metrics_addr = ?metrics_addr, tls = cfg.tls.is_some(),
                   auth = cfg.auth_token.is_some(), "ferry service listening");
    Ok(RunningService {
        grpc_addr,
        metrics_addr,
        manager,
        schedules,
        stop,
        grpc,
        metrics_task,
        health,
        shutdown_timeout: cfg.shutdown_timeout,
    })
}

impl RunningService {
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    pub fn manager(&self) -> &JobManager {
        &self.manager
    }

    pub fn schedules(&self) -> &ScheduleManager {
        &self.schedules
    }

    /// Stops the service (see the module docs for the order).
    pub async fn shutdown(self) {
        tracing::info!("shutting down: no new requests, checkpointing running jobs");
        self.health
            .set_service_status(
                proto::JOB_SERVICE_NAME,
                tonic_health::ServingStatus::NotServing,
            )
            .await;
        self.health
            .set_service_status(
                proto::SCHEDULE_SERVICE_NAME,
                tonic_health::ServingStatus::NotServing,
            )
            .await;
        self.health
            .set_service_status(
                proto::BACKUP_SERVICE_NAME,
                tonic_health::ServingStatus::NotServing,
            )
            .await;
        self.stop.cancel();
        self.schedules.shutdown(self.shutdown_timeout).await;
        self.manager.shutdown(self.shutdown_timeout).await;
        match tokio::time::timeout(Duration::from_secs(5), self.grpc).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "gRPC server ended with an error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "gRPC server task failed"),
            Err(_) => tracing::warn!("gRPC connections did not close in time"),
        }
        if let Some(t) = self.metrics_task {
            let _ = t.await;
        }
        tracing::info!("shutdown complete");
    }
}
