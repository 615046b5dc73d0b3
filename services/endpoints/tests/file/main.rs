//! The file endpoint's tests, one test binary: files and block devices through
//! `FileSource`/`FileTarget` and `open_source`/`open_target`. The helpers every module
//! shares live here; what is not about files (scratch directories that keep holes,
//! sparse images, loop devices, the conformance suite) comes from ferry-testkit.

mod blockdev;
mod errors;
mod extents;
mod io;
mod prealloc;
mod zero;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_core::{Source, Target};
use ferry_endpoints::file::{FileSource, FileTarget};
use ferry_endpoints::{CacheMode, Preallocation, SourceOptions, TargetOptions};
use ferry_testkit::conformance::TargetFixture;
use ferry_testkit::BackedFixture;

pub use ferry_testkit::conformance;
pub use ferry_testkit::files::{
    allocated, open_flags, sparse_scratch as scratch, write_sparse, LoopDevice, KIB, MIB,
};

pub fn source_options(cache: CacheMode) -> SourceOptions {
    let mut o = SourceOptions::default();
    o.cache = cache;
    o
}

pub fn target_options(cache: CacheMode, preallocation: Preallocation) -> TargetOptions {
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

/// Targets for the conformance suite: each open makes a new file `dst-N.img` in `dir`.
pub fn file_fixture(dir: &Path, cache: CacheMode) -> impl TargetFixture {
    let dir = dir.to_path_buf();
    fixture(move |n| dir.join(format!("dst-{n}.img")), cache)
}

/// Targets for the conformance suite: each open opens the device again.
pub fn device_fixture(device: &Path, cache: CacheMode) -> impl TargetFixture {
    let device = device.to_path_buf();
    fixture(move |_| device.clone(), cache)
}

fn fixture(
    path_of: impl Fn(usize) -> PathBuf + Clone + Send + Sync + 'static,
    cache: CacheMode,
) -> impl TargetFixture {
    let open_path = path_of.clone();
    BackedFixture::new(path_of, move |n, size| {
        let path = open_path(n);
        Box::pin(async move {
            let options = target_options(cache, Preallocation::default());
            let target = FileTarget::open(&path, size, &options).await?;
            Ok(Arc::new(target) as Arc<dyn Target>)
        })
    })
}
