//! The copy's memory bound, measured by the allocator: the heap a copy adds stays within
//! `max_in_flight_bytes` (plus small bookkeeping), however large the image.
//!
//! Its own test binary, with one test, so that no other test allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Caps, IoBuf, Result, Source, Target, ZeroMode};
use ferry_engine::{copy, CancellationToken, CopyOptions, Progress};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = CURRENT.fetch_add(bytes, Ordering::SeqCst) + bytes;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const BLOCK: usize = 4096;

/// Byte of block `k`: every 7th block is zero.
fn block_byte(k: u64) -> u8 {
    if k % 7 == 3 {
        0
    } else {
        (k % 251) as u8 + 1
    }
}

/// An image computed from offsets: holds no memory of its own.
struct Pattern(u64);

#[async_trait]
impl Source for Pattern {
    fn describe(&self) -> String {
        "pattern".into()
    }
    fn size(&self) -> u64 {
        self.0
    }
    fn caps(&self) -> Caps {
        Caps::default()
    }
    async fn read_at(&self, offset: u64, mut buf: IoBuf) -> Result<IoBuf> {
        assert_eq!(offset % BLOCK as u64, 0);
        // let other requests start, as real I/O would
        tokio::task::yield_now().await;
        for (i, block) in buf.chunks_mut(BLOCK).enumerate() {
            block.fill(block_byte(offset / BLOCK as u64 + i as u64));
        }
        Ok(buf)
    }
    async fn connect(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(Pattern(self.0)))
    }
}

/// Checks every write against the pattern and counts bytes; stores nothing.
#[derive(Clone)]
struct Verifier {
    size: u64,
    covered: Arc<AtomicU64>,
}

#[async_trait]
impl Target for Verifier {
    fn describe(&self) -> String {
        "verifier".into()
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        Caps::default()
    }
    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        tokio::task::yield_now().await;
        let mut expected = [0u8; BLOCK];
        for (i, block) in buf.chunks(BLOCK).enumerate() {
            expected.fill(block_byte(offset / BLOCK as u64 + i as u64));
            assert!(
                block == &expected[..block.len()],
                "wrong bytes near {offset}"
            );
        }
        self.covered.fetch_add(buf.len() as u64, Ordering::SeqCst);
        Ok(buf)
    }
    async fn write_zeroes(&self, offset: u64, len: u64, _mode: ZeroMode) -> Result<()> {
        for k in offset / BLOCK as u64..(offset + len).div_ceil(BLOCK as u64) {
            assert_eq!(block_byte(k), 0, "zeroes written over data in block {k}");
        }
        self.covered.fetch_add(len, Ordering::SeqCst);
        Ok(())
    }
    async fn flush(&self) -> Result<()> {
        Ok(())
    }
    async fn connect(&self) -> Result<Arc<dyn Target>> {
        Ok(Arc::new(self.clone()))
    }
}

/// Copies `size` bytes and returns the peak heap growth during the copy.
fn peak_growth(size: u64, options: &CopyOptions) -> usize {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let target = Verifier {
        size,
        covered: Arc::default(),
    };
    let covered = Arc::clone(&target.covered);
    let progress = Progress::new();
    let cancel = CancellationToken::new();
    let baseline = CURRENT.load(Ordering::SeqCst);
    PEAK.store(baseline, Ordering::SeqCst);
    rt.block_on(copy(
        Arc::new(Pattern(size)),
        Arc::new(target),
        options,
        &progress,
        &cancel,
    ))
    .unwrap();
    let growth = PEAK.load(Ordering::SeqCst) - baseline;
    assert_eq!(covered.load(Ordering::SeqCst), size);
    growth
}

#[test]
fn heap_stays_within_the_in_flight_bound() {
    const M: usize = 1 << 20;
    const SLACK: usize = M;
    let size = 96 * M as u64;
    for budget in [M, 4 * M] {
        let options = CopyOptions {
            max_in_flight_bytes: Some(budget),
            work_unit: 8 * M as u64,
            ..CopyOptions::default()
        };
        let growth = peak_growth(size, &options);
        eprintln!("budget {budget}: heap grew by {growth} bytes");
        assert!(
            growth <= budget + SLACK,
            "budget {budget}: the copy grew the heap by {growth} bytes"
        );
    }
    // the default bound: 8 workers x 4 requests x 256 KiB
    let options = CopyOptions {
        work_unit: 8 * M as u64,
        ..CopyOptions::default()
    };
    let growth = peak_growth(size, &options);
    eprintln!("default bound: heap grew by {growth} bytes");
    assert!(
        growth > 2 * M,
        "default copy used only {growth} bytes: is the test measuring?"
    );
    assert!(
        growth <= 8 * M + SLACK,
        "default copy grew the heap by {growth} bytes"
    );
}
