//! Running the binary under test and judging how it ended.
//!
//! Integration tests of this package get the fresh `ferry-e2e` binary (the same code as
//! `ferry`) from Cargo; [`ferry!`](crate::ferry) hands its path to [`Ferry`]. Every run has a
//! deadline, so a hang fails the test instead of stalling the suite.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The binary under test, for integration tests of this package.
#[macro_export]
macro_rules! ferry {
    () => {
        $crate::bin::Ferry::new(env!("CARGO_BIN_EXE_ferry-e2e"))
    };
}

/// How long one run may take before the test fails.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(300);

/// The `ferry` binary under test.
#[derive(Debug, Clone)]
pub struct Ferry {
    path: PathBuf,
    deadline: Duration,
}

impl Ferry {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            deadline: DEFAULT_DEADLINE,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A command for the binary with the user's defaults (no `RUST_LOG`) and no colours.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(&self.path);
        cmd.args(args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Runs the binary to completion (or the deadline) and collects its output.
    pub fn run<I, S>(&self, args: I) -> Run
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command(args);
        let description = format!("{cmd:?}");
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.path.display()));
        wait_with_deadline(child, self.deadline, description)
    }
}

/// Waits for a child whose stdout and stderr are piped, killing it at the deadline.
pub fn wait_with_deadline(mut child: Child, deadline: Duration, description: String) -> Run {
    let stdout = read_in_thread(child.stdout.take());
    let stderr = read_in_thread(child.stderr.take());
    let started = Instant::now();
    let status = loop {
        match child.try_wait().expect("wait for ferry") {
            Some(status) => break status,
            None if started.elapsed() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{description} did not finish within {deadline:?}");
            }
            None => thread::sleep(Duration::from_millis(20)),
        }
    };
    Run {
        description,
        status,
        elapsed: started.elapsed(),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

fn read_in_thread<R: Read + Send + 'static>(pipe: Option<R>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut text);
        }
        String::from_utf8_lossy(&text).into_owned()
    })
}

/// One finished run of the binary.
#[derive(Debug)]
pub struct Run {
    pub description: String,
    pub status: ExitStatus,
    pub elapsed: Duration,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Fails the test, showing everything, unless the run exited 0 without a panic.
    #[track_caller]
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.status.success() && !self.panicked(),
            "{} failed: {self}",
            self.description
        );
        self
    }

    /// Fails the test unless the run failed the way a user deserves: a non-zero exit,
    /// no panic, nothing on stdout (no summary, so no target reported as done), and stderr
    /// holding exactly one line, `ferry: ...`. Returns that line.
    #[track_caller]
    pub fn assert_clean_failure(&self) -> &str {
        assert!(
            !self.status.success(),
            "{} succeeded but should have failed: {self}",
            self.description
        );
        assert!(
            self.status.code().is_some(),
            "{} was killed by a signal: {self}",
            self.description
        );
        assert!(!self.panicked(), "{} panicked: {self}", self.description);
        assert!(
            self.stdout.trim().is_empty(),
            "{} printed on stdout although it failed: {self}",
            self.description
        );
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect();
        assert!(
            lines.len() == 1 && lines[0].starts_with("ferry: "),
            "{} should fail with one line 'ferry: ...' on stderr: {self}",
            self.description
        );
        lines[0]
    }

    pub fn panicked(&self) -> bool {
        self.stderr.contains("panicked") || self.stderr.contains("RUST_BACKTRACE")
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} after {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.elapsed, self.stdout, self.stderr
        )
    }
}
