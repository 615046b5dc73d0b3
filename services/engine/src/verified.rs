//! Copy, flush, then verify: the one copy-then-verify path of `ferry copy --verify` and of
//! the job service's transfers.
//!
//! The copy ends with the target's flush ([`copy`] finishes the target). Only then is the
//! target opened again for reading, through the caller's read-back function (a new handle:
//! what is checked is what the endpoint stores, never a buffer of ferry's), and the source
//! and the target's first `source size` bytes are compared: by their block hashes, or, when
//! the copy hashed the source in flight, by a per-block CRC-64 check of each (see
//! `blockcheck`), which proves the same equality at a fraction of the CPU. A
//! target larger than the image (an existing disk, a volume bigger than the image) verifies
//! when that prefix equals the source; the bytes past it are not the copy's business.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ferry_core::{Caps, Error, ErrorKind, Extent, IoBuf, Result, Source, Target};
use tokio_util::sync::CancellationToken;

use crate::checksum::read_back_check;
use crate::copy::copy_tapped;
use crate::readback::{Gate, Gated};
use crate::stream::{copy_stream, StreamHash};
use crate::tap::BlockTap;
use crate::{
    checksum, copy, ChecksumOptions, CopyOptions, CopyReport, Digest, HashAlgorithm, Progress,
};

/// The stage of a verified copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Copying and flushing the target.
    Copy,
    /// Hashing the source and the target read back.
    Verify,
}

/// How to verify a copy: the checksum to compare and how to open the target for reading
/// once the copy has flushed it.
#[derive(Debug, Clone)]
pub struct Verify<R> {
    pub checksum: ChecksumOptions,
    /// Opens the target again as a source (called once, after the flush).
    pub read_back: R,
}

/// Where a verified copy reports its progress.
pub struct Stages<'a> {
    /// Progress of the copy (and its checkpoints).
    pub copy: Progress,
    /// Progress of hashing the source during verification.
    pub verify: Progress,
    /// Called as each stage starts.
    pub entered: &'a (dyn Fn(Stage) + Send + Sync),
}

impl fmt::Debug for Stages<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stages")
            .field("copy", &self.copy)
            .field("verify", &self.verify)
            .finish_non_exhaustive()
    }
}

/// The digests of both sides of a verified copy and how long computing them took.
#[derive(Debug, Clone)]
pub struct Verification {
    pub source: Digest,
    pub target: Digest,
    pub elapsed: Duration,
}

/// What a copy, verified or not, did.
#[derive(Debug, Clone)]
pub struct VerifiedCopy {
    pub copy: CopyReport,
    /// Present when verification was asked for (and passed).
    pub verification: Option<Verification>,
}

/// A failed verified copy: the stage that failed and why.
#[derive(Debug)]
pub struct StageError {
    pub stage: Stage,
    pub error: Error,
}

impl StageError {
    fn in_copy(error: Error) -> Self {
        Self {
            stage: Stage::Copy,
            error,
        }
    }

    fn in_verify(error: Error) -> Self {
        Self {
            stage: Stage::Verify,
            error,
        }
    }
}

impl fmt::Display for StageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for StageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<StageError> for Error {
    fn from(e: StageError) -> Self {
        e.error
    }
}

