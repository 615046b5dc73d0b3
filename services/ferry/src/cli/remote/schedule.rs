//! `ferry schedule create|list|get|pause|resume|run|delete`: a gRPC client of the
//! schedules of `ferry serve`, next to `ferry job`.

use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, Subcommand, ValueEnum};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use ferry_api::auth::BearerToken;
use ferry_api::names::{job_kind_name, missed_run_policy_name, schedule_run_result_name};
use ferry_api::proto::{self, schedule_service_client::ScheduleServiceClient};

use super::connection::{channel, parse_label, secret_ref as secret, status_error, ServerArgs};
use super::job::{checksum_request, transfer_request, StartArgs};
use super::json::{job_json, schedule_json};
use crate::cli::retention::RetentionArgs;

/// Create, inspect, pause, resume, run and delete schedules on a running `ferry serve`.
#[derive(Debug, Clone, Args)]
pub struct ScheduleArgs {
    #[command(flatten)]
    pub conn: ServerArgs,
    /// Print schedules as JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: ScheduleCommand,
}

// Parsed once per command line: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule that starts a transfer from SRC to DST (or, with --checksum, a
    /// checksum of SRC; with --backup, a backup of SRC into the repository DST) at every
    /// fire time of --cron.
    Create(CreateArgs),
    /// List schedules.
    List {
        /// Only schedules with label KEY=VALUE (repeatable).
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
    },
    /// Show a schedule (by id or name).
    Get { id: String },
    /// Pause a schedule: no runs until it is resumed.
    Pause { id: String },
    /// Resume a paused schedule.
    Resume { id: String },
    /// Start a run now (refused while the previous run is still going).
    Run { id: String },
    /// Delete a schedule (a run it started goes on as a job).
    Delete { id: String },
}

#[derive(Debug, Clone, Args)]
pub struct CreateArgs {
    /// Unique name (letters, digits, '-', '_', '.').
    pub name: String,
    /// Cron expression: five fields (minute hour day-of-month month day-of-week) or
    /// @hourly, @daily, @weekly, @monthly, @yearly.
    #[arg(long)]
    pub cron: String,
    /// IANA time zone the expression is read in (e.g. Europe/Oslo) [default: UTC].
    #[arg(long)]
    pub time_zone: Option<String>,
    /// What to do about fire times missed while the server was down.
    #[arg(long, value_enum, default_value = "run-once")]
    pub missed: Missed,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
    /// The job of each run: `ferry job start`'s arguments (not --key, --watch or
    /// --resume-from). Its labels are the schedule's labels too.
    #[command(flatten)]
    pub job: StartArgs,
    /// Each run backs SRC up into the repository DST (a directory or s3://bucket/prefix)
    /// instead of copying; with --keep-... rules it then prunes the source's backups.
    #[arg(long, conflicts_with = "checksum")]
    pub backup: bool,
    /// Backups (and syncs: of SRC): environment variable on the server with the
    /// repository's passphrase.
    #[arg(long, value_name = "NAME", conflicts_with = "repo_key_file")]
    pub repo_key_env: Option<String>,
    /// Backups (and syncs: of SRC): file under the server's --secrets-dir with the
    /// repository's passphrase.
    #[arg(long, value_name = "NAME")]
    pub repo_key_file: Option<String>,
    /// Backups: the source's identity, which groups its backups [default: SRC]; syncs:
    /// only the backups of this source identity.
    #[arg(long, value_name = "ID")]
    pub source_id: Option<String>,
    /// Backups: the retention applied after each successful run; syncs: only the backups
    /// these rules keep.
    #[command(flatten)]
    pub retention: RetentionArgs,
    /// Each run syncs the repository SRC into the repository DST (`ferry job sync`);
    /// --rate-limit caps the bytes sent per second.
    #[arg(long, conflicts_with_all = ["checksum", "backup"])]
    pub sync: bool,
    #[command(flatten)]
    pub sync_args: ScheduleSyncArgs,
}

