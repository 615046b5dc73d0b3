//! Every manifest in deploy/ is a valid Kubernetes object for each supported Kubernetes
//! version (kubernetes-validate --strict, which rejects unknown fields), and the tool
//! really rejects a broken CRD, so a pass means something. yamllint checks the YAML
//! itself (duplicate keys, syntax, trailing spaces). What kubernetes-validate has no
//! schema for is checked here otherwise: ferry's own resources in deploy/examples by
//! ferry-operator's types and their `validate()`, the ServiceMonitor against a schema of
//! the fields it uses. The operator's Deployment is checked for the restricted pod
//! security profile, deploy/operator for an order `kubectl apply` can follow, and the
//! Grafana dashboard for queries naming only metrics ferry exports.

use ferry_testkit::promql;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferry_operator::crd::{
    Backup, BackupRepository, BackupSchedule, Checksum, Transfer, VolumeImageSource,
};
use serde_json::{json, Value as Json};
use serde_yaml::Value;

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

/// The documents of a multi-document YAML file.
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).expect("a YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

/// API groups kubernetes-validate has no schemas for, each checked by its own test here.
fn checked_elsewhere(doc: &Value) -> bool {
    let api = doc["apiVersion"].as_str().unwrap_or("");
    api.starts_with("ferry.dev/")
        || api.starts_with("monitoring.coreos.com/")
        || api.starts_with("populator.storage.k8s.io/")
}

/// deploy/volume-populators.yaml: one VolumePopulator (the volume-data-source-validator's
/// `populator.storage.k8s.io/v1beta1` shape: `sourceKind` at the top level, nothing else)
/// per kind the operator's populator fills claims from.
#[test]
fn the_volume_populators_name_every_populator_source_kind() {
    use kube::Resource;
    let docs = documents(&repo().join("deploy/volume-populators.yaml"));
    let mut kinds = std::collections::BTreeSet::new();
    for d in &docs {
        assert_eq!(
            d["apiVersion"].as_str(),
            Some("populator.storage.k8s.io/v1beta1")
        );
        assert_eq!(d["kind"].as_str(), Some("VolumePopulator"));
        assert!(d["metadata"]["name"].as_str().is_some(), "{d:?}");
        let keys: Vec<&str> = d
            .as_mapping()
            .unwrap()
            .keys()
            .map(|k| k.as_str().unwrap())
            .collect();
        assert_eq!(
            keys,
            ["apiVersion", "kind", "metadata", "sourceKind"],
            "{d:?}"
        );
        assert_eq!(d["sourceKind"]["group"].as_str(), Some("ferry.dev"));
        kinds.insert(d["sourceKind"]["kind"].as_str().unwrap().to_string());
    }
    let populated: std::collections::BTreeSet<String> = [
        ferry_operator::crd::VolumeImageSource::kind(&()).to_string(),
        ferry_operator::crd::Backup::kind(&()).to_string(),
        ferry_operator::crd::BackupSchedule::kind(&()).to_string(),
    ]
    .into();
    assert_eq!(kinds, populated);
    for kind in &populated {
        let claim = serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "c", "namespace": "n"},
            "spec": {"dataSourceRef": {"apiGroup": "ferry.dev", "kind": kind, "name": "x"}}});
        let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim =
            serde_json::from_value(claim).unwrap();
        assert!(
            ferry_operator::populator::source::of(&claim).is_some(),
            "the populator does not fill claims from {kind}"
        );
    }
}

