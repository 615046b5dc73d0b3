//! Checkpoints on the wire: `ferry.v1.Checkpoint` checked into the engine's [`Checkpoint`]
//! (a caller's `resume_from`: it decides which bytes are never copied, so every rule the
//! engine relies on is checked here), and the engine's checkpoint bounded for `Job`.

use ferry_core::Result;
use ferry_engine::Checkpoint;

use super::validation::invalid;
use ferry_api::proto;

/// Most ranges a checkpoint carries on the wire, in either direction.
pub const MAX_CHECKPOINT_RANGES: usize = 256;

/// A caller's checkpoint, checked: at most [`MAX_CHECKPOINT_RANGES`] ranges, each
/// non-empty and inside `size`, sorted and non-overlapping (adjacent ranges are fine).
/// Errors name the field and the range at fault. Whether `size` is the source's size is
/// known only when the job opens the source.
pub fn checkpoint_from_proto(what: &str, c: &proto::Checkpoint) -> Result<Checkpoint> {
    if c.committed.len() > MAX_CHECKPOINT_RANGES {
        return Err(invalid(format!(
            "{what}.committed has {} ranges: at most {MAX_CHECKPOINT_RANGES}",
            c.committed.len()
        )));
    }
    let mut committed = Vec::with_capacity(c.committed.len());
    let mut previous_end = 0;
    for (i, r) in c.committed.iter().enumerate() {
        let field = format!("{what}.committed[{i}] [{}, {})", r.start, r.end);
        if r.start >= r.end {
            return Err(invalid(format!(
                "{field} is empty: start must be below end"
            )));
        }
        if r.end > c.size {
            return Err(invalid(format!(
                "{field} ends beyond {what}.size {}",
                c.size
            )));
        }
        if r.start < previous_end {
            return Err(invalid(format!(
                "{field} starts before the end of the range before it ({previous_end}): \
                 ranges must be sorted and must not overlap"
            )));
        }
        previous_end = r.end;
        committed.push((r.start, r.end));
    }
    Ok(Checkpoint {
        size: c.size,
        committed,
    })
}

/// The first [`MAX_CHECKPOINT_RANGES`] ranges of a checkpoint: a subset of what is
/// committed, so still true (a resume from it copies the rest again).
pub fn bounded(c: &Checkpoint) -> Checkpoint {
    Checkpoint {
        size: c.size,
        committed: c
            .committed
            .iter()
            .take(MAX_CHECKPOINT_RANGES)
            .copied()
            .collect(),
    }
}

/// The wire form of a checkpoint, bounded (see [`bounded`]).
pub fn checkpoint_to_proto(c: &Checkpoint) -> proto::Checkpoint {
    proto::Checkpoint {
        size: c.size,
        committed: bounded(c)
            .committed
            .into_iter()
            .map(|(start, end)| proto::Range { start, end })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::ErrorKind;

    fn wire(size: u64, ranges: &[(u64, u64)]) -> proto::Checkpoint {
        proto::Checkpoint {
            size,
            committed: ranges
                .iter()
                .map(|&(start, end)| proto::Range { start, end })
                .collect(),
        }
    }

    #[test]
    fn valid_checkpoints_convert_exactly() {
        let c = checkpoint_from_proto("resume_from", &wire(100, &[(0, 10), (10, 20), (50, 100)]))
            .unwrap();
        assert_eq!(c.size, 100);
        assert_eq!(c.committed, [(0, 10), (10, 20), (50, 100)]);
        assert_eq!(c.committed_bytes(), 70);
        let empty = checkpoint_from_proto("resume_from", &wire(0, &[])).unwrap();
        assert!(empty.committed.is_empty());
        assert_eq!(
            checkpoint_to_proto(&c),
            wire(100, &[(0, 10), (10, 20), (50, 100)])
        );
    }

    #[test]
    fn invalid_checkpoints_name_the_problem() {
        let many: Vec<(u64, u64)> = (0..257).map(|i| (i * 2, i * 2 + 1)).collect();
        let cases = [
            (wire(100, &[(10, 10)]), "resume_from.committed[0] [10, 10) is empty"),
            (wire(100, &[(20, 10)]), "resume_from.committed[0] [20, 10) is empty"),
            (wire(100, &[(0, 101)]), "ends beyond resume_from.size 100"),
            (
                wire(100, &[(0, 10), (5, 20)]),
                "resume_from.committed[1] [5, 20) starts before the end of the range before it (10)",
            ),
            (wire(100, &[(50, 60), (0, 10)]), "must be sorted"),
            (wire(1000, &many), "resume_from.committed has 257 ranges: at most 256"),
        ];
        for (c, expected) in cases {
            let err = checkpoint_from_proto("resume_from", &c).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    #[test]
    fn a_long_checkpoint_is_bounded_to_a_true_prefix() {
        let ranges: Vec<(u64, u64)> = (0..1000).map(|i| (i * 10, i * 10 + 5)).collect();
        let c = Checkpoint {
            size: 10_000,
            committed: ranges.clone(),
        };
        let b = bounded(&c);
        assert_eq!(b.size, 10_000);
        assert_eq!(b.committed, ranges[..MAX_CHECKPOINT_RANGES]);
        let p = checkpoint_to_proto(&c);
        assert_eq!(p.committed.len(), MAX_CHECKPOINT_RANGES);
        // What goes out is accepted back in.
        assert_eq!(checkpoint_from_proto("resume_from", &p).unwrap(), b);
    }
}
