//! One attempt of a transfer into several targets: one pass over the source through the
//! engine's [`FanOut`], then each target that holds the image read back and compared
//! with the source ([`verify_read_backs`], the verify `ferry copy SRC DST1 DST2 --verify`
//! runs), while the job record says how each target is doing.
//!
//! A target that fails is dropped (and aborted at the end) while the others go on; it is
//! out of the job for good: the checkpoint moves on without it, so no retry or restart
//! writes it again (`resumable` is false). Retries and restarts resume the targets still
//! live. When the last live targets fail together the attempt fails as a whole, and the
//! one that failed last, which holds every committed range, stays live for a retry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Caps, Error, ErrorKind, IoBuf, Result, Source, Target, ZeroMode};
use ferry_engine::{
    verify_read_backs, CancellationToken, FanOut, Progress, Verification, VerifiedCopy,
};

use super::metered::{JobCounts, MeteredSource, MeteredTarget};
use super::runner::{
    attempt_options, drive, error_record, kind_label, open_transfer_source, transfer_result, Ended,
};
use super::Inner;
use crate::convert::options::source_options;
use crate::convert::TransferSpec;
use crate::model::job::{DigestRecord, ErrorRecord, JobRecord, TargetState};

/// One target written by this attempt.
struct Member {
    /// Its position among the job's targets (`target` is 0).
    index: usize,
    /// What the fan-out writes: the opened target, metered and tracked.
    target: Arc<dyn Target>,
    tracking: Arc<Tracking>,
    kind: &'static str,
    counts: Arc<JobCounts>,
}

/// Runs one attempt of a fan-out transfer; see the module docs.
pub(super) async fn transfer(
    inner: &Arc<Inner>,
    id: &str,
    spec: &TransferSpec,
    cancel: &CancellationToken,
) -> Result<Ended> {
    let source = open_transfer_source(inner, id, spec).await?;
    if !source.size_known() {
        let _ = source.close().await;
        return Err(Error::invalid_input(
            "the source's size is not known before it is read (a compressed stream that \
             does not record it), and a transfer to several targets needs it: give \
             image_size, set prescan, or transfer to one target",
        ));
    }
    let size = source.size();
    let mut members = open_members(inner, id, spec, size).await?;
    let (copy, resumed_bytes) = attempt_options(inner, id, spec, size);
    // A relayed target that is out of the job (failed earlier) has nothing to serve.
    let relayed = spec
        .relay
        .as_ref()
        .and_then(|(index, _)| members.iter().position(|m| m.index == *index));
    let relay = match relayed {
        Some(at) => {
            let relay = super::relay::start(inner, id, spec, size).await?;
            if let Some((_, r)) = &relay {
                members[at].target = r.wrap(members[at].target.clone());
            }
            relay
        }
        None => None,
    };
    let fan = Arc::new(FanOut::new(
        source.clone(),
        members.iter().map(|m| m.target.clone()).collect(),
    )?);
    let progress = super::relay::progress(relay.as_ref());
    let copying = ferry_engine::copy(source.clone(), fan.clone(), &copy, &progress, cancel);
    let watched = async {
        tokio::select! {
            r = copying => r,
            never = watch_members(inner, id, &members, &fan) => match never {},
        }
    };
    let copied = drive(inner, id, &progress, true, watched).await;
    super::relay::end(relay).await;
    let last = settle_copy(inner, id, &members, &fan, copied.is_err());
    // When none was left, the last failure decides whether the attempt is retried.
    let report = copied.map_err(|e| last.unwrap_or(e))?;
    for m in &members {
        let moved =
            m.counts.written.load(Ordering::Relaxed) + m.counts.zeroed.load(Ordering::Relaxed);
        inner
            .metrics
            .bytes_skipped
            .with_label_values(&[m.kind])
            .inc_by(size.saturating_sub(moved));
    }
    let holding: Vec<&Member> = members
        .iter()
        .zip(fan.outcomes())
        .filter(|(_, o)| o.error.is_none())
        .map(|(m, _)| m)
        .collect();
    let verification = match &spec.verify {
        Some(checksum) => {
            verify(inner, id, spec, source.clone(), &holding, checksum, cancel).await?
        }
        None => None,
    };
    let _ = source.close().await;
    let done = VerifiedCopy {
        copy: report,
        verification,
    };
    let result = transfer_result(&done, resumed_bytes);
    let record = inner
        .update(id, |r| {
            for m in &holding {
                if let Some(t) = r.targets.get_mut(m.index) {
                    if t.state == TargetState::Running {
                        t.state = TargetState::Succeeded;
                        t.done = size;
                    }
                }
            }
            true
        })
        .ok_or_else(|| Error::internal("the job disappeared while it ran"))?;
    Ok(Ended {
        result,
        failed: failed_targets(&record),
    })
}

