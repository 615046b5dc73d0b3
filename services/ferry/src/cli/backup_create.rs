//! `ferry backup create SRC REPO`: one backup of an image.
//!
//! The source is opened as `ferry copy` opens it (any endpoint, qcow2 and compressed
//! images through ferry-formats). With `--dirty-bitmap NAME` the source must be NBD: the
//! export is opened with the `qemu:dirty-bitmap:NAME` context and only the chunks it
//! marks dirty are read. With `--snapshot-metadata URL` the CSI SnapshotMetadata service
//! says which ranges changed since the parent's snapshot (or, for a full backup, which are
//! allocated), and only those are read ([`super::snapshot_metadata`]). The summary (or
//! `--json`) says what was stored, what was read, and why a backup was full when it was,
//! or why the service's answer was not used (`full_reason`).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use ferry_core::size::format_size;
use ferry_core::{EndpointSpec, Source};
use ferry_engine::{CancellationToken, Progress};
use ferry_image_backup::{
    changed_block_tracking, with_reason, BackupOptions, BackupReport, NbdDirtyBitmap, ParentChoice,
};
use serde::Serialize;

use super::args::{self, ProgressArgs};
use super::backup::open_repository;
use super::image::{self, FormatArgs};
use super::summary::rate;
use super::{cancel_on_ctrl_c, interrupted, progress, snapshot_metadata};

/// Arguments of `ferry backup create`.
#[derive(Debug, Clone, Args)]
#[command(after_help = super::HTTP_SOURCE_HELP)]
pub struct CreateArgs {
    /// Image to back up: a path or URL, as for `ferry copy`.
    #[arg(value_name = "SRC")]
    pub source: String,
    /// The repository: a directory, file:///path or s3://bucket/prefix.
    #[arg(value_name = "REPO")]
    pub repo: String,
    /// The backup to build on: auto (the latest of the same source), a backup id, or none.
    #[arg(long, value_name = "PARENT", default_value = "auto", value_parser = parent)]
    pub parent: ParentChoice,
    /// A label KEY=VALUE stored with the backup (repeatable).
    #[arg(long = "tag", value_name = "KEY=VALUE", value_parser = tag)]
    pub tags: Vec<(String, String)>,
    /// The source's identity, which groups backups (parent auto, prune) [default: the
    /// source URL without secrets].
    #[arg(long, value_name = "ID")]
    pub source_id: Option<String>,
    /// NBD sources: read only the chunks this QEMU dirty bitmap marks dirty (it must track
    /// the writes since the parent backup).
    #[arg(long, value_name = "NAME")]
    pub dirty_bitmap: Option<String>,
    /// Ask the CSI SnapshotMetadata service at this address (https://HOST:PORT) which
    /// ranges of --snapshot changed since the parent's snapshot (or are allocated, for a
    /// full backup), and read only those; on any failure the backup is made without it.
    /// The CA and the token come from FERRY_SNAPSHOT_METADATA_CA_FILE and
    /// FERRY_SNAPSHOT_METADATA_TOKEN_FILE.
    #[arg(long, value_name = "URL", requires_all = ["snapshot", "namespace"], conflicts_with = "dirty_bitmap")]
    pub snapshot_metadata: Option<String>,
    /// The VolumeSnapshot SRC was made from (with --snapshot-metadata).
    #[arg(long, value_name = "NAME", requires = "snapshot_metadata")]
    pub snapshot: Option<String>,
    /// The namespace of the VolumeSnapshot (with --snapshot-metadata).
    #[arg(long, value_name = "NS", requires = "snapshot_metadata")]
    pub namespace: Option<String>,
    /// The CSI snapshot handle of the base snapshot [default: the snapshot id the parent
    /// backup recorded].
    #[arg(long, value_name = "ID", requires = "snapshot_metadata")]
    pub base_snapshot_id: Option<String>,
    /// The CSI snapshot handle of the snapshot SRC is, recorded in the backup's manifest:
    /// the next incremental's default base.
    #[arg(long, value_name = "ID")]
    pub snapshot_id: Option<String>,
    #[arg(long, value_name = "N", value_parser = args::count,
          help = format!("Chunks in flight at once [default: {}]", ferry_image_backup::DEFAULT_WORKERS))]
    pub workers: Option<usize>,
    #[command(flatten)]
    pub format: FormatArgs,
    #[command(flatten)]
    pub progress: ProgressArgs,
    /// Print one JSON object summarising the backup on stdout.
    #[arg(long)]
    pub json: bool,
}

