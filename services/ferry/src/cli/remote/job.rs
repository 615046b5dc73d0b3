//! `ferry job start|get|list|watch|cancel`: a gRPC client of `ferry serve`, with a
//! progress bar while watching; the backup jobs' commands are in [`super::backup`].

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use ferry_core::size::{format_size, parse_size};
use ferry_endpoints::Preallocation;
use ferry_engine::{CommitOrder, HashAlgorithm};
use indicatif::{ProgressBar, ProgressStyle};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use ferry_api::auth::BearerToken;
use ferry_api::names::{job_kind_name, job_state_name, target_state_name};
use ferry_api::proto::{self, job_service_client::JobServiceClient};

use super::connection::{channel, parse_label, status_error, ServerArgs};
use super::json::job_json;
use crate::cli::image::FormatArgs;
use crate::cli::options::{self, Cache, Order};

/// Start, watch and cancel jobs on a running `ferry serve`.
#[derive(Debug, Clone, Args)]
pub struct JobArgs {
    #[command(flatten)]
    pub conn: ServerArgs,
    /// Print jobs as JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: JobCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum JobCommand {
    /// Start a transfer from SRC to DST, or to several targets in one pass (DST DST2 ...),
    /// or with --checksum a checksum of SRC.
    Start(StartArgs),
    /// Show a job.
    Get { id: String },
    /// List jobs.
    List(ListArgs),
    /// Follow a job until it ends; exit status 0 only if it succeeded.
    Watch {
        id: String,
        /// No progress bar: print each state change as a line.
        #[arg(long)]
        no_progress: bool,
    },
    /// Cancel a job.
    Cancel { id: String },
    /// Start a backup of SRC into the repository REPO.
    Backup(super::backup::BackupJobArgs),
    /// Start a restore of backup ID of REPO into DST.
    Restore(super::backup::RestoreJobArgs),
    /// Start a verify of a repository's chunks.
    RepoVerify(super::backup::VerifyJobArgs),
    /// Start a prune of a repository's backups by a retention policy.
    Prune(super::backup::PruneJobArgs),
    /// Start a garbage collection of a repository.
    Gc(super::backup::GcJobArgs),
    /// List the backups in a repository.
    Snapshots(super::backup::SnapshotsArgs),
    /// Start a sync: copy the backups SRC_REPO has and DST_REPO lacks.
    Sync(super::sync::SyncJobArgs),
    /// Protect a backup: no prune removes it until it is unprotected.
    Protect(super::sync::ProtectArgs),
    /// Remove a backup's protection.
    Unprotect(super::sync::ProtectArgs),
    /// List, add, remove or rotate the keys of an encrypted repository.
    Key(super::keys::KeyJobArgs),
}

