//! `ferry job key list|add|remove|rotate REPO`: the keys (passphrases) of an encrypted
//! repository, managed through a running `ferry serve` (its ListKeys, AddKey, RemoveKey
//! and RotateKey calls), as `ferry backup key` does locally.
//!
//! Every passphrase is given by reference, never by value: the repository's own as for
//! every `ferry job` repository (`--key-env`, `--key-file`), the new one by
//! `--new-key-env` or `--new-key-file` (a variable of the server or a file under its
//! `--secrets-dir`). Nothing here prints key material: the service answers with key ids,
//! times and master key ids only.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use ferry_api::proto::{self, backup_service_client::BackupServiceClient};

use super::backup::RepoArgs;
use super::connection::{status_error, ServerArgs};
use super::schedule::time;

/// `ferry job key ...`.
#[derive(Debug, Clone, Args)]
pub struct KeyJobArgs {
    #[command(subcommand)]
    pub command: KeyJobCommand,
}

/// The `ferry job key` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum KeyJobCommand {
    /// List the keys that open the repository (never the keys themselves).
    List(RepoArgs),
    /// Add a key: the passphrase --new-key-env or --new-key-file refers to opens the
    /// repository too.
    Add(NewKeyArgs),
    /// Remove a key (not the one the request opens the repository with, not the last).
    Remove(RemoveKeyArgs),
    /// Replace the key the request opens the repository with by the new one, without
    /// rewriting any data; with --master, also start a new master key for new data.
    Rotate(RotateKeyArgs),
}

/// The repository and a new passphrase, by reference.
#[derive(Debug, Clone, Args)]
pub struct NewKeyArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Environment variable on the server holding the new passphrase.
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with = "new_key_file",
        required_unless_present = "new_key_file"
    )]
    pub new_key_env: Option<String>,
    /// File under the server's --secrets-dir holding the new passphrase (first line).
    #[arg(long, value_name = "NAME")]
    pub new_key_file: Option<String>,
}

impl NewKeyArgs {
    fn new_key(&self) -> Option<proto::SecretRef> {
        super::connection::secret_ref(&self.new_key_env, &self.new_key_file)
    }
}

/// `ferry job key remove REPO KEY_ID`.
#[derive(Debug, Clone, Args)]
pub struct RemoveKeyArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// The key's id, as `ferry job key list` prints it.
    #[arg(value_name = "KEY_ID")]
    pub key_id: String,
}

/// `ferry job key rotate REPO --new-key-...`.
#[derive(Debug, Clone, Args)]
pub struct RotateKeyArgs {
    #[command(flatten)]
    pub key: NewKeyArgs,
    /// Also start a new master key: new backups are encrypted with it and do not
    /// deduplicate against older ones; older backups stay readable. Only when the key in
    /// use is the repository's only key.
    #[arg(long)]
    pub master: bool,
}

fn key_json(k: &proto::RepositoryKey) -> serde_json::Value {
    serde_json::json!({
        "id": k.id,
        "created": k.create_time.as_ref().map(|_| time(&k.create_time)),
        "current": k.current,
        "master_key": k.master_key,
        "master_keys": k.master_keys,
    })
}

fn key_line(k: &proto::RepositoryKey) -> String {
    let created = match &k.create_time {
        Some(_) => time(&k.create_time),
        None => "unknown".into(),
    };
    format!(
        "{}{}  created {created}  master key {} (reads {})",
        k.id,
        if k.current { " (in use)" } else { "" },
        k.master_key,
        k.master_keys.len()
    )
}

/// Runs `ferry job key ...`; `json` prints the replies as JSON.
pub async fn run(conn: &ServerArgs, args: &KeyJobArgs, json: bool) -> anyhow::Result<ExitCode> {
    let (channel, token) = super::connection::channel(conn).await?;
    let mut client = BackupServiceClient::with_interceptor(channel, token);
    match &args.command {
        KeyJobCommand::List(repo) => {
            let keys = client
                .list_keys(proto::ListKeysRequest {
                    repository: Some(repo.to_proto()),
                })
                .await
                .map_err(status_error)?
                .into_inner()
                .keys;
            if json {
                let list: Vec<_> = keys.iter().map(key_json).collect();
                println!("{}", serde_json::Value::Array(list));
            } else {
                keys.iter().for_each(|k| println!("{}", key_line(k)));
            }
        }
        KeyJobCommand::Add(a) => {
            let key = client
                .add_key(proto::AddKeyRequest {
                    repository: Some(a.repo.to_proto()),
                    new_key: a.new_key(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if json {
                println!("{}", key_json(&key));
            } else {
                println!("added key {}", key.id);
            }
        }
        KeyJobCommand::Remove(a) => {
            let removed = client
                .remove_key(proto::RemoveKeyRequest {
                    repository: Some(a.repo.to_proto()),
                    key_id: a.key_id.clone(),
                })
                .await
                .map_err(status_error)?
                .into_inner();
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "removed": removed.removed, "keys": removed.keys_left })
                );
            } else {
                println!(
                    "removed key {} ({} left)",
                    removed.removed, removed.keys_left
                );
            }
        }
        KeyJobCommand::Rotate(a) => {
            let rotated = client
                .rotate_key(proto::RotateKeyRequest {
                    repository: Some(a.key.repo.to_proto()),
                    new_key: a.key.new_key(),
                    new_master_key: a.master,
                })
                .await
                .map_err(status_error)?
                .into_inner();
            let added = rotated.added.unwrap_or_default();
            let master = (!rotated.new_master_key.is_empty()).then_some(&rotated.new_master_key);
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "removed": rotated.removed,
                        "added": key_json(&added),
                        "new_master_key": master,
                    })
                );
            } else {
                println!(
                    "replaced key {} by key {}: refer to the new passphrase from now on",
                    rotated.removed, added.id
                );
                if let Some(master) = master {
                    println!(
                        "new backups are encrypted with the new master key {master}; they do not deduplicate against older backups, which stay readable"
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
