//! One conformance suite for every endpoint: the same checks against any [`Source`] or
//! [`Target`], only the constructor differs (cloud-hypervisor's habit).
//!
//! The checks panic with a message naming the endpoint and the broken rule, as test
//! assertions do. Where an endpoint legitimately differs from another, the rule follows
//! what its [`Caps`] say rather than being skipped: a source without `extents` must
//! report everything as data, a target without `random_write` is written strictly in
//! order through one handle, request sizes follow the block sizes.
//!
//! ```ignore
//! let image = conformance::test_image(3 * 1024 * 1024 + 4097, 7);
//! // ...create the image as the endpoint's storage, holes where image.layout says Zero...
//! conformance::check_source(source, &image.data).await;
//! let fixture = BackedFixture::new(|n| dir.join(format!("dst-{n}.img")), |n, size| ...);
//! conformance::check_target(&fixture, 3 * 1024 * 1024 + 4097).await;
//! ```

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Caps, Extent, ExtentKind, IoBuf, Result, Source, Target, ZeroMode};

/// A generated image: its bytes and its layout (Zero extents are all-zero runs that a
/// fixture should create as holes where it can).
#[derive(Debug, Clone)]
pub struct Image {
    pub data: Vec<u8>,
    pub layout: Vec<Extent>,
}

/// A small deterministic generator (xorshift64*), so failures reproduce.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Fills `buf` with bytes that are never zero, so data never looks like a hole.
    pub fn fill_nonzero(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            for (b, r) in chunk.iter_mut().zip(v) {
                *b = r | 1;
            }
        }
    }
}

/// An image of `size` bytes: runs of data and zeroes of 4 KiB to 256 KiB (4 KiB aligned,
/// so file systems can make the zero runs holes), starting with data, plus whatever
/// partial run the size leaves at the end.
pub fn test_image(size: u64, seed: u64) -> Image {
    const BLOCK: u64 = 4096;
    let mut rng = Rng::new(seed);
    let mut data = vec![0u8; size as usize];
    let mut layout = Vec::new();
    let mut pos = 0u64;
    let mut is_data = true;
    while pos < size {
        let len = ((1 + rng.below(64)) * BLOCK).min(size - pos);
        if is_data {
            rng.fill_nonzero(&mut data[pos as usize..(pos + len) as usize]);
            layout.push(Extent::data(pos, len));
        } else {
            layout.push(Extent::zero(pos, len));
        }
        pos += len;
        is_data = !is_data;
    }
    Image { data, layout }
}

fn check_caps(name: &str, caps: &Caps) {
    let b = caps.block;
    assert!(
        b.minimum >= 1 && b.minimum.is_power_of_two(),
        "{name}: block.minimum {} must be a power of two",
        b.minimum
    );
    assert!(
        b.minimum <= b.preferred && b.preferred <= b.maximum,
        "{name}: block sizes must satisfy minimum <= preferred <= maximum: {b:?}"
    );
}

/// A request size that suits the endpoint: about 64 KiB, a multiple of its minimum, at
/// most its maximum.
fn request_size(caps: &Caps) -> u64 {
    let min = u64::from(caps.block.minimum);
    let want = (64 * 1024u64).div_ceil(min) * min;
    want.min(u64::from(caps.block.maximum) / min * min).max(min)
}

async fn read(source: &dyn Source, offset: u64, len: usize) -> Vec<u8> {
    let buf = IoBuf::new(len);
    let name = source.describe();
    let buf = source
        .read_at(offset, buf)
        .await
        .unwrap_or_else(|e| panic!("{name}: read of {len} bytes at {offset} failed: {e}"));
    assert_eq!(buf.len(), len, "{name}: read changed the buffer's view");
    buf.to_vec()
}

/// Reads `offset..offset + len` in requests of `step` bytes.
async fn read_range(source: &dyn Source, offset: u64, len: u64, step: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize);
    let mut pos = offset;
    while pos < offset + len {
        let n = (offset + len - pos).min(step);
        out.extend(read(source, pos, n as usize).await);
        pos += n;
    }
    out
}

/// Walks `offset..offset + len` through `extents()`, checking the contract, and returns
/// the extents found.
async fn walk_extents(source: &dyn Source, offset: u64, len: u64, expected: &[u8]) -> Vec<Extent> {
    let name = source.describe();
    let end = offset + len;
    let mut pos = offset;
    let mut all = Vec::new();
    while pos < end {
        let extents = source
            .extents(pos, end - pos)
            .await
            .unwrap_or_else(|e| panic!("{name}: extents({pos}, {}) failed: {e}", end - pos));
        assert!(
            !extents.is_empty(),
            "{name}: extents({pos}, {}) returned nothing",
            end - pos
        );
        for e in extents {
            assert_eq!(
                e.offset, pos,
                "{name}: extents not contiguous: {e:?} after {pos}"
            );
            assert!(e.len > 0, "{name}: empty extent {e:?}");
            assert!(e.end() <= end, "{name}: extent {e:?} reaches past {end}");
            assert!(
                source.caps().extents || e.kind == ExtentKind::Data,
                "{name}: caps say no extents, yet extent {e:?} is not data"
            );
            if e.kind == ExtentKind::Zero {
                let bytes = &expected[e.offset as usize..e.end() as usize];
                assert!(
                    bytes.iter().all(|b| *b == 0),
                    "{name}: extent {e:?} says zero but the image has data there"
                );
            }
            pos = e.end();
            all.push(e);
        }
    }
    all
}