/// Copies `source` to `target` (which the copy flushes) and, when `verify` is given,
/// compares the target's first `source.size()` bytes, read back through a new handle, with
/// the source by digest. A mismatch is an [`ErrorKind::Corrupt`] error of the
/// [`Stage::Verify`] stage.
///
/// With the block hash, the source's digest is taken from the bytes the copy reads (no
/// second read of the source), together with a per-block CRC-64 check that the target read
/// back is compared with (see `blockcheck`: it costs a fraction of hashing the target with
/// SHA-256; when the checks match, the target's digest is the source's), and a target that
/// can be read while it is written
/// ([`Caps::read_while_writing`]) is read back as the copy goes, each range only after a
/// flush covered it (see `readback`). Plain SHA-256, and a copy that resumes (part of the
/// source is not read again), hash the source in a second pass after the copy; targets
/// readable only once finished are read back after the copy.
pub async fn copy_and_verify<R, F>(
    source: Arc<dyn Source>,
    target: Arc<dyn Target>,
    options: &CopyOptions,
    verify: Option<Verify<R>>,
    stages: &Stages<'_>,
    cancel: &CancellationToken,
) -> std::result::Result<VerifiedCopy, StageError>
where
    R: FnOnce() -> F,
    F: Future<Output = Result<Arc<dyn Source>>>,
{
    (stages.entered)(Stage::Copy);
    if !source.size_known() {
        return verified_stream(source, target, options, verify, stages, cancel).await;
    }
    let verify = match verify {
        Some(v) if hashes_in_flight(&v, options) => {
            return in_flight(source, target, options, v, stages, cancel).await;
        }
        v => v,
    };
    // The copy takes the only handle: the target is finished (flushed) and released
    // before it is opened again for reading.
    let report = copy(source.clone(), target, options, &stages.copy, cancel)
        .await
        .map_err(|error| StageError {
            stage: Stage::Copy,
            error,
        })?;
    let Some(verify) = verify else {
        return Ok(VerifiedCopy {
            copy: report,
            verification: None,
        });
    };
    (stages.entered)(Stage::Verify);
    let read_back = open_read_back(verify.read_back).await?;
    let verification =
        verify_read_back(source, read_back, &verify.checksum, &stages.verify, cancel)
            .await
            .map_err(|error| StageError {
                stage: Stage::Verify,
                error,
            })?;
    Ok(VerifiedCopy {
        copy: report,
        verification: Some(verification),
    })
}

/// The verified copy of a source whose size is not known: its digest is taken by the
/// copy's one pass (see `stream`), then the target's first `size` bytes, the length the
/// stream turned out to have, are read back and hashed.
async fn verified_stream<R, F>(
    source: Arc<dyn Source>,
    target: Arc<dyn Target>,
    options: &CopyOptions,
    verify: Option<Verify<R>>,
    stages: &Stages<'_>,
    cancel: &CancellationToken,
) -> std::result::Result<VerifiedCopy, StageError>
where
    R: FnOnce() -> F,
    F: Future<Output = Result<Arc<dyn Source>>>,
{
    let mut hash = verify
        .as_ref()
        .map(|v| StreamHash::new(v.checksum.algorithm));
    let report = copy_stream(source, target, options, &stages.copy, cancel, &mut hash)
        .await
        .map_err(StageError::in_copy)?;
    let (Some(verify), Some(hash)) = (verify, hash) else {
        return Ok(VerifiedCopy {
            copy: report,
            verification: None,
        });
    };
    (stages.entered)(Stage::Verify);
    let started = Instant::now();
    let size = report.size;
    let source_digest = Digest {
        algorithm: verify.checksum.algorithm,
        bytes: hash.finish(size),
    };
    let read_back = open_read_back(verify.read_back).await?;
    let name = read_back.describe();
    let verification = async {
        let target = prefix_view(read_back, size).await?;
        let digest = checksum(target.clone(), &verify.checksum, &stages.verify, cancel).await;
        let _ = target.close().await;
        let digest = digest.map_err(|e| reworded(e, "verify: checksum of the target"))?;
        check_equal(source_digest, digest, &name, size, started)
    }
    .await
    .map_err(StageError::in_verify)?;
    Ok(VerifiedCopy {
        copy: report,
        verification: Some(verification),
    })
}

/// Checkpoint interval of a copy whose target is read back as it goes: how far the
/// read-back trails the copy.
const READ_BACK_INTERVAL: Duration = Duration::from_millis(250);

/// Whether the source's digest can come from the copy's own reads.
fn hashes_in_flight<R>(verify: &Verify<R>, options: &CopyOptions) -> bool {
    verify.checksum.algorithm == HashAlgorithm::Blkhash
        && options
            .resume
            .as_ref()
            .is_none_or(|c| c.committed.is_empty())
}

