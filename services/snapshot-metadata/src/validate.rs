//! Checking the service's block metadata before anything relies on it.
//!
//! A backup takes every range the service does not name from the parent backup unread,
//! so one wrong extent would make a wrong backup silently. [`Collector`] takes the
//! replies of one stream (and of the streams that resume it) and refuses the whole
//! answer at the first extent that breaks the protocol's promises: a known and constant
//! block style and capacity, `size_bytes > 0`, extents in strictly increasing order that
//! do not overlap, none past the capacity, constant sizes when FIXED_LENGTH. Adjacent
//! extents are joined as they come, and the joined ranges are bounded in number, so a
//! reply of millions of tiny extents costs bounded memory and ends in a clear error.

use crate::proto::{BlockMetadata, BlockMetadataType};

/// How the service cut its ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockStyle {
    /// FIXED_LENGTH: every extent has this size.
    Fixed(u64),
    /// VARIABLE_LENGTH: extents of any size.
    Variable,
}

/// A validated answer: the volume's capacity and its ranges, sorted, disjoint, joined
/// where adjacent, `[start, end)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranges {
    pub capacity: u64,
    pub style: BlockStyle,
    pub ranges: Vec<(u64, u64)>,
    /// Extents as the service sent them (before joining).
    pub extents_received: u64,
    /// How many times a broken stream was resumed.
    pub resumed: u32,
}

impl Ranges {
    /// Bytes the ranges cover.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }
}

/// A broken promise of the protocol, naming the offending values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Invalid {
    #[error("block_metadata_type is {0}, not FIXED_LENGTH or VARIABLE_LENGTH")]
    UnknownStyle(i32),
    #[error("block_metadata_type changed from {first:?} to {now:?} within one answer")]
    StyleChanged { first: BlockStyle, now: BlockStyle },
    #[error("volume_capacity_bytes is {0}, not a positive size")]
    BadCapacity(i64),
    #[error("volume_capacity_bytes changed from {first} to {now} within one answer")]
    CapacityChanged { first: u64, now: u64 },
    #[error("the volume's capacity is {capacity} bytes, not the {expected} bytes expected")]
    CapacityMismatch { capacity: u64, expected: u64 },
    #[error("an extent at byte_offset {offset} has size_bytes {size}, not a positive size")]
    EmptyExtent { offset: i64, size: i64 },
    #[error("an extent has a negative byte_offset {0}")]
    NegativeOffset(i64),
    #[error("the extent {offset}+{size} ends past the volume's capacity of {capacity} bytes")]
    PastCapacity {
        offset: u64,
        size: u64,
        capacity: u64,
    },
    #[error("the extent at {offset} comes after one at {previous}: extents out of order")]
    OutOfOrder { offset: u64, previous: u64 },
    #[error("the extent at {offset} overlaps the previous one, which ends at {previous_end}")]
    Overlapping { offset: u64, previous_end: u64 },
    #[error(
        "an extent's size_bytes is {size} in a FIXED_LENGTH answer whose extents are {fixed} bytes"
    )]
    NotFixed { size: u64, fixed: u64 },
    #[error("the answer holds more than {limit} separate ranges (after joining adjacent ones): refused as implausible")]
    TooManyExtents { limit: usize },
}

/// Takes the replies of one answer, checking each extent as it comes.
#[derive(Debug)]
pub struct Collector {
    limit: usize,
    expected_capacity: Option<u64>,
    capacity: Option<u64>,
    style: Option<BlockStyle>,
    ranges: Vec<(u64, u64)>,
    /// Start of the last extent accepted, and where it ended.
    last: Option<(u64, u64)>,
    /// Where a resumed stream starts: its first extents may begin before it (the sidecar
    /// promises only that they end after it), and are cut there.
    resume_from: u64,
    /// No extent of the current stream was seen yet.
    fresh_stream: bool,
    received: u64,
    resumed: u32,
}

impl Collector {
    /// At most `limit` separate ranges; `expected_capacity`, when given, must be the
    /// volume's capacity.
    pub fn new(limit: usize, expected_capacity: Option<u64>) -> Self {
        Self {
            limit,
            expected_capacity,
            capacity: None,
            style: None,
            ranges: Vec::new(),
            last: None,
            resume_from: 0,
            fresh_stream: true,
            received: 0,
            resumed: 0,
        }
    }

    /// Where a resumed stream should start: the end of the last extent accepted.
    pub fn resume_offset(&self) -> u64 {
        self.last.map_or(self.resume_from, |(_, end)| end)
    }

    /// A new stream resumes this answer from [`Collector::resume_offset`].
    pub fn resume(&mut self) {
        self.resume_from = self.resume_offset();
        self.fresh_stream = true;
        self.resumed += 1;
    }

