//! Copy, flush, then verify: the one copy-then-verify path of `ferry copy --verify` and of
//! the job service's transfers.
//!
//! The copy ends with the target's flush ([`copy`] finishes the target). Only then is the
//! target opened again for reading, through the caller's read-back function (a new handle:
//! what is hashed is what the endpoint stores, never a buffer of ferry's), and the block
//! hashes of the source and of the target's first `source size` bytes are compared. A
//! target larger than the image (an existing disk, a volume bigger than the image) verifies
//! when that prefix equals the source; the bytes past it are not the copy's business.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ferry_core::{Caps, Error, ErrorKind, Extent, IoBuf, Result, Source, Target};
use tokio_util::sync::CancellationToken;

use crate::{checksum, copy, ChecksumOptions, CopyOptions, CopyReport, Digest, Progress};

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

/// Copies `source` to `target` (which the copy flushes), then, when `verify` is given,
/// reads the target back and compares its first `source.size()` bytes with the source by
/// digest. A mismatch is an [`ErrorKind::Corrupt`] error of the [`Stage::Verify`] stage.
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
    let read_back = (verify.read_back)().await.map_err(|e| StageError {
        stage: Stage::Verify,
        error: reworded(e, "verify: cannot open the target for reading"),
    })?;
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
    if target.size() < size {
        let _ = target.close().await;
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "verify: the target {name} reads back {} bytes, fewer than the source's {size}",
                target.size()
            ),
        ));
    }
    let target: Arc<dyn Source> = if target.size() == size {
        target
    } else {
        Arc::new(Prefix::new(target, size))
    };
    let target_progress = Progress::new();
    let (source_digest, target_digest) = tokio::join!(
        checksum(source, options, progress, cancel),
        checksum(target.clone(), options, &target_progress, cancel),
    );
    let _ = target.close().await;
    let source_digest = source_digest.map_err(|e| reworded(e, "verify: checksum of the source"))?;
    let target_digest = target_digest.map_err(|e| reworded(e, "verify: checksum of the target"))?;
    if source_digest != target_digest {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "verify failed: the target {name} differs from the source \
                 ({} of the source {}, of the target's first {size} bytes {})",
                source_digest.algorithm,
                source_digest.hex(),
                target_digest.hex()
            ),
        ));
    }
    Ok(Verification {
        source: source_digest,
        target: target_digest,
        elapsed: started.elapsed(),
    })
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
    use std::sync::atomic::Ordering;

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
    }

    /// Copies `source` into `target` with verification, reading the target back through
    /// `damage` applied to its bytes after the copy finished (and flushed) it.
    async fn run(
        source: &MemSource,
        target: &RecordingTarget,
        verify: bool,
        damage: impl FnOnce(&mut Vec<u8>),
    ) -> Run {
        let seen = Mutex::new(Vec::new());
        let entered = |s: Stage| seen.lock().push(s);
        let stages = Stages {
            copy: Progress::new(),
            verify: Progress::new(),
            entered: &entered,
        };
        let read_backs = std::sync::atomic::AtomicUsize::new(0);
        let reader = target.clone();
        let read_back = || async {
            read_backs.fetch_add(1, Ordering::SeqCst);
            assert!(
                reader.is_finished(),
                "read back before the copy finished the target"
            );
            assert!(reader.flushes() > 0);
            let mut bytes = reader.data();
            damage(&mut bytes);
            Ok(Arc::new(MemSource::new(bytes)) as Arc<dyn Source>)
        };
        let verify = verify.then(|| Verify {
            checksum: ChecksumOptions::default(),
            read_back,
        });
        let result = copy_and_verify(
            Arc::new(source.clone()),
            Arc::new(target.clone()),
            &CopyOptions::default(),
            verify,
            &stages,
            &CancellationToken::new(),
        )
        .await;
        Run {
            result,
            stages: seen.into_inner(),
            read_backs: read_backs.load(Ordering::SeqCst),
        }
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
        type Damage = Box<dyn FnOnce(&mut Vec<u8>)>;
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
        assert_eq!(run_failing.read_backs, 0);
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
