//! [`FileTarget`]: a file or block device written as an image.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use std::sync::atomic::{AtomicU64, Ordering};

use ferry_core::{Caps, Error, ErrorKind, IoBuf, Result, Target, ZeroMode, UNKNOWN_SIZE};

use super::exec::Executor;
use super::handle::FileHandle;
use super::prealloc::{self, Grow};
use super::writeback::WriteBehind;
use super::{node, zero};
use crate::{Preallocation, TargetOptions};

/// A regular file or block device opened for writing.
///
/// A missing file is created with the size asked for; an existing one must be at least
/// that large (a zero-length file is extended) and keeps its size.
///
/// Opened for a source of unknown size ([`UNKNOWN_SIZE`]), a regular file grows with the
/// writes: [`Target::set_end`] then cuts a file this copy created (or found empty) to the
/// stream's length, and extends an existing one that was shorter; a longer existing file
/// keeps its size and the bytes past the stream, as it does for a smaller source of known
/// size. A block device holds what fits.
#[derive(Debug)]
pub struct FileTarget {
    shared: Arc<Shared>,
    exec: Executor,
    /// This handle's write-behind window; none with direct I/O, which bypasses the cache.
    write_behind: Option<Arc<WriteBehind>>,
}

#[derive(Debug)]
struct Shared {
    handle: Arc<FileHandle>,
    zeroed: bool,
    grow: Option<Grow>,
    /// Written pages stay cached for a read-back ([`TargetOptions::keep_cached`]).
    keep_cached: bool,
    /// A regular file opened for a source of unknown size: writes may reach past its size.
    grows: bool,
    /// The file's length at the end: its size, or what [`Target::set_end`] made it.
    end: AtomicU64,
}

impl FileTarget {
    /// Opens `path` for writing an image of `size` bytes, creating it if missing.
    pub async fn open(path: &Path, size: u64, options: &TargetOptions) -> Result<Self> {
        let path = path.to_path_buf();
        let options = options.clone();
        tokio::task::spawn_blocking(move || Self::open_blocking(&path, size, &options))
            .await
            .map_err(|e| Error::internal(format!("open task failed: {e}")))?
    }

    /// [`FileTarget::open`] for callers outside an async context: it blocks (for a long
    /// time with full preallocation).
    pub fn open_blocking(path: &Path, size: u64, options: &TargetOptions) -> Result<Self> {
        let opened = node::open_target(path, size, options.cache)?;
        let handle = opened.handle;
        let prepared = match options.preallocation {
            Preallocation::Off | Preallocation::Grow { .. } => Ok(()),
            Preallocation::Falloc | Preallocation::Full if size == UNKNOWN_SIZE => {
                Err(Error::invalid_input(
                    "the source's size is not known before it is read (a compressed \
                     stream), so the target cannot be preallocated up front: use \
                     --preallocation grow, or give the size with --source-size",
                ))
            }
            Preallocation::Falloc => prealloc::falloc(&handle, size).map_err(|e| {
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    Error::new(
                        ErrorKind::Unsupported,
                        "the file system does not support fallocate: use preallocation off or full",
                    )
                    .with_source(e)
                } else {
                    Error::io("preallocation (fallocate) failed", e)
                }
            }),
            Preallocation::Full => prealloc::full(&handle, size)
                .map_err(|e| Error::io("preallocation (writing zeroes) failed", e)),
        };
        if let Err(e) = prepared {
            if opened.created {
                let _ = std::fs::remove_file(path);
            }
            return Err(e
                .with_operation("preallocate")
                .with_endpoint(handle.describe.clone()));
        }
        let grow = match options.preallocation {
            Preallocation::Grow { step } => Some(Grow::new(step)),
            _ => None,
        };
        let grows = size == UNKNOWN_SIZE && handle.kind == super::handle::Kind::Regular;
        let shared = Arc::new(Shared {
            end: AtomicU64::new(handle.size),
            handle: Arc::new(handle),
            zeroed: opened.zeroed,
            grow,
            keep_cached: options.keep_cached,
            grows,
        });
        Ok(Self::with_shared(shared))
    }

    fn with_shared(shared: Arc<Shared>) -> Self {
        let direct = shared.handle.direct.is_some();
        Self {
            exec: Executor::for_handle(direct),
            write_behind: (!direct).then(|| Arc::new(WriteBehind::new(!shared.keep_cached))),
            shared,
        }
    }

    fn handle(&self) -> &Arc<FileHandle> {
        &self.shared.handle
    }

    /// Checks that a request lies within the image, which a growing file has no end of.
    fn check_range(&self, op: &'static str, offset: u64, len: u64) -> Result<()> {
        if self.shared.grows {
            return Ok(());
        }
        self.handle().check_range(op, offset, len)
    }

    async fn trim(&self) -> Result<()> {
        if self.shared.grow.is_none() {
            return Ok(());
        }
        let shared = Arc::clone(&self.shared);
        self.exec
            .run(move || {
                let h = &shared.handle;
                let len = shared.end.load(Ordering::Acquire);
                match &shared.grow {
                    Some(grow) => grow
                        .trim(h, len)
                        .map_err(|e| h.error("finish", len, "cannot trim the preallocation", e)),
                    None => Ok(()),
                }
            })
            .await
    }
}

