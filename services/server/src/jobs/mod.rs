//! The job manager: accepts jobs, keeps their records (memory for reads, the store for
//! durability), hands queued jobs to runners as the scheduler allows, streams state to
//! watchers, cancels, recovers after a restart, prunes history and shuts down gracefully.
//!
//! Locking: one mutex over the table, held only for bookkeeping (never across an await).
//! Every state change goes through [`Inner::update`], which also publishes the record to
//! the job's watch channel and moves the jobs-by-state gauge.

mod backup;
mod fan_out;
pub mod metered;
pub mod opener;
mod relay;
mod runner;
mod sync;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{Error, ErrorKind};
use ferry_engine::Checkpoint;
use parking_lot::Mutex;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::opener::Opener;
use super::admission::{Claim, Limits, Scheduler};
use super::convert::checkpoint::bounded;
use super::convert::{Accepted, JobSpec};
use super::metrics::Metrics;
use super::secrets::SecretResolver;
use super::security::AllowRoots;
use super::status::ServiceError;
use super::store::{Loaded, Op, Store};
use crate::model::job::{
    now_ms, ErrorRecord, JobKind, JobRecord, JobState, TargetRecord, TargetState,
};

/// How the manager runs jobs.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    pub limits: Limits,
    /// Most jobs waiting in the queue; StartTransfer beyond it is RESOURCE_EXHAUSTED.
    pub max_queued: usize,
    /// Attempts of a job with transient errors (1 = no retry).
    pub max_attempts: u32,
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// How often a running copy flushes its target and the checkpoint is persisted.
    pub checkpoint_interval: Duration,
    /// How often watchers see progress.
    pub progress_interval: Duration,
    /// Finished jobs older than this are pruned.
    pub history_max_age: Duration,
    /// At most this many finished jobs are kept (the oldest go first).
    pub history_max_count: usize,
    /// Where a qcow2 source's backing files may be (the server's `--allow-root`s).
    pub allow_roots: AllowRoots,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            limits: Limits {
                max_running: 4,
                max_per_host: 2,
            },
            max_queued: 10_000,
            max_attempts: 5,
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            checkpoint_interval: Duration::from_secs(5),
            progress_interval: Duration::from_millis(500),
            history_max_age: Duration::from_secs(7 * 24 * 3600),
            history_max_count: 10_000,
            allow_roots: AllowRoots::default(),
        }
    }
}

struct Entry {
    record: JobRecord,
    /// What the job runs with; None for a finished job taken over from the store (or a
    /// stored request that no longer decodes, which fails the job when it would run).
    spec: Option<Arc<JobSpec>>,
    tx: watch::Sender<JobRecord>,
    cancel: CancellationToken,
    checkpoint: Option<Checkpoint>,
    /// The relay of the running attempt, once started.
    relay: Option<ferry_endpoints::relay::RelayRelease>,
    /// An EndRelay asked that no more relay clients be waited for (this attempt's and
    /// the next's).
    relay_released: bool,
}

#[derive(Default)]
struct Table {
    jobs: HashMap<String, Entry>,
    order: BTreeMap<u64, String>,
    keys: HashMap<String, String>,
    next_seq: u64,
}

pub(crate) struct Inner {
    cfg: ManagerConfig,
    store: Store,
    metrics: Metrics,
    opener: Arc<dyn Opener>,
    secrets: SecretResolver,
    table: Mutex<Table>,
    sched: Mutex<Scheduler>,
    wake: Notify,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobManager")
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// A page of jobs.
#[derive(Debug, Clone)]
pub struct Page {
    pub jobs: Vec<JobRecord>,
    pub next_token: String,
}

/// Filters of a job listing.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub states: Vec<JobState>,
    pub labels: BTreeMap<String, String>,
    pub kind: Option<JobKind>,
}

impl ListFilter {
    fn matches(&self, r: &JobRecord) -> bool {
        (self.states.is_empty() || self.states.contains(&r.state))
            && self.kind.is_none_or(|k| k == r.kind)
            && self
                .labels
                .iter()
                .all(|(k, v)| r.labels.get(k).is_some_and(|have| have == v))
    }
}

/// The job manager; cheap to clone.
#[derive(Debug, Clone)]
pub struct JobManager {
    inner: Arc<Inner>,
}