/// The verified copy with the source hashed from the copy's reads and, where the target
/// allows it, the target read back during the copy.
async fn in_flight<R, F>(
    source: Arc<dyn Source>,
    target: Arc<dyn Target>,
    options: &CopyOptions,
    verify: Verify<R>,
    stages: &Stages<'_>,
    cancel: &CancellationToken,
) -> std::result::Result<VerifiedCopy, StageError>
where
    R: FnOnce() -> F,
    F: Future<Output = Result<Arc<dyn Source>>>,
{
    if !target.caps().read_while_writing {
        return read_back_after_copy(source, target, options, verify, stages, cancel).await;
    }
    let read_back = match open_read_back(verify.read_back).await {
        Ok(r) => r,
        Err(e) => {
            let _ = target.abort().await;
            return Err(e);
        }
    };
    let read_back = match prefix_view(read_back, source.size()).await {
        Ok(r) => r,
        Err(short) => {
            return Err(copy_then_fail_verify(source, target, options, stages, cancel, short).await)
        }
    };
    read_back_during_copy(
        source,
        target,
        options,
        read_back,
        &verify.checksum,
        stages,
        cancel,
    )
    .await
}

/// The in-flight verified copy of a target that can be read back only once the copy has
/// finished it.
async fn read_back_after_copy<R, F>(
    source: Arc<dyn Source>,
    target: Arc<dyn Target>,
    options: &CopyOptions,
    verify: Verify<R>,
    stages: &Stages<'_>,
    cancel: &CancellationToken,
) -> std::result::Result<VerifiedCopy, StageError>
where
    R: FnOnce() -> F,
    F: Future<Output = Result<Arc<dyn Source>>>,
{
    let size = source.size();
    let tap = Arc::new(BlockTap::new(size));
    let report = copy_tapped(
        source,
        target,
        options,
        &stages.copy,
        cancel,
        Some(tap.clone()),
    )
    .await
    .map_err(StageError::in_copy)?;
    (stages.entered)(Stage::Verify);
    let started = Instant::now();
    let read_back = open_read_back(verify.read_back).await?;
    let read_back = prefix_view(read_back, size)
        .await
        .map_err(StageError::in_verify)?;
    let target_check = check_read_back(&read_back, &verify.checksum, stages, cancel).await;
    let verification = compare(&tap, target_check, &read_back.describe(), size, started)
        .map_err(StageError::in_verify)?;
    Ok(VerifiedCopy {
        copy: report,
        verification: Some(verification),
    })
}

/// A read-back shorter than the image, found before the copy: the copy still runs, and
/// the shortness is reported as the verify stage's failure once it has, as it would be
/// had the target been read back afterwards.
async fn copy_then_fail_verify(
    source: Arc<dyn Source>,
    target: Arc<dyn Target>,
    options: &CopyOptions,
    stages: &Stages<'_>,
    cancel: &CancellationToken,
    short: Error,
) -> StageError {
    if let Err(error) = copy_tapped(source, target, options, &stages.copy, cancel, None).await {
        return StageError::in_copy(error);
    }
    (stages.entered)(Stage::Verify);
    StageError::in_verify(short)
}

/// The in-flight verified copy of a target read back (through `read_back`, the image's
/// prefix) as the copy goes, each range once a checkpoint's flush covered it.
async fn read_back_during_copy(
    source: Arc<dyn Source>,
    target: Arc<dyn Target>,
    options: &CopyOptions,
    read_back: Arc<dyn Source>,
    checksum: &ChecksumOptions,
    stages: &Stages<'_>,
    cancel: &CancellationToken,
) -> std::result::Result<VerifiedCopy, StageError> {
    let size = source.size();
    let tap = Arc::new(BlockTap::new(size));
    let name = read_back.describe();
    let gate = Arc::new(Gate::new(stages.copy.clone()));
    let gated: Arc<dyn Source> = Arc::new(Gated::new(read_back.clone(), Arc::clone(&gate)));
    let copy_options = with_read_back_interval(options);
    let started = Instant::now();
    let copying = async {
        let result = copy_tapped(
            source,
            target,
            &copy_options,
            &stages.copy,
            cancel,
            Some(tap.clone()),
        )
        .await;
        if result.is_ok() {
            (stages.entered)(Stage::Verify);
        }
        gate.end();
        result
    };
    let (report, target_check) =
        tokio::join!(copying, check_read_back(&gated, checksum, stages, cancel));
    let report = report.map_err(StageError::in_copy)?;
    let verification =
        compare(&tap, target_check, &name, size, started).map_err(StageError::in_verify)?;
    Ok(VerifiedCopy {
        copy: report,
        verification: Some(verification),
    })
}