/// The flags of a sync schedule (`--sync`).
#[derive(Debug, Clone, Args)]
pub struct ScheduleSyncArgs {
    /// Syncs: environment variable on the server with DST's passphrase [default: SRC's].
    #[arg(
        long,
        value_name = "NAME",
        requires = "sync",
        conflicts_with = "dest_key_file"
    )]
    pub dest_key_env: Option<String>,
    /// Syncs: file under the server's --secrets-dir with DST's passphrase.
    #[arg(long, value_name = "NAME", requires = "sync")]
    pub dest_key_file: Option<String>,
    /// Syncs: remove DST's backups that SRC no longer has (protected ones stay).
    #[arg(long, requires = "sync")]
    pub remove_vanished: bool,
    /// Syncs: create DST when it holds no repository, sharing SRC's keys.
    #[arg(long, requires = "sync")]
    pub init_destination: bool,
    /// Syncs: apply --rate-limit only in this window, `[DAYS ]HH:MM-HH:MM` (repeatable).
    #[arg(long = "limit-window", value_name = "WINDOW", requires = "sync",
          value_parser = super::sync::window)]
    pub limit_windows: Vec<proto::RateLimitWindow>,
    /// Syncs: the IANA time zone of the windows [default: UTC].
    #[arg(long, value_name = "ZONE", requires = "limit_windows")]
    pub limit_time_zone: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Missed {
    /// One run at start when fire times were missed.
    RunOnce,
    /// No run for missed fire times.
    Skip,
}

type Client = ScheduleServiceClient<InterceptedService<Channel, BearerToken>>;

/// Runs `ferry schedule ...`.
pub async fn run(args: ScheduleArgs) -> anyhow::Result<ExitCode> {
    let (channel, token) = channel(&args.conn).await?;
    let mut client = ScheduleServiceClient::with_interceptor(channel, token);
    let schedule = match &args.command {
        ScheduleCommand::Create(c) => client
            .create_schedule(create_request(c)?)
            .await
            .map_err(status_error)?
            .into_inner(),
        ScheduleCommand::List { labels } => {
            list(&mut client, labels, args.json).await?;
            return Ok(ExitCode::SUCCESS);
        }
        ScheduleCommand::Get { id } => client
            .get_schedule(proto::GetScheduleRequest { id: id.clone() })
            .await
            .map_err(status_error)?
            .into_inner(),
        ScheduleCommand::Pause { id } => client
            .pause_schedule(proto::PauseScheduleRequest { id: id.clone() })
            .await
            .map_err(status_error)?
            .into_inner(),
        ScheduleCommand::Resume { id } => client
            .resume_schedule(proto::ResumeScheduleRequest { id: id.clone() })
            .await
            .map_err(status_error)?
            .into_inner(),
        ScheduleCommand::Run { id } => {
            let r = client
                .run_schedule_now(proto::RunScheduleNowRequest { id: id.clone() })
                .await
                .map_err(status_error)?
                .into_inner();
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "schedule": r.schedule.as_ref().map(schedule_json),
                        "job": r.job.as_ref().map(job_json),
                    })
                );
            } else if let Some(job) = &r.job {
                println!("started job {} ({})", job.id, job_kind_name(job.kind));
            }
            return Ok(ExitCode::SUCCESS);
        }
        ScheduleCommand::Delete { id } => client
            .delete_schedule(proto::DeleteScheduleRequest { id: id.clone() })
            .await
            .map_err(status_error)?
            .into_inner()
            .schedule
            .unwrap_or_default(),
    };
    print_schedule(&schedule, args.json);
    Ok(ExitCode::SUCCESS)
}

/// The template of a sync schedule: the repository SRC into the repository DST.
fn sync_request(c: &CreateArgs) -> anyhow::Result<proto::StartSyncRequest> {
    let (s, a) = (&c.job, &c.sync_args);
    let [dst] = s.dst.as_slice() else {
        bail!("--sync needs the source repository (SRC) and the destination (DST) only");
    };
    let repo = |url: &str, key| proto::Repository {
        url: url.to_string(),
        s3: None,
        key,
    };
    Ok(proto::StartSyncRequest {
        source: Some(repo(&s.src, secret(&c.repo_key_env, &c.repo_key_file))),
        destination: Some(repo(dst, secret(&a.dest_key_env, &a.dest_key_file))),
        source_id: c.source_id.clone().unwrap_or_default(),
        retention: c.retention.to_proto(),
        remove_vanished: a.remove_vanished,
        init_destination_if_missing: a.init_destination,
        rate_limit: s.rate_limit.unwrap_or(0),
        rate_limit_windows: super::sync::in_zone(&a.limit_windows, a.limit_time_zone.as_deref()),
        labels: s.labels.iter().cloned().collect(),
        priority: s.priority,
        idempotency_key: String::new(),
    })
}

