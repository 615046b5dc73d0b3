//! `ferry copy SRC DST1 DST2 ...`: one pass over the source into several targets.
//!
//! The engine's [`FanOut`] reads each extent once and writes it to every target; a target
//! that fails is dropped and the others go on. With `--verify` the source is hashed once
//! and every target that holds the image is read back and compared. What printed: the
//! summary of the targets that hold the image (stdout, as for one target) and one line
//! per failed target (stderr); the exit status is 0 only if every target holds the image.

use std::process::ExitCode;
use std::sync::Arc;

use ferry_core::{EndpointSpec, Target};
use ferry_endpoints::open_source;
use ferry_engine::{verify_read_backs, CancellationToken, FanOut, Progress, Stage};

use super::copy::{CopyArgs, Opened};
use super::summary::{CopySummary, FailedTarget};
use super::{cancel_on_ctrl_c, interrupted, progress};

/// Exit status when some targets hold the image and others do not.
const EXIT_SOME_FAILED: u8 = 1;

/// Copies the opened source into every target.
pub(super) async fn run(
    args: &CopyArgs,
    opened: Opened,
    specs: &[EndpointSpec],
    targets: Vec<Arc<dyn Target>>,
) -> anyhow::Result<ExitCode> {
    let Opened {
        source,
        source_name,
        source_options,
        progress: copy_progress,
    } = opened;
    let names: Vec<String> = specs.iter().map(ToString::to_string).collect();
    let options = args.copy_options();
    tracing::debug!(source = %source_name, targets = ?names, size = source.size(), ?options, "fan-out copy");
    let fan = Arc::new(
        FanOut::new(source.clone(), targets).map_err(|e| super::failed(e, "cannot copy"))?,
    );
    let cancel = CancellationToken::new();
    let ctrl_c = cancel_on_ctrl_c(&cancel);
    let verify_progress = Progress::new();
    let display = progress::Stages::start(&copy_progress, &verify_progress, args.progress.choice());
    display.enter(Stage::Copy);
    let copied = ferry_engine::copy(
        source.clone(),
        fan.clone(),
        &options,
        &copy_progress,
        &cancel,
    )
    .await;
    let mut failures = target_failures(&fan);
    let report = match copied {
        Ok(report) => report,
        Err(e) => {
            display.finish().await;
            let _ = source.close().await;
            return copy_failed(e, &ctrl_c);
        }
    };
    let verified = if args.verify {
        display.enter(Stage::Verify);
        let read_back = ReadBack {
            source: source.clone(),
            specs,
            options: &source_options,
            progress: &verify_progress,
            cancel: &cancel,
        };
        match read_back.verify(args, &mut failures).await {
            Ok(v) => v,
            Err(e) => {
                display.finish().await;
                return verify_failed(e, &ctrl_c);
            }
        }
    } else {
        None
    };
    display.finish().await;
    let _ = source.close().await;
    cancel.cancel();
    report_outcome(
        args,
        source_name,
        &names,
        failures,
        &report,
        verified.as_ref(),
    )
}

/// Each target's failure during the copy, in target order (`None`: it holds the image so
/// far).
fn target_failures(fan: &FanOut) -> Vec<Option<String>> {
    fan.outcomes()
        .into_iter()
        .map(|o| o.error.map(|f| f.message))
        .collect()
}

/// The exit of a copy that failed as a whole (`ctrl_c`: fired by Ctrl-C).
fn copy_failed(error: ferry_core::Error, ctrl_c: &CancellationToken) -> anyhow::Result<ExitCode> {
    if ctrl_c.is_cancelled() {
        return Ok(interrupted(
            "the copy was cancelled; every target is incomplete",
        ));
    }
    Err(super::failed(error, "copy failed"))
}

/// The exit of a verification that failed as a whole (`ctrl_c`: fired by Ctrl-C).
fn verify_failed(error: ferry_core::Error, ctrl_c: &CancellationToken) -> anyhow::Result<ExitCode> {
    if ctrl_c.is_cancelled() {
        return Ok(interrupted("the verification was cancelled"));
    }
    Err(anyhow::anyhow!("{error}"))
}

/// What the verification of a fan-out reads back, and with what.
struct ReadBack<'a> {
    source: Arc<dyn ferry_core::Source>,
    specs: &'a [EndpointSpec],
    options: &'a ferry_endpoints::SourceOptions,
    progress: &'a Progress,
    cancel: &'a CancellationToken,
}

impl ReadBack<'_> {
    /// Reads back every target that has not failed and compares it with the source; a
    /// target that differs or cannot be read back gets its failure. Returns a verification
    /// of a target that passed.
    async fn verify(
        &self,
        args: &CopyArgs,
        failures: &mut [Option<String>],
    ) -> ferry_core::Result<Option<ferry_engine::Verification>> {
        let mut indexes = Vec::new();
        let mut read_backs = Vec::new();
        for (i, spec) in self.specs.iter().enumerate() {
            if failures[i].is_none() {
                indexes.push(i);
                read_backs.push(open_source(spec, self.options).await);
            }
        }
        let results = verify_read_backs(
            self.source.clone(),
            read_backs,
            &args.verify_options(),
            self.progress,
            self.cancel,
        )
        .await?;
        let mut verified = None;
        for (i, result) in indexes.into_iter().zip(results) {
            match result {
                Ok(v) => verified = Some(v),
                Err(e) => failures[i] = Some(e.to_string()),
            }
        }
        Ok(verified)
    }
}

/// Prints the summary of the targets that hold the image (stdout) and one line per failed
/// target (stderr); the exit status says whether every target holds it.
fn report_outcome(
    args: &CopyArgs,
    source_name: String,
    names: &[String],
    failures: Vec<Option<String>>,
    report: &ferry_engine::CopyReport,
    verified: Option<&ferry_engine::Verification>,
) -> anyhow::Result<ExitCode> {
    let holding: Vec<&str> = names
        .iter()
        .zip(&failures)
        .filter(|(_, f)| f.is_none())
        .map(|(n, _)| n.as_str())
        .collect();
    let failed: Vec<FailedTarget> = names
        .iter()
        .zip(failures)
        .filter_map(|(name, f)| {
            f.map(|error| FailedTarget {
                target: name.clone(),
                error,
            })
        })
        .collect();
    for f in &failed {
        eprintln!("ferry: {}: {}", f.target, f.error);
    }
    if holding.is_empty() {
        anyhow::bail!("no target holds the image");
    }
    let mut summary = CopySummary::new(source_name, holding.join(", "), report);
    if let Some(v) = verified {
        summary = summary.with_digests(&v.source, &v.target, v.elapsed);
    }
    let some_failed = !failed.is_empty();
    summary.failed_targets = failed;
    if args.json {
        println!("{}", summary.to_json());
    } else {
        println!("{}", summary.to_text());
    }
    Ok(if some_failed {
        ExitCode::from(EXIT_SOME_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}
