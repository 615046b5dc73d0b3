//! Schedules: jobs started on a cron schedule (nightly copies, periodic checksums).
//!
//! The [`ScheduleManager`] keeps the schedules (memory for reads, the store for
//! durability) and runs one scheduler task that sleeps until the earliest next fire time
//! (or a change of the schedules wakes it), then starts each due run through the same path
//! as StartTransfer: the template is validated like a request and submitted to the job
//! manager, so limits, queueing and metrics apply alike.
//!
//! Crash safety: a fire is recorded in the store before its job is submitted, and the job's
//! idempotency key is derived from the schedule id and the fire time. After a crash, the
//! next start submits every recorded fire again under its key: the job manager returns the
//! job when it had been created, so a fire never runs twice, and a fire whose job had not
//! been created yet still runs.
//!
//! Every change of a schedule record happens under one async lock (read, change, commit,
//! publish), so fires, API calls and the watchers of finished runs never lose each other's
//! changes.

pub mod api;
pub mod convert;
pub mod template;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ferry_core::Error;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::template::Template;
use super::convert::validation::check_meta;
use super::convert::Validator;
use super::jobs::JobManager;
use super::metrics::Metrics;
use super::status::ServiceError;
use super::store::{Op, Store};
use crate::model::job::{now_ms, JobRecord};
use crate::model::schedule::{MissedPolicy, PendingFire, RunRecord, RunResult, ScheduleRecord};
use ferry_cron::CronSpec;

/// Longest sleep of the scheduler task: after a change of the wall clock (an NTP step, a
/// resumed virtual machine) the next fire time is looked at again within this.
const MAX_SLEEP: Duration = Duration::from_secs(60);
/// Missed fire times counted per schedule and restart.
const MAX_MISSED_COUNT: u64 = 10_000;
/// Longest schedule name.
pub const MAX_NAME_BYTES: usize = 63;

/// How schedules behave.
#[derive(Debug, Clone)]
pub struct ScheduleConfig {
    /// Most schedules the server holds.
    pub max_schedules: usize,
    /// Test hook: cron expressions may have a leading seconds field. Never offered through
    /// the API; `ferry serve` sets it only with a hidden flag, so tests fire every few
    /// seconds instead of every minute.
    pub seconds_field: bool,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        Self {
            max_schedules: 1000,
            seconds_field: false,
        }
    }
}

/// What a caller asks a new schedule to be.
#[derive(Debug, Clone)]
pub struct NewSchedule {
    pub name: String,
    pub cron: String,
    pub time_zone: String,
    pub paused: bool,
    pub missed: MissedPolicy,
    pub template: Template,
    pub labels: BTreeMap<String, String>,
}

/// The fields an update replaces (None: unchanged).
#[derive(Debug, Clone, Default)]
pub struct ScheduleChange {
    pub cron: Option<String>,
    pub time_zone: Option<String>,
    pub paused: Option<bool>,
    pub missed: Option<MissedPolicy>,
    pub template: Option<Template>,
}

struct Entry {
    record: ScheduleRecord,
    /// None when the stored expression no longer parses (the schedule never fires).
    cron: Option<CronSpec>,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<String, Entry>,
    by_name: HashMap<String, String>,
}

struct Inner {
    cfg: ScheduleConfig,
    store: Store,
    jobs: JobManager,
    validator: Validator,
    metrics: Metrics,
    table: Mutex<Table>,
    /// Held while a schedule record is read, changed, committed and published.
    write: tokio::sync::Mutex<()>,
    wake: Notify,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

/// The schedule manager; cheap to clone.
#[derive(Clone)]
pub struct ScheduleManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ScheduleManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScheduleManager")
            .field("cfg", &self.inner.cfg)
            .finish()
    }
}

fn to_time(ms: u64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms.min(i64::MAX as u64) as i64).unwrap_or_default()
}

fn to_ms(t: DateTime<Utc>) -> u64 {
    t.timestamp_millis().max(0) as u64
}

fn check_name(name: &str) -> Result<(), Error> {
    if name.is_empty()
        || name.len() > MAX_NAME_BYTES
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(Error::invalid_input(format!(
            "name '{name}' must have 1 to {MAX_NAME_BYTES} ASCII letters, digits, '-', '_' or '.'"
        )));
    }
    Ok(())
}

