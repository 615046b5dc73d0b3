//! `ferry job backup|restore|repo-verify|prune|gc|snapshots`: the backup jobs and
//! repository reads of a running `ferry serve`, with the repository's key and S3
//! credentials given by reference (a variable or a file on the server), never by value.
//! `ferry schedule create --backup` builds its template with [`BackupJobArgs`].

use std::collections::BTreeMap;

use anyhow::bail;
use clap::Args;
use ferry_core::size::{format_size, parse_size};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use ferry_api::auth::BearerToken;
use ferry_api::proto::{self, backup_service_client::BackupServiceClient};

use super::connection::{parse_label, status_error, ServerArgs};
use super::json::snapshot_json;
use crate::cli::options::{Cache, Order};
use crate::cli::retention::RetentionArgs;

/// Where the repository is and how the server opens it.
#[derive(Debug, Clone, Args)]
pub struct RepoArgs {
    /// The repository: a directory on the server, file:///path or s3://bucket/prefix.
    #[arg(value_name = "REPO")]
    pub repo: String,
    /// Environment variable on the server holding the passphrase of an encrypted
    /// repository.
    #[arg(long, value_name = "NAME", conflicts_with = "key_file")]
    pub key_env: Option<String>,
    /// File under the server's --secrets-dir holding the passphrase (first line).
    #[arg(long, value_name = "NAME")]
    pub key_file: Option<String>,
    /// S3 repositories: endpoint URL (default: the server's AWS configuration).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// S3 repositories: region.
    #[arg(long, value_name = "REGION")]
    pub s3_region: Option<String>,
    /// S3 repositories: path-style addressing (most S3-compatible servers need it).
    #[arg(long)]
    pub s3_path_style: bool,
}

impl RepoArgs {
    pub fn to_proto(&self) -> proto::Repository {
        let key = super::connection::secret_ref(&self.key_env, &self.key_file);
        let s3 = (self.s3_endpoint.is_some() || self.s3_region.is_some() || self.s3_path_style)
            .then(|| proto::S3Options {
                endpoint_url: self.s3_endpoint.clone().unwrap_or_default(),
                region: self.s3_region.clone().unwrap_or_default(),
                force_path_style: self.s3_path_style,
                ..Default::default()
            });
        proto::Repository {
            url: self.repo.clone(),
            s3,
            key,
        }
    }
}

/// What every backup job takes besides its own options.
#[derive(Debug, Clone, Args)]
pub struct JobMeta {
    /// Idempotency key: repeating the command with the same key returns the same job.
    #[arg(long)]
    pub key: Option<String>,
    /// A label KEY=VALUE (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    #[arg(long, default_value_t = 0)]
    pub priority: i32,
    /// Watch the job after starting it.
    #[arg(long)]
    pub watch: bool,
}

/// `ferry job backup SRC REPO`.
#[derive(Debug, Clone, Args)]
pub struct BackupJobArgs {
    /// Image to back up: a path or URL on the server.
    pub src: String,
    #[command(flatten)]
    pub repo: RepoArgs,
    /// The backup to build on: auto (the latest of the same source), a backup id, or none.
    #[arg(long, default_value = "auto")]
    pub parent: String,
    /// A label KEY=VALUE stored with the backup (repeatable).
    #[arg(long = "tag", value_parser = parse_label)]
    pub tags: Vec<(String, String)>,
    /// The source's identity, which groups backups [default: SRC].
    #[arg(long, value_name = "ID")]
    pub source_id: Option<String>,
    /// NBD sources: read only the chunks this QEMU dirty bitmap marks dirty.
    #[arg(long, value_name = "NAME")]
    pub dirty_bitmap: Option<String>,
    /// Chunks in flight at once.
    #[arg(long)]
    pub workers: Option<u32>,
    /// Create the repository when there is none, with this chunk size (e.g. 4M).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub init_chunk_size: Option<u64>,
    /// Prune the backups of the source after a successful backup with these rules.
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub meta: JobMeta,
}

