//! Files and devices for tests: scratch directories that keep holes, sparse images
//! written from a known layout, allocated bytes, loop devices, and the open flags of this
//! process's descriptors (to check O_DIRECT and friends).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use ferry_core::ExtentKind;

use crate::conformance::Image;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;

/// A scratch directory on /var/tmp (a disk file system with SEEK_HOLE, not tmpfs),
/// checked to keep sparse files sparse: tests of holes need one that does.
pub fn sparse_scratch() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("ferry-file-test-")
        .tempdir_in("/var/tmp")
        .expect("create a scratch directory in /var/tmp");
    let probe = dir.path().join("probe");
    let f = File::create(&probe).expect("create a probe file");
    f.set_len(MIB).expect("size the probe file");
    f.write_all_at(&[1], 512 * KIB)
        .expect("write the probe file");
    assert!(
        allocated(&probe) < MIB,
        "the file system of /var/tmp does not keep sparse files sparse; these tests need one that does (ext4, xfs, btrfs)"
    );
    std::fs::remove_file(&probe).expect("remove the probe file");
    dir
}

/// Bytes allocated to a file (st_blocks * 512).
pub fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .blocks()
        * 512
}

/// Writes `image` to `path` as a sparse file: only its data runs are written.
pub fn write_sparse(path: &Path, image: &Image) {
    let write = || {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        f.set_len(image.data.len() as u64)?;
        for e in image.layout.iter().filter(|e| e.kind == ExtentKind::Data) {
            f.write_all_at(&image.data[e.offset as usize..e.end() as usize], e.offset)?;
        }
        f.sync_all()
    };
    write().unwrap_or_else(|e: std::io::Error| panic!("write {}: {e}", path.display()));
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
        let path = String::from_utf8_lossy(&out.stdout).trim().into();
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
    let target = std::fs::canonicalize(path)
        .unwrap_or_else(|e| panic!("canonicalize {}: {e}", path.display()));
    let mut flags = Vec::new();
    let fds = std::fs::read_dir("/proc/self/fd").expect("list /proc/self/fd");
    for entry in fds.flatten() {
        if std::fs::read_link(entry.path()).ok().as_deref() != Some(target.as_path()) {
            continue;
        }
        let fdinfo = Path::new("/proc/self/fdinfo").join(entry.file_name());
        let Ok(text) = std::fs::read_to_string(fdinfo) else {
            continue;
        };
        for v in text.lines().filter_map(|l| l.strip_prefix("flags:")) {
            flags.push(u32::from_str_radix(v.trim(), 8).expect("octal flags in fdinfo"));
        }
    }
    flags
}
