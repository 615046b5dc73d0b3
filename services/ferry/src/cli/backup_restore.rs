//! `ferry backup restore REPO ID DST`: a backup written into any target.
//!
//! The target is opened as `ferry copy` opens one (a missing file is created with the
//! image's size and stays sparse). The restore checks the block hash of what it wrote
//! against the backup's before finishing the target; nothing is printed on stdout unless
//! it matched.
//!
//! `--while-serving ADDRESS` is a live restore: the backup is also served over NBD (as
//! `ferry backup serve` serves it) from before the restore starts until SIGTERM, so a VM
//! can boot from the export while the target fills. The export and the restore share one
//! chunk cache: a chunk the clients read is not fetched again by the restore. The URI is
//! the first line on stdout, the restore's summary the next; the export keeps serving
//! after the restore finished (the clients are not cut off) until SIGTERM or Ctrl-C.

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use ferry_backup::BackupId;
use ferry_core::size::format_size;
use ferry_core::EndpointSpec;
use ferry_endpoints::{open_target, TargetOptions};
use ferry_engine::{CancellationToken, Progress};
use ferry_image_backup::{RestoreOptions, RestoreOrder, RestoreReport};
use serde::Serialize;

use super::args::{self, ProgressArgs};
use super::backup::{backup_id, open_repository};
use super::backup_serve::{terminated, ExportServing};
use super::summary::rate;
use super::{cancel_on_ctrl_c, interrupted, progress};
use crate::cli::options::Cache;
use ferry_endpoints::export::ExportListen;

/// The order of writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Order {
    /// Out of order when the target allows it.
    #[default]
    Auto,
    /// In offset order (fetches still run ahead in parallel).
    In,
    /// As chunks arrive.
    Out,
}

/// Arguments of `ferry backup restore`.
#[derive(Debug, Clone, Args)]
pub struct RestoreArgs {
    #[arg(value_name = "REPO")]
    pub repo: String,
    #[arg(value_name = "ID", value_parser = backup_id)]
    pub id: BackupId,
    /// Image to write; a missing file is created with the image's size.
    #[arg(value_name = "DST")]
    pub target: String,
    #[arg(long, value_name = "N", value_parser = args::count,
          help = format!("Chunks opened and written at once, with twice as many fetched [default: {}]", ferry_image_backup::DEFAULT_WORKERS))]
    pub workers: Option<usize>,
    /// Write order.
    #[arg(long, value_enum, default_value_t = Order::Auto)]
    pub order: Order,
    /// writeback: through the page cache; none: direct I/O (O_DIRECT).
    #[arg(long, value_enum, default_value_t = Cache::Writeback)]
    pub cache: Cache,
    #[command(flatten)]
    pub progress: ProgressArgs,
    /// Print one JSON object summarising the restore on stdout.
    #[arg(long)]
    pub json: bool,
    /// A live restore: serve the backup over NBD at ADDRESS (HOST:PORT, unix:PATH) while
    /// the restore runs, and after it until SIGTERM; the URI is stdout's first line.
    #[arg(long, value_name = "ADDRESS", value_parser = parse_listen)]
    pub while_serving: Option<ExportListen>,
    /// The export's options (with --while-serving).
    #[command(flatten)]
    pub export: ExportServing,
}

fn parse_listen(text: &str) -> Result<ExportListen, String> {
    ExportListen::parse(text).map_err(|e| e.to_string())
}

/// Refuses export options given without --while-serving.
fn check_export_options(args: &RestoreArgs) -> anyhow::Result<()> {
    let e = &args.export;
    let given = [
        (!e.name.is_empty(), "--name"),
        (e.tls_cert.is_some(), "--tls-cert"),
        (e.tls_ca.is_some(), "--tls-ca"),
        (e.cache_size.is_some(), "--cache-size"),
        (e.read_ahead.is_some(), "--read-ahead"),
    ];
    match given.iter().find(|(set, _)| *set) {
        Some((_, option)) if args.while_serving.is_none() => {
            anyhow::bail!("{option} is an option of the export: it needs --while-serving ADDRESS")
        }
        _ => Ok(()),
    }
}

/// The `--json` summary of a restore.
#[derive(Debug, Serialize)]
pub struct RestoreSummary {
    pub id: String,
    pub target: String,
    pub size: u64,
    pub data_bytes: u64,
    pub zero_bytes: u64,
    pub block_hash: String,
    /// Whether the block hash was checked against the backup's (always, for backups made
    /// by `ferry backup create`).
    pub verified: bool,
    pub seconds: f64,
    pub throughput_bytes_per_second: f64,
}

