//! The Kubernetes manifests of `ferry serve` (deploy/service) and the Helm chart
//! (charts/ferry) are valid Kubernetes objects (kubernetes-validate --strict against the
//! API schemas), and what they configure is what ferry accepts: the ConfigMap's config
//! file parses as ferry's config and the container arguments parse as `ferry serve` flags.
//!
//! No helm binary exists here, so the chart's templates use plain `{{ .Values.x }}`
//! substitutions only and this test renders them itself; any other template syntax
//! fails the test.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use ferry_mover::service::config::FileConfig;
use ferry_mover::service::serve::ServeArgs;

#[derive(Debug, Parser)]
struct Ferry {
    #[command(subcommand)]
    command: Sub,
}

#[derive(Debug, clap::Subcommand)]
enum Sub {
    Serve(ServeArgs),
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn kubernetes_validate(files: &[PathBuf]) {
    let out = Command::new("kubernetes-validate")
        .arg("--strict")
        .args(files)
        .output()
        .unwrap_or_else(|e| {
            panic!("kubernetes-validate is needed: pip install kubernetes-validate ({e})")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubernetes-validate failed:\n{text}");
    assert!(!text.contains("ERROR"), "{text}");
    assert!(text.contains("passed"), "{text}");
}

/// Checks what the objects configure against ferry's own parsers.
fn check_objects(text: &str) -> usize {
    let mut count = 0;
    for doc in text.split("\n---") {
        let v: serde_yaml::Value = serde_yaml::from_str(doc).expect("YAML document");
        if v.is_null() {
            continue;
        }
        count += 1;
        match v["kind"].as_str() {
            Some("ConfigMap") => {
                let cfg = v["data"]["ferry.yaml"]
                    .as_str()
                    .expect("ferry.yaml in the ConfigMap");
                let parsed: FileConfig =
                    serde_yaml::from_str(cfg).expect("ferry accepts the config");
                assert!(parsed.grpc_listen.is_some());
                assert!(parsed.allow_root.is_some_and(|r| !r.is_empty()));
            }
            Some("Deployment") => {
                let spec = &v["spec"]["template"]["spec"]["containers"][0];
                let args: Vec<String> = spec["args"]
                    .as_sequence()
                    .expect("container args")
                    .iter()
                    .map(|a| a.as_str().expect("string arg").to_string())
                    .collect();
                let parsed =
                    Ferry::try_parse_from(std::iter::once("ferry".to_string()).chain(args))
                        .expect("ferry accepts the container arguments");
                let Sub::Serve(serve) = parsed.command;
                assert!(serve.config.is_some());
                assert_eq!(
                    v["spec"]["replicas"].as_u64(),
                    Some(1),
                    "one writer of the store"
                );
            }
            _ => {}
        }
    }
    count
}

#[test]
fn plain_manifests_are_valid() {
    let file = repo().join("deploy/service/ferry-serve.yaml");
    kubernetes_validate(std::slice::from_ref(&file));
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(check_objects(&text), 4);
}

fn lookup<'a>(values: &'a serde_yaml::Value, path: &str) -> Option<&'a serde_yaml::Value> {
    path.split('.').try_fold(values, |v, key| v.get(key))
}

fn scalar(v: &serde_yaml::Value) -> String {
    match v {
        serde_yaml::Value::String(s) => s.clone(),
        serde_yaml::Value::Number(n) => n.to_string(),
        serde_yaml::Value::Bool(b) => b.to_string(),
        other => panic!("template value is not a scalar: {other:?}"),
    }
}

/// Renders `{{ .Values.a.b }}`, `{{ .Release.Name }}`, `{{ .Release.Namespace }}`,
/// `{{ .Chart.Name }}` and `{{ .Chart.AppVersion }}`; anything else is an error.
fn render(template: &str, values: &serde_yaml::Value, chart: &serde_yaml::Value) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find("}}").expect("closed action") + start;
        let action = rest[start + 2..end].trim();
        let value = if let Some(path) = action.strip_prefix(".Values.") {
            scalar(lookup(values, path).unwrap_or_else(|| panic!("no value {path}")))
        } else {
            match action {
                ".Release.Name" => "ferry".to_string(),
                ".Release.Namespace" => "ferry-system".to_string(),
                ".Chart.Name" => scalar(&chart["name"]),
                ".Chart.AppVersion" => scalar(&chart["appVersion"]),
                other => panic!("template action '{other}' is beyond what this test renders"),
            }
        };
        out.push_str(&value);
        rest = &rest[end + 2..];
    }
    out.push_str(rest);
    out
}

#[test]
fn helm_chart_renders_to_valid_manifests() {
    let chart_dir = repo().join("charts/ferry");
    let chart: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir.join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(chart["apiVersion"].as_str(), Some("v2"));
    let values: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir.join("values.yaml")).unwrap())
            .unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut rendered = Vec::new();
    let mut objects = 0;
    let mut names: Vec<_> = std::fs::read_dir(chart_dir.join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    names.sort();
    for path in names {
        let text = render(&std::fs::read_to_string(&path).unwrap(), &values, &chart);
        assert!(!text.contains("{{"), "{}", path.display());
        objects += check_objects(&text);
        let dest = out.path().join(path.file_name().unwrap());
        std::fs::write(&dest, text).unwrap();
        rendered.push(dest);
    }
    assert_eq!(objects, 4);
    kubernetes_validate(&rendered);
}
