//! The copy: workers spawned once per copy, each planning segments and keeping a few
//! requests in flight (no task per request), committing out of order or through the
//! sequencer, while the copy itself checkpoints, watches for cancellation and finishes
//! or aborts the target.

use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{Error, IoBuf, Result, Source, Target, ZeroMode};
use futures::stream::{self, FuturesUnordered, StreamExt};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::commit::Committer;
use crate::geometry::Geometry;
use crate::options::{CommitOrder, CopyOptions};
use crate::plan::{Cursor, Planner, Segment};
use crate::pool::{Slot, SlotPool};
use crate::progress::{Checkpoint, Progress};
use crate::ranges::RangeSet;
use crate::rate::RateLimiter;
use crate::sequencer::Sequencer;
use crate::tap::BlockTap;
use crate::zero::{scan, Run};

/// What a finished copy did.
#[derive(Debug, Clone)]
pub struct CopyReport {
    pub size: u64,
    /// Bytes written as data by this run.
    pub data_bytes: u64,
    /// Bytes handled as zeroes by this run.
    pub zero_bytes: u64,
    pub elapsed: Duration,
    /// The source's size was not known before the copy: `size` is where it ended.
    pub size_learned: bool,
}

/// State every worker of one copy shares.
#[derive(Debug)]
struct Shared {
    geometry: Geometry,
    cursor: Arc<Cursor>,
    resume: Arc<RangeSet>,
    committer: Committer,
    /// Present for in-order commits.
    sequencer: Option<Sequencer>,
    rate: Option<RateLimiter>,
    /// Takes the block hash of what the copy reads (a verified copy's source digest).
    tap: Option<Arc<BlockTap>>,
}

/// Copies `source` to `target` (which must be at least as large).
///
/// On success the target has been finished (and so flushed) and the checkpoint covers the
/// whole image. On failure or cancellation the target is aborted, the original error is
/// returned (`ErrorKind::Cancelled` when `cancel` fired) and `progress.checkpoint()` says
/// which ranges were written and flushed, for `CopyOptions::resume`.
pub async fn copy(
    source: Arc<dyn Source>,
    target: Arc<dyn Target>,
    options: &CopyOptions,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<CopyReport> {
    copy_tapped(source, target, options, progress, cancel, None).await
}

/// [`copy`], handing every segment read (or known zero) to `tap` as well.
pub(crate) async fn copy_tapped(
    source: Arc<dyn Source>,
    target: Arc<dyn Target>,
    options: &CopyOptions,
    progress: &Progress,
    cancel: &CancellationToken,
    tap: Option<Arc<BlockTap>>,
) -> Result<CopyReport> {
    if !source.size_known() {
        if tap.is_some() {
            let _ = target.abort().await;
            return Err(Error::internal(
                "a source of unknown size is hashed by the stream copy, not a block tap",
            ));
        }
        return crate::stream::copy_stream(source, target, options, progress, cancel, &mut None)
            .await;
    }
    let started = Instant::now();
    let shared = match prepare(&source, &target, options, progress, tap) {
        Ok(shared) => Arc::new(shared),
        Err(e) => {
            let _ = target.abort().await;
            return Err(e);
        }
    };
    let result = match run(&shared, &source, &target, options, cancel).await {
        Ok(()) => match source.finish().await {
            // What only the end shows (a registry layer's digest) decides before the
            // target is finished: a source that fails it leaves no finished target.
            Ok(()) => finish(&shared, cancel).await,
            Err(e) => Err(e
                .with_operation("finish source")
                .with_endpoint(source.describe())),
        },
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        let _ = target.abort().await;
        return Err(e);
    }
    let snap = progress.snapshot();
    Ok(CopyReport {
        size: shared.geometry.size,
        data_bytes: snap.data_bytes,
        zero_bytes: snap.zero_bytes,
        elapsed: started.elapsed(),
        size_learned: false,
    })
}

fn prepare(
    source: &Arc<dyn Source>,
    target: &Arc<dyn Target>,
    options: &CopyOptions,
    progress: &Progress,
    tap: Option<Arc<BlockTap>>,
) -> Result<Shared> {
    options.validate()?;
    let size = source.size();
    if target.size() < size {
        return Err(Error::invalid_input(format!(
            "the target ({} bytes) is smaller than the source ({size} bytes)",
            target.size()
        ))
        .with_endpoint(target.describe()));
    }
    let resume = match &options.resume {
        None => RangeSet::new(),
        Some(Checkpoint { size: s, .. }) if *s != size => {
            return Err(Error::invalid_input(format!(
                "the checkpoint to resume is for an image of {s} bytes, but the source has {size}"
            )))
        }
        Some(c) => RangeSet::from_ranges(c.committed.iter().map(|&(s, e)| (s, e.min(size)))),
    };
    let geometry = Geometry::new(size, source.caps(), target.caps(), options)?;
    let in_order = match options.order {
        CommitOrder::Auto => !target.caps().random_write,
        CommitOrder::InOrder => true,
        CommitOrder::OutOfOrder => false,
    };
    let zero_mode = if options.sparse_size == 0 {
        ZeroMode::Allocate
    } else {
        options.zero_mode
    };
    let skip_zero =
        zero_mode == ZeroMode::MayDeallocate && (options.target_is_zero || target.is_zero());
    progress.start(size, resume.len());
    progress.publish(Checkpoint {
        size,
        committed: resume.to_vec(),
    });
    Ok(Shared {
        geometry,
        cursor: Arc::new(Cursor::new(&geometry)),
        sequencer: in_order.then(|| Sequencer::new(size, resume.clone())),
        committer: Committer::new(
            Arc::clone(target),
            progress.clone(),
            size,
            skip_zero,
            zero_mode,
            resume.clone(),
        ),
        resume: Arc::new(resume),
        rate: options
            .rate_limit
            .map(|rate| RateLimiter::new(rate, geometry.request as u64)),
        tap,
    })
}

/// Runs the workers and periodic checkpoints until the work is done, a worker fails or
/// the copy is cancelled. Every worker has stopped when this returns.
async fn run(
    shared: &Arc<Shared>,
    source: &Arc<dyn Source>,
    target: &Arc<dyn Target>,
    options: &CopyOptions,
    cancel: &CancellationToken,
) -> Result<()> {
    let mut set = JoinSet::new();
    for index in 0..shared.geometry.workers {
        set.spawn(worker(
            Arc::clone(shared),
            index,
            Arc::clone(source),
            Arc::clone(target),
        ));
    }
    let workers = async {
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok(result) => result?,
                Err(e) if e.is_panic() => return Err(Error::internal("a copy worker panicked")),
                Err(_) => return Err(Error::cancelled()),
            }
        }
        Ok(())
    };
    let interval = options.checkpoint_interval;
    let checkpoints = async {
        if interval.is_zero() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(interval).await;
            shared.committer.checkpoint().await?;
        }
    };
    let result = tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(Error::cancelled()),
        r = workers => r,
        r = checkpoints => r,
    };
    set.shutdown().await;
    result?;
    let written = shared.committer.written_bytes();
    if written != shared.geometry.size {
        return Err(Error::internal(format!(
            "copy ended with {written} of {} bytes committed",
            shared.geometry.size
        )));
    }
    Ok(())
}