impl BackupJobArgs {
    pub fn to_proto(&self) -> proto::StartBackupRequest {
        proto::StartBackupRequest {
            source: Some(proto::Endpoint {
                url: self.src.clone(),
                ..Default::default()
            }),
            repository: Some(self.repo.to_proto()),
            parent: self.parent.clone(),
            source_id: self.source_id.clone().unwrap_or_default(),
            tags: self.tags.iter().cloned().collect(),
            workers: self.workers.unwrap_or(0),
            dirty_bitmap: self.dirty_bitmap.clone().unwrap_or_default(),
            init_if_missing: self
                .init_chunk_size
                .map(|chunk_size| proto::RepositoryInit {
                    chunk_size,
                    zstd_level: None,
                    ..Default::default()
                }),
            retention: self.retention.to_proto(),
            idempotency_key: self.meta.key.clone().unwrap_or_default(),
            labels: self.meta.labels.iter().cloned().collect(),
            priority: self.meta.priority,
            // Changed blocks from the CSI SnapshotMetadata service: what the operator's
            // movers are sent (per fire, with a fresh token); no flags here.
            snapshot_metadata: None,
            volume_snapshot_handle: String::new(),
        }
    }
}

/// `ferry job restore REPO ID DST`.
#[derive(Debug, Clone, Args)]
pub struct RestoreJobArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// The backup's id, or `latest`: the newest backup of --source-id, as the job finds
    /// it when it starts.
    #[arg(value_name = "ID")]
    pub id: String,
    /// Image to write on the server (a missing file is created with the image's size).
    #[arg(value_name = "DST")]
    pub dst: String,
    /// With ID `latest`: the source whose newest backup is restored.
    #[arg(long, value_name = "SOURCE")]
    pub source_id: Option<String>,
    /// With ID `latest`: only backups started at or before this time (RFC 3339, like
    /// 2026-12-02T03:00:00Z).
    #[arg(long, value_name = "TIME", value_parser = parse_time, requires = "source_id")]
    pub as_of: Option<prost_types::Timestamp>,
    /// Chunks opened and written at once (twice as many are fetched).
    #[arg(long)]
    pub workers: Option<u32>,
    #[arg(long, value_enum)]
    pub order: Option<Order>,
    /// Do not check the restored image's block hash against the backup's.
    #[arg(long)]
    pub skip_verify: bool,
    #[arg(long, value_enum)]
    pub cache: Option<Cache>,
    #[command(flatten)]
    pub meta: JobMeta,
}

/// `ferry job repo-verify REPO [ID...]`.
#[derive(Debug, Clone, Args)]
pub struct VerifyJobArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Only the chunks of these backups [default: every stored chunk].
    #[arg(value_name = "ID")]
    pub ids: Vec<String>,
    #[command(flatten)]
    pub meta: JobMeta,
}

/// `ferry job prune REPO --keep-...`.
#[derive(Debug, Clone, Args)]
pub struct PruneJobArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    /// Only the backups of this source identity.
    #[arg(long, value_name = "ID")]
    pub source_id: Option<String>,
    /// Decide, delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub meta: JobMeta,
}

/// `ferry job gc REPO`.
#[derive(Debug, Clone, Args)]
pub struct GcJobArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Keep unused chunks younger than this many seconds [default: 86400].
    #[arg(long, value_name = "SECONDS")]
    pub grace_seconds: Option<u64>,
    #[command(flatten)]
    pub meta: JobMeta,
}

/// `ferry job snapshots REPO`.
#[derive(Debug, Clone, Args)]
pub struct SnapshotsArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Only backups of this source identity.
    #[arg(long, value_name = "ID")]
    pub source_id: Option<String>,
    /// Only backups with tag KEY=VALUE (repeatable).
    #[arg(long = "tag", value_parser = parse_label)]
    pub tags: Vec<(String, String)>,
}

