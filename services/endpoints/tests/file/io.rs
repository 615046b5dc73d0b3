//! Reads and writes of files: the conformance suite in both cache modes, round trips
//! through open_source/open_target, and the target's size and is_zero rules.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::{conformance, open_flags, scratch, source_options, target_options, write_sparse, MIB};
use ferry_core::{EndpointSpec, ErrorKind, IoBuf, ZeroMode};
use ferry_endpoints::{open_source, open_target, CacheMode, Preallocation};

#[tokio::test]
async fn file_source_conforms_in_both_cache_modes() {
    let dir = scratch();
    for (i, size) in [0, 1, 4096, 3 * MIB + 4097].into_iter().enumerate() {
        let path = dir.path().join(format!("src{i}.img"));
        let image = conformance::test_image(size, i as u64);
        write_sparse(&path, &image);
        for cache in [CacheMode::PageCache, CacheMode::Direct] {
            let src = crate::open_source(&path, cache).await;
            conformance::check_source(src, &image.data).await;
        }
    }
}

#[tokio::test]
async fn file_target_conforms_in_both_cache_modes() {
    let dir = scratch();
    for cache in [CacheMode::PageCache, CacheMode::Direct] {
        let fixture = crate::file_fixture(dir.path(), cache);
        for size in [1, 4096, 3 * MIB + 4097] {
            conformance::check_target(&fixture, size).await;
        }
    }
}

#[tokio::test]
async fn direct_io_opens_o_direct_and_round_trips_an_unaligned_size() {
    let dir = scratch();
    let size = 2 * MIB + 4097;
    let src_path = dir.path().join("src.img");
    let dst_path = dir.path().join("dst.img");
    let image = conformance::test_image(size, 3);
    write_sparse(&src_path, &image);

    let spec =
        |p: &std::path::Path| EndpointSpec::parse(&format!("file://{}", p.display())).unwrap();
    let src = open_source(&spec(&src_path), &source_options(CacheMode::Direct))
        .await
        .unwrap();
    let dst = open_target(
        &spec(&dst_path),
        size,
        &target_options(CacheMode::Direct, Preallocation::Off),
    )
    .await
    .unwrap();
    let min = src.caps().block.minimum;
    assert!(min >= 4096 && min.is_power_of_two(), "direct minimum {min}");
    assert_eq!(dst.caps().block.minimum, min);
    for path in [&src_path, &dst_path] {
        let flags = open_flags(path);
        assert!(
            flags.iter().any(|f| f & libc::O_DIRECT as u32 != 0),
            "no O_DIRECT descriptor for {}: {flags:?}",
            path.display()
        );
    }

    // Copy in aligned 1 MiB requests; the last one ends in the partial block.
    let mut pos = 0;
    while pos < size {
        let n = (size - pos).min(MIB) as usize;
        let mut buf = IoBuf::new(MIB as usize);
        buf.set_len(n);
        let buf = src.read_at(pos, buf).await.unwrap();
        dst.write_at(pos, buf).await.unwrap();
        pos += n as u64;
    }
    dst.finish().await.unwrap();
    assert_eq!(std::fs::metadata(&dst_path).unwrap().len(), size);
    assert!(std::fs::read(&dst_path).unwrap() == image.data);
}

#[tokio::test]
async fn a_created_target_has_the_size_asked_and_is_zero() {
    let dir = scratch();
    let path = dir.path().join("new.img");
    let dst = open_target(
        &EndpointSpec::File(path.clone()),
        5 * MIB + 1,
        &Default::default(),
    )
    .await
    .unwrap();
    assert!(dst.is_zero());
    assert_eq!(dst.size(), 5 * MIB + 1);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 5 * MIB + 1);
    assert_eq!(crate::allocated(&path), 0, "a new target must be sparse");
}

#[tokio::test]
async fn an_existing_target_keeps_its_size_and_is_not_zero() {
    let dir = scratch();
    // Larger than needed: written over the first bytes only; the rest is kept.
    let path = dir.path().join("big.img");
    std::fs::write(&path, vec![3u8; 3 * MIB as usize]).unwrap();
    let dst = open_target(&EndpointSpec::File(path.clone()), MIB, &Default::default())
        .await
        .unwrap();
    assert!(!dst.is_zero());
    assert_eq!(dst.size(), 3 * MIB);
    let mut buf = IoBuf::new(MIB as usize);
    buf.fill(4);
    dst.write_at(0, buf).await.unwrap();
    dst.finish().await.unwrap();
    let data = std::fs::read(&path).unwrap();
    assert_eq!(data.len(), 3 * MIB as usize);
    assert!(data[..MIB as usize].iter().all(|b| *b == 4));
    assert!(data[MIB as usize..].iter().all(|b| *b == 3));

    // Exactly the size needed, with data: not zero either.
    let same = dir.path().join("same.img");
    std::fs::write(&same, vec![1u8; 4096]).unwrap();
    let dst = open_target(&EndpointSpec::File(same), 4096, &Default::default())
        .await
        .unwrap();
    assert!(!dst.is_zero());

    // Zero length: extended to the size and known zero.
    let empty = dir.path().join("empty.img");
    File::create(&empty).unwrap();
    let dst = open_target(&EndpointSpec::File(empty.clone()), MIB, &Default::default())
        .await
        .unwrap();
    assert!(dst.is_zero());
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), MIB);
}

#[tokio::test]
async fn reads_and_writes_past_the_end_are_refused() {
    let dir = scratch();
    let path = dir.path().join("x.img");
    std::fs::write(&path, vec![1u8; 8192]).unwrap();
    let src = crate::open_source(&path, CacheMode::PageCache).await;
    let err = src.read_at(8192 - 10, IoBuf::new(11)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("past the end"), "{err}");

    let dst = open_target(&EndpointSpec::File(path.clone()), 8192, &Default::default())
        .await
        .unwrap();
    let err = dst.write_at(8192, IoBuf::new(1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = dst
        .write_zeroes(4096, 4097, ZeroMode::MayDeallocate)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        8192,
        "the file grew"
    );
}

#[tokio::test]
async fn a_source_that_shrank_fails_the_read_with_a_clear_error() {
    let dir = scratch();
    let path = dir.path().join("shrinks.img");
    std::fs::write(&path, vec![1u8; 8192]).unwrap();
    let src = crate::open_source(&path, CacheMode::PageCache).await;
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let err = src.read_at(4096, IoBuf::new(4096)).await.unwrap_err();
    assert!(err.to_string().contains("shorter than it was"), "{err}");
    assert_eq!(err.context().offset, Some(4096));
    assert_eq!(err.context().operation, Some("read"));
}

#[tokio::test]
async fn handles_from_connect_share_the_file() {
    let dir = scratch();
    let path = dir.path().join("shared.img");
    let dst = open_target(
        &EndpointSpec::File(path.clone()),
        2 * MIB,
        &Default::default(),
    )
    .await
    .unwrap();
    let other = dst.connect().await.unwrap();
    let mut a = IoBuf::new(MIB as usize);
    a.fill(1);
    let mut b = IoBuf::new(MIB as usize);
    b.fill(2);
    let (ra, rb) = tokio::join!(dst.write_at(0, a), other.write_at(MIB, b));
    ra.unwrap();
    rb.unwrap();
    drop(other);
    dst.finish().await.unwrap();
    let f = File::open(&path).unwrap();
    let mut buf = [0u8; 2];
    f.read_exact_at(&mut buf[..1], MIB - 1).unwrap();
    f.read_exact_at(&mut buf[1..], MIB).unwrap();
    assert_eq!(buf, [1, 2]);
}
