//! Which ranges of a source changed since its parent backup: a dirty bitmap.
//!
//! An incremental backup with a [`ChangedRanges`] reads only the chunks it marks
//! changed; every other chunk is taken from the parent backup unread. The bitmap must
//! have been started (or cleared) when the parent backup was taken: ferry cannot check
//! that, the system that keeps the bitmap (QEMU, libvirt, Proxmox) does.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::spec::NbdSpec;
use ferry_core::{Error, ErrorKind, Result, Source};
use ferry_endpoints::nbd::{NbdOptions, NbdSource};

/// Ranges of an image written since the parent backup.
#[async_trait]
pub trait ChangedRanges: Send + Sync + std::fmt::Debug {
    /// The changed ranges within `offset..offset + len`: sorted, disjoint `[start, end)`.
    async fn changed(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>>;

    /// What the ranges come from, for messages (`dirty bitmap b0 of nbd://...`).
    fn describe(&self) -> String;
}

/// A QEMU dirty bitmap exported over NBD (`qemu-nbd -B NAME`, or a QEMU NBD server with
/// the bitmap added to the export): the context `qemu:dirty-bitmap:NAME`.
#[derive(Debug, Clone)]
pub struct NbdDirtyBitmap {
    source: NbdSource,
    bitmap: String,
}

impl NbdDirtyBitmap {
    /// Opens `spec` selecting `qemu:dirty-bitmap:BITMAP` besides `base:allocation`; fails
    /// clearly when the server does not export that bitmap.
    pub async fn open(spec: &NbdSpec, bitmap: &str) -> Result<Self> {
        let context = format!(
            "{}{bitmap}",
            ferry_endpoints::nbd::DIRTY_BITMAP_CONTEXT_PREFIX
        );
        let options = NbdOptions {
            extra_contexts: vec![context.clone()],
            ..NbdOptions::default()
        };
        let source = NbdSource::open(spec, &options).await?;
        if !source.info().has_context(&context) {
            let _ = source.close().await;
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("the NBD server does not export the dirty bitmap '{bitmap}' (metadata context {context}): export it (qemu-nbd -B {bitmap}) or back up without --dirty-bitmap"),
            )
            .with_endpoint(source.describe()));
        }
        Ok(Self {
            source,
            bitmap: bitmap.to_string(),
        })
    }

    /// The export as a source to back up (the same connection).
    pub fn source(&self) -> Arc<dyn Source> {
        Arc::new(self.source.clone())
    }
}

#[async_trait]
impl ChangedRanges for NbdDirtyBitmap {
    async fn changed(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        self.source.dirty_ranges(&self.bitmap, offset, len).await
    }

    fn describe(&self) -> String {
        format!("dirty bitmap {} of {}", self.bitmap, self.source.describe())
    }
}
