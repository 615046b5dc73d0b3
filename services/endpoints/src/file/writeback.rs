//! Write-behind for page-cache targets: start writing each request's pages to disk as soon
//! as it is written, and drop them from the cache once they are on disk.
//!
//! Without it, a copy into the page cache leaves every byte dirty until the final
//! fdatasync, which then writes the whole image while the copy waits, and a large image
//! fills memory with dirty pages other programs must wait for. With it, writeback runs
//! during the copy and the final flush finds little to do. The scheme is the one nbdcopy
//! uses (after Linus Torvalds' advice on streaming writes): each handle keeps a short
//! window of its recent writes; a new write starts asynchronous writeback of its range
//! (`SYNC_FILE_RANGE_WRITE`), and the write that pushes the oldest range out of the window
//! waits for that range to reach the disk and evicts it (`POSIX_FADV_DONTNEED`). The wait
//! is also backpressure: a worker cannot run ahead of the disk by more than its window.
//!
//! Errors here are only hints lost: durability still comes from the final fdatasync,
//! which reports any write error.
//!
//! A target that is read back right after it is written (a verified copy) keeps its pages:
//! they are still written back and waited for, but stay in the cache as clean pages (which
//! the kernel reclaims when memory is short), so the read-back does not read the disk.

use std::collections::VecDeque;
use std::fs::File;

use parking_lot::Mutex;

use super::sys;

/// Ranges a handle may have in writeback before it waits for the oldest.
const WINDOW: usize = 8;

/// One handle's recent writes still in writeback.
#[derive(Debug)]
pub(crate) struct WriteBehind {
    window: Mutex<VecDeque<(u64, u64)>>,
    /// Drop a range from the cache once it is on disk.
    evict: bool,
}

impl Default for WriteBehind {
    fn default() -> Self {
        Self::new(true)
    }
}

impl WriteBehind {
    pub(crate) fn new(evict: bool) -> Self {
        Self {
            window: Mutex::default(),
            evict,
        }
    }

    /// Called after `len` bytes were written at `offset` through the page cache.
    pub(crate) fn written(&self, file: &File, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let _ = sys::sync_file_range(file, offset, len, libc::SYNC_FILE_RANGE_WRITE);
        let oldest = {
            let mut window = self.window.lock();
            window.push_back((offset, len));
            if window.len() > WINDOW {
                window.pop_front()
            } else {
                None
            }
        };
        if let Some((offset, len)) = oldest {
            let _ = sys::sync_file_range(
                file,
                offset,
                len,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER,
            );
            if self.evict {
                let _ = sys::fadvise_dontneed(file, offset, len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn written_ranges_keep_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let wb = WriteBehind::default();
        let block = 64 * 1024;
        for i in 0..(WINDOW as u64 * 3) {
            let data = vec![i as u8 + 1; block];
            file.write_at(&data, i * block as u64).unwrap();
            wb.written(&file, i * block as u64, block as u64);
        }
        assert_eq!(wb.window.lock().len(), WINDOW);
        let mut back = vec![0u8; block];
        for i in 0..(WINDOW as u64 * 3) {
            file.read_at(&mut back, i * block as u64).unwrap();
            assert!(back.iter().all(|&b| b == i as u8 + 1), "block {i}");
        }
    }

    /// Pages of `file` in the page cache, out of its first `len` bytes.
    fn resident_pages(file: &File, len: usize) -> usize {
        use std::os::fd::AsRawFd;
        let page = 4096;
        // SAFETY: a read-only shared mapping of `len` bytes of an open file, only passed to
        // mincore and unmapped before returning; its memory is never touched.
        unsafe {
            let map = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            assert_ne!(map, libc::MAP_FAILED);
            let mut vec = vec![0u8; len.div_ceil(page)];
            assert_eq!(libc::mincore(map, len, vec.as_mut_ptr()), 0);
            libc::munmap(map, len);
            vec.iter().filter(|&&b| b & 1 == 1).count()
        }
    }

    /// Evicting write-behind drops the ranges that left its window; keeping leaves every
    /// written page cached for a read-back.
    #[test]
    fn written_pages_are_dropped_only_when_evicting() {
        let block = 64 * 1024;
        let blocks = WINDOW * 4;
        for evict in [true, false] {
            let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
            let file = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.path().join("f"))
                .unwrap();
            let wb = WriteBehind::new(evict);
            for i in 0..blocks as u64 {
                file.write_at(&vec![7; block], i * block as u64).unwrap();
                wb.written(&file, i * block as u64, block as u64);
            }
            let resident = resident_pages(&file, blocks * block);
            let all = blocks * block / 4096;
            if evict {
                assert!(
                    resident <= WINDOW * block / 4096,
                    "{resident} of {all} cached"
                );
            } else {
                assert_eq!(resident, all);
            }
        }
    }
}
