//! Runs one job: opens its endpoints, drives the engine while publishing progress and
//! persisting checkpoints, retries transient errors with backoff (resuming from the last
//! checkpoint), and records the outcome. On shutdown it persists the checkpoint and
//! leaves the job running in the store, so the next server resumes it.
//!
//! A job's source is read as the image its bytes hold (raw, qcow2, gz, xz or zst, as
//! the request's `format` says; see [`open_image`]).
//!
//! A job runs with the typed options its request was accepted with ([`JobSpec`]); a
//! transfer copies and verifies through the engine's one copy-then-verify path
//! ([`ferry_engine::copy_and_verify`]), the one `ferry copy --verify` takes. A transfer
//! with several targets runs as one fan-out ([`super::fan_out`]).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{EndpointSpec, Error, Result, Source, Target};
use ferry_endpoints::SourceOptions;
use ferry_engine::{Checkpoint, CopyOptions, Progress, Stage, Stages, VerifiedCopy, Verify};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::metered::{JobCounts, MeteredSource, MeteredTarget};
use super::opener::{open_bytes, open_image};
use super::{finish_record, Inner};
use crate::admission::{backoff, jitter_random};
use crate::convert::checkpoint::bounded;
use crate::convert::options::source_options;
use crate::convert::{ChecksumSpec, JobSpec, TransferSpec};
use crate::model::job::{
    now_ms, DigestRecord, ErrorRecord, JobKind, JobRecord, JobState, ResultRecord, TargetState,
};
use crate::store::Op;

pub(super) fn kind_label(kind: &str) -> &'static str {
    match kind {
        "file" => "file",
        "nbd" => "nbd",
        "nfs" => "nfs",
        "iscsi" => "iscsi",
        "s3" => "s3",
        "http" => "http",
        "https" => "https",
        _ => "other",
    }
}

/// Runs the job to a terminal state (or until shutdown).
pub(super) async fn run(inner: Arc<Inner>, id: String, resumed: bool) {
    let Some(cancel) = inner.cancel_token(&id) else {
        return;
    };
    let Some(record) = mark_running(&inner, &id, resumed) else {
        return;
    };
    persist(&inner, &record, "start").await;
    let Some(spec) = inner.spec(&id) else {
        let error = Error::internal(
            "the stored request of this job cannot be read (the server log at startup says why)",
        );
        finish(
            &inner,
            &id,
            JobState::Failed,
            None,
            Some(error_record(&error)),
        )
        .await;
        return;
    };
    let span = tracing::info_span!("job", job.id = %id, job.kind = record.kind.as_str(),
                                   source = %record.plan.source_kind,
                                   target = record.plan.target_kind.as_deref().unwrap_or(""));
    run_attempts(&inner, &id, record, &spec, &cancel)
        .instrument(span)
        .await;
}

/// Moves a queued job (or, on resumption, a running one) to running and counts the
/// attempt; None when the job is not runnable.
fn mark_running(inner: &Inner, id: &str, resumed: bool) -> Option<JobRecord> {
    inner.update(id, |r| {
        let runnable = r.state == JobState::Queued || (resumed && r.state == JobState::Running);
        if !runnable {
            return false;
        }
        if r.state == JobState::Queued {
            let wait = now_ms().saturating_sub(r.created_ms) as f64 / 1000.0;
            inner
                .metrics
                .queue_wait
                .with_label_values(&[r.kind.as_str()])
                .observe(wait);
        }
        r.state = JobState::Running;
        r.started_ms.get_or_insert_with(now_ms);
        r.attempt += 1;
        r.message = if resumed {
            "resuming after a server restart".into()
        } else {
            "running".into()
        };
        true
    })
}

/// Persists the record of a job that keeps running. A failed write is logged and the
/// job goes on rather than failing: the record in memory (what clients see) is current,
/// the stored one only lags until the job's next write (its outcome is always written),
/// and after a crash in between the job resumes as running from what is stored either way.
async fn persist(inner: &Inner, record: &JobRecord, what: &str) {
    if let Err(e) = inner.store.put_job(record).await {
        tracing::warn!(job = %record.id, error = %e, "cannot persist the job's {what}");
    }
}