/// The template of a backup schedule: SRC into the repository DST.
fn backup_request(c: &CreateArgs) -> anyhow::Result<proto::StartBackupRequest> {
    let s = &c.job;
    let [repo] = s.dst.as_slice() else {
        bail!("--backup needs SRC and the repository (REPO) only");
    };
    let mut source = proto::Endpoint {
        url: s.src.clone(),
        ..Default::default()
    };
    source.format = proto::ImageFormat::from(s.format.source_format) as i32;
    source.allow_backing = s.format.allow_backing;
    source.image_size = s.format.source_size;
    source.prescan = s.format.prescan;
    Ok(proto::StartBackupRequest {
        source: Some(source),
        repository: Some(proto::Repository {
            url: repo.clone(),
            s3: None,
            key: secret(&c.repo_key_env, &c.repo_key_file),
        }),
        source_id: c.source_id.clone().unwrap_or_default(),
        workers: s.workers.unwrap_or(0),
        retention: c.retention.to_proto(),
        labels: s.labels.iter().cloned().collect(),
        priority: s.priority,
        ..Default::default()
    })
}

fn create_request(c: &CreateArgs) -> anyhow::Result<proto::CreateScheduleRequest> {
    let s = &c.job;
    if s.key.is_some() || s.watch || s.resume_from.is_some() {
        bail!("--key, --watch and --resume-from are not for schedules: each run gets its own key");
    }
    let request = if c.backup {
        proto::job_template::Request::Backup(backup_request(c)?)
    } else if c.sync {
        proto::job_template::Request::Sync(sync_request(c)?)
    } else if c.retention.to_proto().is_some() {
        bail!("--keep-... rules apply to backup and sync schedules (--backup, --sync)");
    } else if c.repo_key_env.is_some() || c.repo_key_file.is_some() || c.source_id.is_some() {
        bail!("--repo-key-env, --repo-key-file and --source-id apply to backup and sync schedules");
    } else if s.checksum {
        if !s.dst.is_empty() {
            bail!("--checksum takes only SRC");
        }
        proto::job_template::Request::Checksum(checksum_request(s)?)
    } else {
        let Some((dst, more)) = s.dst.split_first() else {
            bail!("a transfer needs SRC and DST (or use --checksum)");
        };
        proto::job_template::Request::Transfer(transfer_request(s, dst, more)?)
    };
    Ok(proto::CreateScheduleRequest {
        name: c.name.clone(),
        cron: c.cron.clone(),
        time_zone: c.time_zone.clone().unwrap_or_default(),
        paused: c.paused,
        missed_run_policy: match c.missed {
            Missed::RunOnce => proto::MissedRunPolicy::RunOnce,
            Missed::Skip => proto::MissedRunPolicy::Skip,
        } as i32,
        template: Some(proto::JobTemplate {
            request: Some(request),
        }),
        labels: s.labels.iter().cloned().collect(),
    })
}

async fn list(client: &mut Client, labels: &[(String, String)], json: bool) -> anyhow::Result<()> {
    let mut token = String::new();
    let mut all = Vec::new();
    loop {
        let page = client
            .list_schedules(proto::ListSchedulesRequest {
                labels: labels.iter().cloned().collect(),
                page_size: 0,
                page_token: token.clone(),
            })
            .await
            .map_err(status_error)?
            .into_inner();
        all.extend(page.schedules);
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    if json {
        let list: Vec<_> = all.iter().map(schedule_json).collect();
        println!("{}", serde_json::Value::Array(list));
        return Ok(());
    }
    println!(
        "{:<24}  {:<16}  {:<16}  {:<7}  {:<20}  LAST RUN",
        "NAME", "CRON", "TIME ZONE", "STATE", "NEXT RUN"
    );
    for s in &all {
        let status = s.status.clone().unwrap_or_default();
        println!(
            "{:<24}  {:<16}  {:<16}  {:<7}  {:<20}  {}",
            s.name,
            s.cron,
            zone(s),
            if s.paused { "paused" } else { "active" },
            time(&status.next_run_time),
            status
                .last_run
                .as_ref()
                .map_or("-", |r| schedule_run_result_name(r.result)),
        );
    }
    Ok(())
}

pub(super) fn zone(s: &proto::Schedule) -> &str {
    if s.time_zone.is_empty() {
        "UTC"
    } else {
        &s.time_zone
    }
}

/// RFC 3339 in UTC, or "-".
pub(super) fn time(t: &Option<prost_types::Timestamp>) -> String {
    t.as_ref()
        .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32))
        .map_or_else(
            || "-".to_string(),
            |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        )
}

