//! Local regular files and block devices as sources and targets (`/path`, `file:///path`).
//!
//! Reads and writes are positional (pread/pwrite) on descriptors shared by every handle,
//! run off the async threads by a small pool of I/O threads per handle. Extents come from
//! SEEK_DATA/SEEK_HOLE, zeroes from fallocate or the block device zeroing calls,
//! durability from fdatasync, with write-behind so that
//! it finds little left to write. The page cache is the default; direct I/O (O_DIRECT) is
//! opt-in.

mod direct;
mod exec;
mod extents;
mod handle;
mod node;
mod prealloc;
mod source;
mod sys;
mod target;
mod writeback;
mod zero;

pub use source::FileSource;
pub use target::FileTarget;
