//! The checksum engine: reads chunks concurrently (none for zero extents), hashes them on
//! a bounded number of blocking threads and combines the results in order.
//!
//! Both algorithms share the chunk plan and the reads; the block hash hashes each chunk
//! independently in parallel, plain SHA-256 feeds chunks in order to one hasher.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ferry_blkhash::{block_digest, to_hex, Combiner, Hash, ZeroDigests, BLOCK_SIZE};
use ferry_core::{Error, ExtentKind, IoBuf, Result, Source};
use futures::stream::{self, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::blockcheck::block_value;
use crate::geometry::{round_down, round_up};
use crate::hashers::Hashers;
use crate::options::{ChecksumOptions, HashAlgorithm};
use crate::pool::BufPool;
use crate::progress::Progress;
use crate::sha256::hash_in_order;

/// How far ahead of the chunk being planned the extents are asked for.
const EXTENTS_LOOKAHEAD: u64 = 1 << 30;

/// A digest and the algorithm that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    pub algorithm: HashAlgorithm,
    pub bytes: Vec<u8>,
}

impl Digest {
    /// Lower-case hex, as sha256sum and blksum print it.
    pub fn hex(&self) -> String {
        to_hex(&self.bytes)
    }
}

/// Computes the checksum of the whole source.
pub async fn checksum(
    source: Arc<dyn Source>,
    options: &ChecksumOptions,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<Digest> {
    options.validate()?;
    if !source.size_known() {
        let work = crate::stream::checksum_stream(&source, options, progress);
        return tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(Error::cancelled()),
            r = work => r.map(|(bytes, _)| Digest {
                algorithm: options.algorithm,
                bytes,
            }),
        };
    }
    let work = async {
        let size = source.size();
        progress.start(size, 0);
        let plan = ChunkPlanner::new(Arc::clone(&source), options.request_size)?;
        let bytes = match options.algorithm {
            HashAlgorithm::Blkhash => blkhash(&source, plan, options, progress).await?,
            HashAlgorithm::Sha256 => sha256(&source, plan, options, progress).await?,
        };
        Ok(Digest {
            algorithm: options.algorithm,
            bytes: bytes.to_vec(),
        })
    };
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(Error::cancelled()),
        r = work => r,
    }
}

/// The read-back check of the whole source (see `blockcheck`): the same chunk plan and
/// reads as [`checksum`] (none for zero extents), CRC-64 per block instead of SHA-256.
pub(crate) async fn read_back_check(
    source: Arc<dyn Source>,
    options: &ChecksumOptions,
    progress: &Progress,
    cancel: &CancellationToken,
) -> Result<u64> {
    options.validate()?;
    let work = async {
        progress.start(source.size(), 0);
        let plan = ChunkPlanner::new(Arc::clone(&source), options.request_size)?;
        let max_read = plan.max_read;
        let pool = BufPool::new(plan.chunk as usize);
        let readers = Readers::open(&source, options).await?;
        let results = plan
            .into_stream()
            .map(|chunk| {
                let (pool, readers) = (&pool, &readers);
                async move {
                    let chunk = chunk?;
                    let read_bytes = chunk.read_bytes();
                    if chunk.reads.is_empty() {
                        return Ok((chunk.len as u64, 0, read_bytes));
                    }
                    let buf = read_chunk(readers.pick(), &chunk, max_read, pool, false).await?;
                    // Cheap next to the read: computed here, while the bytes are cached.
                    let value = chunk_check(&buf, &chunk);
                    pool.put(buf);
                    Ok::<_, Error>((chunk.len as u64, value, read_bytes))
                }
            })
            .buffered(readers.count);
        let mut results = std::pin::pin!(results);
        let mut sum = 0u64;
        while let Some(result) = results.next().await {
            let (len, value, read_bytes) = result?;
            sum = sum.wrapping_add(value);
            progress.add_data(read_bytes);
            progress.add_zero(len - read_bytes);
        }
        Ok(sum)
    };
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(Error::cancelled()),
        r = work => r,
    }
}

