//! `ferry copy SRC DST [DST...]`: copy an image between any endpoints.
//!
//! Opens the source, then the target sized to it, runs the engine's copy (and with
//! `--verify` its verification of the flushed target read back, the path the job service
//! takes too) with progress and Ctrl-C cancellation, and prints a summary (or `--json`).
//! Nothing is printed on stdout unless the copy succeeded (and verified).
//!
//! With several targets the copy is one pass ([`ferry_engine::FanOut`]): each extent is
//! read once and written to every target; a target that fails is reported and the others
//! go on; `--verify` hashes the source once and reads each target back. The summary names
//! the targets that hold the image; the exit status is 0 only if every one does.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use ferry_core::{EndpointSpec, Source, Target};
use ferry_endpoints::{open_source, open_target, Preallocation, SourceOptions, TargetOptions};
use ferry_engine::{
    CancellationToken, ChecksumOptions, CommitOrder, CopyOptions, Progress, Stage, Stages, Verify,
};

use super::args::{self, ProgressArgs};
use super::image::{self, FormatArgs};
use super::relay::RelayArgs;
use super::summary::CopySummary;
use super::{cancel_on_ctrl_c, interrupted, progress};
use crate::cli::options::{self, Cache};

/// Arguments of `ferry copy`.
#[derive(Debug, Clone, Args)]
#[command(after_help = super::HTTP_SOURCE_HELP)]
pub struct CopyArgs {
    /// Image to read: a path, file:///path, nbd://host[:port]/export, nbd+unix:///export?socket=PATH,
    /// nfs://host/path, iscsi://host/IQN/LUN, s3://bucket/key, http(s)://host/path
    #[arg(value_name = "SRC")]
    pub source: String,
    /// Image to write; a missing file is created with the source's size. Several: one
    /// pass writes them all.
    #[arg(value_name = "DST", required = true, num_args = 1..)]
    pub targets: Vec<String>,
    #[arg(long, value_name = "N", value_parser = args::count,
          help = format!("Concurrent copy workers [default: {}]", ferry_engine::DEFAULT_WORKERS))]
    pub workers: Option<usize>,
    #[arg(help = format!("Size of each read request, like 1M [default: what the endpoints \
                          prefer, at least {}; NBD: 1M]",
                         args::show_size(ferry_engine::DEFAULT_REQUEST_SIZE as u64)))]
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = args::request_size)]
    pub request_size: Option<usize>,
    #[arg(help = format!("Size of the work units workers take from a shared cursor [default: {}]",
                         args::show_size(ferry_engine::DEFAULT_WORK_UNIT)))]
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = args::work_unit)]
    pub work_unit: Option<u64>,
    /// Commit writes strictly in offset order (reads still run ahead in parallel).
    #[arg(long, conflicts_with = "out_of_order")]
    pub in_order: bool,
    /// Commit writes as reads complete [default: when the target takes random writes].
    #[arg(long)]
    pub out_of_order: bool,
    /// Detect zero blocks of this size in the data and leave them unwritten; 0 keeps every
    /// block allocated [default: 4K].
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = args::sparse_size)]
    pub sparse_size: Option<usize>,
    /// The target already reads as zeroes: write nothing for zero ranges.
    #[arg(long)]
    pub target_is_zero: bool,
    /// Target preallocation: off, falloc, full, grow or grow=STEP (extend by STEP, 128M by default).
    #[arg(long, value_name = "MODE", value_parser = options::preallocation, default_value = "off")]
    pub preallocation: Preallocation,
    /// writeback: through the page cache; none: direct I/O (O_DIRECT).
    #[arg(long, value_enum, default_value_t = Cache::Writeback)]
    pub cache: Cache,
    /// Read at most SIZE bytes per second, like 100M.
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = args::rate)]
    pub rate_limit: Option<u64>,
    /// After the copy, compare the block hashes of source and target; fail on a mismatch.
    #[arg(long)]
    pub verify: bool,
    #[command(flatten)]
    pub format: FormatArgs,
    #[command(flatten)]
    pub progress: ProgressArgs,
    #[command(flatten)]
    pub relay: RelayArgs,
    /// Print one JSON object summarising the copy on stdout.
    #[arg(long)]
    pub json: bool,
}

impl CopyArgs {
    /// The engine options these arguments ask for (engine defaults where not given).
    pub fn copy_options(&self) -> CopyOptions {
        let mut options = CopyOptions::default();
        if let Some(workers) = self.workers {
            options.workers = workers;
        }
        options.request_size = self.request_size;
        if let Some(work_unit) = self.work_unit {
            options.work_unit = work_unit;
        }
        options.order = match (self.in_order, self.out_of_order) {
            (true, _) => CommitOrder::InOrder,
            (_, true) => CommitOrder::OutOfOrder,
            _ => CommitOrder::Auto,
        };
        if let Some(sparse_size) = self.sparse_size {
            options.sparse_size = sparse_size;
        }
        options.target_is_zero = self.target_is_zero;
        options.rate_limit = self.rate_limit;
        options.zero_mode = self.preallocation.zero_mode();
        options
    }

    /// The checksum options of `--verify`.
    pub(super) fn verify_options(&self) -> ChecksumOptions {
        let mut options = ChecksumOptions::default();
        if let Some(workers) = self.workers {
            options.workers = workers;
        }
        options
    }

    pub(super) fn source_options(&self) -> anyhow::Result<SourceOptions> {
        let mut options = super::source_options_from_env()?;
        options.cache = self.cache.into();
        self.format
            .apply_platform(&mut options)
            .map_err(|e| super::failed(e, "invalid --platform"))?;
        Ok(options)
    }

