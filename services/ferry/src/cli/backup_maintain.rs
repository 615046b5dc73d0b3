//! `ferry backup verify | prune | gc`: the repository's maintenance operations, with the
//! block digests ferry stores beside each backup kept in step (deleted with their backup).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use ferry_backup::{BackupId, ChunkFault, GcOptions, VerifyOptions, VerifyReport};
use ferry_core::size::format_size;
use serde::Serialize;

use super::backup::{backup_id, open_repository};
use super::retention::RetentionArgs;

/// Arguments of `ferry backup verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    /// Only the chunks of these backups [default: every stored chunk].
    #[arg(value_name = "ID", value_parser = backup_id)]
    pub ids: Vec<BackupId>,
    /// Print one JSON object with what was checked and found.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct VerifySummary {
    ok: bool,
    snapshots_checked: u64,
    chunks_checked: u64,
    bytes_checked: u64,
    problems: Vec<Problem>,
    broken_snapshots: Vec<String>,
    unreadable_snapshots: Vec<Unreadable>,
}

#[derive(Debug, Serialize)]
struct Problem {
    chunk: String,
    fault: String,
    snapshots: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Unreadable {
    id: String,
    error: String,
}

impl VerifySummary {
    fn new(report: &VerifyReport) -> Self {
        Self {
            ok: report.is_ok(),
            snapshots_checked: report.snapshots_checked,
            chunks_checked: report.chunks_checked,
            bytes_checked: report.bytes_checked,
            problems: report
                .problems
                .iter()
                .map(|p| Problem {
                    chunk: p.digest.to_string(),
                    fault: match &p.fault {
                        ChunkFault::Missing => "missing".to_string(),
                        ChunkFault::Damaged(why) => format!("damaged: {why}"),
                    },
                    snapshots: p.snapshots.iter().map(ToString::to_string).collect(),
                })
                .collect(),
            broken_snapshots: report
                .broken_snapshots
                .iter()
                .map(ToString::to_string)
                .collect(),
            unreadable_snapshots: report
                .unreadable_snapshots
                .iter()
                .map(|(id, error)| Unreadable {
                    id: id.to_string(),
                    error: error.clone(),
                })
                .collect(),
        }
    }

