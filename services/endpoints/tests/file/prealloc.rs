//! Preallocation modes: allocated blocks (st_blocks) and final size of each.

use std::path::Path;
use std::sync::Arc;

use crate::{allocated, scratch, target_options, MIB};
use ferry_core::{EndpointSpec, IoBuf, Target, ZeroMode};
use ferry_endpoints::{open_target, CacheMode, Preallocation};

async fn open(
    path: &Path,
    size: u64,
    preallocation: Preallocation,
    cache: CacheMode,
) -> Arc<dyn Target> {
    open_target(
        &EndpointSpec::File(path.to_path_buf()),
        size,
        &target_options(cache, preallocation),
    )
    .await
    .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// Allocation equals `want`, give or take a few blocks of extent-tree metadata.
#[track_caller]
fn assert_allocated(path: &Path, want: u64) {
    let got = allocated(path);
    assert!(
        got >= want && got < want + 64 * 1024,
        "{} has {got} bytes allocated, want {want}",
        path.display()
    );
}

async fn write(dst: &dyn Target, offset: u64, len: usize, byte: u8) {
    let mut buf = IoBuf::new(len);
    buf.fill(byte);
    dst.write_at(offset, buf).await.unwrap();
}

#[tokio::test]
async fn off_allocates_only_what_is_written() {
    let dir = scratch();
    let path = dir.path().join("off.img");
    let dst = open(&path, 64 * MIB, Preallocation::Off, CacheMode::PageCache).await;
    assert_allocated(&path, 0);
    write(&*dst, 10 * MIB, MIB as usize, 1).await;
    dst.finish().await.unwrap();
    assert_allocated(&path, MIB);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 * MIB);
}

#[tokio::test]
async fn falloc_allocates_everything_up_front_and_keeps_reading_zeroes() {
    let dir = scratch();
    let size = 32 * MIB + 4097;
    let path = dir.path().join("falloc.img");
    let dst = open(&path, size, Preallocation::Falloc, CacheMode::PageCache).await;
    assert!(
        allocated(&path) >= size,
        "allocated {} < {size}",
        allocated(&path)
    );
    assert!(dst.is_zero(), "preallocated blocks read as zeroes");
    write(&*dst, MIB, 4096, 9).await;
    dst.finish().await.unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    let data = std::fs::read(&path).unwrap();
    assert!(data[..MIB as usize].iter().all(|b| *b == 0));
    assert!(data[MIB as usize..MIB as usize + 4096]
        .iter()
        .all(|b| *b == 9));

    // An existing file: its data is kept, its holes are allocated.
    let existing = dir.path().join("existing.img");
    let f = std::fs::File::create(&existing).unwrap();
    f.set_len(8 * MIB).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[7u8; 4096], 4 * MIB).unwrap();
    drop(f);
    let dst = open(
        &existing,
        8 * MIB,
        Preallocation::Falloc,
        CacheMode::PageCache,
    )
    .await;
    assert!(!dst.is_zero());
    assert_allocated(&existing, 8 * MIB);
    let data = std::fs::read(&existing).unwrap();
    assert!(data[4 * MIB as usize..4 * MIB as usize + 4096]
        .iter()
        .all(|b| *b == 7));
}