async fn finish(shared: &Shared, cancel: &CancellationToken) -> Result<()> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(Error::cancelled()),
        r = shared.committer.finish() => r,
    }
}

/// One worker: plans segments from the shared cursor and keeps up to `window` of them
/// in flight, reusing its slots.
async fn worker(
    shared: Arc<Shared>,
    index: usize,
    source: Arc<dyn Source>,
    target: Arc<dyn Target>,
) -> Result<()> {
    let (src, tgt) = if index == 0 {
        (source, target)
    } else {
        let src = source
            .connect()
            .await
            .map_err(|e| e.with_operation("connect").with_endpoint(source.describe()))?;
        let tgt = target
            .connect()
            .await
            .map_err(|e| e.with_operation("connect").with_endpoint(target.describe()))?;
        (src, tgt)
    };
    let planner = Planner::new(
        shared.geometry,
        Arc::clone(&src),
        Arc::clone(&shared.cursor),
        Arc::clone(&shared.resume),
    );
    let mut segments = pin!(stream::unfold(planner, |mut planner| async move {
        match planner.next().await {
            Ok(Some(seg)) => Some((Ok(seg), planner)),
            Ok(None) => None,
            Err(e) => Some((Err(e), planner)),
        }
    }));
    let mut pool = SlotPool::new(shared.geometry.window);
    let mut inflight = FuturesUnordered::new();
    let mut planned_all = false;
    loop {
        tokio::select! {
            biased;
            Some(done) = inflight.next(), if !inflight.is_empty() => pool.put(done?),
            next = segments.next(), if !planned_all && pool.has_free() => match next {
                None => planned_all = true,
                Some(Err(e)) => return Err(e),
                Some(Ok(seg)) => {
                    let slot = pool
                        .take()
                        .ok_or_else(|| Error::internal("no free request slot"))?;
                    inflight.push(process(&shared, &*src, &*tgt, seg, slot));
                }
            },
            else => break,
        }
    }
    Ok(())
}

/// Reads (unless known zero), scans and commits one segment.
async fn process(
    shared: &Shared,
    source: &dyn Source,
    target: &dyn Target,
    seg: Segment,
    mut slot: Slot,
) -> Result<Slot> {
    if seg.zero {
        if let Some(tap) = &shared.tap {
            tap.zero(seg.offset, seg.len);
        }
        commit_zero_segment(shared, target, &seg).await?;
        return Ok(slot);
    }
    let buf = read_segment(shared, source, &seg, &mut slot).await?;
    let geometry = &shared.geometry;
    scan(
        &buf,
        seg.offset,
        geometry.sparse,
        geometry.size,
        &mut slot.runs,
    );
    let buf = match &shared.sequencer {
        None => commit_runs(shared, target, &seg, &slot.runs, buf).await?,
        Some(seq) => commit_runs_in_order(shared, seq, target, &seg, &slot.runs, buf).await?,
    };
    slot.put_buf(buf);
    Ok(slot)
}

