//! `ferry backup ...`: deduplicating backups of disk images into a repository (a
//! directory or `s3://bucket/prefix`), and everything done with them.
//!
//! This module holds the subcommand list, opening a repository (with the passphrase from
//! `FERRY_BACKUP_KEY_FILE`, never from the command line), and the small commands (`init`,
//! `list`, `show`, `protect`, `unprotect`). `create`, `restore` and `serve` move image data and live in their own modules,
//! like the repository maintenance (`verify`, `prune`, `gc`).

use std::process::ExitCode;

use anyhow::{anyhow, bail};
use clap::{Args, Subcommand};
use ferry_backup::{
    BackupId, Immutability, InitOptions, LockMode, Manifest, Repository, RepositoryUrl,
};
use ferry_core::size::format_size;
use ferry_core::Secret;
use ferry_endpoints::s3::S3Options;
use serde::Serialize;

use super::args;

/// The environment variable naming the file whose first line is the passphrase.
pub const KEY_FILE_ENV: &str = "FERRY_BACKUP_KEY_FILE";

/// Arguments of `ferry backup`.
#[derive(Debug, Args)]
pub struct BackupArgs {
    #[command(subcommand)]
    pub command: BackupCommand,
}

/// The `ferry backup` subcommands.
#[derive(Debug, Subcommand)]
pub enum BackupCommand {
    /// Create an empty repository (encrypted when FERRY_BACKUP_KEY_FILE names a key file).
    Init(InitArgs),
    /// Back an image up into a repository.
    Create(super::backup_create::CreateArgs),
    /// List the backups in a repository.
    List(ListArgs),
    /// Print a backup's manifest (JSON).
    Show(ShowArgs),
    /// Restore a backup into an image.
    Restore(super::backup_restore::RestoreArgs),
    /// Serve a backup's image read-only over NBD until SIGTERM (instant access).
    Serve(super::backup_serve::ServeArgs),
    /// Re-read stored chunks and check them against their digests.
    Verify(super::backup_maintain::VerifyArgs),
    /// Delete backups a retention policy does not keep.
    Prune(super::backup_maintain::PruneArgs),
    /// Delete chunks no backup uses any more.
    Gc(super::backup_maintain::GcArgs),
    /// List, add, remove and rotate the keys of an encrypted repository.
    Key(super::backup_keys::KeyArgs),
    /// Protect a backup: no prune or delete removes it until it is unprotected.
    Protect(ProtectArgs),
    /// Remove a backup's protection.
    Unprotect(ProtectArgs),
    /// List, and bring back, backups hidden by S3 delete markers (versioned buckets).
    Undelete(super::backup_undelete::UndeleteArgs),
    /// Copy the backups another repository lacks into it (replication).
    Sync(super::backup_sync::SyncArgs),
}

/// Runs `ferry backup`.
pub async fn run(args: BackupArgs) -> anyhow::Result<ExitCode> {
    super::init_tracing();
    match args.command {
        BackupCommand::Init(a) => init(a).await,
        BackupCommand::Create(a) => super::backup_create::run(a).await,
        BackupCommand::List(a) => list(a).await,
        BackupCommand::Show(a) => show(a).await,
        BackupCommand::Restore(a) => super::backup_restore::run(a).await,
        BackupCommand::Serve(a) => super::backup_serve::run(a).await,
        BackupCommand::Verify(a) => super::backup_maintain::verify(a).await,
        BackupCommand::Prune(a) => super::backup_maintain::prune(a).await,
        BackupCommand::Gc(a) => super::backup_maintain::gc(a).await,
        BackupCommand::Key(a) => super::backup_keys::run(a).await,
        BackupCommand::Protect(a) => protect(a, true).await,
        BackupCommand::Unprotect(a) => protect(a, false).await,
        BackupCommand::Undelete(a) => super::backup_undelete::run(a).await,
        BackupCommand::Sync(a) => super::backup_sync::run(a).await,
    }
}

/// The passphrase from the key file `FERRY_BACKUP_KEY_FILE` names, if it is set.
pub fn passphrase() -> anyhow::Result<Option<Secret>> {
    let Some(path) = std::env::var_os(KEY_FILE_ENV) else {
        return Ok(None);
    };
    read_key_file(std::path::Path::new(&path), KEY_FILE_ENV).map(Some)
}

/// The passphrase in a key file: its first line, which must not be empty. `what` names
/// where the path came from, for messages (which never hold the file's content).
pub fn read_key_file(path: &std::path::Path, what: &str) -> anyhow::Result<Secret> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow!("cannot read the key file {} ({what}): {e}", path.display()))?;
    let line = text.lines().next().unwrap_or_default();
    if line.is_empty() {
        bail!(
            "the key file {} ({what}) is empty: its first line is the passphrase",
            path.display()
        );
    }
    Ok(Secret::new(line))
}

/// Parses a repository location.
pub(super) fn location(text: &str) -> anyhow::Result<RepositoryUrl> {
    RepositoryUrl::parse(text).map_err(|e| super::failed(e, "invalid repository"))
}