async fn run_attempts(
    inner: &Arc<Inner>,
    id: &str,
    mut record: JobRecord,
    spec: &JobSpec,
    cancel: &CancellationToken,
) {
    loop {
        tracing::info!(attempt = record.attempt, "job attempt starting");
        let outcome = match spec {
            JobSpec::Transfer(t) if !t.more_targets.is_empty() => {
                super::fan_out::transfer(inner, id, t, cancel).await
            }
            JobSpec::Transfer(t) => transfer(inner, id, t, cancel).await.map(Ended::done),
            JobSpec::Checksum(c) => checksum(inner, id, c, cancel).await.map(Ended::done),
            JobSpec::Backup(b) => super::backup::backup(inner, id, b, cancel).await,
            JobSpec::Restore(r) => super::backup::restore(inner, id, r, cancel).await,
            JobSpec::RepositoryVerify(v) => super::backup::verify(inner, id, v, cancel).await,
            JobSpec::Prune(p) => super::backup::prune(inner, id, p, cancel).await,
            JobSpec::Gc(g) => super::backup::gc(inner, id, g, cancel).await,
            JobSpec::Sync(s) => super::sync::sync(inner, id, s, cancel).await,
        };
        let err = match outcome {
            Ok(Ended {
                result,
                failed: None,
            }) => {
                tracing::info!("job succeeded");
                finish(inner, id, JobState::Succeeded, Some(result), None).await;
                return;
            }
            Ok(Ended {
                result,
                failed: Some(e),
            }) => {
                // Final: the targets that hold the image are done, the failed ones are
                // out of the job (a retry would have nothing to write).
                tracing::warn!(error = %e, "job failed on some of its targets");
                finish(
                    inner,
                    id,
                    JobState::Failed,
                    Some(result),
                    Some(error_record(&e)),
                )
                .await;
                return;
            }
            Err(e) => e,
        };
        if stopped(inner, id, cancel).await {
            return;
        }
        if !err.kind().is_transient() || record.attempt >= inner.cfg.max_attempts {
            tracing::warn!(error = %err, "job failed");
            finish(inner, id, JobState::Failed, None, Some(error_record(&err))).await;
            return;
        }
        match retry(inner, id, &record, &err, cancel).await {
            Some(next) => record = next,
            None => return,
        }
    }
}

/// Ends the job when the server is stopping (it stays running in the store) or the job
/// was cancelled; true when it did.
async fn stopped(inner: &Arc<Inner>, id: &str, cancel: &CancellationToken) -> bool {
    if inner.shutdown.is_cancelled() {
        interrupted(inner, id).await;
        return true;
    }
    if cancel.is_cancelled() {
        tracing::info!("job cancelled");
        let error = super::cancelled_error();
        finish(inner, id, JobState::Cancelled, None, Some(error)).await;
        return true;
    }
    false
}

/// Waits out the backoff after a transient error and starts the next attempt; None when
/// the job stopped meanwhile.
async fn retry(
    inner: &Arc<Inner>,
    id: &str,
    record: &JobRecord,
    err: &Error,
    cancel: &CancellationToken,
) -> Option<JobRecord> {
    let delay = backoff(
        record.attempt,
        inner.cfg.retry_base,
        inner.cfg.retry_max,
        jitter_random(),
    );
    tracing::warn!(error = %err, ?delay, "transient error; retrying");
    inner
        .metrics
        .job_retries
        .with_label_values(&[record.kind.as_str()])
        .inc();
    let message = format!("retrying in {:.1}s after: {err}", delay.as_secs_f64());
    if let Some(r) = inner.update(id, |r| {
        r.message = message;
        r.error = Some(error_record(err));
        true
    }) {
        persist(inner, &r, "retry").await;
    }
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = cancel.cancelled() => {}
    }
    if stopped(inner, id, cancel).await {
        return None;
    }
    let next = inner.update(id, |r| {
        r.attempt += 1;
        r.error = None;
        r.message = format!("attempt {}", r.attempt);
        true
    })?;
    persist(inner, &next, "next attempt").await;
    Some(next)
}

/// How an attempt that ran to its end ended.
pub(super) struct Ended {
    pub result: ResultRecord,
    /// Set when some targets of a fan-out failed (the others hold the image): the job
    /// fails with this error, keeping the result.
    pub failed: Option<Error>,
}

