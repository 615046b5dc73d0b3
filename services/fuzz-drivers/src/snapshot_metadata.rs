//! The CSI SnapshotMetadata fuzz target: `snapshot_metadata_replies` decodes a stream of
//! `GetMetadataDeltaResponse` messages (each preceded by a 2-byte length) as a malicious
//! service could send them, feeds each to the client's validation
//! (`ferry_snapshot_metadata::validate::Collector`), resuming it where the input says, and
//! checks that whatever it accepts is what a backup may trust: sorted, disjoint, non-empty
//! ranges within the capacity, no more of them than the limit.

use ferry_snapshot_metadata::proto::GetMetadataDeltaResponse;
use ferry_snapshot_metadata::validate::Collector;
use prost::Message;

/// Ranges the fuzzed collector accepts at most.
const LIMIT: usize = 64;

/// Length-prefixed messages; a zero length resumes the stream instead.
pub fn snapshot_metadata_replies(data: &[u8]) {
    let mut collector = Collector::new(LIMIT, None);
    let mut rest = data;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
        if len == 0 {
            collector.resume();
            continue;
        }
        let (body, tail) = rest.split_at(len.min(rest.len()));
        rest = tail;
        let Ok(reply) = GetMetadataDeltaResponse::decode(body) else {
            return;
        };
        if collector
            .accept(
                reply.block_metadata_type,
                reply.volume_capacity_bytes,
                &reply.block_metadata,
            )
            .is_err()
        {
            return;
        }
    }
    let Ok(ranges) = collector.finish() else {
        return;
    };
    assert!(ranges.ranges.len() <= LIMIT);
    let mut end = 0;
    for &(s, e) in &ranges.ranges {
        assert!(s >= end && e > s && e <= ranges.capacity, "{ranges:?}");
        end = e;
    }
}
