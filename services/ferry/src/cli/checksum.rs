//! `ferry checksum URL...`: print each image's digest as `HEXDIGEST  URL`, the format of
//! sha256sum and blksum, so outputs can be compared with theirs line by line.
//!
//! The default algorithm is the blksum-compatible block hash; `--algorithm sha256` gives
//! the plain SHA-256 of the image that `sha256sum` prints.

use std::process::ExitCode;

use clap::Args;
use ferry_core::EndpointSpec;
use ferry_engine::{CancellationToken, ChecksumOptions, Digest, HashAlgorithm, Progress};

use super::args::{self, ProgressArgs};
use super::image::{self, FormatArgs};
use super::{cancel_on_ctrl_c, interrupted, progress};
use crate::cli::options::{self, Cache};

/// Arguments of `ferry checksum`.
#[derive(Debug, Clone, Args)]
#[command(after_help = super::HTTP_SOURCE_HELP)]
pub struct ChecksumArgs {
    /// Images to hash: paths or URLs.
    #[arg(value_name = "URL", required = true)]
    pub urls: Vec<String>,
    /// blkhash (blksum-compatible block hash) or sha256 (equal to sha256sum).
    #[arg(long, short = 'a', value_name = "ALGORITHM", default_value = "blkhash", value_parser = options::algorithm)]
    pub algorithm: HashAlgorithm,
    /// Reads in flight at once [default: 8].
    #[arg(long, value_name = "N", value_parser = args::count)]
    pub workers: Option<usize>,
    /// Threads hashing at once [default: every core].
    #[arg(long, value_name = "N", value_parser = args::count)]
    pub threads: Option<usize>,
    /// Size of each read, like 4M [default: 4M].
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = args::request_size)]
    pub request_size: Option<usize>,
    /// writeback: through the page cache; none: direct I/O (O_DIRECT).
    #[arg(long, value_enum, default_value_t = Cache::Writeback)]
    pub cache: Cache,
    #[command(flatten)]
    pub format: FormatArgs,
    #[command(flatten)]
    pub progress: ProgressArgs,
}

impl ChecksumArgs {
    pub fn checksum_options(&self) -> ChecksumOptions {
        let mut options = ChecksumOptions {
            algorithm: self.algorithm,
            ..ChecksumOptions::default()
        };
        if let Some(workers) = self.workers {
            options.workers = workers;
        }
        if let Some(threads) = self.threads {
            options.threads = threads;
        }
        if let Some(request_size) = self.request_size {
            options.request_size = request_size;
        }
        options
    }
}

/// Runs `ferry checksum`. Like sha256sum, a failing image is reported and the others are
/// still hashed; the exit code is non-zero if any failed.
pub async fn run(args: ChecksumArgs) -> anyhow::Result<ExitCode> {
    super::init_tracing();
    let cancel = CancellationToken::new();
    let ctrl_c = cancel_on_ctrl_c(&cancel);
    let options = args.checksum_options();
    let mut failed = false;
    for url in &args.urls {
        match checksum_one(url, &args, &options, &cancel).await {
            Ok(digest) => println!("{}  {url}", digest.hex()),
            Err(_) if ctrl_c.is_cancelled() => {
                return Ok(interrupted(&format!("the checksum of {url} was cancelled")))
            }
            Err(e) => {
                eprintln!("ferry: {}", crate::app::one_line(&e));
                failed = true;
            }
        }
    }
    cancel.cancel();
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

async fn checksum_one(
    url: &str,
    args: &ChecksumArgs,
    options: &ChecksumOptions,
    cancel: &CancellationToken,
) -> anyhow::Result<Digest> {
    let spec = EndpointSpec::parse(url).map_err(|e| super::failed(e, "invalid image"))?;
    let mut source_options = super::source_options_from_env()?;
    args.format
        .apply_platform(&mut source_options)
        .map_err(|e| super::failed(e, "invalid --platform"))?;
    source_options.cache = args.cache.into();
    let format = args.format.open_options(&source_options);
    let (source, _) = image::open(&spec, &source_options, &format)
        .await
        .map_err(|e| super::named(e, &spec.to_string(), "cannot open the image"))?;
    let progress = Progress::new();
    let display = progress::start(&progress, "checksum", args.progress.choice());
    let result = ferry_engine::checksum(source.clone(), options, &progress, cancel).await;
    progress::finish(display).await;
    let _ = source.close().await;
    result.map_err(|e| super::failed(e, &format!("checksum of {spec} failed")))
}
