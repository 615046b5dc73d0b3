//! Shared helpers of the file endpoint tests: scratch directories on a real file system,
//! sparse images with a known layout, allocation checks, loop devices, and a
//! [`conformance::TargetFixture`] for files and devices.

#![allow(dead_code)]

#[path = "../../src/conformance.rs"]
pub mod conformance;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use ferry_core::{ExtentKind, Result, Source, Target};
use ferry_endpoints::file::{FileSource, FileTarget};
use ferry_endpoints::{CacheMode, SourceOptions, TargetOptions};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;

/// A scratch directory on /var/tmp (a disk file system with SEEK_HOLE, not tmpfs), checked
/// to report holes: these tests are about holes.
pub fn scratch() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("ferry-file-test-")
        .tempdir_in("/var/tmp")
        .expect("create a scratch directory in /var/tmp");
    let probe = dir.path().join("probe");
    let f = File::create(&probe).unwrap();
    f.set_len(MIB).unwrap();
    f.write_all_at(&[1], 512 * KIB).unwrap();
    assert!(
        allocated(&probe) < MIB,
        "the file system of /var/tmp does not keep sparse files sparse; these tests need one that does (ext4, xfs, btrfs)"
    );
    std::fs::remove_file(&probe).unwrap();
    dir
}

/// Bytes allocated to a file (st_blocks * 512).
pub fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// Writes `image` to `path` as a sparse file: only its data runs are written.
pub fn write_sparse(path: &Path, image: &conformance::Image) {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap();
    f.set_len(image.data.len() as u64).unwrap();
    for e in &image.layout {
        if e.kind == ExtentKind::Data {
            f.write_all_at(&image.data[e.offset as usize..e.end() as usize], e.offset)
                .unwrap();
        }
    }
    f.sync_all().unwrap();
}

pub fn source_options(cache: CacheMode) -> SourceOptions {
    let mut o = SourceOptions::default();
    o.cache = cache;
    o
}

pub fn target_options(
    cache: CacheMode,
    preallocation: ferry_endpoints::Preallocation,
) -> TargetOptions {
    let mut o = TargetOptions::default();
    o.cache = cache;
    o.preallocation = preallocation;
    o
}

pub async fn open_source(path: &Path, cache: CacheMode) -> Arc<dyn Source> {
    Arc::new(
        FileSource::open(path, &source_options(cache))
            .await
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display())),
    )
}

/// Opens file targets at one path for the conformance suite; each open starts a new file
/// (or, for a device, reuses it).
pub struct FileFixture {
    pub path: PathBuf,
    pub cache: CacheMode,
    pub device: bool,
    pub last: Mutex<Option<Arc<dyn Target>>>,
}

impl std::fmt::Debug for FileFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileFixture")
            .field("path", &self.path)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl FileFixture {
    pub fn new(path: PathBuf, cache: CacheMode) -> Self {
        Self {
            path,
            cache,
            device: false,
            last: Mutex::new(None),
        }
    }

    pub fn device(path: PathBuf, cache: CacheMode) -> Self {
        Self {
            device: true,
            ..Self::new(path, cache)
        }
    }
}

#[async_trait]
impl conformance::TargetFixture for FileFixture {
    async fn open(&self, size: u64) -> Result<Arc<dyn Target>> {
        // Close the previous target first: a device is opened exclusively.
        self.last.lock().unwrap().take();
        if !self.device {
            let _ = std::fs::remove_file(&self.path);
        }
        let options = target_options(self.cache, Default::default());
        let target: Arc<dyn Target> = Arc::new(FileTarget::open(&self.path, size, &options).await?);
        *self.last.lock().unwrap() = Some(Arc::clone(&target));
        Ok(target)
    }

    async fn contents(&self, size: u64) -> Result<Vec<u8>> {
        self.last.lock().unwrap().take();
        let mut data = std::fs::read(&self.path).unwrap_or_else(|_| {
            // Devices: read the first `size` bytes.
            let f = File::open(&self.path).unwrap();
            let mut buf = vec![0u8; size as usize];
            f.read_exact_at(&mut buf, 0).unwrap();
            buf
        });
        data.truncate(size as usize);
        Ok(data)
    }
}

/// A loop device over a file, detached on drop.
#[derive(Debug)]
pub struct LoopDevice {
    pub path: PathBuf,
}

impl LoopDevice {
    /// Attaches `backing` to a free loop device. Needs root and the `losetup` command.
    pub fn attach(backing: &Path) -> Self {
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run losetup ({e}): install it with `apt-get install -y mount`")
            });
        assert!(
            out.status.success(),
            "losetup failed (these tests need root and loop devices): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        Self { path }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}

/// The open-file flags of every descriptor of this process that refers to `path`.
pub fn open_flags(path: &Path) -> Vec<u32> {
    let target = std::fs::canonicalize(path).unwrap();
    let mut flags = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if std::fs::read_link(entry.path()).ok().as_deref() != Some(target.as_path()) {
            continue;
        }
        let fdinfo = Path::new("/proc/self/fdinfo").join(entry.file_name());
        if let Ok(text) = std::fs::read_to_string(fdinfo) {
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("flags:") {
                    flags.push(u32::from_str_radix(v.trim(), 8).unwrap());
                }
            }
        }
    }
    flags
}