impl Ended {
    pub(super) fn done(result: ResultRecord) -> Self {
        Self {
            result,
            failed: None,
        }
    }
}

pub(super) fn error_record(e: &Error) -> ErrorRecord {
    ErrorRecord {
        kind: e.kind().as_str().into(),
        message: e.to_string(),
    }
}

async fn finish(
    inner: &Arc<Inner>,
    id: &str,
    state: JobState,
    result: Option<ResultRecord>,
    error: Option<ErrorRecord>,
) {
    let Some(record) = inner.update(id, |r| {
        finish_record(r, state, error);
        if let Some(res) = result {
            r.result = Some(res);
        }
        target_digests(r);
        if state == JobState::Succeeded {
            r.progress.done = r.progress.total;
            r.progress.committed = r.progress.total;
            if r.kind == JobKind::Transfer {
                r.checkpoint = Some(complete(r.progress.total));
            }
        }
        true
    }) else {
        return;
    };
    inner.finished_metrics(&record);
    target_metrics(inner, &record);
    let mut ops = vec![Op::PutJob(Box::new(record))];
    if state == JobState::Succeeded {
        ops.push(Op::DeleteCheckpoint(id.to_string()));
    }
    if let Err(e) = inner.store.commit(ops).await {
        tracing::error!(job = %id, error = %e, "cannot persist the job's outcome");
    }
}

/// A single target that succeeded has the verified target digest of the result.
fn target_digests(r: &mut JobRecord) {
    let Some(ResultRecord::Transfer {
        target_digest: Some(d),
        ..
    }) = &r.result
    else {
        return;
    };
    if let [t] = r.targets.as_mut_slice() {
        if t.state == TargetState::Succeeded && t.digest.is_none() {
            t.digest = Some(d.clone());
        }
    }
}

/// Counts each target of a finished transfer by its endpoint kind and result.
fn target_metrics(inner: &Inner, r: &JobRecord) {
    let kinds = r
        .plan
        .target_kind
        .iter()
        .map(String::as_str)
        .chain(r.plan.more_targets.iter().map(|t| t.kind.as_str()));
    for (t, kind) in r.targets.iter().zip(kinds) {
        let result = match t.state {
            TargetState::Succeeded => "succeeded",
            _ => "failed",
        };
        inner
            .metrics
            .transfer_targets
            .with_label_values(&[kind_label(kind), result])
            .inc();
    }
}

/// The checkpoint of a finished copy: every byte committed.
fn complete(size: u64) -> Checkpoint {
    Checkpoint {
        size,
        committed: if size > 0 {
            vec![(0, size)]
        } else {
            Vec::new()
        },
    }
}

/// The server is stopping: keep the job running in the store with its last checkpoint.
async fn interrupted(inner: &Arc<Inner>, id: &str) {
    tracing::info!(job = %id, "job interrupted by shutdown; it resumes on restart");
    let Some(record) = inner.update(id, |r| {
        r.message = "interrupted by a server shutdown; resumes on restart".into();
        true
    }) else {
        return;
    };
    let mut ops = vec![Op::PutJob(Box::new(record))];
    if let Some(cp) = inner.checkpoint(id) {
        ops.push(Op::PutCheckpoint(id.to_string(), cp));
    }
    if let Err(e) = inner.store.commit(ops).await {
        tracing::error!(job = %id, error = %e, "cannot persist the interrupted job");
    }
}

/// What [`drive`] remembers between ticks.
struct Ticks {
    last_persist: Instant,
    last_cp: Option<Checkpoint>,
    last_done: (Instant, u64),
}

impl Ticks {
    fn new(inner: &Inner, id: &str) -> Self {
        Self {
            last_persist: Instant::now(),
            last_cp: inner.checkpoint(id),
            last_done: (Instant::now(), 0),
        }
    }