#[tokio::test]
async fn full_writes_zeroes_everywhere_and_keeps_data() {
    let dir = scratch();
    for cache in [CacheMode::PageCache, CacheMode::Direct] {
        let size = 16 * MIB + 4097;
        let path = dir.path().join(format!("full-{cache:?}.img"));
        let dst = open(&path, size, Preallocation::Full, cache).await;
        assert!(allocated(&path) >= size);
        assert!(dst.is_zero());
        // Written zeroes, not unwritten extents: SEEK_DATA sees data at 0 and no hole
        // before the end.
        let src = crate::open_source(&path, CacheMode::PageCache).await;
        assert_eq!(
            src.extents(0, size).await.unwrap(),
            vec![ferry_core::Extent::data(0, size)],
            "{cache:?}"
        );
        dst.finish().await.unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        assert!(std::fs::read(&path).unwrap().iter().all(|b| *b == 0));
    }

    let existing = dir.path().join("existing.img");
    let f = std::fs::File::create(&existing).unwrap();
    f.set_len(4 * MIB).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[7u8; 4096], MIB).unwrap();
    drop(f);
    let dst = open(
        &existing,
        4 * MIB,
        Preallocation::Full,
        CacheMode::PageCache,
    )
    .await;
    dst.finish().await.unwrap();
    assert_allocated(&existing, 4 * MIB);
    let data = std::fs::read(&existing).unwrap();
    assert!(data[MIB as usize..MIB as usize + 4096]
        .iter()
        .all(|b| *b == 7));
    assert_eq!(data.iter().filter(|b| **b != 0).count(), 4096);
}

#[tokio::test]
async fn grow_allocates_ahead_in_aligned_steps_and_trims_at_the_end() {
    let dir = scratch();
    let step = 8 * MIB;
    let size = 20 * MIB + 12345;
    let path = dir.path().join("grow.img");
    let dst = open(
        &path,
        size,
        Preallocation::Grow { step },
        CacheMode::PageCache,
    )
    .await;
    assert_allocated(&path, 0);

    // First write crosses the (empty) preallocation: allocate up to
    // align_up(end + step, 1 MiB) = align_up(1 MiB + 100 + 8 MiB) = 10 MiB.
    write(&*dst, MIB, 100, 1).await;
    assert_allocated(&path, 10 * MIB);
    // Inside the preallocated range: nothing more.
    write(&*dst, 9 * MIB, MIB as usize, 2).await;
    assert_allocated(&path, 10 * MIB);
    // Crossing its end: extend to align_up(10 MiB + 1 + 8 MiB) = 19 MiB.
    write(&*dst, 10 * MIB - 1, 2, 3).await;
    assert_allocated(&path, 19 * MIB);
    // Near the end of the file: the step reaches past the end of file.
    write(&*dst, 20 * MIB, 12345, 4).await;
    assert_allocated(&path, 29 * MIB);
    // Zero writes that may deallocate do not grow; Allocate ones do.
    dst.write_zeroes(0, 4096, ZeroMode::MayDeallocate)
        .await
        .unwrap();

    dst.finish().await.unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), size, "final size");
    let blocks = allocated(&path);
    assert!(
        blocks < size.div_ceil(4096) * 4096 + 64 * 1024 && blocks >= 20 * MIB,
        "after finish {blocks} bytes are allocated, want the file's {size} bytes trimmed"
    );
    let data = std::fs::read(&path).unwrap();
    assert_eq!(data[MIB as usize], 1);
    assert_eq!(data[10 * MIB as usize], 3);
    assert_eq!(data[size as usize - 1], 4);
}

#[tokio::test]
async fn grow_is_shared_by_connected_handles_and_trimmed_on_abort() {
    let dir = scratch();
    let path = dir.path().join("grow2.img");
    let size = 3 * MIB;
    let dst = open(
        &path,
        size,
        Preallocation::Grow { step: 128 * MIB },
        CacheMode::Direct,
    )
    .await;
    let other = dst.connect().await.unwrap();
    write(&*other, 0, 4096, 1).await;
    assert_allocated(&path, 129 * MIB);
    // The other handle sees the same preallocated end: no further allocation.
    write(&*dst, 2 * MIB, 4096, 2).await;
    assert_allocated(&path, 129 * MIB);
    dst.write_zeroes(MIB, MIB, ZeroMode::Allocate)
        .await
        .unwrap();
    drop(other);
    dst.abort().await.unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    // Trimmed: what was allocated past the end of file is gone, the rest stays.
    assert_allocated(&path, size);
}