impl RestoreSummary {
    fn new(target: String, r: &RestoreReport) -> Self {
        Self {
            id: r.id.to_string(),
            target,
            size: r.size,
            data_bytes: r.data_bytes,
            zero_bytes: r.zero_bytes,
            block_hash: r.block_hash.clone(),
            verified: r.verified,
            seconds: r.elapsed.as_secs_f64(),
            throughput_bytes_per_second: rate(r.size, r.elapsed),
        }
    }
}

/// Runs `ferry backup restore`.
pub async fn run(args: RestoreArgs) -> anyhow::Result<ExitCode> {
    check_export_options(&args)?;
    let spec = EndpointSpec::parse(&args.target).map_err(|e| super::failed(e, "invalid target"))?;
    let target_name = spec.to_string();
    let repo = open_repository(&args.repo).await?;
    let manifest = repo
        .load_manifest(&args.id)
        .await
        .map_err(|e| super::failed(e, &format!("cannot read backup {}", args.id)))?;
    let mut target_options = TargetOptions::default();
    target_options.cache = args.cache.into();
    let target = open_target(&spec, manifest.image_size, &target_options)
        .await
        .map_err(|e| super::named(e, &target_name, "cannot open the target"))?;
    let mut options = RestoreOptions::new().with_order(match args.order {
        Order::Auto => RestoreOrder::Auto,
        Order::In => RestoreOrder::InOrder,
        Order::Out => RestoreOrder::OutOfOrder,
    });
    if let Some(workers) = args.workers {
        options = options.with_workers(workers);
    }
    let cancel = CancellationToken::new();
    let live = match &args.while_serving {
        Some(listen) => {
            let serving = args.export.bind(&repo, &args.id, listen).await?;
            options = options.with_cache(serving.cache.clone());
            Some(LiveExport::start(serving, &args.id, &cancel).await?)
        }
        None => None,
    };
    let ctrl_c = match &live {
        Some(live) => live.signalled.clone(),
        None => cancel_on_ctrl_c(&cancel),
    };
    let progress = Progress::new();
    let display = progress::start(&progress, "restore", args.progress.choice());
    let result =
        ferry_image_backup::restore(&repo, &args.id, target, &options, &progress, &cancel).await;
    progress::finish(display).await;
    cancel.cancel();
    let report = match result {
        Ok(report) => report,
        Err(e) => {
            if let Some(live) = live {
                live.stop().await;
            }
            if ctrl_c.is_cancelled() {
                return Ok(interrupted(&format!(
                    "the restore was cancelled; {target_name} is incomplete"
                )));
            }
            return Err(super::failed(e, "restore failed"));
        }
    };
    let summary = RestoreSummary::new(target_name, &report);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "restored backup {} to {} ({}) in {:.2} s: {} data, {} zero; block hash {} {}",
            summary.id,
            summary.target,
            format_size(summary.size),
            summary.seconds,
            format_size(summary.data_bytes),
            format_size(summary.zero_bytes),
            summary.block_hash,
            if summary.verified {
                "verified"
            } else {
                "(the backup recorded none to check against)"
            }
        );
    }
    if let Some(live) = live {
        use std::io::Write;
        std::io::stdout().flush()?;
        eprintln!("ferry: the restore finished; still serving the backup until SIGTERM");
        live.signalled.cancelled().await;
        live.stop().await;
    }
    Ok(ExitCode::SUCCESS)
}

/// The export of a live restore, serving on its own task.
struct LiveExport {
    /// Cancelled by SIGTERM or Ctrl-C.
    signalled: CancellationToken,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<()>,
}

impl LiveExport {
    /// Serves `serving` until [`LiveExport::stop`]; SIGTERM or Ctrl-C cancel `restore`.
    async fn start(
        serving: super::backup_serve::Serving,
        id: &BackupId,
        restore: &CancellationToken,
    ) -> anyhow::Result<Self> {
        let signal = terminated().await?;
        let signalled = CancellationToken::new();
        let (flag, restore) = (signalled.clone(), restore.clone());
        tokio::spawn(async move {
            signal.await;
            flag.cancel();
            restore.cancel();
        });
        serving.announce(id)?;
        let stop = CancellationToken::new();
        let until = stop.clone();
        let server = tokio::spawn(serving.export.serve(async move { until.cancelled().await }));
        Ok(Self {
            signalled,
            stop,
            server,
        })
    }

    /// Stops serving and closes every connection.
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.server.await;
    }
}