    /// Publishes progress and the engine's checkpoint, and persists the checkpoint every
    /// checkpoint interval (when it moved).
    fn tick(&mut self, inner: &Inner, id: &str, progress: &Progress, checkpoints: bool) {
        let snap = progress.snapshot();
        let now = Instant::now();
        let dt = now.duration_since(self.last_done.0).as_secs_f64();
        let rate = if dt > 0.0 && self.last_done.1 > 0 {
            snap.done.saturating_sub(self.last_done.1) as f64 / dt
        } else {
            0.0
        };
        self.last_done = (now, snap.done);
        let cp = checkpoints.then(|| progress.checkpoint());
        let persist = checkpoints
            && self.last_persist.elapsed() >= inner.cfg.checkpoint_interval
            && cp.as_ref() != self.last_cp.as_ref()
            && cp.as_ref().is_some_and(|c| !c.committed.is_empty());
        let record = inner.update(id, |r| {
            r.progress.total = snap.total;
            r.progress.done = snap.done;
            r.progress.data = snap.data_bytes;
            r.progress.zero = snap.zero_bytes;
            r.progress.bytes_per_second = rate;
            live_targets_done(r, snap.done);
            if let Some(cp) = &cp {
                r.progress.committed = cp.committed_bytes();
                // The engine publishes a checkpoint once the target is flushed: watchers
                // see it at once, the store at the next checkpoint interval.
                if !cp.committed.is_empty() {
                    r.checkpoint = Some(bounded(cp));
                }
            }
            true
        });
        if !persist {
            return;
        }
        let cp = cp.unwrap_or_default();
        inner.set_checkpoint(id, cp.clone());
        let mut ops = vec![Op::PutCheckpoint(id.to_string(), cp.clone())];
        if let Some(r) = record {
            ops.push(Op::PutJob(Box::new(r)));
        }
        // Queued now, committed in call order; not waited for, so a failed write is not
        // seen here: the checkpoint is kept in memory, persisted again at the next
        // interval, and written by the job's outcome, interruption or shutdown.
        drop(inner.store.submit(ops));
        self.last_cp = Some(cp);
        self.last_persist = Instant::now();
    }
}

