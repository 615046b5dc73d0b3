//! The BackupSchedule controller: on each fire of a schedule's cron expression it creates
//! a `Backup` owned by the schedule (after a VolumeSnapshot and a temporary claim made
//! from it, for `copyMethod: Snapshot`), never while the previous one runs, and records
//! how the latest one ended. Pruning rides on the Backups (`retain` is copied into them;
//! the Backup's mover prunes after a successful backup), so a schedule itself never runs
//! a mover.
//!
//! The schedule also deletes the Backups it no longer keeps: those whose snapshots its
//! prunes removed, and failed ones beyond its history limit ([`history`]).
//!
//! Time comes from a [`Clock`], so tests drive fires without waiting.
//!
//! The Kubernetes calls: backupschedules list/watch, backupschedules/status patch,
//! backuprepositories get, backups list/watch/create/delete, volumesnapshots
//! create/delete, claims get/create/delete, events create/patch.

pub mod build;
pub mod consistent;
pub mod group;
pub mod history;
pub mod reconcile;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::Recorder;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};

use crate::controller::Error;
use crate::crd::{Backup, BackupSchedule};
use crate::events;

pub use reconcile::reconcile;

/// The condition a schedule reports: True while one of its backups runs.
pub const SYNCHRONIZING: &str = "Synchronizing";

/// Where the schedule controller reads the time.
pub trait Clock: Send + Sync + Debug {
    /// Now.
    fn now(&self) -> DateTime<Utc>;
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// Shared by every reconcile of a schedule.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The time.
    pub clock: Arc<dyn Clock>,
    recorder: Recorder,
}

impl Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context over this client and clock.
    pub fn new(client: Client, clock: Arc<dyn Clock>) -> Self {
        Self {
            recorder: events::recorder(client.clone()),
            client,
            clock,
        }
    }

    /// Publishes an event on the resource (never fatal; `note` holds no secret).
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        warning: bool,
        reason: &str,
        note: &str,
    ) {
        events::publish(&self.recorder, obj, warning, reason, note).await;
    }
}

/// What the controller does after a failed reconcile: log it and look again soon.
pub fn error_policy(obj: Arc<BackupSchedule>, error: &Error, _ctx: Arc<Context>) -> Action {
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    tracing::warn!(%name, %error, "backup schedule reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

/// Runs the schedule controller until a termination signal, woken by its schedules and
/// their Backups; `namespace` limits it to one namespace.
pub async fn run(client: Client, namespace: Option<String>) {
    let (schedules, backups): (Api<BackupSchedule>, Api<Backup>) = match &namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let ctx = Arc::new(Context::new(client, Arc::new(SystemClock)));
    Controller::new(schedules, watcher::Config::default())
        .owns(
            backups,
            watcher::Config::default().labels(build::SCHEDULE_LABEL),
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            if let Err(e) = result {
                tracing::warn!(error = %e, "backup schedules");
            }
            std::future::ready(())
        })
        .await;
}