/// Opens the repository at `text`, with the key file's passphrase when there is one.
pub async fn open_repository(text: &str) -> anyhow::Result<Repository> {
    open_repository_with(text, passphrase()?, KEY_FILE_ENV).await
}

/// Opens the repository at `text` with `passphrase`, which came from the key file the
/// variable `key_env` names (for messages).
pub async fn open_repository_with(
    text: &str,
    passphrase: Option<Secret>,
    key_env: &str,
) -> anyhow::Result<Repository> {
    let url = location(text)?;
    let store = url.open(&S3Options::default()).await;
    Repository::open(store, passphrase.as_ref())
        .await
        .map_err(|e| {
            let missing_key = passphrase.is_none()
                && e.kind() == ferry_core::ErrorKind::PermissionDenied
                && e.message().contains("encrypted");
            let error = super::failed(e, &format!("cannot open the repository {url}"));
            if missing_key {
                anyhow!("{error} (set {key_env} to a file whose first line is the passphrase)")
            } else {
                error
            }
        })
}

/// Parses a backup id argument.
pub fn backup_id(text: &str) -> Result<BackupId, String> {
    text.parse()
        .map_err(|e: ferry_core::Error| e.message().to_string())
}

/// Arguments of `ferry backup init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// Where: a directory, file:///path or s3://bucket/prefix.
    #[arg(value_name = "REPO")]
    pub repo: String,
    /// Chunk size: a power of two from 64K to 64M, fixed for the repository's life.
    #[arg(long, value_name = "SIZE", default_value = "4M", value_parser = args::size)]
    pub chunk_size: u64,
    /// zstd level 1-22, or `none`.
    #[arg(long, value_name = "LEVEL", default_value = "1", value_parser = compression)]
    pub compression: Compression,
    /// Make the repository immutable (an S3 bucket with Object Lock enabled): every
    /// object version ferry writes is retained this many days, and backups are never
    /// destroyed inside it (docs/BACKUP.md, "Immutable repositories").
    #[arg(long, value_name = "DAYS", value_parser = clap::value_parser!(u32).range(1..=36500))]
    pub immutable_days: Option<u32>,
    /// The Object Lock mode: compliance (nobody can shorten a retention, the bucket's
    /// owner included) or governance (principals allowed s3:BypassGovernanceRetention can).
    #[arg(long, value_name = "MODE", default_value = "compliance", requires = "immutable_days", value_parser = lock_mode)]
    pub immutable_mode: LockMode,
    /// Share the keys of this repository (its id, chunk size, compression and key
    /// objects: the same passphrases open both), so that `ferry backup sync` copies
    /// chunks into the new one as they are stored. Needs no key.
    #[arg(long, value_name = "SRC_REPO", conflicts_with_all = ["chunk_size", "compression"])]
    pub from: Option<String>,
}

fn lock_mode(text: &str) -> Result<LockMode, String> {
    text.parse()
        .map_err(|e: ferry_core::Error| e.message().to_string())
}

/// A compression choice: a zstd level or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compression(pub Option<i32>);

fn compression(text: &str) -> Result<Compression, String> {
    if text == "none" {
        return Ok(Compression(None));
    }
    match text.parse::<i32>() {
        Ok(level) if (1..=22).contains(&level) => Ok(Compression(Some(level))),
        _ => Err(format!("'{text}' is not a zstd level (1 to 22) or 'none'")),
    }
}

