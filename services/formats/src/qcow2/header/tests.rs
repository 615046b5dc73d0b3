//! One test per bound of the header: each malicious field is an error, never a panic.

use super::*;

const FILE: u64 = 1 << 30;

/// A valid v3 header: 64 KiB clusters, 1 GiB virtual, L1 of 2 entries at 0x30000.
fn v3() -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[0..4].copy_from_slice(&MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&3u32.to_be_bytes());
    h[20..24].copy_from_slice(&16u32.to_be_bytes());
    h[24..32].copy_from_slice(&(1u64 << 30).to_be_bytes());
    h[36..40].copy_from_slice(&2u32.to_be_bytes());
    h[40..48].copy_from_slice(&0x30000u64.to_be_bytes());
    h[96..100].copy_from_slice(&4u32.to_be_bytes());
    h[100..104].copy_from_slice(&112u32.to_be_bytes());
    h
}

fn set32(h: &mut [u8], at: usize, v: u32) {
    h[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn set64(h: &mut [u8], at: usize, v: u64) {
    h[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

fn err(h: &[u8]) -> Error {
    Header::parse(h, FILE).unwrap_err()
}

#[test]
fn parses_a_valid_header() {
    let h = Header::parse(&v3(), FILE).unwrap();
    assert_eq!(h.version, 3);
    assert_eq!(h.cluster_size(), 65536);
    assert_eq!(h.size, 1 << 30);
    assert_eq!(h.compression, Compression::Deflate);
    assert!(!h.extended_l2);
    assert_eq!(h.backing, None);
}

#[test]
fn short_image_and_bad_magic() {
    assert!(err(&v3()[..100]).message().contains("too short"));
    let mut h = v3();
    h[3] = 0;
    assert!(err(&h).message().contains("magic"));
}

#[test]
fn unknown_version() {
    let mut h = v3();
    set32(&mut h, 4, 4);
    assert_eq!(err(&h).kind(), ErrorKind::Unsupported);
}

#[test]
fn cluster_bits_out_of_range() {
    for bits in [0, 8, 22, 63, u32::MAX] {
        let mut h = v3();
        set32(&mut h, 20, bits);
        assert_eq!(err(&h).kind(), ErrorKind::Corrupt, "bits {bits}");
    }
}

#[test]
fn encryption_is_refused() {
    let mut h = v3();
    set32(&mut h, 32, 2);
    let e = err(&h);
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(e.message().contains("encrypted"), "{e}");
}

#[test]
fn header_length_out_of_bounds() {
    for len in [0, 103, 4097, u32::MAX] {
        let mut h = v3();
        set32(&mut h, 100, len);
        assert_eq!(err(&h).kind(), ErrorKind::Corrupt, "len {len}");
    }
}

#[test]
fn unknown_incompatible_features_and_external_data_file() {
    let mut h = v3();
    set64(&mut h, 72, 1 << 20);
    assert!(err(&h).message().contains("unknown incompatible"));
    set64(&mut h, 72, 1 << 2);
    assert!(err(&h).message().contains("external data file"));
    set64(&mut h, 72, 1 << 1);
    assert!(err(&h).message().contains("marked corrupt"));
}

#[test]
fn compression_type_bounds() {
    let mut h = v3();
    h[104] = 1;
    assert_eq!(err(&h).kind(), ErrorKind::Corrupt);
    set64(&mut h, 72, 1 << 3);
    assert_eq!(
        Header::parse(&h, FILE).unwrap().compression,
        Compression::Zstd
    );
    h[104] = 7;
    assert_eq!(err(&h).kind(), ErrorKind::Unsupported);
}

#[test]
fn extended_l2_needs_16k_clusters() {
    let mut h = v3();
    set64(&mut h, 72, 1 << 4);
    assert!(
        err(&h).message().contains("too few"),
        "half the coverage per L2 table"
    );
    set32(&mut h, 36, 4);
    assert!(Header::parse(&h, FILE).unwrap().extended_l2);
    set32(&mut h, 20, 13);
    set32(&mut h, 36, 64);
    assert!(err(&h).message().contains("16 KiB"));
}

#[test]
fn l1_table_that_would_need_gigabytes() {
    let mut h = v3();
    set32(&mut h, 36, u32::MAX);
    assert!(err(&h).message().contains("L1 table would be"));
}

#[test]
fn l1_table_too_small_for_the_virtual_size() {
    let mut h = v3();
    set64(&mut h, 24, u64::MAX);
    assert!(err(&h).message().contains("too few"));
}

#[test]
fn l1_offset_past_the_end_or_unaligned() {
    let mut h = v3();
    set64(&mut h, 40, FILE);
    assert!(err(&h).message().contains("past the end"));
    set64(&mut h, 40, u64::MAX - 0xffff);
    assert!(err(&h).message().contains("past the end"));
    set64(&mut h, 40, 0x30008);
    assert!(err(&h).message().contains("aligned"));
}

#[test]
fn backing_name_bounds() {
    let mut h = v3();
    set64(&mut h, 8, 0x200);
    set32(&mut h, 16, 0);
    assert!(err(&h).message().contains("length"));
    set32(&mut h, 16, 5000);
    assert!(err(&h).message().contains("length"));
    set64(&mut h, 8, 65536 - 4);
    set32(&mut h, 16, 10);
    assert!(err(&h).message().contains("outside"));
    set32(&mut h, 16, 4);
    assert_eq!(Header::parse(&h, FILE).unwrap().backing, Some((65532, 4)));
}

#[test]
fn extensions_give_the_backing_format_and_stay_in_bounds() {
    let mut h = v3();
    set32(&mut h, 112, 0xe279_2aca);
    set32(&mut h, 116, 5);
    h[120..125].copy_from_slice(b"qcow2");
    assert_eq!(
        Header::parse(&h, FILE).unwrap().backing_format.as_deref(),
        Some("qcow2")
    );
    set32(&mut h, 116, u32::MAX);
    assert_eq!(Header::parse(&h, FILE).unwrap().backing_format, None);
}