/// The check of one chunk; blocks outside the read ranges are known zero (value 0). The
/// blocks it reads are those [`hash_blocks`] hashes.
fn chunk_check(buf: &[u8], chunk: &Chunk) -> u64 {
    let first = chunk.offset / BLOCK_SIZE as u64;
    let mut reads = chunk.reads.iter().peekable();
    let mut sum = 0u64;
    for (i, block) in buf.chunks(BLOCK_SIZE).enumerate() {
        let start = i * BLOCK_SIZE;
        while reads.next_if(|r| r.1 <= start).is_some() {}
        match reads.peek() {
            Some(&&(s, _)) if s < start + block.len() => {
                sum = sum.wrapping_add(block_value(first + i as u64, block));
            }
            Some(_) => {}
            None => break,
        }
    }
    sum
}

/// A chunk of the image: which of its bytes must be read (the rest is known zero).
#[derive(Debug)]
struct Chunk {
    offset: u64,
    len: usize,
    /// Byte ranges relative to the chunk start, sorted.
    reads: Vec<(usize, usize)>,
}

impl Chunk {
    fn read_bytes(&self) -> u64 {
        self.reads.iter().map(|(s, e)| (e - s) as u64).sum()
    }
}

/// Cuts the image into chunks of whole blocks and marks the blocks that lie entirely in
/// zero extents, asking the source for extents a bounded distance ahead.
struct ChunkPlanner {
    source: Arc<dyn Source>,
    size: u64,
    chunk: u64,
    align: u64,
    max_read: u64,
    next: u64,
    /// Known extents from `next` on: (start, end, zero).
    extents: std::collections::VecDeque<(u64, u64, bool)>,
    covered: u64,
}

impl ChunkPlanner {
    fn new(source: Arc<dyn Source>, request_size: usize) -> Result<Self> {
        let caps = source.caps();
        let align = u64::from(caps.block.minimum.max(1));
        let grain = if (BLOCK_SIZE as u64).is_multiple_of(align) {
            BLOCK_SIZE as u64
        } else {
            round_up(BLOCK_SIZE as u64, align)
        };
        let max_read = round_down(u64::from(caps.block.maximum), align);
        if max_read == 0 {
            return Err(Error::invalid_input(format!(
                "the source allows no read: maximum request {} below its alignment {align}",
                caps.block.maximum
            ))
            .with_endpoint(source.describe()));
        }
        Ok(Self {
            size: source.size(),
            chunk: round_up((request_size as u64).max(1), grain),
            align,
            max_read,
            next: 0,
            extents: Default::default(),
            covered: 0,
            source,
        })
    }

    async fn next_chunk(&mut self) -> Result<Option<Chunk>> {
        if self.next >= self.size {
            return Ok(None);
        }
        let start = self.next;
        let mut end = (start + self.chunk).min(self.size);
        while self.covered < end {
            self.fetch_extents(end).await?;
        }
        while self.extents.front().is_some_and(|e| e.1 <= start) {
            self.extents.pop_front();
        }
        if self.known_zero(start, end) {
            end = self.zero_run_end(end);
            self.next = end;
            return Ok(Some(Chunk {
                offset: start,
                len: (end - start) as usize,
                reads: Vec::new(),
            }));
        }
        self.next = end;
        let mut reads: Vec<(usize, usize)> = Vec::new();
        let mut block = start;
        while block < end {
            let block_end = (block + BLOCK_SIZE as u64).min(end);
            while self.extents.front().is_some_and(|e| e.1 <= block) {
                self.extents.pop_front();
            }
            if !self.known_zero(block, block_end) {
                let s = round_down(block, self.align).max(start);
                let e = round_up(block_end, self.align).min(end);
                let (s, e) = ((s - start) as usize, (e - start) as usize);
                match reads.last_mut() {
                    Some(last) if last.1 >= s => last.1 = last.1.max(e),
                    _ => reads.push((s, e)),
                }
            }
            block = block_end;
        }
        Ok(Some(Chunk {
            offset: start,
            len: (end - start) as usize,
            reads,
        }))
    }

    /// Where a zero run that covers `[.., end)` may stop: the end of its known zero extent,
    /// on the chunk grid (so later chunks keep their alignment), or the image's end. One plan
    /// item then stands for a whole run instead of one per chunk.
    fn zero_run_end(&self, end: u64) -> u64 {
        let extent_end = self.extents.front().map_or(end, |e| e.1);
        if extent_end >= self.size {
            self.size
        } else {
            round_down(extent_end, self.chunk).max(end)
        }
    }

