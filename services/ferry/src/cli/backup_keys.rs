//! `ferry backup key ...`: the keys (passphrases) of an encrypted repository.
//!
//! The key in use comes from `FERRY_BACKUP_KEY_FILE` as for every backup command; a new
//! one from `--new-key-file`, never from the command line. Nothing here prints a
//! passphrase or a key: only key ids, times and KDF parameters (see
//! `ferry_backup::KeyInfo`). The repository does the work and keeps every step safe
//! against a crash (see ferry-backup's `key_admin` module).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use ferry_backup::{KdfParams, KeyInfo};

use super::backup::{open_repository, read_key_file};

/// Arguments of `ferry backup key`.
#[derive(Debug, Args)]
pub struct KeyArgs {
    #[command(subcommand)]
    pub command: KeyCommand,
}

/// The `ferry backup key` subcommands.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// List the keys that open the repository (never the keys themselves).
    List(ListArgs),
    /// Add a key: the passphrase in --new-key-file opens the repository too.
    Add(AddArgs),
    /// Remove a key (not the one in use, and not the last one).
    Remove(RemoveArgs),
    /// Replace the key in use by --new-key-file, without rewriting any data; with
    /// --master, also start a new master key for new data.
    Rotate(RotateArgs),
}

/// Arguments of `ferry backup key list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    /// Print a JSON array of keys.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `ferry backup key add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    /// The file whose first line is the new key's passphrase.
    #[arg(long, value_name = "FILE")]
    pub new_key_file: PathBuf,
    /// Print the new key as a JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `ferry backup key remove`.
#[derive(Debug, Args)]
pub struct RemoveArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    /// The key's id, as `ferry backup key list` prints it.
    #[arg(value_name = "KEY_ID")]
    pub key_id: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `ferry backup key rotate`.
#[derive(Debug, Args)]
pub struct RotateArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    /// The file whose first line is the passphrase that replaces the one in use.
    #[arg(long, value_name = "FILE")]
    pub new_key_file: PathBuf,
    /// Also start a new master key: new backups are encrypted with it and do not
    /// deduplicate against older ones; older backups stay readable. Only when the key in
    /// use is the repository's only key.
    #[arg(long)]
    pub master: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs `ferry backup key`.
pub async fn run(args: KeyArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        KeyCommand::List(a) => list(a).await,
        KeyCommand::Add(a) => add(a).await,
        KeyCommand::Remove(a) => remove(a).await,
        KeyCommand::Rotate(a) => rotate(a).await,
    }
}

fn line(k: &KeyInfo) -> String {
    format!(
        "{}{}  created {}  {} {} KiB x{}  master key {} (reads {})",
        k.id,
        if k.current { " (in use)" } else { "" },
        k.created.map_or("unknown".to_string(), |t| t.to_rfc3339()),
        k.kdf.algorithm,
        k.kdf.memory_kib,
        k.kdf.iterations,
        k.master_key,
        k.master_keys.len()
    )
}

async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let repo = open_repository(&args.repo).await?;
    let keys = repo
        .list_keys()
        .await
        .map_err(|e| super::failed(e, "cannot list the keys"))?;
    if args.json {
        println!("{}", serde_json::to_string(&keys)?);
    } else {
        keys.iter().for_each(|k| println!("{}", line(k)));
    }
    Ok(ExitCode::SUCCESS)
}

async fn add(args: AddArgs) -> anyhow::Result<ExitCode> {
    let new = read_key_file(&args.new_key_file, "--new-key-file")?;
    let repo = open_repository(&args.repo).await?;
    let key = repo
        .add_key(&new, &KdfParams::default())
        .await
        .map_err(|e| super::failed(e, "cannot add the key"))?;
    if args.json {
        println!("{}", serde_json::to_string(&key)?);
    } else {
        println!("added key {}", key.id);
    }
    Ok(ExitCode::SUCCESS)
}

async fn remove(args: RemoveArgs) -> anyhow::Result<ExitCode> {
    let repo = open_repository(&args.repo).await?;
    let removed = repo
        .remove_key(&args.key_id)
        .await
        .map_err(|e| super::failed(e, &format!("cannot remove key {}", args.key_id)))?;
    if args.json {
        println!("{}", serde_json::to_string(&removed)?);
    } else {
        println!("removed key {} ({} left)", removed.removed, removed.keys);
    }
    Ok(ExitCode::SUCCESS)
}

async fn rotate(args: RotateArgs) -> anyhow::Result<ExitCode> {
    let new = read_key_file(&args.new_key_file, "--new-key-file")?;
    let repo = open_repository(&args.repo).await?;
    let rotated = repo
        .rotate_key(&new, &KdfParams::default(), args.master)
        .await
        .map_err(|e| super::failed(e, "cannot rotate the key"))?;
    if args.json {
        println!("{}", serde_json::to_string(&rotated)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "replaced key {} by key {}: use the new key file from now on",
        rotated.removed, rotated.added.id
    );
    if let Some(master) = &rotated.new_master_key {
        println!(
            "new backups are encrypted with the new master key {master}; they do not deduplicate against older backups, which stay readable"
        );
    }
    Ok(ExitCode::SUCCESS)
}
