//! Making a range read as zeroes without writing zero bytes where the system allows.
//!
//! Files: `MayDeallocate` punches a hole (size kept), falling back to ZERO_RANGE;
//! `Allocate` uses ZERO_RANGE, which leaves the range allocated.
//! Block devices: `MayDeallocate` uses fallocate(PUNCH_HOLE) on the device, which the
//! kernel turns into a write-zeroes command that may unmap, and which fails rather than
//! discarding where discarded blocks would not read back as zeroes; then BLKZEROOUT.
//! `Allocate` uses fallocate(ZERO_RANGE) (zeroes without unmapping).
//! Whatever the system refuses falls back to writing zero buffers, and is not tried again
//! on this file.

use std::io;
use std::sync::atomic::AtomicBool;

use ferry_core::{IoBuf, ZeroMode};

use super::handle::{FileHandle, Kind, Unsupported};
use super::sys;

/// Size of the zero buffer used when nothing better works.
const ZERO_CHUNK: u64 = 1024 * 1024;

/// Whether an fallocate/ioctl failure means "this call is not available here".
fn refused(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::ENOSYS) | Some(libc::EINVAL)
    )
}

/// Tries `call` unless `flag` says it was refused before; records a refusal.
/// `Ok(true)`: done. `Ok(false)`: refused, try something else.
fn attempt(flag: &AtomicBool, call: impl FnOnce() -> io::Result<()>) -> io::Result<bool> {
    if Unsupported::get(flag) {
        return Ok(false);
    }
    match call() {
        Ok(()) => Ok(true),
        Err(e) if refused(&e) => {
            Unsupported::set(flag);
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Zeroes `offset..offset + len` (within the image).
pub(crate) fn write_zeroes(
    h: &FileHandle,
    offset: u64,
    len: u64,
    mode: ZeroMode,
) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    match h.kind {
        Kind::Regular => zero_file(h, offset, len, mode),
        Kind::BlockDevice => zero_device(h, offset, len, mode),
    }
}

fn zero_file(h: &FileHandle, offset: u64, len: u64, mode: ZeroMode) -> io::Result<()> {
    let keep = libc::FALLOC_FL_KEEP_SIZE;
    let u = &h.unsupported;
    if mode == ZeroMode::MayDeallocate
        && attempt(&u.punch_hole, || {
            sys::fallocate(&h.file, libc::FALLOC_FL_PUNCH_HOLE | keep, offset, len)
        })?
    {
        return Ok(());
    }
    if attempt(&u.zero_range, || {
        sys::fallocate(&h.file, libc::FALLOC_FL_ZERO_RANGE | keep, offset, len)
    })? {
        return Ok(());
    }
    write_zero_buffers(h, offset, len)
}

fn zero_device(h: &FileHandle, offset: u64, len: u64, mode: ZeroMode) -> io::Result<()> {
    // The kernel's zeroing calls need whole logical blocks; edges are written.
    let block = h.zero_granularity.max(1);
    let start = offset.div_ceil(block) * block;
    let end = (offset + len) / block * block;
    if start >= end {
        return write_zero_buffers(h, offset, len);
    }
    write_zero_buffers(h, offset, start - offset)?;
    zero_device_aligned(h, start, end - start, mode)?;
    write_zero_buffers(h, end, offset + len - end)
}

fn zero_device_aligned(h: &FileHandle, offset: u64, len: u64, mode: ZeroMode) -> io::Result<()> {
    let keep = libc::FALLOC_FL_KEEP_SIZE;
    let u = &h.unsupported;
    match mode {
        ZeroMode::MayDeallocate => {
            if attempt(&u.punch_hole, || {
                sys::fallocate(&h.file, libc::FALLOC_FL_PUNCH_HOLE | keep, offset, len)
            })? {
                return Ok(());
            }
            if attempt(&u.zeroout, || {
                sys::block_device_zeroout(&h.file, offset, len)
            })? {
                return Ok(());
            }
        }
        ZeroMode::Allocate => {
            if attempt(&u.zero_range, || {
                sys::fallocate(&h.file, libc::FALLOC_FL_ZERO_RANGE | keep, offset, len)
            })? {
                return Ok(());
            }
        }
    }
    write_zero_buffers(h, offset, len)
}

/// Writes zero bytes over `offset..offset + len`.
pub(crate) fn write_zero_buffers(h: &FileHandle, offset: u64, len: u64) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let chunk = len.min(ZERO_CHUNK) as usize;
    let zeroes = IoBuf::new(chunk);
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk as u64) as usize;
        h.write(offset + done, &zeroes[..n])?;
        done += n as u64;
    }
    Ok(())
}