#[test]
fn every_manifest_in_deploy_is_valid() {
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy"), &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("deploy/crds.yaml")),
        "deploy/crds.yaml is missing: {files:?}"
    );
    // Files holding ferry resources or a ServiceMonitor are validated without them.
    let dir = tempfile::tempdir().unwrap();
    let mut objects = 0;
    let mut to_validate = Vec::new();
    for (n, file) in files.iter().enumerate() {
        let docs: Vec<Value> = documents(file)
            .into_iter()
            .filter(|d| !checked_elsewhere(d))
            .collect();
        if docs.is_empty() {
            continue;
        }
        objects += docs.len();
        let name = file.file_name().unwrap().to_string_lossy();
        let copy = dir.path().join(format!("{n:02}-{name}"));
        let text: Vec<String> = docs
            .iter()
            .map(|d| serde_yaml::to_string(d).unwrap())
            .collect();
        std::fs::write(&copy, text.join("---\n")).unwrap();
        to_validate.push(copy);
    }
    for version in VERSIONS {
        let (ok, text) = kubernetes_validate(version, &to_validate);
        assert!(
            ok,
            "kubernetes-validate --strict -k {version} failed:\n{text}"
        );
        // One "passed" line per object: every object was read.
        assert_eq!(text.matches("passed").count(), objects, "{text}");
    }
}