/// An RFC 3339 time as a protobuf Timestamp.
fn parse_time(text: &str) -> Result<prost_types::Timestamp, String> {
    let t = chrono::DateTime::parse_from_rfc3339(text)
        .map_err(|e| format!("'{text}' is not an RFC 3339 time like 2026-12-02T03:00:00Z: {e}"))?;
    Ok(prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
    })
}

type JobClient =
    proto::job_service_client::JobServiceClient<InterceptedService<Channel, BearerToken>>;

/// Starts a backup job.
pub async fn start_backup(client: &mut JobClient, a: &BackupJobArgs) -> anyhow::Result<proto::Job> {
    Ok(client
        .start_backup(a.to_proto())
        .await
        .map_err(status_error)?
        .into_inner())
}

pub async fn start_restore(
    client: &mut JobClient,
    a: &RestoreJobArgs,
) -> anyhow::Result<proto::Job> {
    let order = a.order.map_or(
        ferry_engine::CommitOrder::Auto,
        ferry_engine::CommitOrder::from,
    );
    let latest = match (a.id.as_str(), &a.source_id) {
        ("latest", Some(source_id)) => Some(proto::LatestBackup {
            source_id: source_id.clone(),
            as_of: a.as_of,
        }),
        ("latest", None) => bail!("ID latest needs --source-id: whose latest backup?"),
        (_, Some(_)) => bail!("--source-id goes with ID latest, not with a backup id"),
        _ => None,
    };
    let req = proto::StartRestoreRequest {
        repository: Some(a.repo.to_proto()),
        snapshot_id: if latest.is_some() {
            String::new()
        } else {
            a.id.clone()
        },
        latest,
        target: Some(proto::Endpoint {
            url: a.dst.clone(),
            ..Default::default()
        }),
        workers: a.workers.unwrap_or(0),
        order: proto::CommitOrder::from(order) as i32,
        skip_verify: a.skip_verify,
        idempotency_key: a.meta.key.clone().unwrap_or_default(),
        labels: a.meta.labels.iter().cloned().collect(),
        priority: a.meta.priority,
        refuse_if_target_busy: false,
        cache: proto::CacheMode::from(a.cache.unwrap_or_default()) as i32,
    };
    Ok(client
        .start_restore(req)
        .await
        .map_err(status_error)?
        .into_inner())
}

pub async fn start_verify(client: &mut JobClient, a: &VerifyJobArgs) -> anyhow::Result<proto::Job> {
    let req = proto::StartRepositoryVerifyRequest {
        repository: Some(a.repo.to_proto()),
        snapshot_ids: a.ids.clone(),
        no_mark_bad: false,
        idempotency_key: a.meta.key.clone().unwrap_or_default(),
        labels: a.meta.labels.iter().cloned().collect(),
        priority: a.meta.priority,
    };
    Ok(client
        .start_repository_verify(req)
        .await
        .map_err(status_error)?
        .into_inner())
}

pub async fn start_prune(client: &mut JobClient, a: &PruneJobArgs) -> anyhow::Result<proto::Job> {
    let Some(retention) = a.retention.to_proto() else {
        bail!("give at least one --keep-... rule");
    };
    let req = proto::StartPruneRequest {
        repository: Some(a.repo.to_proto()),
        retention: Some(retention),
        source_id: a.source_id.clone().unwrap_or_default(),
        dry_run: a.dry_run,
        idempotency_key: a.meta.key.clone().unwrap_or_default(),
        labels: a.meta.labels.iter().cloned().collect(),
        priority: a.meta.priority,
    };
    Ok(client
        .start_prune(req)
        .await
        .map_err(status_error)?
        .into_inner())
}

pub async fn start_gc(client: &mut JobClient, a: &GcJobArgs) -> anyhow::Result<proto::Job> {
    let req = proto::StartGcRequest {
        repository: Some(a.repo.to_proto()),
        grace_seconds: a.grace_seconds,
        idempotency_key: a.meta.key.clone().unwrap_or_default(),
        labels: a.meta.labels.iter().cloned().collect(),
        priority: a.meta.priority,
    };
    Ok(client
        .start_gc(req)
        .await
        .map_err(status_error)?
        .into_inner())
}

