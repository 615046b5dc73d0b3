//! The operator's metrics: reconciles and their failures are counted by kind, the gauges
//! are sampled from the stores, and the exposition names every metric the dashboard uses.

use crate::support;

use std::sync::Arc;

use ferry_operator::controller::{error_policy, reconcile};
use ferry_operator::crd::{Checksum, Transfer};
use ferry_operator::metrics::OperatorMetrics;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::{json, Value};
use support::{settings, Harness, Reply};

const T: &str = "/apis/ferry.dev/v1alpha1/namespaces/vms/transfers/import";

/// The metric names fixed for the dashboard (docs in tasks/shared-k8s.md).
const NAMES: [&str; 5] = [
    "ferry_operator_reconciles_total",
    "ferry_operator_reconcile_errors_total",
    "ferry_operator_movers_running",
    "ferry_operator_resources",
    "ferry_operator_leader",
];

fn transfer_json(name: &str, phase: Option<&str>) -> Value {
    let mut t = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "Transfer",
        "metadata": {"name": name, "namespace": "vms", "uid": format!("uid-{name}"),
                     "generation": 1, "resourceVersion": "7"},
        "spec": {
            "source": {"pvc": {"name": "golden"}},
            "targets": [{"pvc": {"name": "copy"}}],
        },
    });
    if let Some(phase) = phase {
        t["status"] = json!({"phase": phase});
    }
    t
}

fn transfer(v: &Value) -> Arc<Transfer> {
    Arc::new(serde_json::from_value(v.clone()).unwrap())
}

fn line(text: &str, series: &str) -> Option<String> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .map(str::to_string)
}

#[tokio::test]
async fn a_reconcile_and_a_failed_one_are_counted_by_kind() {
    let mut h = Harness::new(settings());
    let metrics = h.ctx.metrics.clone();
    let text = metrics.encode();
    let start = r#"ferry_operator_reconciles_total{kind="Transfer"}"#;
    assert_eq!(line(&text, start).as_deref(), Some(&*format!("{start} 0")));

    // The first reconcile adds the finalizer.
    let obj = transfer(&transfer_json("import", None));
    let task = tokio::spawn(reconcile(obj.clone(), h.ctx.clone()));
    let written = transfer_json("import", None);
    h.server.expect("PATCH", T, Reply::Ok(written)).await;
    task.await.unwrap().unwrap();
    h.server.done().await;

    // The second one's write is refused; the controller's error policy counts it.
    let task = tokio::spawn(reconcile(obj.clone(), h.ctx.clone()));
    h.server.expect("PATCH", T, Reply::Conflict).await;
    let error = task.await.unwrap().unwrap_err();
    error_policy(obj, &error, h.ctx.clone());
    h.server.done().await;

    let text = metrics.encode();
    let series = |name: &str, kind: &str| format!("{name}{{kind=\"{kind}\"}}");
    let count = |name: &str, kind: &str| line(&text, &series(name, kind));
    let expect = |name: &str, kind: &str, n: u32| Some(format!("{} {n}", series(name, kind)));
    assert_eq!(
        count("ferry_operator_reconciles_total", "Transfer"),
        expect("ferry_operator_reconciles_total", "Transfer", 2)
    );
    assert_eq!(
        count("ferry_operator_reconcile_errors_total", "Transfer"),
        expect("ferry_operator_reconcile_errors_total", "Transfer", 1)
    );
    assert_eq!(
        count("ferry_operator_reconciles_total", "Checksum"),
        expect("ferry_operator_reconciles_total", "Checksum", 0)
    );
}

fn pod(name: &str, phase: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "vms"},
        "status": {"phase": phase},
    }))
    .unwrap()
}

#[test]
fn the_exposition_names_every_metric_with_sampled_gauges() {
    let metrics = OperatorMetrics::new();
    let mut transfers = Writer::<Transfer>::default();
    for (name, phase) in [
        ("a", Some("Running")),
        ("b", Some("Running")),
        ("c", Some("Succeeded")),
        ("d", None),
    ] {
        let t: Transfer = serde_json::from_value(transfer_json(name, phase)).unwrap();
        transfers.apply_watcher_event(&watcher::Event::Apply(t));
    }
    let checksums = Writer::<Checksum>::default();
    let mut pods = Writer::<Pod>::default();
    for (name, phase) in [("m1", "Running"), ("m2", "Pending"), ("m3", "Succeeded")] {
        pods.apply_watcher_event(&watcher::Event::Apply(pod(name, phase)));
    }
    let stores = (
        transfers.as_reader(),
        checksums.as_reader(),
        pods.as_reader(),
    );
    metrics.set_sampler(Box::new(move |m| {
        m.sample_resources(&stores.0);
        m.sample_resources(&stores.1);
        m.sample_movers(&stores.2);
    }));
    metrics.leader.set(1);

    let text = metrics.encode();
    for name in NAMES {
        assert!(text.contains(&format!("# TYPE {name} ")), "{name}: {text}");
    }
    for (series, value) in [
        (
            r#"ferry_operator_resources{kind="Transfer",phase="Running"}"#,
            2,
        ),
        (
            r#"ferry_operator_resources{kind="Transfer",phase="Succeeded"}"#,
            1,
        ),
        (
            r#"ferry_operator_resources{kind="Transfer",phase="Pending"}"#,
            1,
        ),
        (
            r#"ferry_operator_resources{kind="Transfer",phase="Failed"}"#,
            0,
        ),
        (
            r#"ferry_operator_resources{kind="Checksum",phase="Running"}"#,
            0,
        ),
        ("ferry_operator_movers_running", 2),
        ("ferry_operator_leader", 1),
    ] {
        assert_eq!(
            line(&text, series),
            Some(format!("{series} {value}")),
            "{text}"
        );
    }

    // A Transfer that finished leaves Running at once (the gauge is sampled, not counted).
    transfers.apply_watcher_event(&watcher::Event::Delete(
        serde_json::from_value(transfer_json("a", Some("Running"))).unwrap(),
    ));
    let text = metrics.encode();
    let running = r#"ferry_operator_resources{kind="Transfer",phase="Running"}"#;
    assert_eq!(line(&text, running), Some(format!("{running} 1")));
}