/// tests/cluster/run.sh, the end-to-end check for a real cluster, cannot run here: it is
/// checked by shellcheck, every manifest it applies is validated (Kubernetes objects by
/// kubernetes-validate, ferry resources by the operator's own types and validation), and
/// every manifest file it names exists.
#[test]
fn the_cluster_script_is_clean_and_its_manifests_valid() {
    let script = repo().join("tests/cluster/run.sh");
    let out = Command::new("shellcheck")
        .arg(&script)
        .output()
        .expect("run shellcheck (apt-get install shellcheck; scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "shellcheck:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let text = std::fs::read_to_string(&script).unwrap();
    let dir = repo().join("tests/cluster/manifests");
    let mut files = Vec::new();
    yaml_files(&dir, &mut files);
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        assert!(
            text.contains(&format!("apply {name}")),
            "{name} is never applied"
        );
    }
    for name in text.split_whitespace().filter(|w| w.ends_with(".yaml")) {
        if !name.contains('/') && !name.contains('$') {
            assert!(
                dir.join(name).exists(),
                "run.sh applies {name}, which does not exist"
            );
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut objects = 0;
    let mut to_validate = Vec::new();
    let mut ferry_kinds = BTreeSet::new();
    let (mut repositories, mut backups) = (Vec::<BackupRepository>::new(), Vec::new());
    for (n, file) in files.iter().enumerate() {
        let mut plain = Vec::new();
        for doc in documents(file) {
            match doc["kind"].as_str().unwrap_or("") {
                "Transfer" => {
                    check_resource(&doc, |t: &Transfer| {
                        t.spec.validate().map_err(|e| e.to_string())
                    });
                    ferry_kinds.insert("Transfer");
                }
                "Checksum" => {
                    check_resource(&doc, |c: &Checksum| {
                        c.spec.validate().map_err(|e| e.to_string())
                    });
                    ferry_kinds.insert("Checksum");
                }
                "VolumeImageSource" => {
                    check_resource(&doc, |v: &VolumeImageSource| {
                        v.spec.validate().map_err(|e| e.to_string())
                    });
                    ferry_kinds.insert("VolumeImageSource");
                }
                "BackupRepository" => {
                    repositories.push(check_resource(&doc, |r: &BackupRepository| {
                        r.spec.validate().map_err(|e| e.to_string())
                    }));
                    ferry_kinds.insert("BackupRepository");
                }
                "Backup" => {
                    backups.push(doc);
                    ferry_kinds.insert("Backup");
                }
                _ => plain.push(serde_yaml::to_string(&doc).unwrap()),
            }
        }
        if plain.is_empty() {
            continue;
        }
        objects += plain.len();
        let copy = tmp.path().join(format!("{n:02}.yaml"));
        std::fs::write(&copy, plain.join("---\n")).unwrap();
        to_validate.push(copy);
    }
    // A Backup is checked with the repository it names, as the operator looks it up.
    for doc in &backups {
        check_resource(doc, |b: &Backup| {
            let mut b = b.clone();
            b.spec.resolved_repository = repositories
                .iter()
                .find(|r| r.metadata.name == Some(b.spec.repository.clone()))
                .map(|r| r.spec.clone());
            b.spec.validate().map_err(|e| e.to_string())
        });
    }
    assert_eq!(
        ferry_kinds,
        BTreeSet::from([
            "Transfer",
            "Checksum",
            "VolumeImageSource",
            "BackupRepository",
            "Backup"
        ])
    );
    for version in VERSIONS {
        let (ok, text) = kubernetes_validate(version, &to_validate);
        assert!(
            ok,
            "kubernetes-validate --strict -k {version} failed:\n{text}"
        );
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

/// Every field of `original` is in `round_trip` with the same value: a field the type
/// does not know (a typo in an example) would be dropped by deserializing and fail this.
fn assert_subset(original: &Json, round_trip: &Json, at: &str) {
    match (original, round_trip) {
        (Json::Object(o), Json::Object(r)) => {
            for (k, v) in o {
                let there = r
                    .get(k)
                    .unwrap_or_else(|| panic!("{at}.{k} is not a field of the type"));
                assert_subset(v, there, &format!("{at}.{k}"));
            }
        }
        (Json::Array(o), Json::Array(r)) => {
            assert_eq!(o.len(), r.len(), "{at}");
            for (i, (a, b)) in o.iter().zip(r).enumerate() {
                assert_subset(a, b, &format!("{at}[{i}]"));
            }
        }
        // Quantities and numbers may be written as strings or numbers.
        (a, b) if a.to_string().trim_matches('"') == b.to_string().trim_matches('"') => {}
        (a, b) => panic!("{at}: {a} became {b}"),
    }
}

/// Deserializes a ferry resource into its type, checks it as the operator does, and
/// checks that nothing in it was unknown to the type.
fn check_resource<K>(doc: &Value, validate: impl Fn(&K) -> Result<(), String>) -> K
where
    K: serde::de::DeserializeOwned + serde::Serialize,
{
    let json: Json = serde_json::to_value(doc).unwrap();
    let name = json["metadata"]["name"].clone();
    let k: K = serde_json::from_value(json.clone())
        .unwrap_or_else(|e| panic!("{name}: not a valid {}: {e}", json["kind"]));
    validate(&k).unwrap_or_else(|e| panic!("{name}: {e}"));
    let back = serde_json::to_value(&k).unwrap();
    assert_subset(&json["spec"], &back["spec"], &format!("{name}.spec"));
    k
}

#[test]
fn the_examples_are_valid_ferry_resources() {
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy/examples"), &mut files);
    let mut kinds = BTreeSet::new();
    let mut sources = BTreeSet::new();
    let mut populated = Vec::new();
    let mut fan_out = 0;
    let mut repositories: Vec<BackupRepository> = Vec::new();
    let mut backups = Vec::new();
    let mut scheduled = Vec::new();
    let mut restored = Vec::new();
    for file in &files {
        for doc in documents(file) {
            let kind = doc["kind"].as_str().unwrap_or("").to_string();
            match kind.as_str() {
                "Transfer" => {
                    let t: Transfer = check_resource(&doc, |t: &Transfer| {
                        t.spec.validate().map_err(|e| e.to_string())
                    });
                    fan_out = fan_out.max(t.spec.targets.len());
                }
                "Checksum" => {
                    check_resource(&doc, |c: &Checksum| {
                        c.spec.validate().map_err(|e| e.to_string())
                    });
                }
                "VolumeImageSource" => {
                    check_resource(&doc, |v: &VolumeImageSource| {
                        v.spec.validate().map_err(|e| e.to_string())
                    });
                    sources.insert(doc["metadata"]["name"].as_str().unwrap().to_string());
                }
                "BackupRepository" => {
                    let r: BackupRepository = check_resource(&doc, |r: &BackupRepository| {
                        r.spec.validate().map_err(|e| e.to_string())
                    });
                    repositories.push(r);
                }
                "Backup" => {
                    backups.push(doc.clone());
                }
                "BackupSchedule" => {
                    let s: BackupSchedule = check_resource(&doc, |s: &BackupSchedule| {
                        s.spec.validate().map(|_| ()).map_err(|e| e.to_string())
                    });
                    scheduled.push(s.spec.repository.clone());
                }
                "PersistentVolumeClaim" => {
                    let r = &doc["spec"]["dataSourceRef"];
                    if r["apiGroup"].as_str() == Some("ferry.dev") {
                        match r["kind"].as_str() {
                            Some("VolumeImageSource") => {
                                populated.push(r["name"].as_str().unwrap().to_string())
                            }
                            Some("Backup") => {
                                restored.push(r["name"].as_str().unwrap().to_string())
                            }
                            other => panic!("a claim populated from {other:?}"),
                        }
                    }
                }
                _ => {}
            }
            kinds.insert(kind);
        }
    }
    // A Backup is checked with the repository it names, as the operator looks it up.
    let repository = |name: &str| {
        repositories
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
            .map(|r| r.spec.clone())
    };
    assert!(!restored.is_empty(), "no claim restored from a Backup");
    for name in &restored {
        assert!(
            backups
                .iter()
                .any(|b| b["metadata"]["name"].as_str() == Some(name)),
            "no Backup {name} in the examples"
        );
    }
    for doc in &backups {
        check_resource(doc, |b: &Backup| {
            let mut b = b.clone();
            b.spec.resolved_repository = repository(&b.spec.repository);
            b.spec.validate().map_err(|e| e.to_string())
        });
    }
    for name in &scheduled {
        assert!(
            repository(name).is_some(),
            "no BackupRepository {name} in the examples"
        );
    }
    for kind in [
        "Transfer",
        "Checksum",
        "VolumeImageSource",
        "BackupRepository",
        "Backup",
        "BackupSchedule",
    ] {
        assert!(kinds.contains(kind), "no {kind} example: {kinds:?}");
    }
    assert_eq!(fan_out, 10, "the clone example writes 10 claims");
    assert!(!populated.is_empty(), "no claim populated on creation");
    for name in populated {
        assert!(
            sources.contains(&name),
            "no VolumeImageSource {name} in the examples"
        );
    }
}

#[test]
fn an_example_with_a_mistake_is_refused() {
    let file = repo().join("deploy/examples/03-checksum-a-claim.yaml");
    let good = documents(&file).remove(0);
    let check = |doc: &Value| {
        std::panic::catch_unwind(|| {
            check_resource(doc, |c: &Checksum| {
                c.spec.validate().map_err(|e| e.to_string())
            });
        })
        .is_ok()
    };
    assert!(check(&good));
    let mut typo = good.clone();
    typo["spec"]["options"]["algorythm"] = "sha256".into();
    assert!(!check(&typo), "an unknown field passed");
    let mut password = good.clone();
    password["spec"]["source"] = serde_yaml::from_str("url: nbd://u:secret@host/x").unwrap();
    assert!(!check(&password), "an inline password passed");
}

/// The part of the ServiceMonitor schema (monitoring.coreos.com/v1) this repository's
/// ServiceMonitors use; anything else is refused, as the real CRD's pruning would drop it.
fn service_monitor_schema() -> Json {
    let strings = json!({"type": "array", "items": {"type": "string"}});
    let labels = json!({"type": "object", "additionalProperties": {"type": "string"}});
    json!({
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"enum": ["monitoring.coreos.com/v1"]},
            "kind": {"enum": ["ServiceMonitor"]},
            "metadata": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "namespace": {"type": "string"}, "labels": labels,
            }},
            "spec": {"type": "object", "required": ["selector", "endpoints"], "properties": {
                "selector": {"type": "object", "properties": {"matchLabels": labels}},
                "namespaceSelector": {"type": "object", "properties": {
                    "matchNames": strings, "any": {"type": "boolean"},
                }},
                "endpoints": {"type": "array", "items": {"type": "object", "properties": {
                    "port": {"type": "string"}, "path": {"type": "string"},
                    "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                    "scheme": {"enum": ["http", "https"]},
                }}},
            }},
        },
    })
}

