//! The attempts of backup jobs: backup, restore, repository verify, prune and GC, each
//! through ferry-image-backup and ferry-backup, with progress published like a copy's.
//!
//! Restarts: an attempt opens the repository again (its key and S3 credentials read from
//! their references again). A backup cut off by a crash or a kill starts over in a new
//! session; the chunks the earlier attempt stored are found in the repository and not
//! sent again. Prune and GC are safe to cut off at any point: the library deletes a
//! backup's manifest before anything it references, and a GC never deletes a chunk a
//! backup (finished or running) uses.

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use ferry_backup::{GcOptions, Repository, VerifyOptions};
use ferry_core::{EndpointSpec, Error, ErrorKind, Result, Source};
use ferry_endpoints::TargetOptions;
use ferry_engine::Progress;
use ferry_image_backup::{
    changed_block_tracking, plan_with_snapshot_metadata, with_reason, BackupOptions, MetadataPlan,
    MetadataRequest, NbdDirtyBitmap, RestoreOptions, SecurityToken,
};
use prost::Message;
use tokio_util::sync::CancellationToken;

use super::metered::{JobCounts, MeteredSource, MeteredTarget};
use super::opener::{open_bytes, open_image};
use super::runner::{drive, error_record, kind_label, Ended};
use super::Inner;
use crate::backups::results;
use crate::convert::backup::{
    BackupSpec, GcSpec, MetadataSpec, PruneSpec, RestoreSpec, VerifySpec,
};
use crate::convert::options::source_options;
use crate::model::job::ResultRecord;
use ferry_api::proto;

fn note(inner: &Inner, id: &str, message: String) {
    inner.update(id, |r| {
        r.message = message;
        true
    });
}

/// Opens a backup's source: through the dirty bitmap's NBD connection when the request
/// names one, else as a checksum opens its source (the image its bytes hold).
async fn open_backup_source(
    inner: &Inner,
    spec: &BackupSpec,
) -> Result<(Arc<dyn Source>, Option<NbdDirtyBitmap>)> {
    let (src_spec, settings) = spec.source.open(&inner.secrets)?;
    let kind = kind_label(src_spec.kind());
    if let Some(bitmap) = &spec.dirty_bitmap {
        let EndpointSpec::Nbd(nbd) = &src_spec else {
            return Err(Error::invalid_input(
                "dirty_bitmap needs an NBD source (nbd://... or nbd+unix://...)",
            ));
        };
        let changed = NbdDirtyBitmap::open(nbd, bitmap).await?;
        let source = MeteredSource::wrap(changed.source(), &inner.metrics, kind);
        return Ok((source, Some(changed)));
    }
    let options = source_options(ferry_endpoints::CacheMode::default(), settings);
    let (bytes, layer) = open_bytes(&inner.opener, &src_spec, &options).await?;
    let source = open_image(
        (bytes, layer),
        &spec.image,
        &inner.opener,
        &options,
        &inner.cfg.allow_roots,
        &inner.metrics,
        kind,
    )
    .await?;
    Ok((source, None))
}