/// Reads one segment into the slot's buffer, within the rate limit, and hands it to the
/// tap.
#[inline]
async fn read_segment(
    shared: &Shared,
    source: &dyn Source,
    seg: &Segment,
    slot: &mut Slot,
) -> Result<IoBuf> {
    if let Some(rate) = &shared.rate {
        rate.acquire(seg.len).await;
    }
    let buf = slot.take_buf(shared.geometry.request, seg.len as usize);
    let mut buf = source
        .read_at(seg.offset, buf)
        .await
        .map_err(|e| e.at("read", seg.offset).with_endpoint(source.describe()))?;
    if let Some(tap) = &shared.tap {
        buf = hash_into(tap, seg.offset, buf).await?;
    }
    Ok(buf)
}

/// Commits a read segment's runs out of order: its data, its inner zero runs, and the
/// zero runs its edges close together with its neighbours (see the span's merger).
/// Returns the buffer.
#[inline]
async fn commit_runs(
    shared: &Shared,
    target: &dyn Target,
    seg: &Segment,
    runs: &[Run],
    mut buf: IoBuf,
) -> Result<IoBuf> {
    let committer = &shared.committer;
    let (first, last) = (runs.first(), runs.last());
    let head_end = first
        .filter(|r| r.zero)
        .map(|r| seg.offset + r.end() as u64);
    let tail_start = last.filter(|r| r.zero).map(|r| seg.offset + r.start as u64);
    let [before, after] =
        seg.span
            .merger
            .lock()
            .resolve(seg.offset, seg.end(), head_end, tail_start);
    // Offset order: the run closed at the head goes first, because it may complete
    // a part of the target (an S3 part buffer) that this segment's data must wait for.
    if let Some((start, end)) = before {
        committer.zero(target, start, end).await?;
    }
    let n = runs.len();
    for (i, run) in runs.iter().enumerate() {
        let at = seg.offset + run.start as u64;
        if !run.zero {
            buf.set_view(run.start, run.len);
            buf = committer.write(target, at, buf).await?;
        } else if i > 0 && i + 1 < n {
            committer.zero(target, at, at + run.len as u64).await?;
        }
    }
    if let Some((start, end)) = after {
        committer.zero(target, start, end).await?;
    }
    Ok(buf)
}

/// Commits a read segment's runs in offset order, on its turn: zero runs join the
/// sequencer's pending one, which is written before the next data. Returns the buffer.
#[inline]
async fn commit_runs_in_order(
    shared: &Shared,
    seq: &Sequencer,
    target: &dyn Target,
    seg: &Segment,
    runs: &[Run],
    mut buf: IoBuf,
) -> Result<IoBuf> {
    let committer = &shared.committer;
    seq.wait_turn(seg.offset).await?;
    for run in runs {
        let at = seg.offset + run.start as u64;
        if run.zero {
            if let Some((s, e)) = seq.add_zero(at, at + run.len as u64) {
                committer.zero(target, s, e).await?;
            }
        } else {
            if let Some((s, e)) = seq.take_zero() {
                committer.zero(target, s, e).await?;
            }
            buf.set_view(run.start, run.len);
            buf = committer.write(target, at, buf).await?;
        }
    }
    advance(shared, seq, target, seg.end()).await?;
    Ok(buf)
}

/// Hands the bytes read at `offset` to the tap, hashing them where they were just read
/// (see `cpu`).
async fn hash_into(tap: &Arc<BlockTap>, offset: u64, buf: IoBuf) -> Result<IoBuf> {
    let tap = Arc::clone(tap);
    crate::cpu::run(move || {
        tap.data(offset, &buf);
        buf
    })
    .await
}

async fn commit_zero_segment(shared: &Shared, target: &dyn Target, seg: &Segment) -> Result<()> {
    let committer = &shared.committer;
    match &shared.sequencer {
        None => {
            let closed = seg.span.merger.lock().resolve(
                seg.offset,
                seg.end(),
                Some(seg.end()),
                Some(seg.offset),
            );
            for (start, end) in closed.into_iter().flatten() {
                committer.zero(target, start, end).await?;
            }
        }
        Some(seq) => {
            seq.wait_turn(seg.offset).await?;
            if let Some((s, e)) = seq.add_zero(seg.offset, seg.end()) {
                committer.zero(target, s, e).await?;
            }
            advance(shared, seq, target, seg.end()).await?;
        }
    }
    Ok(())
}

/// Passes the in-order turn on; whoever completes the image writes the last zero run.
async fn advance(shared: &Shared, seq: &Sequencer, target: &dyn Target, end: u64) -> Result<()> {
    if seq.advance(end) {
        if let Some((s, e)) = seq.take_zero() {
            shared.committer.zero(target, s, e).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