/// A small JSON-schema check (type, enum, required, properties with no others,
/// additionalProperties, items, a duration pattern): the errors, with their paths.
fn schema_errors(schema: &Json, v: &Json, at: &str, errors: &mut Vec<String>) {
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(v) {
            errors.push(format!("{at}: {v} is not one of {allowed:?}"));
        }
    }
    let type_ok = match schema["type"].as_str() {
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("string") => v.is_string(),
        Some("boolean") => v.is_boolean(),
        _ => true,
    };
    if !type_ok {
        errors.push(format!("{at}: {v} is not of type {}", schema["type"]));
        return;
    }
    if let (Some(p), Some(s)) = (schema["pattern"].as_str(), v.as_str()) {
        let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(0));
        let ok = !digits.is_empty() && ["ms", "s", "m", "h"].contains(&unit);
        if !ok {
            errors.push(format!("{at}: {s} does not match {p}"));
        }
    }
    for r in schema["required"].as_array().into_iter().flatten() {
        if v.get(r.as_str().unwrap()).is_none() {
            errors.push(format!("{at}: {r} is required"));
        }
    }
    if let Some(obj) = v.as_object() {
        for (k, field) in obj {
            let sub = schema["properties"]
                .get(k)
                .or_else(|| schema.get("additionalProperties"));
            match sub {
                Some(sub) => schema_errors(sub, field, &format!("{at}.{k}"), errors),
                None => errors.push(format!("{at}.{k}: unknown field")),
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), v.as_array()) {
        for (i, item) in arr.iter().enumerate() {
            schema_errors(items, item, &format!("{at}[{i}]"), errors);
        }
    }
}

