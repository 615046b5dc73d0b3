//! Copies and hashes of a source whose size shows only at its end (a gzip stream nobody
//! gave the size of: [`Source::size_known`] is false).
//!
//! Such a source is read front to back by one reader anyway, so the copy is one loop:
//! read a request with [`Source::read_some`], split it into zero and data runs, write
//! the data and merge the zero runs across requests, until a read comes back short. The
//! end is then the image's size: a target that can grow takes it ([`Target::set_end`]);
//! one that cannot holds at most its own size (as a growing one holds at most what its
//! `size()` says), and a stream longer than that fails the copy with the lengths named
//! (nothing is reported as copied; the target is aborted). A shorter stream leaves
//! the bytes past it as they were, as a smaller source of known size does.
//!
//! The block hash (or SHA-256) needs the size only at its very end, so it is taken in
//! the same pass ([`StreamHash`]): the source's digest of a verified copy, and the whole
//! `ferry checksum` of such a source.

use std::sync::Arc;
use std::time::Instant;

use ferry_blkhash::{block_digest, sha256, Combiner, ZeroDigests, BLOCK_SIZE};
use ferry_core::{Error, ErrorKind, IoBuf, Result, Source, Target, ZeroMode};
use sha2::Digest as _;
use tokio_util::sync::CancellationToken;

use crate::copy::CopyReport;
use crate::geometry::Geometry;
use crate::options::{ChecksumOptions, CopyOptions, HashAlgorithm, DEFAULT_REQUEST_SIZE};
use crate::progress::{Checkpoint, Progress};
use crate::rate::RateLimiter;
use crate::zero::{scan, Run};

/// The block hash or SHA-256 of bytes handed over in order, the size given at the end.
pub(crate) enum StreamHash {
    Blkhash {
        combiner: Combiner,
        zeroes: ZeroDigests,
        /// The bytes of the block not yet complete.
        partial: Vec<u8>,
    },
    Sha256(Box<sha2::Sha256>),
}

impl std::fmt::Debug for StreamHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Blkhash { .. } => "StreamHash::Blkhash",
            Self::Sha256(_) => "StreamHash::Sha256",
        })
    }
}

impl StreamHash {
    pub fn new(algorithm: HashAlgorithm) -> Self {
        match algorithm {
            HashAlgorithm::Blkhash => Self::Blkhash {
                combiner: Combiner::default(),
                // Only the full-block digest is used: the short last block is hashed as
                // it is.
                zeroes: ZeroDigests::new(0),
                partial: Vec::with_capacity(BLOCK_SIZE),
            },
            HashAlgorithm::Sha256 => Self::Sha256(Box::default()),
        }
    }

    /// The next bytes of the image.
    pub fn update(&mut self, mut data: &[u8]) {
        match self {
            Self::Sha256(h) => h.update(data),
            Self::Blkhash {
                combiner,
                zeroes,
                partial,
            } => {
                if !partial.is_empty() {
                    let n = (BLOCK_SIZE - partial.len()).min(data.len());
                    partial.extend_from_slice(&data[..n]);
                    data = &data[n..];
                    if partial.len() == BLOCK_SIZE {
                        combiner.add(&block_digest(partial, zeroes));
                        partial.clear();
                    }
                }
                let mut blocks = data.chunks_exact(BLOCK_SIZE);
                for block in &mut blocks {
                    combiner.add(&block_digest(block, zeroes));
                }
                partial.extend_from_slice(blocks.remainder());
            }
        }
    }

    /// The digest of the `size` bytes handed over.
    pub fn finish(self, size: u64) -> Vec<u8> {
        match self {
            Self::Sha256(h) => h.finalize().to_vec(),
            Self::Blkhash {
                mut combiner,
                partial,
                ..
            } => {
                if !partial.is_empty() {
                    combiner.add(&sha256(&partial));
                }
                combiner.finish(size).to_vec()
            }
        }
    }
}

/// The request size a stream is read in: the copy's own choice, clamped to both ends'
/// block limits as every copy is.
fn request_size(
    source: &dyn Source,
    target: &dyn Target,
    options: &CopyOptions,
) -> Result<Geometry> {
    // The geometry's size is only used to cut work units, which this loop has none of.
    let mut options = options.clone();
    options.workers = 1;
    Geometry::new(u64::MAX, source.caps(), target.caps(), &options)
}

