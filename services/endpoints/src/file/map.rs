//! [`FileMapper`]: a regular file's bytes seen in place through a mapped window, so that
//! a reader that only looks at them (the checksum) skips the copy a pread makes.
//!
//! Each call maps one window of the file (the caller's request, so memory stays bounded
//! whatever the file's size), hands it out and unmaps it. A file that shrinks while a
//! window is read would kill the process with SIGBUS; [`super::sigbus`] turns that into
//! zeroes and a mark, and the call fails. When no window can be registered the call reads
//! the bytes into a buffer instead.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use ferry_core::{Error, Mapper, Result};

use super::handle::FileHandle;
use super::sigbus::{self, Window};

/// The mapper of a page-cache regular file handle.
#[derive(Debug)]
pub(crate) struct FileMapper {
    pub(crate) handle: Arc<FileHandle>,
}

impl Mapper for FileMapper {
    fn with_bytes(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        let h = &self.handle;
        h.check_range("read", offset, len as u64)?;
        if len == 0 {
            f(&[]);
            return Ok(());
        }
        let page = sigbus::page_size() as u64;
        let start = offset - offset % page;
        let pad = (offset - start) as usize;
        let map_len = pad + len;
        // SAFETY: a fresh private-to-us read-only mapping of the descriptor, at an address
        // the kernel picks; nothing else refers to it. Its bytes are only read while the
        // window is registered with the SIGBUS guard (below), so a file that shrinks under
        // it gives zeroes and a mark instead of killing the process.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                h.file.as_raw_fd(),
                start as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(h.error(
                "read",
                offset,
                "mmap failed",
                std::io::Error::last_os_error(),
            ));
        }
        let unmap = Unmap { ptr, len: map_len };
        let Some(window) = Window::register(ptr as usize, map_len) else {
            drop(unmap);
            return self.read_copy(offset, len, f);
        };
        // SAFETY: the mapping covers ptr..ptr + map_len and lives until `unmap` drops,
        // after this borrow ends; no one writes through it (PROT_READ). Pages past a
        // shrunk end read as zeroes (see above), so every access is defined.
        let bytes = unsafe { std::slice::from_raw_parts((ptr as *const u8).add(pad), len) };
        f(bytes);
        let shrank = window.hit();
        drop(window);
        drop(unmap);
        if shrank {
            return Err(Error::io(
                "the file shrank while it was read",
                std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            )
            .at("read", offset)
            .with_endpoint(h.describe.clone()));
        }
        Ok(())
    }
}

impl FileMapper {
    /// The copy the mapping avoids, for when no window can be registered.
    fn read_copy(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        let h = &self.handle;
        let mut buf = vec![0; len];
        h.read(offset, &mut buf)
            .map_err(|e| h.error("read", offset, "read failed", e))?;
        f(&buf);
        Ok(())
    }
}

/// Unmaps a window when dropped.
struct Unmap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Drop for Unmap {
    fn drop(&mut self) {
        // SAFETY: ptr..ptr + len is the mapping this value owns; no borrow of it outlives
        // the call that made it.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use ferry_core::{ErrorKind, Source};

    use super::*;
    use crate::file::FileSource;
    use crate::SourceOptions;

    fn file(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    fn mapper(f: &tempfile::NamedTempFile) -> Arc<dyn Mapper> {
        let source = FileSource::open_blocking(f.path(), &SourceOptions::default()).unwrap();
        source.mapper().expect("a page-cache regular file maps")
    }

    #[test]
    fn sees_the_bytes_at_any_offset() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let f = file(&data);
        let m = mapper(&f);
        for (offset, len) in [(0, 100_000), (1, 5), (4095, 4098), (99_999, 1), (500, 0)] {
            let mut seen = Vec::new();
            m.with_bytes(offset as u64, len, &mut |b| seen = b.to_vec())
                .unwrap();
            assert_eq!(seen, &data[offset..offset + len], "{offset}+{len}");
        }
        let err = m.with_bytes(99_999, 2, &mut |_| {}).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }

    #[test]
    fn a_file_that_shrinks_under_the_window_fails_instead_of_crashing() {
        let f = file(&vec![7; 1 << 20]);
        let m = mapper(&f);
        let mut sum = 0u64;
        let err = m
            .with_bytes(0, 1 << 20, &mut |b| {
                f.as_file().set_len(4096).unwrap();
                sum = b.iter().map(|&x| u64::from(x)).sum();
            })
            .unwrap_err();
        assert_eq!(sum, 7 * 4096, "pages past the new end read as zeroes");
        assert!(err.to_string().contains("shrank"), "{err}");
        // the window is free again: later calls work
        m.with_bytes(0, 4096, &mut |b| assert!(b.iter().all(|&x| x == 7)))
            .unwrap();
    }
}
