//! Every manifest in deploy/ is a valid Kubernetes object for each supported Kubernetes
//! version (kubernetes-validate --strict, which rejects unknown fields), and the tool
//! really rejects a broken CRD, so a pass means something. yamllint checks the YAML
//! itself (duplicate keys, syntax, trailing spaces).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Kubernetes versions the manifests must be valid for (k8s-openapi is built for 1.33;
/// AnyVolumeDataSource, which the populator needs, is GA since 1.33).
const VERSIONS: [&str; 3] = ["1.33.0", "1.34.0", "1.35.0"];

const INSTALL: &str = "pip install kubernetes-validate==1.37.0 (scripts/test.sh installs it)";
const INSTALL_YAMLLINT: &str = "pip install yamllint==1.38.0 (scripts/test.sh installs it)";

/// yamllint's defaults without the rules generated YAML cannot follow (serde_yaml writes
/// long descriptions on one line and sequences unindented).
const YAMLLINT_CONFIG: &str = "{extends: default, rules: {line-length: disable, \
    document-start: disable, indentation: {indent-sequences: whatever}}}";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

fn kubernetes_validate(version: &str, files: &[PathBuf]) -> (bool, String) {
    let out: Output = Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", version])
        .args(files)
        .output()
        .unwrap_or_else(|e| panic!("kubernetes-validate is needed: {INSTALL} ({e})"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ok = out.status.success() && !text.contains("ERROR") && !text.contains("WARN");
    (ok, text)
}

#[test]
fn every_manifest_in_deploy_is_valid() {
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy"), &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("deploy/crds.yaml")),
        "deploy/crds.yaml is missing: {files:?}"
    );
    for version in VERSIONS {
        let (ok, text) = kubernetes_validate(version, &files);
        assert!(
            ok,
            "kubernetes-validate --strict -k {version} failed:\n{text}"
        );
        // One "passed" line per object: the CRDs and the service manifests were all read.
        let objects: usize = files
            .iter()
            .map(|f| {
                std::fs::read_to_string(f)
                    .unwrap()
                    .split("\n---")
                    .filter(|doc| doc.lines().any(|l| l.starts_with("kind:")))
                    .count()
            })
            .sum();
        assert_eq!(text.matches("passed").count(), objects, "{text}");
    }
}

/// The generated CRDs with one change applied to the first document.
fn broken_crd(change: impl Fn(&mut serde_yaml::Value)) -> tempfile::TempDir {
    let yaml = ferry_operator::crd::crds_yaml().unwrap();
    let first = serde_yaml::Deserializer::from_str(&yaml).next().unwrap();
    let mut doc = <serde_yaml::Value as serde::Deserialize>::deserialize(first).unwrap();
    change(&mut doc);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("crd.yaml"),
        serde_yaml::to_string(&doc).unwrap(),
    )
    .unwrap();
    dir
}

#[test]
fn a_broken_crd_is_rejected() {
    let unknown_field = broken_crd(|doc| {
        doc["spec"]
            .as_mapping_mut()
            .unwrap()
            .insert("replicas".into(), 3.into());
    });
    let wrong_type = broken_crd(|doc| {
        doc["spec"]["versions"][0]["served"] = "maybe".into();
    });
    let intact = broken_crd(|_| {});
    for (dir, expect_ok) in [(intact, true), (unknown_field, false), (wrong_type, false)] {
        let file = dir.path().join("crd.yaml");
        let (ok, text) = kubernetes_validate(VERSIONS[0], std::slice::from_ref(&file));
        assert_eq!(ok, expect_ok, "{text}");
    }
}

#[test]
fn every_manifest_in_deploy_passes_yamllint() {
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy"), &mut files);
    let run = |files: &[PathBuf]| {
        Command::new("yamllint")
            .args(["--strict", "--format", "parsable", "-d", YAMLLINT_CONFIG])
            .args(files)
            .output()
            .unwrap_or_else(|e| panic!("yamllint is needed: {INSTALL_YAMLLINT} ({e})"))
    };
    let out = run(&files);
    assert!(
        out.status.success(),
        "yamllint failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // And it does fail on a broken file (a duplicated key).
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "kind: A\nkind: B\n").unwrap();
    let out = run(&[bad]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("key-duplicates"));
}