    /// The error of a verify that found problems: every bad chunk and unreadable backup.
    fn failure(&self) -> anyhow::Error {
        let mut faults: Vec<String> = self
            .problems
            .iter()
            .map(|p| {
                let users = if p.snapshots.is_empty() {
                    "no backup".to_string()
                } else {
                    format!("backups {}", p.snapshots.join(", "))
                };
                format!("chunk {} {} (used by {users})", p.chunk, p.fault)
            })
            .collect();
        faults.extend(
            self.unreadable_snapshots
                .iter()
                .map(|u| format!("backup {} unreadable: {}", u.id, u.error)),
        );
        anyhow!(
            "verify found {} problem(s); broken backups: [{}]; {}",
            faults.len(),
            self.broken_snapshots.join(", "),
            faults.join("; ")
        )
    }
}

/// Runs `ferry backup verify`: exit 0 when everything read back as stored, 1 otherwise.
pub async fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let repo = open_repository(&args.repo).await?;
    let mut options = VerifyOptions::new();
    if !args.ids.is_empty() {
        options = options.with_snapshots(args.ids.clone());
    }
    let report = repo
        .verify(&options)
        .await
        .map_err(|e| super::failed(e, "verify failed"))?;
    let summary = VerifySummary::new(&report);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(if summary.ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    if !summary.ok {
        return Err(summary.failure());
    }
    println!(
        "verified {} backups: {} chunks ({}) read back as stored",
        summary.snapshots_checked,
        summary.chunks_checked,
        format_size(summary.bytes_checked)
    );
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `ferry backup prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    #[command(flatten)]
    pub retention: RetentionArgs,
    /// Print what would be deleted, delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print one JSON object with the decisions.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct PruneSummary {
    dry_run: bool,
    keep: Vec<PruneEntry>,
    remove: Vec<PruneEntry>,
    /// Backups deleted (empty in a dry run).
    deleted: Vec<String>,
}

#[derive(Debug, Serialize)]
struct PruneEntry {
    id: String,
    time: String,
    source: String,
    reasons: Vec<String>,
}

/// Runs `ferry backup prune`.
pub async fn prune(args: PruneArgs) -> anyhow::Result<ExitCode> {
    let repo = open_repository(&args.repo).await?;
    let policy = args.retention.policy();
    let report = ferry_image_backup::prune(&repo, &policy, chrono::Utc::now(), args.dry_run)
        .await
        .map_err(|e| super::failed(e, "prune failed"))?;
    let (mut keep, mut remove) = (Vec::new(), Vec::new());
    for d in &report.plan.decisions {
        let entry = PruneEntry {
            id: d.snapshot.id.to_string(),
            time: d.snapshot.time.to_rfc3339(),
            source: d.snapshot.source.clone(),
            reasons: d.reasons.iter().map(ToString::to_string).collect(),
        };
        if d.keep() {
            keep.push(entry);
        } else {
            remove.push(entry);
        }
    }
    let summary = PruneSummary {
        dry_run: args.dry_run,
        keep,
        remove,
        deleted: report.deleted.iter().map(ToString::to_string).collect(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(ExitCode::SUCCESS);
    }
    for e in &summary.keep {
        println!("keep    {}  {}  ({})", e.id, e.source, e.reasons.join(", "));
    }
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    for e in &summary.remove {
        println!("{verb} {}  {}", e.id, e.source);
    }
    println!(
        "{} kept, {} {verb}{}",
        summary.keep.len(),
        summary.remove.len(),
        if args.dry_run {
            " (dry run: nothing deleted)"
        } else if repo.immutability().is_some() {
            "; immutable repository: they are hidden and recorded, and 'ferry backup gc' destroys them once their retention has passed"
        } else {
            "; run 'ferry backup gc' to free their chunks"
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// A duration: a number with s, m, h, d or w (`0`, `90s`, `30m`, `24h`, `7d`).
pub fn duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("'{text}' is not a duration like 0, 90s, 30m, 24h or 7d");
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        "w" => 7 * 86400,
        _ => return Err(bad()),
    };
    n.checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(bad)
}

/// A lease lifetime: a [`duration`] of at least 3 s (renewed every third of it).
fn lease_ttl(text: &str) -> Result<Duration, String> {
    let ttl = duration(text)?;
    if ttl < Duration::from_secs(3) {
        return Err(format!("'{text}' is too short for a lease: at least 3s"));
    }
    Ok(ttl)
}

/// Arguments of `ferry backup gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    /// Keep unused chunks younger than this (0 frees everything unused; only safe when no
    /// backup of an older ferry runs).
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = duration)]
    pub grace: Duration,
    /// How long the GC's lease on the repository lasts unless renewed (every third of it).
    /// A GC that dies keeps others out this long.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = lease_ttl)]
    pub lease_ttl: Duration,
    /// Print the GC's report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct GcSummary {
    #[serde(flatten)]
    report: ferry_backup::GcReport,
    block_digests_removed: u64,
}

/// Runs `ferry backup gc`.
pub async fn gc(args: GcArgs) -> anyhow::Result<ExitCode> {
    let repo = open_repository(&args.repo).await?;
    let options = GcOptions::new()
        .with_grace(args.grace)
        .with_lease_ttl(args.lease_ttl);
    let (report, block_digests_removed) = ferry_image_backup::gc(&repo, &options)
        .await
        .map_err(|e| super::failed(e, "garbage collection failed"))?;
    if args.json {
        let summary = GcSummary {
            report,
            block_digests_removed,
        };
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "removed {} unused chunks ({}); kept {} in use and {} recent ({}) in {:.2} s",
        report.chunks_removed,
        format_size(report.bytes_removed),
        report.chunks_referenced,
        report.chunks_recent,
        format_size(report.bytes_kept),
        report.duration.as_secs_f64()
    );
    if repo.immutability().is_some() {
        println!(
            "immutable repository: {} object version(s) destroyed, {} still retained ({} unused chunks wait for their retention to pass)",
            report.versions_removed, report.versions_retained, report.chunks_retained
        );
    }
    if report.hidden_backups > 0 {
        println!(
            "{} backup(s) are hidden by a delete marker that no prune made: kept; see ferry backup undelete {}",
            report.hidden_backups, args.repo
        );
    }
    if report.sessions_without_parent > 0 {
        println!(
            "no unused chunk was removed: {} running backup(s) reuse chunks of a backup pruned meanwhile; run gc again when they have finished",
            report.sessions_without_parent
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert_eq!(duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("24h"), Ok(Duration::from_secs(86400)));
        assert_eq!(duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert!(duration("1x").is_err());
        assert!(duration("h").is_err());
        assert!(duration("").is_err());
        assert_eq!(lease_ttl("3s"), Ok(Duration::from_secs(3)));
        assert!(lease_ttl("2s").unwrap_err().contains("at least 3s"));
    }
}