    fn target_options(&self) -> TargetOptions {
        let mut options = TargetOptions::default();
        options.cache = self.cache.into();
        options.preallocation = self.preallocation;
        options.keep_cached = self.verify;
        options
    }
}

/// Runs `ferry copy`.
pub async fn run(args: CopyArgs) -> anyhow::Result<ExitCode> {
    super::init_tracing();
    let source_spec =
        EndpointSpec::parse(&args.source).map_err(|e| super::failed(e, "invalid source"))?;
    let target_specs = args
        .targets
        .iter()
        .map(|t| EndpointSpec::parse(t).map_err(|e| super::failed(e, "invalid target")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let backing = super::relay::backing(&args.relay, &target_specs)?;
    let source_name = source_spec.to_string();
    let source_options = args.source_options()?;
    let format = args.format.open_options(&source_options);
    let (source, _): (Arc<dyn Source>, _) = image::open(&source_spec, &source_options, &format)
        .await
        .map_err(|e| super::named(e, &source_name, "cannot open the source"))?;
    if target_specs.len() > 1 && !source.size_known() {
        let _ = source.close().await;
        return Err(anyhow::anyhow!(
            "{source_name}: the size of this stream is not known before it is read, and a \
             copy to several targets needs it: give it with --source-size, count it first \
             with --prescan, or copy to one target"
        ));
    }
    let mut targets: Vec<Arc<dyn Target>> = Vec::with_capacity(target_specs.len());
    for spec in &target_specs {
        let target = open_target(spec, source.size(), &args.target_options())
            .await
            .map_err(|e| super::named(e, &spec.to_string(), "cannot open the target"))?;
        targets.push(target);
    }
    let relay = match super::relay::start(&args.relay, backing, &source, &source_name, &mut targets)
        .await
    {
        Ok(relay) => relay,
        Err(e) => {
            for target in &targets {
                let _ = target.abort().await;
            }
            let _ = source.close().await;
            return Err(e);
        }
    };
    let opened = Opened {
        progress: match &relay {
            Some(relay) => Progress::with_written(relay.written()),
            None => Progress::new(),
        },
        source,
        source_name,
        source_options,
    };
    let result = match <[_; 1]>::try_from(targets) {
        Ok([target]) => copy_one(&args, opened, &target_specs[0], target).await,
        Err(targets) => super::fan_out::run(&args, opened, &target_specs, targets).await,
    };
    if let Some(relay) = relay {
        super::relay::end(relay).await;
    }
    result
}

/// The opened source and how to open it again.
pub(super) struct Opened {
    pub source: Arc<dyn Source>,
    pub source_name: String,
    pub source_options: SourceOptions,
    /// The copy's progress (reporting written ranges to the relay, if any).
    pub progress: Progress,
}

async fn copy_one(
    args: &CopyArgs,
    opened: Opened,
    target_spec: &EndpointSpec,
    target: Arc<dyn Target>,
) -> anyhow::Result<ExitCode> {
    let Opened {
        source,
        source_name,
        source_options,
        progress: copy_progress,
    } = opened;
    let target_name = target_spec.to_string();
    let options = args.copy_options();
    tracing::debug!(source = %source_name, target = %target_name, size = source.size(), ?options, "copy");

    let cancel = CancellationToken::new();
    let ctrl_c = cancel_on_ctrl_c(&cancel);
    // Verification reads the target through a new handle, opened after the copy flushed it.
    let verify = args.verify.then(|| Verify {
        checksum: args.verify_options(),
        read_back: || async {
            open_source(target_spec, &source_options)
                .await
                .map_err(|e| e.with_endpoint(&target_name))
        },
    });
    let fixed_size = (!target.can_grow()).then(|| target.size());
    let verify_progress = Progress::new();
    let display = progress::Stages::start(&copy_progress, &verify_progress, args.progress.choice());
    let entered = |stage: Stage| display.enter(stage);
    let stages = Stages {
        copy: copy_progress,
        verify: verify_progress,
        entered: &entered,
    };
    let result =
        ferry_engine::copy_and_verify(source.clone(), target, &options, verify, &stages, &cancel)
            .await;
    display.finish().await;
    let done = match result {
        Ok(done) => done,
        Err(e) if ctrl_c.is_cancelled() => {
            return Ok(interrupted(&cancelled(e.stage, &target_name)))
        }
        Err(e) => {
            let _ = source.close().await;
            return Err(match e.stage {
                Stage::Copy => super::failed(e.error, "copy failed"),
                // Verification errors already say "verify ...".
                Stage::Verify => anyhow::anyhow!("{}", e.error),
            });
        }
    };
    let _ = source.close().await;
    cancel.cancel();

    let mut summary =
        CopySummary::new(source_name, target_name, &done.copy).with_fixed_target(fixed_size);
    if let Some(v) = &done.verification {
        summary = summary.with_digests(&v.source, &v.target, v.elapsed);
    }
    if args.json {
        println!("{}", summary.to_json());
    } else {
        println!("{}", summary.to_text());
    }
    Ok(ExitCode::SUCCESS)
}

/// What an interrupted copy tells the user, by the stage Ctrl-C stopped.
fn cancelled(stage: Stage, target: &str) -> String {
    match stage {
        Stage::Copy => format!("the copy was cancelled; {target} is incomplete"),
        Stage::Verify => format!("the verification of {target} was cancelled"),
    }
}
