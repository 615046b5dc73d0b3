//! `ferry job sync SRC_REPO DST_REPO`: a sync job of a running `ferry serve` (what `ferry
//! backup sync` does locally), with both repositories' keys and S3 settings given by
//! reference, a bandwidth limit and the time windows it applies in; and
//! `ferry job protect|unprotect REPO ID`.

use clap::Args;
use ferry_core::size::format_size;

use ferry_api::proto::{self, backup_service_client::BackupServiceClient};

use super::backup::{JobMeta, RepoArgs};
use super::connection::{status_error, ServerArgs};
use crate::cli::args;
use crate::cli::retention::RetentionArgs;

/// `ferry job sync SRC_REPO DST_REPO`.
#[derive(Debug, Clone, Args)]
pub struct SyncJobArgs {
    /// The repository to copy from (its key and S3 flags are --key-env, --key-file,
    /// --s3-...).
    #[command(flatten)]
    pub src: RepoArgs,
    /// The repository to copy into: a directory on the server, file:///path or
    /// s3://bucket/prefix.
    #[arg(value_name = "DST_REPO")]
    pub dst: String,
    /// Environment variable on the server holding the destination's passphrase
    /// [default: the source's key, which opens a destination made with --from].
    #[arg(long, value_name = "NAME", conflicts_with = "dest_key_file")]
    pub dest_key_env: Option<String>,
    /// File under the server's --secrets-dir holding the destination's passphrase.
    #[arg(long, value_name = "NAME")]
    pub dest_key_file: Option<String>,
    /// S3 destinations: endpoint URL.
    #[arg(long, value_name = "URL")]
    pub dest_s3_endpoint: Option<String>,
    /// S3 destinations: region.
    #[arg(long, value_name = "REGION")]
    pub dest_s3_region: Option<String>,
    /// S3 destinations: path-style addressing.
    #[arg(long)]
    pub dest_s3_path_style: bool,
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
    /// Create DST when it holds no repository, sharing SRC's keys (as `ferry backup init
    /// DST --from SRC`); the destination key, when given, is added as one more key.
    #[arg(long)]
    pub init_destination: bool,
    /// Send at most this many bytes per second (like 50M).
    #[arg(long, value_name = "BYTES", value_parser = args::rate)]
    pub limit_rate: Option<u64>,
    /// Apply --limit-rate only in this window, `[DAYS ]HH:MM-HH:MM` with DAYS like
    /// `mon-fri` or `sat,sun` (repeatable; outside every window: unlimited).
    #[arg(long = "limit-window", value_name = "WINDOW", requires = "limit_rate", value_parser = window)]
    pub limit_windows: Vec<proto::RateLimitWindow>,
    /// The IANA time zone of the windows [default: UTC].
    #[arg(long, value_name = "ZONE", requires = "limit_windows")]
    pub limit_time_zone: Option<String>,
    #[command(flatten)]
    pub meta: JobMeta,
}

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// `[DAYS ]HH:MM-HH:MM`: days as a list (`mon,wed`) or a range (`mon-fri`).
pub(super) fn window(text: &str) -> Result<proto::RateLimitWindow, String> {
    let (days, times) = match text.trim().rsplit_once(' ') {
        Some((d, t)) => (d.trim(), t),
        None => ("", text.trim()),
    };
    let (start, end) = times
        .split_once('-')
        .ok_or_else(|| format!("'{text}': give [DAYS ]HH:MM-HH:MM, like 'mon-fri 08:00-18:00'"))?;
    let day = |d: &str| {
        DAYS.iter()
            .position(|n| n.eq_ignore_ascii_case(d))
            .ok_or_else(|| format!("'{d}' is not a day (mon, tue, wed, thu, fri, sat, sun)"))
    };
    let mut list = Vec::new();
    for part in days.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (day(a)?, day(b)?);
                let mut d = a;
                loop {
                    list.push(DAYS[d].to_string());
                    if d == b {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => list.push(DAYS[day(part)?].to_string()),
        }
    }
    Ok(proto::RateLimitWindow {
        days: list,
        start: start.into(),
        end: end.into(),
        time_zone: String::new(),
    })
}

/// The windows with their time zone (None: UTC).
pub(super) fn in_zone(
    windows: &[proto::RateLimitWindow],
    zone: Option<&str>,
) -> Vec<proto::RateLimitWindow> {
    windows
        .iter()
        .map(|w| proto::RateLimitWindow {
            time_zone: zone.unwrap_or_default().to_string(),
            ..w.clone()
        })
        .collect()
}

