//! Progress display for a running copy or checksum.
//!
//! On a terminal: an indicatif bar with bytes done, rate and ETA. When the user asks for
//! progress but stderr is not a terminal (a log file, CI), a plain line every few seconds
//! instead, since a redrawn bar would only litter the log. Either reads the engine's
//! [`Progress`] counters from its own task, so the data path never waits for the display.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use ferry_core::size::format_size;
use ferry_engine::{CancellationToken, Progress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::task::JoinHandle;

const BAR_TICK: Duration = Duration::from_millis(100);
const LINE_EVERY: Duration = Duration::from_secs(5);

/// A running progress display; [`Display::finish`] removes it.
#[derive(Debug)]
pub struct Display {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// Starts a display of `progress` labelled `label` when `choice` asks for one (or, when the
/// user did not choose, when stderr is a terminal).
pub fn start(progress: &Progress, label: &str, choice: Option<bool>) -> Option<Display> {
    let terminal = std::io::stderr().is_terminal();
    if !choice.unwrap_or(terminal) {
        return None;
    }
    Some(spawn(progress, label, terminal, None))
}

/// A display of `progress` that starts drawing once `after` (an earlier display) is cleared.
fn spawn(
    progress: &Progress,
    label: &str,
    terminal: bool,
    after: Option<JoinHandle<()>>,
) -> Display {
    let stop = CancellationToken::new();
    let (progress, label, token) = (progress.clone(), label.to_string(), stop.clone());
    let task = tokio::spawn(async move {
        if let Some(earlier) = after {
            let _ = earlier.await;
        }
        if terminal {
            bar(progress, label, token).await;
        } else {
            lines(progress, label, token).await;
        }
    });
    Display { stop, task }
}

/// The display of a verified copy: the copy's progress, then the verification's, each
/// under its own label. [`Stages::enter`] switches from a stage callback (synchronous).
#[derive(Debug)]
pub struct Stages {
    current: parking_lot::Mutex<Option<Display>>,
    verify: Progress,
}

impl Stages {
    /// Starts showing `copy` (when `choice` asks for a display); `verify` is shown from
    /// the verify stage on.
    pub fn start(copy: &Progress, verify: &Progress, choice: Option<bool>) -> Self {
        Self {
            current: parking_lot::Mutex::new(start(copy, "copy", choice)),
            verify: verify.clone(),
        }
    }

    /// Follows the verified copy into `stage`.
    pub fn enter(&self, stage: ferry_engine::Stage) {
        if stage != ferry_engine::Stage::Verify {
            return;
        }
        let mut current = self.current.lock();
        if let Some(copy) = current.take() {
            copy.stop.cancel();
            let terminal = std::io::stderr().is_terminal();
            *current = Some(spawn(&self.verify, "verify", terminal, Some(copy.task)));
        }
    }

    /// Stops and clears whatever is shown.
    pub async fn finish(self) {
        finish(self.current.into_inner()).await;
    }
}

impl Display {
    /// Stops and clears the display (before the command prints its result).
    pub async fn finish(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Stops an optional display.
pub async fn finish(display: Option<Display>) {
    if let Some(display) = display {
        display.finish().await;
    }
}

async fn bar(progress: Progress, label: String, stop: CancellationToken) {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{msg} [{wide_bar}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    // A source whose size shows only at its end has no total while it is read: bytes and
    // rate only.
    let open_ended = ProgressStyle::with_template(
        "{msg} {spinner} {binary_bytes} {binary_bytes_per_sec} (size not known until the end)",
    )
    .unwrap_or_else(|_| ProgressStyle::default_spinner());
    bar.set_style(style.clone());
    bar.set_message(label);
    let mut is_open_ended = false;
    loop {
        let snap = progress.snapshot();
        if snap.total > 0 && bar.length() != Some(snap.total) {
            bar.set_style(style.clone());
            is_open_ended = false;
            bar.set_length(snap.total);
        } else if snap.total == 0 && snap.done > 0 && !is_open_ended {
            bar.set_style(open_ended.clone());
            is_open_ended = true;
        }
        bar.set_position(snap.done);
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(BAR_TICK) => {}
        }
    }
    bar.finish_and_clear();
}

async fn lines(progress: Progress, label: String, stop: CancellationToken) {
    let started = Instant::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(LINE_EVERY) => {}
        }
        let snap = progress.snapshot();
        let secs = started.elapsed().as_secs_f64();
        let rate = if secs > 0.0 {
            snap.done as f64 / secs
        } else {
            0.0
        };
        if snap.total == 0 && snap.done > 0 {
            eprintln!(
                "ferry: {label}: {} (size not known until the end), {}/s",
                format_size(snap.done),
                format_size(rate as u64),
            );
            continue;
        }
        let percent = if snap.total > 0 {
            100.0 * snap.done as f64 / snap.total as f64
        } else {
            100.0
        };
        let eta = if rate > 0.0 && snap.total >= snap.done {
            format!("{:.0}s", (snap.total - snap.done) as f64 / rate)
        } else {
            "?".to_string()
        };
        eprintln!(
            "ferry: {label}: {percent:.1}% ({} of {}), {}/s, ETA {eta}",
            format_size(snap.done),
            format_size(snap.total),
            format_size(rate as u64),
        );
    }
}
