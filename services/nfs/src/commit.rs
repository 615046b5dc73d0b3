//! Which UNSTABLE writes a COMMIT must cover, and whether it did.
//!
//! An NFSv3 server may keep UNSTABLE writes in memory until COMMIT. Every WRITE reply and
//! every COMMIT reply carries the server's write verifier, which changes when the server
//! restarts: a write whose verifier differs from the COMMIT's may have been lost with the
//! restart. Ferry does not keep a copy of written data (that would double the memory of a
//! copy), so such a loss fails the flush with the ranges concerned; the engine's
//! checkpoint never counts them as committed, so a resume writes them again. Once a loss
//! is seen every later flush fails too, so a later success cannot hide it.

use parking_lot::Mutex;

use crate::v3::proto::Verifier;

/// One completed UNSTABLE write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    seq: u64,
    offset: u64,
    len: u64,
    verf: Verifier,
}

#[derive(Debug, Default)]
struct State {
    next_seq: u64,
    writes: Vec<Entry>,
    lost: Option<Lost>,
}

/// Writes that a server restart may have dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    pub writes: u64,
    pub bytes: u64,
    /// The first few ranges, sorted, as (offset, length).
    pub ranges: Vec<(u64, u64)>,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the NFS server restarted (its write verifier changed) before {} bytes in {} writes were committed, so they may be lost",
            self.bytes, self.writes
        )?;
        let shown: Vec<String> = self
            .ranges
            .iter()
            .map(|(o, l)| format!("{o}..{}", o + l))
            .collect();
        write!(f, " (ranges {}", shown.join(", "))?;
        if (self.ranges.len() as u64) < self.writes {
            f.write_str(", ...")?;
        }
        f.write_str("); copy again, or resume from the last checkpoint")
    }
}

/// Ranges shown in a [`Lost`] report.
const SHOWN: usize = 8;

/// The record of uncommitted writes of one file, shared by all its handles.
#[derive(Debug, Default)]
pub struct Tracker {
    state: Mutex<State>,
}

/// What a flush must cover: the writes completed before it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark(u64);

impl Tracker {
    /// Records a completed UNSTABLE write.
    pub fn record(&self, offset: u64, len: u64, verf: Verifier) {
        let mut st = self.state.lock();
        let seq = st.next_seq;
        st.next_seq += 1;
        st.writes.push(Entry {
            seq,
            offset,
            len,
            verf,
        });
    }

    /// Starts a flush: Ok(None) when no write needs a COMMIT, the mark otherwise, or the
    /// loss seen before.
    pub fn begin(&self) -> Result<Option<Mark>, Lost> {
        let st = self.state.lock();
        if let Some(lost) = &st.lost {
            return Err(lost.clone());
        }
        Ok((!st.writes.is_empty()).then_some(Mark(st.next_seq)))
    }

    /// Settles the writes before `mark` against the COMMIT's verifier: they are committed
    /// when the verifiers match, possibly lost otherwise.
    pub fn settle(&self, mark: Mark, commit: Verifier) -> Result<(), Lost> {
        let mut st = self.state.lock();
        let mut lost: Vec<Entry> = Vec::new();
        st.writes.retain(|e| {
            if e.seq >= mark.0 {
                return true;
            }
            if e.verf != commit {
                lost.push(*e);
            }
            false
        });
        if let Some(previous) = &st.lost {
            return Err(previous.clone());
        }
        if lost.is_empty() {
            return Ok(());
        }
        lost.sort_by_key(|e| e.offset);
        let report = Lost {
            writes: lost.len() as u64,
            bytes: lost.iter().map(|e| e.len).sum(),
            ranges: lost.iter().take(SHOWN).map(|e| (e.offset, e.len)).collect(),
        };
        st.lost = Some(report.clone());
        Err(report)
    }

    /// One flush of the writes completed so far: nothing when none is uncommitted, else
    /// `send` (the COMMIT, answering the server's verifier) and the verifier check. A loss,
    /// seen now or before, is the error `lost` makes of it.
    pub async fn commit<F, Fut, E>(&self, send: F, lost: impl Fn(Lost) -> E) -> Result<(), E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Verifier, E>>,
    {
        let mark = match self.begin() {
            Ok(Some(mark)) => mark,
            Ok(None) => return Ok(()),
            Err(e) => return Err(lost(e)),
        };
        let verf = send().await?;
        self.settle(mark, verf).map_err(lost)
    }

    /// Uncommitted writes recorded (for tests and diagnostics).
    pub fn pending(&self) -> usize {
        self.state.lock().writes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Verifier = [1; 8];
    const B: Verifier = [2; 8];

    #[test]
    fn matching_verifier_commits_everything_before_the_mark() {
        let t = Tracker::default();
        assert_eq!(t.begin(), Ok(None), "nothing to commit");
        t.record(0, 10, A);
        t.record(10, 10, A);
        let mark = t.begin().unwrap().unwrap();
        t.record(20, 10, B); // completes during the flush: not covered by it
        assert_eq!(t.settle(mark, A), Ok(()));
        assert_eq!(t.pending(), 1);
        let mark = t.begin().unwrap().unwrap();
        assert_eq!(t.settle(mark, B), Ok(()));
        assert_eq!(t.begin(), Ok(None));
    }

    #[test]
    fn a_changed_verifier_fails_this_and_every_later_flush() {
        let t = Tracker::default();
        t.record(4096, 4096, A);
        t.record(0, 4096, A);
        t.record(8192, 100, B);
        let mark = t.begin().unwrap().unwrap();
        let lost = t.settle(mark, B).unwrap_err();
        assert_eq!(lost.writes, 2);
        assert_eq!(lost.bytes, 8192);
        assert_eq!(lost.ranges, [(0, 4096), (4096, 4096)]);
        let text = lost.to_string();
        assert!(text.contains("restarted"), "{text}");
        assert!(text.contains("0..4096, 4096..8192"), "{text}");
        assert_eq!(t.begin(), Err(lost.clone()));
        t.record(0, 1, B);
        assert_eq!(t.begin(), Err(lost));
    }
}
