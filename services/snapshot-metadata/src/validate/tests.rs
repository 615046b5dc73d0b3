use super::*;

const VAR: i32 = BlockMetadataType::VariableLength as i32;
const FIXED: i32 = BlockMetadataType::FixedLength as i32;

fn b(offset: i64, size: i64) -> BlockMetadata {
    BlockMetadata {
        byte_offset: offset,
        size_bytes: size,
    }
}

fn collect(style: i32, capacity: i64, blocks: &[BlockMetadata]) -> Result<Ranges, Invalid> {
    let mut c = Collector::new(100, None);
    c.accept(style, capacity, blocks)?;
    c.finish()
}

#[test]
fn adjacent_extents_join_and_gaps_stay() {
    let r = collect(VAR, 100, &[b(0, 10), b(10, 5), b(20, 5), b(25, 75)]).unwrap();
    assert_eq!(r.ranges, vec![(0, 15), (20, 100)]);
    assert_eq!(r.extents_received, 4);
    assert_eq!(r.bytes(), 95);
    assert_eq!(r.style, BlockStyle::Variable);
    let r = collect(FIXED, 64, &[b(0, 16), b(32, 16)]).unwrap();
    assert_eq!(r.style, BlockStyle::Fixed(16));
    assert_eq!(r.ranges, vec![(0, 16), (32, 48)]);
}

#[test]
fn broken_promises_are_refused_by_name() {
    let cases: Vec<(i32, i64, Vec<BlockMetadata>, Invalid)> = vec![
        (0, 100, vec![b(0, 1)], Invalid::UnknownStyle(0)),
        (VAR, 0, vec![], Invalid::BadCapacity(0)),
        (
            VAR,
            100,
            vec![b(10, 0)],
            Invalid::EmptyExtent {
                offset: 10,
                size: 0,
            },
        ),
        (VAR, 100, vec![b(-5, 10)], Invalid::NegativeOffset(-5)),
        (
            VAR,
            100,
            vec![b(90, 20)],
            Invalid::PastCapacity {
                offset: 90,
                size: 20,
                capacity: 100,
            },
        ),
        (
            VAR,
            100,
            vec![b(i64::MAX - 1, 10)],
            Invalid::PastCapacity {
                offset: i64::MAX as u64 - 1,
                size: 10,
                capacity: 100,
            },
        ),
        (
            VAR,
            100,
            vec![b(50, 10), b(20, 10)],
            Invalid::OutOfOrder {
                offset: 20,
                previous: 50,
            },
        ),
        (
            VAR,
            100,
            vec![b(50, 10), b(50, 10)],
            Invalid::OutOfOrder {
                offset: 50,
                previous: 50,
            },
        ),
        (
            VAR,
            100,
            vec![b(50, 10), b(55, 10)],
            Invalid::Overlapping {
                offset: 55,
                previous_end: 60,
            },
        ),
        (
            FIXED,
            100,
            vec![b(0, 10), b(20, 5)],
            Invalid::NotFixed { size: 5, fixed: 10 },
        ),
    ];
    for (style, capacity, blocks, want) in cases {
        assert_eq!(
            collect(style, capacity, &blocks).unwrap_err(),
            want,
            "{blocks:?}"
        );
    }
}

#[test]
fn capacity_and_style_stay_constant_and_as_expected() {
    let mut c = Collector::new(10, None);
    c.accept(VAR, 100, &[b(0, 1)]).unwrap();
    assert_eq!(
        c.accept(VAR, 200, &[]).unwrap_err(),
        Invalid::CapacityChanged {
            first: 100,
            now: 200
        }
    );
    let mut c = Collector::new(10, None);
    c.accept(VAR, 100, &[b(0, 1)]).unwrap();
    assert!(matches!(
        c.accept(FIXED, 100, &[b(10, 1)]).unwrap_err(),
        Invalid::StyleChanged { .. }
    ));
    let mut c = Collector::new(10, Some(50));
    assert_eq!(
        c.accept(VAR, 100, &[]).unwrap_err(),
        Invalid::CapacityMismatch {
            capacity: 100,
            expected: 50
        }
    );
    // An empty FIXED_LENGTH message says nothing of the block size.
    let mut c = Collector::new(10, None);
    c.accept(FIXED, 100, &[]).unwrap();
    c.accept(FIXED, 100, &[b(0, 10), b(10, 10)]).unwrap();
    assert_eq!(c.finish().unwrap().ranges, vec![(0, 20)]);
}

#[test]
fn separate_ranges_are_bounded_but_adjacent_ones_are_not() {
    let mut c = Collector::new(3, None);
    let tiny: Vec<_> = (0..100_000).map(|i| b(i, 1)).collect();
    c.accept(VAR, 1 << 20, &tiny).unwrap();
    assert_eq!(c.finish().unwrap().ranges, vec![(0, 100_000)]);
    let mut c = Collector::new(3, None);
    let err = c
        .accept(VAR, 1 << 20, &[b(0, 1), b(2, 1), b(4, 1), b(6, 1)])
        .unwrap_err();
    assert_eq!(err, Invalid::TooManyExtents { limit: 3 });
    assert!(
        err.to_string().contains("more than 3 separate ranges"),
        "{err}"
    );
}

#[test]
fn a_resumed_stream_continues_where_the_last_extent_ended() {
    let mut c = Collector::new(10, None);
    c.accept(VAR, 100, &[b(0, 10), b(20, 10)]).unwrap();
    c.resume();
    assert_eq!(c.resume_offset(), 30);
    // The first extent may begin before the resume offset; it is cut there.
    c.accept(VAR, 100, &[b(25, 10), b(40, 10)]).unwrap();
    let r = c.finish().unwrap();
    assert_eq!(r.ranges, vec![(0, 10), (20, 35), (40, 50)]);
    assert_eq!(r.resumed, 1);

    // One that ends before the resume offset breaks the sidecar's promise.
    let mut c = Collector::new(10, None);
    c.accept(VAR, 100, &[b(0, 10), b(20, 10)]).unwrap();
    c.resume();
    assert_eq!(
        c.accept(VAR, 100, &[b(0, 10)]).unwrap_err(),
        Invalid::OutOfOrder {
            offset: 0,
            previous: 30
        }
    );
    // Only the first extent of a resumed stream may do so.
    let mut c = Collector::new(10, None);
    c.accept(VAR, 100, &[b(0, 10)]).unwrap();
    c.resume();
    assert!(c.accept(VAR, 100, &[b(20, 10), b(25, 10)]).is_err());
}