/// The copy's options with checkpoints at least every [`READ_BACK_INTERVAL`].
fn with_read_back_interval(options: &CopyOptions) -> CopyOptions {
    let mut copy_options = options.clone();
    if copy_options.checkpoint_interval.is_zero()
        || copy_options.checkpoint_interval > READ_BACK_INTERVAL
    {
        copy_options.checkpoint_interval = READ_BACK_INTERVAL;
    }
    copy_options
}

async fn open_read_back<R, F>(read_back: R) -> std::result::Result<Arc<dyn Source>, StageError>
where
    R: FnOnce() -> F,
    F: Future<Output = Result<Arc<dyn Source>>>,
{
    read_back().await.map_err(|e| StageError {
        stage: Stage::Verify,
        error: reworded(e, "verify: cannot open the target for reading"),
    })
}

/// The read-back target cut to the image's size; one that is smaller is corrupt.
async fn prefix_view(target: Arc<dyn Source>, size: u64) -> Result<Arc<dyn Source>> {
    if target.size() < size {
        let _ = target.close().await;
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "verify: the target {} reads back {} bytes, fewer than the source's {size}",
                target.describe(),
                target.size()
            ),
        ));
    }
    Ok(if target.size() == size {
        target
    } else {
        Arc::new(Prefix::new(target, size))
    })
}

/// The target's read-back check (see `blockcheck`), read back through `target`, which is
/// closed afterwards.
async fn check_read_back(
    target: &Arc<dyn Source>,
    options: &ChecksumOptions,
    stages: &Stages<'_>,
    cancel: &CancellationToken,
) -> Result<u64> {
    let check = read_back_check(target.clone(), options, &stages.verify, cancel).await;
    let _ = target.close().await;
    check.map_err(|e| reworded(e, "verify: reading the target back"))
}

/// Compares the target's read-back check with the tapped source's. When they are equal
/// the target holds the source's bytes, so its block hash is the source's.
fn compare(
    tap: &BlockTap,
    target: Result<u64>,
    name: &str,
    size: u64,
    started: Instant,
) -> Result<Verification> {
    let target = target?;
    let source = Digest {
        algorithm: HashAlgorithm::Blkhash,
        bytes: tap.finish()?.to_vec(),
    };
    if tap.check() != target {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "verify failed: the target {name} differs from the source \
                 (its first {size} bytes read back do not match the source, whose {} is {})",
                source.algorithm,
                source.hex()
            ),
        ));
    }
    Ok(Verification {
        target: source.clone(),
        source,
        elapsed: started.elapsed(),
    })
}

/// A verification when the digests are equal, else the corrupt error users see.
fn check_equal(
    source: Digest,
    target: Digest,
    name: &str,
    size: u64,
    started: Instant,
) -> Result<Verification> {
    if source != target {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "verify failed: the target {name} differs from the source \
                 ({} of the source {}, of the target's first {size} bytes {})",
                source.algorithm,
                source.hex(),
                target.hex()
            ),
        ));
    }
    Ok(Verification {
        source,
        target,
        elapsed: started.elapsed(),
    })
}