#[async_trait]
impl Target for FileTarget {
    fn describe(&self) -> String {
        self.handle().describe.clone()
    }

    fn size(&self) -> u64 {
        if self.shared.grows {
            UNKNOWN_SIZE
        } else {
            self.handle().size
        }
    }

    fn caps(&self) -> Caps {
        self.handle().caps()
    }

    fn is_zero(&self) -> bool {
        self.shared.zeroed
    }

    fn can_grow(&self) -> bool {
        self.shared.grows
    }

    async fn set_end(&self, end: u64) -> Result<()> {
        if !self.shared.grows {
            return Ok(());
        }
        let shared = Arc::clone(&self.shared);
        self.exec
            .run(move || {
                let h = &shared.handle;
                let len = if shared.zeroed { end } else { end.max(h.size) };
                super::sys::ftruncate(&h.file, len).map_err(|e| {
                    h.error(
                        "set_end",
                        len,
                        &format!("cannot set the file's length to {len} bytes"),
                        e,
                    )
                })?;
                shared.end.store(len, Ordering::Release);
                Ok(())
            })
            .await
    }

    async fn write_at(&self, offset: u64, buf: IoBuf) -> Result<IoBuf> {
        let len = buf.len() as u64;
        self.check_range("write", offset, len)?;
        let shared = Arc::clone(&self.shared);
        let write_behind = self.write_behind.clone();
        self.exec
            .run(move || {
                let h = &shared.handle;
                if let Some(grow) = &shared.grow {
                    grow.before_write(h, offset + len);
                }
                h.write(offset, &buf)
                    .map_err(|e| h.error("write", offset, "write failed", e))?;
                if let Some(wb) = &write_behind {
                    wb.written(&h.file, offset, len);
                }
                Ok(buf)
            })
            .await
    }

    async fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.check_range("write_zeroes", offset, len)?;
        let shared = Arc::clone(&self.shared);
        self.exec
            .run(move || {
                let h = &shared.handle;
                if let (Some(grow), ZeroMode::Allocate) = (&shared.grow, mode) {
                    grow.before_write(h, offset + len);
                }
                zero::write_zeroes(h, offset, len, mode)
                    .map_err(|e| h.error("write_zeroes", offset, "cannot write zeroes", e))
            })
            .await
    }

    async fn flush(&self) -> Result<()> {
        let h = Arc::clone(self.handle());
        self.exec
            .run(move || {
                h.flush().map_err(|e| {
                    Error::io("fdatasync failed", e)
                        .with_operation("flush")
                        .with_endpoint(h.describe.clone())
                })
            })
            .await
    }

    async fn connect(&self) -> Result<Arc<dyn Target>> {
        Ok(Arc::new(Self::with_shared(Arc::clone(&self.shared))))
    }

    async fn finish(&self) -> Result<()> {
        self.trim().await?;
        self.flush().await
    }

    async fn abort(&self) -> Result<()> {
        self.trim().await
    }
}