    /// Checks and takes one reply message.
    pub fn accept(
        &mut self,
        style: i32,
        capacity: i64,
        blocks: &[BlockMetadata],
    ) -> Result<(), Invalid> {
        let style = match BlockMetadataType::try_from(style) {
            Ok(BlockMetadataType::FixedLength) => {
                BlockStyle::Fixed(blocks.first().map_or(0, |b| b.size_bytes.max(0) as u64))
            }
            Ok(BlockMetadataType::VariableLength) => BlockStyle::Variable,
            _ => return Err(Invalid::UnknownStyle(style)),
        };
        self.accept_style(style)?;
        let capacity = self.accept_capacity(capacity)?;
        for block in blocks {
            self.accept_block(block, capacity)?;
        }
        Ok(())
    }

    fn accept_style(&mut self, style: BlockStyle) -> Result<(), Invalid> {
        match (self.style, style) {
            (None, s) => self.style = Some(s),
            // A FIXED_LENGTH message with no extents says nothing of the size.
            (Some(BlockStyle::Fixed(0)), BlockStyle::Fixed(n)) => {
                self.style = Some(BlockStyle::Fixed(n))
            }
            (Some(BlockStyle::Fixed(_)), BlockStyle::Fixed(_)) => {}
            (Some(BlockStyle::Variable), BlockStyle::Variable) => {}
            (Some(first), now) => return Err(Invalid::StyleChanged { first, now }),
        }
        Ok(())
    }

    fn accept_capacity(&mut self, capacity: i64) -> Result<u64, Invalid> {
        if capacity <= 0 {
            return Err(Invalid::BadCapacity(capacity));
        }
        let capacity = capacity as u64;
        match self.capacity {
            None => {
                if let Some(expected) = self.expected_capacity.filter(|e| *e != capacity) {
                    return Err(Invalid::CapacityMismatch { capacity, expected });
                }
                self.capacity = Some(capacity);
            }
            Some(first) if first != capacity => {
                return Err(Invalid::CapacityChanged {
                    first,
                    now: capacity,
                })
            }
            Some(_) => {}
        }
        Ok(capacity)
    }

    fn accept_block(&mut self, block: &BlockMetadata, capacity: u64) -> Result<(), Invalid> {
        self.received += 1;
        if block.byte_offset < 0 {
            return Err(Invalid::NegativeOffset(block.byte_offset));
        }
        if block.size_bytes <= 0 {
            return Err(Invalid::EmptyExtent {
                offset: block.byte_offset,
                size: block.size_bytes,
            });
        }
        let (offset, size) = (block.byte_offset as u64, block.size_bytes as u64);
        if let Some(BlockStyle::Fixed(fixed)) = self.style {
            if size != fixed {
                return Err(Invalid::NotFixed { size, fixed });
            }
        }
        let end = match offset.checked_add(size) {
            Some(end) if end <= capacity => end,
            _ => {
                return Err(Invalid::PastCapacity {
                    offset,
                    size,
                    capacity,
                })
            }
        };
        let mut start = offset;
        if std::mem::take(&mut self.fresh_stream) && offset < self.resume_from {
            // The first extent of a resumed stream may begin before the resume offset
            // (the sidecar promises only that it ends after it): it is cut there.
            if end <= self.resume_from {
                return Err(Invalid::OutOfOrder {
                    offset,
                    previous: self.resume_from,
                });
            }
            start = self.resume_from;
        }
        match self.last {
            Some((previous, _)) if start <= previous => {
                return Err(Invalid::OutOfOrder { offset, previous });
            }
            Some((_, previous_end)) if start < previous_end => {
                return Err(Invalid::Overlapping {
                    offset,
                    previous_end,
                });
            }
            _ => {}
        }
        self.last = Some((start, end));
        match self.ranges.last_mut() {
            Some((_, e)) if *e == start => *e = end,
            _ => {
                if self.ranges.len() == self.limit {
                    return Err(Invalid::TooManyExtents { limit: self.limit });
                }
                self.ranges.push((start, end));
            }
        }
        Ok(())
    }

    /// The validated answer. A stream that sent no message at all says nothing of the
    /// capacity: the expected one (if any) stands in.
    pub fn finish(self) -> Result<Ranges, Invalid> {
        let capacity = match (self.capacity, self.expected_capacity) {
            (Some(c), _) | (None, Some(c)) => c,
            (None, None) => return Err(Invalid::BadCapacity(0)),
        };
        Ok(Ranges {
            capacity,
            style: self.style.unwrap_or(BlockStyle::Variable),
            ranges: self.ranges,
            extents_received: self.received,
            resumed: self.resumed,
        })
    }
}

#[cfg(test)]
mod tests;