/// Hashes `source` and the first `source.size()` bytes of `target` (a target read back
/// after its flush) concurrently and fails with [`ErrorKind::Corrupt`] when they differ.
/// Closes `target`.
pub async fn verify_read_back(
    source: Arc<dyn Source>,
    target: Arc<dyn Source>,
    options: &ChecksumOptions,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<Verification> {
    let started = Instant::now();
    let name = target.describe();
    let size = source.size();
    let target = prefix_view(target, size).await?;
    let target_progress = Progress::new();
    let (source_digest, target_digest) = tokio::join!(
        checksum(source, options, progress, cancel),
        checksum(target.clone(), options, &target_progress, cancel),
    );
    let _ = target.close().await;
    let source_digest = source_digest.map_err(|e| reworded(e, "verify: checksum of the source"))?;
    let target_digest = target_digest.map_err(|e| reworded(e, "verify: checksum of the target"))?;
    check_equal(source_digest, target_digest, &name, size, started)
}

/// [`verify_read_back`] of several targets written from one source (a fan-out): the
/// source is hashed once, then each target read back, one after another. Each target comes
/// as the caller opened it for reading, or as the error that opening gave ("verify: cannot
/// read it back", of that error's kind). One result per target, in order; a target's
/// failure does not stop the others.
pub async fn verify_read_backs(
    source: Arc<dyn Source>,
    targets: Vec<Result<Arc<dyn Source>>>,
    options: &ChecksumOptions,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<Vec<Result<Verification>>> {
    let size = source.size();
    let source_digest = checksum(source, options, progress, cancel)
        .await
        .map_err(|e| reworded(e, "verify: checksum of the source"))?;
    let mut results = Vec::with_capacity(targets.len());
    for target in targets {
        let target = match target {
            Ok(target) => target,
            Err(e) => {
                results.push(Err(reworded(e, "verify: cannot read it back")));
                continue;
            }
        };
        let started = Instant::now();
        let name = target.describe();
        let result = async {
            let target = prefix_view(target, size).await?;
            let digest = checksum(target.clone(), options, &Progress::new(), cancel).await;
            let _ = target.close().await;
            let digest = digest.map_err(|e| reworded(e, "verify: checksum of the target"))?;
            check_equal(source_digest.clone(), digest, &name, size, started)
        }
        .await;
        results.push(result);
    }
    Ok(results)
}

/// `error` with `what` in front, keeping its kind (so cancellation stays cancellation and
/// a lost connection stays worth a retry).
fn reworded(error: Error, what: &str) -> Error {
    Error::new(error.kind(), format!("{what}: {error}"))
}

/// The first `size` bytes of a larger source.
pub struct Prefix {
    inner: Arc<dyn Source>,
    size: u64,
}

impl Prefix {
    pub fn new(inner: Arc<dyn Source>, size: u64) -> Self {
        let size = size.min(inner.size());
        Self { inner, size }
    }
}

impl fmt::Debug for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prefix")
            .field("inner", &self.inner.describe())
            .field("size", &self.size)
            .finish()
    }
}