#[derive(Debug, Clone, Args)]
pub struct StartArgs {
    /// Source path or URL.
    pub src: String,
    /// Target paths or URLs: one, or several written in one pass over SRC (not with
    /// --checksum).
    pub dst: Vec<String>,
    /// Start a checksum of SRC instead of a transfer.
    #[arg(long)]
    pub checksum: bool,
    /// Checksum algorithm (for --checksum and --verify): blkhash or sha256.
    #[arg(long, default_value = "blkhash", value_parser = options::algorithm)]
    pub algorithm: HashAlgorithm,
    /// Parallel workers.
    #[arg(long)]
    pub workers: Option<u32>,
    /// Request size (e.g. 1M).
    #[arg(long, value_parser = parse_size)]
    pub request_size: Option<u64>,
    #[arg(long, value_enum)]
    pub order: Option<Order>,
    /// Zero detection granularity; 0 keeps everything allocated.
    #[arg(long, value_parser = parse_size)]
    pub sparse_size: Option<u64>,
    /// The target reads as zeroes already.
    #[arg(long)]
    pub target_is_zero: bool,
    /// Target preallocation: off, falloc, full, grow or grow=STEP (extend by STEP, 128M by
    /// default).
    #[arg(long, value_name = "MODE", value_parser = options::preallocation)]
    pub preallocation: Option<Preallocation>,
    #[arg(long, value_enum)]
    pub cache: Option<Cache>,
    /// Bytes per second (e.g. 100M).
    #[arg(long, value_parser = parse_size)]
    pub rate_limit: Option<u64>,
    /// Checksum source and target after the copy.
    #[arg(long)]
    pub verify: bool,
    /// Idempotency key: repeating the command with the same key returns the same job.
    #[arg(long)]
    pub key: Option<String>,
    /// A label KEY=VALUE (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    #[arg(long, default_value_t = 0)]
    pub priority: i32,
    /// Fail instead of queueing when another job writes DST (any of them).
    #[arg(long)]
    pub refuse_if_busy: bool,
    /// Environment variable on the server with the iSCSI CHAP password. (Per-job S3
    /// settings and credentials go through the gRPC API's `S3Options`.)
    #[arg(long)]
    pub secret_env: Option<String>,
    /// How the server reads SRC as an image (as `ferry copy` does).
    #[command(flatten)]
    pub format: FormatArgs,
    /// A docker config.json with the registry's credentials, for a docker:// or oci://
    /// SRC: a path on the server, under its allowed roots (what FERRY_REGISTRY_AUTH_FILE
    /// is to `ferry copy`).
    #[arg(long, value_name = "PATH")]
    pub registry_auth_file: Option<String>,
    /// Extra trusted CA certificates (PEM) of a docker:// or oci:// SRC's registry: a path
    /// on the server, under its allowed roots.
    #[arg(long, value_name = "PATH")]
    pub registry_ca_file: Option<String>,
    /// Plain HTTP to a docker:// or oci:// SRC's registry (never the default).
    #[arg(long)]
    pub registry_insecure: bool,
    /// Watch the job after starting it.
    #[arg(long)]
    pub watch: bool,
    /// Resume from a checkpoint: a file with what `ferry job get --json` printed for the
    /// earlier job (its "checkpoint"), or the checkpoint alone ({"size": N, "committed":
    /// [[START, END], ...]}). DST must be the targets that job wrote.
    #[arg(long, value_name = "FILE")]
    pub resume_from: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Only jobs in this state (repeatable).
    #[arg(long = "state", value_enum)]
    pub states: Vec<StateArg>,
    /// Only jobs with label KEY=VALUE (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Jobs per page.
    #[arg(long, default_value_t = 100)]
    pub page_size: u32,
    /// Fetch every page.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StateArg {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

type Client = JobServiceClient<InterceptedService<Channel, BearerToken>>;

/// Connects to the server named in the arguments.
pub async fn connect(args: &JobArgs) -> anyhow::Result<Client> {
    let (channel, token) = channel(&args.conn).await?;
    Ok(JobServiceClient::with_interceptor(channel, token))
}

fn endpoint(url: &str, secret_env: Option<&String>) -> proto::Endpoint {
    let options = secret_env.and_then(|name| {
        let r = Some(proto::SecretRef {
            source: Some(proto::secret_ref::Source::Env(name.clone())),
        });
        if url.starts_with("iscsi://") {
            Some(proto::endpoint::Options::Iscsi(proto::IscsiOptions {
                user: String::new(),
                password: r,
            }))
        } else {
            None
        }
    });
    proto::Endpoint {
        url: url.to_string(),
        options,
        ..Default::default()
    }
}

/// The source endpoint of `ferry job start`: SRC read as `--source-format` and friends say,
/// an OVA's `--disk`, and a registry image's `--platform` and `--registry-*` settings.
fn source_endpoint(s: &StartArgs) -> anyhow::Result<proto::Endpoint> {
    let mut ep = endpoint(&s.src, s.secret_env.as_ref());
    ep.format = proto::ImageFormat::from(s.format.source_format) as i32;
    ep.allow_backing = s.format.allow_backing;
    ep.image_size = s.format.source_size;
    ep.prescan = s.format.prescan;
    ep.disk = s
        .format
        .disk
        .map(u32::try_from)
        .transpose()
        .context("--disk is too large")?;
    if let Some(registry) = registry_options(s)? {
        ep.options = Some(proto::endpoint::Options::Registry(registry));
    }
    Ok(ep)
}

/// The registry settings of a docker:// or oci:// SRC (None when none is given); refused
/// on any other SRC.
fn registry_options(s: &StartArgs) -> anyhow::Result<Option<proto::RegistryOptions>> {
    let given = |v: &Option<String>| v.clone().unwrap_or_default();
    let options = proto::RegistryOptions {
        auth_file: given(&s.registry_auth_file),
        ca_file: given(&s.registry_ca_file),
        insecure: s.registry_insecure,
        platform: given(&s.format.platform),
    };
    if options == proto::RegistryOptions::default() {
        return Ok(None);
    }
    let registry = matches!(
        ferry_core::EndpointSpec::parse(&s.src),
        Ok(ferry_core::EndpointSpec::Registry(_))
    );
    if !registry {
        bail!(
            "--platform, --registry-auth-file, --registry-ca-file and --registry-insecure \
             apply to docker:// and oci:// sources only"
        );
    }
    Ok(Some(options))
}

/// Runs `ferry job ...`.
pub async fn run(args: JobArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect(&args).await?;
    let job = match &args.command {
        JobCommand::Start(s) => {
            let job = start(&mut client, s).await?;
            if s.watch {
                return watch(&mut client, &job.id, args.json, false).await;
            }
            job
        }
        JobCommand::Get { id } => client
            .get_job(proto::GetJobRequest { id: id.clone() })
            .await
            .map_err(status_error)?
            .into_inner(),
        JobCommand::List(l) => {
            list(&mut client, l, args.json).await?;
            return Ok(ExitCode::SUCCESS);
        }
        JobCommand::Watch { id, no_progress } => {
            return watch(&mut client, id, args.json, *no_progress).await;
        }
        JobCommand::Cancel { id } => client
            .cancel_job(proto::CancelJobRequest { id: id.clone() })
            .await
            .map_err(status_error)?
            .into_inner(),
        JobCommand::Snapshots(a) => {
            super::backup::snapshots(&args.conn, a, args.json).await?;
            return Ok(ExitCode::SUCCESS);
        }
        JobCommand::Backup(a) => {
            let job = super::backup::start_backup(&mut client, a).await?;
            return started(&mut client, job, a.meta.watch, args.json).await;
        }
        JobCommand::Restore(a) => {
            let job = super::backup::start_restore(&mut client, a).await?;
            return started(&mut client, job, a.meta.watch, args.json).await;
        }
        JobCommand::RepoVerify(a) => {
            let job = super::backup::start_verify(&mut client, a).await?;
            return started(&mut client, job, a.meta.watch, args.json).await;
        }
        JobCommand::Prune(a) => {
            let job = super::backup::start_prune(&mut client, a).await?;
            return started(&mut client, job, a.meta.watch, args.json).await;
        }
        JobCommand::Gc(a) => {
            let job = super::backup::start_gc(&mut client, a).await?;
            return started(&mut client, job, a.meta.watch, args.json).await;
        }
        JobCommand::Sync(a) => {
            let job = client
                .start_sync(a.to_proto())
                .await
                .map_err(status_error)?
                .into_inner();
            return started(&mut client, job, a.meta.watch, args.json).await;
        }
        JobCommand::Protect(a) | JobCommand::Unprotect(a) => {
            let on = matches!(&args.command, JobCommand::Protect(_));
            super::sync::protect(&args.conn, a, on, args.json).await?;
            return Ok(ExitCode::SUCCESS);
        }
        JobCommand::Key(a) => return super::keys::run(&args.conn, a, args.json).await,
    };
    print_job(&job, args.json);
    Ok(ExitCode::SUCCESS)
}

/// Prints a job just started, or watches it to its end.
async fn started(
    client: &mut Client,
    job: proto::Job,
    watch_it: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if watch_it {
        return watch(client, &job.id, json, false).await;
    }
    print_job(&job, json);
    Ok(ExitCode::SUCCESS)
}

/// `ferry job start`: a checksum of SRC, or a transfer from SRC to DST.
async fn start(client: &mut Client, s: &StartArgs) -> anyhow::Result<proto::Job> {
    let job = if s.checksum {
        if !s.dst.is_empty() {
            bail!("--checksum takes only SRC");
        }
        client.start_checksum(checksum_request(s)?).await
    } else {
        let Some((dst, more)) = s.dst.split_first() else {
            bail!("a transfer needs SRC and DST (or use --checksum)");
        };
        let mut request = transfer_request(s, dst, more)?;
        if let Some(file) = &s.resume_from {
            request.resume_from = Some(read_checkpoint(file)?);
        }
        client.start_transfer(request).await
    };
    Ok(job.map_err(status_error)?.into_inner())
}

pub(crate) fn checksum_request(s: &StartArgs) -> anyhow::Result<proto::StartChecksumRequest> {
    Ok(proto::StartChecksumRequest {
        source: Some(source_endpoint(s)?),
        options: Some(proto::ChecksumOptions {
            algorithm: proto::HashAlgorithm::from(s.algorithm) as i32,
            workers: s.workers.unwrap_or(0),
            request_size: s.request_size.unwrap_or(0),
            threads: 0,
            cache: cache(s.cache),
        }),
        idempotency_key: s.key.clone().unwrap_or_default(),
        labels: s.labels.iter().cloned().collect(),
        priority: s.priority,
    })
}

pub(crate) fn transfer_request(
    s: &StartArgs,
    dst: &str,
    more: &[String],
) -> anyhow::Result<proto::StartTransferRequest> {
    let order = s.order.map_or(CommitOrder::Auto, CommitOrder::from);
    let (preallocation, preallocation_step) =
        ferry_api::options::preallocation_to_proto(s.preallocation.unwrap_or_default());
    Ok(proto::StartTransferRequest {
        source: Some(source_endpoint(s)?),
        target: Some(endpoint(dst, s.secret_env.as_ref())),
        options: Some(proto::TransferOptions {
            workers: s.workers.unwrap_or(0),
            request_size: s.request_size.unwrap_or(0),
            order: proto::CommitOrder::from(order) as i32,
            sparse_size: s.sparse_size,
            target_is_zero: s.target_is_zero,
            preallocation: preallocation as i32,
            preallocation_step,
            cache: cache(s.cache),
            rate_limit: s.rate_limit.unwrap_or(0),
            verify: s.verify,
            verify_algorithm: proto::HashAlgorithm::from(s.algorithm) as i32,
        }),
        idempotency_key: s.key.clone().unwrap_or_default(),
        labels: s.labels.iter().cloned().collect(),
        priority: s.priority,
        refuse_if_target_busy: s.refuse_if_busy,
        resume_from: None,
        more_targets: more
            .iter()
            .map(|d| endpoint(d, s.secret_env.as_ref()))
            .collect(),
    })
}

/// The checkpoint in a file written from `ferry job get --json` (or a bare checkpoint in
/// the same shape); the server checks the ranges.
fn read_checkpoint(file: &std::path::Path) -> anyhow::Result<proto::Checkpoint> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    let c = match value.get("checkpoint") {
        Some(serde_json::Value::Null) => bail!("the job in {} has no checkpoint", file.display()),
        Some(c) => c,
        None => &value,
    };
    let shape = || {
        format!(
            "{}: expected {{\"size\": N, \"committed\": [[START, END], ...]}}",
            file.display()
        )
    };
    let size = c.get("size").and_then(|v| v.as_u64()).with_context(shape)?;
    let ranges = c
        .get("committed")
        .and_then(|v| v.as_array())
        .with_context(shape)?;
    let committed = ranges
        .iter()
        .map(|r| match r.as_array().map(|a| a.as_slice()) {
            Some([start, end]) => Some(proto::Range {
                start: start.as_u64()?,
                end: end.as_u64()?,
            }),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .with_context(shape)?;
    Ok(proto::Checkpoint { size, committed })
}

/// `ferry job list`: one page, or with --all every page, as a table or JSON.
async fn list(client: &mut Client, l: &ListArgs, json: bool) -> anyhow::Result<()> {
    let mut token = String::new();
    let mut all = Vec::new();
    loop {
        let page = client
            .list_jobs(proto::ListJobsRequest {
                states: l
                    .states
                    .iter()
                    .map(|s| proto::JobState::from(*s) as i32)
                    .collect(),
                labels: l.labels.iter().cloned().collect(),
                kind: 0,
                page_size: l.page_size,
                page_token: token.clone(),
            })
            .await
            .map_err(status_error)?
            .into_inner();
        all.extend(page.jobs);
        token = page.next_page_token;
        if token.is_empty() || !l.all {
            break;
        }
    }
    if json {
        let list: Vec<_> = all.iter().map(job_json).collect();
        println!("{}", serde_json::Value::Array(list));
        return Ok(());
    }
    println!(
        "{:<36}  {:<9}  {:<10}  {:>7}  MESSAGE",
        "ID", "KIND", "STATE", "DONE"
    );
    for j in &all {
        println!(
            "{:<36}  {:<9}  {:<10}  {:>6.1}%  {}",
            j.id,
            job_kind_name(j.kind),
            job_state_name(j.state),
            percent(j),
            j.message
        );
    }
    if !token.is_empty() {
        println!("(more: --all)");
    }
    Ok(())
}

fn cache(c: Option<Cache>) -> i32 {
    proto::CacheMode::from(c.unwrap_or_default()) as i32
}

impl From<StateArg> for proto::JobState {
    fn from(s: StateArg) -> Self {
        match s {
            StateArg::Queued => Self::Queued,
            StateArg::Running => Self::Running,
            StateArg::Succeeded => Self::Succeeded,
            StateArg::Failed => Self::Failed,
            StateArg::Cancelled => Self::Cancelled,
        }
    }
}

async fn watch(
    client: &mut Client,
    id: &str,
    json: bool,
    no_progress: bool,
) -> anyhow::Result<ExitCode> {
    let mut stream = client
        .watch_job(proto::WatchJobRequest { id: id.to_string() })
        .await
        .map_err(status_error)?
        .into_inner();
    let bar = if json || no_progress || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} {msg:12} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar
    };
    let mut last: Option<proto::Job> = None;
    let mut last_state = -1;
    while let Some(event) = stream.message().await.map_err(status_error)? {
        let Some(job) = event.job else { continue };
        if let Some(p) = &job.progress {
            bar.set_length(p.total_bytes);
            bar.set_position(p.done_bytes);
        }
        bar.set_message(job_state_name(job.state).to_string());
        if (no_progress || json) && job.state != last_state {
            if json {
                println!("{}", job_json(&job));
            } else {
                println!("{} {} {}", job.id, job_state_name(job.state), job.message);
            }
        }
        last_state = job.state;
        last = Some(job);
    }
    bar.finish_and_clear();
    let Some(job) = last else {
        bail!("the server ended the watch without any state");
    };
    if !json {
        print_job(&job, false);
    }
    Ok(if job.state == proto::JobState::Succeeded as i32 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn percent(j: &proto::Job) -> f64 {
    match &j.progress {
        Some(p) if p.total_bytes > 0 => p.done_bytes as f64 * 100.0 / p.total_bytes as f64,
        _ => 0.0,
    }
}

fn print_job(j: &proto::Job, json: bool) {
    if json {
        println!("{}", job_json(j));
        return;
    }
    println!("id:       {}", j.id);
    println!("kind:     {}", job_kind_name(j.kind));
    println!("state:    {}", job_state_name(j.state));
    if !j.message.is_empty() {
        println!("message:  {}", j.message);
    }
    if let Some(p) = &j.progress {
        println!(
            "progress: {} of {} ({:.1}%), resumed {}",
            format_size(p.done_bytes),
            format_size(p.total_bytes),
            percent(j),
            format_size(p.resumed_bytes)
        );
    }
    match &j.result {
        Some(proto::job::Result::TransferResult(r)) => {
            println!(
                "result:   {} copied ({} data, {} zero) in {:.2}s, {}/s",
                format_size(r.size),
                format_size(r.data_bytes),
                format_size(r.zero_bytes),
                r.seconds,
                format_size(r.throughput_bytes_per_second as u64)
            );
            if let Some(d) = &r.target_digest {
                println!("verified: {}", d.hex);
            }
        }
        Some(proto::job::Result::ChecksumResult(r)) => {
            if let Some(d) = &r.digest {
                println!("digest:   {}", d.hex);
            }
        }
        Some(r) => {
            if let Some(text) = super::backup::result_text(r) {
                println!("{text}");
            }
        }
        None => {}
    }
    if j.targets.len() > 1 {
        for t in &j.targets {
            match &t.error {
                Some(e) => println!(
                    "target:   {} {}: {}: {}",
                    t.target,
                    target_state_name(t.state),
                    e.kind,
                    e.message
                ),
                None => println!("target:   {} {}", t.target, target_state_name(t.state)),
            }
        }
    }
    if let Some(e) = &j.error {
        println!("error:    {}: {}", e.kind, e.message);
    }
}