pub(super) async fn backup(
    inner: &Arc<Inner>,
    id: &str,
    spec: &BackupSpec,
    cancel: &CancellationToken,
) -> Result<Ended> {
    let repo_name = spec.repository.name();
    let repo = spec
        .repository
        .open(&inner.secrets, spec.init.as_ref())
        .await?;
    let (mut source, changed) = open_backup_source(inner, spec).await?;
    let mut parent = spec.parent.clone();
    let mut tracking = changed.as_ref().map(|_| "DirtyBitmap");
    let mut fallback = None;
    let mut metadata_changes = None;
    if let Some(metadata) = &spec.snapshot_metadata {
        let asked = tokio::select! {
            plan = metadata_plan(inner, metadata, &repo, source.clone(), spec) => plan,
            () = cancel.cancelled() => Err(Error::new(
                ErrorKind::Cancelled,
                "the backup was cancelled while the CSI SnapshotMetadata service was asked",
            )),
        };
        let plan = match asked {
            Ok(plan) => plan,
            Err(e) => {
                let _ = source.close().await;
                return Err(e);
            }
        };
        if let Some(why) = &plan.fallback {
            tracing::warn!(reason = %why, "the backup does not use the CSI SnapshotMetadata service");
        }
        tracking = Some(plan.tracking());
        (source, parent, metadata_changes, fallback) =
            (plan.source, plan.parent, plan.changed, plan.fallback);
    }
    let mut options = BackupOptions::new(spec.source_id.clone())
        .with_parent(parent)
        .with_workers(spec.workers);
    for (k, v) in &spec.tags {
        options = options.with_tag(k.clone(), v.clone());
    }
    if let Some(changed) = metadata_changes {
        options = options.with_changed(changed);
    }
    if let Some(changed) = changed {
        options = options.with_changed(Arc::new(changed));
    }
    if let Some(handle) = &spec.volume_snapshot_handle {
        options = options.with_snapshot_id(handle.clone());
    }
    let progress = Progress::new();
    let outcome = drive(
        inner,
        id,
        &progress,
        false,
        ferry_image_backup::backup(&repo, source.clone(), &options, &progress, cancel),
    )
    .await;
    let _ = source.close().await;
    let report = outcome?;
    inner.metrics.backup_done(&repo_name, &report);
    let mut result = results::backup(&report);
    result.changed_block_tracking =
        changed_block_tracking(report.manifest.parent.is_some(), tracking)
            .unwrap_or_default()
            .to_string();
    let full_reason = (!result.full_reason.is_empty()).then(|| result.full_reason.clone());
    result.full_reason = with_reason(full_reason, fallback).unwrap_or_default();
    if let Some(policy) = &spec.retention {
        note(inner, id, "pruning by the retention policy".into());
        match ferry_image_backup::prune_source(
            &repo,
            policy,
            Some(&spec.source_id),
            Utc::now(),
            false,
        )
        .await
        {
            Ok(pruned) => result.prune = Some(results::prune(&pruned, false)),
            Err(e) => {
                tracing::warn!(error = %e, "the prune after the backup failed");
                let e = error_record(&e);
                result.prune_error = Some(proto::JobError {
                    kind: e.kind,
                    message: e.message,
                });
            }
        }
    }
    Ok(Ended::done(ResultRecord::Backup {
        result: result.encode_to_vec(),
    }))
}

/// How a backup reads its source, by the CSI SnapshotMetadata service's answer. A token
/// that cannot be read is a fallback too (the service is an optimisation of the backup,
/// never a condition of it); only the repository's failures end the job.
async fn metadata_plan(
    inner: &Inner,
    metadata: &MetadataSpec,
    repo: &Repository,
    source: Arc<dyn Source>,
    spec: &BackupSpec,
) -> Result<MetadataPlan> {
    let token = match inner.secrets.resolve("snapshot_metadata.token", &metadata.token) {
        Ok(token) => SecurityToken::new(token.expose().trim()),
        Err(e) => {
            return Ok(MetadataPlan {
                source,
                changed: None,
                parent: spec.parent.clone(),
                fallback: Some(format!(
                    "changed blocks from the CSI SnapshotMetadata service are not used: {}; comparing change digests instead",
                    e.message()
                )),
            })
        }
    };
    let request = MetadataRequest {
        url: metadata.address.clone(),
        ca_pem: metadata.ca_pem.clone(),
        token,
        snapshot: metadata.snapshot.clone(),
        namespace: metadata.namespace.clone(),
        base_snapshot_id: metadata.base_snapshot_id.clone(),
    };
    plan_with_snapshot_metadata(&request, repo, source, &spec.source_id, &spec.parent).await
}

