//! Opening a path as a source or target: what it names, whether it may be used, and the
//! descriptors and size of the resulting [`FileHandle`].
//!
//! Every refusal says what was wrong in terms of the user's path: missing, a directory,
//! not readable, too small, no parent directory.

use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use ferry_core::{Error, ErrorKind, Result, UNKNOWN_SIZE};

use super::extents::KnownData;
use super::handle::{self, Direct, FileHandle, Kind, Unsupported};
use super::sys;
use crate::CacheMode;

/// A target handle and what this open did to the file.
#[derive(Debug)]
pub(crate) struct OpenedTarget {
    pub(crate) handle: FileHandle,
    /// The file did not exist and was created by this open (and is removed again if a
    /// later step of the open fails).
    pub(crate) created: bool,
    /// The file reads as zeroes everywhere: created here, or extended from zero length.
    pub(crate) zeroed: bool,
}

fn describe(path: &Path) -> String {
    path.display().to_string()
}

fn invalid(describe: &str, message: String) -> Error {
    Error::invalid_input(message)
        .with_operation("open")
        .with_endpoint(describe.to_string())
}

/// Classifies what `meta` describes, refusing anything but a regular file or a block device.
fn kind_of(describe: &str, meta: &Metadata) -> Result<Kind> {
    let ft = meta.file_type();
    if ft.is_file() {
        Ok(Kind::Regular)
    } else if ft.is_block_device() {
        Ok(Kind::BlockDevice)
    } else if ft.is_dir() {
        Err(invalid(
            describe,
            "is a directory: give a file or a block device".into(),
        ))
    } else {
        Err(invalid(
            describe,
            "is neither a regular file nor a block device".into(),
        ))
    }
}

fn size_of(describe: &str, file: &File, kind: Kind, meta: &Metadata) -> Result<u64> {
    match kind {
        Kind::Regular => Ok(meta.len()),
        Kind::BlockDevice => sys::block_device_size(file).map_err(|e| {
            Error::io("cannot read the block device size (BLKGETSIZE64)", e)
                .with_operation("open")
                .with_endpoint(describe.to_string())
        }),
    }
}

fn zero_granularity(file: &File, kind: Kind) -> u64 {
    match kind {
        Kind::Regular => 1,
        Kind::BlockDevice => sys::block_device_logical_block_size(file).map_or(512, u64::from),
    }
}

/// Opens the O_DIRECT descriptor of a direct-I/O handle.
fn open_direct(path: &Path, write: bool, kind: Kind, describe: &str) -> Result<Direct> {
    let what = if write {
        "for direct writing"
    } else {
        "for direct reading"
    };
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| handle::open_error(describe, what, e, true))?;
    let (align, mem_align) = handle::direct_alignment(&file, kind);
    Ok(Direct {
        file,
        align,
        mem_align,
    })
}

fn stat_error(describe: &str, err: io::Error, role: &str) -> Error {
    if err.kind() == io::ErrorKind::NotFound {
        return Error::new(ErrorKind::NotFound, format!("{role} does not exist"))
            .with_source(err)
            .with_operation("open")
            .with_endpoint(describe.to_string());
    }
    Error::io(format!("cannot look up the {role}"), err)
        .with_operation("open")
        .with_endpoint(describe.to_string())
}

/// Opens a file or block device for reading.
pub(crate) fn open_source(path: &Path, cache: CacheMode) -> Result<FileHandle> {
    let describe = describe(path);
    let meta = fs::metadata(path).map_err(|e| stat_error(&describe, e, "source"))?;
    let kind = kind_of(&describe, &meta)?;
    let file =
        File::open(path).map_err(|e| handle::open_error(&describe, "for reading", e, false))?;
    // The path may have changed between the lookup and the open: trust the descriptor.
    let meta = file
        .metadata()
        .map_err(|e| stat_error(&describe, e, "source"))?;
    let kind = if kind_of(&describe, &meta)? == kind {
        kind
    } else {
        return Err(invalid(&describe, "changed while being opened".into()));
    };
    let size = size_of(&describe, &file, kind, &meta)?;
    let direct = match cache {
        CacheMode::PageCache => None,
        CacheMode::Direct => Some(open_direct(path, false, kind, &describe)?),
    };
    // One walk of the first data run serves both the readahead choice and the extents.
    let first_hole = first_hole(&file, kind);
    if direct.is_none() && has_holes(first_hole, size) {
        // Best effort: without it, reads are only slower.
        let _ = sys::fadvise_random(&file);
    }
    Ok(FileHandle {
        describe,
        zero_granularity: zero_granularity(&file, kind),
        file,
        direct,
        kind,
        size,
        unsupported: Unsupported::default(),
        known_data: KnownData::first_run(first_hole),
    })
}

