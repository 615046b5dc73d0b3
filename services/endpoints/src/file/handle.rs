//! The open file shared by every handle of one endpoint: its descriptors, what it is
//! (regular file or block device), its size and alignment, and full-length positional
//! reads and writes that honour direct I/O's rules.
//!
//! All I/O is positional (pread/pwrite), so one descriptor serves any number of workers
//! at once; [`super::FileSource::connect`] and [`super::FileTarget::connect`] share it.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use ferry_core::{BlockSizes, Caps, Error, ErrorKind};

use super::extents::KnownData;
use super::{direct, sys};

/// What the path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Regular,
    BlockDevice,
}

/// The O_DIRECT side of a handle opened with `CacheMode::Direct`.
#[derive(Debug)]
pub(crate) struct Direct {
    pub(crate) file: File,
    /// File offset and length alignment (at least a page).
    pub(crate) align: u32,
    /// Buffer address alignment.
    pub(crate) mem_align: usize,
}

/// Which zeroing calls the file system or device refused, so they are not tried again.
#[derive(Debug, Default)]
pub(crate) struct Unsupported {
    pub(crate) punch_hole: AtomicBool,
    pub(crate) zero_range: AtomicBool,
    pub(crate) zeroout: AtomicBool,
    pub(crate) seek_data: AtomicBool,
}

impl Unsupported {
    pub(crate) fn get(flag: &AtomicBool) -> bool {
        flag.load(Ordering::Relaxed)
    }

    pub(crate) fn set(flag: &AtomicBool) {
        flag.store(true, Ordering::Relaxed);
    }
}

#[derive(Debug)]
pub(crate) struct FileHandle {
    pub(crate) describe: String,
    /// The page-cache descriptor: all I/O in page-cache mode, unaligned pieces in direct
    /// mode, and every fallocate, lseek and fdatasync.
    pub(crate) file: File,
    pub(crate) direct: Option<Direct>,
    pub(crate) kind: Kind,
    pub(crate) size: u64,
    /// The granularity of zeroing calls: the logical block size of a device, 1 for files.
    pub(crate) zero_granularity: u64,
    pub(crate) unsupported: Unsupported,
    /// The data run lseek SEEK_HOLE found last (see [`super::extents`]).
    pub(crate) known_data: KnownData,
}

/// Largest request the endpoint advertises; larger ones work but gain nothing.
const MAX_REQUEST: u32 = 32 * 1024 * 1024;

impl FileHandle {
    pub(crate) fn caps(&self) -> Caps {
        let regular = self.kind == Kind::Regular;
        let minimum = self.direct.as_ref().map_or(1, |d| d.align);
        Caps {
            extents: regular,
            efficient_zero: true,
            trim: regular,
            random_write: true,
            rewrite: true,
            read_while_writing: true,
            multi_conn: true,
            sequential_read: false,
            block: BlockSizes {
                minimum,
                preferred: minimum.max(4096),
                maximum: MAX_REQUEST.max(minimum),
            },
            request_size: None,
            work_unit: None,
        }
    }

    /// Checks that `offset..offset + len` lies within the image.
    pub(crate) fn check_range(
        &self,
        op: &'static str,
        offset: u64,
        len: u64,
    ) -> ferry_core::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::invalid_input(format!(
                "request of {len} bytes at offset {offset} reaches past the end of the image ({} bytes)",
                self.size
            ))
            .at(op, offset)
            .with_endpoint(self.describe.clone())),
        }
    }

    /// Wraps an OS error with this endpoint's context.
    pub(crate) fn error(
        &self,
        op: &'static str,
        offset: u64,
        message: &str,
        err: io::Error,
    ) -> Error {
        Error::io(message, err)
            .at(op, offset)
            .with_endpoint(self.describe.clone())
    }

    /// Reads all of `buf` at `offset`.
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let Some(d) = &self.direct else {
            return sys::read_full(&self.file, buf, offset);
        };
        for piece in direct::plan(
            offset,
            buf.len(),
            buf.as_ptr() as usize,
            d.align,
            d.mem_align,
        ) {
            let fd = if piece.direct { &d.file } else { &self.file };
            let at = offset + piece.range.start as u64;
            sys::read_full(fd, &mut buf[piece.range], at)?;
        }
        Ok(())
    }

    /// Writes all of `data` at `offset`.
    pub(crate) fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let Some(d) = &self.direct else {
            return sys::write_full(&self.file, data, offset);
        };
        for piece in direct::plan(
            offset,
            data.len(),
            data.as_ptr() as usize,
            d.align,
            d.mem_align,
        ) {
            let fd = if piece.direct { &d.file } else { &self.file };
            let at = offset + piece.range.start as u64;
            sys::write_full(fd, &data[piece.range], at)?;
        }
        Ok(())
    }

    pub(crate) fn flush(&self) -> io::Result<()> {
        sys::fdatasync(&self.file)
    }
}

/// Alignment for direct I/O on `file`: (offset alignment, memory alignment).
pub(crate) fn direct_alignment(file: &File, kind: Kind) -> (u32, usize) {
    let page = sys::page_size();
    let (mem, offset) = match kind {
        Kind::BlockDevice => {
            let lbs = sys::block_device_logical_block_size(file).unwrap_or(4096);
            (lbs, lbs)
        }
        Kind::Regular => sys::direct_io_alignment(file).unwrap_or((4096, 4096)),
    };
    let align = match kind {
        // A device has no partial last block, so its own block size is the alignment.
        Kind::BlockDevice => offset.max(1),
        // Files: at least a page, so the page-cache tail never shares a page with direct I/O.
        Kind::Regular => offset.max(page),
    };
    (align, mem.max(1) as usize)
}

/// An error for an open that failed, classified for the user.
pub(crate) fn open_error(describe: &str, what: &str, err: io::Error, direct: bool) -> Error {
    if direct && err.raw_os_error() == Some(libc::EINVAL) {
        return Error::new(
            ErrorKind::InvalidInput,
            "direct I/O (cache mode none) is not supported here: use the page cache",
        )
        .with_source(err)
        .with_operation("open")
        .with_endpoint(describe.to_string());
    }
    Error::io(format!("cannot open {what}"), err)
        .with_operation("open")
        .with_endpoint(describe.to_string())
}
