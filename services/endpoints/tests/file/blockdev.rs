//! Block devices (loop devices over scratch files; needs root): size from BLKGETSIZE64,
//! the conformance suite in both cache modes, zeroing, exclusive opens, too-small devices.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::{conformance, scratch, target_options, LoopDevice, MIB};
use ferry_core::{EndpointSpec, ErrorKind, Extent, IoBuf, ZeroMode};
use ferry_endpoints::{open_target, CacheMode, Preallocation};

#[tokio::test]
async fn a_block_device_conforms_as_source_and_target() {
    let dir = scratch();
    let size = 8 * MIB;
    let backing = dir.path().join("disk.img");
    let image = conformance::test_image(size, 21);
    std::fs::write(&backing, &image.data).unwrap();
    let dev = LoopDevice::attach(&backing);

    for cache in [CacheMode::PageCache, CacheMode::Direct] {
        let src = crate::open_source(&dev.path, cache).await;
        assert_eq!(src.size(), size, "BLKGETSIZE64");
        let caps = src.caps();
        assert!(!caps.extents, "a block device cannot report holes");
        if cache == CacheMode::Direct {
            assert_eq!(
                caps.block.minimum, 512,
                "the loop device's logical block size"
            );
        }
        // Everything is data.
        assert_eq!(
            src.extents(0, size).await.unwrap(),
            vec![Extent::data(0, size)]
        );
        conformance::check_source(src, &image.data).await;
    }
    for cache in [CacheMode::PageCache, CacheMode::Direct] {
        let fixture = crate::device_fixture(&dev.path, cache);
        conformance::check_target(&fixture, size).await;
        // Smaller images than the device are written over its first bytes only.
        conformance::check_target(&fixture, size - 3 * 4096).await;
    }
}

#[tokio::test]
async fn a_block_device_target_zeroes_in_both_modes_and_is_exclusive() {
    let dir = scratch();
    let size = 8 * MIB;
    let backing = dir.path().join("disk.img");
    std::fs::write(&backing, vec![0xABu8; size as usize]).unwrap();
    let dev = LoopDevice::attach(&backing);
    let spec = EndpointSpec::File(dev.path.clone());

    let dst = open_target(
        &spec,
        size,
        &target_options(CacheMode::PageCache, Preallocation::Full),
    )
    .await
    .unwrap();
    assert!(!dst.is_zero(), "a device is never known to be zero");
    assert_eq!(dst.size(), size);
    assert!(dst.caps().efficient_zero);

    // A second writer is refused while the first holds the device.
    let err = open_target(&spec, size, &Default::default())
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("in use"), "{err}");

    dst.write_zeroes(MIB, MIB, ZeroMode::MayDeallocate)
        .await
        .unwrap();
    dst.write_zeroes(3 * MIB, MIB, ZeroMode::Allocate)
        .await
        .unwrap();
    // Unaligned edges are written, the middle is zeroed by the device.
    dst.write_zeroes(5 * MIB + 100, MIB, ZeroMode::MayDeallocate)
        .await
        .unwrap();
    let mut buf = IoBuf::new(4096);
    buf.fill(0x11);
    dst.write_at(7 * MIB, buf).await.unwrap();
    dst.finish().await.unwrap();
    drop(dst);

    let f = File::open(&dev.path).unwrap();
    let mut data = vec![0u8; size as usize];
    f.read_exact_at(&mut data, 0).unwrap();
    for (i, b) in data.iter().enumerate() {
        let i = i as u64;
        let want = if (MIB..2 * MIB).contains(&i)
            || (3 * MIB..4 * MIB).contains(&i)
            || (5 * MIB + 100..6 * MIB + 100).contains(&i)
        {
            0
        } else if (7 * MIB..7 * MIB + 4096).contains(&i) {
            0x11
        } else {
            0xAB
        };
        assert_eq!(*b, want, "byte {i}");
    }
}

#[tokio::test]
async fn a_block_device_smaller_than_the_source_is_refused() {
    let dir = scratch();
    let backing = dir.path().join("disk.img");
    File::create(&backing).unwrap().set_len(4 * MIB).unwrap();
    let dev = LoopDevice::attach(&backing);
    let err = open_target(
        &EndpointSpec::File(dev.path.clone()),
        4 * MIB + 512,
        &Default::default(),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let text = err.to_string();
    assert!(text.contains(&format!("{} bytes", 4 * MIB)), "{text}");
    assert!(text.contains(&format!("{} bytes", 4 * MIB + 512)), "{text}");
}
