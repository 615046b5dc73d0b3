//! Allocation of a file from lseek SEEK_DATA / SEEK_HOLE, asked lazily for one range.
//!
//! A hole reads as zeroes, so it becomes a Zero extent and the engine never reads it.
//! File systems that cannot say (EINVAL) and block devices report everything as data.
//! Unwritten (preallocated) extents count as holes where the file system reports them so.
//!
//! SEEK_HOLE walks the file's data from the offset asked up to the next hole (tmpfs page
//! by page, ext4 extent by extent) however short the range asked, so the data run it
//! finds is remembered ([`KnownData`]): the engine asks once per work unit, and a file
//! without holes was otherwise walked to its end once per unit.

use std::io;

use ferry_core::{merge_extents, Extent};
use parking_lot::Mutex;

use super::handle::{FileHandle, Kind, Unsupported};
use super::sys;

/// At most this many extents per call; callers ask again for the rest.
const MAX_EXTENTS: usize = 1024;

/// The data run SEEK_HOLE found last, `[start, end)`, shared by every handle of the file.
/// Only data is remembered: should the file change, a range reported as data still reads
/// right (a hole punched since reads as zeroes).
#[derive(Debug, Default)]
pub(crate) struct KnownData(Mutex<(u64, u64)>);

impl KnownData {
    /// The run from the file's start up to `first_hole`, SEEK_HOLE's answer at 0 (when
    /// the file starts with data), as the file was opened: workers starting together
    /// then do not each walk the same run.
    pub(crate) fn first_run(first_hole: Option<u64>) -> Self {
        Self(Mutex::new((0, first_hole.unwrap_or(0))))
    }

    /// Where the data run holding `pos` ends, when it is known.
    fn end(&self, pos: u64) -> Option<u64> {
        let (start, end) = *self.0.lock();
        (start <= pos && pos < end).then_some(end)
    }

    fn remember(&self, start: u64, end: u64) {
        *self.0.lock() = (start, end);
    }
}

/// Extents covering a prefix of `offset..offset + len` (already checked to lie within the
/// image), contiguous from `offset`.
pub(crate) fn extents(h: &FileHandle, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
    let end = offset + len;
    if len == 0 {
        return Ok(Vec::new());
    }
    if h.kind != Kind::Regular || Unsupported::get(&h.unsupported.seek_data) {
        return Ok(vec![Extent::data(offset, len)]);
    }
    let mut out = Vec::new();
    let mut pos = offset;
    // Right after a hole, pos is where SEEK_DATA found data: no need to ask again.
    let mut at_data = false;
    while pos < end && out.len() < MAX_EXTENTS {
        if let Some(run_end) = h.known_data.end(pos) {
            let stop = run_end.min(end);
            out.push(Extent::data(pos, stop - pos));
            pos = stop;
            at_data = false;
            continue;
        }
        if at_data {
            at_data = false;
        } else {
            let data = match sys::seek_data(&h.file, pos) {
                Ok(d) => d,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && out.is_empty() => {
                    Unsupported::set(&h.unsupported.seek_data);
                    return Ok(vec![Extent::data(offset, len)]);
                }
                Err(e) => return Err(e),
            };
            // ENXIO: no data at or after pos, so the rest of the range is a hole.
            let data = data.unwrap_or(end).min(end);
            if data > pos {
                out.push(Extent::zero(pos, data - pos));
                pos = data;
                at_data = true;
                continue;
            }
        }
        // ENXIO here means the file shrank below pos: report data and let the read fail.
        let hole = sys::seek_hole(&h.file, pos)?;
        if let Some(found) = hole.filter(|&found| found > pos) {
            h.known_data.remember(pos, found);
        }
        let hole = hole.unwrap_or(end).min(end);
        let hole = if hole > pos { hole } else { end };
        out.push(Extent::data(pos, hole - pos));
        pos = hole;
    }
    Ok(merge_extents(out))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;
    use crate::file::node;
    use crate::CacheMode;

    const MIB: u64 = 1 << 20;

    /// SEEK_HOLE's answer past the range asked is kept, so the next unit of the same data
    /// run is answered without walking the file again; the hole after it is still found.
    /// The run a file starts with is known from its opening.
    #[test]
    fn a_data_run_found_past_the_range_asked_is_remembered_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hole-data-hole.img");
        let file = std::fs::File::create(&path).unwrap();
        file.write_all_at(&vec![7u8; (8 * MIB) as usize], MIB)
            .unwrap();
        file.set_len(12 * MIB).unwrap();
        let h = node::open_source(&path, CacheMode::PageCache).unwrap();
        assert_eq!(h.known_data.end(2 * MIB), None, "it starts with a hole");
        assert_eq!(
            extents(&h, 2 * MIB, 4096).unwrap(),
            vec![Extent::data(2 * MIB, 4096)]
        );
        assert_eq!(h.known_data.end(5 * MIB), Some(9 * MIB), "the whole run");
        assert_eq!(
            extents(&h, 6 * MIB, 4 * MIB).unwrap(),
            vec![Extent::data(6 * MIB, 3 * MIB), Extent::zero(9 * MIB, MIB)]
        );
        assert_eq!(h.known_data.end(9 * MIB), None, "holes are not remembered");
        assert_eq!(
            extents(&h, 0, 2 * MIB).unwrap(),
            vec![Extent::zero(0, MIB), Extent::data(MIB, MIB)]
        );

        let full = dir.path().join("data.img");
        std::fs::write(&full, vec![1u8; (3 * MIB) as usize]).unwrap();
        let h = node::open_source(&full, CacheMode::Direct).unwrap();
        assert_eq!(h.known_data.end(0), Some(3 * MIB), "known from the opening");
        assert_eq!(extents(&h, MIB, MIB).unwrap(), vec![Extent::data(MIB, MIB)]);
    }
}
