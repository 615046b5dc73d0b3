//! The reconcilers of Transfers, Checksums, Backups and BackupRepositories, and [`run`],
//! which builds their controllers (and the BackupSchedule controller,
//! [`crate::schedule`]).
//!
//! Each resource gets a mover pod ([`crate::mover`]); the reconciler
//! ([`reconcile::reconcile`]) drives it through a small state machine, talking to the
//! mover through the [`link::MoverLink`] trait (implemented over the movers' gRPC job
//! service by [`grpc_link::GrpcMoverLink`]).
//! Mover pods are read from a watched store, so a running resource costs no API request
//! per reconcile; a task per running mover ([`follow`]) turns the job stream into status
//! writes. The reconcilers count into [`crate::metrics`]; leader election
//! ([`crate::leader`]) and the volume populator are the caller's.

pub mod attachments;
pub mod backup;
pub mod checksum;
pub mod claims;
pub mod context;
pub mod error;
pub mod finalizer;
pub mod follow;
pub mod grpc_link;
pub mod kind;
pub mod life;
pub mod limits;
pub mod link;
pub mod mover_ca;
pub mod names;
pub mod plan;
pub mod pods;
pub mod progress;
pub mod reconcile;
pub mod repository;
pub mod restore;
pub mod secrets;
pub mod settings;
pub mod snapshot_metadata;
pub mod transfer;
pub mod users;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryFuture};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};

use crate::crd::{Backup, BackupRepository, Checksum, Restore, Transfer};
use crate::metrics::OperatorMetrics;
use crate::mover::pod::labels;
use crate::mover::tls::MoverCa;

pub use context::Context;
pub use error::Error;
pub use grpc_link::{GrpcMoverLink, LinkTimeouts};
pub use kind::MoverKind;
pub use link::{
    BackupSummary, JobFailure, JobReport, JobRequest, JobState, LinkError, MoverAddress, MoverLink,
    PruneSummary, ReportStream, SyncSummary, TargetReport,
};
pub use reconcile::reconcile;
pub use settings::OperatorSettings;

/// The label selector of every mover pod.
pub fn mover_selector() -> String {
    format!(
        "{}=mover,{}=ferry-operator",
        labels::COMPONENT,
        labels::MANAGED_BY
    )
}

/// What the controller does after a failed reconcile: log it and look again later (the
/// failure is usually the API server or a mover being unreachable for a moment).
pub fn error_policy<K: MoverKind>(obj: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    let name = kube::Resource::meta(obj.as_ref())
        .name
        .clone()
        .unwrap_or_default();
    tracing::warn!(kind = K::KIND, %name, %error, "reconcile failed");
    ctx.metrics.failed(K::KIND);
    Action::requeue(ctx.settings.pending_backoff.max(Duration::from_secs(1)))
}

fn log_result<T, E: std::fmt::Display>(result: Result<T, E>) -> std::future::Ready<()> {
    if let Err(e) = result {
        tracing::warn!(error = %e, "controller");
    }
    std::future::ready(())
}

/// The API of `K` in the watched namespace, or in all namespaces.
fn api<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The store of mover pods went away before it was filled.
#[derive(Debug, thiserror::Error)]
#[error("the watch of mover pods stopped before it listed them")]
pub struct RunError;

/// Runs the Transfer, Checksum, Backup, BackupRepository and BackupSchedule controllers
/// until a termination signal: one watch of
/// mover pods fills the shared store; each controller watches its kind and the pods it
/// owns. The reconcilers count into `metrics`, whose gauges are sampled from the stores.
pub async fn run(
    client: Client,
    settings: OperatorSettings,
    link: Arc<dyn MoverLink>,
    mover_ca: Option<Arc<MoverCa>>,
    metrics: Arc<OperatorMetrics>,
) -> Result<(), RunError> {
    let ns = settings.watch_namespace.clone();
    let (store, pod_task) = watch_movers(&client, &ns);
    store.wait_until_ready().await.map_err(|_| RunError)?;
    let (namespaces, namespace_task) = watch_namespaces(&client);
    let (class_defaults, class_tasks) =
        crate::class_defaults::ClassDefaults::watch_ready(&client).await;
    let mut ctx = Context::new(client.clone(), settings, link, store.clone())
        .with_namespaces(namespaces)
        .with_class_defaults(class_defaults)
        .with_metrics(metrics.clone());
    if let Some(ca) = mover_ca {
        ctx = ctx.with_mover_ca(ca);
    }
    let ctx = Arc::new(ctx);
    let transfers = mover_controller::<Transfer>(&client, &ns, &ctx).owns(
        api::<Transfer>(&client, &ns),
        watcher::Config::default().labels(crate::fanout::children::PARENT_UID),
    );
    ctx.set_transfers(transfers.store());
    let checksums = mover_controller::<Checksum>(&client, &ns, &ctx);
    let backups = mover_controller::<Backup>(&client, &ns, &ctx);
    let restores = mover_controller::<Restore>(&client, &ns, &ctx);
    let repositories = Controller::new(
        api::<BackupRepository>(&client, &ns),
        watcher::Config::default(),
    )
    .shutdown_on_signal();
    let stores = (
        transfers.store(),
        checksums.store(),
        backups.store(),
        restores.store(),
    );
    metrics.set_sampler(Box::new(move |m| {
        m.sample_resources(&stores.0);
        m.sample_resources(&stores.1);
        m.sample_resources(&stores.2);
        m.sample_resources(&stores.3);
        m.sample_movers(&store);
    }));
    let transfers = drive(transfers, crate::clone::reconcile::reconcile_transfer, &ctx);
    let checksums = drive(checksums, reconcile::<Checksum>, &ctx);
    let backups = drive(backups, backup::reconcile_backup, &ctx);
    let restores = drive(restores, restore::reconcile_restore, &ctx);
    let golden_images = crate::golden::reconcile::run(client.clone(), ctx.clone(), ns.clone());
    let repositories = repositories
        .run(
            repository::reconcile_repository,
            repository_error_policy,
            ctx,
        )
        .for_each(log_result);
    let schedules = crate::schedule::run(client.clone(), ns.clone());
    futures::join!(
        transfers,
        checksums,
        backups,
        restores,
        repositories,
        schedules,
        golden_images
    );
    pod_task.abort();
    namespace_task.abort();
    class_tasks.iter().for_each(|t| t.abort());
    Ok(())
}