pub(super) async fn restore(
    inner: &Arc<Inner>,
    id: &str,
    spec: &RestoreSpec,
    cancel: &CancellationToken,
) -> Result<Ended> {
    let repo = spec.repository.open(&inner.secrets, None).await?;
    let backup_id = spec.which.resolve(&repo).await?;
    let manifest = repo.load_manifest(&backup_id).await?;
    let (tgt_spec, settings) = spec.target.open(&inner.secrets)?;
    let kind = kind_label(tgt_spec.kind());
    let mut options = TargetOptions::default();
    options.s3 = settings.s3;
    options.cache = spec.cache;
    let target = inner
        .opener
        .open_target(&tgt_spec, manifest.image_size, &options)
        .await?;
    let target = MeteredTarget::wrap(target, &inner.metrics, kind, Arc::new(JobCounts::default()));
    let restore_options = RestoreOptions::new()
        .with_workers(spec.workers)
        .with_order(spec.order)
        .with_verify(spec.verify);
    let progress = Progress::new();
    let report = drive(
        inner,
        id,
        &progress,
        false,
        ferry_image_backup::restore(
            &repo,
            &backup_id,
            target,
            &restore_options,
            &progress,
            cancel,
        ),
    )
    .await?;
    Ok(Ended::done(ResultRecord::Restore {
        result: results::restore(&report, spec.verify).encode_to_vec(),
    }))
}

pub(super) async fn verify(
    inner: &Arc<Inner>,
    id: &str,
    spec: &VerifySpec,
    cancel: &CancellationToken,
) -> Result<Ended> {
    let repo_name = spec.repository.name();
    let repo = spec.repository.open(&inner.secrets, None).await?;
    let mut options = VerifyOptions::new().with_mark_bad(spec.mark_bad);
    if let Some(ids) = &spec.snapshots {
        options = options.with_snapshots(ids.clone());
    }
    note(inner, id, "verifying chunks".into());
    let started = Instant::now();
    let report = cancellable(cancel, repo.verify(&options)).await?;
    inner.metrics.verify_done(&repo_name, &report);
    let result = results::verify(&report, started.elapsed());
    let failed = (!report.is_ok()).then(|| {
        Error::new(
            ErrorKind::Corrupt,
            format!(
                "{} bad chunks in {repo_name}; backups that cannot be restored whole: {}",
                result.chunks_bad,
                if result.broken_snapshots.is_empty() {
                    "none".to_string()
                } else {
                    result.broken_snapshots.join(", ")
                }
            ),
        )
    });
    Ok(Ended {
        result: ResultRecord::RepositoryVerify {
            result: result.encode_to_vec(),
        },
        failed,
    })
}

pub(super) async fn prune(
    inner: &Arc<Inner>,
    id: &str,
    spec: &PruneSpec,
    cancel: &CancellationToken,
) -> Result<Ended> {
    let repo = spec.repository.open(&inner.secrets, None).await?;
    note(inner, id, "pruning".into());
    let report = cancellable(
        cancel,
        ferry_image_backup::prune_source(
            &repo,
            &spec.policy,
            spec.source_id.as_deref(),
            Utc::now(),
            spec.dry_run,
        ),
    )
    .await?;
    Ok(Ended::done(ResultRecord::Prune {
        result: results::prune(&report, spec.dry_run).encode_to_vec(),
    }))
}

pub(super) async fn gc(
    inner: &Arc<Inner>,
    id: &str,
    spec: &GcSpec,
    cancel: &CancellationToken,
) -> Result<Ended> {
    let repo_name = spec.repository.name();
    let repo: Repository = spec.repository.open(&inner.secrets, None).await?;
    note(inner, id, "collecting garbage".into());
    let options = GcOptions::new()
        .with_grace(spec.grace)
        .with_holder(format!("ferry serve job {id}"))
        // The job's ID names this run: after a restart of the service it resumes here.
        .resuming_own_lease();
    let (report, block_digests) =
        cancellable(cancel, ferry_image_backup::gc(&repo, &options)).await?;
    inner.metrics.gc_done(&repo_name, &report);
    Ok(Ended::done(ResultRecord::Gc {
        result: results::gc(&report, block_digests).encode_to_vec(),
    }))
}

/// Runs repository maintenance until it ends or the job is cancelled. Dropping the
/// library's future is safe: its deletions are ordered so that stopping between any two
/// leaves nothing referenced deleted.
async fn cancellable<T>(
    cancel: &CancellationToken,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::select! {
        r = work => r,
        () = cancel.cancelled() => Err(Error::cancelled()),
    }
}