fn parent(text: &str) -> Result<ParentChoice, String> {
    text.parse()
        .map_err(|e: ferry_core::Error| e.message().to_string())
}

fn tag(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("'{text}' is not a tag: use KEY=VALUE")),
    }
}

/// The `--json` summary of a backup (field names are part of the CLI's interface).
#[derive(Debug, Serialize)]
pub struct CreateSummary {
    pub id: String,
    pub source: String,
    pub parent: Option<String>,
    /// Why the backup was made without a parent, when it was; and why the CSI
    /// SnapshotMetadata service's answer was not used, when it was asked and was not.
    pub full_reason: Option<String>,
    /// How the changed blocks were found: SnapshotMetadata, DirtyBitmap, ChangeDigests
    /// (read and compared), or none (a full backup).
    pub changed_block_tracking: Option<String>,
    /// The storage snapshot recorded in the manifest (--snapshot-id).
    pub snapshot_id: Option<String>,
    pub size: u64,
    pub block_hash: Option<String>,
    pub tags: BTreeMap<String, String>,
    pub bytes_new: u64,
    pub bytes_reused: u64,
    pub bytes_zero: u64,
    pub chunks_new: u64,
    pub chunks_reused: u64,
    pub chunks_zero: u64,
    pub bytes_read: u64,
    pub chunks_read: u64,
    pub chunks_unread: u64,
    pub chunks_unchanged: u64,
    pub seconds: f64,
    pub throughput_bytes_per_second: f64,
}

impl From<&BackupReport> for CreateSummary {
    fn from(r: &BackupReport) -> Self {
        let m = &r.manifest;
        Self {
            id: m.id.to_string(),
            source: m.source.clone(),
            parent: m.parent.as_ref().map(ToString::to_string),
            full_reason: r.full_reason.clone(),
            changed_block_tracking: None,
            snapshot_id: m.snapshot_id.clone(),
            size: m.image_size,
            block_hash: m.block_hash.clone(),
            tags: m.tags.clone(),
            bytes_new: m.bytes_new,
            bytes_reused: m.bytes_reused,
            bytes_zero: m.bytes_zero,
            chunks_new: m.chunks_new,
            chunks_reused: m.chunks_reused,
            chunks_zero: m.chunks_zero,
            bytes_read: r.bytes_read,
            chunks_read: r.chunks_read,
            chunks_unread: r.chunks_unread,
            chunks_unchanged: r.chunks_unchanged,
            seconds: r.elapsed.as_secs_f64(),
            throughput_bytes_per_second: rate(m.image_size, r.elapsed),
        }
    }
}

impl CreateSummary {
    fn to_text(&self) -> String {
        let mut text = format!(
            "backup {} of {} ({}) in {:.2} s: {} new, {} reused, {} zero; {} read",
            self.id,
            self.source,
            format_size(self.size),
            self.seconds,
            format_size(self.bytes_new),
            format_size(self.bytes_reused),
            format_size(self.bytes_zero),
            format_size(self.bytes_read),
        );
        match (&self.parent, &self.full_reason) {
            (Some(p), Some(reason)) => text.push_str(&format!("\nparent {p} ({reason})")),
            (Some(p), None) => text.push_str(&format!("\nparent {p}")),
            (None, Some(reason)) => text.push_str(&format!("\nfull backup: {reason}")),
            (None, None) => {}
        }
        text
    }
}

