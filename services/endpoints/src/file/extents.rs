//! Allocation of a file from lseek SEEK_DATA / SEEK_HOLE, asked lazily for one range.
//!
//! A hole reads as zeroes, so it becomes a Zero extent and the engine never reads it.
//! File systems that cannot say (EINVAL) and block devices report everything as data.
//! Unwritten (preallocated) extents count as holes where the file system reports them so.

use std::io;

use ferry_core::{merge_extents, Extent};

use super::handle::{FileHandle, Kind, Unsupported};
use super::sys;

/// At most this many extents per call; callers ask again for the rest.
const MAX_EXTENTS: usize = 1024;

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
        let hole = sys::seek_hole(&h.file, pos)?.unwrap_or(end).min(end);
        let hole = if hole > pos { hole } else { end };
        out.push(Extent::data(pos, hole - pos));
        pos = hole;
    }
    Ok(merge_extents(out))
}
