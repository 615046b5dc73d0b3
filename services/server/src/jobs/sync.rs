//! The attempts of sync jobs: ferry-image-backup's sync (the repository's, with each
//! backup's block digests) from one repository into another, its progress published
//! like a copy's (in image bytes of the backups it copies).
//!
//! Cancelling, a retry and a restart drop the sync between chunks: the backups copied
//! stay, the one being copied never shows in the destination (its index and manifest
//! are written last), and the next attempt sends only the chunks still missing.

use std::sync::Arc;
use std::time::Instant;

use ferry_backup::{SyncObserver, SyncOptions, SyncReport};
use ferry_core::{Error, Result};
use ferry_engine::Progress;
use prost::Message;
use tokio_util::sync::CancellationToken;

use super::runner::{drive, Ended};
use super::Inner;
use crate::convert::sync::SyncSpec;
use crate::model::job::ResultRecord;
use ferry_api::proto;

/// The sync's progress, told to the job's [`Progress`].
#[derive(Debug)]
struct Observed(Progress);

impl SyncObserver for Observed {
    fn planned(&self, _backups: usize, bytes: u64) {
        self.0.start(bytes, 0);
    }

    fn handled(&self, bytes: u64, sent: bool) {
        if sent {
            self.0.add_data(bytes);
        } else {
            self.0.add_zero(bytes);
        }
    }
}

pub(super) async fn sync(
    inner: &Arc<Inner>,
    id: &str,
    spec: &SyncSpec,
    cancel: &CancellationToken,
) -> Result<Ended> {
    let started = Instant::now();
    let src = spec.source.open(&inner.secrets, None).await?;
    let dst = if spec.init_destination {
        spec.destination
            .open_or_init_from(&inner.secrets, &spec.source)
            .await?
    } else {
        spec.destination.open(&inner.secrets, None).await?
    };
    let progress = Progress::new();
    let mut options = SyncOptions::new()
        .with_keep(spec.keep.clone())
        .with_remove_vanished(spec.remove_vanished)
        .with_observer(Arc::new(Observed(progress.clone())));
    if let Some(source) = &spec.source_id {
        options = options.with_source_id(source.clone());
    }
    if let Some(rate) = &spec.rate {
        options = options.with_rate_policy(rate.clone());
    }
    let work = async {
        tokio::select! {
            r = ferry_image_backup::sync(&src, &dst, &options) => r,
            () = cancel.cancelled() => Err(Error::cancelled()),
        }
    };
    let report = drive(inner, id, &progress, false, work).await?;
    tracing::info!(
        source = %spec.source.name(),
        destination = %spec.destination.name(),
        backups = report.copied.len(),
        chunks = report.chunks_copied,
        "sync done"
    );
    Ok(Ended::done(ResultRecord::Sync {
        result: result(&report, started.elapsed().as_secs_f64()).encode_to_vec(),
    }))
}

/// The wire form of what a sync did.
fn result(r: &SyncReport, seconds: f64) -> proto::SyncResult {
    proto::SyncResult {
        backups_copied: r.copied.len() as u64,
        backups_present: r.present as u64,
        chunks_copied: r.chunks_copied,
        chunks_reused: r.chunks_reused,
        bytes_copied: r.bytes_copied,
        same_keys: r.same_keys,
        copied: r.copied.iter().map(ToString::to_string).collect(),
        removed: r.removed.iter().map(ToString::to_string).collect(),
        seconds,
        throughput_bytes_per_second: if seconds > 0.0 {
            r.bytes_copied as f64 / seconds
        } else {
            0.0
        },
    }
}