impl SyncJobArgs {
    pub fn to_proto(&self) -> proto::StartSyncRequest {
        let key = super::connection::secret_ref(&self.dest_key_env, &self.dest_key_file);
        let s3 = (self.dest_s3_endpoint.is_some()
            || self.dest_s3_region.is_some()
            || self.dest_s3_path_style)
            .then(|| proto::S3Options {
                endpoint_url: self.dest_s3_endpoint.clone().unwrap_or_default(),
                region: self.dest_s3_region.clone().unwrap_or_default(),
                force_path_style: self.dest_s3_path_style,
                ..Default::default()
            });
        proto::StartSyncRequest {
            source: Some(self.src.to_proto()),
            destination: Some(proto::Repository {
                url: self.dst.clone(),
                s3,
                key,
            }),
            source_id: self.source_id.clone().unwrap_or_default(),
            retention: self.retention.to_proto(),
            remove_vanished: self.remove_vanished,
            init_destination_if_missing: self.init_destination,
            rate_limit: self.limit_rate.unwrap_or(0),
            rate_limit_windows: in_zone(&self.limit_windows, self.limit_time_zone.as_deref()),
            idempotency_key: self.meta.key.clone().unwrap_or_default(),
            labels: self.meta.labels.iter().cloned().collect(),
            priority: self.meta.priority,
        }
    }
}

/// `ferry job protect|unprotect REPO ID`.
#[derive(Debug, Clone, Args)]
pub struct ProtectArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// The backup's id.
    #[arg(value_name = "ID")]
    pub id: String,
}

/// Protects or unprotects a backup through the service; prints what changed.
pub async fn protect(
    conn: &ServerArgs,
    a: &ProtectArgs,
    on: bool,
    json: bool,
) -> anyhow::Result<()> {
    let (channel, token) = super::connection::channel(conn).await?;
    let mut client = BackupServiceClient::with_interceptor(channel, token);
    let req = proto::ProtectSnapshotRequest {
        repository: Some(a.repo.to_proto()),
        id: a.id.clone(),
    };
    let reply = if on {
        client.protect_snapshot(req).await
    } else {
        client.unprotect_snapshot(req).await
    }
    .map_err(status_error)?
    .into_inner();
    if json {
        println!(
            "{}",
            serde_json::json!({ "id": a.id, "protected": on, "was_protected": reply.was_protected })
        );
    } else {
        let state = if on { "protected" } else { "unprotected" };
        let was = if reply.was_protected == on {
            " (it was already)"
        } else {
            ""
        };
        println!("{} {state}{was}", a.id);
    }
    Ok(())
}

/// A sync's result as text lines.
pub fn result_text(s: &proto::SyncResult) -> String {
    format!(
        "sync:     {} backup(s) copied ({} present already): {} chunks sent ({}), {} reused{}; {} removed",
        s.backups_copied,
        s.backups_present,
        s.chunks_copied,
        format_size(s.bytes_copied),
        s.chunks_reused,
        if s.same_keys {
            ", as stored (shared keys)"
        } else {
            ""
        },
        s.removed.len()
    )
}

/// A sync's result as JSON (the fields of `ferry backup sync --json`).
pub fn result_json(s: &proto::SyncResult) -> serde_json::Value {
    serde_json::json!({
        "backups_copied": s.backups_copied, "backups_present": s.backups_present,
        "chunks_copied": s.chunks_copied, "chunks_reused": s.chunks_reused,
        "bytes_copied": s.bytes_copied, "same_keys": s.same_keys,
        "copied": s.copied, "removed": s.removed, "seconds": s.seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_read_days_as_lists_and_ranges() {
        let w = window("mon-fri 08:00-18:00").unwrap();
        assert_eq!(w.days, ["mon", "tue", "wed", "thu", "fri"]);
        assert_eq!((w.start.as_str(), w.end.as_str()), ("08:00", "18:00"));
        assert_eq!(window("sat,SUN 22:00-06:00").unwrap().days, ["sat", "sun"]);
        assert_eq!(
            window("fri-mon 00:00-24:00").unwrap().days,
            ["fri", "sat", "sun", "mon"]
        );
        assert!(window("08:00-18:00").unwrap().days.is_empty());
        assert!(window("someday 08:00-18:00").is_err());
        assert!(window("08:00").is_err());
    }
}
