//! Planning: work units from a shared cursor, extents asked lazily per unit, and the
//! aligned read and zero segments a worker turns them into.
//!
//! A worker never sees the whole disk's extents: it takes the next unit, asks the source
//! for extents of what remains of it (sources may answer with a prefix), and hands out
//! segments one at a time as it has room for another request.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferry_core::{Error, ExtentKind, Result, Source};
use parking_lot::Mutex;

use crate::geometry::{round_down, round_up, Geometry};
use crate::merge::ZeroMerger;
use crate::ranges::RangeSet;

/// Hands out work units in offset order to whichever worker asks first.
#[derive(Debug)]
pub(crate) struct Cursor {
    next: AtomicU64,
    units: u64,
    unit: u64,
    size: u64,
}

impl Cursor {
    pub fn new(geometry: &Geometry) -> Self {
        Self {
            next: AtomicU64::new(0),
            units: geometry.size.div_ceil(geometry.unit),
            unit: geometry.unit,
            size: geometry.size,
        }
    }

    /// The next unit's `[start, end)`, or None when the image is handed out.
    pub fn next_unit(&self) -> Option<(u64, u64)> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.units).then(|| (i * self.unit, ((i + 1) * self.unit).min(self.size)))
    }
}

/// A contiguous part of a unit that needs copying (a unit minus resumed ranges). Segments
/// of one span merge their zero runs (out-of-order commit).
#[derive(Debug)]
pub(crate) struct Span {
    pub merger: Mutex<ZeroMerger>,
}

/// One request's worth of work, in offset order per worker.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub offset: u64,
    pub len: u64,
    /// Known zero from the extents: needs no read.
    pub zero: bool,
    pub span: Arc<Span>,
}

impl Segment {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

#[derive(Debug, Clone, Copy)]
struct Piece {
    start: u64,
    end: u64,
    zero: bool,
}

/// One worker's planner.
pub(crate) struct Planner {
    geometry: Geometry,
    source: Arc<dyn Source>,
    cursor: Arc<Cursor>,
    resume: Arc<RangeSet>,
    /// Spans of the current unit still to plan.
    spans: VecDeque<(u64, u64)>,
    /// The span being planned, its next offset to ask extents for.
    span: Option<(Arc<Span>, u64, u64)>,
    pos: u64,
    /// Aligned pieces ready to cut into segments.
    ready: VecDeque<Piece>,
    /// The last piece, which the next extents answer may extend.
    carry: Option<Piece>,
}

impl std::fmt::Debug for Planner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planner")
            .field("span", &self.span.as_ref().map(|s| (s.1, s.2)))
            .field("pos", &self.pos)
            .finish_non_exhaustive()
    }
}

impl Planner {
    pub fn new(
        geometry: Geometry,
        source: Arc<dyn Source>,
        cursor: Arc<Cursor>,
        resume: Arc<RangeSet>,
    ) -> Self {
        Self {
            geometry,
            source,
            cursor,
            resume,
            spans: VecDeque::new(),
            span: None,
            pos: 0,
            ready: VecDeque::new(),
            carry: None,
        }
    }

