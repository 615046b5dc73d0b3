//! `ferry backup sync SRC_REPO DST_REPO`: copies the backups the destination lacks
//! (Proxmox Backup Server's sync jobs), only the chunks it lacks, each checked on the
//! way, the index and manifest last; running it again after an interruption resumes.
//!
//! The source opens with the passphrase of `FERRY_BACKUP_KEY_FILE`; the destination with
//! `FERRY_BACKUP_DEST_KEY_FILE`'s, or, when that is not set, the same one (a destination
//! made with `ferry backup init DST --from SRC` shares the source's keys: chunks go as
//! stored, without re-encryption).

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use ferry_backup::SyncOptions;
use ferry_core::size::format_size;
use serde::Serialize;

use super::args;
use super::backup::{open_repository, open_repository_with, read_key_file};
use super::retention::RetentionArgs;

/// The environment variable naming the destination's key file.
pub const DEST_KEY_FILE_ENV: &str = "FERRY_BACKUP_DEST_KEY_FILE";

/// Arguments of `ferry backup sync`.
#[derive(Debug, Args)]
pub struct SyncArgs {
    /// The repository to copy from.
    #[arg(value_name = "SRC_REPO")]
    pub src: String,
    /// The repository to copy into (created with the same chunk size, or with
    /// `ferry backup init DST --from SRC`).
    #[arg(value_name = "DST_REPO")]
    pub dst: String,
    /// Only the backups of this source identity.
    #[arg(long, value_name = "ID")]
    pub source_id: Option<String>,
    /// Only the backups these rules keep (the flags of `ferry backup prune`; none: all).
    #[command(flatten)]
    pub retention: RetentionArgs,
    /// Remove the destination's backups (of --source-id) that the source no longer has;
    /// protected backups stay.
    #[arg(long)]
    pub remove_vanished: bool,
    /// Send at most this many bytes per second (like 50M).
    #[arg(long, value_name = "BYTES", value_parser = args::rate)]
    pub limit_rate: Option<u64>,
    /// Print one JSON object summarising the sync on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The `--json` summary of a sync (field names are part of the interface).
#[derive(Debug, Serialize)]
pub struct SyncSummary {
    pub backups_copied: usize,
    /// Selected backups the destination had already.
    pub backups_present: usize,
    pub chunks_copied: u64,
    /// Chunks of copied backups the destination had already.
    pub chunks_reused: u64,
    /// Bytes sent, as the destination stores them.
    pub bytes_copied: u64,
    /// Chunks sent as stored (the repositories share their keys) rather than re-encoded.
    pub same_keys: bool,
    pub copied: Vec<String>,
    pub removed: Vec<String>,
    pub seconds: f64,
}

/// Runs `ferry backup sync`.
pub async fn run(args: SyncArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let src = open_repository(&args.src).await?;
    let dst = match std::env::var_os(DEST_KEY_FILE_ENV) {
        Some(path) => {
            let key = read_key_file(std::path::Path::new(&path), DEST_KEY_FILE_ENV)?;
            open_repository_with(&args.dst, Some(key), DEST_KEY_FILE_ENV).await?
        }
        None => open_repository(&args.dst).await?,
    };
    let mut options = SyncOptions::new()
        .with_keep(args.retention.policy())
        .with_remove_vanished(args.remove_vanished);
    if let Some(source) = args.source_id {
        options = options.with_source_id(source);
    }
    if let Some(rate) = args.limit_rate {
        options = options.with_limit_rate(rate);
    }
    let report = ferry_image_backup::sync(&src, &dst, &options)
        .await
        .map_err(|e| super::failed(e, "sync failed"))?;
    let summary = SyncSummary {
        backups_copied: report.copied.len(),
        backups_present: report.present,
        chunks_copied: report.chunks_copied,
        chunks_reused: report.chunks_reused,
        bytes_copied: report.bytes_copied,
        same_keys: report.same_keys,
        copied: report.copied.iter().map(ToString::to_string).collect(),
        removed: report.removed.iter().map(ToString::to_string).collect(),
        seconds: started.elapsed().as_secs_f64(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "copied {} backup(s) ({} present already): {} chunks sent ({}), {} reused{}; removed {} in {:.2} s",
            summary.backups_copied,
            summary.backups_present,
            summary.chunks_copied,
            format_size(summary.bytes_copied),
            summary.chunks_reused,
            if summary.same_keys {
                ", as stored (shared keys)"
            } else {
                ", re-encoded for the destination"
            },
            summary.removed.len(),
            summary.seconds
        );
    }
    Ok(ExitCode::SUCCESS)
}