    /// Whether `[start, end)` lies in one zero extent. Extents ending before `start` have
    /// been dropped, so only the first can cover it: blocks are planned in order.
    fn known_zero(&self, start: u64, end: u64) -> bool {
        self.extents
            .front()
            .is_some_and(|e| e.0 <= start && e.2 && end <= e.1)
    }

    async fn fetch_extents(&mut self, need: u64) -> Result<()> {
        let from = self.covered;
        let until = need
            .max(from.saturating_add(EXTENTS_LOOKAHEAD))
            .min(self.size);
        let describe = || self.source.describe();
        let extents = self
            .source
            .extents(from, until - from)
            .await
            .map_err(|e| e.at("extents", from).with_endpoint(describe()))?;
        if extents.is_empty() {
            return Err(Error::protocol("the source's extents are empty")
                .at("extents", from)
                .with_endpoint(describe()));
        }
        for e in extents {
            if e.offset != self.covered || e.len == 0 {
                return Err(Error::protocol("the source's extents are not contiguous")
                    .at("extents", from)
                    .with_endpoint(describe()));
            }
            let end = e.offset.saturating_add(e.len).min(until);
            let zero = matches!(e.kind, ExtentKind::Zero);
            match self.extents.back_mut() {
                Some(last) if last.2 == zero && last.1 == e.offset => last.1 = end,
                _ => self.extents.push_back((e.offset, end, zero)),
            }
            self.covered = end;
            if end == until {
                break;
            }
        }
        Ok(())
    }