/// Starts a watch of the namespaces' metadata (whether a namespace assigns user IDs);
/// returns the store it fills and its task. Not waited for: until it has listed, movers
/// get the default IDs, and a namespace that refuses them makes the resource wait
/// (Refused) and try again.
fn watch_namespaces(
    client: &Client,
) -> (
    reflector::Store<PartialObjectMeta<Namespace>>,
    tokio::task::JoinHandle<()>,
) {
    let (store, writer) = reflector::store();
    let watch = reflector(
        writer,
        watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .for_each(|_| std::future::ready(()));
    (store, tokio::spawn(watch))
}

/// Starts the one watch of mover pods; returns the store it fills and its task.
fn watch_movers(
    client: &Client,
    ns: &Option<String>,
) -> (reflector::Store<Pod>, tokio::task::JoinHandle<()>) {
    let (store, writer) = reflector::store::<Pod>();
    let pod_watch = reflector(
        writer,
        watcher(
            api(client, ns),
            watcher::Config::default().labels(&mover_selector()),
        ),
    )
    .default_backoff()
    .for_each(|_| std::future::ready(()));
    (store, tokio::spawn(pod_watch))
}

/// The controller of `K`, watching `K` and the mover pods it owns, and every mover pod:
/// when one goes, the queued resources of `K` are looked at at once (a slot freed).
fn mover_controller<K: MoverKind>(
    client: &Client,
    ns: &Option<String>,
    ctx: &Arc<Context>,
) -> Controller<K> {
    let owned = watcher::Config::default().labels(&format!(
        "{},{}={}",
        mover_selector(),
        labels::OWNER_KIND,
        K::KIND
    ));
    let movers = watcher::Config::default().labels(&mover_selector());
    let wake = Arc::clone(ctx);
    Controller::new(api::<K>(client, ns), watcher::Config::default())
        .owns(api::<Pod>(client, ns), owned)
        .watches(api::<Pod>(client, ns), movers, move |pod| {
            wake.to_wake(K::KIND, &pod)
                .into_iter()
                .map(|(namespace, name)| ObjectRef::new(&name).within(&namespace))
                .collect::<Vec<_>>()
        })
        .reconcile_on(
            ctx.relinked(K::KIND)
                .map(|(namespace, name)| ObjectRef::new(&name).within(&namespace)),
        )
        .with_config(controller::Config::default().concurrency(RECONCILES_AT_ONCE))
        .shutdown_on_signal()
}

/// Reconciles of one kind at once: bounded, so that a thousand resources applied together
/// are taken a few at a time (kube-rs runs them all at once by default).
const RECONCILES_AT_ONCE: u16 = 8;

/// Runs the controller of a mover kind with its reconciler and [`error_policy`], logging
/// what the controller itself reports.
fn drive<K, F>(
    controller: Controller<K>,
    reconciler: impl FnMut(Arc<K>, Arc<Context>) -> F,
    ctx: &Arc<Context>,
) -> impl Future<Output = ()>
where
    K: MoverKind,
    F: TryFuture<Ok = Action, Error = Error> + Send + 'static,
{
    controller
        .run(reconciler, error_policy::<K>, ctx.clone())
        .for_each(log_result)
}

/// What the BackupRepository controller does after a failed reconcile: log it and look
/// again in ten seconds.
fn repository_error_policy(
    obj: Arc<BackupRepository>,
    error: &Error,
    _ctx: Arc<Context>,
) -> Action {
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    tracing::warn!(kind = "BackupRepository", %name, %error, "reconcile failed");
    Action::requeue(Duration::from_secs(10))
}