impl JobManager {
    /// Takes over what the store held: queued jobs queue again, running jobs resume from
    /// their checkpoints, finished jobs stay queryable. Spawns the dispatcher and pruner.
    pub fn start(
        cfg: ManagerConfig,
        store: Store,
        loaded: Loaded,
        metrics: Metrics,
        opener: Arc<dyn Opener>,
        secrets: SecretResolver,
    ) -> Self {
        let inner = Arc::new(Inner {
            sched: Mutex::new(Scheduler::new(cfg.limits)),
            cfg,
            store,
            metrics,
            opener,
            secrets,
            table: Mutex::new(Table::default()),
            wake: Notify::new(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        let resumed = inner.take_over(loaded);
        for id in resumed {
            tracing::info!(job = %id, "resuming job that was running before the restart");
            inner.spawn_runner(id, true);
        }
        let dispatcher = inner.clone();
        inner
            .tasks
            .spawn(async move { dispatcher.dispatch().await });
        let pruner = inner.clone();
        inner.tasks.spawn(async move {
            loop {
                pruner.prune().await;
                tokio::select! {
                    _ = pruner.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                }
            }
        });
        inner.wake.notify_one();
        Self { inner }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Whether a job was submitted under this idempotency key (and is still known).
    pub fn has_key(&self, key: &str) -> bool {
        !key.is_empty() && self.inner.table.lock().keys.contains_key(key)
    }

    /// Accepts a validated request: a new queued job, or the job an earlier identical
    /// request under the same idempotency key created.
    pub async fn submit(&self, acc: Accepted) -> Result<JobRecord, ServiceError> {
        let inner = &self.inner;
        if inner.shutdown.is_cancelled() {
            return Err(ServiceError::ShuttingDown);
        }
        let (record, resume_from) = {
            let mut table = inner.table.lock();
            if let Some(existing) = inner.admission_check(&table, &acc)? {
                return Ok(existing);
            }
            let seq = table.next_seq;
            table.next_seq += 1;
            let spec = acc.spec.clone();
            let (record, resume_from) = queued_record(acc, seq);
            inner.metrics.job_state(None, Some(JobState::Queued));
            inner.insert_locked(&mut table, record.clone(), Some(spec), resume_from.clone());
            (record, resume_from)
        };
        // A caller's checkpoint is stored with the job: it is where the job starts, the
        // first time and after a restart of this server alike.
        let mut ops = vec![Op::PutJob(Box::new(record.clone()))];
        if let Some(cp) = resume_from {
            ops.push(Op::PutCheckpoint(record.id.clone(), cp));
        }
        if let Err(e) = inner.store.commit(ops).await {
            inner.forget(&record.id);
            return Err(e.into());
        }
        let still_queued = {
            let table = inner.table.lock();
            table
                .jobs
                .get(&record.id)
                .is_some_and(|e| e.record.state == JobState::Queued)
        };
        if still_queued {
            inner
                .sched
                .lock()
                .enqueue(&record.id, record.priority, record.seq, claim(&record));
            inner.wake.notify_one();
        }
        tracing::info!(job = %record.id, kind = record.kind.as_str(), "job accepted");
        Ok(record)
    }

    pub fn get(&self, id: &str) -> Result<JobRecord, ServiceError> {
        self.inner
            .table
            .lock()
            .jobs
            .get(id)
            .map(|e| e.record.clone())
            .ok_or_else(|| ServiceError::UnknownJob { id: id.to_string() })
    }

    /// Jobs in acceptance order after `page_token`.
    pub fn list(
        &self,
        filter: &ListFilter,
        page_size: usize,
        page_token: &str,
    ) -> Result<Page, ServiceError> {
        let after = if page_token.is_empty() {
            None
        } else {
            Some(
                page_token
                    .strip_prefix('s')
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| {
                        ServiceError::Core(Error::invalid_input(
                            "page_token is not a token this server returned",
                        ))
                    })?,
            )
        };
        let table = self.inner.table.lock();
        let range = match after {
            Some(seq) => table.order.range(seq + 1..),
            None => table.order.range(..),
        };
        let mut jobs = Vec::new();
        let mut next_token = String::new();
        for (seq, id) in range {
            let record = &table.jobs[id].record;
            if !filter.matches(record) {
                continue;
            }
            if jobs.len() == page_size {
                next_token = format!("s{}", jobs.last().map_or(*seq, |r: &JobRecord| r.seq));
                break;
            }
            jobs.push(record.clone());
        }
        Ok(Page { jobs, next_token })
    }

    /// A channel with the job's record, updated on every change.
    pub fn watch(&self, id: &str) -> Result<watch::Receiver<JobRecord>, ServiceError> {
        self.inner
            .table
            .lock()
            .jobs
            .get(id)
            .map(|e| e.tx.subscribe())
            .ok_or_else(|| ServiceError::UnknownJob { id: id.to_string() })
    }

    /// Tells a job's relay that no client is still to come: once its copy finished it
    /// ends as soon as its connected clients have gone, without its idle time. A job
    /// that relays nothing is FAILED_PRECONDITION; an ended job is returned as it is.
    pub fn end_relay(&self, id: &str) -> Result<JobRecord, ServiceError> {
        let mut table = self.inner.table.lock();
        let e = table
            .jobs
            .get_mut(id)
            .ok_or_else(|| ServiceError::UnknownJob { id: id.to_string() })?;
        if e.record.state.is_terminal() {
            return Ok(e.record.clone());
        }
        let relays = matches!(e.spec.as_deref(), Some(JobSpec::Transfer(t)) if t.relay.is_some());
        if !relays {
            return Err(ServiceError::NotRelaying { id: id.to_string() });
        }
        e.relay_released = true;
        if let Some(relay) = &e.relay {
            relay.release();
        }
        Ok(e.record.clone())
    }

    /// Cancels a job; waits a little for a running job to stop so the caller usually sees
    /// the terminal state.
    pub async fn cancel(&self, id: &str) -> Result<JobRecord, ServiceError> {
        let inner = &self.inner;
        let state = self.get(id)?.state;
        match state {
            JobState::Queued => {
                let removed = inner.sched.lock().remove_queued(id);
                let done = inner.update(id, |r| {
                    if r.state == JobState::Queued {
                        finish_record(r, JobState::Cancelled, Some(cancelled_error()));
                        true
                    } else {
                        false
                    }
                });
                match done {
                    Some(record) if removed || record.state == JobState::Cancelled => {
                        inner.finished_metrics(&record);
                        inner.store.put_job(&record).await?;
                        return Ok(record);
                    }
                    _ => {}
                }
            }
            JobState::Running => {}
            _ => return self.get(id),
        }
        let mut rx = self.watch(id)?;
        if let Some(e) = inner.table.lock().jobs.get(id) {
            e.cancel.cancel();
        }
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            rx.wait_for(|r| r.state.is_terminal()),
        )
        .await;
        self.get(id)
    }

    /// Stops accepting, interrupts running jobs (they persist their checkpoints and stay
    /// running in the store, so a restart resumes them), waits up to `timeout`, closes
    /// the store.
    pub async fn shutdown(&self, timeout: Duration) {
        let inner = &self.inner;
        inner.shutdown.cancel();
        inner.tasks.close();
        if tokio::time::timeout(timeout, inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "jobs did not stop within {timeout:?}; persisting their last checkpoints"
            );
            let ops: Vec<Op> = {
                let table = inner.table.lock();
                table
                    .jobs
                    .values()
                    .filter_map(|e| {
                        Some(Op::PutCheckpoint(
                            e.record.id.clone(),
                            e.checkpoint.clone()?,
                        ))
                    })
                    .collect()
            };
            if let Err(e) = inner.store.commit(ops).await {
                // The jobs stay running in the store; a restart resumes them from their
                // last persisted checkpoints instead, redoing more of the copy.
                tracing::error!(error = %e, "cannot persist the checkpoints of unfinished jobs");
            }
        }
        inner.store.close();
    }

    /// Number of jobs the manager knows (all states).
    pub fn len(&self) -> usize {
        self.inner.table.lock().jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Prunes finished jobs now (also done every minute).
    pub async fn prune(&self) {
        self.inner.prune().await
    }
}

/// The record of a job just accepted, and the checkpoint it starts from (a caller's).
fn queued_record(acc: Accepted, seq: u64) -> (JobRecord, Option<Checkpoint>) {
    let (resume_from, targets) = match acc.spec.as_ref() {
        JobSpec::Transfer(t) => (
            t.resume_from.clone(),
            t.targets().map(|t| TargetRecord::new(t.name())).collect(),
        ),
        _ => (None, Vec::new()),
    };
    let record = JobRecord {
        id: uuid::Uuid::now_v7().to_string(),
        seq,
        kind: acc.kind,
        state: JobState::Queued,
        idempotency_key: acc.idempotency_key,
        fingerprint: acc.fingerprint,
        labels: acc.labels,
        priority: acc.priority,
        created_ms: now_ms(),
        started_ms: None,
        ended_ms: None,
        request: acc.request,
        plan: acc.plan,
        attempt: 0,
        progress: Default::default(),
        result: None,
        error: None,
        message: "queued".into(),
        checkpoint: resume_from.as_ref().map(bounded),
        targets,
        source_version: None,
    };
    (record, resume_from)
}

fn table_writes(table: &Table, target: &str) -> bool {
    table
        .jobs
        .values()
        .any(|e| !e.record.state.is_terminal() && e.record.plan.writes(target))
}

fn claim(r: &JobRecord) -> Claim {
    Claim {
        hosts: r.plan.hosts.clone(),
        targets: r.plan.target_keys(),
    }
}

fn cancelled_error() -> ErrorRecord {
    ErrorRecord {
        kind: ErrorKind::Cancelled.as_str().into(),
        message: "cancelled by a CancelJob request".into(),
    }
}

fn finish_record(r: &mut JobRecord, state: JobState, error: Option<ErrorRecord>) {
    r.state = state;
    r.ended_ms = Some(now_ms());
    r.progress.bytes_per_second = 0.0;
    r.message = state.as_str().into();
    // The targets still being written end with the job: they hold the image when it
    // succeeded, and share its error otherwise (they stay resumable: a checkpoint of a
    // cancelled or failed job still holds for them).
    for t in r
        .targets
        .iter_mut()
        .filter(|t| t.state == TargetState::Running)
    {
        if state == JobState::Succeeded {
            t.state = TargetState::Succeeded;
            t.done = r.progress.total;
        } else {
            t.state = TargetState::Failed;
            t.error = error.clone();
        }
    }
    r.error = error;
}

impl Inner {
    /// Records the relay an attempt of job `id` started (released at once when an
    /// EndRelay came first).
    pub(crate) fn relay_started(&self, id: &str, relay: ferry_endpoints::relay::RelayRelease) {
        if let Some(e) = self.table.lock().jobs.get_mut(id) {
            if e.relay_released {
                relay.release();
            }
            e.relay = Some(relay);
        }
    }

    /// Takes over the jobs of the store: queued ones queue again, running ones are
    /// returned to be resumed; unfinished ones get their typed options from their stored
    /// request.
    fn take_over(&self, loaded: Loaded) -> Vec<String> {
        let mut resumed = Vec::new();
        let mut table = self.table.lock();
        let mut sched = self.sched.lock();
        let mut checkpoints = loaded.checkpoints;
        for record in loaded.jobs {
            table.next_seq = table.next_seq.max(record.seq + 1);
            self.metrics.job_state(None, Some(record.state));
            match record.state {
                JobState::Queued => {
                    sched.enqueue(&record.id, record.priority, record.seq, claim(&record))
                }
                JobState::Running => {
                    sched.resume_running(&record.id, claim(&record));
                    resumed.push(record.id.clone());
                }
                _ => {}
            }
            let spec = if record.state.is_terminal() {
                None
            } else {
                match JobSpec::from_record(&record) {
                    Ok(spec) => Some(Arc::new(spec)),
                    Err(e) => {
                        tracing::error!(job = %record.id, error = %e,
                                        "the stored job cannot be read; it fails when it runs");
                        None
                    }
                }
            };
            let checkpoint = checkpoints.remove(&record.id);
            self.insert_locked(&mut table, record, spec, checkpoint);
        }
        resumed
    }

    /// Whether `acc` may be queued now: the job an identical earlier request under the
    /// same idempotency key created (`Some`), or an error for a key reused by another
    /// request, a target another job writes (when the request refuses that), a full queue.
    fn admission_check(
        &self,
        table: &Table,
        acc: &Accepted,
    ) -> Result<Option<JobRecord>, ServiceError> {
        if !acc.idempotency_key.is_empty() {
            if let Some(id) = table.keys.get(&acc.idempotency_key) {
                let existing = &table.jobs[id].record;
                if existing.fingerprint == acc.fingerprint && existing.kind == acc.kind {
                    return Ok(Some(existing.clone()));
                }
                return Err(ServiceError::KeyConflict {
                    key: acc.idempotency_key.clone(),
                    job_id: id.clone(),
                });
            }
        }
        let sched = self.sched.lock();
        if acc.refuse_if_target_busy {
            for t in acc.plan.target_keys() {
                if sched.target_in_use(&t) || table_writes(table, &t) {
                    return Err(ServiceError::TargetBusy { target: t });
                }
            }
        }
        if sched.queued_len() >= self.cfg.max_queued {
            return Err(ServiceError::QueueFull {
                limit: self.cfg.max_queued,
            });
        }
        Ok(None)
    }

    fn insert_locked(
        &self,
        table: &mut Table,
        record: JobRecord,
        spec: Option<Arc<JobSpec>>,
        checkpoint: Option<Checkpoint>,
    ) {
        let (tx, _) = watch::channel(record.clone());
        if !record.idempotency_key.is_empty() {
            table
                .keys
                .insert(record.idempotency_key.clone(), record.id.clone());
        }
        table.order.insert(record.seq, record.id.clone());
        table.jobs.insert(
            record.id.clone(),
            Entry {
                record,
                spec,
                tx,
                cancel: self.shutdown.child_token(),
                checkpoint,
                relay: None,
                relay_released: false,
            },
        );
    }

    fn forget(&self, id: &str) {
        let mut table = self.table.lock();
        if let Some(e) = table.jobs.remove(id) {
            table.order.remove(&e.record.seq);
            if table
                .keys
                .get(&e.record.idempotency_key)
                .is_some_and(|k| k == id)
            {
                table.keys.remove(&e.record.idempotency_key);
            }
            self.metrics.job_state(Some(e.record.state), None);
        }
    }

    /// Applies `f` to the record; when it returns true the change is published. Returns
    /// the record after the change (None: unknown job or no change).
    fn update(&self, id: &str, f: impl FnOnce(&mut JobRecord) -> bool) -> Option<JobRecord> {
        let mut table = self.table.lock();
        let entry = table.jobs.get_mut(id)?;
        let before = entry.record.state;
        if !f(&mut entry.record) {
            return None;
        }
        if before != entry.record.state {
            self.metrics
                .job_state(Some(before), Some(entry.record.state));
        }
        entry.tx.send_replace(entry.record.clone());
        Some(entry.record.clone())
    }

    fn set_checkpoint(&self, id: &str, cp: Checkpoint) {
        if let Some(e) = self.table.lock().jobs.get_mut(id) {
            e.checkpoint = Some(cp);
        }
    }

    /// The typed options of a job (None: unknown job, or a stored one that does not decode).
    fn spec(&self, id: &str) -> Option<Arc<JobSpec>> {
        self.table.lock().jobs.get(id)?.spec.clone()
    }

    fn checkpoint(&self, id: &str) -> Option<Checkpoint> {
        self.table.lock().jobs.get(id)?.checkpoint.clone()
    }

    /// The source version a job's first attempt pinned (see `runner::open_pinned_source`).
    fn source_version(&self, id: &str) -> Option<String> {
        self.table
            .lock()
            .jobs
            .get(id)?
            .record
            .source_version
            .clone()
    }

    fn cancel_token(&self, id: &str) -> Option<CancellationToken> {
        Some(self.table.lock().jobs.get(id)?.cancel.clone())
    }

    fn finished_metrics(&self, r: &JobRecord) {
        let kind = r.kind.as_str();
        let result = r.state.as_str();
        self.metrics
            .jobs_finished
            .with_label_values(&[kind, result])
            .inc();
        if let (Some(start), Some(end)) = (r.started_ms, r.ended_ms) {
            self.metrics
                .job_duration
                .with_label_values(&[kind, result])
                .observe(end.saturating_sub(start) as f64 / 1000.0);
        }
    }

    async fn dispatch(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = self.wake.notified() => {}
            }
            let batch = self.sched.lock().next_batch();
            for id in batch {
                self.spawn_runner(id, false);
            }
        }
    }

