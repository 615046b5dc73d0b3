//! Runs one job: opens its endpoints, drives the engine while publishing progress and
//! persisting checkpoints, retries transient errors with backoff (resuming from the last
//! checkpoint), and records the outcome. On shutdown it persists the checkpoint and
//! leaves the job running in the store, so the next server resumes it.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{Error, ErrorKind, Result};
use ferry_engine::{Checkpoint, Progress};
use prost::Message;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::metered::{JobCounts, MeteredSource, MeteredTarget};
use super::model::{now_ms, DigestRecord, ErrorRecord, JobKind, JobRecord, JobState, ResultRecord};
use super::{finish_record, Inner};
use crate::service::convert;
use crate::service::proto;
use crate::service::scheduler::{backoff, jitter_random};
use crate::service::store::Op;

fn kind_label(kind: &str) -> &'static str {
    match kind {
        "file" => "file",
        "nbd" => "nbd",
        "nfs" => "nfs",
        "iscsi" => "iscsi",
        "s3" => "s3",
        _ => "other",
    }
}

/// Runs the job to a terminal state (or until shutdown).
pub(super) async fn run(inner: Arc<Inner>, id: String, resumed: bool) {
    let Some(cancel) = inner.cancel_token(&id) else {
        return;
    };
    let started = inner.update(&id, |r| {
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
    });
    let Some(record) = started else {
        return;
    };
    if let Err(e) = inner.store.put_job(&record).await {
        tracing::error!(job = %id, error = %e, "cannot persist job start");
    }
    let span = tracing::info_span!("job", job.id = %id, job.kind = record.kind.as_str(),
                                   source = %record.plan.source_kind,
                                   target = record.plan.target_kind.as_deref().unwrap_or(""));
    run_attempts(&inner, &id, record, &cancel)
        .instrument(span)
        .await;
}

async fn run_attempts(
    inner: &Arc<Inner>,
    id: &str,
    mut record: JobRecord,
    cancel: &CancellationToken,
) {
    loop {
        tracing::info!(attempt = record.attempt, "job attempt starting");
        let outcome = match record.kind {
            JobKind::Transfer => transfer(inner, &record, cancel).await,
            JobKind::Checksum => checksum(inner, &record, cancel).await,
        };
        let err = match outcome {
            Ok(result) => {
                tracing::info!("job succeeded");
                finish(inner, id, JobState::Succeeded, Some(result), None).await;
                return;
            }
            Err(e) => e,
        };
        if inner.shutdown.is_cancelled() {
            interrupted(inner, id).await;
            return;
        }
        if cancel.is_cancelled() {
            tracing::info!("job cancelled");
            finish(
                inner,
                id,
                JobState::Cancelled,
                None,
                Some(super::cancelled_error()),
            )
            .await;
            return;
        }
        let kind = err.kind();
        if kind.is_transient() && record.attempt < inner.cfg.max_attempts {
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
                r.error = Some(error_record(&err));
                true
            }) {
                let _ = inner.store.put_job(&r).await;
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = cancel.cancelled() => {}
            }
            if inner.shutdown.is_cancelled() {
                interrupted(inner, id).await;
                return;
            }
            if cancel.is_cancelled() {
                finish(
                    inner,
                    id,
                    JobState::Cancelled,
                    None,
                    Some(super::cancelled_error()),
                )
                .await;
                return;
            }
            match inner.update(id, |r| {
                r.attempt += 1;
                r.error = None;
                r.message = format!("attempt {}", r.attempt);
                true
            }) {
                Some(r) => record = r,
                None => return,
            }
            let _ = inner.store.put_job(&record).await;
            continue;
        }
        tracing::warn!(error = %err, "job failed");
        finish(inner, id, JobState::Failed, None, Some(error_record(&err))).await;
        return;
    }
}