/// The error for a stream longer than the target can hold.
fn longer_than(target: &dyn Target) -> Error {
    let message = if target.can_grow() {
        format!(
            "the source is longer than the {} bytes this target takes of a source whose \
             size is not known before it is read: give the size with --source-size (or \
             count it with --prescan)",
            target.size()
        )
    } else {
        format!(
            "the source is longer than the target's {} bytes (its size was not known \
             before it was read): use a larger target, or one that can grow (a file, an S3 \
             object)",
            target.size()
        )
    };
    Error::new(ErrorKind::InvalidInput, message).with_endpoint(target.describe())
}

/// Copies `source`, whose size is not known, to `target`; hashes what it reads into
/// `hash` when given. On failure the target is aborted.
pub(crate) async fn copy_stream(
    source: Arc<dyn Source>,
    target: Arc<dyn Target>,
    options: &CopyOptions,
    progress: &Progress,
    cancel: &CancellationToken,
    hash: &mut Option<StreamHash>,
) -> Result<CopyReport> {
    let started = Instant::now();
    let result = async {
        options.validate()?;
        // A resumed attempt starts over: the stream must be decompressed from its start
        // to reach any offset, and what it holds may have changed.
        let geometry = request_size(source.as_ref(), target.as_ref(), options)?;
        progress.start(0, 0);
        let copied = tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(Error::cancelled()),
            r = stream_loop(&source, &target, options, &geometry, progress, hash) => r,
        }?;
        source.finish().await.map_err(|e| {
            e.with_operation("finish source")
                .with_endpoint(source.describe())
        })?;
        target.set_end(copied).await.map_err(|e| {
            e.with_operation("set_end")
                .with_endpoint(target.describe())
        })?;
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(Error::cancelled()),
            r = target.finish() => r.map_err(|e| e.with_operation("finish").with_endpoint(target.describe())),
        }?;
        progress.set_total(copied);
        progress.publish(Checkpoint {
            size: copied,
            committed: if copied == 0 { Vec::new() } else { vec![(0, copied)] },
        });
        Ok(copied)
    }
    .await;
    let size = match result {
        Ok(size) => size,
        Err(e) => {
            let _ = target.abort().await;
            return Err(e);
        }
    };
    let snap = progress.snapshot();
    Ok(CopyReport {
        size,
        data_bytes: snap.data_bytes,
        zero_bytes: snap.zero_bytes,
        elapsed: started.elapsed(),
        size_learned: true,
    })
}

/// The copy loop; returns the stream's length.
async fn stream_loop(
    source: &Arc<dyn Source>,
    target: &Arc<dyn Target>,
    options: &CopyOptions,
    geometry: &Geometry,
    progress: &Progress,
    hash: &mut Option<StreamHash>,
) -> Result<u64> {
    // A target that grows says how far it can (a file: without limit).
    let limit = target.size();
    let zero_mode = if options.sparse_size == 0 {
        ZeroMode::Allocate
    } else {
        options.zero_mode
    };
    let skip_zero =
        zero_mode == ZeroMode::MayDeallocate && (options.target_is_zero || target.is_zero());
    let rate = options
        .rate_limit
        .map(|rate| RateLimiter::new(rate, geometry.request as u64));
    let writer = Writer {
        target: target.as_ref(),
        progress,
        skip_zero,
        zero_mode,
    };
    let mut buf = IoBuf::new(geometry.request);
    let mut runs: Vec<Run> = Vec::new();
    let mut pending: Option<(u64, u64)> = None;
    let mut offset = 0u64;
    loop {
        if let Some(rate) = &rate {
            rate.acquire(geometry.request as u64).await;
        }
        buf.set_len(geometry.request);
        buf = source
            .read_some(offset, buf)
            .await
            .map_err(|e| e.at("read", offset).with_endpoint(source.describe()))?;
        let n = buf.len();
        if n == 0 {
            break;
        }
        let end = offset + n as u64;
        if end > limit {
            return Err(longer_than(target.as_ref()));
        }
        let last = n < geometry.request;
        if let Some(h) = hash.take() {
            let (h, b) = hash_chunk(h, buf).await?;
            *hash = Some(h);
            buf = b;
        }
        scan(
            &buf,
            offset,
            geometry.sparse,
            if last { end } else { u64::MAX },
            &mut runs,
        );
        for run in &runs {
            let at = offset + run.start as u64;
            let run_end = at + run.len as u64;
            if run.zero {
                pending = match pending {
                    Some((s, e)) if e == at => Some((s, run_end)),
                    Some((s, e)) => {
                        writer.zero(s, e).await?;
                        Some((at, run_end))
                    }
                    None => Some((at, run_end)),
                };
            } else {
                if let Some((s, e)) = pending.take() {
                    writer.zero(s, e).await?;
                }
                buf.set_view(run.start, run.len);
                buf = writer.write(at, buf).await?;
            }
        }
        offset = end;
        if last {
            break;
        }
    }
    if let Some((s, e)) = pending.take() {
        writer.zero(s, e).await?;
    }
    Ok(offset)
}

