//! deploy/crds.yaml is exactly what `ferry operator crds` prints (the CRDs are generated
//! from the Rust types, never edited by hand), and the generated CRDs carry what users
//! and the API server rely on: names, printer columns, the status subresource and the
//! validation the schema can express.

use std::path::{Path, PathBuf};

use ferry_operator::crd::{crds, crds_yaml};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const REGENERATE: &str = "cargo run -p ferry --bin ferry -- operator crds > deploy/crds.yaml";

#[test]
fn deploy_crds_yaml_is_the_generated_output() {
    let path = repo().join("deploy/crds.yaml");
    let on_disk = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; create it with: {REGENERATE}", path.display()));
    let generated = crds_yaml().expect("CRDs as YAML");
    assert!(
        on_disk == generated,
        "deploy/crds.yaml differs from `ferry operator crds`; regenerate it with: {REGENERATE}"
    );
}

fn crd(kind: &str) -> CustomResourceDefinition {
    crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD of kind {kind}"))
}

fn schema_json(kind: &str) -> serde_json::Value {
    let crd = crd(kind);
    serde_json::to_value(&crd.spec.versions[0].schema).unwrap()
}

#[test]
fn kinds_names_and_columns() {
    let all: Vec<(String, String, Vec<String>)> = crds()
        .into_iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap(),
                c.spec.scope.clone(),
                c.spec.names.short_names.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        all,
        vec![
            (
                "transfers.ferry.dev".into(),
                "Namespaced".into(),
                vec!["ft".into()]
            ),
            (
                "checksums.ferry.dev".into(),
                "Namespaced".into(),
                vec!["fcs".into()]
            ),
            (
                "volumeimagesources.ferry.dev".into(),
                "Namespaced".into(),
                vec!["vis".into()]
            ),
            (
                "backuprepositories.ferry.dev".into(),
                "Namespaced".into(),
                vec!["fbr".into()]
            ),
            (
                "ferrybackups.ferry.dev".into(),
                "Namespaced".into(),
                vec!["fbk".into()]
            ),
            (
                "backupschedules.ferry.dev".into(),
                "Namespaced".into(),
                vec!["fbs".into()]
            ),
            (
                "ferryrestores.ferry.dev".into(),
                "Namespaced".into(),
                vec!["frs".into()]
            ),
            (
                "storageclassprofiles.ferry.dev".into(),
                "Cluster".into(),
                vec!["fscp".into()]
            ),
            (
                "goldenimages.ferry.dev".into(),
                "Namespaced".into(),
                vec!["fgi".into()]
            ),
        ]
    );
    let transfer = crd("Transfer");
    let version = &transfer.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<String> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| format!("{}={}", c.name, c.json_path))
        .collect();
    assert_eq!(
        columns,
        [
            "Phase=.status.phase",
            "Total=.status.progress.totalBytes",
            "Done=.status.progress.doneBytes",
            "Node=.status.node",
            "Age=.metadata.creationTimestamp"
        ]
    );
    let checksum = crd("Checksum");
    assert!(checksum.spec.versions[0]
        .subresources
        .as_ref()
        .unwrap()
        .status
        .is_some());
    // The populator's source has no status to keep.
    assert!(crd("VolumeImageSource").spec.versions[0]
        .subresources
        .is_none());
}

#[test]
fn the_schema_carries_the_validation() {
    let s = schema_json("Transfer");
    let spec = &s["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(spec["required"], serde_json::json!(["source"]));
    let targets = &spec["properties"]["targets"];
    assert_eq!(targets["maxItems"].as_f64(), Some(1000.0));
    let generated = &spec["properties"]["pvcTemplates"]["properties"]["count"];
    assert_eq!(generated["maximum"].as_f64(), Some(100000.0));
    let per_mover = &spec["properties"]["fanOut"]["properties"]["maxTargetsPerMover"];
    assert_eq!(per_mover["maximum"].as_f64(), Some(64.0));
    let rules = targets["x-kubernetes-validations"].to_string();
    assert!(rules.contains("exists_one"), "{rules}");
    let source_rules = spec["properties"]["source"]["x-kubernetes-validations"].to_string();
    assert!(
        source_rules
            .contains("[has(self.url), has(self.pvc), has(self.goldenImage)].exists_one(x, x)"),
        "{source_rules}"
    );
    assert_eq!(
        spec["properties"]["expectedDigest"]["pattern"],
        "^(sha256|blkhash):[0-9a-f]{64}$"
    );
    let options = &spec["properties"]["options"]["properties"];
    assert_eq!(
        options["order"]["enum"],
        serde_json::json!(["Auto", "InOrder", "OutOfOrder"])
    );
    assert_eq!(options["workers"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(options["workers"]["maximum"].as_f64(), Some(256.0));
    assert_eq!(
        options["verifyAlgorithm"]["enum"],
        serde_json::json!(["blkhash", "sha256"])
    );
    let status = &s["openAPIV3Schema"]["properties"]["status"]["properties"];
    assert_eq!(
        status["phase"]["enum"],
        serde_json::json!(["Pending", "Running", "Succeeded", "Failed", "Cancelled"])
    );
    assert_eq!(
        status["progress"]["properties"]["totalBytes"]["type"],
        "integer"
    );
    assert_eq!(
        status["checkpoint"]["properties"]["committed"]["maxItems"].as_f64(),
        Some(256.0)
    );
    // Target items carry the endpoint's fields and the template side by side.
    let target = &targets["items"]["properties"];
    for field in ["url", "s3", "nbd", "iscsi", "nfs", "pvc", "pvcTemplate"] {
        assert!(
            target.get(field).is_some(),
            "targets[] lacks {field}: {target}"
        );
    }
}

#[test]
fn the_backup_kinds_have_their_columns_and_no_operator_field() {
    let columns = |kind: &str| -> Vec<String> {
        crd(kind).spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.clone())
            .collect()
    };
    assert_eq!(
        columns("Backup"),
        ["PVC", "Repository", "Phase", "Snapshot", "New", "Age"]
    );
    assert_eq!(
        columns("BackupSchedule"),
        [
            "PVC",
            "Schedule",
            "Last sync",
            "Next sync",
            "Last snapshot",
            "Age"
        ]
    );
    assert_eq!(
        columns("BackupRepository"),
        ["URL", "PVC", "Ready", "Encrypted", "Age"]
    );
    let backup = schema_json("Backup");
    let spec = &backup["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(
        spec["required"],
        serde_json::json!(["repository", "sourcePVC"])
    );
    assert!(
        spec["properties"].get("resolvedRepository").is_none(),
        "the operator's lookup is never part of the API: {spec}"
    );
    assert!(
        spec["properties"].get("resolvedSnapshotMetadata").is_none(),
        "the operator's lookup is never part of the API: {spec}"
    );
    let schedule = schema_json("BackupSchedule");
    let spec = &schedule["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(
        spec["copyMethod"]["enum"],
        serde_json::json!(["Direct", "Snapshot", "Clone"])
    );
    assert_eq!(spec["trigger"]["required"], serde_json::json!(["schedule"]));
}
