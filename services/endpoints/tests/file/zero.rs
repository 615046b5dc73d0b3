//! write_zeroes on files: MayDeallocate punches holes, Allocate keeps the blocks; both
//! read back as zeroes, with the file size kept, for aligned and unaligned ranges.

use std::path::Path;

use crate::{allocated, scratch, target_options, KIB, MIB};
use ferry_core::{EndpointSpec, ExtentKind, Target, ZeroMode};
use ferry_endpoints::{open_target, CacheMode, Preallocation};

async fn full_target(path: &Path, size: u64, cache: CacheMode) -> std::sync::Arc<dyn Target> {
    std::fs::write(path, vec![0xEEu8; size as usize]).unwrap();
    let dst = open_target(
        &EndpointSpec::File(path.to_path_buf()),
        size,
        &target_options(cache, Preallocation::Off),
    )
    .await
    .unwrap();
    assert!(!dst.is_zero());
    dst
}

fn bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[tokio::test]
async fn may_deallocate_leaves_holes_that_read_as_zeroes() {
    let dir = scratch();
    for cache in [CacheMode::PageCache, CacheMode::Direct] {
        let path = dir.path().join(format!("punch-{cache:?}.img"));
        let size = 4 * MIB;
        let dst = full_target(&path, size, cache).await;
        assert!(dst.caps().efficient_zero && dst.caps().trim);
        dst.write_zeroes(MIB, 2 * MIB, ZeroMode::MayDeallocate)
            .await
            .unwrap();
        dst.finish().await.unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size, "size kept");
        assert_eq!(
            allocated(&path),
            2 * MIB,
            "{cache:?}: the range must become a hole"
        );
        let data = bytes(&path);
        assert!(data[..MIB as usize].iter().all(|b| *b == 0xEE));
        assert!(data[MIB as usize..3 * MIB as usize].iter().all(|b| *b == 0));
        assert!(data[3 * MIB as usize..].iter().all(|b| *b == 0xEE));

        // The file endpoint now reports the hole.
        let src = crate::open_source(&path, CacheMode::PageCache).await;
        let extents = src.extents(0, size).await.unwrap();
        assert_eq!(extents.len(), 3);
        assert_eq!(extents[1].kind, ExtentKind::Zero);
        assert_eq!((extents[1].offset, extents[1].len), (MIB, 2 * MIB));
    }
}

#[tokio::test]
async fn allocate_zeroes_keep_the_blocks() {
    let dir = scratch();
    for cache in [CacheMode::PageCache, CacheMode::Direct] {
        let path = dir.path().join(format!("zero-{cache:?}.img"));
        let size = 4 * MIB;
        let dst = full_target(&path, size, cache).await;
        dst.write_zeroes(MIB, 2 * MIB, ZeroMode::Allocate)
            .await
            .unwrap();
        dst.finish().await.unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        assert_eq!(
            allocated(&path),
            size,
            "{cache:?}: Allocate must not deallocate"
        );
        let data = bytes(&path);
        assert!(data[..MIB as usize].iter().all(|b| *b == 0xEE));
        assert!(data[MIB as usize..3 * MIB as usize].iter().all(|b| *b == 0));
        assert!(data[3 * MIB as usize..].iter().all(|b| *b == 0xEE));
    }
}

#[tokio::test]
async fn unaligned_ranges_are_zeroed_exactly() {
    let dir = scratch();
    for mode in [ZeroMode::MayDeallocate, ZeroMode::Allocate] {
        for cache in [CacheMode::PageCache, CacheMode::Direct] {
            let path = dir.path().join(format!("odd-{mode:?}-{cache:?}.img"));
            let size = MIB + 333;
            let dst = full_target(&path, size, cache).await;
            // Inside one block, across blocks, and up to the unaligned end.
            for (offset, len) in [(100, 10), (4000, 9000), (MIB - 7, 340)] {
                dst.write_zeroes(offset, len, mode).await.unwrap();
            }
            dst.finish().await.unwrap();
            let data = bytes(&path);
            assert_eq!(data.len() as u64, size);
            for (i, b) in data.iter().enumerate() {
                let i = i as u64;
                let zero = (100..110).contains(&i)
                    || (4000..13000).contains(&i)
                    || (MIB - 7..size).contains(&i);
                assert_eq!(*b == 0, zero, "{mode:?} {cache:?}: byte {i} is {b}");
            }
        }
    }
}

#[tokio::test]
async fn zeroes_over_a_large_range_punch_everything_but_the_edges() {
    let dir = scratch();
    let path = dir.path().join("large.img");
    let size = 16 * MIB;
    let dst = full_target(&path, size, CacheMode::PageCache).await;
    dst.write_zeroes(6 * KIB, size - 6 * KIB - 10, ZeroMode::MayDeallocate)
        .await
        .unwrap();
    dst.finish().await.unwrap();
    // Only the first two blocks and the last block keep allocations.
    assert_eq!(allocated(&path), 3 * 4 * KIB);
    let data = bytes(&path);
    assert!(data[..6 * KIB as usize].iter().all(|b| *b == 0xEE));
    assert!(data[6 * KIB as usize..(size - 10) as usize]
        .iter()
        .all(|b| *b == 0));
    assert!(data[(size - 10) as usize..].iter().all(|b| *b == 0xEE));
}
