//! `ferry backup undelete`: on a versioned bucket (an immutable repository on S3 Object
//! Lock) a delete without a version id only hides an object behind a delete marker.
//! This command lists the backups hidden that way (or whose manifest was overwritten),
//! and brings them back with the chunks they need, by copying the hidden versions
//! forward: it needs only the rights to write, never to destroy a version.

use std::process::ExitCode;

use clap::Args;
use ferry_backup::{BackupId, HiddenBackup};
use ferry_endpoints::s3::S3Options;
use serde::Serialize;

use super::backup::{backup_id, location, passphrase};

/// Arguments of `ferry backup undelete`.
#[derive(Debug, Args)]
pub struct UndeleteArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    /// The backups to bring back (without any, and without --all: list them).
    #[arg(value_name = "ID", value_parser = backup_id)]
    pub ids: Vec<BackupId>,
    /// Bring back every hidden backup.
    #[arg(long, conflicts_with = "ids")]
    pub all: bool,
    /// Print one JSON value.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Listed<'a> {
    hidden: &'a [HiddenBackup],
}

/// Runs `ferry backup undelete`.
pub async fn run(args: UndeleteArgs) -> anyhow::Result<ExitCode> {
    let url = location(&args.repo)?;
    let store = url.open(&S3Options::default()).await;
    if args.ids.is_empty() && !args.all {
        let hidden = ferry_backup::hidden_backups(store.as_ref())
            .await
            .map_err(|e| super::failed(e, &format!("cannot list the versions of {url}")))?;
        if args.json {
            println!("{}", serde_json::to_string(&Listed { hidden: &hidden })?);
            return Ok(ExitCode::SUCCESS);
        }
        for h in &hidden {
            println!(
                "{}  {}{}",
                h.id,
                match h.hidden {
                    Some(t) => format!("hidden since {}", t.to_rfc3339()),
                    None => "present".to_string(),
                },
                match (h.pruned, h.overwritten) {
                    (_, true) => ", its manifest was overwritten",
                    (true, _) => ", removed by a prune",
                    _ => ", deleted by something other than a prune",
                }
            );
        }
        println!(
            "{} hidden backup(s); bring them back with: ferry backup undelete {url} --all (or ID...)",
            hidden.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let key = passphrase()?;
    let ids = (!args.all).then_some(args.ids.as_slice());
    let report = ferry_backup::undelete(store, key.as_ref(), ids)
        .await
        .map_err(|e| super::failed(e, &format!("undelete in {url} failed")))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for id in &report.backups {
            println!("brought back {id}");
        }
        println!(
            "{} backup(s), {} chunk(s) and {} repository object(s) brought back",
            report.backups.len(),
            report.chunks,
            report.repository_objects
        );
    }
    if report.chunks_lost > 0 {
        anyhow::bail!(
            "{} chunk(s) that listed backups need have no intact version left: run ferry backup verify {url}",
            report.chunks_lost
        );
    }
    Ok(ExitCode::SUCCESS)
}