impl ScheduleManager {
    /// Takes over the stored schedules and starts the scheduler task. Fires recorded
    /// before a crash are submitted again first, then missed fire times are handled by
    /// each schedule's policy.
    pub fn start(
        cfg: ScheduleConfig,
        store: Store,
        schedules: Vec<ScheduleRecord>,
        jobs: JobManager,
        validator: Validator,
        metrics: Metrics,
    ) -> Self {
        let mut table = Table::default();
        for record in schedules {
            let cron = match CronSpec::parse(&record.cron, &record.time_zone, cfg.seconds_field) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::error!(schedule = %record.name, error = %e,
                                    "the stored schedule cannot be read; it does not fire");
                    None
                }
            };
            metrics.schedule_state(None, Some(record.paused));
            table.by_name.insert(record.name.clone(), record.id.clone());
            table
                .by_id
                .insert(record.id.clone(), Entry { record, cron });
        }
        let inner = Arc::new(Inner {
            cfg,
            store,
            jobs,
            validator,
            metrics,
            table: Mutex::new(table),
            write: tokio::sync::Mutex::new(()),
            wake: Notify::new(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        let scheduler = inner.clone();
        inner.tasks.spawn(async move { scheduler.run().await });
        Self { inner }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Creates a schedule.
    pub async fn create(&self, new: NewSchedule) -> Result<ScheduleRecord, ServiceError> {
        let inner = &self.inner;
        check_name(&new.name)?;
        check_meta("", &new.labels)?;
        let cron = CronSpec::parse(&new.cron, &new.time_zone, inner.cfg.seconds_field)?;
        new.template
            .accept(&inner.validator, "schedule/check", &new.name, "check")?;
        let _w = inner.write.lock().await;
        if inner.shutdown.is_cancelled() {
            return Err(ServiceError::ShuttingDown);
        }
        {
            let table = inner.table.lock();
            if table.by_name.contains_key(&new.name) {
                return Err(ServiceError::ScheduleNameTaken { name: new.name });
            }
            if table.by_id.len() >= inner.cfg.max_schedules {
                return Err(ServiceError::TooManySchedules {
                    limit: inner.cfg.max_schedules,
                });
            }
        }
        let now = now_ms();
        let record = ScheduleRecord {
            id: uuid::Uuid::now_v7().to_string(),
            name: new.name,
            cron: new.cron.trim().to_string(),
            time_zone: new.time_zone,
            paused: new.paused,
            missed: new.missed,
            template: new.template.to_record(),
            labels: new.labels,
            created_ms: now,
            updated_ms: now,
            next_run_ms: if new.paused {
                None
            } else {
                cron.next_after(to_time(now)).map(to_ms)
            },
            pending: None,
            last_run: None,
            last_success_ms: None,
            runs_started: 0,
            runs_skipped: 0,
            runs_missed: 0,
            consecutive_failures: 0,
        };
        inner.store.put_schedule(&record).await?;
        inner.publish(record.clone(), Some(cron));
        inner.wake.notify_one();
        tracing::info!(schedule = %record.name, id = %record.id, cron = %record.cron,
                       time_zone = %record.time_zone, "schedule created");
        Ok(record)
    }

    /// A schedule by id or name.
    pub fn get(&self, id: &str) -> Result<ScheduleRecord, ServiceError> {
        self.inner.record(id)
    }

    /// Schedules by name after `page_token` (a name), with all of `labels`.
    pub fn list(
        &self,
        labels: &BTreeMap<String, String>,
        page_size: usize,
        page_token: &str,
    ) -> (Vec<ScheduleRecord>, String) {
        let table = self.inner.table.lock();
        let mut all: Vec<&ScheduleRecord> = table
            .by_id
            .values()
            .map(|e| &e.record)
            .filter(|r| page_token.is_empty() || r.name.as_str() > page_token)
            .filter(|r| {
                labels
                    .iter()
                    .all(|(k, v)| r.labels.get(k).is_some_and(|have| have == v))
            })
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        let page_size = page_size.max(1);
        let next = if all.len() > page_size {
            all[page_size - 1].name.clone()
        } else {
            String::new()
        };
        (all.into_iter().take(page_size).cloned().collect(), next)
    }

    /// Changes a schedule; the next fire time is computed again from now when the
    /// expression, the time zone or the paused flag changes.
    pub async fn update(
        &self,
        id: &str,
        change: ScheduleChange,
    ) -> Result<ScheduleRecord, ServiceError> {
        let inner = &self.inner;
        let _w = inner.write.lock().await;
        let mut record = inner.record(id)?;
        let timing = change.cron.is_some() || change.time_zone.is_some() || change.paused.is_some();
        if let Some(c) = change.cron {
            record.cron = c.trim().to_string();
        }
        if let Some(z) = change.time_zone {
            record.time_zone = z;
        }
        let cron = CronSpec::parse(&record.cron, &record.time_zone, inner.cfg.seconds_field)?;
        if let Some(t) = &change.template {
            t.accept(&inner.validator, "schedule/check", &record.name, &record.id)?;
            record.template = t.to_record();
        }
        if let Some(m) = change.missed {
            record.missed = m;
        }
        if let Some(p) = change.paused {
            record.paused = p;
        }
        let now = now_ms();
        if timing {
            record.next_run_ms = if record.paused {
                None
            } else {
                cron.next_after(to_time(now)).map(to_ms)
            };
        }
        record.updated_ms = now;
        inner.store.put_schedule(&record).await?;
        inner.publish(record.clone(), Some(cron));
        inner.wake.notify_one();
        tracing::info!(schedule = %record.name, "schedule updated");
        Ok(record)
    }

    /// Pauses or resumes a schedule (no change when it already is so).
    pub async fn set_paused(&self, id: &str, paused: bool) -> Result<ScheduleRecord, ServiceError> {
        let current = self.get(id)?;
        if current.paused == paused {
            return Ok(current);
        }
        self.update(
            id,
            ScheduleChange {
                paused: Some(paused),
                ..Default::default()
            },
        )
        .await
    }

    /// Deletes a schedule; a run it started goes on as an ordinary job.
    pub async fn delete(&self, id: &str) -> Result<ScheduleRecord, ServiceError> {
        let inner = &self.inner;
        let _w = inner.write.lock().await;
        let record = inner.record(id)?;
        inner
            .store
            .commit(vec![Op::DeleteSchedule(record.id.clone())])
            .await?;
        {
            let mut table = inner.table.lock();
            table.by_id.remove(&record.id);
            table.by_name.remove(&record.name);
        }
        inner.metrics.schedule_state(Some(record.paused), None);
        inner.wake.notify_one();
        tracing::info!(schedule = %record.name, "schedule deleted");
        Ok(record)
    }

    /// Starts a run now (paused or not), unless the previous run is still going.
    pub async fn run_now(&self, id: &str) -> Result<(ScheduleRecord, JobRecord), ServiceError> {
        let inner = &self.inner;
        let _w = inner.write.lock().await;
        if inner.shutdown.is_cancelled() {
            return Err(ServiceError::ShuttingDown);
        }
        let record = inner.record(id)?;
        let next = record.next_run_ms;
        let job = inner
            .fire(&record.id, now_ms(), true, next, 0)
            .await?
            .ok_or_else(|| ServiceError::Core(Error::internal("the run was not started")))?;
        Ok((inner.record(&record.id)?, job))
    }

    /// Stops the scheduler task and the watchers of running runs (the runs themselves
    /// are jobs: the job manager's shutdown handles them). Call before the job manager's.
    pub async fn shutdown(&self, timeout: Duration) {
        let inner = &self.inner;
        inner.shutdown.cancel();
        inner.tasks.close();
        if tokio::time::timeout(timeout, inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("the scheduler did not stop within {timeout:?}");
        }
    }
}

impl Inner {
    /// A schedule by id, else by name.
    fn record(&self, id: &str) -> Result<ScheduleRecord, ServiceError> {
        let table = self.table.lock();
        table
            .by_id
            .get(id)
            .or_else(|| table.by_name.get(id).and_then(|i| table.by_id.get(i)))
            .map(|e| e.record.clone())
            .ok_or_else(|| ServiceError::UnknownSchedule { id: id.to_string() })
    }

    fn cron(&self, id: &str) -> Option<CronSpec> {
        self.table.lock().by_id.get(id)?.cron.clone()
    }

    /// Makes `record` the schedule's current state in memory (with `cron` when it was
    /// parsed again).
    fn publish(&self, record: ScheduleRecord, cron: Option<CronSpec>) {
        let mut table = self.table.lock();
        let before = table.by_id.get(&record.id).map(|e| e.record.paused);
        self.metrics.schedule_state(before, Some(record.paused));
        if let Some(old) = table.by_id.get(&record.id) {
            let old_name = old.record.name.clone();
            table.by_name.remove(&old_name);
        }
        table.by_name.insert(record.name.clone(), record.id.clone());
        let cron = match cron {
            Some(c) => Some(c),
            None => table.by_id.get(&record.id).and_then(|e| e.cron.clone()),
        };
        table
            .by_id
            .insert(record.id.clone(), Entry { record, cron });
    }

    /// Publishes the record and commits it; the commit's outcome is returned.
    async fn save(&self, record: ScheduleRecord) -> Result<(), ServiceError> {
        let committed = self.store.put_schedule(&record).await;
        if let Err(e) = &committed {
            tracing::warn!(schedule = %record.name, error = %e, "cannot persist the schedule");
        }
        self.publish(record, None);
        committed.map_err(ServiceError::from)
    }

    /// The scheduler task: takes over what a crash or a restart left, then sleeps until
    /// the earliest next fire time or a change.
    async fn run(self: Arc<Self>) {
        self.recover().await;
        loop {
            let now = now_ms();
            let due: Vec<String> = {
                let table = self.table.lock();
                table
                    .by_id
                    .values()
                    .filter(|e| !e.record.paused && e.record.next_run_ms.is_some_and(|n| n <= now))
                    .map(|e| e.record.id.clone())
                    .collect()
            };
            for id in due {
                if self.shutdown.is_cancelled() {
                    return;
                }
                let _w = self.write.lock().await;
                self.fire_due(&id, now_ms(), false).await;
            }
            let earliest = {
                let table = self.table.lock();
                table
                    .by_id
                    .values()
                    .filter(|e| !e.record.paused)
                    .filter_map(|e| e.record.next_run_ms)
                    .min()
            };
            let wait = earliest.map_or(MAX_SLEEP, |n| {
                Duration::from_millis(n.saturating_sub(now_ms())).min(MAX_SLEEP)
            });
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// After a start: submits fires recorded before a crash, watches runs still going,
    /// and applies the missed-run policy to fire times that passed while the server was
    /// down.
    async fn recover(self: &Arc<Self>) {
        let _w = self.write.lock().await;
        let ids: Vec<String> = self.table.lock().by_id.keys().cloned().collect();
        for id in ids {
            let Ok(record) = self.record(&id) else {
                continue;
            };
            if let Some(pending) = record.pending {
                tracing::info!(schedule = %record.name, fire_ms = pending.fire_ms,
                               "submitting a fire recorded before the restart");
                let _ = self.start_run(record, pending).await;
            } else if let Some(job) = record.active_job() {
                self.watch_run(&id, job);
            }
            let Ok(record) = self.record(&id) else {
                continue;
            };
            if record.paused {
                continue;
            }
            match record.next_run_ms {
                Some(_) => self.fire_due(&id, now_ms(), true).await,
                None => {
                    // An expression that had no next fire time may have one now (a
                    // schedule stored by another server version, for instance).
                    if let Some(cron) = self.cron(&id) {
                        let mut record = record;
                        record.next_run_ms = cron.next_after(to_time(now_ms())).map(to_ms);
                        if record.next_run_ms.is_some() {
                            let _ = self.save(record).await;
                        }
                    }
                }
            }
        }
    }

    /// Handles the due fire times of a schedule (the caller holds the write lock). At
    /// run time the latest due fire starts a run (earlier ones, after a jump of the
    /// clock, are missed); at start all due fire times were missed while the server was
    /// down, and the schedule's policy says whether the latest one still runs.
    async fn fire_due(self: &Arc<Self>, id: &str, now: u64, at_start: bool) {
        let Ok(mut record) = self.record(id) else {
            return;
        };
        let Some(next) = record.next_run_ms.filter(|n| *n <= now && !record.paused) else {
            return;
        };
        let Some(cron) = self.cron(id) else {
            record.next_run_ms = None;
            let _ = self.save(record).await;
            return;
        };
        let (count, latest) = cron.due(to_time(next), to_time(now), MAX_MISSED_COUNT);
        let latest = latest.map_or(next, to_ms);
        let following = cron.next_after(to_time(latest.max(now))).map(to_ms);
        let run = !(at_start && record.missed == MissedPolicy::Skip);
        let missed = if run { count.saturating_sub(1) } else { count };
        if missed > 0 {
            tracing::info!(schedule = %record.name, missed, run_once = run,
                           "fire times passed while the server was down");
            self.metrics.schedule_run("missed", missed);
        }
        if run {
            let _ = self.fire(id, latest, false, following, missed).await;
        } else {
            record.runs_missed = record.runs_missed.saturating_add(missed);
            record.next_run_ms = following;
            let _ = self.save(record).await;
        }
    }

    /// Whether the schedule's latest run is still going (its job id); records the end of a
    /// run that ended without its watcher having said so yet.
    fn still_running(&self, record: &mut ScheduleRecord) -> Option<String> {
        let job_id = record.active_job()?.to_string();
        match self.jobs.get(&job_id) {
            Ok(job) if !job.state.is_terminal() => Some(job_id),
            Ok(job) => {
                let result = RunResult::of(job.state);
                let message = job.error.map(|e| e.message).unwrap_or_default();
                if record.run_ended(
                    &job_id,
                    result,
                    job.ended_ms.unwrap_or_else(now_ms),
                    &message,
                ) {
                    self.metrics.schedule_run(result.as_str(), 1);
                }
                None
            }
            Err(_) => {
                if record.run_ended(
                    &job_id,
                    RunResult::Failed,
                    now_ms(),
                    "the run's job is no longer known (pruned from the job history)",
                ) {
                    self.metrics.schedule_run("failed", 1);
                }
                None
            }
        }
    }

    /// Fires a schedule at `fire_ms` (the caller holds the write lock): skipped when the
    /// previous run is still going (an error for a manual run), else recorded, then
    /// started. `following` becomes the next fire time of a scheduled fire.
    async fn fire(
        self: &Arc<Self>,
        id: &str,
        fire_ms: u64,
        manual: bool,
        following: Option<u64>,
        missed: u64,
    ) -> Result<Option<JobRecord>, ServiceError> {
        let mut record = self.record(id)?;
        record.runs_missed = record.runs_missed.saturating_add(missed);
        if !manual {
            record.next_run_ms = following;
        }
        if let Some(job_id) = self.still_running(&mut record) {
            if manual {
                return Err(ServiceError::ScheduleBusy {
                    name: record.name,
                    job_id,
                });
            }
            tracing::info!(schedule = %record.name, job = %job_id,
                           "skipping a fire: the previous run has not finished");
            record.runs_skipped = record.runs_skipped.saturating_add(1);
            self.metrics.schedule_run("skipped", 1);
            let _ = self.save(record).await;
            return Ok(None);
        }
        let pending = PendingFire { fire_ms, manual };
        record.pending = Some(pending);
        if let Err(e) = self.save(record.clone()).await {
            // Without the fire on disk a crash could run it twice: do not start it.
            record.pending = None;
            self.not_started(&mut record, pending, &e);
            self.publish(record, None);
            return Err(e);
        }
        self.start_run(record, pending).await.map(Some)
    }

    /// Records a run that could not be started.
    fn not_started(&self, record: &mut ScheduleRecord, pending: PendingFire, e: &ServiceError) {
        let message = e.to_status().message().to_string();
        tracing::warn!(schedule = %record.name, error = %message, "a schedule run could not start");
        record.last_run = Some(RunRecord {
            job_id: String::new(),
            fire_ms: pending.fire_ms,
            started_ms: now_ms(),
            result: RunResult::Failed,
            message,
            manual: pending.manual,
        });
        record.consecutive_failures = record.consecutive_failures.saturating_add(1);
        self.metrics.schedule_run("failed", 1);
    }

    /// Submits the job of a recorded fire under the fire's idempotency key and records
    /// the run. A shutdown leaves the fire recorded for the next start.
    async fn start_run(
        self: &Arc<Self>,
        mut record: ScheduleRecord,
        pending: PendingFire,
    ) -> Result<JobRecord, ServiceError> {
        let key = pending.key(&record.id);
        let submitted = match Template::from_record(&record.template) {
            Ok(t) => match t.accept(&self.validator, &key, &record.name, &record.id) {
                Ok(accepted) => self.jobs.submit(accepted).await,
                Err(e) => Err(e.into()),
            },
            Err(e) => Err(e.into()),
        };
        let submitted = match submitted {
            // The fire's job exists, created from the template as it was before a change.
            Err(ServiceError::KeyConflict { job_id, .. }) => self.jobs.get(&job_id),
            other => other,
        };
        match submitted {
            Ok(job) => {
                record.pending = None;
                record.runs_started = record.runs_started.saturating_add(1);
                record.last_run = Some(RunRecord {
                    job_id: job.id.clone(),
                    fire_ms: pending.fire_ms,
                    started_ms: now_ms(),
                    result: RunResult::Running,
                    message: String::new(),
                    manual: pending.manual,
                });
                self.metrics.schedule_run("started", 1);
                let result = RunResult::of(job.state);
                if result != RunResult::Running {
                    let message = job
                        .error
                        .as_ref()
                        .map(|e| e.message.clone())
                        .unwrap_or_default();
                    if record.run_ended(
                        &job.id,
                        result,
                        job.ended_ms.unwrap_or_else(now_ms),
                        &message,
                    ) {
                        self.metrics.schedule_run(result.as_str(), 1);
                    }
                }
                tracing::info!(schedule = %record.name, job = %job.id, fire_ms = pending.fire_ms,
                               manual = pending.manual, "schedule run started");
                let id = record.id.clone();
                let _ = self.save(record).await;
                if result == RunResult::Running {
                    self.watch_run(&id, &job.id);
                }
                Ok(job)
            }
            Err(ServiceError::ShuttingDown) => Err(ServiceError::ShuttingDown),
            Err(e) => {
                record.pending = None;
                self.not_started(&mut record, pending, &e);
                let _ = self.save(record).await;
                Err(e)
            }
        }
    }

    /// Waits for the run's job to end and records how it ended.
    fn watch_run(self: &Arc<Self>, schedule_id: &str, job_id: &str) {
        let inner = self.clone();
        let schedule_id = schedule_id.to_string();
        let job_id = job_id.to_string();
        let rx = self.jobs.watch(&job_id);
        self.tasks.spawn(async move {
            let ended = match rx {
                Ok(mut rx) => {
                    let ended = tokio::select! {
                        _ = inner.shutdown.cancelled() => return,
                        r = rx.wait_for(|j| j.state.is_terminal()) => r.map(|j| JobRecord::clone(&j)),
                    };
                    match ended {
                        Ok(job) => Some(job),
                        Err(_) => return,
                    }
                }
                Err(_) => None,
            };
            let _w = inner.write.lock().await;
            let Ok(mut record) = inner.record(&schedule_id) else {
                return;
            };
            let (result, ended_ms, message) = match &ended {
                Some(job) => (
                    RunResult::of(job.state),
                    job.ended_ms.unwrap_or_else(now_ms),
                    job.error.as_ref().map(|e| e.message.clone()).unwrap_or_default(),
                ),
                None => (
                    RunResult::Failed,
                    now_ms(),
                    "the run's job is no longer known (pruned from the job history)".to_string(),
                ),
            };
            if record.run_ended(&job_id, result, ended_ms, &message) {
                inner.metrics.schedule_run(result.as_str(), 1);
                tracing::info!(schedule = %record.name, job = %job_id, result = result.as_str(),
                               "schedule run ended");
                let _ = inner.save(record).await;
                inner.wake.notify_one();
            }
        });
    }
}