/// Checks a source that holds exactly `expected`.
pub async fn check_source(source: Arc<dyn Source>, expected: &[u8]) {
    let name = source.describe();
    let size = expected.len() as u64;
    assert_eq!(source.size(), size, "{name}: size");
    let caps = source.caps();
    check_caps(&name, &caps);
    let min = u64::from(caps.block.minimum);
    let step = request_size(&caps);

    // The whole image, in requests, the last one ending at the (maybe unaligned) size.
    let all = read_range(&*source, 0, size, step).await;
    assert!(
        all == expected,
        "{name}: contents differ from the expected image"
    );

    // Extents of the whole image and of sub-ranges starting and ending anywhere aligned.
    walk_extents(&*source, 0, size, expected).await;
    let mut rng = Rng::new(size);
    for _ in 0..16 {
        if size < min {
            break;
        }
        let start = rng.below(size / min + 1) * min;
        let len = rng.below(size - start + 1);
        walk_extents(&*source, start, len, expected).await;
    }
    assert!(
        source
            .extents(0, 0)
            .await
            .map(|v| v.is_empty())
            .unwrap_or(true),
        "{name}: extents of an empty range must be empty"
    );

    // Aligned reads at random places, with random lengths.
    for _ in 0..32 {
        if size < min {
            break;
        }
        let start = rng.below(size / min) * min;
        let len = ((1 + rng.below(step / min)) * min).min(size - start);
        let got = read(&*source, start, len as usize).await;
        assert!(
            got == expected[start as usize..(start + len) as usize],
            "{name}: read of {len} bytes at {start} differs"
        );
    }

    // A read into a view that does not start at the buffer's start.
    if size >= min {
        let mut buf = IoBuf::new((2 * min.max(4096)) as usize);
        buf.set_view(min.max(4096) as usize, min as usize);
        let buf = source
            .read_at(0, buf)
            .await
            .unwrap_or_else(|e| panic!("{name}: read into an offset view failed: {e}"));
        assert!(
            *buf == expected[..min as usize],
            "{name}: read into an offset view differs"
        );
        assert!(
            buf.full()[..min.max(4096) as usize].iter().all(|b| *b == 0),
            "{name}: read wrote outside its view"
        );
    }

    // Reads past the end fail.
    let past = source.read_at(size, IoBuf::new(min as usize)).await;
    assert!(past.is_err(), "{name}: a read past the end succeeded");
    if size > 0 {
        let over = source
            .read_at(size - 1, IoBuf::new((min + 1) as usize))
            .await;
        assert!(over.is_err(), "{name}: a read crossing the end succeeded");
    }

    // Other handles see the same bytes, concurrently.
    let mut handles = Vec::new();
    for _ in 0..4 {
        handles.push(
            source
                .connect()
                .await
                .unwrap_or_else(|e| panic!("{name}: connect failed: {e}")),
        );
    }
    let chunk = size.div_ceil(4).div_ceil(min) * min;
    let reads = handles.iter().enumerate().map(|(i, h)| {
        let start = (i as u64 * chunk).min(size);
        let len = chunk.min(size - start);
        async move { (start, read_range(&**h, start, len, step).await) }
    });
    for (start, got) in futures::future::join_all(reads).await {
        assert!(
            got == expected[start as usize..start as usize + got.len()],
            "{name}: concurrent read through another handle at {start} differs"
        );
    }
    for h in handles {
        h.close()
            .await
            .unwrap_or_else(|e| panic!("{name}: close failed: {e}"));
    }
}

/// Opens targets for [`check_target`] and reads back what they hold.
#[async_trait]
pub trait TargetFixture: Send + Sync {
    /// Opens a new, empty image of `size` bytes as a target (each call starts over).
    async fn open(&self, size: u64) -> Result<Arc<dyn Target>>;
    /// The first `size` bytes the last opened target holds now (called after finish).
    async fn contents(&self, size: u64) -> Result<Vec<u8>>;
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Data(u64, u64),
    Zero(u64, u64, ZeroMode),
}

