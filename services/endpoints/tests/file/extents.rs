//! Extents of sparse files from SEEK_DATA/SEEK_HOLE against layouts the test wrote.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::{conformance, open_source, scratch, write_sparse, KIB, MIB};
use ferry_core::{ErrorKind, Extent};
use ferry_endpoints::CacheMode;

/// Data at 0..64K, hole 64K..1M, data 1M..1M+4K, hole to 2M, data 2M..2M+100 (the last
/// block partly written), hole to the end at 3M.
fn known_layout(path: &std::path::Path) {
    let f = File::create(path).unwrap();
    f.set_len(3 * MIB).unwrap();
    f.write_all_at(&[7u8; 64 * 1024], 0).unwrap();
    f.write_all_at(&[8u8; 4096], MIB).unwrap();
    f.write_all_at(&[9u8; 100], 2 * MIB).unwrap();
    f.sync_all().unwrap();
}

#[tokio::test]
async fn extents_follow_the_holes_of_a_sparse_file() {
    let dir = scratch();
    let path = dir.path().join("sparse.img");
    known_layout(&path);
    let src = open_source(&path, CacheMode::PageCache).await;
    assert!(src.caps().extents);
    assert_eq!(
        src.extents(0, 3 * MIB).await.unwrap(),
        vec![
            Extent::data(0, 64 * KIB),
            Extent::zero(64 * KIB, MIB - 64 * KIB),
            Extent::data(MIB, 4 * KIB),
            Extent::zero(MIB + 4 * KIB, MIB - 4 * KIB),
            Extent::data(2 * MIB, 4 * KIB),
            Extent::zero(2 * MIB + 4 * KIB, MIB - 4 * KIB),
        ]
    );
}

#[tokio::test]
async fn extents_are_clipped_to_the_range_asked() {
    let dir = scratch();
    let path = dir.path().join("sparse.img");
    known_layout(&path);
    let src = open_source(&path, CacheMode::PageCache).await;
    // Starting inside data, ending inside a hole.
    assert_eq!(
        src.extents(4 * KIB, 100 * KIB).await.unwrap(),
        vec![
            Extent::data(4 * KIB, 60 * KIB),
            Extent::zero(64 * KIB, 40 * KIB)
        ]
    );
    // Starting inside a hole, ending inside data.
    assert_eq!(
        src.extents(512 * KIB, 512 * KIB + 1).await.unwrap(),
        vec![Extent::zero(512 * KIB, 512 * KIB), Extent::data(MIB, 1)]
    );
    // Wholly inside a hole; the last hole up to the end of file.
    assert_eq!(
        src.extents(300 * KIB, 10).await.unwrap(),
        vec![Extent::zero(300 * KIB, 10)]
    );
    assert_eq!(
        src.extents(2 * MIB + 8 * KIB, MIB - 8 * KIB).await.unwrap(),
        vec![Extent::zero(2 * MIB + 8 * KIB, MIB - 8 * KIB)]
    );
    assert!(src.extents(MIB, 0).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_file_ending_in_data_and_one_without_holes() {
    let dir = scratch();
    let path = dir.path().join("tail.img");
    let f = File::create(&path).unwrap();
    f.set_len(MIB + 3).unwrap();
    f.write_all_at(&[1, 2, 3], MIB).unwrap();
    let src = open_source(&path, CacheMode::PageCache).await;
    assert_eq!(
        src.extents(0, MIB + 3).await.unwrap(),
        vec![Extent::zero(0, MIB), Extent::data(MIB, 3)]
    );

    let full = dir.path().join("full.img");
    std::fs::write(&full, vec![5u8; 300 * 1024 + 1]).unwrap();
    let src = open_source(&full, CacheMode::PageCache).await;
    assert_eq!(
        src.extents(0, 300 * KIB + 1).await.unwrap(),
        vec![Extent::data(0, 300 * KIB + 1)]
    );

    let empty = dir.path().join("hole.img");
    File::create(&empty).unwrap().set_len(5 * MIB).unwrap();
    let src = open_source(&empty, CacheMode::PageCache).await;
    assert_eq!(
        src.extents(0, 5 * MIB).await.unwrap(),
        vec![Extent::zero(0, 5 * MIB)]
    );
}

#[tokio::test]
async fn extents_match_a_generated_layout_in_both_cache_modes() {
    let dir = scratch();
    let path = dir.path().join("gen.img");
    let image = conformance::test_image(8 * MIB + 4097, 11);
    write_sparse(&path, &image);
    for cache in [CacheMode::PageCache, CacheMode::Direct] {
        let src = open_source(&path, cache).await;
        let mut got = Vec::new();
        let mut pos = 0;
        while pos < src.size() {
            let more = src.extents(pos, src.size() - pos).await.unwrap();
            pos = more.last().unwrap().end();
            got.extend(more);
        }
        assert_eq!(ferry_core::merge_extents(got), image.layout, "{cache:?}");
    }
}

#[tokio::test]
async fn extents_past_the_end_are_refused() {
    let dir = scratch();
    let path = dir.path().join("small.img");
    std::fs::write(&path, [1u8; 10]).unwrap();
    let src = open_source(&path, CacheMode::PageCache).await;
    let err = src.extents(5, 6).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("past the end"), "{err}");
}
