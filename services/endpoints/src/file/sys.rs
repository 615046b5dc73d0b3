//! Thin, safe wrappers over the Linux calls the file endpoint needs and std lacks:
//! full-length positional I/O, fallocate, lseek SEEK_DATA/SEEK_HOLE, block device ioctls
//! and statx's direct I/O alignment. Every `unsafe` block of the endpoint lives here.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

/// `BLKGETSIZE64`: the device size in bytes.
const BLKGETSIZE64: libc::Ioctl = libc::_IOR::<u64>(0x12, 114);
/// `BLKZEROOUT`: zero a byte range, falling back to writing zeroes inside the kernel.
const BLKZEROOUT: libc::Ioctl = libc::_IO(0x12, 127);

/// Reads exactly `buf.len()` bytes at `offset`, retrying short reads and EINTR.
/// End of file before the buffer is full is an `UnexpectedEof` error.
pub(crate) fn read_full(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match file.read_at(buf, offset) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                    "end of file at offset {offset}: the file is shorter than it was when opened"
                ),
                ))
            }
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `data` at `offset`, retrying short writes and EINTR.
pub(crate) fn write_full(file: &File, mut data: &[u8], mut offset: u64) -> io::Result<()> {
    while !data.is_empty() {
        match file.write_at(data, offset) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("write at offset {offset} made no progress"),
                ))
            }
            Ok(n) => {
                data = &data[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn to_off(value: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(value).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("offset {value} is out of range"),
        )
    })
}

fn retry_eintr(mut call: impl FnMut() -> libc::c_int) -> io::Result<()> {
    loop {
        if call() == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// `fallocate(2)` with the given mode flags.
pub(crate) fn fallocate(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    let (off, len) = (to_off(offset)?, to_off(len)?);
    // SAFETY: plain syscall on a valid descriptor with integer arguments.
    retry_eintr(|| unsafe { libc::fallocate(file.as_raw_fd(), mode, off, len) })
}

/// `fdatasync(2)`.
pub(crate) fn fdatasync(file: &File) -> io::Result<()> {
    // SAFETY: plain syscall on a valid descriptor.
    retry_eintr(|| unsafe { libc::fdatasync(file.as_raw_fd()) })
}

/// `ftruncate(2)`.
pub(crate) fn ftruncate(file: &File, size: u64) -> io::Result<()> {
    let size = to_off(size)?;
    // SAFETY: plain syscall on a valid descriptor.
    retry_eintr(|| unsafe { libc::ftruncate(file.as_raw_fd(), size) })
}

/// `lseek(fd, offset, whence)` for SEEK_DATA / SEEK_HOLE. `Ok(None)` is ENXIO: no data
/// (SEEK_DATA) or no hole (SEEK_HOLE, offset at or past end of file) at or after `offset`.
fn seek(file: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let off = to_off(offset)?;
    // SAFETY: lseek only moves the descriptor's position, which this endpoint never uses
    // (all I/O is positional), so concurrent calls cannot disturb each other.
    let ret = unsafe { libc::lseek(file.as_raw_fd(), off, whence) };
    if ret >= 0 {
        return Ok(Some(ret as u64));
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENXIO) {
        Ok(None)
    } else {
        Err(err)
    }
}

/// The first byte of data at or after `offset`, or `None` when only a hole follows.
pub(crate) fn seek_data(file: &File, offset: u64) -> io::Result<Option<u64>> {
    seek(file, offset, libc::SEEK_DATA)
}

/// The first byte of a hole at or after `offset` (end of file counts as a hole).
pub(crate) fn seek_hole(file: &File, offset: u64) -> io::Result<Option<u64>> {
    seek(file, offset, libc::SEEK_HOLE)
}

/// The size of a block device.
pub(crate) fn block_device_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid for that.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// The logical block size of a block device.
pub(crate) fn block_device_logical_block_size(file: &File) -> io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which is valid for that.
    let ret = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::BLKSSZGET,
            &mut size as *mut libc::c_int,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(size)
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| io::Error::other(format!("device reports logical block size {size}")))
}

/// `BLKZEROOUT` over `offset..offset + len` (both multiples of the logical block size).
pub(crate) fn block_device_zeroout(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: BLKZEROOUT reads two u64 through the pointer, which is valid for that.
    retry_eintr(|| unsafe { libc::ioctl(file.as_raw_fd(), BLKZEROOUT, range.as_ptr()) })
}

/// Direct I/O alignment of an open file from statx(STATX_DIOALIGN): (memory, offset).
/// `None` when the kernel or file system does not say.
pub(crate) fn direct_io_alignment(file: &File) -> Option<(u32, u32)> {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an empty path with AT_EMPTY_PATH stats the descriptor; stx is valid for writes.
    let ret = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if ret != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 || stx.stx_dio_offset_align == 0 {
        return None;
    }
    Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align))
}

/// The system page size.
pub(crate) fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
}

/// `sync_file_range(2)` with the given `SYNC_FILE_RANGE_*` flags.
pub(crate) fn sync_file_range(
    file: &File,
    offset: u64,
    len: u64,
    flags: libc::c_uint,
) -> io::Result<()> {
    let (off, len) = (to_off(offset)?, to_off(len)?);
    // SAFETY: plain syscall on a valid descriptor with integer arguments.
    retry_eintr(|| unsafe { libc::sync_file_range(file.as_raw_fd(), off, len, flags) })
}

/// `posix_fadvise(fd, offset, len, POSIX_FADV_DONTNEED)`: drop clean cached pages.
pub(crate) fn fadvise_dontneed(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fadvise(file, offset, len, libc::POSIX_FADV_DONTNEED)
}

/// `posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM)`: no readahead on this open file.
pub(crate) fn fadvise_random(file: &File) -> io::Result<()> {
    fadvise(file, 0, 0, libc::POSIX_FADV_RANDOM)
}

fn fadvise(file: &File, offset: u64, len: u64, advice: libc::c_int) -> io::Result<()> {
    let (off, len) = (to_off(offset)?, to_off(len)?);
    // SAFETY: plain syscall on a valid descriptor with integer arguments; posix_fadvise
    // returns the error number instead of setting errno.
    match unsafe { libc::posix_fadvise(file.as_raw_fd(), off, len, advice) } {
        0 => Ok(()),
        err => Err(io::Error::from_raw_os_error(err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux_headers() {
        assert_eq!(BLKGETSIZE64, 0x8008_1272);
        assert_eq!(BLKZEROOUT, 0x127f);
    }

    #[test]
    fn seek_reports_holes_and_end_of_file() {
        let file = tempfile::tempfile().unwrap();
        ftruncate(&file, 1 << 20).unwrap();
        write_full(&file, &[1u8; 4096], 512 * 1024).unwrap();
        assert_eq!(seek_data(&file, 0).unwrap(), Some(512 * 1024));
        assert_eq!(seek_hole(&file, 512 * 1024).unwrap(), Some(516 * 1024));
        assert_eq!(seek_data(&file, 516 * 1024).unwrap(), None);
        assert_eq!(seek_hole(&file, 1 << 20).unwrap(), None);
    }

    #[test]
    fn read_full_reports_end_of_file() {
        let file = tempfile::tempfile().unwrap();
        write_full(&file, b"abc", 0).unwrap();
        let mut buf = [0u8; 4];
        let err = read_full(&file, &mut buf, 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        let mut buf = [0u8; 2];
        read_full(&file, &mut buf, 1).unwrap();
        assert_eq!(&buf, b"bc");
    }
}