/// Checks a target of `size` bytes: writes and zeroes from several handles, out of order
/// where the target takes random writes, zeroes over data, writes from views, errors past
/// the end, and `is_zero`.
pub async fn check_target(fixture: &dyn TargetFixture, size: u64) {
    // A fresh target: its size, its caps, and what is_zero promises.
    let target = fixture.open(size).await.expect("open the target");
    let name = target.describe();
    assert!(
        target.size() >= size,
        "{name}: size {} < {size}",
        target.size()
    );
    let caps = target.caps();
    check_caps(&name, &caps);
    let min = u64::from(caps.block.minimum);
    let step = request_size(&caps);
    // A target that reads as zeroes may be finished untouched (the engine skips zero
    // ranges there) and must then hold zeroes. Any other target is written whole before
    // it is finished (an upload must not store bytes nobody wrote), so it is discarded.
    if target.is_zero() {
        target
            .finish()
            .await
            .unwrap_or_else(|e| panic!("{name}: finish failed: {e}"));
        // Every handle is dropped before the next open: some targets are exclusive.
        drop(target);
        let got = fixture.contents(size).await.expect("read back");
        assert!(
            got.iter().all(|b| *b == 0),
            "{name}: is_zero() was true but the new target holds data"
        );
    } else {
        target
            .abort()
            .await
            .unwrap_or_else(|e| panic!("{name}: abort of a new target failed: {e}"));
        drop(target);
    }

    // Writes past the end fail.
    let target = fixture.open(size).await.expect("open the target");
    let end = target.size();
    assert!(
        target
            .write_at(end, IoBuf::new(min as usize))
            .await
            .is_err(),
        "{name}: a write past the end succeeded"
    );
    target.abort().await.ok();
    drop(target);

    // The image: data and zero runs; zero runs alternate between the two modes.
    let image = test_image(size, size ^ 0x5eed);
    let mut ops = Vec::new();
    for (i, e) in image.layout.iter().enumerate() {
        match e.kind {
            ExtentKind::Zero => {
                let mode = if i % 4 == 1 {
                    ZeroMode::MayDeallocate
                } else {
                    ZeroMode::Allocate
                };
                ops.push(Op::Zero(e.offset, e.len, mode));
            }
            _ => {
                let mut pos = e.offset;
                while pos < e.end() {
                    let n = (e.end() - pos).min(step);
                    ops.push(Op::Data(pos, n));
                    pos += n;
                }
            }
        }
    }
    let target = fixture.open(size).await.expect("open the target");
    let workers = if caps.random_write { 4 } else { 1 };
    let mut handles: Vec<Arc<dyn Target>> = vec![Arc::clone(&target)];
    for _ in 1..workers {
        handles.push(
            target
                .connect()
                .await
                .unwrap_or_else(|e| panic!("{name}: connect failed: {e}")),
        );
    }
    if caps.random_write && caps.rewrite {
        // Garbage first where zeroes will go, so zeroing must really zero.
        for op in &ops {
            if let Op::Zero(offset, len, _) = *op {
                let mut pos = offset;
                while pos < offset + len {
                    let n = (offset + len - pos).min(step);
                    let mut buf = IoBuf::new(n as usize);
                    buf.fill(0xA5);
                    target
                        .write_at(pos, buf)
                        .await
                        .unwrap_or_else(|e| panic!("{name}: write at {pos} failed: {e}"));
                    pos += n;
                }
            }
        }
        // Out of order: a deterministic shuffle.
        let mut rng = Rng::new(size);
        for i in (0..ops.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            ops.swap(i, j);
        }
    }
    let lanes: Vec<Vec<Op>> = (0..workers)
        .map(|w| ops.iter().copied().skip(w).step_by(workers).collect())
        .collect();
    let data = &image.data;
    let runs = handles.iter().zip(lanes).map(|(h, lane)| async move {
        for op in lane {
            match op {
                Op::Data(offset, len) => {
                    // Write from a view that starts one block into the buffer.
                    let pad = min.max(4096) as usize;
                    let mut buf = IoBuf::new(pad + len as usize);
                    buf.set_view(pad, len as usize);
                    buf.copy_from_slice(&data[offset as usize..(offset + len) as usize]);
                    let back = h.write_at(offset, buf).await.unwrap_or_else(|e| {
                        panic!(
                            "{}: write of {len} bytes at {offset} failed: {e}",
                            h.describe()
                        )
                    });
                    assert_eq!(back.len(), len as usize, "write changed the buffer's view");
                }
                Op::Zero(offset, len, mode) => {
                    h.write_zeroes(offset, len, mode).await.unwrap_or_else(|e| {
                        panic!(
                            "{}: write_zeroes({offset}, {len}, {mode:?}) failed: {e}",
                            h.describe()
                        )
                    });
                }
            }
        }
    });
    futures::future::join_all(runs).await;
    for h in &handles[1..] {
        h.flush()
            .await
            .unwrap_or_else(|e| panic!("{name}: flush failed: {e}"));
    }
    drop(handles);
    target
        .finish()
        .await
        .unwrap_or_else(|e| panic!("{name}: finish failed: {e}"));
    let got = fixture.contents(size).await.expect("read back");
    assert_eq!(
        got.len(),
        data.len(),
        "{name}: read back a different length"
    );
    if let Some(at) = got.iter().zip(data.iter()).position(|(a, b)| a != b) {
        panic!("{name}: target contents differ from what was written, first at byte {at}");
    }
}