fn error_record(e: &Error) -> ErrorRecord {
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
        if state == JobState::Succeeded {
            r.progress.done = r.progress.total;
            r.progress.committed = r.progress.total;
        }
        true
    }) else {
        return;
    };
    inner.finished_metrics(&record);
    let mut ops = vec![Op::PutJob(Box::new(record))];
    if state == JobState::Succeeded {
        ops.push(Op::DeleteCheckpoint(id.to_string()));
    }
    if let Err(e) = inner.store.commit(ops).await {
        tracing::error!(job = %id, error = %e, "cannot persist the job's outcome");
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

/// Polls the engine future while publishing progress every progress interval and
/// persisting the engine's checkpoint every checkpoint interval (when it moved).
async fn drive<T>(
    inner: &Arc<Inner>,
    id: &str,
    progress: &Progress,
    checkpoints: bool,
    work: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::pin!(work);
    let mut tick = tokio::time::interval(inner.cfg.progress_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_persist = Instant::now();
    let mut last_cp: Option<Checkpoint> = inner.checkpoint(id);
    let mut last_done = (Instant::now(), 0u64);
    let result = loop {
        tokio::select! {
            r = &mut work => break r,
            _ = tick.tick() => {
                let snap = progress.snapshot();
                let now = Instant::now();
                let dt = now.duration_since(last_done.0).as_secs_f64();
                let rate = if dt > 0.0 && last_done.1 > 0 {
                    snap.done.saturating_sub(last_done.1) as f64 / dt
                } else {
                    0.0
                };
                last_done = (now, snap.done);
                let cp = checkpoints.then(|| progress.checkpoint());
                let persist = checkpoints
                    && last_persist.elapsed() >= inner.cfg.checkpoint_interval
                    && cp.as_ref() != last_cp.as_ref()
                    && cp.as_ref().is_some_and(|c| !c.committed.is_empty());
                let record = inner.update(id, |r| {
                    r.progress.total = snap.total;
                    r.progress.done = snap.done;
                    r.progress.data = snap.data_bytes;
                    r.progress.zero = snap.zero_bytes;
                    r.progress.bytes_per_second = rate;
                    if let Some(cp) = &cp {
                        r.progress.committed = cp.committed_bytes();
                    }
                    true
                });
                if persist {
                    let cp = cp.clone().unwrap_or_default();
                    inner.set_checkpoint(id, cp.clone());
                    let mut ops = vec![Op::PutCheckpoint(id.to_string(), cp.clone())];
                    if let Some(r) = record {
                        ops.push(Op::PutJob(Box::new(r)));
                    }
                    // Queued now, committed in call order; no need to wait for the fsync.
                    drop(inner.store.submit(ops));
                    last_cp = Some(cp);
                    last_persist = Instant::now();
                }
            }
        }
    };
    if checkpoints {
        let cp = progress.checkpoint();
        if !cp.committed.is_empty() && Some(&cp) != last_cp.as_ref() {
            inner.set_checkpoint(id, cp.clone());
            inner.update(id, |r| {
                r.progress.committed = cp.committed_bytes();
                true
            });
            if result.is_err() {
                let _ = inner
                    .store
                    .commit(vec![Op::PutCheckpoint(id.to_string(), cp)])
                    .await;
            }
        }
    }
    let snap = progress.snapshot();
    inner.update(id, |r| {
        r.progress.total = snap.total;
        r.progress.done = snap.done;
        r.progress.data = snap.data_bytes;
        r.progress.zero = snap.zero_bytes;
        true
    });
    result
}

async fn transfer(
    inner: &Arc<Inner>,
    record: &JobRecord,
    cancel: &CancellationToken,
) -> Result<ResultRecord> {
    let id = record.id.as_str();
    let req = proto::StartTransferRequest::decode(record.request.as_slice())
        .map_err(|e| Error::internal(format!("stored request does not decode: {e}")))?;
    let opts = req.options.unwrap_or_default();
    let plan = &record.plan;
    let target_plan = plan
        .target
        .as_ref()
        .ok_or_else(|| Error::internal("transfer job without a target"))?;
    let (src_spec, src_s3) =
        convert::open_spec(&plan.source, req.source.as_ref(), &inner.secrets, "source")?;
    let (tgt_spec, tgt_s3) =
        convert::open_spec(target_plan, req.target.as_ref(), &inner.secrets, "target")?;
    let src_kind = kind_label(&plan.source_kind);
    let tgt_kind = kind_label(plan.target_kind.as_deref().unwrap_or("other"));

    let src_options = convert::source_options(opts.cache, src_s3)?;
    let source = inner.opener.open_source(&src_spec, &src_options).await?;
    let source = MeteredSource::wrap(source, &inner.metrics, src_kind);
    let size = source.size();
    let resume = inner
        .checkpoint(id)
        .filter(|c| c.size == size && !c.committed.is_empty());
    let resumed_bytes = resume.as_ref().map_or(0, Checkpoint::committed_bytes);
    let counts = Arc::new(JobCounts::default());
    let tgt_options = convert::target_options(&opts, tgt_s3.clone())?;
    let target = inner
        .opener
        .open_target(&tgt_spec, size, &tgt_options)
        .await?;
    let target = MeteredTarget::wrap(target, &inner.metrics, tgt_kind, counts.clone());

    let mut copy = convert::copy_options(&opts)?;
    copy.checkpoint_interval = inner.cfg.checkpoint_interval;
    if resume.is_some() {
        // Uncommitted ranges may hold partial writes of the earlier run.
        copy.target_is_zero = false;
    }
    copy.resume = resume;
    inner.update(id, |r| {
        r.progress.total = size;
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
    let progress = Progress::new();
    let report = drive(
        inner,
        id,
        &progress,
        true,
        ferry_engine::copy(source.clone(), target.clone(), &copy, &progress, cancel),
    )
    .await?;
    let moved = counts.written.load(Ordering::Relaxed) + counts.zeroed.load(Ordering::Relaxed);
    inner
        .metrics
        .bytes_skipped
        .with_label_values(&[tgt_kind])
        .inc_by(size.saturating_sub(moved));

    let (mut source_digest, mut target_digest) = (None, None);
    if opts.verify {
        inner.update(id, |r| {
            r.message = "verifying".into();
            true
        });
        let mut ck = ferry_engine::ChecksumOptions {
            algorithm: convert::hash_algorithm(opts.verify_algorithm)?,
            ..Default::default()
        };
        if opts.workers > 0 {
            ck.workers = opts.workers as usize;
        }
        let verify_options = convert::source_options(opts.cache, tgt_s3)?;
        let verify_target = inner.opener.open_source(&tgt_spec, &verify_options).await?;
        let verify_target = MeteredSource::wrap(verify_target, &inner.metrics, tgt_kind);
        let p1 = Progress::new();
        let p2 = Progress::new();
        let (a, b) = tokio::join!(
            ferry_engine::checksum(source.clone(), &ck, &p1, cancel),
            ferry_engine::checksum(verify_target, &ck, &p2, cancel),
        );
        let (a, b) = (a?, b?);
        let (ha, hb) = (a.hex(), b.hex());
        if ha != hb {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "verify failed: source {} digest {ha} but target digest {hb}",
                    ck.algorithm
                ),
            ));
        }
        source_digest = Some(DigestRecord {
            algorithm: ck.algorithm.as_str().into(),
            hex: ha,
        });
        target_digest = Some(DigestRecord {
            algorithm: ck.algorithm.as_str().into(),
            hex: hb,
        });
    }
    Ok(ResultRecord::Transfer {
        size: report.size,
        data_bytes: report.data_bytes,
        zero_bytes: report.zero_bytes,
        seconds: report.elapsed.as_secs_f64(),
        source_digest,
        target_digest,
        resumed_bytes,
    })
}

async fn checksum(
    inner: &Arc<Inner>,
    record: &JobRecord,
    cancel: &CancellationToken,
) -> Result<ResultRecord> {
    let id = record.id.as_str();
    let req = proto::StartChecksumRequest::decode(record.request.as_slice())
        .map_err(|e| Error::internal(format!("stored request does not decode: {e}")))?;
    let opts = req.options.unwrap_or_default();
    let (spec, s3) = convert::open_spec(
        &record.plan.source,
        req.source.as_ref(),
        &inner.secrets,
        "source",
    )?;
    let source_options = convert::source_options(opts.cache, s3)?;
    let source = inner.opener.open_source(&spec, &source_options).await?;
    let source = MeteredSource::wrap(source, &inner.metrics, kind_label(&record.plan.source_kind));
    let size = source.size();
    let ck = convert::checksum_options(&opts)?;
    let progress = Progress::new();
    let started = Instant::now();
    let digest = drive(
        inner,
        id,
        &progress,
        false,
        ferry_engine::checksum(source, &ck, &progress, cancel),
    )
    .await?;
    Ok(ResultRecord::Checksum {
        digest: DigestRecord {
            algorithm: digest.algorithm.as_str().into(),
            hex: digest.hex(),
        },
        size,
        seconds: started
            .elapsed()
            .as_secs_f64()
            .max(Duration::from_micros(1).as_secs_f64()),
    })
}