async fn init(args: InitArgs) -> anyhow::Result<ExitCode> {
    let url = location(&args.repo)?;
    if let Some(from) = &args.from {
        return init_from(&url, from, &args).await;
    }
    let chunk_size = u32::try_from(args.chunk_size)
        .map_err(|_| anyhow!("chunk size {} is too large", args.chunk_size))?;
    let mut options = InitOptions::new()
        .with_chunk_size(chunk_size)
        .with_zstd_level(args.compression.0);
    let passphrase = passphrase()?;
    let encrypted = passphrase.is_some();
    if let Some(p) = passphrase {
        options = options.with_passphrase(p);
    }
    if let Some(days) = args.immutable_days {
        options = options.with_immutability(Immutability::days(args.immutable_mode, days));
    }
    let store = url.open(&S3Options::default()).await;
    Repository::init(store, options)
        .await
        .map_err(|e| super::failed(e, &format!("cannot create the repository {url}")))?;
    println!(
        "created the repository {url}: {} chunks, compression {}, {}",
        args::show_size(args.chunk_size),
        args.compression
            .0
            .map_or("none".to_string(), |l| format!("zstd level {l}")),
        if encrypted {
            "encrypted (keep the key file: without it the backups cannot be read)"
        } else {
            "not encrypted"
        }
    );
    if let Some(days) = args.immutable_days {
        println!(
            "immutable: every object version is retained {days} day(s) in {} mode",
            args.immutable_mode
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `ferry backup init DST --from SRC`.
async fn init_from(url: &RepositoryUrl, from: &str, args: &InitArgs) -> anyhow::Result<ExitCode> {
    let src_url = location(from)?;
    let src = src_url.open(&S3Options::default()).await;
    let store = url.open(&S3Options::default()).await;
    let immutable = args
        .immutable_days
        .map(|days| Immutability::days(args.immutable_mode, days));
    Repository::init_from(store, src.as_ref(), immutable)
        .await
        .map_err(|e| super::failed(e, &format!("cannot create the repository {url}")))?;
    println!(
        "created the repository {url} sharing the keys of {src_url} (the same passphrases open it)"
    );
    if let Some(days) = args.immutable_days {
        println!(
            "immutable: every object version is retained {days} day(s) in {} mode",
            args.immutable_mode
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `ferry backup list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    /// Only the backups of this source identity.
    #[arg(long, value_name = "ID")]
    pub source: Option<String>,
    /// Print a JSON array of backups.
    #[arg(long)]
    pub json: bool,
}

/// One backup in `ferry backup list --json` (field names are part of the interface).
#[derive(Debug, Serialize)]
pub struct ListEntry {
    pub id: String,
    pub time: String,
    pub size: u64,
    pub source: String,
    pub parent: Option<String>,
    pub tags: std::collections::BTreeMap<String, String>,
    pub block_hash: Option<String>,
    pub new_bytes: u64,
    pub reused_bytes: u64,
    pub zero_bytes: u64,
    /// Never removed by prune until unprotected (`ferry backup protect`).
    pub protected: bool,
}

impl From<&Manifest> for ListEntry {
    fn from(m: &Manifest) -> Self {
        Self {
            id: m.id.to_string(),
            time: m.time.to_rfc3339(),
            size: m.image_size,
            source: m.source.clone(),
            parent: m.parent.as_ref().map(ToString::to_string),
            tags: m.tags.clone(),
            block_hash: m.block_hash.clone(),
            new_bytes: m.bytes_new,
            reused_bytes: m.bytes_reused,
            zero_bytes: m.bytes_zero,
            protected: false,
        }
    }
}

async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let repo = open_repository(&args.repo).await?;
    let ids = repo
        .list_snapshots()
        .await
        .map_err(|e| super::failed(e, "cannot list the backups"))?;
    let protected = repo
        .protected_backups()
        .await
        .map_err(|e| super::failed(e, "cannot list the protected backups"))?;
    let mut manifests = Vec::with_capacity(ids.len());
    for id in &ids {
        let manifest = repo
            .load_manifest(id)
            .await
            .map_err(|e| super::failed(e, &format!("cannot read backup {id}")))?;
        if args.source.as_ref().is_none_or(|s| *s == manifest.source) {
            manifests.push(manifest);
        }
    }
    // Oldest first by start time: ids name the second only, so two backups started in
    // one second are ordered by their manifests' exact times.
    manifests.sort_by(|a, b| (a.time, &a.id).cmp(&(b.time, &b.id)));
    let entries: Vec<ListEntry> = manifests
        .iter()
        .map(|m| ListEntry {
            protected: protected.contains(&m.id),
            ..ListEntry::from(m)
        })
        .collect();
    if args.json {
        println!("{}", serde_json::to_string(&entries)?);
        return Ok(ExitCode::SUCCESS);
    }
    for e in &entries {
        println!(
            "{}  {}  {:>9}  new {:>9}  {}{}",
            e.id,
            e.time,
            format_size(e.size),
            format_size(e.new_bytes),
            e.source,
            if e.protected { "  (protected)" } else { "" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `ferry backup show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    #[arg(value_name = "ID", value_parser = backup_id)]
    pub id: BackupId,
}

async fn show(args: ShowArgs) -> anyhow::Result<ExitCode> {
    let repo = open_repository(&args.repo).await?;
    let manifest = repo
        .load_manifest(&args.id)
        .await
        .map_err(|e| super::failed(e, &format!("cannot read backup {}", args.id)))?;
    println!("{}", serde_json::to_string_pretty(&manifest)?);
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `ferry backup protect` and `ferry backup unprotect`.
#[derive(Debug, Args)]
pub struct ProtectArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    #[arg(value_name = "ID", value_parser = backup_id)]
    pub id: BackupId,
}

async fn protect(args: ProtectArgs, on: bool) -> anyhow::Result<ExitCode> {
    let repo = open_repository(&args.repo).await?;
    let id = &args.id;
    let was = if on {
        repo.protect(id).await
    } else {
        repo.unprotect(id).await
    }
    .map_err(|e| {
        let verb = if on { "protect" } else { "unprotect" };
        super::failed(e, &format!("cannot {verb} backup {id}"))
    })?;
    println!(
        "backup {id} {}",
        match (on, was) {
            (true, false) => "is protected: no prune removes it until it is unprotected",
            (true, true) => "was already protected",
            (false, true) => "is no longer protected",
            (false, false) => "was not protected",
        }
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_levels() {
        assert_eq!(compression("none"), Ok(Compression(None)));
        assert_eq!(compression("19"), Ok(Compression(Some(19))));
        assert!(compression("0").is_err());
        assert!(compression("fast").is_err());
    }
}