/// Opens the source: through the dirty bitmap's NBD connection, or as `ferry copy` does.
async fn open_source(
    args: &CreateArgs,
    spec: &EndpointSpec,
) -> anyhow::Result<(Arc<dyn Source>, Option<NbdDirtyBitmap>)> {
    let name = spec.to_string();
    if let Some(bitmap) = &args.dirty_bitmap {
        let EndpointSpec::Nbd(nbd) = spec else {
            anyhow::bail!(
                "--dirty-bitmap needs an NBD source (nbd://... or nbd+unix://...), not {name}"
            );
        };
        let changed = NbdDirtyBitmap::open(nbd, bitmap)
            .await
            .map_err(|e| super::named(e, &name, "cannot open the source"))?;
        return Ok((changed.source(), Some(changed)));
    }
    let source_options = super::source_options_from_env()?;
    let format = args.format.open_options(&source_options);
    let (source, _) = image::open(spec, &source_options, &format)
        .await
        .map_err(|e| super::named(e, &name, "cannot open the source"))?;
    Ok((source, None))
}

/// Runs `ferry backup create`.
pub async fn run(args: CreateArgs) -> anyhow::Result<ExitCode> {
    let spec = EndpointSpec::parse(&args.source).map_err(|e| super::failed(e, "invalid source"))?;
    let repo = open_repository(&args.repo).await?;
    let (mut source, changed) = open_source(&args, &spec).await?;
    let source_id = args.source_id.clone().unwrap_or_else(|| spec.to_string());
    let mut parent = args.parent.clone();
    let mut tracking = changed.as_ref().map(|_| "DirtyBitmap");
    let mut fallback = None;
    let mut metadata_changes = None;
    if let Some(url) = &args.snapshot_metadata {
        let request = snapshot_metadata::Request {
            url: url.clone(),
            snapshot: args.snapshot.clone().unwrap_or_default(),
            namespace: args.namespace.clone().unwrap_or_default(),
            base_snapshot_id: args.base_snapshot_id.clone(),
        };
        let plan =
            match snapshot_metadata::plan(&request, &repo, source.clone(), &source_id, &parent)
                .await
            {
                Ok(plan) => plan,
                Err(e) => {
                    let _ = source.close().await;
                    return Err(e);
                }
            };
        if let Some(why) = &plan.fallback {
            eprintln!("ferry: warning: {why}");
        }
        tracking = Some(plan.tracking());
        (source, parent, metadata_changes, fallback) =
            (plan.source, plan.parent, plan.changed, plan.fallback);
    }
    let mut options = BackupOptions::new(source_id).with_parent(parent);
    if let Some(changed) = metadata_changes {
        options = options.with_changed(changed);
    }
    if let Some(id) = &args.snapshot_id {
        options = options.with_snapshot_id(id.clone());
    }
    if let Some(workers) = args.workers {
        options = options.with_workers(workers);
    }
    for (k, v) in &args.tags {
        options = options.with_tag(k.clone(), v.clone());
    }
    if let Some(changed) = changed {
        options = options.with_changed(Arc::new(changed));
    }
    let cancel = CancellationToken::new();
    let ctrl_c = cancel_on_ctrl_c(&cancel);
    let progress = Progress::new();
    let display = progress::start(&progress, "backup", args.progress.choice());
    let result =
        ferry_image_backup::backup(&repo, source.clone(), &options, &progress, &cancel).await;
    progress::finish(display).await;
    let _ = source.close().await;
    cancel.cancel();
    let report = match result {
        Ok(report) => report,
        Err(_) if ctrl_c.is_cancelled() => {
            return Ok(interrupted(
                "the backup was cancelled; nothing was recorded",
            ))
        }
        Err(e) => return Err(super::failed(e, "backup failed")),
    };
    let mut summary = CreateSummary::from(&report);
    summary.changed_block_tracking =
        changed_block_tracking(report.manifest.parent.is_some(), tracking).map(str::to_string);
    summary.full_reason = with_reason(summary.full_reason.take(), fallback);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!("{}", summary.to_text());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_parents_parse() {
        assert_eq!(tag("vm=web1"), Ok(("vm".into(), "web1".into())));
        assert_eq!(tag("empty="), Ok(("empty".into(), String::new())));
        assert!(tag("=x").is_err());
        assert!(tag("novalue").is_err());
        assert_eq!(parent("auto"), Ok(ParentChoice::Auto));
        assert!(parent("yesterday").is_err());
    }
}
