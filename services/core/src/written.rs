//! What a copy tells an observer about its progress on the target: the relay (an NBD
//! export of the image a copy is writing) lives in the endpoints and the copy in the
//! engine, so the contract between them lives here.

/// Told of every range a copy has written to its target (or handled as zeroes), as soon as
/// the write completed: a relay serves what its copy wrote before the copy ends.
pub trait WrittenRanges: Send + Sync + 'static {
    /// `[start, end)` holds the source's bytes on the target now; `zero` when it reads as
    /// zeroes (written as zeroes, or left alone on a target that already reads as zeroes).
    /// Ranges a resumed copy skips are reported as data when it starts.
    fn written(&self, start: u64, end: u64, zero: bool);
}
