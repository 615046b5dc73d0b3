//! `ferry job start|get|list|watch|cancel`: a gRPC client of `ferry serve`, with a
//! progress bar while watching; the backup jobs' commands are in [`super::backup_client`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use ferry_core::size::{format_size, parse_size};
use ferry_core::Secret;
use ferry_endpoints::Preallocation;
use ferry_engine::{CommitOrder, HashAlgorithm};
use indicatif::{ProgressBar, ProgressStyle};
use tonic::codegen::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use super::convert::output::state as state_proto;
use super::convert::{kind_from_proto, state_from_proto};
use super::jobs::model::JobState;
use super::proto::{self, job_service_client::JobServiceClient};
use super::security::BearerToken;
use crate::cli::image::FormatArgs;
use crate::options::{self, Cache, Order};

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

/// How to reach a running `ferry serve` (shared by `ferry job` and `ferry schedule`).
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The server: http://HOST:PORT, or https://HOST:PORT for TLS.
    #[arg(
        long,
        env = "FERRY_SERVER",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    pub server: String,
    /// File with the bearer token (the FERRY_TOKEN variable works too).
    #[arg(long, env = "FERRY_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// PEM CA bundle to verify the server with (https).
    #[arg(long, env = "FERRY_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS.
    #[arg(
        long,
        env = "FERRY_TLS_CLIENT_CERT",
        global = true,
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM key of --tls-cert.
    #[arg(
        long,
        env = "FERRY_TLS_CLIENT_KEY",
        global = true,
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// Server name to verify the certificate against (default: the host of --server).
    #[arg(long, global = true)]
    pub tls_domain: Option<String>,
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
    Backup(super::backup_client::BackupJobArgs),
    /// Start a restore of backup ID of REPO into DST.
    Restore(super::backup_client::RestoreJobArgs),
    /// Start a verify of a repository's chunks.
    RepoVerify(super::backup_client::VerifyJobArgs),
    /// Start a prune of a repository's backups by a retention policy.
    Prune(super::backup_client::PruneJobArgs),
    /// Start a garbage collection of a repository.
    Gc(super::backup_client::GcJobArgs),
    /// List the backups in a repository.
    Snapshots(super::backup_client::SnapshotsArgs),
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

pub(crate) fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("label '{s}' is not KEY=VALUE"))
}

type Client = JobServiceClient<InterceptedService<Channel, BearerToken>>;

/// Connects to the server named in the arguments.
pub async fn connect(args: &JobArgs) -> anyhow::Result<Client> {
    let (channel, token) = channel(&args.conn).await?;
    Ok(JobServiceClient::with_interceptor(channel, token))
}