    fn into_stream(self) -> impl futures::Stream<Item = Result<Chunk>> {
        stream::unfold(Some(self), |planner| async move {
            let mut planner = planner?;
            match planner.next_chunk().await {
                Ok(Some(chunk)) => Some((Ok(chunk), Some(planner))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        })
    }
}

/// The handles chunks are read through, one per chunk read at once: a source that can
/// only be read front to back gets one; a server that allows several connections
/// (NBD multi-conn) gets one connection per reader, as the copy's workers do, so reads
/// are not queued behind each other on one socket.
struct Readers {
    handles: Vec<Arc<dyn Source>>,
    next: AtomicUsize,
    /// Chunks read at once.
    count: usize,
}

impl Readers {
    async fn open(source: &Arc<dyn Source>, options: &ChecksumOptions) -> Result<Self> {
        let caps = source.caps();
        let count = if caps.sequential_read {
            1
        } else {
            options.workers
        };
        let mut handles = vec![Arc::clone(source)];
        if caps.multi_conn {
            while handles.len() < count {
                let handle = source
                    .connect()
                    .await
                    .map_err(|e| e.with_operation("connect").with_endpoint(source.describe()))?;
                handles.push(handle);
            }
        }
        Ok(Self {
            handles,
            next: AtomicUsize::new(0),
            count,
        })
    }

    /// The handle for the next chunk, in turn.
    fn pick(&self) -> &dyn Source {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        &*self.handles[i]
    }
}

/// Reads the chunk's data ranges into a pooled buffer; with `zero_fill`, also clears the
/// known-zero ranges so the buffer holds the chunk's exact bytes.
async fn read_chunk(
    source: &dyn Source,
    chunk: &Chunk,
    max_read: u64,
    pool: &BufPool,
    zero_fill: bool,
) -> Result<IoBuf> {
    let mut buf = pool.get(chunk.len);
    let mut pos = 0;
    for &(s, e) in &chunk.reads {
        if zero_fill && s > pos {
            buf.set_view(pos, s - pos);
            buf.fill(0);
        }
        let mut at = s;
        while at < e {
            let n = (e - at).min(max_read as usize);
            buf.set_view(at, n);
            let offset = chunk.offset + at as u64;
            buf = source
                .read_at(offset, buf)
                .await
                .map_err(|err| err.at("read", offset).with_endpoint(source.describe()))?;
            at += n;
        }
        pos = e;
    }
    if zero_fill && pos < chunk.len {
        buf.set_view(pos, chunk.len - pos);
        buf.fill(0);
    }
    buf.set_len(chunk.len);
    Ok(buf)
}

async fn blkhash(
    source: &Arc<dyn Source>,
    plan: ChunkPlanner,
    options: &ChecksumOptions,
    progress: &Progress,
) -> Result<Hash> {
    let size = plan.size;
    let max_read = plan.max_read;
    let zeroes = ZeroDigests::new(size);
    let pool = BufPool::new(plan.chunk as usize);
    let hashers = Hashers::new(options.threads)?;
    let readers = Readers::open(source, options).await?;
    let results = plan
        .into_stream()
        .map(|chunk| {
            let (pool, hashers, readers) = (&pool, &hashers, &readers);
            async move {
                let chunk = chunk?;
                let read_bytes = chunk.read_bytes();
                if chunk.reads.is_empty() {
                    return Ok((chunk, BlockDigests::Zero, read_bytes));
                }
                let buf = read_chunk(readers.pick(), &chunk, max_read, pool, false).await?;
                let (buf, chunk, digests) = hashers
                    .run(move || {
                        let digests = BlockDigests::Each(hash_blocks(&buf, &chunk, &zeroes));
                        (buf, chunk, digests)
                    })
                    .await?;
                pool.put(buf);
                Ok::<_, Error>((chunk, digests, read_bytes))
            }
        })
        .buffered(readers.count);
    let mut results = std::pin::pin!(results);
    let mut combiner = Combiner::default();
    while let Some(result) = results.next().await {
        let (chunk, digests, read_bytes) = result?;
        match digests {
            BlockDigests::Each(digests) => combiner.add_all(&digests),
            BlockDigests::Zero => {
                let len = chunk.len as u64;
                let block = BLOCK_SIZE as u64;
                combiner.add_run(&zeroes.for_len(BLOCK_SIZE), len / block);
                let tail = (len % block) as usize;
                if tail != 0 {
                    combiner.add(&zeroes.for_len(tail));
                }
            }
        }
        progress.add_data(read_bytes);
        progress.add_zero(chunk.len as u64 - read_bytes);
    }
    Ok(combiner.finish(size))
}

/// What a chunk contributes to the outer hash.
enum BlockDigests {
    /// Every block is zero (the chunk may be a long run: see `ChunkPlanner::zero_run_end`).
    Zero,
    /// One digest per block, in order.
    Each(Vec<Hash>),
}

/// Block digests of one chunk; blocks outside the read ranges are known zero.
fn hash_blocks(buf: &[u8], chunk: &Chunk, zeroes: &ZeroDigests) -> Vec<Hash> {
    let mut reads = chunk.reads.iter().peekable();
    buf.chunks(BLOCK_SIZE)
        .enumerate()
        .map(|(i, block)| {
            let start = i * BLOCK_SIZE;
            while reads.next_if(|r| r.1 <= start).is_some() {}
            match reads.peek() {
                Some(&&(s, _)) if s < start + block.len() => block_digest(block, zeroes),
                _ => zeroes.for_len(block.len()),
            }
        })
        .collect()
}

async fn sha256(
    source: &Arc<dyn Source>,
    plan: ChunkPlanner,
    options: &ChecksumOptions,
    progress: &Progress,
) -> Result<Hash> {
    let max_read = plan.max_read;
    let pool = BufPool::new(plan.chunk as usize);
    let readers = Readers::open(source, options).await?;
    let chunks = plan
        .into_stream()
        .map(|chunk| {
            let (pool, readers) = (&pool, &readers);
            async move {
                let chunk = chunk?;
                let read_bytes = chunk.read_bytes();
                let buf = if chunk.reads.is_empty() {
                    None
                } else {
                    Some(read_chunk(readers.pick(), &chunk, max_read, pool, true).await?)
                };
                Ok::<_, Error>((chunk, buf, read_bytes))
            }
        })
        .buffered(readers.count);
    // Reads run ahead in `buffered`; two chunks queued keep the hasher busy.
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    let produce = async {
        let mut chunks = std::pin::pin!(chunks);
        while let Some(item) = chunks.next().await {
            let (chunk, buf, read_bytes) = item?;
            progress.add_data(read_bytes);
            progress.add_zero(chunk.len as u64 - read_bytes);
            tx.send((chunk.len, buf))
                .await
                .map_err(|_| Error::internal("the hashing stage stopped"))?;
        }
        drop(tx);
        Ok::<_, Error>(())
    };
    let ((), digest) = tokio::try_join!(produce, hash_in_order(rx, &pool))?;
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use ferry_blkhash::digest_bytes;
    use ferry_core::{BlockSizes, Caps, ErrorKind, Extent};
    use ferry_testkit::MemSource;
    use proptest::prelude::*;
    use sha2::Digest as _;

    const B: usize = BLOCK_SIZE;

    /// An image of zeroes of any size that holds no memory; reports one zero extent, or
    /// only data when `extents` is false (so every block is read and found zero).
    #[derive(Debug)]
    struct Zeroes {
        size: u64,
        extents: bool,
    }

    #[async_trait]
    impl Source for Zeroes {
        fn describe(&self) -> String {
            "zeroes".into()
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
        async fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
            Ok(vec![if self.extents {
                Extent::zero(offset, len)
            } else {
                Extent::data(offset, len)
            }])
        }
        async fn read_at(&self, _offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
            buf.fill(0);
            Ok(buf)
        }
        async fn connect(&self) -> Result<Arc<dyn Source>> {
            Err(Error::unsupported("one handle"))
        }
    }

    async fn sum(source: impl Source, options: &ChecksumOptions) -> Result<String> {
        checksum(
            Arc::new(source),
            options,
            &Progress::new(),
            &CancellationToken::new(),
        )
        .await
        .map(|d| d.hex())
    }

    async fn blk(source: impl Source) -> String {
        sum(source, &ChecksumOptions::default()).await.unwrap()
    }

    fn with_hole(data: Vec<u8>) -> MemSource {
        let len = data.len() as u64;
        MemSource::new(data).with_holes(&[(0, len)])
    }

    #[tokio::test]
    async fn field_notes_vectors() {
        let a = |n: usize| MemSource::new(vec![b'A'; n]);
        let z = |n: usize| MemSource::new(vec![0; n]);
        let cases: [(MemSource, &str); 6] = [
            (
                a(B),
                "2e3a5f57d5e726ee5de62db1a85ff816f4fa6ea4627807d9a51bdc4c883e165e",
            ),
            (
                z(B),
                "8ab067ab7939a3d4f40cbb118956c07c06aeae2d075d6e0a2ebbb94bd42832af",
            ),
            (
                a(B / 2),
                "9467334d6d7668a2f06898185b5cddc78cdfbd962f50c6bf250101f03a0e54dc",
            ),
            (
                z(B / 2),
                "842d185f0ff348b0d689e184bddc47f69a19032a6934c89b879479f1e86f9d56",
            ),
            (
                z(8 * B),
                "722ac11a3a81034edf196aa3ee68d1a2e345cd0838b0c78c2ce2fb015d4d817d",
            ),
            (
                z(8 * B + B / 2),
                "e623a5702b1feb08fbb3d18e35bbb7ec10146b8cd1bcff811200a3948c78c55c",
            ),
        ];
        for (source, expected) in cases {
            let data = source.data().to_vec();
            assert_eq!(blk(source).await, expected);
            if data.iter().all(|&b| b == 0) {
                // the same image as a hole: no read at all
                let hole = with_hole(data);
                let stats = Arc::clone(&hole.stats);
                assert_eq!(blk(hole).await, expected);
                assert!(stats.reads().is_empty());
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_gib_of_zeroes() {
        const EXPECTED: &str = "c6d6562c3074a2caa0ceea3e1f460f3af678c792ed05e64157eb51e68ae5260d";
        for extents in [true, false] {
            let progress = Progress::new();
            let digest = checksum(
                Arc::new(Zeroes {
                    size: 1 << 30,
                    extents,
                }),
                &ChecksumOptions::default(),
                &progress,
                &CancellationToken::new(),
            )
            .await
            .unwrap();
            assert_eq!(digest.hex(), EXPECTED);
            assert_eq!(digest.algorithm, HashAlgorithm::Blkhash);
            let snap = progress.snapshot();
            assert_eq!(snap.data_bytes + snap.zero_bytes, 1 << 30);
            assert_eq!(snap.zero_bytes, if extents { 1 << 30 } else { 0 });
        }
    }

    #[tokio::test]
    async fn a_zero_run_is_one_plan_item_on_the_chunk_grid() {
        async fn plan(source: impl Source, request: usize) -> Vec<(u64, usize, bool)> {
            let planner = ChunkPlanner::new(Arc::new(source), request).unwrap();
            let chunks: Vec<_> = planner.into_stream().collect().await;
            let chunks = chunks.into_iter().map(Result::unwrap);
            chunks
                .map(|c| (c.offset, c.len, c.reads.is_empty()))
                .collect()
        }
        let empty = Zeroes {
            size: (1 << 30) + 5,
            extents: true,
        };
        // Extents are asked for a lookahead at a time, so a run stops at its end.
        let lookahead = EXTENTS_LOOKAHEAD as usize;
        let expected = [(0, lookahead, true), (lookahead as u64, 5, true)];
        assert_eq!(plan(empty, B).await, expected);
        // data | 10 blocks of hole | data, in 2-block chunks: the run ends on the grid.
        let source = MemSource::new(vec![7; 16 * B]).with_holes(&[(B as u64, 11 * B as u64)]);
        let items = plan(source, 2 * B).await;
        let expected = [
            (0, 2 * B, false),
            (2 * B as u64, 8 * B, true),
            (10 * B as u64, 2 * B, false),
            (12 * B as u64, 2 * B, false),
            (14 * B as u64, 2 * B, false),
        ];
        assert_eq!(items, expected);
    }

    #[tokio::test]
    async fn sha256_matches_sha256sum() {
        let opts = ChecksumOptions {
            algorithm: HashAlgorithm::Sha256,
            ..ChecksumOptions::default()
        };
        assert_eq!(
            sum(MemSource::new(b"abc".to_vec()), &opts).await.unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sum(MemSource::new(Vec::new()), &opts).await.unwrap(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[tokio::test]
    async fn respects_source_block_sizes() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let source = MemSource::new(data.clone()).with_caps(Caps {
            block: BlockSizes {
                minimum: 512,
                preferred: 512,
                maximum: 24 * 1024,
            },
            ..Caps::default()
        });
        let stats = Arc::clone(&source.stats);
        assert_eq!(blk(source).await, to_hex(&digest_bytes(&data)));
        for &(offset, len) in stats.reads().iter() {
            assert!(len <= 24 * 1024 && offset % 512 == 0, "{offset}+{len}");
        }
    }

    #[tokio::test]
    async fn read_errors_carry_context_and_cancel_is_prompt() {
        let hanging = MemSource::new(vec![1; 4 * B]).hang_from(0);
        let cancel = CancellationToken::new();
        let task = tokio::spawn({
            let cancel = cancel.clone();
            async move {
                checksum(
                    Arc::new(hanging),
                    &ChecksumOptions::default(),
                    &Progress::new(),
                    &cancel,
                )
                .await
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        cancel.cancel();
        let err = tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("cancellation was not prompt")
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled);
        // a read past the source's end is refused by the source: the error says where
        let short = MemSource::new(vec![1; 10]).with_extents(vec![Extent::data(0, 10)]);
        let broken = Truncated(short);
        let err = sum(broken, &ChecksumOptions::default()).await.unwrap_err();
        assert_eq!(err.context().operation, Some("read"));
        assert_eq!(err.context().offset, Some(0));
        assert_eq!(err.context().endpoint.as_deref(), Some("mem-source"));
    }

    /// One handle of a multi-conn source: reads are served from shared data and record
    /// which handle served them.
    struct Handle {
        data: MemSource,
        id: usize,
        opened: Arc<AtomicUsize>,
        served: Arc<parking_lot::Mutex<std::collections::BTreeSet<usize>>>,
    }

    #[async_trait]
    impl Source for Handle {
        fn describe(&self) -> String {
            "handles".into()
        }
        fn size(&self) -> u64 {
            self.data.size()
        }
        fn caps(&self) -> Caps {
            Caps::default()
        }
        async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
            self.served.lock().insert(self.id);
            self.data.read_at(offset, buf).await
        }
        async fn connect(&self) -> Result<Arc<dyn Source>> {
            Ok(Arc::new(Handle {
                data: self.data.clone(),
                id: self.opened.fetch_add(1, Ordering::Relaxed) + 1,
                opened: Arc::clone(&self.opened),
                served: Arc::clone(&self.served),
            }))
        }
    }

    #[tokio::test]
    async fn a_multi_conn_source_is_read_through_one_handle_per_reader() {
        let data: Vec<u8> = (0..64 * B).map(|i| (i % 251) as u8 | 1).collect();
        let expected = blk(MemSource::new(data.clone())).await;
        for algorithm in [HashAlgorithm::Blkhash, HashAlgorithm::Sha256] {
            let source = Handle {
                data: MemSource::new(data.clone()),
                id: 0,
                opened: Arc::new(AtomicUsize::new(0)),
                served: Arc::default(),
            };
            let (opened, served) = (Arc::clone(&source.opened), Arc::clone(&source.served));
            let options = ChecksumOptions {
                algorithm,
                workers: 4,
                request_size: B,
                ..ChecksumOptions::default()
            };
            let got = sum(source, &options).await.unwrap();
            if algorithm == HashAlgorithm::Blkhash {
                assert_eq!(got, expected);
            } else {
                assert_eq!(got, to_hex(&sha2::Sha256::digest(&data)));
            }
            assert_eq!(opened.load(Ordering::Relaxed), 3, "{algorithm:?}");
            assert_eq!(
                served.lock().iter().copied().collect::<Vec<_>>(),
                vec![0, 1, 2, 3],
                "{algorithm:?}"
            );
        }
    }

    /// Claims to be larger than its data, so reads fail.
    struct Truncated(MemSource);

    #[async_trait]
    impl Source for Truncated {
        fn describe(&self) -> String {
            self.0.describe()
        }
        fn size(&self) -> u64 {
            100
        }
        fn caps(&self) -> Caps {
            Caps {
                multi_conn: false,
                ..Caps::default()
            }
        }
        async fn read_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
            self.0.read_at(offset, buf).await
        }
        async fn connect(&self) -> Result<Arc<dyn Source>> {
            Err(Error::unsupported("one handle"))
        }
    }

    fn image() -> impl Strategy<Value = (Vec<u8>, Vec<(u64, u64)>)> {
        let sizes = prop_oneof![
            Just(0usize),
            Just(1),
            Just(B - 1),
            Just(B),
            Just(B + 1),
            0usize..(5 * B + 3),
        ];
        (
            sizes,
            any::<u64>(),
            prop::collection::vec((0u8..3, 1usize..(2 * B)), 0..10),
        )
            .prop_map(|(size, seed, runs)| {
                let mut x = seed | 1;
                let mut data: Vec<u8> = (0..size)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                let mut holes = Vec::new();
                let mut pos = 0;
                for (kind, len) in runs {
                    let end = (pos + len).min(size);
                    if kind > 0 {
                        data[pos..end].fill(0);
                    }
                    if kind == 2 && end > pos {
                        holes.push((pos as u64, end as u64));
                    }
                    pos = end;
                }
                (data, holes)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn engine_matches_direct_computation(
            (data, holes) in image(),
            workers in 1usize..5,
            threads in 1usize..4,
            request in prop::sample::select(vec![1usize, B, 3 * B, 4 << 20]),
        ) {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .build()
                .unwrap();
            let source = MemSource::new(data.clone()).with_holes(&holes);
            let mut opts = ChecksumOptions { workers, threads, request_size: request, ..Default::default() };
            let blk = rt.block_on(sum(source.clone(), &opts)).unwrap();
            prop_assert_eq!(blk, to_hex(&digest_bytes(&data)));
            let check = rt.block_on(read_back_check(
                Arc::new(source.clone()),
                &opts,
                &Progress::new(),
                &CancellationToken::new(),
            ));
            prop_assert_eq!(check.unwrap(), crate::blockcheck::blocks_value(0, &data));
            opts.algorithm = HashAlgorithm::Sha256;
            let sha = rt.block_on(sum(source, &opts)).unwrap();
            prop_assert_eq!(sha, to_hex(&sha2::Sha256::digest(&data)));
        }
    }
}