    fn spawn_runner(self: &Arc<Self>, id: String, resumed: bool) {
        let inner = self.clone();
        self.tasks.spawn(async move {
            runner::run(inner.clone(), id.clone(), resumed).await;
            inner.sched.lock().release(&id);
            inner.wake.notify_one();
        });
    }

    async fn prune(&self) {
        let max_age_ms = self.cfg.history_max_age.as_millis() as u64;
        let now = now_ms();
        let doomed: Vec<String> = {
            let table = self.table.lock();
            let finished: Vec<&JobRecord> = table
                .order
                .values()
                .map(|id| &table.jobs[id].record)
                .filter(|r| r.state.is_terminal())
                .collect();
            let excess = finished.len().saturating_sub(self.cfg.history_max_count);
            finished
                .iter()
                .enumerate()
                .filter(|(i, r)| {
                    *i < excess || now.saturating_sub(r.ended_ms.unwrap_or(now)) > max_age_ms
                })
                .map(|(_, r)| r.id.clone())
                .collect()
        };
        if doomed.is_empty() {
            return;
        }
        tracing::info!(
            count = doomed.len(),
            "pruning finished jobs from the history"
        );
        for id in &doomed {
            self.forget(id);
        }
        if let Err(e) = self
            .store
            .commit(doomed.into_iter().map(Op::DeleteJob).collect())
            .await
        {
            tracing::warn!(error = %e, "cannot prune job history");
        }
    }
}

#[cfg(test)]
mod tests;
