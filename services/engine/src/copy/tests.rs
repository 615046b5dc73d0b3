//! Copy engine tests against the in-memory source and the recording target: the recorded
//! writes and zero runs are sorted and compared exactly, as nbdcopy's tests do.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::{BlockSizes, Caps, ErrorKind, Extent, ZeroMode};
use ferry_testkit::{MemSource, Op, RecordingTarget, GARBAGE};
use proptest::prelude::*;

use crate::ranges::RangeSet;
use crate::{copy, CancellationToken, Checkpoint, CommitOrder, CopyOptions, CopyReport, Progress};

const K: usize = 1024;
const M: usize = 1024 * 1024;

/// Deterministic non-zero-heavy bytes.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x as u8) | 1
        })
        .collect()
}

async fn run(
    src: &MemSource,
    tgt: &RecordingTarget,
    opts: &CopyOptions,
) -> ferry_core::Result<CopyReport> {
    copy(
        Arc::new(src.clone()),
        Arc::new(tgt.clone()),
        opts,
        &Progress::new(),
        &CancellationToken::new(),
    )
    .await
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Compares images without printing megabytes on failure.
fn assert_same(actual: &[u8], expected: &[u8]) {
    if let Some(at) = first_difference(actual, expected) {
        panic!(
            "images differ at byte {at} (lengths {} and {})",
            actual.len(),
            expected.len()
        );
    }
}

fn sorted_ops(tgt: &RecordingTarget) -> Vec<(u64, u64)> {
    let mut ranges: Vec<_> = tgt.ops().iter().map(Op::range).collect();
    ranges.sort();
    ranges
}

/// The recorded operations tile `[0, size)` exactly: no gap, no overlap.
fn assert_exactly_once(tgt: &RecordingTarget, size: u64) {
    let mut pos = 0;
    for (s, e) in sorted_ops(tgt) {
        assert_eq!(s, pos, "gap or overlap at {pos}: {:?}", sorted_ops(tgt));
        pos = e;
    }
    assert_eq!(pos, size);
}

fn caps(minimum: u32, maximum: u32) -> Caps {
    Caps {
        block: BlockSizes {
            minimum,
            preferred: minimum,
            maximum,
        },
        ..Caps::default()
    }
}

/// 1 MiB data, 3 MiB allocated zeroes, a 2 MiB hole, 1 MiB data.
fn zero_middle_image() -> MemSource {
    let mut data = vec![0u8; 7 * M];
    data[..M].copy_from_slice(&pattern(M, 1));
    data[6 * M..].copy_from_slice(&pattern(M, 2));
    MemSource::new(data).with_holes(&[(4 * M as u64, 6 * M as u64)])
}

#[tokio::test]
async fn zero_runs_merge_into_one_write_zeroes() {
    for order in [CommitOrder::OutOfOrder, CommitOrder::InOrder] {
        let src = zero_middle_image();
        let tgt = RecordingTarget::new(src.len());
        let opts = CopyOptions {
            request_size: Some(256 * K),
            order,
            ..CopyOptions::default()
        };
        let report = run(&src, &tgt, &opts).await.unwrap();
        assert_same(&tgt.data(), src.data());
        assert_eq!(tgt.zeroes(), vec![(M as u64, 6 * M as u64)], "{order:?}");
        assert_exactly_once(&tgt, src.len());
        assert_eq!(report.zero_bytes, 5 * M as u64);
        assert_eq!(report.data_bytes, 2 * M as u64);
        // the hole was never read
        let reads = src.stats.reads();
        assert!(reads
            .iter()
            .all(|&(o, l)| o + l as u64 <= 4 * M as u64 || o >= 6 * M as u64));
    }
}

#[tokio::test]
async fn zero_blocks_are_never_written_as_data() {
    let mut data = pattern(2 * M, 3);
    for block in [0usize, 5, 6, 7, 100, 255, 256, 511] {
        data[block * 4096..(block + 1) * 4096].fill(0);
    }
    let src = MemSource::new(data.clone());
    for target_zero in [false, true] {
        let tgt = if target_zero {
            RecordingTarget::zeroed(src.len())
        } else {
            RecordingTarget::new(src.len())
        };
        let opts = CopyOptions {
            request_size: Some(64 * K),
            workers: 3,
            ..CopyOptions::default()
        };
        run(&src, &tgt, &opts).await.unwrap();
        assert_same(&tgt.data(), &data);
        for (s, e) in tgt.writes() {
            for block in data[s as usize..e as usize].chunks(4096) {
                assert!(
                    block.iter().any(|&b| b != 0),
                    "zero block written at {s}..{e}"
                );
            }
        }
        if target_zero {
            assert!(tgt.zeroes().is_empty(), "{:?}", tgt.zeroes());
        } else {
            assert_exactly_once(&tgt, src.len());
        }
    }
}

#[tokio::test]
async fn in_order_commits_strictly_in_order() {
    let src = MemSource::new(pattern(4 * M, 4))
        .with_holes(&[(M as u64, M as u64 + 64 * 1024)])
        .with_read_delay(Duration::from_millis(2));
    for (order, random_write) in [(CommitOrder::InOrder, true), (CommitOrder::Auto, false)] {
        let tgt = RecordingTarget::new(src.len()).with_caps(Caps {
            random_write,
            ..Caps::default()
        });
        let opts = CopyOptions {
            request_size: Some(64 * K),
            work_unit: 256 * K as u64,
            order,
            ..CopyOptions::default()
        };
        run(&src, &tgt, &opts).await.unwrap();
        assert_same(&tgt.data(), src.data());
        let mut pos = 0;
        for op in tgt.ops() {
            let (s, e) = op.range();
            assert_eq!(s, pos, "{order:?}: out of order: {:?}", tgt.ops());
            pos = e;
        }
        assert_eq!(pos, src.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_covers_every_byte_exactly_once() {
    let mut data = pattern(6 * M, 5);
    data[M..2 * M].fill(0);
    let src = MemSource::new(data)
        .with_holes(&[(3 * M as u64, 4 * M as u64)])
        .with_read_delay(Duration::from_micros(300));
    let tgt = RecordingTarget::new(src.len());
    let opts = CopyOptions {
        request_size: Some(32 * K),
        work_unit: 512 * K as u64,
        order: CommitOrder::OutOfOrder,
        ..CopyOptions::default()
    };
    run(&src, &tgt, &opts).await.unwrap();
    assert_same(&tgt.data(), src.data());
    assert_exactly_once(&tgt, src.len());
    let issued: Vec<u64> = tgt.ops().iter().map(|o| o.range().0).collect();
    assert!(issued.windows(2).any(|w| w[0] > w[1]), "never out of order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_bound_holds_and_buffers_are_reused() {
    let src = MemSource::new(pattern(8 * M, 6)).with_read_delay(Duration::from_micros(200));
    let tgt = RecordingTarget::new(src.len()).with_write_delay(Duration::from_micros(200));
    let budget = 200 * K;
    let opts = CopyOptions {
        request_size: Some(64 * K),
        workers: 8,
        max_in_flight_bytes: Some(budget),
        ..CopyOptions::default()
    };
    run(&src, &tgt, &opts).await.unwrap();
    assert_same(&tgt.data(), src.data());
    let buffers = src.stats.buffers();
    let buffer_bytes: usize = buffers.iter().map(|b| b.1).sum();
    assert!(buffer_bytes <= budget, "{buffer_bytes} bytes of buffers");
    assert!(src.stats.in_flight.max() <= budget);
    assert!(tgt.log.in_flight.max() <= budget);
    let reads = src.stats.reads().len();
    assert!(
        reads >= 8 * buffers.len(),
        "{reads} reads, {} buffers",
        buffers.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_is_prompt_and_checkpoint_lists_only_flushed_ranges() {
    for order in [CommitOrder::OutOfOrder, CommitOrder::InOrder] {
        let size = 16 * M;
        let src = MemSource::new(pattern(size, 7))
            .with_read_delay(Duration::from_micros(500))
            .hang_from(12 * M as u64);
        let tgt = RecordingTarget::new(size as u64);
        let opts = CopyOptions {
            request_size: Some(64 * K),
            work_unit: M as u64,
            order,
            checkpoint_interval: Duration::from_millis(5),
            ..CopyOptions::default()
        };
        let progress = Progress::new();
        let cancel = CancellationToken::new();
        let copy = tokio::spawn({
            let (src, tgt, progress, cancel) =
                (src.clone(), tgt.clone(), progress.clone(), cancel.clone());
            async move { copy(Arc::new(src), Arc::new(tgt), &opts, &progress, &cancel).await }
        });
        // wait until something is committed, then cancel
        tokio::time::timeout(Duration::from_secs(20), async {
            while progress.checkpoint().committed_bytes() < 2 * M as u64 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .expect("no checkpoint within 20 s");
        cancel.cancel();
        let err = tokio::time::timeout(Duration::from_secs(5), copy)
            .await
            .expect("cancellation was not prompt")
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled);
        assert!(tgt.is_aborted());
        assert!(!tgt.is_finished());
        let checkpoint = progress.checkpoint();
        assert_eq!(checkpoint.size, size as u64);
        assert!(checkpoint.committed_bytes() >= 2 * M as u64);
        assert!(!checkpoint.is_complete());
        let data = tgt.data();
        for &(s, e) in &checkpoint.committed {
            assert_eq!(
                tgt.durable_gaps(s, e),
                vec![],
                "{order:?}: {s}..{e} not flushed"
            );
            assert_same(
                &data[s as usize..e as usize],
                &src.data()[s as usize..e as usize],
            );
        }
        if order == CommitOrder::InOrder {
            assert_eq!(checkpoint.committed.len(), 1);
            assert_eq!(checkpoint.committed[0].0, 0);
        }
    }
}

#[tokio::test]
async fn resume_skips_committed_ranges() {
    for order in [CommitOrder::OutOfOrder, CommitOrder::InOrder] {
        let src = zero_middle_image();
        let size = src.len();
        let tgt = RecordingTarget::new(size);
        let committed = vec![(0, 512 * K as u64), (2 * M as u64, 5 * M as u64)];
        let opts = CopyOptions {
            request_size: Some(128 * K),
            order,
            resume: Some(Checkpoint {
                size,
                committed: committed.clone(),
            }),
            ..CopyOptions::default()
        };
        let progress = Progress::new();
        copy(
            Arc::new(src.clone()),
            Arc::new(tgt.clone()),
            &opts,
            &progress,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        let done = RangeSet::from_ranges(committed.iter().copied());
        for op in tgt.ops() {
            let (s, e) = op.range();
            assert_eq!(done.gaps(s, e), vec![(s, e)], "{order:?}: rewrote {s}..{e}");
        }
        let data = tgt.data();
        for (s, e) in done.gaps(0, size) {
            assert_same(
                &data[s as usize..e as usize],
                &src.data()[s as usize..e as usize],
            );
        }
        for (s, e) in committed {
            assert!(data[s as usize..e as usize].iter().all(|&b| b == GARBAGE));
        }
        let checkpoint = progress.checkpoint();
        assert!(checkpoint.is_complete());
        assert_eq!(checkpoint.committed, vec![(0, size)]);
        let snap = progress.snapshot();
        assert_eq!(snap.done, size);
        assert_eq!(
            snap.data_bytes + snap.zero_bytes,
            size - 3 * M as u64 - 512 * K as u64
        );
    }
}

#[tokio::test]
async fn resume_of_another_size_is_rejected() {
    let src = MemSource::new(vec![1; 100]);
    let tgt = RecordingTarget::new(100);
    let opts = CopyOptions {
        resume: Some(Checkpoint {
            size: 99,
            committed: vec![],
        }),
        ..CopyOptions::default()
    };
    let err = run(&src, &tgt, &opts).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

#[tokio::test]
async fn target_too_small_is_invalid_input() {
    let src = MemSource::new(vec![1; 4097]);
    let tgt = RecordingTarget::new(4096);
    let err = run(&src, &tgt, &CopyOptions::default()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("smaller than the source"), "{err}");
    assert!(tgt.ops().is_empty());
    assert!(!tgt.is_finished());
}

#[tokio::test]
async fn target_errors_carry_operation_offset_and_endpoint() {
    let src = MemSource::new(pattern(M, 8));
    let tgt = RecordingTarget::new(M as u64).fail_write_at(300_000);
    let opts = CopyOptions {
        request_size: Some(64 * K),
        ..CopyOptions::default()
    };
    let err = run(&src, &tgt, &opts).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert_eq!(err.context().operation, Some("write"));
    assert_eq!(err.context().offset, Some(4 * 64 * K as u64));
    assert_eq!(err.context().endpoint.as_deref(), Some("recording-target"));
    assert!(
        err.to_string()
            .starts_with("write at offset 262144 on recording-target"),
        "{err}"
    );
    assert!(tgt.is_aborted());
    assert!(!tgt.is_finished());
}

#[tokio::test]
async fn broken_extents_are_a_protocol_error() {
    let src = MemSource::new(vec![1; 1000]).with_extents(vec![Extent::data(10, 990)]);
    let tgt = RecordingTarget::new(1000);
    let err = run(&src, &tgt, &CopyOptions::default()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol);
    assert_eq!(err.context().operation, Some("extents"));
    assert_eq!(err.context().offset, Some(0));
}

#[tokio::test(start_paused = true)]
async fn rate_limit_is_respected() {
    let size = 4 * M;
    let src = MemSource::new(pattern(size, 9));
    let tgt = RecordingTarget::new(size as u64);
    let rate = M as u64;
    let request = 128 * K;
    let opts = CopyOptions {
        request_size: Some(request),
        rate_limit: Some(rate),
        ..CopyOptions::default()
    };
    let start = tokio::time::Instant::now();
    run(&src, &tgt, &opts).await.unwrap();
    let elapsed = start.elapsed().as_secs_f64();
    let tokens: usize = src.stats.reads().iter().map(|r| r.1).sum();
    assert_eq!(tokens, size);
    // the bucket starts with one request's worth; the rest is paid at `rate`
    let floor = (tokens - request) as f64 / rate as f64;
    assert!(elapsed >= floor * 0.99, "{elapsed} s < {floor} s");
    assert!(
        elapsed <= floor * 1.5 + 0.1,
        "{elapsed} s, expected about {floor} s"
    );
    assert_same(&tgt.data(), src.data());
}

#[tokio::test]
async fn unusual_block_sizes_are_respected() {
    // 512-byte holes that are not aligned to the target's 4 KiB blocks
    let mut data = pattern(300 * K + 512, 10);
    let holes = [
        (10_752u64, 50_176u64),
        (100_352, 100_864),
        (200_192, 307_712),
    ];
    for &(s, e) in &holes {
        data[s as usize..e as usize].fill(0);
    }
    let src = MemSource::new(data)
        .with_holes(&holes)
        .with_caps(caps(512, 24 * K as u32));
    for order in [CommitOrder::OutOfOrder, CommitOrder::InOrder] {
        let tgt = RecordingTarget::new(src.len()).with_caps(caps(4096, 64 * K as u32));
        let opts = CopyOptions {
            order,
            ..CopyOptions::default()
        };
        run(&src, &tgt, &opts).await.unwrap();
        assert_same(&tgt.data(), src.data());
        let size = src.len();
        for &(o, l) in src.stats.reads().iter() {
            assert!(l <= 24 * K, "read of {l}");
            assert_eq!(o % 4096, 0, "unaligned read at {o}");
            assert!(l % 4096 == 0 || o + l as u64 == size, "read of {l}");
        }
        for op in tgt.ops() {
            let (s, e) = op.range();
            assert_eq!(s % 4096, 0, "{op:?}");
            assert!(e % 4096 == 0 || e == size, "{op:?}");
            if let Op::Write { len, .. } = op {
                assert!(len <= 24 * K as u64);
            }
        }
    }
}

#[tokio::test]
async fn sparse_size_zero_keeps_everything_allocated() {
    let src = zero_middle_image();
    let tgt = RecordingTarget::zeroed(src.len());
    let opts = CopyOptions {
        sparse_size: 0,
        ..CopyOptions::default()
    };
    run(&src, &tgt, &opts).await.unwrap();
    assert_same(&tgt.data(), src.data());
    assert_exactly_once(&tgt, src.len());
    // allocated zeroes are copied as data; only the hole is written as (allocated) zeroes
    assert_eq!(tgt.zeroes(), vec![(4 * M as u64, 6 * M as u64)]);
    assert!(tgt
        .ops()
        .iter()
        .all(|o| !matches!(o, Op::Zero { mode, .. } if *mode != ZeroMode::Allocate)));
}

#[tokio::test]
async fn tiny_images_and_progress() {
    for size in [0usize, 1, 4095, 4097] {
        let src = MemSource::new(pattern(size, 11));
        let tgt = RecordingTarget::new(size as u64 + 10);
        let progress = Progress::new();
        let report = copy(
            Arc::new(src.clone()),
            Arc::new(tgt.clone()),
            &CopyOptions::default(),
            &progress,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(&tgt.data()[..size], src.data());
        assert!(
            tgt.data()[size..].iter().all(|&b| b == GARBAGE),
            "wrote past the source"
        );
        assert_eq!(report.size, size as u64);
        assert_eq!(report.data_bytes + report.zero_bytes, size as u64);
        let snap = progress.snapshot();
        assert_eq!((snap.total, snap.done), (size as u64, size as u64));
        assert!(progress.checkpoint().is_complete());
        assert!(tgt.is_finished());
    }
}

#[tokio::test]
async fn zero_tail_of_an_unaligned_image_is_sparse() {
    let mut data = pattern(8192 + 100, 12);
    data[8192..].fill(0);
    let src = MemSource::new(data);
    let tgt = RecordingTarget::new(src.len());
    run(&src, &tgt, &CopyOptions::default()).await.unwrap();
    assert_eq!(tgt.writes(), vec![(0, 8192)]);
    assert_eq!(tgt.zeroes(), vec![(8192, 8292)]);
}

/// A random image: blocks of data, allocated zeroes and holes.
fn image_strategy() -> impl Strategy<Value = (Vec<u8>, Vec<(u64, u64)>)> {
    (
        0usize..300_000,
        any::<u64>(),
        prop::collection::vec((0u8..3, 1usize..40_000), 0..12),
    )
        .prop_map(|(size, seed, runs)| {
            let mut data = pattern(size, seed);
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
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn copies_are_exact((data, holes) in image_strategy(),
                        workers in 1usize..6,
                        request_kib in prop::sample::select(vec![4usize, 12, 64, 1024]),
                        unit_kib in prop::sample::select(vec![16u64, 48, 1024]),
                        in_order in any::<bool>(),
                        target_zero in any::<bool>(),
                        sparse in prop::sample::select(vec![0usize, 512, 4096, 8192]),
                        min_block in prop::sample::select(vec![1u32, 512, 4096])) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let size = data.len() as u64;
        let src = MemSource::new(data).with_holes(&holes).with_caps(caps(min_block, 1 << 20));
        let tgt = if target_zero {
            RecordingTarget::zeroed(size)
        } else {
            RecordingTarget::new(size)
        };
        let opts = CopyOptions {
            workers,
            request_size: Some(request_kib * K),
            work_unit: unit_kib * 1024,
            order: if in_order { CommitOrder::InOrder } else { CommitOrder::OutOfOrder },
            sparse_size: sparse,
            ..CopyOptions::default()
        };
        let report = rt.block_on(run(&src, &tgt, &opts)).unwrap();
        prop_assert!(first_difference(&tgt.data(), src.data()).is_none());
        prop_assert_eq!(report.data_bytes + report.zero_bytes, size);
        let ops = sorted_ops(&tgt);
        for w in ops.windows(2) {
            prop_assert!(w[0].1 <= w[1].0, "overlap: {:?}", w);
        }
        if !target_zero || sparse == 0 {
            assert_exactly_once(&tgt, size);
        }
        if in_order {
            let issued: Vec<_> = tgt.ops().iter().map(Op::range).collect();
            prop_assert_eq!(issued, ops);
        }
    }
}

/// Collects what a copy reports as written.
#[derive(Default)]
struct Seen(parking_lot::Mutex<Vec<(u64, u64, bool)>>);

impl crate::WrittenRanges for Seen {
    fn written(&self, start: u64, end: u64, zero: bool) {
        self.0.lock().push((start, end, zero));
    }
}

#[tokio::test]
async fn written_ranges_are_reported_with_their_kind_before_the_copy_ends() {
    for order in [CommitOrder::OutOfOrder, CommitOrder::InOrder] {
        let src = zero_middle_image();
        let tgt = RecordingTarget::new(src.len());
        let seen = Arc::new(Seen::default());
        let progress = Progress::with_written(seen.clone());
        let opts = CopyOptions {
            request_size: Some(256 * K),
            order,
            ..CopyOptions::default()
        };
        copy(
            Arc::new(src.clone()),
            Arc::new(tgt.clone()),
            &opts,
            &progress,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        let mut seen = seen.0.lock().clone();
        seen.sort();
        // Every byte reported exactly once: data where the image has data, zero elsewhere.
        let mut at = 0;
        for &(s, e, zero) in &seen {
            assert_eq!(s, at, "{order:?}: {seen:?}");
            let data = s < M as u64 || s >= 6 * M as u64;
            assert_eq!(zero, !data, "{order:?}: {s}..{e}");
            at = e;
        }
        assert_eq!(at, src.len());
    }
}

#[tokio::test]
async fn resumed_ranges_are_reported_as_data() {
    let src = MemSource::new(pattern(4 * M, 9));
    let tgt = RecordingTarget::new(src.len());
    let seen = Arc::new(Seen::default());
    let progress = Progress::with_written(seen.clone());
    let opts = CopyOptions {
        resume: Some(Checkpoint {
            size: src.len(),
            committed: vec![(0, M as u64)],
        }),
        ..CopyOptions::default()
    };
    copy(
        Arc::new(src.clone()),
        Arc::new(tgt.clone()),
        &opts,
        &progress,
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    let seen = seen.0.lock().clone();
    assert_eq!(seen[0], (0, M as u64, false));
    let total: u64 = seen.iter().map(|(s, e, _)| e - s).sum();
    assert_eq!(total, src.len());
}
