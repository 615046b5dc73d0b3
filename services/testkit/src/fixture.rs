//! [`BackedFixture`]: a [`TargetFixture`] for any endpoint whose bytes end up in a local
//! file or device the test can read back: files, block devices, an NFS export, the
//! backing file of an iSCSI LUN, an S3 server's directory.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Error, Result, Target};
use futures::future::BoxFuture;

use crate::conformance::TargetFixture;

/// What a [`BackedFixture`]'s open closure returns: the target being opened.
pub type Opening = BoxFuture<'static, Result<Arc<dyn Target>>>;

/// Opens targets with a closure (given the number of the open, counting from 1, and the
/// size) and reads back the `n`-th one from the local path
/// `path_of(n)`. Numbering the opens lets each open make a new file or LUN (servers such
/// as ganesha cache directory entries, so a file removed behind their back would still
/// be found); a device simply answers the same path every time.
pub struct BackedFixture<P, O> {
    path_of: P,
    open: O,
    opened: AtomicUsize,
}

impl<P, O> std::fmt::Debug for BackedFixture<P, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackedFixture")
            .field("opened", &self.opened)
            .finish_non_exhaustive()
    }
}

impl<P, O> BackedFixture<P, O>
where
    P: Fn(usize) -> PathBuf + Send + Sync,
    O: Fn(usize, u64) -> Opening + Send + Sync,
{
    pub fn new(path_of: P, open: O) -> Self {
        Self {
            path_of,
            open,
            opened: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl<P, O> TargetFixture for BackedFixture<P, O>
where
    P: Fn(usize) -> PathBuf + Send + Sync,
    O: Fn(usize, u64) -> Opening + Send + Sync,
{
    async fn open(&self, size: u64) -> Result<Arc<dyn Target>> {
        let n = self.opened.fetch_add(1, Ordering::SeqCst) + 1;
        (self.open)(n, size).await
    }

    async fn contents(&self, size: u64) -> Result<Vec<u8>> {
        let path = (self.path_of)(self.opened.load(Ordering::SeqCst));
        let read = |path: &PathBuf| {
            let mut buf = vec![0u8; size as usize];
            File::open(path)?.read_exact_at(&mut buf, 0)?;
            Ok::<_, std::io::Error>(buf)
        };
        read(&path).map_err(|e| Error::io(format!("read back {}", path.display()), e))
    }
}