/// Hashes one chunk off the async worker (see `cpu`).
async fn hash_chunk(mut hash: StreamHash, buf: IoBuf) -> Result<(StreamHash, IoBuf)> {
    crate::cpu::run(move || {
        hash.update(&buf);
        (hash, buf)
    })
    .await
}

/// Writes to the target, with the context and progress every commit has.
struct Writer<'a> {
    target: &'a dyn Target,
    progress: &'a Progress,
    skip_zero: bool,
    zero_mode: ZeroMode,
}

impl Writer<'_> {
    async fn write(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let len = buf.len() as u64;
        let buf = self
            .target
            .write_at(offset, buf)
            .await
            .map_err(|e| e.at("write", offset).with_endpoint(self.target.describe()))?;
        self.progress.add_data(len);
        Ok(buf)
    }

    async fn zero(&self, start: u64, end: u64) -> Result<()> {
        if !self.skip_zero {
            self.target
                .write_zeroes(start, end - start, self.zero_mode)
                .await
                .map_err(|e| {
                    e.at("write_zeroes", start)
                        .with_endpoint(self.target.describe())
                })?;
        }
        self.progress.add_zero(end - start);
        Ok(())
    }
}

/// The checksum of a source whose size is not known, in one pass front to back.
/// Returns the digest and the size the source turned out to have.
pub(crate) async fn checksum_stream(
    source: &Arc<dyn Source>,
    options: &ChecksumOptions,
    progress: &Progress,
) -> Result<(Vec<u8>, u64)> {
    let request = options.request_size.max(DEFAULT_REQUEST_SIZE);

    let request = crate::geometry::read_request_size(&source.caps(), request as u64) as usize;
    progress.start(0, 0);
    let mut hash = StreamHash::new(options.algorithm);
    let mut buf = IoBuf::new(request);
    let mut offset = 0u64;
    loop {
        buf.set_len(request);
        buf = source
            .read_some(offset, buf)
            .await
            .map_err(|e| e.at("read", offset).with_endpoint(source.describe()))?;
        let n = buf.len();
        if n == 0 {
            break;
        }
        (hash, buf) = hash_chunk(hash, buf).await?;
        progress.add_data(n as u64);
        offset += n as u64;
        if n < request {
            break;
        }
    }
    source.finish().await.map_err(|e| {
        e.with_operation("finish source")
            .with_endpoint(source.describe())
    })?;
    progress.set_total(offset);
    Ok((hash.finish(offset), offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{checksum, copy, copy_and_verify, Stage, Stages, Verify};
    use ferry_blkhash::digest_bytes;
    use ferry_testkit::{MemSource, RecordingTarget, GARBAGE};

    /// An image of `len` bytes: data, a zero run across request boundaries, data, and
    /// zeroes to the end.
    fn image(len: usize) -> Vec<u8> {
        let mut data: Vec<u8> = (0..len).map(|i| (i % 253) as u8 | 1).collect();
        data[len / 4..len / 2].fill(0);
        data[len * 3 / 4..].fill(0);
        data
    }

    fn small_requests() -> CopyOptions {
        CopyOptions {
            request_size: Some(64 * 1024),
            ..CopyOptions::default()
        }
    }

    #[tokio::test]
    async fn a_stream_fills_a_larger_target_up_to_its_end_and_leaves_the_rest() {
        let data = image(1_000_003);
        let source = Arc::new(MemSource::new(data.clone()).with_unknown_size());
        let target = RecordingTarget::new(2_000_000);
        let progress = Progress::new();
        let report = copy(
            source,
            Arc::new(target.clone()),
            &small_requests(),
            &progress,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(report.size, data.len() as u64);
        assert!(report.size_learned);
        let held = target.data();
        assert!(held[..data.len()] == data[..]);
        assert!(held[data.len()..].iter().all(|&b| b == GARBAGE));
        assert!(target.is_finished());
        let snap = progress.snapshot();
        assert_eq!((snap.total, snap.done), (report.size, report.size));
        assert_eq!(progress.checkpoint().committed, vec![(0, report.size)]);
        // Half the image is zero, less the 4 KiB blocks its runs' edges cut.
        assert_eq!(report.zero_bytes + report.data_bytes, report.size);
        assert!(report.zero_bytes > 480_000, "{report:?}");
    }

    #[tokio::test]
    async fn a_stream_longer_than_a_fixed_target_fails_and_aborts_it() {
        let source = Arc::new(MemSource::new(image(300_000)).with_unknown_size());
        let target = RecordingTarget::new(200_000);
        let err = copy(
            source,
            Arc::new(target.clone()),
            &small_requests(),
            &Progress::new(),
            &CancellationToken::new(),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(
            err.to_string()
                .contains("the source is longer than the target's 200000 bytes"),
            "{err}"
        );
        assert!(target.is_aborted() && !target.is_finished());
    }

    #[tokio::test]
    async fn checksum_and_verified_copy_of_a_stream_are_the_images_block_hash() {
        let data = image(700_001);
        let want = digest_bytes(&data).to_vec();
        let source = Arc::new(MemSource::new(data.clone()).with_unknown_size());
        let progress = Progress::new();
        let digest = checksum(
            source.clone(),
            &ChecksumOptions::default(),
            &progress,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(digest.bytes, want);
        assert_eq!(progress.snapshot().total, data.len() as u64);

        let target = RecordingTarget::new(800_000);
        let read_back: Arc<dyn Source> = Arc::new(MemSource::new(data.clone()));
        let stages = Stages {
            copy: Progress::new(),
            verify: Progress::new(),
            entered: &|_: Stage| {},
        };
        let done = copy_and_verify(
            source,
            Arc::new(target),
            &small_requests(),
            Some(Verify {
                checksum: ChecksumOptions::default(),
                read_back: || async move { Ok(read_back) },
            }),
            &stages,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        let v = done.verification.unwrap();
        assert_eq!(v.source.bytes, want);
        assert_eq!(v.target.bytes, want);
    }

    #[test]
    fn the_stream_hash_is_the_block_hash_however_the_bytes_are_cut() {
        let mut data = vec![0u8; 5 * BLOCK_SIZE + 1234];
        for (i, b) in data.iter_mut().enumerate().skip(BLOCK_SIZE) {
            *b = (i % 251) as u8;
        }
        data[2 * BLOCK_SIZE..3 * BLOCK_SIZE].fill(0);
        let want = digest_bytes(&data).to_vec();
        for cut in [
            1usize,
            1000,
            BLOCK_SIZE - 1,
            BLOCK_SIZE,
            3 * BLOCK_SIZE + 7,
            data.len(),
        ] {
            let mut h = StreamHash::new(HashAlgorithm::Blkhash);
            for piece in data.chunks(cut) {
                h.update(piece);
            }
            assert_eq!(h.finish(data.len() as u64), want, "cut {cut}");
        }
        let mut h = StreamHash::new(HashAlgorithm::Sha256);
        h.update(&data);
        assert_eq!(h.finish(0), sha256(&data).to_vec());
        assert_eq!(
            StreamHash::new(HashAlgorithm::Blkhash).finish(0),
            digest_bytes(&[]).to_vec()
        );
    }
}