/// `ferry job snapshots`: every backup of the repository (all pages).
pub async fn snapshots(conn: &ServerArgs, a: &SnapshotsArgs, json: bool) -> anyhow::Result<()> {
    let (channel, token) = super::connection::channel(conn).await?;
    let mut client = BackupServiceClient::with_interceptor(channel, token);
    let mut all = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_snapshots(proto::ListSnapshotsRequest {
                repository: Some(a.repo.to_proto()),
                source_id: a.source_id.clone().unwrap_or_default(),
                tags: a.tags.iter().cloned().collect::<BTreeMap<_, _>>(),
                page_size: 1000,
                page_token,
            })
            .await
            .map_err(status_error)?
            .into_inner();
        all.extend(page.snapshots);
        page_token = page.next_page_token;
        if page_token.is_empty() {
            break;
        }
    }
    if json {
        let list: Vec<_> = all.iter().map(snapshot_json).collect();
        println!("{}", serde_json::Value::Array(list));
        return Ok(());
    }
    println!("{:<25}  {:>9}  {:>9}  SOURCE", "ID", "SIZE", "NEW");
    for s in &all {
        println!(
            "{:<25}  {:>9}  {:>9}  {}",
            s.id,
            format_size(s.size),
            format_size(s.bytes_new),
            s.source_id
        );
    }
    Ok(())
}

/// A backup job's result as text lines, None for others.
pub fn result_text(r: &proto::job::Result) -> Option<String> {
    use proto::job::Result as R;
    Some(match r {
        R::BackupResult(b) => {
            let mut t = format!(
                "backup:   {} of {} ({}): {} new, {} reused, {} zero; {} read",
                b.snapshot_id,
                b.source_id,
                format_size(b.size),
                format_size(b.bytes_new),
                format_size(b.bytes_reused),
                format_size(b.bytes_zero),
                format_size(b.bytes_read)
            );
            if !b.parent_id.is_empty() {
                t.push_str(&format!("\nparent:   {}", b.parent_id));
            } else if !b.full_reason.is_empty() {
                t.push_str(&format!("\nfull:     {}", b.full_reason));
            }
            if let Some(p) = &b.prune {
                t.push_str(&format!(
                    "\npruned:   {} removed, {} kept",
                    p.removed.len(),
                    p.kept.len()
                ));
            }
            if let Some(e) = &b.prune_error {
                t.push_str(&format!("\nprune:    failed: {}", e.message));
            }
            t
        }
        R::RestoreResult(r) => format!(
            "restore:  {} ({}, {} data){}",
            r.snapshot_id,
            format_size(r.size),
            format_size(r.data_bytes),
            if r.verified {
                ", block hash verified"
            } else {
                ""
            }
        ),
        R::RepositoryVerifyResult(v) => format!(
            "verify:   {} chunks checked, {} bad; broken backups: {}",
            v.chunks_checked,
            v.chunks_bad,
            if v.broken_snapshots.is_empty() {
                "none".to_string()
            } else {
                v.broken_snapshots.join(", ")
            }
        ),
        R::PruneResult(p) => format!(
            "prune:    {} kept, {} {}",
            p.kept.len(),
            p.removed.len(),
            if p.dry_run {
                "would be removed"
            } else {
                "removed"
            }
        ),
        R::GcResult(g) => format!(
            "gc:       {} chunks ({}) removed, {} kept ({})",
            g.chunks_removed,
            format_size(g.bytes_removed),
            g.chunks_referenced + g.chunks_recent,
            format_size(g.bytes_kept)
        ),
        R::SyncResult(s) => super::sync::result_text(s),
        R::TransferResult(_) | R::ChecksumResult(_) => return None,
    })
}