fn print_schedule(s: &proto::Schedule, json: bool) {
    if json {
        println!("{}", schedule_json(s));
        return;
    }
    let status = s.status.clone().unwrap_or_default();
    let (source, target) = endpoints(s);
    println!("id:        {}", s.id);
    println!("name:      {}", s.name);
    println!("cron:      {} ({})", s.cron, zone(s));
    println!("state:     {}", if s.paused { "paused" } else { "active" });
    println!("missed:    {}", missed_run_policy_name(s.missed_run_policy));
    match target {
        Some(t) => println!("job:       {} {source} -> {t}", template_kind(s)),
        None => println!("job:       {} {source}", template_kind(s)),
    }
    println!("next run:  {}", time(&status.next_run_time));
    if let Some(r) = &status.last_run {
        let job = if r.job_id.is_empty() { "-" } else { &r.job_id };
        println!(
            "last run:  {} at {} (job {job}){}",
            schedule_run_result_name(r.result),
            time(&r.fire_time),
            if r.message.is_empty() {
                String::new()
            } else {
                format!(": {}", r.message)
            }
        );
    }
    println!("succeeded: {}", time(&status.last_success_time));
    println!(
        "runs:      {} started, {} skipped, {} missed, {} failures in a row",
        status.runs_started, status.runs_skipped, status.runs_missed, status.consecutive_failures
    );
}

pub(super) fn template_kind(s: &proto::Schedule) -> &'static str {
    match s.template.as_ref().and_then(|t| t.request.as_ref()) {
        Some(proto::job_template::Request::Transfer(_)) => "transfer",
        Some(proto::job_template::Request::Checksum(_)) => "checksum",
        Some(proto::job_template::Request::Backup(_)) => "backup",
        Some(proto::job_template::Request::RepositoryVerify(_)) => "repository_verify",
        Some(proto::job_template::Request::Prune(_)) => "prune",
        Some(proto::job_template::Request::Gc(_)) => "gc",
        Some(proto::job_template::Request::Sync(_)) => "sync",
        None => "unknown",
    }
}

fn repo_url(r: &Option<proto::Repository>) -> Option<String> {
    Some(r.as_ref().map(|r| r.url.clone()).unwrap_or_default())
}

pub(super) fn endpoints(s: &proto::Schedule) -> (String, Option<String>) {
    let url = |e: &Option<proto::Endpoint>| e.as_ref().map(|e| e.url.clone()).unwrap_or_default();
    match s.template.as_ref().and_then(|t| t.request.as_ref()) {
        Some(proto::job_template::Request::Transfer(r)) => (url(&r.source), Some(url(&r.target))),
        Some(proto::job_template::Request::Checksum(r)) => (url(&r.source), None),
        Some(proto::job_template::Request::Backup(r)) => (url(&r.source), repo_url(&r.repository)),
        Some(proto::job_template::Request::RepositoryVerify(r)) => {
            (String::new(), repo_url(&r.repository))
        }
        Some(proto::job_template::Request::Prune(r)) => (String::new(), repo_url(&r.repository)),
        Some(proto::job_template::Request::Gc(r)) => (String::new(), repo_url(&r.repository)),
        Some(proto::job_template::Request::Sync(r)) => (
            repo_url(&r.source).unwrap_or_default(),
            repo_url(&r.destination),
        ),
        None => (String::new(), None),
    }
}
