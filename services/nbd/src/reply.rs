//! Assembling and checking the reply to one request.
//!
//! A [`Tracker`] knows what was asked (command, offset, length, selected contexts) and
//! checks each chunk against it: content inside the request and not overlapping, error
//! offsets inside the request, one block status chunk per context, and, at the end, that
//! a successful read covered every byte. It does no I/O; the reader task feeds it.

use std::ops::Range;

use crate::config::MetaContext;
use crate::error::{Error, Result, ServerError};
use crate::proto::{self, *};
use crate::wire::{Descriptor, ReplyMode};

/// The most disjoint pieces a read reply may arrive in before the client calls the
/// server abusive (in-order servers produce one).
pub const MAX_FRAGMENTS: usize = 4096;

/// One extent of a metadata context, in absolute export offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusExtent {
    pub offset: u64,
    pub len: u64,
    /// The context's flags (for `base:allocation`: NBD_STATE_HOLE, NBD_STATE_ZERO).
    pub flags: u64,
}

impl StatusExtent {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// The extents one metadata context reported, starting at the request offset,
/// contiguous, clipped to the requested range (possibly covering only a prefix of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextStatus {
    pub id: u32,
    pub name: String,
    pub extents: Vec<StatusExtent>,
}

/// The answer to a block status request: one entry per selected context.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockStatus {
    pub contexts: Vec<ContextStatus>,
}

impl BlockStatus {
    /// The extents of the context called `name`.
    pub fn context(&self, name: &str) -> Option<&[StatusExtent]> {
        self.contexts
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.extents.as_slice())
    }
}

/// Which byte ranges of a read have arrived: sorted, disjoint, adjacent ones merged.
#[derive(Debug, Default)]
struct Coverage {
    ranges: Vec<(u64, u64)>,
    total: u64,
}

impl Coverage {
    fn insert(&mut self, start: u64, end: u64) -> std::result::Result<(), String> {
        let i = self.ranges.partition_point(|r| r.1 < start);
        let mut j = i;
        while j < self.ranges.len() && self.ranges[j].0 <= end {
            let (s, e) = self.ranges[j];
            if s < end && e > start {
                return Err(format!(
                    "overlaps bytes {s}..{e} that an earlier chunk already delivered"
                ));
            }
            j += 1;
        }
        let merged_start = if i < j {
            self.ranges[i].0.min(start)
        } else {
            start
        };
        let merged_end = if i < j {
            self.ranges[j - 1].1.max(end)
        } else {
            end
        };
        self.ranges.splice(i..j, [(merged_start, merged_end)]);
        self.total += end - start;
        if self.ranges.len() > MAX_FRAGMENTS {
            return Err(format!(
                "leaves the read in more than {MAX_FRAGMENTS} disjoint pieces"
            ));
        }
        Ok(())
    }
}

/// What a simple reply to a read means.
#[derive(Debug, PartialEq, Eq)]
pub enum SimpleRead {
    /// `len` bytes of data follow.
    Data,
    /// No payload follows.
    NoData,
}

/// The state of one request's reply.
#[derive(Debug)]
pub struct Tracker {
    command: u16,
    offset: u64,
    len: u64,
    error: Option<ServerError>,
    coverage: Coverage,
    status: Vec<ContextStatus>,
}

impl Tracker {
    pub fn new(command: u16, offset: u64, len: u64) -> Self {
        Self {
            command,
            offset,
            len,
            error: None,
            coverage: Coverage::default(),
            status: Vec::new(),
        }
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    fn name(&self) -> &'static str {
        proto::command_name(self.command)
    }

    fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }

    fn describe(&self) -> String {
        format!(
            "{} of {} bytes at offset {}",
            self.name(),
            self.len,
            self.offset
        )
    }

    /// Extended replies repeat the request's offset; a different one means confusion.
    pub fn check_header_offset(&self, offset: u64) -> Result<()> {
        if offset != self.offset {
            return Err(Error::protocol(format!(
                "reply header for {} names offset {offset}",
                self.describe()
            )));
        }
        Ok(())
    }

    /// A simple reply (always final).
    pub fn on_simple(&mut self, errno: u32, mode: ReplyMode) -> Result<SimpleRead> {
        if errno != 0 {
            self.record(ServerError {
                errno,
                message: None,
                offset: None,
            });
            return Ok(SimpleRead::NoData);
        }
        match self.command {
            CMD_READ if mode == ReplyMode::Simple => Ok(SimpleRead::Data),
            CMD_READ | CMD_BLOCK_STATUS => Err(Error::protocol(format!(
                "simple success reply to {}, which needs a structured reply",
                self.describe()
            ))),
            _ => Ok(SimpleRead::NoData),
        }
    }

    fn record(&mut self, err: ServerError) {
        self.error.get_or_insert(err);
    }

    /// Checks that a chunk type fits this request and the negotiated headers, and that
    /// its announced payload length is plausible, before anything of it is read.
    pub fn check_chunk(&self, kind: u16, len: u64, flags: u16, mode: ReplyMode) -> Result<()> {
        let bad_len = |what: String| {
            Err(Error::protocol(format!(
                "{} of {len} bytes in the reply to {}: {what}",
                proto::chunk_name(kind),
                self.describe()
            )))
        };
        match kind {
            REPLY_TYPE_NONE => {
                if len != 0 {
                    return bad_len("must be empty".into());
                }
                if flags & REPLY_FLAG_DONE == 0 {
                    return Err(Error::protocol(format!(
                        "NBD_REPLY_TYPE_NONE without the DONE flag in the reply to {}",
                        self.describe()
                    )));
                }
            }
            REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE if self.command != CMD_READ => {
                return self.unexpected(kind);
            }
            REPLY_TYPE_OFFSET_DATA => {
                if len < 9 {
                    return bad_len("must carry an offset and at least one byte".into());
                }
                if len - 8 > self.len {
                    return bad_len(format!("larger than the {}-byte request", self.len));
                }
            }
            REPLY_TYPE_OFFSET_HOLE => {
                if len != 12 {
                    return bad_len("must be 12 bytes".into());
                }
            }
            REPLY_TYPE_BLOCK_STATUS | REPLY_TYPE_BLOCK_STATUS_EXT => {
                let want = if mode == ReplyMode::Extended {
                    REPLY_TYPE_BLOCK_STATUS_EXT
                } else {
                    REPLY_TYPE_BLOCK_STATUS
                };
                if self.command != CMD_BLOCK_STATUS || kind != want {
                    return self.unexpected(kind);
                }
                if len > crate::wire::MAX_STATUS_CHUNK {
                    return bad_len(format!(
                        "more than the {} allowed",
                        crate::wire::MAX_STATUS_CHUNK
                    ));
                }
            }
            k if k & REPLY_TYPE_FLAG_ERROR != 0 => {
                if len > crate::wire::MAX_ERROR_CHUNK {
                    return bad_len(format!(
                        "more than the {} an error chunk can need",
                        crate::wire::MAX_ERROR_CHUNK
                    ));
                }
            }
            _ => return self.unexpected(kind),
        }
        Ok(())
    }

    fn unexpected<T>(&self, kind: u16) -> Result<T> {
        Err(Error::protocol(format!(
            "unexpected chunk {} ({kind}) in the reply to {}",
            proto::chunk_name(kind),
            self.describe()
        )))
    }

    /// Places a content chunk: returns where its bytes go in the read buffer.
    fn place(&mut self, what: &str, offset: u64, len: u64) -> Result<Range<usize>> {
        let end = offset.checked_add(len);
        let inside = offset >= self.offset && end.is_some_and(|e| e <= self.end());
        if !inside {
            return Err(Error::protocol(format!(
                "{what} for bytes {offset}..{} lies outside {}",
                offset as u128 + len as u128,
                self.describe()
            )));
        }
        let end = offset + len;
        self.coverage
            .insert(offset, end)
            .map_err(|why| Error::protocol(format!("{what} for bytes {offset}..{end} {why}")))?;
        let start = (offset - self.offset) as usize;
        Ok(start..start + len as usize)
    }

    /// An OFFSET_DATA chunk at `offset` with `len` data bytes.
    pub fn on_data(&mut self, offset: u64, len: u64) -> Result<Range<usize>> {
        self.place("data chunk", offset, len)
    }

    /// An OFFSET_HOLE chunk.
    pub fn on_hole(&mut self, offset: u64, len: u64) -> Result<Range<usize>> {
        self.place("hole chunk", offset, len)
    }

    /// An error chunk.
    pub fn on_error(&mut self, err: ServerError) -> Result<()> {
        if let Some(at) = err.offset {
            let inside = at >= self.offset && at < self.end();
            if !inside {
                return Err(Error::protocol(format!(
                    "error chunk names offset {at}, outside {}",
                    self.describe()
                )));
            }
        }
        self.record(err);
        Ok(())
    }

    /// A block status chunk for context `id`.
    pub fn on_status(
        &mut self,
        id: u32,
        descriptors: &[Descriptor],
        contexts: &[MetaContext],
    ) -> Result<()> {
        let Some(context) = contexts.iter().find(|c| c.id == id) else {
            return Err(Error::protocol(format!(
                "block status for metadata context id {id}, which was not selected"
            )));
        };
        if self.status.iter().any(|s| s.id == id) {
            return Err(Error::protocol(format!(
                "two block status chunks for context {} in one reply",
                context.name
            )));
        }
        let end = self.end();
        let mut cursor = self.offset;
        let mut extents = Vec::with_capacity(descriptors.len().min(4096));
        for d in descriptors {
            if cursor >= end {
                // The last extent may reach past the request; anything after it is noise.
                break;
            }
            let next = cursor.checked_add(d.len).ok_or_else(|| {
                Error::protocol(format!(
                    "block status extents for context {} overflow 64 bits",
                    context.name
                ))
            })?;
            extents.push(StatusExtent {
                offset: cursor,
                len: next.min(end) - cursor,
                flags: d.flags,
            });
            cursor = next;
        }
        self.status.push(ContextStatus {
            id,
            name: context.name.clone(),
            extents,
        });
        Ok(())
    }

    /// The reply is complete: the request's outcome.
    ///
    /// `Ok(Err(_))` is the server's error for this request; `Err(_)` means the server
    /// broke the protocol.
    pub fn finish(
        self,
        contexts: &[MetaContext],
    ) -> Result<std::result::Result<BlockStatus, ServerError>> {
        if let Some(err) = self.error {
            return Ok(Err(err));
        }
        match self.command {
            CMD_READ if self.coverage.total != self.len => Err(Error::protocol(format!(
                "the server completed {} after delivering only {} bytes",
                self.describe(),
                self.coverage.total
            ))),
            CMD_BLOCK_STATUS => {
                if let Some(missing) = contexts
                    .iter()
                    .find(|c| !self.status.iter().any(|s| s.id == c.id))
                {
                    return Err(Error::protocol(format!(
                        "the server completed {} without status for context {}",
                        self.describe(),
                        missing.name
                    )));
                }
                Ok(Ok(BlockStatus {
                    contexts: self.status,
                }))
            }
            _ => Ok(Ok(BlockStatus::default())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Vec<MetaContext> {
        vec![
            MetaContext {
                id: 1,
                name: "base:allocation".into(),
            },
            MetaContext {
                id: 9,
                name: "qemu:allocation-depth".into(),
            },
        ]
    }

    #[test]
    fn coverage_merges_and_rejects_overlap() {
        let mut c = Coverage::default();
        c.insert(10, 20).unwrap();
        c.insert(30, 40).unwrap();
        c.insert(20, 30).unwrap();
        assert_eq!(c.ranges, vec![(10, 40)]);
        assert_eq!(c.total, 30);
        assert!(c.insert(39, 41).is_err());
        assert!(c.insert(0, 11).is_err());
        assert!(c.insert(15, 16).is_err());
        c.insert(0, 10).unwrap();
        c.insert(40, 50).unwrap();
        assert_eq!(c.ranges, vec![(0, 50)]);
    }

    #[test]
    fn fragmentation_is_bounded() {
        let mut c = Coverage::default();
        let mut failed = false;
        for i in 0..(MAX_FRAGMENTS as u64 + 10) {
            if c.insert(i * 2, i * 2 + 1).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed);
    }

    #[test]
    fn read_chunks_must_stay_inside_and_cover() {
        let mut t = Tracker::new(CMD_READ, 1000, 100);
        assert!(t.on_data(999, 10).is_err());
        let mut t = Tracker::new(CMD_READ, 1000, 100);
        assert!(t.on_data(1050, 51).is_err());
        let mut t = Tracker::new(CMD_READ, 1000, 100);
        assert!(t.on_hole(u64::MAX, 2).is_err());
        let mut t = Tracker::new(CMD_READ, 1000, 100);
        assert_eq!(t.on_data(1050, 50).unwrap(), 50..100);
        assert!(t.finish(&[]).is_err());
        let mut t = Tracker::new(CMD_READ, 1000, 100);
        t.on_data(1050, 50).unwrap();
        t.on_hole(1000, 50).unwrap();
        assert!(t.finish(&[]).unwrap().is_ok());
    }

    #[test]
    fn errors_win_and_offsets_are_checked() {
        let mut t = Tracker::new(CMD_WRITE, 0, 512);
        let e = ServerError {
            errno: EIO,
            message: None,
            offset: Some(512),
        };
        assert!(t.on_error(e.clone()).is_err());
        let mut t = Tracker::new(CMD_WRITE, 0, 512);
        let e = ServerError {
            offset: Some(100),
            ..e
        };
        t.on_error(e.clone()).unwrap();
        assert_eq!(t.finish(&[]).unwrap().unwrap_err(), e);
        let mut t = Tracker::new(CMD_READ, 0, 512);
        assert!(t.on_simple(0, ReplyMode::Structured).is_err());
        let mut t = Tracker::new(CMD_READ, 0, 512);
        assert_eq!(t.on_simple(0, ReplyMode::Simple).unwrap(), SimpleRead::Data);
    }

    #[test]
    fn chunk_types_must_fit_the_command() {
        let t = Tracker::new(CMD_WRITE, 0, 512);
        assert!(t
            .check_chunk(REPLY_TYPE_OFFSET_DATA, 20, 0, ReplyMode::Structured)
            .is_err());
        assert!(t
            .check_chunk(REPLY_TYPE_NONE, 0, 0, ReplyMode::Structured)
            .is_err());
        assert!(t
            .check_chunk(REPLY_TYPE_NONE, 0, REPLY_FLAG_DONE, ReplyMode::Structured)
            .is_ok());
        assert!(t.check_chunk(77, 0, 0, ReplyMode::Structured).is_err());
        assert!(t
            .check_chunk(REPLY_TYPE_ERROR, 1 << 20, 0, ReplyMode::Structured)
            .is_err());
        let r = Tracker::new(CMD_READ, 0, 512);
        assert!(r
            .check_chunk(REPLY_TYPE_OFFSET_DATA, 8 + 513, 0, ReplyMode::Structured)
            .is_err());
        assert!(r
            .check_chunk(REPLY_TYPE_OFFSET_DATA, 8 + 512, 0, ReplyMode::Structured)
            .is_ok());
        let b = Tracker::new(CMD_BLOCK_STATUS, 0, 512);
        assert!(b
            .check_chunk(REPLY_TYPE_BLOCK_STATUS_EXT, 24, 0, ReplyMode::Structured)
            .is_err());
        assert!(b
            .check_chunk(REPLY_TYPE_BLOCK_STATUS_EXT, 24, 0, ReplyMode::Extended)
            .is_ok());
    }

    #[test]
    fn block_status_is_clipped_and_complete() {
        let contexts = ctx();
        let mut t = Tracker::new(CMD_BLOCK_STATUS, 4096, 8192);
        let d = [
            Descriptor {
                len: 4096,
                flags: 3,
            },
            Descriptor {
                len: 1 << 20,
                flags: 0,
            },
            Descriptor { len: 5, flags: 1 },
        ];
        t.on_status(1, &d, &contexts).unwrap();
        assert!(t.on_status(1, &d, &contexts).is_err());
        assert!(t.on_status(2, &d, &contexts).is_err());
        let mut t2 = Tracker::new(CMD_BLOCK_STATUS, 4096, 8192);
        t2.on_status(1, &d, &contexts).unwrap();
        assert!(t2.finish(&contexts).is_err(), "missing context 9");
        t.on_status(9, &d[..1], &contexts).unwrap();
        let status = t.finish(&contexts).unwrap().unwrap();
        assert_eq!(
            status.context("base:allocation").unwrap(),
            &[
                StatusExtent {
                    offset: 4096,
                    len: 4096,
                    flags: 3
                },
                StatusExtent {
                    offset: 8192,
                    len: 4096,
                    flags: 0
                }
            ]
        );
        let mut t = Tracker::new(CMD_BLOCK_STATUS, 0, u64::MAX);
        let huge = [
            Descriptor {
                len: u64::MAX,
                flags: 0,
            },
            Descriptor { len: 2, flags: 0 },
        ];
        assert!(t.on_status(1, &huge, &contexts).is_ok());
    }
}