// kubernetes-validate knows only the Kubernetes API's own kinds: a ServiceMonitor is a
// prometheus-operator CRD, so its shape is checked against the schema above instead.
#[test]
fn the_service_monitor_has_the_shape_prometheus_operator_accepts() {
    let schema = service_monitor_schema();
    let monitor: Json = serde_json::to_value(
        documents(&repo().join("deploy/monitoring/servicemonitor.yaml")).remove(0),
    )
    .unwrap();
    let mut errors = Vec::new();
    schema_errors(&schema, &monitor, "", &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    // It selects the operator's metrics Service and names its port.
    let service: Json =
        serde_json::to_value(documents(&repo().join("deploy/operator/30-service.yaml")).remove(0))
            .unwrap();
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&service["metadata"]["labels"][k], v, "label {k}");
    }
    let port = monitor["spec"]["endpoints"][0]["port"].as_str().unwrap();
    assert!(service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == port));
    // And the check refuses what the CRD would not keep.
    let mut bad = monitor.clone();
    bad["spec"]["endpoints"][0]["intervall"] = "30s".into();
    bad["spec"]["endpoints"][0]["interval"] = "soon".into();
    let mut errors = Vec::new();
    schema_errors(&schema, &bad, "", &mut errors);
    assert_eq!(errors.len(), 2, "{errors:?}");
}