/// The targets still live (all of them for a record without targets), opened, metered
/// and tracked. A target that cannot be opened (or is smaller than the source) fails
/// alone; when none can be opened the attempt fails with the first error, and every
/// target is tried again by a retry.
async fn open_members(
    inner: &Inner,
    id: &str,
    spec: &TransferSpec,
    size: u64,
) -> Result<Vec<Member>> {
    let live: Vec<bool> = inner
        .table
        .lock()
        .jobs
        .get(id)
        .map(|e| e.record.targets.iter().map(|t| t.is_live()).collect())
        .unwrap_or_default();
    let clock = Arc::new(AtomicU64::new(0));
    let mut members = Vec::new();
    let mut failures = Vec::new();
    for (index, access) in spec.targets().enumerate() {
        if !live.get(index).copied().unwrap_or(true) {
            continue;
        }
        let opened = async {
            let (target_spec, s3) = access.open(&inner.secrets)?;
            let kind = kind_label(target_spec.kind());
            let target = inner
                .opener
                .open_target(&target_spec, size, &spec.target_options(s3))
                .await?;
            if target.size() < size {
                let _ = target.abort().await;
                return Err(Error::invalid_input(format!(
                    "the target ({} bytes) is smaller than the source ({size} bytes)",
                    target.size()
                )));
            }
            Ok::<_, Error>((target, kind))
        }
        .await;
        match opened {
            Ok((target, kind)) => {
                let counts = Arc::new(JobCounts::default());
                let metered = MeteredTarget::wrap(target, &inner.metrics, kind, counts.clone());
                let tracking = Arc::new(Tracking {
                    clock: clock.clone(),
                    failed_at: AtomicU64::new(0),
                });
                members.push(Member {
                    index,
                    target: Arc::new(Tracked {
                        inner: metered,
                        tracking: tracking.clone(),
                    }),
                    tracking,
                    kind,
                    counts,
                });
            }
            Err(e) => failures.push((index, e.with_endpoint(access.name()))),
        }
    }
    if members.is_empty() {
        return Err(match failures.into_iter().next() {
            Some((_, e)) => e,
            None => Error::internal("a transfer without a live target ran"),
        });
    }
    inner.update(id, |r| {
        for (index, e) in &failures {
            drop_target(r, *index, error_record(e));
        }
        !failures.is_empty()
    });
    Ok(members)
}

/// Out of the job for good: failed, not resumable.
fn drop_target(r: &mut JobRecord, index: usize, error: ErrorRecord) {
    if let Some(t) = r.targets.get_mut(index) {
        t.state = TargetState::Failed;
        t.error = Some(error);
        t.resumable = false;
    }
}

/// The members the fan-out dropped, by position, with their errors (cancellation is the
/// whole copy's end, not a member's failure).
fn dropped(fan: &FanOut) -> Vec<(usize, ErrorRecord)> {
    fan.outcomes()
        .into_iter()
        .enumerate()
        .filter_map(|(i, o)| {
            let f = o.error?;
            (f.kind != ErrorKind::Cancelled).then(|| {
                (
                    i,
                    ErrorRecord {
                        kind: f.kind.as_str().into(),
                        message: f.message,
                    },
                )
            })
        })
        .collect()
}