#[async_trait]
impl Source for Prefix {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut extents = self.inner.extents(offset, end - offset).await?;
        extents.retain(|e| e.offset < end);
        for e in &mut extents {
            if e.end() > end {
                e.len = end - e.offset;
            }
        }
        Ok(extents)
    }

    async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        if offset.saturating_add(buf.len() as u64) > self.size {
            return Err(Error::invalid_input("read past the end of the prefix").at("read", offset));
        }
        self.inner.read_at(offset, buf).await
    }

    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Prefix {
            inner: self.inner.connect().await?,
            size: self.size,
        }))
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use ferry_testkit::{MemSource, RecordingTarget};

    const MIB: usize = 1 << 20;

    fn image() -> MemSource {
        let data = (0..3 * MIB + 4096)
            .map(|i| (i as u8).wrapping_mul(37) | 1)
            .collect();
        MemSource::new(data).with_holes(&[(MIB as u64, 2 * MIB as u64)])
    }

    struct Run {
        result: std::result::Result<VerifiedCopy, StageError>,
        stages: Vec<Stage>,
        read_backs: usize,
        reader: Arc<LiveReadBack>,
    }

    type Damage = Arc<dyn Fn(&mut Vec<u8>) + Send + Sync>;

    /// The target read back as it is at each read, through `damage`; records reads of
    /// bytes no flush had made durable yet and reads made before the target finished.
    struct LiveReadBack {
        target: RecordingTarget,
        damage: Damage,
        size: u64,
        undurable_reads: Mutex<Vec<(u64, u64)>>,
        reads_before_finish: AtomicUsize,
        reads: AtomicUsize,
    }

    impl LiveReadBack {
        fn new(target: RecordingTarget, damage: Damage) -> Self {
            let mut bytes = target.data();
            damage(&mut bytes);
            Self {
                size: bytes.len() as u64,
                target,
                damage,
                undurable_reads: Mutex::default(),
                reads_before_finish: AtomicUsize::new(0),
                reads: AtomicUsize::new(0),
            }
        }
    }

    #[async_trait]
    impl Source for LiveReadBack {
        fn describe(&self) -> String {
            "read-back".into()
        }
        fn size(&self) -> u64 {
            self.size
        }
        fn caps(&self) -> Caps {
            Caps {
                multi_conn: false,
                ..Caps::default()
            }
        }
        async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
            let end = offset + buf.len() as u64;
            self.reads.fetch_add(1, Ordering::SeqCst);
            if !self.target.durable_gaps(offset, end).is_empty() {
                self.undurable_reads.lock().push((offset, end));
            }
            if !self.target.is_finished() {
                self.reads_before_finish.fetch_add(1, Ordering::SeqCst);
            }
            let mut bytes = self.target.data();
            (self.damage)(&mut bytes);
            buf.copy_from_slice(&bytes[offset as usize..end as usize]);
            Ok(buf)
        }
        async fn connect(&self) -> Result<Arc<dyn Source>> {
            Err(Error::unsupported("one connection"))
        }
    }

    /// Copies `source` into `target` with verification, reading the target back live
    /// through `damage`.
    async fn run_with(
        source: &MemSource,
        target: &RecordingTarget,
        verify: Option<ChecksumOptions>,
        options: &CopyOptions,
        damage: impl Fn(&mut Vec<u8>) + Send + Sync + 'static,
    ) -> Run {
        let seen = Mutex::new(Vec::new());
        let entered = |s: Stage| seen.lock().push(s);
        let stages = Stages {
            copy: Progress::new(),
            verify: Progress::new(),
            entered: &entered,
        };
        let read_backs = AtomicUsize::new(0);
        let reader = Arc::new(LiveReadBack::new(target.clone(), Arc::new(damage)));
        let read_back = || async {
            read_backs.fetch_add(1, Ordering::SeqCst);
            if !target.caps().read_while_writing {
                assert!(target.is_finished(), "read back before the target finished");
            }
            Ok(Arc::clone(&reader) as Arc<dyn Source>)
        };
        let verify = verify.map(|checksum| Verify {
            checksum,
            read_back,
        });
        let result = copy_and_verify(
            Arc::new(source.clone()),
            Arc::new(target.clone()),
            options,
            verify,
            &stages,
            &CancellationToken::new(),
        )
        .await;
        Run {
            result,
            stages: seen.into_inner(),
            read_backs: read_backs.load(Ordering::SeqCst),
            reader,
        }
    }

    async fn run(
        source: &MemSource,
        target: &RecordingTarget,
        verify: bool,
        damage: impl Fn(&mut Vec<u8>) + Send + Sync + 'static,
    ) -> Run {
        let verify = verify.then(ChecksumOptions::default);
        let run = run_with(source, target, verify, &CopyOptions::default(), damage).await;
        assert!(
            run.reader.undurable_reads.lock().is_empty(),
            "read back unflushed bytes"
        );
        run
    }

    async fn digest(source: MemSource) -> Digest {
        checksum(
            Arc::new(source),
            &ChecksumOptions::default(),
            &Progress::new(),
            &CancellationToken::new(),
        )
        .await
        .unwrap()
    }

    /// A target larger than the image verifies: only its first `source size` bytes are
    /// hashed, though the rest holds other bytes.
    #[tokio::test]
    async fn a_larger_target_verifies_on_its_prefix() {
        let source = image();
        let target = RecordingTarget::new(source.len() + 5 * MIB as u64);
        let run = run(&source, &target, true, |_| {}).await;
        let done = run.result.unwrap();
        let v = done.verification.expect("verified");
        assert_eq!(v.source, v.target);
        assert_eq!(v.source, digest(source.clone()).await);
        assert_eq!(done.copy.size, source.len());
        assert_eq!(run.stages, [Stage::Copy, Stage::Verify]);
        assert_eq!(run.read_backs, 1);
        let data = target.data();
        assert_eq!(&data[..source.len() as usize], source.data());
        assert!(data[source.len() as usize..]
            .iter()
            .all(|&b| b == ferry_testkit::GARBAGE));
        // The whole larger target differs from the image: hashing all of it would fail.
        assert_ne!(digest(MemSource::new(data)).await, v.source);
    }

    /// A byte changed between the flush and the read-back, a target that lost its writes,
    /// or one that reads back short all fail the verify stage as corrupt.
    #[tokio::test]
    async fn a_mismatch_fails_the_verify_stage() {
        let source = image();
        type Damage = Box<dyn Fn(&mut Vec<u8>) + Send + Sync>;
        let cases: [(&str, Damage); 3] = [
            (
                "flipped",
                Box::new(|b: &mut Vec<u8>| b[2 * MIB + 17] ^= 0x40),
            ),
            ("dropped", Box::new(|b: &mut Vec<u8>| b.fill(0))),
            ("short", Box::new(|b: &mut Vec<u8>| b.truncate(MIB))),
        ];
        for (name, damage) in cases {
            let target = RecordingTarget::new(source.len() + MIB as u64);
            let run = run(&source, &target, true, damage).await;
            let err = run.result.expect_err(name);
            assert_eq!(err.stage, Stage::Verify, "{name}: {err}");
            assert_eq!(err.error.kind(), ErrorKind::Corrupt, "{name}: {err}");
            assert!(err.to_string().starts_with("verify"), "{name}: {err}");
            assert_eq!(run.stages, [Stage::Copy, Stage::Verify]);
        }
        let target = RecordingTarget::new(source.len());
        let err = run(&source, &target, true, |b| b[0] ^= 1)
            .await
            .result
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("verify failed"), "{text}");
        assert!(text.contains(&digest(source).await.hex()), "{text}");
    }

    /// Without verification the target is never read back; a failed copy is the copy
    /// stage's failure and nothing is read back either.
    #[tokio::test]
    async fn copy_only_and_copy_failures() {
        let source = image();
        let target = RecordingTarget::new(source.len());
        let run_plain = run(&source, &target, false, |_| {}).await;
        assert!(run_plain.result.unwrap().verification.is_none());
        assert_eq!(run_plain.read_backs, 0);
        assert_eq!(run_plain.stages, [Stage::Copy]);

        let failing = RecordingTarget::new(source.len()).fail_write_at(4096);
        let run_failing = run(&source, &failing, true, |_| {}).await;
        let err = run_failing.result.unwrap_err();
        assert_eq!(err.stage, Stage::Copy);
        assert_eq!(err.error.kind(), ErrorKind::Io);
        // The read-back handle is opened with the copy, but nothing was committed to read.
        assert_eq!(run_failing.reader.reads.load(Ordering::SeqCst), 0);
        assert_eq!(run_failing.stages, [Stage::Copy]);
    }

    /// A fan-out's read-backs: a target that matches passes, a damaged one and one that
    /// could not be opened fail alone (the open error keeps its kind), in the callers' order.
    #[tokio::test]
    async fn read_backs_fail_one_by_one() {
        let source = image();
        let mut damaged_bytes = source.data().to_vec();
        damaged_bytes[5] ^= 0xff;
        let good: Arc<dyn Source> = Arc::new(source.clone());
        let damaged: Arc<dyn Source> = Arc::new(MemSource::new(damaged_bytes));
        let unopened = Err(Error::new(ErrorKind::NotFound, "no such target"));
        let results = verify_read_backs(
            Arc::new(source.clone()),
            vec![Ok(good), unopened, Ok(damaged)],
            &ChecksumOptions::default(),
            &Progress::new(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(results.len(), 3);
        let passed = results[0].as_ref().unwrap();
        assert_eq!(passed.source, passed.target);
        let e = results[1].as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(
            e.to_string()
                .contains("verify: cannot read it back: no such target"),
            "{e}"
        );
        assert_eq!(results[2].as_ref().unwrap_err().kind(), ErrorKind::Corrupt);
    }

    /// The target is read back while the copy still writes it (a slow target, one worker:
    /// the copy takes about two seconds, eight checkpoints; the read-back reads 1 MiB at a
    /// time), never ahead of a flush; the source is read once.
    #[tokio::test]
    async fn the_target_is_read_back_during_the_copy_and_only_after_flushes() {
        let data: Vec<u8> = (0..16 * MIB).map(|i| (i % 253) as u8 | 1).collect();
        let source = MemSource::new(data);
        let target =
            RecordingTarget::new(source.len()).with_write_delay(Duration::from_millis(120));
        let options = CopyOptions {
            workers: 1,
            request_size: Some(MIB),
            ..CopyOptions::default()
        };
        let run = run_with(
            &source,
            &target,
            Some(ChecksumOptions {
                request_size: MIB,
                ..ChecksumOptions::default()
            }),
            &options,
            |_| {},
        )
        .await;
        let done = run.result.unwrap();
        let mut read = source.stats.reads();
        read.sort_unstable();
        let total: usize = read.iter().map(|r| r.1).sum();
        assert_eq!(
            total as u64,
            source.len(),
            "the source is read once: {read:?}"
        );
        let v = done.verification.unwrap();
        assert_eq!(v.source, digest(source.clone()).await);
        assert!(run.reader.undurable_reads.lock().is_empty());
        assert!(run.reader.reads_before_finish.load(Ordering::SeqCst) > 0);
        assert_eq!(run.stages, [Stage::Copy, Stage::Verify]);
    }

    /// A target that can only be read once finished (an S3 upload) is read back after
    /// the copy; plain SHA-256 takes the second pass over the source; both verify, and
    /// both still catch a damaged target.
    #[tokio::test]
    async fn finished_only_targets_and_sha256_verify_after_the_copy() {
        let source = image();
        let sha = ChecksumOptions {
            algorithm: HashAlgorithm::Sha256,
            ..ChecksumOptions::default()
        };
        let finished_only = Caps {
            read_while_writing: false,
            ..RecordingTarget::new(0).caps()
        };
        for (caps, checksum) in [
            (finished_only, ChecksumOptions::default()),
            (Caps::default(), sha.clone()),
            (finished_only, sha),
        ] {
            let target = RecordingTarget::new(source.len()).with_caps(caps);
            let run = run_with(
                &source,
                &target,
                Some(checksum.clone()),
                &CopyOptions::default(),
                |_| {},
            )
            .await;
            let v = run.result.unwrap().verification.unwrap();
            assert_eq!(v.source.algorithm, checksum.algorithm);
            assert_eq!(v.source, v.target);
            assert_eq!(run.reader.reads_before_finish.load(Ordering::SeqCst), 0);
            let target = RecordingTarget::new(source.len()).with_caps(caps);
            let run = run_with(
                &source,
                &target,
                Some(checksum),
                &CopyOptions::default(),
                |b| b[5] ^= 1,
            )
            .await;
            assert_eq!(run.result.unwrap_err().error.kind(), ErrorKind::Corrupt);
        }
    }

    #[tokio::test]
    async fn a_prefix_reads_and_reports_extents_only_within_its_size() {
        let inner: Arc<dyn Source> = Arc::new(image());
        let prefix = Prefix::new(inner, MIB as u64 + 100);
        assert_eq!(prefix.size(), MIB as u64 + 100);
        let extents = prefix.extents(0, 4 * MIB as u64).await.unwrap();
        assert_eq!(extents.last().unwrap().end(), MIB as u64 + 100);
        let buf = prefix.read_at(MIB as u64, IoBuf::new(100)).await.unwrap();
        assert_eq!(buf.len(), 100);
        assert!(prefix.read_at(MIB as u64, IoBuf::new(101)).await.is_err());
    }
}