/// `kubectl apply -f deploy/crds.yaml -f deploy/operator/` applies the files in this
/// order, each top to bottom: every object's namespace, role and account must come first.
#[test]
fn deploy_operator_applies_in_file_order() {
    let mut files = vec![repo().join("deploy/crds.yaml")];
    yaml_files(&repo().join("deploy/operator"), &mut files);
    let mut created: BTreeSet<(String, String)> = BTreeSet::new();
    let mut namespaced = 0;
    for file in &files {
        for doc in documents(file) {
            let kind = doc["kind"].as_str().unwrap().to_string();
            let name = doc["metadata"]["name"].as_str().unwrap().to_string();
            if let Some(ns) = doc["metadata"]["namespace"].as_str() {
                namespaced += 1;
                assert_eq!(ns, "ferry-system", "{kind}/{name}");
                assert!(
                    created.contains(&("Namespace".into(), ns.into())),
                    "{kind}/{name} in {} comes before its namespace",
                    file.display()
                );
            }
            let needs = match kind.as_str() {
                "ClusterRoleBinding" | "RoleBinding" => vec![(
                    doc["roleRef"]["kind"].as_str().unwrap().to_string(),
                    doc["roleRef"]["name"].as_str().unwrap().to_string(),
                )],
                "Deployment" => vec![(
                    "ServiceAccount".to_string(),
                    doc["spec"]["template"]["spec"]["serviceAccountName"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                )],
                _ => vec![],
            };
            for need in needs {
                assert!(
                    created.contains(&need),
                    "{kind}/{name} comes before {need:?}"
                );
            }
            created.insert((kind, name));
        }
    }
    assert!(namespaced >= 6, "{created:?}");
    assert!(created.contains(&(
        "CustomResourceDefinition".into(),
        "transfers.ferry.dev".into()
    )));
}

/// The operator runs under the restricted Pod Security Standard and gets what
/// `ferry operator run` reads from its environment.
#[test]
fn the_operator_deployment_is_restricted() {
    let d: Json = serde_json::to_value(
        documents(&repo().join("deploy/operator/20-deployment.yaml")).remove(0),
    )
    .unwrap();
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "ferry-operator");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());
    assert_eq!(c["args"][0], "operator");
    assert_eq!(c["args"][1], "run");
    let env: Vec<(&str, &str)> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap(),
                e["valueFrom"]["fieldRef"]["fieldPath"]
                    .as_str()
                    .unwrap_or(""),
            )
        })
        .collect();
    assert!(env.contains(&("POD_NAME", "metadata.name")), "{env:?}");
    assert!(
        env.contains(&("POD_NAMESPACE", "metadata.namespace")),
        "{env:?}"
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    let metrics = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics");
    assert_eq!(metrics.unwrap()["containerPort"], 9090);
}

/// The operator's metric names (shared-k8s.md; the operator's metrics module exports
/// exactly these, its own test checks the exposition).
const OPERATOR_METRICS: &[&str] = &[
    "ferry_operator_reconciles_total",
    "ferry_operator_reconcile_errors_total",
    "ferry_operator_movers_running",
    "ferry_operator_resources",
    "ferry_operator_leader",
];

#[test]
fn the_dashboard_queries_name_only_metrics_ferry_exports() {
    let dashboard = promql::ferry_dashboard(&repo());
    let exprs = promql::dashboard_exprs(&dashboard);
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut used = BTreeSet::new();
    for (title, expr) in &exprs {
        let names = promql::metric_names(expr);
        assert!(!names.is_empty(), "panel '{title}': no metric in {expr}");
        for name in names {
            let family = promql::family(&name).to_string();
            if family.starts_with("ferry_operator_") {
                assert!(
                    OPERATOR_METRICS.contains(&family.as_str()),
                    "panel '{title}': the operator exports no {name}"
                );
            } else {
                // The service's names are checked against a running `ferry serve`'s
                // /metrics by tests/tests/service_deploy.rs.
                assert!(
                    name.starts_with("ferry_"),
                    "panel '{title}': {name} is not ferry's"
                );
            }
            used.insert(family);
        }
    }
    for name in OPERATOR_METRICS {
        assert!(used.contains(*name), "no panel shows {name}");
    }
    let ids: Vec<_> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["id"])
        .collect();
    let unique: BTreeSet<String> = ids.iter().map(|i| i.to_string()).collect();
    assert_eq!(unique.len(), ids.len(), "panel ids repeat");
}