/// Polls the engine future while publishing progress every progress interval and
/// persisting the engine's checkpoint every checkpoint interval (when it moved).
pub(super) async fn drive<T>(
    inner: &Arc<Inner>,
    id: &str,
    progress: &Progress,
    checkpoints: bool,
    work: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::pin!(work);
    let mut tick = tokio::time::interval(inner.cfg.progress_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks = Ticks::new(inner, id);
    let result = loop {
        tokio::select! {
            r = &mut work => break r,
            _ = tick.tick() => ticks.tick(inner, id, progress, checkpoints),
        }
    };
    if checkpoints {
        keep_last_checkpoint(inner, id, progress, ticks.last_cp.as_ref(), result.is_err()).await;
    }
    let snap = progress.snapshot();
    inner.update(id, |r| {
        r.progress.total = snap.total;
        r.progress.done = snap.done;
        r.progress.data = snap.data_bytes;
        r.progress.zero = snap.zero_bytes;
        live_targets_done(r, snap.done);
        true
    });
    result
}

/// The targets being written are as far as the copy.
fn live_targets_done(r: &mut JobRecord, done: u64) {
    for t in r
        .targets
        .iter_mut()
        .filter(|t| t.state == TargetState::Running)
    {
        t.done = done;
    }
}

/// Keeps the engine's last checkpoint for the next attempt; after a failure it is also
/// persisted at once, for a restart.
async fn keep_last_checkpoint(
    inner: &Inner,
    id: &str,
    progress: &Progress,
    last: Option<&Checkpoint>,
    failed: bool,
) {
    let cp = progress.checkpoint();
    if cp.committed.is_empty() || Some(&cp) == last {
        return;
    }
    inner.set_checkpoint(id, cp.clone());
    inner.update(id, |r| {
        r.progress.committed = cp.committed_bytes();
        r.checkpoint = Some(bounded(&cp));
        true
    });
    if failed {
        if let Err(e) = inner
            .store
            .commit(vec![Op::PutCheckpoint(id.to_string(), cp)])
            .await
        {
            // The next attempt in this process resumes from the checkpoint in memory;
            // only a restart would start from the last one stored.
            tracing::warn!(job = %id, error = %e, "cannot persist the checkpoint of a failed attempt");
        }
    }
}

/// A transfer's endpoints, open.
struct Opened {
    source: Arc<dyn Source>,
    target: Arc<dyn Target>,
    counts: Arc<JobCounts>,
    target_kind: &'static str,
}

/// Opens a transfer's source, then (when the caller's checkpoint, if any, is of an image
/// of that size) its target sized to it, both metered.
async fn open_transfer(inner: &Inner, id: &str, spec: &TransferSpec) -> Result<Opened> {
    let source = open_transfer_source(inner, id, spec).await?;
    let (tgt_spec, tgt_s3) = spec.target.open(&inner.secrets)?;
    let target_kind = kind_label(tgt_spec.kind());
    let counts = Arc::new(JobCounts::default());
    let target = inner
        .opener
        .open_target(&tgt_spec, source.size(), &spec.target_options(tgt_s3))
        .await?;
    let target = MeteredTarget::wrap(target, &inner.metrics, target_kind, counts.clone());
    Ok(Opened {
        source,
        target,
        counts,
        target_kind,
    })
}

/// Opens a job's source bytes pinned to the version its first attempt read: a later
/// attempt (a retry, a resumption after a restart) of a source that can tell its version
/// (an HTTP ETag, a registry image's digest) fails when the object changed instead of
/// mixing versions in the target. A registry image's bytes are its disk layer: how that
/// layer is compressed comes back with them.
async fn open_pinned_source(
    inner: &Inner,
    id: &str,
    spec: &EndpointSpec,
    options: &mut SourceOptions,
) -> Result<(Arc<dyn Source>, Option<ferry_formats::Detected>)> {
    let pinned = inner.source_version(id);
    if let Some(version) = &pinned {
        options.http.expect_version = Some(version.clone());
        options.registry.expect_digest = Some(version.clone());
    }
    let (bytes, layer) = open_bytes(&inner.opener, spec, options).await?;
    if pinned.is_none() {
        if let Some(version) = bytes.version() {
            if let Some(record) = inner.update(id, |r| {
                r.source_version = Some(version.clone());
                true
            }) {
                persist(inner, &record, "source version").await;
            }
        }
    }
    Ok((bytes, layer))
}

/// Opens a transfer's source, metered, and checks the caller's checkpoint (if any) is of
/// an image of its size, before any target is opened (a file target would be created).
pub(super) async fn open_transfer_source(
    inner: &Inner,
    id: &str,
    spec: &TransferSpec,
) -> Result<Arc<dyn Source>> {
    let (src_spec, src_settings) = spec.source.open(&inner.secrets)?;
    let mut options = source_options(spec.cache, src_settings);
    let (bytes, layer) = open_pinned_source(inner, id, &src_spec, &mut options).await?;
    let kind = kind_label(src_spec.kind());
    let source = open_image(
        (bytes, layer),
        &spec.image,
        &inner.opener,
        &options,
        &inner.cfg.allow_roots,
        &inner.metrics,
        kind,
    )
    .await?;
    // A source whose size shows only at its end starts over (the engine's stream copy):
    // no checkpoint can be of it.
    if let Some(c) = spec
        .resume_from
        .as_ref()
        .filter(|c| source.size_known() && c.size != source.size())
    {
        // A checkpoint of another image says nothing about the targets.
        return Err(Error::invalid_input(format!(
            "resume_from.size {} is not the source's size {}: the checkpoint is of \
             another image",
            c.size,
            source.size()
        )));
    }
    Ok(source)
}

/// The engine options of this attempt: the spec's, resuming from the job's checkpoint
/// when it has one for this source size. Returns them with the bytes resumed.
pub(super) fn attempt_options(
    inner: &Inner,
    id: &str,
    spec: &TransferSpec,
    size: u64,
) -> (CopyOptions, u64) {
    let resume = inner
        .checkpoint(id)
        .filter(|c| c.size == size && !c.committed.is_empty());
    let resumed_bytes = resume.as_ref().map_or(0, Checkpoint::committed_bytes);
    let mut copy = spec.copy.clone();
    copy.checkpoint_interval = inner.cfg.checkpoint_interval;
    if resume.is_some() {
        // Uncommitted ranges may hold partial writes of the earlier run.
        copy.target_is_zero = false;
    }
    copy.resume = resume;
    // 0 until the end for a source whose size shows only there.
    let total = if size == ferry_core::UNKNOWN_SIZE {
        0
    } else {
        size
    };
    inner.update(id, |r| {
        r.progress.total = total;
        r.progress.resumed = resumed_bytes;
        if resumed_bytes > 0 {
            r.message = format!(
                "resumed from checkpoint: {resumed_bytes} of {size} bytes already committed"
            );
        }
        true
    });
    if resumed_bytes > 0 {
        tracing::info!(resumed_bytes, size, "resuming copy from checkpoint");
    }
    (copy, resumed_bytes)
}

async fn transfer(
    inner: &Arc<Inner>,
    id: &str,
    spec: &TransferSpec,
    cancel: &CancellationToken,
) -> Result<ResultRecord> {
    let mut opened = open_transfer(inner, id, spec).await?;
    let (copy, resumed_bytes) = attempt_options(inner, id, spec, opened.source.size());
    let relay = super::relay::start(inner, id, spec, opened.source.size()).await?;
    if let Some((_, r)) = &relay {
        opened.target = r.wrap(opened.target.clone());
    }
    // Verification reads the target through a new handle, opened after the copy
    // flushed the target and released it.
    let target_kind = opened.target_kind;
    let verify = spec.verify.clone().map(|checksum| Verify {
        checksum,
        read_back: || async move {
            let (tgt_spec, tgt_s3) = spec.target.open(&inner.secrets)?;
            let options = source_options(spec.cache, tgt_s3);
            let target = inner.opener.open_source(&tgt_spec, &options).await?;
            Ok(MeteredSource::wrap(target, &inner.metrics, target_kind))
        },
    });
    let entered = |stage: Stage| {
        if stage == Stage::Verify {
            inner.update(id, |r| {
                r.message = "verifying".into();
                true
            });
        }
    };
    let stages = Stages {
        copy: super::relay::progress(relay.as_ref()),
        verify: Progress::new(),
        entered: &entered,
    };
    let work =
        ferry_engine::copy_and_verify(opened.source, opened.target, &copy, verify, &stages, cancel);
    let done = drive(inner, id, &stages.copy, true, async {
        work.await.map_err(Error::from)
    })
    .await;
    super::relay::end(relay).await;
    let done = done?;
    let counts = &opened.counts;
    let moved = counts.written.load(Ordering::Relaxed) + counts.zeroed.load(Ordering::Relaxed);
    inner
        .metrics
        .bytes_skipped
        .with_label_values(&[target_kind])
        .inc_by(done.copy.size.saturating_sub(moved));
    Ok(transfer_result(&done, resumed_bytes))
}

pub(super) fn transfer_result(done: &VerifiedCopy, resumed_bytes: u64) -> ResultRecord {
    let digest = |d: &ferry_engine::Digest| DigestRecord {
        algorithm: d.algorithm.as_str().into(),
        hex: d.hex(),
    };
    let v = done.verification.as_ref();
    ResultRecord::Transfer {
        size: done.copy.size,
        data_bytes: done.copy.data_bytes,
        zero_bytes: done.copy.zero_bytes,
        seconds: done.copy.elapsed.as_secs_f64(),
        source_digest: v.map(|v| digest(&v.source)),
        target_digest: v.map(|v| digest(&v.target)),
        resumed_bytes,
    }
}

async fn checksum(
    inner: &Arc<Inner>,
    id: &str,
    spec: &ChecksumSpec,
    cancel: &CancellationToken,
) -> Result<ResultRecord> {
    let (source_spec, settings) = spec.source.open(&inner.secrets)?;
    let mut options = source_options(spec.cache, settings);
    let (bytes, layer) = open_pinned_source(inner, id, &source_spec, &mut options).await?;
    let kind = kind_label(source_spec.kind());
    let source = open_image(
        (bytes, layer),
        &spec.image,
        &inner.opener,
        &options,
        &inner.cfg.allow_roots,
        &inner.metrics,
        kind,
    )
    .await?;
    let known = source.size_known().then(|| source.size());
    let progress = Progress::new();
    let started = Instant::now();
    let digest = drive(
        inner,
        id,
        &progress,
        false,
        ferry_engine::checksum(source, &spec.checksum, &progress, cancel),
    )
    .await?;
    Ok(ResultRecord::Checksum {
        digest: DigestRecord {
            algorithm: digest.algorithm.as_str().into(),
            hex: digest.hex(),
        },
        // A stream of unknown size: the length the checksum found.
        size: known.unwrap_or_else(|| progress.snapshot().total),
        seconds: started
            .elapsed()
            .as_secs_f64()
            .max(Duration::from_micros(1).as_secs_f64()),
    })
}