/// Marks the members the fan-out dropped as failed while the copy goes on, so watchers
/// see at once which targets no longer get the image. Never returns.
async fn watch_members(
    inner: &Inner,
    id: &str,
    members: &[Member],
    fan: &FanOut,
) -> std::convert::Infallible {
    let mut tick = tokio::time::interval(inner.cfg.progress_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = 0;
    loop {
        tick.tick().await;
        let now = dropped(fan);
        if now.len() == seen {
            continue;
        }
        seen = now.len();
        inner.update(id, |r| {
            for (i, error) in &now {
                if r.targets
                    .get(members[*i].index)
                    .is_some_and(|t| t.is_live())
                {
                    drop_target(r, members[*i].index, error.clone());
                }
            }
            true
        });
    }
}

/// After the copy: the dropped members failed. When the copy failed because none was
/// left, the one that failed last held every committed range until its failure: it stays
/// live (resumable) for a retry, as the target of a single copy would, and its error is
/// returned as the attempt's.
fn settle_copy(
    inner: &Inner,
    id: &str,
    members: &[Member],
    fan: &FanOut,
    copy_failed: bool,
) -> Option<Error> {
    let failed = dropped(fan);
    let last = if copy_failed && failed.len() == members.len() {
        failed
            .iter()
            .max_by_key(|(i, _)| members[*i].tracking.failed_at.load(Ordering::SeqCst))
            .map(|(i, _)| *i)
    } else {
        None
    };
    inner.update(id, |r| {
        for (i, error) in &failed {
            let index = members[*i].index;
            if Some(*i) == last {
                if let Some(t) = r.targets.get_mut(index) {
                    t.state = TargetState::Running;
                    t.error = None;
                    t.resumable = true;
                }
            } else {
                drop_target(r, index, error.clone());
            }
        }
        true
    });
    let (_, error) = failed.into_iter().find(|(i, _)| Some(*i) == last)?;
    let kind = ErrorKind::from_name(&error.kind).unwrap_or(ErrorKind::Internal);
    Some(Error::new(kind, error.message))
}

/// Reads every member that holds the image back and compares it with the source; a
/// target that cannot be read back or differs fails alone. Returns a verification of a
/// target that passed (the digests of all that passed are equal).
async fn verify(
    inner: &Inner,
    id: &str,
    spec: &TransferSpec,
    source: Arc<dyn Source>,
    holding: &[&Member],
    checksum: &ferry_engine::ChecksumOptions,
    cancel: &CancellationToken,
) -> Result<Option<Verification>> {
    inner.update(id, |r| {
        r.message = "verifying".into();
        true
    });
    let mut read_backs = Vec::new();
    let mut reading = Vec::new();
    for m in holding {
        let Some(access) = spec.targets().nth(m.index) else {
            continue;
        };
        let opened = async {
            let (target_spec, s3) = access.open(&inner.secrets)?;
            let options = source_options(spec.cache, s3);
            let read_back = inner.opener.open_source(&target_spec, &options).await?;
            Ok::<_, Error>(MeteredSource::wrap(read_back, &inner.metrics, m.kind))
        }
        .await;
        read_backs.push(opened);
        reading.push(m.index);
    }
    let progress = Progress::new();
    let results = verify_read_backs(source, read_backs, checksum, &progress, cancel).await?;
    let mut failed = Vec::new();
    let mut passed = None;
    let mut digests = Vec::new();
    for (index, result) in reading.into_iter().zip(results) {
        match result {
            Ok(v) => {
                digests.push((index, digest_record(&v.target)));
                passed.get_or_insert(v);
            }
            Err(e) => failed.push((index, error_record(&e))),
        }
    }
    inner.update(id, |r| {
        for (index, error) in &failed {
            drop_target(r, *index, error.clone());
        }
        for (index, digest) in &digests {
            if let Some(t) = r.targets.get_mut(*index) {
                t.digest = Some(digest.clone());
            }
        }
        true
    });
    Ok(passed)
}

fn digest_record(d: &ferry_engine::Digest) -> DigestRecord {
    DigestRecord {
        algorithm: d.algorithm.as_str().into(),
        hex: d.hex(),
    }
}

/// The error of a transfer some of whose targets failed: how many and which, and where
/// the image is. Its kind is the first failed target's.
fn failed_targets(r: &JobRecord) -> Option<Error> {
    let failed: Vec<_> = r
        .targets
        .iter()
        .filter(|t| t.state == TargetState::Failed)
        .collect();
    let first = failed.first()?;
    let kind = first
        .error
        .as_ref()
        .and_then(|e| ErrorKind::from_name(&e.kind))
        .unwrap_or(ErrorKind::Internal);
    let which: Vec<String> = failed
        .iter()
        .map(|t| match &t.error {
            Some(e) => format!("{} ({}: {})", t.target, e.kind, e.message),
            None => t.target.clone(),
        })
        .collect();
    let holding: Vec<&str> = r
        .targets
        .iter()
        .filter(|t| t.state == TargetState::Succeeded)
        .map(|t| t.target.as_str())
        .collect();
    let held = if holding.is_empty() {
        "no target holds the image".to_string()
    } else {
        format!("the image is on {}", holding.join(", "))
    };
    Some(Error::new(
        kind,
        format!(
            "{} of {} targets failed: {}; {held}",
            failed.len(),
            r.targets.len(),
            which.join("; ")
        ),
    ))
}

/// When a member first failed, on a clock shared by the members of one attempt.
#[derive(Debug)]
struct Tracking {
    clock: Arc<AtomicU64>,
    /// 0 while it has not failed.
    failed_at: AtomicU64,
}

impl Tracking {
    fn note<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if e.kind() != ErrorKind::Cancelled && self.failed_at.load(Ordering::SeqCst) == 0 {
                let now = self.clock.fetch_add(1, Ordering::SeqCst) + 1;
                let _ = self
                    .failed_at
                    .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
        r
    }
}

/// A member target that notes when it first failed.
struct Tracked {
    inner: Arc<dyn Target>,
    tracking: Arc<Tracking>,
}

impl std::fmt::Debug for Tracked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tracked({})", self.inner.describe())
    }
}

#[async_trait]
impl Target for Tracked {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn is_zero(&self) -> bool {
        self.inner.is_zero()
    }

    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        self.tracking.note(self.inner.write_at(offset, buf).await)
    }

    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.tracking
            .note(self.inner.write_zeroes(offset, len, mode).await)
    }

    async fn flush(&self) -> Result<()> {
        self.tracking.note(self.inner.flush().await)
    }

    async fn connect(&self) -> Result<Arc<dyn Target>> {
        let inner = self.tracking.note(self.inner.connect().await)?;
        Ok(Arc::new(Self {
            inner,
            tracking: self.tracking.clone(),
        }))
    }

    async fn finish(&self) -> Result<()> {
        self.tracking.note(self.inner.finish().await)
    }

    async fn abort(&self) -> Result<()> {
        self.inner.abort().await
    }
}
