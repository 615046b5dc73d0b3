//! Target preallocation: off, falloc, full, and grow (QEMU's preallocate filter).
//!
//! Preallocation trades sparseness for fewer, larger allocations: it helps file systems
//! that allocate slowly or fragment under many small writes, and costs time and space
//! elsewhere, so it is never the default. Block devices are allocated already; every
//! mode is a no-op there.
//!
//! `grow` allocates ahead of the writes: when a write ends past the allocated end, the
//! allocation is extended to the write's end plus `step`, rounded up to 1 MiB, with
//! fallocate(KEEP_SIZE), so it may run past the end of file. [`Grow::trim`] truncates the
//! file to its size again at the end, which returns those blocks. As in QEMU, a failed
//! preallocation is not an error: growing stops and the writes go on.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ferry_core::IoBuf;
use parking_lot::Mutex;

use super::handle::{FileHandle, Kind};
use super::sys;

/// Grow steps end on this alignment.
const GROW_ALIGN: u64 = 1024 * 1024;
/// Zero buffer size for full preallocation.
const FULL_CHUNK: usize = 8 * 1024 * 1024;

/// fallocate the first `len` bytes (allocated blocks that read as zeroes; data untouched).
pub(crate) fn falloc(h: &FileHandle, len: u64) -> io::Result<()> {
    if h.kind != Kind::Regular || len == 0 {
        return Ok(());
    }
    sys::fallocate(&h.file, 0, 0, len)
}

/// Writes zeroes over every hole in the first `len` bytes, so all of it is allocated and
/// written; existing data is left as it is.
pub(crate) fn full(h: &FileHandle, len: u64) -> io::Result<()> {
    if h.kind != Kind::Regular || len == 0 {
        return Ok(());
    }
    let zeroes = IoBuf::new(FULL_CHUNK.min(usize::try_from(len).unwrap_or(FULL_CHUNK)));
    let mut pos = 0;
    while pos < len {
        let hole = match sys::seek_hole(&h.file, pos) {
            Ok(Some(hole)) => hole.min(len),
            Ok(None) => len,
            // No SEEK_HOLE here, so holes cannot be told from data: allocate without
            // writing, which never touches data.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return falloc(h, len),
            Err(e) => return Err(e),
        };
        if hole >= len {
            break;
        }
        let data = match sys::seek_data(&h.file, hole) {
            Ok(Some(data)) => data.min(len),
            Ok(None) => len,
            Err(e) => return Err(e),
        };
        let mut at = hole;
        while at < data {
            let n = (data - at).min(zeroes.len() as u64) as usize;
            h.write(at, &zeroes[..n])?;
            at += n as u64;
        }
        pos = data;
    }
    Ok(())
}

/// The state of `grow` preallocation, shared by every handle of one target.
#[derive(Debug)]
pub(crate) struct Grow {
    step: u64,
    /// Everything below this is allocated (or was asked to be).
    end: AtomicU64,
    /// Serialises extensions so two writers do not allocate the same step.
    extend: Mutex<()>,
    stopped: AtomicBool,
}

impl Grow {
    pub(crate) fn new(step: u64) -> Self {
        Self {
            step,
            end: AtomicU64::new(0),
            extend: Mutex::new(()),
            stopped: AtomicBool::new(false),
        }
    }

    /// Called before a write of `offset..end`: extends the allocation when the write
    /// crosses its end.
    pub(crate) fn before_write(&self, h: &FileHandle, end: u64) {
        if h.kind != Kind::Regular
            || end <= self.end.load(Ordering::Acquire)
            || self.stopped.load(Ordering::Relaxed)
        {
            return;
        }
        let _guard = self.extend.lock();
        let from = self.end.load(Ordering::Acquire);
        if end <= from {
            return;
        }
        let to = end
            .saturating_add(self.step)
            .div_ceil(GROW_ALIGN)
            .saturating_mul(GROW_ALIGN);
        match sys::fallocate(&h.file, libc::FALLOC_FL_KEEP_SIZE, from, to - from) {
            Ok(()) => self.end.store(to, Ordering::Release),
            Err(_) => self.stopped.store(true, Ordering::Relaxed),
        }
    }

    /// Returns the blocks allocated past the end of file, `len` bytes (the size the
    /// target was opened with, or the length a stream of unknown size ended at).
    pub(crate) fn trim(&self, h: &FileHandle, len: u64) -> io::Result<()> {
        if h.kind != Kind::Regular || self.end.load(Ordering::Acquire) <= len {
            return Ok(());
        }
        sys::ftruncate(&h.file, len)
    }
}