#[test]
fn metric_names_are_found_in_promql() {
    let cases = [
        ("sum by (kind) (rate(ferry_operator_reconciles_total[$__rate_interval]))",
            vec!["ferry_operator_reconciles_total"]),
        ("histogram_quantile(0.95, sum by (le, kind) (rate(ferry_job_duration_seconds_bucket{kind=\"copy\"}[5m])))",
            vec!["ferry_job_duration_seconds_bucket"]),
        ("ferry_jobs{state=~\"run.*\"} / on (pod) group_left ferry_operator_leader > bool 0",
            vec!["ferry_jobs", "ferry_operator_leader"]),
        ("max(up offset 5m)", vec!["up"]),
    ];
    for (expr, want) in cases {
        let got: Vec<String> = promql::metric_names(expr).into_iter().collect();
        assert_eq!(got, want, "{expr}");
    }
    assert_eq!(
        promql::family("ferry_job_duration_seconds_bucket"),
        "ferry_job_duration_seconds"
    );
}

const INSTALL_CEL: &str = "pip install cel-expr-python==0.1.3 (scripts/test.sh installs it)";

/// The admission webhook's matchConditions (deploy/ and the chart say the same) compile
/// in Google's CEL runtime with `object` and `request` dynamic, as the API server declares
/// them, and select exactly the Transfers whose source claim is in another namespace.
#[test]
fn the_webhook_match_condition_selects_only_cross_namespace_transfers() {
    let docs = documents(&repo().join("deploy/operator/50-webhook.yaml"));
    let config = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("MutatingWebhookConfiguration"))
        .unwrap();
    let conditions = config["webhooks"][0]["matchConditions"]
        .as_sequence()
        .unwrap();
    assert_eq!(conditions.len(), 1);
    let expression = conditions[0]["expression"]
        .as_str()
        .unwrap()
        .trim()
        .to_string();
    let chart =
        std::fs::read_to_string(repo().join("charts/ferry/templates/operator-webhook.yaml"))
            .unwrap();
    let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        squeeze(&chart).contains(&squeeze(&expression)),
        "the chart's matchConditions differ from deploy/'s"
    );
    let other =
        serde_json::json!({"spec": {"source": {"pvc": {"name": "g", "namespace": "images"}}}});
    let own = serde_json::json!({"spec": {"source": {"pvc": {"name": "g"}}}});
    // [object, oldObject (null on CREATE), the request's namespace, sent?]
    let cases = serde_json::json!([
        [other, null, "vms", true],
        [{"spec": {"source": {"pvc": {"name": "g", "namespace": "vms"}}}}, null, "vms", false],
        [own, null, "vms", false],
        [{"spec": {"source": {"url": "s3://b/k"}}}, null, "vms", false],
        [{"spec": {"source": {"goldenImage": {"name": "f"}}}}, null, "vms", false],
        [{"metadata": {"name": "t"}}, null, "vms", false],
        // An update that moves the source into the Transfer's namespace is still sent
        // (the webhook refuses it once the clone started), and so is one that moves it out.
        [own, other, "vms", true],
        [other, own, "vms", true],
        [own, own, "vms", false],
        [{"metadata": {"name": "t"}}, {"metadata": {"name": "t"}}, "vms", false],
    ]);
    let script = r#"
import json, sys
from cel_expr_python import cel
expression, cases = sys.argv[1], json.loads(sys.argv[2])
dyn = cel.Type("dyn")
compiled = cel.NewEnv(variables={"object": dyn, "oldObject": dyn, "request": dyn}).compile(expression)
print(json.dumps([compiled.eval(data={"object": o, "oldObject": old, "request": {"namespace": ns}}).value()
                  for o, old, ns, _ in cases]))
"#;
    let out = Command::new("python3")
        .args(["-c", script, &expression, &cases.to_string()])
        .output()
        .unwrap_or_else(|e| panic!("python3 is needed: {INSTALL_CEL} ({e})"));
    assert!(
        out.status.success(),
        "the CEL runtime refused the expression ({INSTALL_CEL}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<bool> = serde_json::from_slice(&out.stdout).unwrap();
    let want: Vec<bool> = cases
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c[3].as_bool().unwrap())
        .collect();
    assert_eq!(got, want, "{expression}");
}