    /// The next segment in offset order, or None when no work is left.
    pub async fn next(&mut self) -> Result<Option<Segment>> {
        loop {
            if let Some(seg) = self.cut() {
                return Ok(Some(seg));
            }
            match &self.span {
                Some((_, _, end)) if self.pos < *end => {
                    let end = *end;
                    self.plan_extents(end).await?;
                }
                Some(_) => {
                    if let Some(piece) = self.carry.take() {
                        self.ready.push_back(piece);
                    } else {
                        self.span = None;
                    }
                }
                None => {
                    if let Some((start, end)) = self.spans.pop_front() {
                        let merger = Mutex::new(ZeroMerger::new(start, end));
                        self.span = Some((Arc::new(Span { merger }), start, end));
                        self.pos = start;
                    } else if let Some((start, end)) = self.cursor.next_unit() {
                        self.spans.extend(self.resume.gaps(start, end));
                    } else {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Cuts the next segment off the first ready piece.
    fn cut(&mut self) -> Option<Segment> {
        let piece = self.ready.front_mut()?;
        let (span, _, _) = self.span.as_ref()?;
        let len = if piece.zero {
            piece.end - piece.start
        } else {
            (piece.end - piece.start).min(self.geometry.request as u64)
        };
        let seg = Segment {
            offset: piece.start,
            len,
            zero: piece.zero,
            span: Arc::clone(span),
        };
        piece.start += len;
        if piece.start == piece.end {
            self.ready.pop_front();
        }
        Some(seg)
    }

    async fn plan_extents(&mut self, end: u64) -> Result<()> {
        let pos = self.pos;
        let extents = self
            .source
            .extents(pos, end - pos)
            .await
            .map_err(|e| e.at("extents", pos).with_endpoint(self.source.describe()))?;
        let source = Arc::clone(&self.source);
        let bad = move |what: &str| {
            Error::protocol(format!("the source's extents are {what}"))
                .at("extents", pos)
                .with_endpoint(source.describe())
        };
        if extents.is_empty() {
            return Err(bad("empty"));
        }
        let mut at = pos;
        for e in extents {
            if e.offset != at || e.len == 0 {
                return Err(bad("not contiguous"));
            }
            let e_end = e.offset.saturating_add(e.len).min(end);
            let zero = matches!(e.kind, ExtentKind::Zero);
            self.add_extent(at, e_end, zero);
            at = e_end;
            if at == end {
                break;
            }
        }
        self.pos = at;
        Ok(())
    }

    /// Adds an extent, keeping zero pieces aligned: unaligned edges of a zero extent are
    /// read as data.
    fn add_extent(&mut self, start: u64, end: u64, zero: bool) {
        if !zero {
            self.push(Piece { start, end, zero });
            return;
        }
        let align = self.geometry.align;
        let zs = round_up(start, align);
        let ze = if end == self.geometry.size {
            end
        } else {
            round_down(end, align)
        };
        if zs >= ze {
            self.push(Piece {
                start,
                end,
                zero: false,
            });
            return;
        }
        for (s, e, z) in [(start, zs, false), (zs, ze, true), (ze, end, false)] {
            if s < e {
                self.push(Piece {
                    start: s,
                    end: e,
                    zero: z,
                });
            }
        }
    }

    fn push(&mut self, piece: Piece) {
        match &mut self.carry {
            Some(c) if c.zero == piece.zero && c.end == piece.start => c.end = piece.end,
            carry => {
                if let Some(done) = carry.replace(piece) {
                    self.ready.push_back(done);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CopyOptions;
    use ferry_core::{BlockSizes, Caps, Extent};
    use ferry_testkit::MemSource;

    fn plan_all(
        source: MemSource,
        options: &CopyOptions,
        resume: RangeSet,
    ) -> Vec<(u64, u64, bool)> {
        let size = source.len();
        let caps = source.caps_value();
        let geometry = Geometry::new(size, caps, Caps::default(), options).unwrap();
        let cursor = Arc::new(Cursor::new(&geometry));
        let mut planner = Planner::new(geometry, Arc::new(source), cursor, Arc::new(resume));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut out = Vec::new();
            while let Some(s) = planner.next().await.unwrap() {
                out.push((s.offset, s.len, s.zero));
            }
            out
        })
    }

    #[test]
    fn cuts_units_and_requests_and_keeps_zero_extents_whole() {
        // data 0..10000, zero 10000..30000, data 30000..40000
        let src = MemSource::new(vec![1u8; 40_000]).with_extents(vec![
            Extent::data(0, 10_000),
            Extent::zero(10_000, 20_000),
            Extent::data(30_000, 10_000),
        ]);
        let opts = CopyOptions {
            request_size: Some(4096),
            work_unit: 16384,
            sparse_size: 4096,
            ..CopyOptions::default()
        };
        let segs = plan_all(src, &opts, RangeSet::new());
        assert_eq!(
            segs,
            vec![
                (0, 4096, false),
                (4096, 4096, false),
                (8192, 1808, false),
                (10_000, 6384, true),
                (16384, 13616, true),
                (30_000, 2768, false),
                (32768, 4096, false),
                (36864, 3136, false),
            ]
        );
    }

    #[test]
    fn unaligned_zero_edges_become_data_and_resume_is_skipped() {
        let src = MemSource::new(vec![0u8; 20_000])
            .with_extents(vec![Extent::data(0, 100), Extent::zero(100, 19_900)])
            .with_caps(Caps {
                block: BlockSizes {
                    minimum: 4096,
                    preferred: 4096,
                    maximum: 1 << 20,
                },
                ..Caps::default()
            });
        let opts = CopyOptions::default();
        let segs = plan_all(src.clone(), &opts, RangeSet::new());
        // the zero extent reaches the image end, so its end is kept
        assert_eq!(segs, vec![(0, 4096, false), (4096, 15_904, true)]);
        let segs = plan_all(src, &opts, RangeSet::from_ranges([(0, 8192)]));
        assert_eq!(segs, vec![(8192, 11_808, true)]);
    }

    #[test]
    fn asks_again_when_extents_answer_a_prefix() {
        let src = MemSource::new(vec![1u8; 10_000])
            .with_extents(vec![Extent::data(0, 5000), Extent::data(5000, 5000)])
            .with_extent_limit(1);
        let segs = plan_all(src, &CopyOptions::default(), RangeSet::new());
        assert_eq!(segs, vec![(0, 10_000, false)]);
    }
}
