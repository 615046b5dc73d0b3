//! `ferry operator run` through the built binary: without a cluster configuration or with
//! a bad flag it fails within seconds with one `ferry: ...` line naming the problem, and
//! `--help` lists every flag.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How a run ended.
struct Run {
    output: Output,
    elapsed: Duration,
}

impl Run {
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    /// The one `ferry: ...` line of a failure (non-zero exit, nothing on stdout, no panic).
    #[track_caller]
    fn failure_line(&self) -> String {
        let stderr = self.stderr();
        assert!(!self.output.status.success(), "it succeeded: {stderr}");
        assert!(self.output.status.code().is_some(), "killed: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(self.stdout().trim().is_empty(), "stdout: {}", self.stdout());
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            lines.len() == 1 && lines[0].starts_with("ferry: "),
            "not one 'ferry: ...' line: {stderr}"
        );
        lines[0].to_string()
    }
}

/// Runs `ferry ARGS` with KUBECONFIG at `kubeconfig` and no in-cluster environment,
/// killing it after 20 s (a failure of the test).
fn ferry(kubeconfig: &str, args: &[&str]) -> Run {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env_remove("FERRY_OPERATOR_MOVER_IMAGE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ferry");
    while child.try_wait().expect("wait for ferry").is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("ferry {args:?} did not end within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("ferry's output");
    Run {
        output,
        elapsed: started.elapsed(),
    }
}

fn missing_kubeconfig() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-kubeconfig");
    let path = path.to_str().unwrap().to_string();
    (dir, path)
}

#[test]
fn without_a_cluster_config_it_fails_naming_the_problem() {
    let (_dir, missing) = missing_kubeconfig();
    let args = [
        "operator",
        "run",
        "--mover-image",
        "ferry:test",
        "--metrics-listen",
        "off",
    ];
    let run = ferry(&missing, &args);
    let line = run.failure_line();
    assert!(line.contains("no Kubernetes cluster"), "{line}");
    assert!(line.contains(&missing), "{line}");
    assert!(line.contains("KUBECONFIG"), "{line}");
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
}

#[test]
fn bad_flags_fail_naming_the_flag() {
    let (_dir, missing) = missing_kubeconfig();
    let cases: [(&[&str], &str); 5] = [
        (&[], "--mover-image"),
        (
            &["--mover-image", "i", "--max-attempts", "0"],
            "--max-attempts",
        ),
        (
            &["--mover-image", "i", "--max-movers", "many"],
            "--max-movers",
        ),
        (
            &["--mover-image", "i", "--metrics-listen", "here"],
            "--metrics-listen 'here'",
        ),
        (
            &["--mover-image", "i", "--webhook-listen", "there"],
            "--webhook-listen 'there'",
        ),
    ];
    for (flags, named) in cases {
        let mut args = vec!["operator", "run"];
        args.extend_from_slice(flags);
        let run = ferry(&missing, &args);
        let line = run.failure_line();
        assert!(line.contains(named), "{flags:?}: {line}");
        assert_ne!(run.output.status.code(), Some(0));
        assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
    }
}

#[test]
fn help_lists_every_flag() {
    let (_dir, missing) = missing_kubeconfig();
    let run = ferry(&missing, &["operator", "run", "--help"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let help = run.stdout();
    for flag in [
        "--mover-image",
        "--mover-pull-policy",
        "--mover-service-account",
        "--max-movers",
        "--max-movers-per-node",
        "--max-attempts",
        "--metrics-listen",
        "--lease-namespace",
        "--lease-name",
        "--watch-namespace",
        "--webhook-listen",
        "--webhook-service",
        "--webhook-configuration",
        "--log-format",
        "--log-filter",
    ] {
        assert!(help.contains(flag), "{flag} missing: {help}");
    }
    assert!(help.contains("FERRY_OPERATOR_MOVER_IMAGE"), "{help}");
}