/// Whether a regular file has a hole before its end.
///
/// Readers skip holes and read data in large requests from several workers, so the
/// kernel's readahead adds nothing to them except, at the end of every data extent, reading
/// on into the hole after it: page-cache pages filled with zeroes that nobody asked for.
/// On a cold 4 GiB image with 1 MiB data runs that zeroing was half of a backup's CPU time,
/// so readahead is turned off for sparse files (a file system that cannot find holes
/// reports none, and keeps it).
fn has_holes(first_hole: Option<u64>, size: u64) -> bool {
    first_hole.is_some_and(|hole| hole < size)
}

/// A regular file's first hole (its end when it has none) from SEEK_HOLE at 0: `None` for
/// devices, and where the file system cannot say.
fn first_hole(file: &File, kind: Kind) -> Option<u64> {
    if kind != Kind::Regular {
        return None;
    }
    sys::seek_hole(file, 0).ok().flatten()
}

/// Opens an existing file or block device, or creates a file of `needed` bytes, for writing.
pub(crate) fn open_target(path: &Path, needed: u64, cache: CacheMode) -> Result<OpenedTarget> {
    let describe = describe(path);
    let (file, created) = match fs::metadata(path) {
        Ok(meta) => {
            let kind = kind_of(&describe, &meta)?;
            let mut options = OpenOptions::new();
            options.read(true).write(true);
            if kind == Kind::BlockDevice {
                // Exclusive: refuse a device that is mounted or claimed by someone else.
                options.custom_flags(libc::O_EXCL);
            }
            let file = options.open(path).map_err(|e| {
                if e.raw_os_error() == Some(libc::EBUSY) {
                    Error::io(
                        "the block device is in use (mounted or opened exclusively)",
                        e,
                    )
                    .with_operation("open")
                    .with_endpoint(describe.clone())
                } else {
                    handle::open_error(&describe, "for writing", e, false)
                }
            })?;
            (file, false)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => (create(path, &describe)?, true),
        Err(e) => return Err(stat_error(&describe, e, "target")),
    };
    let opened = finish_target(path, &describe, file, created, needed, cache);
    if opened.is_err() && created {
        let _ = fs::remove_file(path);
    }
    opened
}

fn create(path: &Path, describe: &str) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map_err(|e| {
            let parent = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if e.kind() == io::ErrorKind::NotFound && !parent.exists() {
                Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "directory {} does not exist: create it first",
                        parent.display()
                    ),
                )
                .with_source(e)
                .with_operation("create")
                .with_endpoint(describe.to_string())
            } else {
                Error::io("cannot create the target file", e)
                    .with_operation("create")
                    .with_endpoint(describe.to_string())
            }
        })
}

fn finish_target(
    path: &Path,
    describe: &str,
    file: File,
    created: bool,
    needed: u64,
    cache: CacheMode,
) -> Result<OpenedTarget> {
    let meta = file
        .metadata()
        .map_err(|e| stat_error(describe, e, "target"))?;
    let kind = kind_of(describe, &meta)?;
    let mut size = size_of(describe, &file, kind, &meta)?;
    let mut zeroed = created;
    if needed == UNKNOWN_SIZE {
        // A stream of unknown size: a regular file grows to it (see FileTarget), a device
        // takes what fits.
        zeroed |= kind == Kind::Regular && size == 0;
    } else if size < needed {
        if kind == Kind::Regular && size == 0 {
            zeroed = true;
        } else {
            return Err(invalid(
                describe,
                format!(
                    "target is {size} bytes but the source needs {needed} bytes: \
                     make the target larger or choose another one"
                ),
            ));
        }
    }
    if zeroed && size < needed && needed != UNKNOWN_SIZE {
        sys::ftruncate(&file, needed).map_err(|e| {
            Error::io(format!("cannot set the target size to {needed} bytes"), e)
                .with_operation("open")
                .with_endpoint(describe.to_string())
        })?;
        size = needed;
    }
    let direct = match cache {
        CacheMode::PageCache => None,
        CacheMode::Direct => Some(open_direct(path, true, kind, describe)?),
    };
    Ok(OpenedTarget {
        handle: FileHandle {
            describe: describe.to_string(),
            zero_granularity: zero_granularity(&file, kind),
            file,
            direct,
            kind,
            size,
            unsupported: Unsupported::default(),
            known_data: KnownData::default(),
        },
        created,
        zeroed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn only_a_file_with_a_hole_before_its_end_has_holes() {
        let file = tempfile::tempfile().unwrap();
        file.write_all_at(&[1u8; 1 << 20], 0).unwrap();
        let holes = |kind, size| has_holes(first_hole(&file, kind), size);
        assert!(!holes(Kind::Regular, 1 << 20), "all data");
        file.set_len(4 << 20).unwrap();
        assert!(holes(Kind::Regular, 4 << 20), "3 MiB hole at the end");
        assert!(!holes(Kind::BlockDevice, 4 << 20), "devices have none");
    }
}