/// A channel to the server named in the arguments, and the bearer token to send on it.
pub async fn channel(args: &ServerArgs) -> anyhow::Result<(Channel, BearerToken)> {
    let mut endpoint = Channel::from_shared(args.server.clone())
        .with_context(|| format!("--server '{}' is not a URL", args.server))?
        .connect_timeout(Duration::from_secs(10));
    if args.server.starts_with("https://") || args.tls_ca.is_some() {
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &args.tls_ca {
            let pem = std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
            let cert =
                std::fs::read(cert).with_context(|| format!("cannot read {}", cert.display()))?;
            let key =
                std::fs::read(key).with_context(|| format!("cannot read {}", key.display()))?;
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &args.tls_domain {
            tls = tls.domain_name(domain.clone());
        }
        endpoint = endpoint.tls_config(tls).context("TLS configuration")?;
    }
    let token = match &args.token_file {
        Some(p) => Some(Secret::new(
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read the token file {}", p.display()))?
                .trim(),
        )),
        None => std::env::var("FERRY_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
            .map(Secret::new),
    };
    let channel = endpoint
        .connect()
        .await
        .with_context(|| format!("cannot connect to {}", args.server))?;
    Ok((channel, BearerToken::new(token.as_ref())?))
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

/// The source endpoint of `ferry job start`: SRC read as `--source-format` and friends say.
fn source_endpoint(s: &StartArgs) -> proto::Endpoint {
    let mut ep = endpoint(&s.src, s.secret_env.as_ref());
    ep.format = proto::ImageFormat::from(s.format.source_format) as i32;
    ep.allow_backing = s.format.allow_backing;
    ep.image_size = s.format.source_size;
    ep.prescan = s.format.prescan;
    ep
}

pub(crate) fn status_error(e: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{} ({:?})", e.message(), e.code())
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
            super::backup_client::snapshots(&args.conn, a, args.json).await?;
            return Ok(ExitCode::SUCCESS);
        }
        JobCommand::Backup(a) => {
            let job = super::backup_client::start_backup(&mut client, a).await?;
            return started(&mut client, job, a.meta.watch, args.json).await;
        }
        JobCommand::Restore(a) => {
            let job = super::backup_client::start_restore(&mut client, a).await?;
            return started(&mut client, job, a.meta.watch, args.json).await;
        }
        JobCommand::RepoVerify(a) => {
            let job = super::backup_client::start_verify(&mut client, a).await?;
            return started(&mut client, job, a.meta.watch, args.json).await;
        }
        JobCommand::Prune(a) => {
            let job = super::backup_client::start_prune(&mut client, a).await?;
            return started(&mut client, job, a.meta.watch, args.json).await;
        }
        JobCommand::Gc(a) => {
            let job = super::backup_client::start_gc(&mut client, a).await?;
            return started(&mut client, job, a.meta.watch, args.json).await;
        }
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
        client.start_checksum(checksum_request(s)).await
    } else {
        let Some((dst, more)) = s.dst.split_first() else {
            bail!("a transfer needs SRC and DST (or use --checksum)");
        };
        let mut request = transfer_request(s, dst, more);
        if let Some(file) = &s.resume_from {
            request.resume_from = Some(read_checkpoint(file)?);
        }
        client.start_transfer(request).await
    };
    Ok(job.map_err(status_error)?.into_inner())
}

pub(crate) fn checksum_request(s: &StartArgs) -> proto::StartChecksumRequest {
    proto::StartChecksumRequest {
        source: Some(source_endpoint(s)),
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
    }
}

pub(crate) fn transfer_request(
    s: &StartArgs,
    dst: &str,
    more: &[String],
) -> proto::StartTransferRequest {
    let order = s.order.map_or(CommitOrder::Auto, CommitOrder::from);
    let (preallocation, preallocation_step) =
        options::preallocation_to_proto(s.preallocation.unwrap_or_default());
    proto::StartTransferRequest {
        source: Some(source_endpoint(s)),
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
    }
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

fn checkpoint_json(c: &Option<proto::Checkpoint>) -> serde_json::Value {
    match c {
        Some(c) => serde_json::json!({
            "size": c.size,
            "committed": c.committed.iter().map(|r| [r.start, r.end]).collect::<Vec<_>>(),
        }),
        None => serde_json::Value::Null,
    }
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
                    .map(|s| state_proto(JobState::from(*s)) as i32)
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
            kind_name(j.kind),
            state_name(j.state),
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

impl From<StateArg> for JobState {
    fn from(s: StateArg) -> Self {
        match s {
            StateArg::Queued => JobState::Queued,
            StateArg::Running => JobState::Running,
            StateArg::Succeeded => JobState::Succeeded,
            StateArg::Failed => JobState::Failed,
            StateArg::Cancelled => JobState::Cancelled,
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
        bar.set_message(state_name(job.state).to_string());
        if (no_progress || json) && job.state != last_state {
            if json {
                println!("{}", job_json(&job));
            } else {
                println!("{} {} {}", job.id, state_name(job.state), job.message);
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

pub(crate) fn kind_name(k: i32) -> &'static str {
    match kind_from_proto(k) {
        Ok(Some(kind)) => kind.as_str(),
        _ => "unknown",
    }
}

fn state_name(s: i32) -> &'static str {
    state_from_proto(s).map_or("unknown", JobState::as_str)
}

fn digest_json(d: &Option<proto::Digest>) -> serde_json::Value {
    match d {
        Some(d) => serde_json::json!({
            "algorithm": options::hash_algorithm(d.algorithm).unwrap_or_default().as_str(),
            "hex": d.hex,
        }),
        None => serde_json::Value::Null,
    }
}

/// A job as JSON (the shape `ferry job --json` prints).
pub fn job_json(j: &proto::Job) -> serde_json::Value {
    let p = j.progress.unwrap_or_default();
    let result = match &j.result {
        Some(proto::job::Result::TransferResult(r)) => serde_json::json!({
            "size": r.size, "data_bytes": r.data_bytes, "zero_bytes": r.zero_bytes,
            "seconds": r.seconds, "throughput_bytes_per_second": r.throughput_bytes_per_second,
            "resumed_bytes": r.resumed_bytes,
            "source_digest": digest_json(&r.source_digest), "target_digest": digest_json(&r.target_digest),
        }),
        Some(proto::job::Result::ChecksumResult(r)) => serde_json::json!({
            "size": r.size, "seconds": r.seconds,
            "throughput_bytes_per_second": r.throughput_bytes_per_second,
            "digest": digest_json(&r.digest),
        }),
        Some(r) => super::backup_client::result_json(r).unwrap_or(serde_json::Value::Null),
        None => serde_json::Value::Null,
    };
    serde_json::json!({
        "id": j.id,
        "kind": kind_name(j.kind),
        "state": state_name(j.state),
        "idempotency_key": j.idempotency_key,
        "labels": j.labels,
        "priority": j.priority,
        "attempt": j.attempt,
        "progress": {
            "total_bytes": p.total_bytes, "done_bytes": p.done_bytes, "data_bytes": p.data_bytes,
            "zero_bytes": p.zero_bytes, "resumed_bytes": p.resumed_bytes,
            "committed_bytes": p.committed_bytes, "bytes_per_second": p.bytes_per_second,
        },
        "result": result,
        "error": j.error.as_ref().map(|e| serde_json::json!({"kind": e.kind, "message": e.message})),
        "message": j.message,
        "checkpoint": checkpoint_json(&j.checkpoint),
        "targets": j.targets.iter().map(target_json).collect::<Vec<_>>(),
    })
}

fn target_state_name(s: i32) -> &'static str {
    match proto::TargetState::try_from(s) {
        Ok(proto::TargetState::Running) => "running",
        Ok(proto::TargetState::Succeeded) => "succeeded",
        Ok(proto::TargetState::Failed) => "failed",
        _ => "unknown",
    }
}

fn target_json(t: &proto::TargetOutcome) -> serde_json::Value {
    serde_json::json!({
        "target": t.target,
        "state": target_state_name(t.state),
        "error": t.error.as_ref().map(|e| serde_json::json!({"kind": e.kind, "message": e.message})),
        "digest": digest_json(&t.digest),
        "done_bytes": t.done_bytes,
        "resumable": t.resumable,
    })
}

fn print_job(j: &proto::Job, json: bool) {
    if json {
        println!("{}", job_json(j));
        return;
    }
    println!("id:       {}", j.id);
    println!("kind:     {}", kind_name(j.kind));
    println!("state:    {}", state_name(j.state));
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
            if let Some(text) = super::backup_client::result_text(r) {
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
