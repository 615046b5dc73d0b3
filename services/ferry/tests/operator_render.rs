//! `ferry operator render` through the built binary, on the documented example (the
//! cluster objects of docs/render/cluster.yaml and every example of deploy/examples): it
//! exits 0, prints every object the operator would create as YAML that the Kubernetes
//! schemas accept (kubernetes-validate --strict), and one line per resource on stderr; a
//! file it cannot read fails with one `ferry: ...` line naming the file and document.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const INSTALL: &str = "pip install kubernetes-validate==1.37.0 (scripts/test.sh installs it)";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn render(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["operator", "render"])
        .args(args)
        .current_dir(repo())
        .env_remove("FERRY_OPERATOR_MOVER_IMAGE")
        .env_remove("FERRY_OPERATOR_MAX_MOVERS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ferry");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().expect("wait for ferry")
}

fn example_args() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(repo().join("deploy/examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| p.strip_prefix(repo()).unwrap().display().to_string())
        .collect();
    files.sort();
    let mut args = vec!["docs/render/cluster.yaml".to_string()];
    args.extend(files);
    args
}

#[test]
fn the_documented_example_renders_objects_kubernetes_accepts() {
    let args = example_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = render(&args, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let documents: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&stdout)
        .map(|d| serde::Deserialize::deserialize(d).expect("a YAML document"))
        .collect();
    let kinds: Vec<&str> = documents
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    for kind in [
        "Pod",
        "Secret",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "Transfer",
    ] {
        assert!(kinds.contains(&kind), "no {kind}: {kinds:?}");
    }
    // Never a secret value: every token Secret is redacted.
    for secret in documents.iter().filter(|d| d["kind"] == "Secret") {
        let data = secret["stringData"].as_object().unwrap();
        assert!(data.values().all(|v| v == "REDACTED"), "{secret}");
    }
    // One line per resource, as `Kind namespace/name: ...`.
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.contains(&"Backup vms/web1-before-upgrade: Running: mover pod web1-before-upgrade-fbk-1 runs on node node-2 (render starts no job)"),
        "{stderr}"
    );
    assert!(
        lines.contains(&"PersistentVolumeClaim vms/web1-root-restored: waiting (Pending): waiting for Backup web1-before-upgrade to succeed"),
        "{stderr}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with(
            "BackupSchedule vms/nightly-web1: WaitingForSchedule: the next backup starts at "
        )),
        "{stderr}"
    );

    // The built-in kinds against the Kubernetes schemas (ferry's own kinds are its
    // types, which render serialized).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rendered.yaml");
    // ferry's own text, as kubectl would read it (YAML 1.1), not a re-serialization.
    let builtin: String = stdout
        .split("---\n")
        .filter(|text| !text.is_empty() && !text.starts_with("apiVersion: ferry.dev/"))
        .map(|text| format!("---\n{text}"))
        .collect();
    std::fs::write(&file, builtin).unwrap();
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", "1.33.0"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("kubernetes-validate is needed: {INSTALL} ({e})"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !text.contains("ERROR") && !text.contains("WARN"),
        "{text}"
    );
    let builtin_count = documents
        .iter()
        .filter(|d| !d["apiVersion"].as_str().unwrap().starts_with("ferry.dev/"))
        .count();
    assert_eq!(
        text.matches("passed for resource").count(),
        builtin_count,
        "{text}"
    );
}

#[test]
fn stdin_and_the_mover_limit_are_honoured() {
    let file = std::fs::read_to_string(repo().join("docs/render/cluster.yaml")).unwrap();
    let example =
        std::fs::read_to_string(repo().join("deploy/examples/02-clone-golden-into-10.yaml"))
            .unwrap();
    let out = render(
        &["-", "--max-movers", "0"],
        &format!("{file}\n---\n{example}"),
    );
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Transfer vms/rhel-desktops: Running"),
        "{stderr}"
    );
}

#[test]
fn a_file_it_cannot_read_fails_naming_file_and_document() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )
    .unwrap();
    let cases = [
        (
            bad.display().to_string(),
            format!(
                "ferry: {}: document 2: ConfigMap (v1) is not a kind render reads",
                bad.display()
            ),
        ),
        (
            "/nonexistent/file.yaml".to_string(),
            "ferry: cannot read /nonexistent/file.yaml".to_string(),
        ),
    ];
    for (arg, expected) in cases {
        let out = render(&[&arg], "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(out.stdout.is_empty());
        let line = stderr.lines().next().unwrap_or_default();
        assert!(line.starts_with(&expected), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
